"""The ReAct text protocol: ``Thought: ... Action: name[{json}]`` or ``Final Answer: ...``.

Accepted reply forms (keywords are case-insensitive, each at the start of a line)::

    Thought: I need the file list.
    Action: list_files[{"path": "."}]

    Thought: ...
    Action: list_files
    Action Input: {"path": "."}

    Thought: I know the answer.
    Final Answer: There are three files.

Several ``Action:`` lines in one reply are parallel tool calls. Anything from the first line that
starts with ``Observation:`` on is ignored (a model inventing its own tool results). A reply with
both an action and a final answer, with neither, with arguments that are not a JSON object, or with
an empty final answer raises :class:`~qitos.kit.parsers._base.ParseError` with repair feedback.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from qitos.core._decision import Action, Decision
from qitos.kit.parsers._base import DecisionParser, ParseError, check_tool_name, describe_tools

__all__ = ["ReActParser"]

_FORMAT = 'Thought: <reasoning>\nAction: <tool name>[{"argument": "value"}]'
_FINAL_FORMAT = "Thought: <reasoning>\nFinal Answer: <the answer>"

_OBSERVATION = re.compile(r"^[ \t]*Observation[ \t]*:", re.IGNORECASE | re.MULTILINE)
_ACTION = re.compile(r"^[ \t]*Action[ \t]*:[ \t]*", re.IGNORECASE | re.MULTILINE)
_ACTION_INPUT = re.compile(r"^[ \t]*Action[ \t]+Input[ \t]*:[ \t]*", re.IGNORECASE | re.MULTILINE)
_FINAL = re.compile(r"^[ \t]*Final[ \t]+Answer[ \t]*:[ \t]*", re.IGNORECASE | re.MULTILINE)
_THOUGHT = re.compile(r"^[ \t]*Thought[ \t]*:[ \t]*", re.IGNORECASE | re.MULTILINE)
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_DECODER = json.JSONDecoder()


class ReActParser(DecisionParser):
    """Parses ReAct-style replies into decisions; see the module docstring for the format."""

    protocol_id = "qitos.react/v1"

    def instructions(self, tool_schemas: Iterable[Mapping[str, Any]]) -> str:
        """System-prompt text describing the format and the tools."""
        return (
            "Work step by step. Each reply is EITHER one tool call:\n\n"
            f"{_FORMAT}\n\n"
            "OR, when you can answer the task:\n\n"
            f"{_FINAL_FORMAT}\n\n"
            "The arguments are one JSON object on the Action line (use {} for none). After an Action, stop: "
            "the tool's result comes back to you as an Observation. Never write an Observation yourself.\n\n"
            f"Tools:\n{describe_tools(tool_schemas)}"
        )

    def parse(self, text: str, *, tool_names: Collection[str] | None = None) -> Decision[Any]:
        """The decision in a ReAct reply, or ParseError with repair feedback."""
        if not isinstance(text, str) or not text.strip():
            raise _error("empty reply", "Your reply was empty.", text if isinstance(text, str) else "")
        cut = _OBSERVATION.search(text)
        body = text[: cut.start()] if cut else text
        finals = list(_FINAL.finditer(body))
        actions = list(_ACTION.finditer(body))
        if finals and actions:
            raise _error(
                "reply has both an Action and a Final Answer",
                "Your reply contained both an Action and a Final Answer; give exactly one of them.",
                text,
            )
        if finals:
            answer = body[finals[0].end() :].strip()
            if not answer:
                raise _error("empty final answer", "Your Final Answer was empty.", text)
            return Decision.final(answer, rationale=_thought(body[: finals[0].start()]))
        if not actions:
            raise _error(
                "no Action or Final Answer found",
                "Your reply had neither an 'Action:' line nor a 'Final Answer:' line.",
                text,
            )
        parsed: list[Action] = []
        for i, match in enumerate(actions):
            end = actions[i + 1].start() if i + 1 < len(actions) else len(body)
            parsed.append(_parse_action(body[match.end() : end], text, tool_names))
        return Decision.act(parsed, rationale=_thought(body[: actions[0].start()]))


def _parse_action(segment: str, raw: str, tool_names: Collection[str] | None) -> Action:
    name_match = _NAME.match(segment)
    if name_match is None:
        raise _error("Action without a tool name", "Your Action line did not start with a tool name.", raw)
    name = name_match.group(0)
    check_tool_name(name, tool_names, raw, _FORMAT)
    rest = segment[name_match.end() :]
    stripped = rest.lstrip(" \t")
    if stripped.startswith("[") or stripped.startswith("("):
        closer = "]" if stripped[0] == "[" else ")"
        inner = stripped[1:].lstrip()
        if inner.startswith(closer):
            return Action(name=name, args={})
        args, after = _decode_object(inner, name, raw)
        if not after.lstrip().startswith(closer):
            raise _error(
                f"arguments of {name!r} are not closed with {closer!r}",
                f"The arguments of Action {name!r} must be one JSON object followed by {closer!r}.",
                raw,
            )
        return Action(name=name, args=args)
    input_match = _ACTION_INPUT.search(rest)
    if input_match is not None and not rest[: input_match.start()].strip():
        after_input = rest[input_match.end() :].strip()
        if not after_input:
            return Action(name=name, args={})
        args, _ = _decode_object(after_input, name, raw)
        return Action(name=name, args=args)
    if not rest.strip():
        return Action(name=name, args={})
    raise _error(
        f"cannot read the arguments of {name!r}",
        f"After the tool name {name!r} write its arguments as a JSON object in brackets, "
        f'e.g. {name}[{{"key": "value"}}].',
        raw,
    )


def _decode_object(text: str, name: str, raw: str) -> tuple[dict[str, Any], str]:
    try:
        value, end = _DECODER.raw_decode(text)
    except json.JSONDecodeError as exc:
        raise _error(
            f"arguments of {name!r} are not valid JSON: {exc.msg} at column {exc.colno}",
            f"The arguments of Action {name!r} are not valid JSON ({exc.msg} at column {exc.colno}).",
            raw,
        ) from exc
    if not isinstance(value, dict):
        raise _error(
            f"arguments of {name!r} are a JSON {type(value).__name__}, not an object",
            f'The arguments of Action {name!r} must be a JSON object like {{"key": "value"}}, '
            f"not a {type(value).__name__}.",
            raw,
        )
    return value, text[end:]


def _thought(prefix: str) -> str | None:
    match = _THOUGHT.search(prefix)
    thought = (prefix[match.end() :] if match else prefix).strip()
    return thought or None


def _error(message: str, problem: str, raw: str) -> ParseError:
    feedback = f"{problem} Reply in exactly one of these formats:\n{_FORMAT}\nor\n{_FINAL_FORMAT}"
    return ParseError(f"ReAct reply not understood: {message}", feedback=feedback, raw=raw)
