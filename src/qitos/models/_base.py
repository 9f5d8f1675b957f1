"""The model adapter contract: ``ModelAdapter`` and its records.

A model adapter turns one provider-neutral :class:`~qitos.core.request_view.RequestView` into a
:class:`ModelResponse` (text, native tool calls, token usage, finish reason, raw provider data).
It has exactly one required method, :meth:`ModelAdapter.complete`; ``acomplete`` is its async twin
(awaited by the engine's async driver) and by default runs ``complete`` in a worker thread.

Capacity is *declared*: ``max_input_units`` and ``unit`` ("characters" or "tokens") come from the
adapter class or its constructor, never from a guess based on the model's name.

Streaming: when ``complete`` is given ``on_delta`` and the adapter can stream, it calls
``on_delta(chunk)`` with each piece of text as it arrives (the engine turns these into
``model_delta`` events). Adapters that cannot stream ignore ``on_delta`` and return the whole
response; callers must not rely on receiving deltas.

Adapter events (retries and the like): every adapter carries a listener list. The engine
subscribes with :meth:`ModelAdapter.subscribe` and receives ``listener(kind, payload)`` calls,
e.g. ``("model_retry", {"attempt": 1, "max_retries": 3, "delay_s": 0.42, "reason": "HTTP 429",
"status_code": 429})``. Payloads are JSON-native and never contain credentials. A listener that
raises propagates its exception to the caller of ``complete``; keep listeners trivial.

Network guard (a test suite must never reach a paid service by accident): adapters that reach a real service call
:func:`check_allow_model_requests` first; tests set ``qitos.models._base.ALLOW_MODEL_REQUESTS =
False`` to make any accidental network call fail loudly. Loopback test servers are still
"model requests": a test that talks to one flips the flag back on for its duration.
"""

from __future__ import annotations

import abc
import asyncio
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from qitos.core._codec import canonical_json, sha256_hex
from qitos.core._errors import ConfigurationError

if TYPE_CHECKING:
    from qitos.core.request_view import RequestView

__all__ = [
    "ALLOW_MODEL_REQUESTS",
    "DeltaCallback",
    "EventListener",
    "ModelAdapter",
    "ModelRequestsDisabledError",
    "ModelResponse",
    "ToolCall",
    "Unit",
    "Usage",
    "check_allow_model_requests",
    "check_capacity",
    "decode_arguments",
    "request_digest",
]

ALLOW_MODEL_REQUESTS = True
"""Module flag: set to False (e.g. in a test fixture) to forbid adapters from reaching a service."""

Unit = Literal["characters", "tokens"]
DeltaCallback = Callable[[str], None]
EventListener = Callable[[str, dict[str, Any]], None]


class ModelRequestsDisabledError(ConfigurationError):
    """A real model adapter was called while ``ALLOW_MODEL_REQUESTS`` is False."""


def check_allow_model_requests() -> None:
    """Raise :class:`ModelRequestsDisabledError` when model requests are switched off."""
    if not ALLOW_MODEL_REQUESTS:
        raise ModelRequestsDisabledError(
            "model requests are disabled (qitos.models._base.ALLOW_MODEL_REQUESTS is False); "
            "use ScriptedModel/FunctionModel/ReplayModel in tests, or set the flag to True"
        )


def check_capacity(max_input_units: int | None, unit: str) -> None:
    """Validate a declared capacity; raise ConfigurationError naming the bad value."""
    if unit not in ("characters", "tokens"):
        raise ConfigurationError(f"unit must be 'characters' or 'tokens', got {unit!r}")
    if max_input_units is not None and (
        isinstance(max_input_units, bool) or not isinstance(max_input_units, int) or max_input_units <= 0
    ):
        raise ConfigurationError(f"max_input_units must be a positive int or None, got {max_input_units!r}")


