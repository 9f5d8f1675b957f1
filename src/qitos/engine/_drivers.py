"""The two drivers of the one loop: :func:`drive` (synchronous) and :class:`AsyncDriver`.

A driver takes the loop generator (``Engine._execute``), performs every effect it yields (see
``qitos.engine._effects``) and sends the result back, or throws the effect's exception in at the
same point, until the loop returns its ``EngineResult``.

- :func:`drive` performs effects in the calling thread: ``Engine.run``, ``agent.run``,
  ``Session.run``. It adds no thread and no event loop.
- :class:`AsyncDriver` awaits them on the running event loop: ``AsyncEngine.arun`` /
  ``arun_stream`` and ``Session.arun``. Model calls await ``acomplete``, ``async def`` tools are
  awaited on the loop, sync tools and other blocking calls run in a bounded executor, store
  operations await the store's async methods. Many runs share one event loop; none gets a thread.

Cancellation (async): when the task awaiting :meth:`AsyncDriver.drive` is cancelled, the effect in
flight is abandoned (a model call or an awaited tool is cancelled with it; a sync tool already
running in the executor cannot be interrupted and finishes there unobserved), except a store
operation, which is allowed to finish so the journal stays in step with the store, and a durable
step's non-idempotent call: one still waiting for a thread or a slot is given up (it has not
begun, so it runs on resume), one running in a thread is waited for and its result kept in the
boundary the stop commits (``qitos.engine._effects.StartedToolCall``). The loop then
stops as ``Engine.cancel(immediate=True)`` makes it stop: stop reason ``cancelled_immediate``, the
last boundary committed, ``run_end`` last, trace status ``stopped``. After that the driver raises
``CancelledError`` to its caller, as a cancelled task must.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from qitos.core._state import StopReason
from qitos.engine._effects import BOUNDARY, Effect, Loop, ToolCall
from qitos.engine._run_context import StopRun
from qitos.engine._tool_threads import ToolThreads

__all__ = ["AsyncDriver", "Backpressure", "drive"]

_T = TypeVar("_T")


def drive(loop: Loop[_T]) -> _T:
    """Run ``loop`` to its end in the calling thread, performing each effect as it is yielded."""
    send, throw = loop.send, loop.throw
    try:
        effect = send(None)
        while True:
            if effect is BOUNDARY:
                effect = send(None)
                continue
            try:
                if type(effect) is ToolCall:  # the common effect, without a method call
                    value = effect.registry.call(effect.name, effect.args, call_id=effect.call_id)
                else:
                    value = effect.perform()
            except BaseException as exc:  # handed back to the loop at the point that asked for it
                effect = throw(exc)
                continue
            effect = send(value)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


class Backpressure(Protocol):
    """A bounded consumer of a run's events (``arun_stream``'s queue)."""

    def full(self) -> bool:
        """True when the consumer is at least its bound behind."""
        ...

    async def wait_for_space(self) -> None:
        """Return once the consumer has caught up below its bound."""
        ...


class AsyncDriver:
    """Drives one run of the loop on the running event loop.

    Args:
        executor: the bounded executor for sync tools and other blocking calls (shared by the runs
            of one ``AsyncEngine``).
        backpressure: the stream consumer to wait for at boundaries (None: no stream).
        time_slice: a run that has not waited for anything for this many seconds gives the other
            tasks of the loop a turn at its next boundary.
    """

    def __init__(
        self,
        executor: concurrent.futures.Executor,
        *,
        backpressure: Backpressure | None = None,
        time_slice: float = 0.005,
    ) -> None:
        self._executor = executor
        self._backpressure = backpressure
        self._time_slice = time_slice
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = 0
        self._last_wait = time.perf_counter()
        self._cancelled = False

    # ---- the services effects use (qitos.engine._effects.AsyncServices)

    @property
    def executor(self) -> concurrent.futures.Executor:
        """The bounded executor."""
        return self._executor

    def threadsafe(self, callback: Callable[..., None]) -> Callable[..., None]:
        """``callback`` that, called from another thread, runs on the event loop instead (in order)."""
        loop, thread = self._running_loop(), self._thread
        context = contextvars.copy_context()  # the run's context (hooks such as telemetry read it)

        def call(*args: object) -> None:
            if threading.get_ident() == thread:
                callback(*args)
            elif not loop.is_closed():
                loop.call_soon_threadsafe(functools.partial(callback, *args), context=context)

        return call

    async def run_blocking(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` in the executor; its result or exception comes back here."""
        call = functools.partial(fn, *args, **kwargs) if kwargs else functools.partial(fn, *args)
        if isinstance(self._executor, ToolThreads):
            return await self._executor.run_soon(call)
        return await self._running_loop().run_in_executor(self._executor, call)

    async def checkpoint(self) -> None:
        """At a boundary: wait for a lagging stream consumer; give other tasks a turn now and then."""
        backpressure = self._backpressure
        if backpressure is not None and backpressure.full():
            await backpressure.wait_for_space()
            self._last_wait = time.perf_counter()
            return
        now = time.perf_counter()
        if now - self._last_wait >= self._time_slice:
            await asyncio.sleep(0)
            self._last_wait = time.perf_counter()

    # ---- driving

    async def drive(self, loop: Loop[_T]) -> _T:
        """Run ``loop`` to its end, awaiting each effect (see the module docstring on cancellation)."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        send, throw = loop.send, loop.throw
        self._cancelled = False
        stop_sent = False
        try:
            effect: Effect = send(None)
            while True:
                if self._cancelled and not stop_sent:
                    # Cancelled while a store operation finished: stop at the loop's next request.
                    stop_sent = True
                    effect = throw(StopRun(StopReason.CANCELLED_IMMEDIATE))
                    continue
                try:
                    if effect.completes_on_cancel:
                        value = await self._complete(effect)
                    else:
                        value = await effect.aperform(self)
                    self._last_wait = time.perf_counter()
                except asyncio.CancelledError:
                    self._cancelled = True
                    if stop_sent:
                        effect = send(None)
                    else:
                        stop_sent = True
                        effect = throw(StopRun(StopReason.CANCELLED_IMMEDIATE))
                    continue
                except BaseException as exc:  # handed back to the loop at the point that asked for it
                    effect = throw(exc)
                    continue
                effect = send(value)
        except StopIteration as done:
            if self._cancelled:
                raise asyncio.CancelledError() from None
            return done.value  # type: ignore[no-any-return]

    async def _complete(self, effect: Effect) -> Any:
        """Await a store operation to its end even if this task is cancelled meanwhile."""
        task = asyncio.ensure_future(effect.aperform(self))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            self._cancelled = True
            return await task

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
            self._thread = threading.get_ident()
        return loop
