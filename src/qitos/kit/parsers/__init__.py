"""qitos.kit.parsers: text decision protocols (ReAct, JSON) and native tool-call decoding.

``DecisionParser`` is the protocol an ``AgentModule``'s ``model_parser`` implements;
``ReActParser`` and ``JsonDecisionParser`` are the two text protocols qitos ships.
"""

from qitos.kit.parsers._base import DecisionParser, ParseError
from qitos.kit.parsers._json_protocol import JsonDecisionParser
from qitos.kit.parsers._react import ReActParser

__all__ = ["DecisionParser", "JsonDecisionParser", "ParseError", "ReActParser"]
