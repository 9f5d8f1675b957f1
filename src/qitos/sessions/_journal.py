"""The loop's durability seam: what the engine tells a journal, and what a journal hands back.

A plain run uses ``RunJournal`` itself, which keeps nothing. A durable session
(``qitos.engine.session_runtime``) subclasses it to persist every boundary and, inside a step, the
decision and each tool call's intent and result *before* moving on (LangGraph's "pending writes"),
so a crash never loses a committed step and never silently repeats a side effect.

Every operation that may touch the store has an async twin (``acontrol``, ``arecord_decision``,
``arecord_tool_started``, ``arecord_tool_result``, ``acommit``, ``aclose``) that the engine's async
driver awaits; a durable journal builds both over one I/O-free preparation. ``drain_committed``
hands the engine the step records whose boundaries became durable, so the trace shows only what
the store holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from qitos.core._decision import Action
from qitos.core._state import StateSchema
from qitos.core._tool import ToolResult

__all__ = ["Approval", "BoundaryCommit", "ControlBatch", "PendingStep", "ResumePoint", "RunJournal", "SteeringItem"]


@dataclass(frozen=True)
class SteeringItem:
    """A steering text submitted to a session, with its durable position."""

    position: int
    text: str


@dataclass(frozen=True)
class Approval:
    """A human's answer to a tool call that needs approval."""

    call_id: str
    approved: bool
    reason: str | None = None


@dataclass(frozen=True)
class ControlBatch:
    """Control items not yet consumed: a pause request, steering texts, approvals.

    ``last_position`` is the cursor to record once ``steering`` has been delivered;
    ``pause_position`` the position of the latest pause request (consumed by the stop it causes).
    """

    pause_requested: bool = False
    steering: tuple[SteeringItem, ...] = ()
    approvals: Mapping[str, Approval] = field(default_factory=dict)
    last_position: int = 0
    pause_position: int = 0


@dataclass
class PendingStep:
    """A step that started but did not commit: its decision and the tool calls it got through."""

    step_id: int
    decision: dict[str, Any]
    model: dict[str, Any] | None = None
    request_view: dict[str, Any] | None = None
    log_entries: list[dict[str, Any]] = field(default_factory=list)
    state_changes: list[dict[str, Any]] = field(default_factory=list)
    started: set[str] = field(default_factory=set)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    control_position: int = 0
    # The calls whose tools need a human's approval: recorded so inspection, the CLI and the
    # viewer can show what a session waits for from the store alone, without the agent's code.
    approval_calls: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form (``approval_calls`` only when there are some, as earlier versions wrote it)."""
        out = {
            "step_id": self.step_id,
            "decision": self.decision,
            "model": self.model,
            "request_view": self.request_view,
            "log_entries": self.log_entries,
            "state_changes": self.state_changes,
            "started": sorted(self.started),
            "results": self.results,
            "control_position": self.control_position,
        }
        if self.approval_calls:
            out["approval_calls"] = list(self.approval_calls)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PendingStep:
        """Inverse of :meth:`to_dict`."""
        return cls(
            step_id=int(data["step_id"]),
            decision=dict(data["decision"]),
            model=data.get("model"),
            request_view=data.get("request_view"),
            log_entries=list(data.get("log_entries") or []),
            state_changes=list(data.get("state_changes") or []),
            started=set(data.get("started") or []),
            results=dict(data.get("results") or {}),
            control_position=int(data.get("control_position") or 0),
            approval_calls=[str(c) for c in data.get("approval_calls") or []],
        )


@dataclass
class ResumePoint:
    """Where a durable run continues: restored state and log, counters, and any pending step."""

    state: StateSchema
    log: Any
    budget_used: Mapping[str, Any] = field(default_factory=dict)
    pending: PendingStep | None = None
    carry_changes: list[dict[str, Any]] = field(default_factory=list)
    fresh: bool = False
    """True for a session's first run (its created snapshot): the run is not reported as resumed."""


@dataclass
class BoundaryCommit:
    """One step boundary to make durable."""

    step_id: int
    state: StateSchema
    state_changes: list[dict[str, Any]]
    log: Any
    lifecycle: str
    stop_reason: str | None
    budget_used: dict[str, Any]
    control_position: int
    pending: PendingStep | None = None
    record: Any = None
    request_view: Any = None
    pause_position: int = 0
    # Where the exchange log stood at this boundary; a durable journal fills them in when the
    # boundary is handed to it, so a boundary written later (batched) never takes newer entries.
    log_position: int | None = None
    log_digest: str | None = None


class RunJournal:
    """The non-durable journal: consulted at every boundary, keeps nothing."""

    durable = False

    def control(self, step_id: int, *, fresh: bool = False) -> ControlBatch:
        """Control items that arrived since the last consumed position (``fresh``: re-read them now)."""
        return _NO_CONTROL

    def record_decision(self, pending: PendingStep) -> None:
        """Persist a step's decision (and what decide appended) before any tool runs."""

    def record_tool_started(self, step_id: int, action: Action, *, idempotent: bool = False) -> None:
        """Persist the intent to run ``action`` before it runs (a durable journal may skip the start
        of an ``idempotent`` call: a restore runs such a call again anyway)."""

    def record_tool_result(self, step_id: int, result: ToolResult) -> None:
        """Hand over a tool result; a durable journal writes it with the step's next durable write."""

    def commit(self, boundary: BoundaryCommit) -> None:
        """Make a boundary durable (a step's end, a pause, or the run's end)."""

    def close(self) -> None:
        """Flush anything buffered (batched durability)."""

    def drain_committed(self) -> list[Any]:
        """The step records of boundaries made durable since the last call (none here)."""
        return []

    # ---- async twins (the async driver awaits these; here they do what the sync ones do)

    async def acontrol(self, step_id: int, *, fresh: bool = False) -> ControlBatch:
        """Async twin of :meth:`control`."""
        return self.control(step_id, fresh=fresh)

    async def arecord_decision(self, pending: PendingStep) -> None:
        """Async twin of :meth:`record_decision`."""
        self.record_decision(pending)

    async def arecord_tool_started(self, step_id: int, action: Action, *, idempotent: bool = False) -> None:
        """Async twin of :meth:`record_tool_started`."""
        self.record_tool_started(step_id, action, idempotent=idempotent)

    async def arecord_tool_result(self, step_id: int, result: ToolResult) -> None:
        """Async twin of :meth:`record_tool_result`."""
        self.record_tool_result(step_id, result)

    async def acommit(self, boundary: BoundaryCommit) -> None:
        """Async twin of :meth:`commit`."""
        self.commit(boundary)

    async def aclose(self) -> None:
        """Async twin of :meth:`close`."""
        self.close()


_NO_CONTROL = ControlBatch()
