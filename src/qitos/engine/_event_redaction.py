"""Events pass the redaction policy before anyone sees them (``qitos.core._redaction``).

Only events that can carry free text are rewritten: ``run_start`` (the task), ``run_end`` (the final
result), ``model_delta`` (streamed model text), ``steer``, ``approval``, ``model_retry``,
``compaction``, ``handoff``, ``delegate``, and any event with an ``error``. The per-step events
(``step_start``, ``decide``, ``act``, ``reduce``, …) carry ids, counts and kinds only, so they pass
untouched and the hot loop pays one set lookup per event.

Limit: each ``model_delta`` is redacted on its own, so a credential that a provider streams split
across two deltas is not caught in those two events (it is in everything written from the whole
response: the exchange log, the trace's step records, the store).
"""

from __future__ import annotations

from collections.abc import Callable

from qitos.core._redaction import Redactor
from qitos.engine._events import EngineEvent, EngineEventType

__all__ = ["TEXT_EVENTS", "redact_event", "redacting_sink"]

E = EngineEventType

TEXT_EVENTS: frozenset[EngineEventType] = frozenset(
    {
        E.RUN_START,
        E.RUN_END,
        E.MODEL_DELTA,
        E.STEER,
        E.APPROVAL,
        E.MODEL_RETRY,
        E.COMPACTION,
        E.HANDOFF,
        E.DELEGATE,
        E.ERROR,
    }
)
"""Event types whose payload may hold text from the task, the model, a tool or a human."""


def redact_event(event: EngineEvent, redact: Redactor) -> EngineEvent:
    """``event`` with its payload and error redacted (the same object when nothing changed)."""
    payload = redact.redact_value(event.payload)
    error = redact(event.error) if event.error is not None else None
    if payload is event.payload and error == event.error:
        return event
    return event._replace(payload=payload, error=error)


def redacting_sink(sink: Callable[[EngineEvent], None], redact: Redactor) -> Callable[[EngineEvent], None]:
    """A sink that redacts text-bearing events (see the module docstring) before ``sink`` gets them."""

    def emit(event: EngineEvent) -> None:
        if event.error is not None or event.event_type in TEXT_EVENTS:
            event = redact_event(event, redact)
        sink(event)

    return emit
