"""The per-run context: everything one run of the loop keeps, shared by the loop, the model path and
the drivers.

A :class:`RunContext` is created when a run starts and dropped when it ends; it is never persisted
as such (a durable run's journal persists what a restore needs). It depends on nothing but core,
sessions' journal seam, events and the trace writer, so every engine module can import it without
importing each other:

- the loop (``qitos.engine._loop``) creates it, advances it step by step and finishes it;
- the model path (``qitos.engine._model_path``) reads the task, state, steering and exchange log from
  it and records the log it builds there;
- the drivers (``qitos.engine._drivers``) set its cancellation flags when the awaiting task is
  cancelled.

Fields that matter outside the loop:

``run_id``, ``task``, ``state``, ``journal``: what is being run and where it is recorded.
``emit``: sends one event to the result's event list, the trace, ``on_event`` and listeners.
``log``: the run's ExchangeLog (None until the first model step, or restored from a session).
``steering`` / ``control_position``: steering texts handed to this step's decide (taken in only by
a boundary that lets its step go on) and the control cursor (the position of the last control item
delivered; a durable boundary records it).
``pause_position``: the last pause request honoured (a pause request is consumed when the run stops
for it, independently of the steering cursor).
``cancel`` / ``cancel_immediate``: cooperative cancellation, checked at every boundary and, when
immediate, at every phase end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from qitos.core._state import StopReason
from qitos.core._task import Task
from qitos.engine._events import EngineEvent, StepRecord
from qitos.sessions._journal import BoundaryCommit, PendingStep, RunJournal
from qitos.trace._writer import TraceWriter

__all__ = ["RunContext", "StopRun"]


class StopRun(Exception):
    """Leave the loop with a stop reason (raised inside the loop, never escapes the engine)."""

    def __init__(self, reason: StopReason, detail: str | None = None) -> None:
        super().__init__(reason.value)
        self.reason = reason
        self.detail = detail


@dataclass(eq=False)
class RunContext:
    """Mutable bookkeeping of one run (see the module docstring for what each part is for)."""

    run_id: str
    task: Task
    state: Any
    journal: RunJournal
    emit: Callable[[EngineEvent], None]
    workspace: str | None
    started: float
    max_steps: int
    max_runtime: float | None
    max_tokens: int | None
    log: Any = None
    tokens_used: int = 0
    records: list[StepRecord] = field(default_factory=list)
    events: list[EngineEvent] = field(default_factory=list)
    observation: Any = None
    control_position: int = 0
    pause_position: int = 0
    pending: PendingStep | None = None
    last_commit: BoundaryCommit | None = None  # the last step boundary handed to a durable journal
    step_changes: list[dict[str, Any]] = field(default_factory=list)
    steering: list[str] = field(default_factory=list)
    last_request_view: Any = None
    error: str | None = None
    elapsed_before: float = 0.0
    writer: TraceWriter | None = None
    run_dir: str | None = None
    live: bool = False
    first_step: int = 0  # where this run started (a resumed session run starts past 0)
    tokens_before: int = 0  # the session's tokens before this run
    cancel: bool = False
    cancel_immediate: bool = False

    def request_cancel(self, *, immediate: bool = False) -> None:
        """Stop this run after its current step, or (``immediate``) as soon as its current phase ends."""
        self.cancel_immediate = self.cancel_immediate or immediate
        self.cancel = True
