"""When a durable step's tool call counts as started: the moment it begins, not when it is queued.

A tool call that is not idempotent is recorded started before its tool runs, so that after a crash
it is reported ``interrupted`` rather than run a second time. The record must be written when the
call *begins*: a sync tool of an async run may wait for a thread of the bounded executor, and a call
of a decision's batch for one of its ``max_parallel_tools`` slots; a call that waited and never
began must run on resume. :class:`RecordedStart` is the ``qitos.core.tool.CallStart`` the loop gives
such a call: the registry calls :meth:`~RecordedStart.begin` in the thread that runs a sync tool,
just before it, and awaits :meth:`~RecordedStart.abegin` just before an ``async def`` tool.
"""

from __future__ import annotations

from qitos.core.decision import Action
from qitos.core.tool import ToolResult
from qitos.sessions.journal import PendingStep, RunJournal

__all__ = ["RecordedStart", "StepResults"]


class RecordedStart:
    """Records one call's start through the run's journal when the call begins (see the module)."""

    __slots__ = ("action", "journal", "pending", "step_id")

    def __init__(self, journal: RunJournal, pending: PendingStep, step_id: int, action: Action) -> None:
        self.journal = journal
        self.pending = pending
        self.step_id = step_id
        self.action = action

    def begin(self) -> None:
        """In the thread about to run the sync tool: write the call's start."""
        self.pending.started.add(self.action.id)
        self.journal.record_tool_started(self.step_id, self.action)

    async def abegin(self) -> None:
        """On the loop, just before the ``async def`` tool is awaited: write the call's start."""
        self.pending.started.add(self.action.id)
        await self.journal.arecord_tool_started(self.step_id, self.action)


class StepResults:
    """Where a step's tool results go as they arrive: its pending step, and the journal's next write."""

    __slots__ = ("journal", "pending", "step_id")

    def __init__(self, journal: RunJournal, pending: PendingStep, step_id: int) -> None:
        self.journal = journal
        self.pending = pending
        self.step_id = step_id

    def keep(self, result: ToolResult) -> None:
        """Record ``result`` (in the driving thread or on the loop)."""
        self.pending.results[result.call_id] = result.to_dict()
        self.journal.record_tool_result(self.step_id, result)

    def __repr__(self) -> str:
        return f"StepResults(step_id={self.step_id!r})"
