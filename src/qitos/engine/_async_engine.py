"""``AsyncEngine``: the same loop, driven on the event loop by the async driver.

``arun`` awaits the run on the caller's event loop: the model's ``acomplete`` is awaited, ``async
def`` tools are awaited on the loop, sync tools run in a bounded executor of ``tool_workers``
threads (``AsyncEngine(agent, tool_workers=8)``), store commits await the store's async methods. No
thread per run: a thousand runs in flight share one loop and that executor. Hooks, ``decide``,
``reduce`` and the trace writer's small appends run inline on the loop.

Cancellation: cancelling the task that awaits ``arun`` stops that run only, as
``Engine.cancel(immediate=True)`` would (``cancelled_immediate``, ``run_end`` last, trace status
``stopped``), then ``CancelledError`` reaches the awaiting code. ``engine.cancel()`` stops every run
of this engine at its next boundary.

``arun_stream`` yields the events as they happen, ``run_start`` first and ``run_end`` last.
Backpressure policy: the run's events go into a queue bounded by ``max_queue``; when the consumer
is that far behind, the run waits at its next boundary until the consumer catches up (it never
buffers without bound and never drops an event for this consumer). Events emitted within one phase
(a model's streamed deltas, say) are bounded by what that phase produces. Breaking out of the
stream (or cancelling its consumer) cancels the run immediately; the run still finishes its records.
``event_stream`` is the fan-out ``EventStream`` of the active ``arun_stream`` (extra subscribers
follow its own drop rule, see ``qitos.engine._events``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, Generic, TypeVar

from qitos.core._agent_module import AgentModule
from qitos.core._errors import ConfigurationError
from qitos.core._state import StateSchema
from qitos.core._task import Task
from qitos.engine._engine import Engine
from qitos.engine._events import EngineEvent, EngineResult, EventStream

__all__ = ["AsyncEngine", "EventChannel"]

StateT = TypeVar("StateT", bound=StateSchema)
ObservationT = TypeVar("ObservationT")
ActionT = TypeVar("ActionT")


class EventChannel:
    """One consumer's bounded event queue: ``push`` never blocks, the producer awaits space.

    Args:
        max_queue: how many events may wait for the consumer before the run waits (>= 1).
    """

    def __init__(self, max_queue: int = 1000) -> None:
        if max_queue < 1:
            raise ConfigurationError(f"max_queue must be >= 1, got {max_queue!r}")
        self.max_queue = max_queue
        self._items: deque[EngineEvent | None] = deque()
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()

    def push(self, item: EngineEvent | None) -> None:
        """Add an event (``None`` marks the end); the producer checks ``full()`` at its boundaries."""
        items = self._items
        items.append(item)
        self._readable.set()
        if len(items) >= self.max_queue:
            self._writable.clear()

    def full(self) -> bool:
        """True when the consumer is ``max_queue`` or more events behind."""
        return len(self._items) >= self.max_queue

    async def wait_for_space(self) -> None:
        """Return once the consumer is below ``max_queue`` events behind."""
        while self.full():
            self._writable.clear()
            await self._writable.wait()

    async def get(self) -> EngineEvent | None:
        """The next event (``None`` at the end)."""
        items = self._items
        while not items:
            self._readable.clear()
            await self._readable.wait()
        item = items.popleft()
        if len(items) < self.max_queue:
            self._writable.set()
        return item


class AsyncEngine(Generic[StateT, ObservationT, ActionT]):
    """Non-blocking execution of an agent.

    Args:
        agent: the agent to run.
        tool_workers: threads of the bounded executor for sync tools and other blocking calls
            (default: the process-wide executor, ``DEFAULT_TOOL_WORKERS`` threads).
        max_queue: the bound of ``arun_stream``'s event queue (see the module docstring).
        engine_kwargs: everything else goes to ``Engine``.
    """

    def __init__(
        self,
        agent: AgentModule[StateT, ObservationT, ActionT],
        *,
        tool_workers: int | None = None,
        max_queue: int = 1000,
        **engine_kwargs: Any,
    ) -> None:
        if max_queue < 1:
            raise ConfigurationError(f"max_queue must be >= 1, got {max_queue!r}")
        self._engine: Engine[StateT, ObservationT, ActionT] = Engine(agent, tool_workers=tool_workers, **engine_kwargs)
        self.max_queue = max_queue
        self._stream: EventStream | None = None

    @property
    def engine(self) -> Engine[StateT, ObservationT, ActionT]:
        """The underlying Engine."""
        return self._engine

    @property
    def agent(self) -> AgentModule[StateT, ObservationT, ActionT]:
        """Same as ``engine.agent``."""
        return self._engine.agent

    @property
    def event_stream(self) -> EventStream | None:
        """The active stream while ``arun_stream()`` runs, otherwise None."""
        return self._stream

    async def arun(self, task: str | Task, **kwargs: Any) -> EngineResult[StateT]:
        """Run the loop on this event loop; returns the same EngineResult as ``Engine.run``."""
        return await self._engine.arun(task, **kwargs)

    async def arun_stream(self, task: str | Task, **kwargs: Any) -> AsyncIterator[EngineEvent]:
        """Run the loop and yield its events as they happen: ``run_start`` first, ``run_end`` last.

        An exception the run raises is re-raised after the last event has been yielded.
        """
        stream = EventStream()
        self._stream = stream
        channel = EventChannel(self.max_queue)
        outer = kwargs.pop("on_event", None)

        def on_event(event: EngineEvent) -> None:
            channel.push(event)
            stream.emit(event)
            if outer is not None:
                outer(event)

        run = asyncio.ensure_future(self._engine.arun(task, on_event=on_event, backpressure=channel, **kwargs))

        def ended(_: object) -> None:
            channel.push(None)
            stream.close()

        run.add_done_callback(ended)
        finished = False
        try:
            while True:
                item = await channel.get()
                if item is None:
                    break
                yield item
            finished = True
            await run
        finally:
            if not finished:
                run.cancel()
                with contextlib.suppress(BaseException):
                    await run
            self._stream = None

    def run(self, task: str | Task, **kwargs: Any) -> EngineResult[StateT]:
        """Synchronous fallback: delegates to ``Engine.run``."""
        return self._engine.run(task, **kwargs)
