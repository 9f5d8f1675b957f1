"""Decisions from native tool calls: :func:`decision_from_tool_calls`.

For models with native tool calling (OpenAI-compatible servers, the embedded local model), the
model's :class:`~qitos.models._base.ModelResponse` already separates tool calls from text. This turns
it into a :class:`~qitos.core._decision.Decision`:

- tool calls -> ``Decision.act`` with one ``Action`` per call, keeping the provider's call ids (the
  tool results must answer those ids), and the accompanying text as the rationale;
- text only -> ``Decision.final(text)``;
- anything unusable -> :class:`~qitos.kit.parsers._base.ParseError` with repair feedback: a call
  without a name, arguments that are not a JSON object (``raw_arguments`` is quoted back), a tool
  name not in ``tool_names`` (when given), an empty reply, or a text reply cut off at the output
  limit (``finish_reason == "length"``, never passed off as a final answer).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from qitos.core._decision import Action, Decision
from qitos.kit.parsers._base import ParseError

if TYPE_CHECKING:
    from qitos.models._base import ModelResponse

__all__ = ["NATIVE_PROTOCOL_ID", "decision_from_tool_calls"]

NATIVE_PROTOCOL_ID = "qitos.native_tools/v1"


def decision_from_tool_calls(response: ModelResponse, *, tool_names: Collection[str] | None = None) -> Decision[Any]:
    """The decision carried by a model response's native tool calls (or its text); see the module."""
    raw = _raw_text(response)
    if response.tool_calls:
        problems: list[str] = []
        actions: list[Action] = []
        for i, call in enumerate(response.tool_calls):
            label = f"tool call #{i + 1}" + (f" ({call.name!r})" if call.name else "")
            if not call.name:
                problems.append(f"{label} has no tool name")
                continue
            if tool_names is not None and call.name not in tool_names:
                available = ", ".join(sorted(tool_names)) or "none"
                problems.append(f"{label}: there is no tool named {call.name!r} (available: {available})")
                continue
            if call.arguments is None:
                problems.append(f"{label}: arguments are not a JSON object ({_json_problem(call.raw_arguments)})")
                continue
            actions.append(Action(name=call.name, args=call.arguments, id=call.id))
        if problems:
            raise ParseError(
                "unusable tool calls: " + "; ".join(problems),
                feedback=(
                    "Your tool calls could not be run: "
                    + "; ".join(problems)
                    + ". Call the tools again with an exact tool name and a JSON object as arguments."
                ),
                raw=raw,
            )
        return Decision.act(actions, rationale=(response.text or None))
    text = (response.text or "").strip()
    if response.finish_reason == "length":
        raise ParseError(
            "reply cut off at the output limit",
            feedback=(
                "Your reply was cut off at the output length limit, so it cannot be used as the answer. "
                "Answer again, more briefly."
            ),
            raw=raw,
        )
    if not text:
        raise ParseError(
            "empty reply",
            feedback="Your reply was empty. Call a tool, or reply with the answer as plain text.",
            raw=raw,
        )
    return Decision.final(text)


def _json_problem(raw_arguments: str) -> str:
    excerpt = raw_arguments if len(raw_arguments) <= 120 else raw_arguments[:117] + "..."
    try:
        value = json.loads(raw_arguments)
    except json.JSONDecodeError as exc:
        return f"invalid JSON, {exc.msg} at column {exc.colno}: {excerpt}"
    return f"got a JSON {type(value).__name__}: {excerpt}"


def _raw_text(response: ModelResponse) -> str:
    parts = [response.text or ""]
    parts.extend(f"{c.name}({c.raw_arguments})" for c in response.tool_calls)
    return "\n".join(p for p in parts if p)
