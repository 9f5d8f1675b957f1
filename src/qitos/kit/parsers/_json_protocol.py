"""The JSON text protocol: ``{"tool": name, "arguments": {...}}`` or ``{"final": "..."}``.

The reply is one JSON object, optionally inside a Markdown code fence, optionally with a
``"thought"`` string. ``"arguments"`` may be left out for a tool without arguments. Anything else
(no object, invalid JSON, both or neither of ``tool`` and ``final``, unknown keys, arguments that
are not an object, an empty final answer) raises :class:`~qitos.kit.parsers._base.ParseError` with
repair feedback. The embedded local model produces exactly this format under a grammar.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from qitos.core._decision import Action, Decision
from qitos.kit.parsers._base import DecisionParser, ParseError, check_tool_name, describe_tools

__all__ = ["JsonDecisionParser"]

_TOOL_FORMAT = '{"tool": "<tool name>", "arguments": {"argument": "value"}}'
_FINAL_FORMAT = '{"final": "<the answer>"}'
_ALLOWED_KEYS = frozenset({"tool", "arguments", "final", "thought"})
_DECODER = json.JSONDecoder()


class JsonDecisionParser(DecisionParser):
    """Parses one-JSON-object replies into decisions; see the module docstring."""

    protocol_id = "qitos.json/v1"

    def instructions(self, tool_schemas: Iterable[Mapping[str, Any]]) -> str:
        """System-prompt text describing the format and the tools."""
        return (
            "Reply with exactly one JSON object and nothing else. To call a tool:\n"
            f"{_TOOL_FORMAT}\n"
            "When you can answer the task:\n"
            f"{_FINAL_FORMAT}\n"
            'You may add a short "thought" string. The tool\'s result comes back to you in the next message.\n\n'
            f"Tools:\n{describe_tools(tool_schemas)}"
        )

    def parse(self, text: str, *, tool_names: Collection[str] | None = None) -> Decision[Any]:
        """The decision in a JSON reply, or ParseError with repair feedback."""
        if not isinstance(text, str) or not text.strip():
            raise _error("empty reply", "Your reply was empty.", text if isinstance(text, str) else "")
        obj = _extract_object(text)
        unknown = sorted(set(obj) - _ALLOWED_KEYS)
        if unknown:
            raise _error(
                f"unknown keys {unknown}",
                f"Your JSON had unknown keys {unknown}; the allowed keys are tool, arguments, final, thought.",
                text,
            )
        thought = obj.get("thought")
        rationale = (thought.strip() or None) if isinstance(thought, str) else None
        has_tool, has_final = "tool" in obj, "final" in obj
        if has_tool and has_final:
            raise _error("both 'tool' and 'final'", 'Your JSON had both "tool" and "final"; give one.', text)
        if has_final:
            final = obj["final"]
            if not isinstance(final, str) or not final.strip():
                raise _error(
                    "'final' is not a non-empty string",
                    f'"final" must be a non-empty string, got {json.dumps(final)[:60]}.',
                    text,
                )
            return Decision.final(final.strip(), rationale=rationale)
        if not has_tool:
            raise _error("neither 'tool' nor 'final'", 'Your JSON had neither "tool" nor "final".', text)
        name = obj["tool"]
        if not isinstance(name, str) or not name.strip():
            raise _error("'tool' is not a tool name", '"tool" must be the name of a tool (a string).', text)
        check_tool_name(name, tool_names, text, _TOOL_FORMAT)
        args = obj.get("arguments", {})
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise _error(
                "'arguments' is not an object",
                f'"arguments" must be a JSON object, got {type(args).__name__} {json.dumps(args)[:60]}.',
                text,
            )
        return Decision.act([Action(name=name, args=args)], rationale=rationale)


def _extract_object(text: str) -> dict[str, Any]:
    start = text.find("{")
    if start < 0:
        raise _error("no JSON object found", "Your reply did not contain a JSON object.", text)
    try:
        value, _ = _DECODER.raw_decode(text, start)
    except json.JSONDecodeError as exc:
        raise _error(
            f"invalid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
            f"Your reply was not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}).",
            text,
        ) from exc
    if not isinstance(value, dict):  # raw_decode at "{" yields a dict; kept for the type checker
        raise _error("not a JSON object", "Your reply must be a JSON object.", text)
    return value


def _error(message: str, problem: str, raw: str) -> ParseError:
    feedback = f"{problem} Reply with one JSON object, either\n{_TOOL_FORMAT}\nor\n{_FINAL_FORMAT}"
    return ParseError(f"JSON reply not understood: {message}", feedback=feedback, raw=raw)