def request_digest(view: RequestView) -> str:
    """SHA-256 of what a model sees in ``view``: its messages and tool schemas (canonical JSON).

    Two views with the same digest are the same request as far as any adapter is concerned;
    ReplayModel uses it to detect a run that diverged from its recording.

    The view already holds each message and schema as canonical JSON text, so the canonical text
    of ``{"messages": view.messages(), "tools": view.tools()}`` is assembled from those texts
    rather than parsed and re-encoded: a long transcript costs a join, not a parse per item.
    """
    messages = [
        *view.instructions_json,
        *(canonical_json(json.loads(text)["message"]) for text in view.context_json),
        *view.selected_items_json,
    ]
    return sha256_hex('{"messages":[' + ",".join(messages) + '],"tools":[' + ",".join(view.tool_schemas_json) + "]}")


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, kw_only=True)
class Usage:
    """Token usage of one model call.

    ``estimated`` is True when the provider reported no usage and the adapter counted the tokens
    itself (the OpenAI-compatible adapter does this for a server that ignores
    ``stream_options.include_usage``); a sum is estimated when any part of it is. Zero with
    ``estimated=False`` means the provider said nothing and nothing was counted.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    estimated: bool = False

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            estimated=self.estimated or other.estimated,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form; ``"estimated": true`` is present only for a locally counted usage."""
        out: dict[str, Any] = {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}
        if self.estimated:
            out["estimated"] = True
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Usage:
        """Inverse of :meth:`to_dict`."""
        return cls(
            input_tokens=int(data.get("input_tokens", 0)),
            output_tokens=int(data.get("output_tokens", 0)),
            estimated=bool(data.get("estimated", False)),
        )


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One native tool call requested by the model.

    ``arguments`` is the decoded JSON object, or None when the model's argument text was not a
    JSON object; ``raw_arguments`` always keeps the text exactly as the model produced it, so the
    engine can show the model what was wrong.
    """

    id: str
    name: str
    arguments: dict[str, Any] | None
    raw_arguments: str

    @classmethod
    def from_raw(cls, *, id: str, name: str, raw_arguments: str) -> ToolCall:
        """Build a call from the model's argument text, decoding it when it is a JSON object."""
        return cls(id=id, name=name, arguments=decode_arguments(raw_arguments), raw_arguments=raw_arguments)

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form."""
        return {"id": self.id, "name": self.name, "arguments": self.arguments, "raw_arguments": self.raw_arguments}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolCall:
        """Inverse of :meth:`to_dict`."""
        arguments = data.get("arguments")
        return cls(
            id=str(data["id"]),
            name=str(data["name"]),
            arguments=dict(arguments) if isinstance(arguments, Mapping) else None,
            raw_arguments=str(data.get("raw_arguments", "")),
        )


def decode_arguments(raw: str) -> dict[str, Any] | None:
    """The JSON object in ``raw`` (empty text counts as ``{}``), or None if it is not one."""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True, kw_only=True)
class ModelResponse:
    """What one model call returned.

    Tool-call ids are normalized on construction: an empty id becomes ``call_<i>`` and a repeated
    one gets a ``_<i>`` suffix, so every consumer (decision, exchange log, trace) sees the same
    unique ids. ``text`` is the assistant's text (None when it only called tools); ``tool_calls`` the native
    tool calls in order; ``finish_reason`` as the provider reported it (``stop``, ``tool_calls``,
    ``length``...); ``model`` the model that answered; ``raw`` the provider's decoded payload
    (JSON-native for the built-in adapters); ``served_from`` is set when no model was called for
    it: ``"cache"`` (an eval's response cache) or ``"replay"`` (a recorded reply), so the request
    record says so.
    """

    text: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    finish_reason: str | None = None
    model: str = ""
    raw: Any = field(default=None, repr=False, compare=False)
    served_from: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # Tool-call ids must be unique and non-empty: results are matched to calls by id.
        seen: set[str] = set()
        fixed = []
        for i, call in enumerate(self.tool_calls):
            call_id = call.id or f"call_{i}"
            while call_id in seen:
                call_id = f"{call_id}_{i}"
            seen.add(call_id)
            fixed.append(call if call_id == call.id else replace(call, id=call_id))
        object.__setattr__(self, "tool_calls", tuple(fixed))

    def message(self) -> dict[str, Any]:
        """The assistant message this response adds to an exchange log (provider-neutral).

        Always valid for :class:`~qitos.core._exchange.ExchangeLog`, even for unusable calls:
        arguments that were not a JSON object are kept as ``{"_raw_arguments": "<text>"}`` and a
        missing name becomes ``"missing_tool_name"``, so nothing the model said is lost.
        """
        msg: dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            msg["tool_calls"] = [
                {
                    "id": c.id,
                    "name": c.name or "missing_tool_name",
                    "arguments": c.arguments if c.arguments is not None else {"_raw_arguments": c.raw_arguments},
                }
                for c in self.tool_calls
            ]
        return msg

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form for traces and replay (``raw`` is kept when it is JSON-native;
        ``served_from`` only when set)."""
        out = {
            "text": self.text,
            "tool_calls": [c.to_dict() for c in self.tool_calls],
            "usage": self.usage.to_dict(),
            "finish_reason": self.finish_reason,
            "model": self.model,
            "raw": _json_native(self.raw),
        }
        if self.served_from is not None:
            out["served_from"] = self.served_from
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelResponse:
        """Inverse of :meth:`to_dict`."""
        return cls(
            text=data.get("text"),
            tool_calls=tuple(ToolCall.from_dict(c) for c in data.get("tool_calls") or ()),
            usage=Usage.from_dict(data.get("usage") or {}),
            finish_reason=data.get("finish_reason"),
            model=str(data.get("model") or ""),
            raw=data.get("raw"),
            served_from=data.get("served_from"),
        )


def _json_native(value: object) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, Mapping):
        return {str(k): _json_native(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_native(v) for v in value]
    return repr(value)


# --------------------------------------------------------------------------- adapter


class ModelAdapter(abc.ABC):
    """Base of every model adapter. Subclasses implement :meth:`complete` only.

    Class or instance attributes:

    - ``model_id``: the model this adapter talks to (for traces);
    - ``max_input_units``: declared input capacity, or None when undeclared (the context budget
      policy then uses its own default);
    - ``unit``: the unit of ``max_input_units``, ``"characters"`` or ``"tokens"``;
    - ``tokenizer``: the model's own tokenizer, by its name in the offline tokenizer package
      (``cl100k_base``, ``o200k_base``, ``llama3``...), or None when it is none of them: token
      counts are exact only with it, and labelled estimates otherwise (``qitos.core.context``).
    """

    model_id: str = ""
    max_input_units: int | None = None
    unit: Unit = "characters"
    tokenizer: str | None = None

    @abc.abstractmethod
    def complete(self, view: RequestView, *, on_delta: DeltaCallback | None = None) -> ModelResponse:
        """Answer one request. Stream text to ``on_delta`` when given and supported."""

    async def acomplete(self, view: RequestView, *, on_delta: DeltaCallback | None = None) -> ModelResponse:
        """Async twin of :meth:`complete`; the engine's async driver (``AsyncEngine.arun``,
        ``Session.arun``) awaits it. Override it when the adapter can wait natively (the
        OpenAI-compatible adapter does, over httpx), so many requests wait on one event loop. The
        default runs ``complete`` in a worker thread of the loop's default executor, so ``on_delta``
        and event listeners are then called from that thread (the engine hands them back to its
        event loop, in order)."""
        return await asyncio.to_thread(self.complete, view, on_delta=on_delta)

    # ---- events

    def subscribe(self, listener: EventListener) -> Callable[[], None]:
        """Add an event listener; returns a function that removes it again."""
        listeners = self._event_listeners()
        with _LISTENER_LOCK:
            listeners.append(listener)

        def unsubscribe() -> None:
            with _LISTENER_LOCK:
                if listener in listeners:
                    listeners.remove(listener)

        return unsubscribe

    def emit(self, kind: str, payload: dict[str, Any]) -> None:
        """Report an adapter event (``model_retry``...) to every listener."""
        registered = self._event_listeners()
        with _LISTENER_LOCK:
            listeners = tuple(registered)
        for listener in listeners:
            listener(kind, payload)

    def _event_listeners(self) -> list[EventListener]:
        # Created lazily so subclasses need not call super().__init__().
        listeners: list[EventListener] | None = self.__dict__.get("_qitos_listeners")
        if listeners is None:
            with _LISTENER_LOCK:
                listeners = self.__dict__.setdefault("_qitos_listeners", [])
        return listeners

    # ---- description

    provider: str = "unspecified"
    """Who serves the model (``openai-compatible``, ``local``, ``scripted``...), for request targets."""
    transport: str = "in-process"
    """How requests reach it (``http`` or ``in-process``)."""

    def request_target(self) -> dict[str, str]:
        """The target this adapter declares for RequestView (``RequestTarget.from_model`` reads it)."""
        return {"provider": self.provider, "model": self.model_id, "transport": self.transport, "api_mode": "chat"}

    def describe(self) -> dict[str, Any]:
        """JSON-native description for traces: adapter class, model id, declared capacity and tokenizer."""
        return {
            "adapter": type(self).__name__,
            "model_id": self.model_id,
            "max_input_units": self.max_input_units,
            "unit": self.unit,
            "tokenizer": self.tokenizer,
        }

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(model_id={self.model_id!r}, max_input_units={self.max_input_units!r}, "
            f"unit={self.unit!r})"
        )


_LISTENER_LOCK = threading.Lock()
