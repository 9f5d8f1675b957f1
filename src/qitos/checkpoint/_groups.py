"""Group commit: one writer per store per process takes the writes of every session in flight and
makes them durable together.

A store hands each write to its :class:`GroupWriter` as a piece of *work* (a function of the store's
transaction handle). Work that arrives while a group is being written waits, and the next group
takes everything waiting: one SQLite transaction, or one PostgreSQL round trip, for all of it.
Groups are formed from what is waiting, never by waiting on a timer, so a writer alone commits at
once. The store runs each piece of work behind its own checks (a head's compare-and-swap, a lease's
fence), so a refused one fails alone; each piece's outcome is handed back only once the whole group
is durable, and a group that fails to commit fails every piece in it.

Who writes a group:

- a synchronous caller (``Session.run``, a thread of its own) writes it itself when no group is in
  progress (no thread hop: a single session commits in its own thread), and otherwise waits for the
  group in progress to take its work and finish;
- an asynchronous caller's group is written by a task on its event loop (a SQLite group is a few
  hundred microseconds of CPU there, with no thread waiting for the loop's GIL at every statement;
  a PostgreSQL group is awaited), and each group's outcomes reach an event loop in one callback;
- work that waits behind a synchronous writer's group is written next by the store's writer thread,
  so the synchronous caller returns once its own work is durable.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from qitos.core._errors import CheckpointError

__all__ = ["GroupWriter", "Pending"]

_T = TypeVar("_T")
_W = TypeVar("_W")


class Pending(Generic[_W]):
    """One piece of work (whatever its store writes: a function of a SQLite cursor, a PostgreSQL plan)
    waiting for its group, then its outcome (a result or an error)."""

    __slots__ = ("error", "event", "future", "loop", "result", "work")

    def __init__(self, work: _W) -> None:
        self.work = work
        self.result: Any = None
        self.error: BaseException | None = None
        self.event: threading.Event | None = None
        self.future: asyncio.Future[Any] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def outcome(self) -> Any:
        """The work's result, or its error raised."""
        if self.error is not None:
            raise self.error
        return self.result


class GroupWriter(Generic[_W]):
    """The one writer of a store in this process (see the module docstring).

    ``write_group`` writes a list of :class:`Pending` in one transaction, setting each one's
    ``result`` or ``error`` (an error of its own work leaves the others unaffected; an error raised
    by ``write_group`` itself fails the whole group). ``awrite_group`` is its coroutine twin, which
    writes the groups of asynchronous callers on their event loop.
    """

    def __init__(
        self,
        write_group: Callable[[list[Pending[_W]]], None],
        *,
        awrite_group: Callable[[list[Pending[_W]]], Awaitable[None]],
        name: str = "qitos-store",
    ) -> None:
        self._write_group = write_group
        self._awrite_group = awrite_group
        self._name = name
        self._lock = threading.Lock()
        self._waiting: list[Pending[_W]] = []
        self._leading = False
        self._thread: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = None
        self._task: asyncio.Task[None] | None = None  # the asynchronous leader, while it runs
        self.groups = 0
        """Groups written so far (each one transaction or round trip)."""
        self.written = 0
        """Pieces of work written so far, in all groups."""

    # ---- submitting work

    def run(self, work: _W) -> Any:
        """Write ``work`` in the next group and return its result once the group is durable."""
        pending: Pending[_W] = Pending(work)
        pending.event = threading.Event()
        if self._enqueue(pending):
            self._write(self._take())  # the group holding this work; then the writer thread goes on
            with self._lock:
                handed_over = bool(self._waiting)
                self._leading = handed_over
            if handed_over:
                self._executor().submit(self._lead)
        elif _in_event_loop():
            # The group in progress may be a task of this very event loop, which cannot go on while
            # this call waits: this work is written alone, now.
            with self._lock:
                alone = pending in self._waiting
                if alone:
                    self._waiting.remove(pending)
            if alone:
                self._write([pending])
        pending.event.wait()
        return pending.outcome()

    async def arun(self, work: _W) -> Any:
        """Async twin of :meth:`run`: the caller's event loop is never blocked by the group."""
        loop = asyncio.get_running_loop()
        pending: Pending[_W] = Pending(work)
        pending.loop = loop
        future = pending.future = loop.create_future()
        if self._enqueue(pending):
            self._task = loop.create_task(self._alead(), name=f"{self._name}-group")
        # The work is written whatever happens to the caller: a cancelled caller does not wait for it.
        return await future

    def _enqueue(self, pending: Pending[_W]) -> bool:
        """Queue ``pending``; True when the caller must start a leader (no group is in progress)."""
        with self._lock:
            self._waiting.append(pending)
            if self._leading:
                return False
            self._leading = True
            return True

    def _take(self) -> list[Pending[_W]]:
        """Everything waiting, as the next group; [] (and no leader any more) when nothing waits."""
        with self._lock:
            group, self._waiting = self._waiting, []
            if not group:
                self._leading = False
            return group

    # ---- leading

    def _lead(self) -> None:
        """On the writer thread: write groups until nothing waits (what queued behind a synchronous
        caller's group, which that caller does not stay to write)."""
        group = self._take()
        while group:
            self._write(group)
            group = self._take()

    def _write(self, group: list[Pending[_W]]) -> None:
        try:
            self._write_group(group)
        except BaseException as exc:  # the group did not commit: nothing in it is durable
            for pending in group:
                pending.error = exc
        self._done(group)

    async def _alead(self) -> None:
        while True:
            group = self._take()
            if not group:
                return
            try:
                await self._awrite_group(group)
            except BaseException as exc:
                for pending in group:
                    pending.error = exc
                if isinstance(exc, asyncio.CancelledError):  # the loop is ending: hand the rest over
                    self._done(group)
                    self._abandon()
                    raise
            self._done(group)

    def _abandon(self) -> None:
        """Fail what waits when the asynchronous leader cannot go on (its event loop is closing)."""
        group = self._take()
        while group:
            for pending in group:
                pending.error = CheckpointError("the store's writer stopped with its event loop: not written")
            self._done(group)
            group = self._take()

    def _done(self, group: list[Pending[_W]]) -> None:
        """Hand each outcome back: wake synchronous callers, and resolve each event loop's futures
        in one callback per loop."""
        self.groups += 1
        self.written += len(group)
        by_loop: dict[asyncio.AbstractEventLoop, list[Pending[_W]]] = {}
        for pending in group:
            if pending.event is not None:
                pending.event.set()
            elif pending.loop is not None:
                by_loop.setdefault(pending.loop, []).append(pending)
        for loop, resolved in by_loop.items():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                _resolve(resolved)
            elif not loop.is_closed():
                loop.call_soon_threadsafe(_resolve, resolved)

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        """The writer thread (one per process: a forked child makes its own)."""
        known = self._thread
        pid = os.getpid()
        if known is None or known[0] != pid:
            with self._lock:
                known = self._thread
                if known is None or known[0] != pid:
                    if known is not None:  # inherited across fork(): its waiting work was the parent's
                        self._waiting, self._leading = [], False
                    executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=self._name)
                    known = self._thread = (pid, executor)
        return known[1]

    def close(self) -> None:
        """Let the writer thread end once idle."""
        known, self._thread = self._thread, None
        if known is not None and known[0] == os.getpid():
            known[1].shutdown(wait=False)


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _resolve(group: list[Pending[Any]]) -> None:
    for pending in group:
        future = pending.future
        if future is None or future.done():
            continue
        if pending.error is not None:
            future.set_exception(pending.error)
        else:
            future.set_result(pending.result)
