"""Events pass the redaction policy: the task's sk- key and the model's configured credentials never
reach EngineResult.events, an on_event callback or a hook."""

from __future__ import annotations

from typing import Any

from qitos import Engine
from qitos.core._redaction import REDACTED
from qitos.engine._events import EngineEvent
from secret_agents import API_KEY, HEADER_SECRET, TASK_KEY, KeyedModel, SecretAgent


def _texts(events: list[EngineEvent]) -> str:
    return "\n".join(repr(e.to_dict()) for e in events)


def test_events_never_carry_the_task_key_or_configured_credentials() -> None:
    seen: list[EngineEvent] = []
    result = Engine(SecretAgent(), model=KeyedModel()).run(
        f"log in with {TASK_KEY} then report {API_KEY}", on_event=seen.append
    )
    assert result.state.final_result is not None and API_KEY in result.state.final_result  # the run itself is unchanged
    for events in (result.events, seen):
        text = _texts(list(events))
        assert TASK_KEY not in text and API_KEY not in text and HEADER_SECRET not in text
    start = result.events[0]
    assert start.payload["task"] == f"log in with {REDACTED} then report {REDACTED}"
    assert REDACTED in (result.events[-1].payload["final_result"] or "")


def test_events_without_any_sink_are_redacted_too() -> None:
    result = Engine(SecretAgent(), model=KeyedModel()).run(f"use {TASK_KEY}")
    assert TASK_KEY not in _texts(list(result.events))


def test_a_hook_error_quoting_a_secret_is_redacted() -> None:
    class Leaky:
        def on_event(self, event: Any) -> None:
            if event.event_type == "run_start":
                raise RuntimeError(f"hook saw {API_KEY}")

    result = Engine(SecretAgent(), model=KeyedModel(), hooks=[Leaky()]).run("plain task")
    errors = [e for e in result.events if e.event_type == "error"]
    assert errors and all(API_KEY not in (e.error or "") for e in errors)
