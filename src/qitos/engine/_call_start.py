"""When a durable step's tool call counts as started: the moment it begins, not when it is queued.

A tool call that is not idempotent is recorded started before its tool runs, so that after a crash
it is reported ``interrupted`` rather than run a second time. The record must be written when the
call *begins*: a sync tool of an async run may wait for a thread of the bounded executor, and a call
of a decision's batch for one of its ``max_parallel_tools`` slots; a call that waited and never
began must run on resume. :class:`RecordedStart` is the ``qitos.core._tool.CallStart`` the loop gives
such a call: the registry calls :meth:`~RecordedStart.begin` in the thread that runs a sync tool,
just before it, and awaits :meth:`~RecordedStart.abegin` just before an ``async def`` tool.

A cancelled run decides each call's fate with :meth:`RecordedStart.abandon`: a call that has not
begun is given up for good (its ``begin`` will refuse, so it never starts, and it is not in the
step's started set, so it runs on resume); a sync call already begun in a thread cannot be
interrupted, so its run waits for it and keeps its result (:class:`StepResults`), which the stop's
boundary makes durable.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TypeVar

from qitos.core._decision import Action
from qitos.core._errors import RunError
from qitos.core._tool import ToolResult
from qitos.sessions._journal import PendingStep, RunJournal

__all__ = ["CallAbandoned", "RecordedStart", "StepResults", "outlast_cancel"]

_T = TypeVar("_T")

_WAITING, _BEGUN_IN_THREAD, _BEGUN_ON_LOOP, _ABANDONED = range(4)


class CallAbandoned(RunError):
    """Raised by ``begin`` for a call its cancelled run gave up before it began (it never runs)."""


class RecordedStart:
    """Records one call's start through the run's journal when the call begins (see the module)."""

    __slots__ = ("_lock", "_stage", "action", "journal", "pending", "step_id")

    def __init__(self, journal: RunJournal, pending: PendingStep, step_id: int, action: Action) -> None:
        self.journal = journal
        self.pending = pending
        self.step_id = step_id
        self.action = action
        self._lock = threading.Lock()
        self._stage = _WAITING

    def begin(self) -> None:
        """In the thread about to run the sync tool: claim the call, then write its start."""
        self._claim(_BEGUN_IN_THREAD)
        self.journal.record_tool_started(self.step_id, self.action)

    async def abegin(self) -> None:
        """On the loop, just before the ``async def`` tool is awaited: claim it, write its start.

        A cancellation meanwhile lets the write finish first (the journal stays in step with the
        store), then the tool is not run.
        """
        self._claim(_BEGUN_ON_LOOP)
        write = asyncio.ensure_future(self.journal.arecord_tool_started(self.step_id, self.action))
        try:
            await asyncio.shield(write)
        except asyncio.CancelledError:
            if not write.done():
                await outlast_cancel(write)
            raise

    def abandon(self) -> bool:
        """Give the call up if it has not begun (then it never will); whether it was given up."""
        with self._lock:
            if self._stage == _WAITING:
                self._stage = _ABANDONED
            return self._stage == _ABANDONED

    @property
    def runs_in_thread(self) -> bool:
        """Whether the call has begun in a thread (it cannot be interrupted: wait for its result)."""
        return self._stage == _BEGUN_IN_THREAD

    def _claim(self, stage: int) -> None:
        with self._lock:
            if self._stage == _ABANDONED:
                raise CallAbandoned(f"call {self.action.id!r} was given up by its cancelled run before it began")
            self._stage = stage
        # In the step's started set before the write: whatever the store ends up holding, the
        # boundary the run commits next never lets this call run a second time.
        self.pending.started.add(self.action.id)


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


async def outlast_cancel(task: asyncio.Future[_T]) -> _T:
    """``task``'s result, awaited to its end however often the awaiting task is cancelled meanwhile."""
    while True:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                return task.result()  # the task itself was cancelled: that CancelledError propagates
