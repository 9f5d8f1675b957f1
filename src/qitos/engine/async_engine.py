"""``AsyncEngine`` (seed 004): the same Engine loop, driven from asyncio.

The loop runs in a worker thread; its events cross to the event loop through ``EventStream``
(thread-safe ``emit``, fan-out ``subscribe``). Cancelling the consumer (breaking out of
``arun_stream`` or cancelling its task) cancels the run immediately at the next phase boundary;
the stream still ends with exactly one ``run_end``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Generic, TypeVar

from qitos.core.agent_module import AgentModule
from qitos.core.state import StateSchema
from qitos.core.task import Task
from qitos.engine.engine import Engine
from qitos.engine.events import EngineEvent, EngineResult, EventStream

__all__ = ["AsyncEngine"]

StateT = TypeVar("StateT", bound=StateSchema)
ObservationT = TypeVar("ObservationT")
ActionT = TypeVar("ActionT")


class AsyncEngine(Generic[StateT, ObservationT, ActionT]):
    """Non-blocking execution of an agent. Keyword arguments go to ``Engine``."""

    def __init__(self, agent: AgentModule[StateT, ObservationT, ActionT], **engine_kwargs: Any) -> None:
        self._engine: Engine[StateT, ObservationT, ActionT] = Engine(agent, **engine_kwargs)
        self._stream: EventStream | None = None

    @property
    def engine(self) -> Engine[StateT, ObservationT, ActionT]:
        """The underlying synchronous Engine."""
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
        """Run the loop without blocking the event loop; returns the same EngineResult as ``Engine.run``."""
        return await asyncio.to_thread(self._engine.run, task, **kwargs)

    async def arun_stream(self, task: str | Task, **kwargs: Any) -> AsyncIterator[EngineEvent]:
        """Run the loop and yield its events as they happen: ``run_start`` first, ``run_end`` last.

        An exception the run raises is re-raised after the last event has been yielded.
        """
        stream = EventStream()
        self._stream = stream
        queue = stream.subscribe()
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(None, lambda: self._engine.run(task, on_event=stream.emit, **kwargs))
        future.add_done_callback(lambda _: stream.close())
        finished = False
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                yield item
            finished = True
            await future
        finally:
            if not finished:
                self._engine.cancel(immediate=True)
                with contextlib.suppress(Exception):
                    await asyncio.shield(future)
            self._stream = None

    def run(self, task: str | Task, **kwargs: Any) -> EngineResult[StateT]:
        """Synchronous fallback: delegates to ``Engine.run``."""
        return self._engine.run(task, **kwargs)
