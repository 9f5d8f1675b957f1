"""The text decision protocol contract: ``DecisionParser`` and ``ParseError``.

A text protocol lets a model without native tool calls act: the parser's ``instructions`` go into
the system prompt, and ``parse`` turns the model's reply into a :class:`~qitos.core._decision.Decision`.
A reply that does not follow the protocol raises :class:`ParseError`, whose ``feedback`` tells the
model what was wrong and what is expected; the engine records that feedback in the exchange log and
asks again. A malformed reply is never turned into a final answer.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from qitos.core._decision import Decision
from qitos.core._errors import RunError

__all__ = ["DecisionParser", "ParseError", "check_tool_name", "describe_tools"]


class ParseError(RunError):
    """A model reply does not follow the expected decision format.

    ``feedback`` is repair advice addressed to the model (what was wrong, the expected format);
    ``raw`` is the reply exactly as received.
    """

    def __init__(self, message: str, *, feedback: str, raw: str) -> None:
        super().__init__(message)
        self.feedback = feedback
        self.raw = raw

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_parse_error, (str(self), self.feedback, self.raw))


def _rebuild_parse_error(message: str, feedback: str, raw: str) -> ParseError:
    return ParseError(message, feedback=feedback, raw=raw)


class DecisionParser(abc.ABC):
    """A text protocol: the instructions for the model and the parser for its replies."""

    protocol_id: str = "unknown"

    @abc.abstractmethod
    def instructions(self, tool_schemas: Iterable[Mapping[str, Any]]) -> str:
        """The text to put in the system prompt: the reply format and the available tools."""

    @abc.abstractmethod
    def parse(self, text: str, *, tool_names: Collection[str] | None = None) -> Decision[Any]:
        """The decision in ``text``, or ParseError. With ``tool_names``, unknown tools are errors."""


def describe_tools(tool_schemas: Iterable[Mapping[str, Any]]) -> str:
    """A compact, deterministic text listing of tools (name, description, argument schema)."""
    lines: list[str] = []
    for schema in tool_schemas:
        params = schema.get("parameters") or {"type": "object", "properties": {}}
        props = params.get("properties") or {}
        required = set(params.get("required") or ())
        args = []
        for pname, pschema in props.items():
            kind = pschema.get("type") or ("enum" if "enum" in pschema else "any")
            mark = "" if pname in required else "?"
            desc = f" - {pschema['description']}" if pschema.get("description") else ""
            args.append(f"    {pname}{mark}: {json.dumps(kind)}{desc}")
        lines.append(f"- {schema['name']}: {schema.get('description') or ''}".rstrip())
        lines.extend(args or ["    (no arguments)"])
    return "\n".join(lines) if lines else "(no tools)"


def check_tool_name(name: str, tool_names: Collection[str] | None, raw: str, expected_format: str) -> None:
    """Raise ParseError when ``tool_names`` is given and ``name`` is not one of them."""
    if tool_names is not None and name not in tool_names:
        available = ", ".join(sorted(tool_names)) or "none"
        raise ParseError(
            f"unknown tool {name!r}",
            feedback=(
                f"There is no tool named {name!r}. Available tools: {available}. "
                f"Reply again using one of them, in this format: {expected_format}"
            ),
            raw=raw,
        )
