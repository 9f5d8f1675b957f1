"""What the offline adapters share: scripted responses, streaming them, and recording requests.

A scripted response (what :class:`~qitos.models._scripted.ScriptedModel` is given and what a
:class:`~qitos.models._function.FunctionModel` function returns) is one of:

- a ``str``: plain assistant text (the engine reads it as the final answer);
- a mapping with ``"tool_calls": [{"name": ..., "arguments": {...} | "<raw json>", "id"?: ...}]``
  and optionally ``"text"``, ``"finish_reason"`` and ``"usage": {"input_tokens", "output_tokens"}``
  (``arguments`` given as a string is kept raw, to script malformed JSON from a model);
- a :class:`~qitos.models._base.ModelResponse`, used as is.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from qitos.core._errors import ConfigurationError
from qitos.models._base import DeltaCallback, ModelAdapter, ModelResponse, ToolCall, Unit, Usage, check_capacity

if TYPE_CHECKING:
    from qitos.core.request_view import RequestView

__all__ = ["RecordingAdapter", "ScriptedResponse", "coerce_response", "stream_text"]

ScriptedResponse = str | Mapping[str, Any] | ModelResponse

_RESPONSE_KEYS = frozenset({"text", "tool_calls", "finish_reason", "usage"})


def coerce_response(value: object, *, index: int = 0, model: str = "") -> ModelResponse:
    """Turn a scripted response (see the module docstring) into a ModelResponse.

    Raises ConfigurationError naming ``index`` and the problem when the shape is wrong.
    """
    if isinstance(value, ModelResponse):
        return value
    if isinstance(value, str):
        return ModelResponse(text=value, finish_reason="stop", model=model, raw={"scripted": index})
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"scripted response #{index}: expected str, mapping or ModelResponse, got {type(value).__name__}"
        )
    unknown = set(value) - _RESPONSE_KEYS
    if unknown:
        raise ConfigurationError(
            f"scripted response #{index}: unknown keys {sorted(unknown)} (allowed: {sorted(_RESPONSE_KEYS)})"
        )
    text = value.get("text")
    if text is not None and not isinstance(text, str):
        raise ConfigurationError(f"scripted response #{index}: 'text' must be a string, got {type(text).__name__}")
    raw_calls = value.get("tool_calls") or []
    if not isinstance(raw_calls, Sequence) or isinstance(raw_calls, str):
        raise ConfigurationError(f"scripted response #{index}: 'tool_calls' must be a list")
    calls = tuple(_coerce_call(call, index, j) for j, call in enumerate(raw_calls))
    if text is None and not calls:
        raise ConfigurationError(f"scripted response #{index}: needs 'text' or at least one tool call")
    usage = value.get("usage") or {}
    if not isinstance(usage, Mapping):
        raise ConfigurationError(f"scripted response #{index}: 'usage' must be a mapping")
    default_finish = "tool_calls" if calls else "stop"
    return ModelResponse(
        text=text,
        tool_calls=calls,
        usage=Usage.from_dict(usage),
        finish_reason=value.get("finish_reason", default_finish),
        model=model,
        raw={"scripted": index},
    )


def _coerce_call(call: object, index: int, j: int) -> ToolCall:
    where = f"scripted response #{index}, tool call #{j}"
    if not isinstance(call, Mapping):
        raise ConfigurationError(f"{where}: expected a mapping with 'name' and 'arguments'")
    name = call.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"{where}: 'name' must be a non-empty string, got {name!r}")
    call_id = str(call.get("id") or f"call_{index}_{j}")
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        return ToolCall.from_raw(id=call_id, name=name, raw_arguments=arguments)
    if not isinstance(arguments, Mapping):
        raise ConfigurationError(f"{where}: 'arguments' must be a mapping or a raw JSON string")
    args = dict(arguments)
    return ToolCall(id=call_id, name=name, arguments=args, raw_arguments=json.dumps(args, ensure_ascii=False))


def stream_text(response: ModelResponse, on_delta: DeltaCallback | None) -> None:
    """Deliver a response's text to ``on_delta`` in word-sized chunks (as a provider would)."""
    if on_delta is None or not response.text:
        return
    text = response.text
    start = 0
    for i, char in enumerate(text):
        if char == " " and i > start:
            on_delta(text[start:i])
            start = i
    on_delta(text[start:])


class RecordingAdapter(ModelAdapter):
    """Base of the offline doubles: declared capacity, a lock, and the list of views received
    (``requests``)."""

    provider = "scripted"

    def __init__(self, *, model_id: str, max_input_units: int | None, unit: Unit) -> None:
        check_capacity(max_input_units, unit)
        self.model_id = model_id
        self.max_input_units = max_input_units
        self.unit = unit
        self.requests: list[RequestView] = []
        self._lock = threading.Lock()
