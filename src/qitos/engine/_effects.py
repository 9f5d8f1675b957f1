"""Effects: what the I/O-free loop asks its driver to do, and how each driver does it.

The canonical loop (``qitos.engine._loop``) is a generator. Where it needs the outside world it
yields one effect and receives the effect's result (or has the effect's exception thrown in at the
same point). Each effect knows how to perform itself both ways:

- ``perform()``: the synchronous driver calls it in the calling thread;
- ``aperform(services)``: the async driver awaits it on the event loop, with ``services`` giving
  the bounded executor for blocking work and thread-safe callbacks.

The effects:

``BOUNDARY``       a step boundary: nothing for the sync driver; the async driver applies
                   backpressure to a slow stream consumer there and lets other runs proceed.
``ModelCall``      one model request (``complete`` / awaited ``acomplete``), with the stream
                   callback and the adapter-event listener the model path wants.
``ToolCall``       one tool call through the registry (``call`` / ``acall``).
``StartedToolCall`` a durable step's call that is not idempotent: its start is recorded when it
                   begins (``qitos.engine._call_start``); the async driver's cancellation leaves it
                   to run on resume if it has not begun, and waits for its result if it runs in a
                   thread.
``ToolBatch``      several concurrency-safe calls of one decision run together (threads / the event
                   loop), at most ``limit`` at a time; results in the decision's order, each kept
                   as it arrives; starts recorded as for ``StartedToolCall``.
``JournalCall``    one journal operation that may touch the store (``op`` / awaited ``a<op>``).
``BlockingCall``   any other blocking function (an Env's ``reset``/``step``): called directly, or
                   run in the bounded executor.

A driver must not keep an effect after it has sent the effect's result back: the loop refills one
``ToolCall`` per run for its plain tool calls, so a step allocates no effect object.

Hooks, ``decide``, ``reduce`` and critics are the agent's own synchronous code and run inline in
both drivers (keep them free of long blocking I/O when running many sessions at once).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from qitos.core._decision import Action
from qitos.core._tool import ToolRegistry, ToolResult
from qitos.engine._call_start import RecordedStart, StepResults, outlast_cancel

__all__ = [
    "BOUNDARY",
    "AsyncServices",
    "BlockingCall",
    "Effect",
    "JournalCall",
    "Loop",
    "ModelCall",
    "StartedToolCall",
    "ToolBatch",
    "ToolCall",
]

_T = TypeVar("_T")


class AsyncServices(Protocol):
    """What the async driver offers to effects it awaits."""

    @property
    def executor(self) -> concurrent.futures.Executor:
        """The bounded executor for sync tools and other blocking calls."""
        ...

    def threadsafe(self, callback: Callable[..., None]) -> Callable[..., None]:
        """``callback`` made safe to call from a worker thread (it then runs on the event loop)."""
        ...

    async def run_blocking(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run a blocking call in the executor and await its result."""
        ...

    async def checkpoint(self) -> None:
        """A boundary: wait for a slow stream consumer, and give other tasks a turn now and then."""
        ...


class Effect:
    """Base of every effect (see the module docstring)."""

    __slots__ = ()
    # True for store operations: the async driver lets one finish even when the run is cancelled
    # while it is in flight, so the journal never loses track of what the store holds.
    completes_on_cancel = False

    def perform(self) -> Any:
        """Do it in the calling thread (the sync driver)."""
        raise NotImplementedError

    async def aperform(self, services: AsyncServices) -> Any:
        """Do it on the event loop (the async driver)."""
        raise NotImplementedError


class _Boundary(Effect):
    __slots__ = ()

    def perform(self) -> None:
        return None

    async def aperform(self, services: AsyncServices) -> None:
        await services.checkpoint()


BOUNDARY: Effect = _Boundary()
"""The one boundary effect (yielded at the start of every step boundary)."""


class ModelCall(Effect):
    """One model request: ``model.complete(view, on_delta=...)`` or its awaited ``acomplete``."""

    __slots__ = ("listener", "model", "on_delta", "view")

    def __init__(
        self,
        model: Any,
        view: Any,
        *,
        on_delta: Callable[[str], None] | None = None,
        listener: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.model = model
        self.view = view
        self.on_delta = on_delta
        self.listener = listener

    def perform(self) -> Any:
        unsubscribe = self._subscribe(self.listener)
        try:
            return self.model.complete(self.view, on_delta=self.on_delta)
        finally:
            if unsubscribe is not None:
                unsubscribe()

    async def aperform(self, services: AsyncServices) -> Any:
        on_delta = services.threadsafe(self.on_delta) if self.on_delta is not None else None
        listener = services.threadsafe(self.listener) if self.listener is not None else None
        unsubscribe = self._subscribe(listener)
        try:
            acomplete = getattr(self.model, "acomplete", None)
            if acomplete is None:
                return await services.run_blocking(self.model.complete, self.view, on_delta=on_delta)
            return await acomplete(self.view, on_delta=on_delta)
        finally:
            if unsubscribe is not None:
                unsubscribe()

    def _subscribe(self, listener: Callable[[str, dict[str, Any]], None] | None) -> Callable[[], None] | None:
        subscribe = getattr(self.model, "subscribe", None)
        if listener is None or subscribe is None:
            return None
        result: Callable[[], None] = subscribe(listener)
        return result


class ToolCall(Effect):
    """One tool call through the registry (never raises for the tool's own failure)."""

    __slots__ = ("args", "call_id", "name", "registry")

    def __init__(self, registry: ToolRegistry, name: str, args: Any, call_id: str) -> None:
        self.registry = registry
        self.name = name
        self.args = args
        self.call_id = call_id

    def perform(self) -> Any:
        return self.registry.call(self.name, self.args, call_id=self.call_id)

    async def aperform(self, services: AsyncServices) -> Any:
        return await self.registry.acall(self.name, self.args, call_id=self.call_id, executor=services.executor)


class StartedToolCall(ToolCall):
    """A durable step's call that is not idempotent: ``start`` records it when it begins.

    Cancelled on the async driver before the call began, the call is given up (it runs on resume);
    begun in an executor thread, where it cannot be interrupted, it is waited for and its result
    kept in ``results`` (the stop's boundary makes it durable); an ``async def`` tool is cancelled.
    Either way the ``CancelledError`` then reaches the driver.
    """

    __slots__ = ("results", "start")

    def __init__(self, registry: ToolRegistry, action: Action, start: RecordedStart, results: StepResults) -> None:
        super().__init__(registry, action.name, action.args, action.id)
        self.start = start
        self.results = results

    def perform(self) -> Any:
        return self.registry.call(self.name, self.args, call_id=self.call_id, start=self.start)

    async def aperform(self, services: AsyncServices) -> Any:
        start = self.start
        call = asyncio.ensure_future(
            self.registry.acall(self.name, self.args, call_id=self.call_id, executor=services.executor, start=start)
        )
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:
            if start.abandon() or not start.runs_in_thread:
                call.cancel()
                raise
            self.results.keep(await outlast_cancel(call))
            raise


class ToolBatch(Effect):
    """Concurrency-safe tool calls of one decision, run together; the results in ``actions``' order.

    The sync driver runs them on threads (a process-wide pool kept for batches), the async driver
    awaits them on the event loop (sync tools in its bounded executor); either way at most
    ``limit`` calls are in flight. Each result is kept in ``results`` in the driving thread as soon
    as it arrives, so a crash loses only the calls still running. ``starts`` records, per call id,
    the start of a call that is not idempotent when it begins (not while it waits for a slot or a
    thread); cancelled, the batch treats each call as ``StartedToolCall`` does.
    """

    __slots__ = ("actions", "limit", "registry", "results", "starts")

    def __init__(
        self,
        registry: ToolRegistry,
        actions: Sequence[Action],
        *,
        limit: int,
        results: StepResults | None = None,
        starts: Mapping[str, RecordedStart] | None = None,
    ) -> None:
        self.registry = registry
        self.actions = tuple(actions)
        self.limit = max(1, limit)
        self.results = results
        self.starts = starts or {}

    def perform(self) -> list[ToolResult]:
        registry, actions, keep, starts = self.registry, self.actions, self.results, self.starts
        results: list[ToolResult | None] = [None] * len(actions)
        pool = _batch_pool()
        waiting = list(range(len(actions)))
        waiting.reverse()
        running: dict[concurrent.futures.Future[ToolResult], int] = {}
        while waiting or running:
            while waiting and len(running) < self.limit:
                index = waiting.pop()
                action = actions[index]
                start = starts.get(action.id)
                running[pool.submit(registry.call, action.name, action.args, call_id=action.id, start=start)] = index
            done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                index = running.pop(future)
                result = results[index] = future.result()
                if keep is not None:
                    keep.keep(result)
        return [r for r in results if r is not None]

    async def aperform(self, services: AsyncServices) -> list[ToolResult]:
        registry, actions, keep, starts = self.registry, self.actions, self.results, self.starts
        gate = asyncio.Semaphore(self.limit)
        executor = services.executor

        async def one(index: int) -> tuple[int, ToolResult]:
            action = actions[index]
            async with gate:
                start = starts.get(action.id)
                return index, await registry.acall(
                    action.name, action.args, call_id=action.id, executor=executor, start=start
                )

        tasks = [asyncio.ensure_future(one(i)) for i in range(len(actions))]
        results: list[ToolResult | None] = [None] * len(actions)
        try:
            for next_done in asyncio.as_completed(tasks):
                index, result = await next_done
                results[index] = result
                if keep is not None:
                    keep.keep(result)
        except asyncio.CancelledError:
            await self._settle(tasks, results)
            raise
        finally:
            for task in tasks:
                task.cancel()
        return [r for r in results if r is not None]

    async def _settle(
        self, tasks: list[asyncio.Task[tuple[int, ToolResult]]], results: list[ToolResult | None]
    ) -> None:
        """The batch is cancelled: give up the calls not begun, wait for those running in threads."""
        keep = self.results
        running: list[asyncio.Task[tuple[int, ToolResult]]] = []
        for index, task in enumerate(tasks):
            start = self.starts.get(self.actions[index].id)
            if task.done():
                if results[index] is None and not task.cancelled() and task.exception() is None and keep is not None:
                    keep.keep(task.result()[1])  # finished before it was taken in
            elif start is not None and not start.abandon() and start.runs_in_thread:
                running.append(task)
            else:
                task.cancel()
        for task in running:
            _, result = await outlast_cancel(task)
            if keep is not None:
                keep.keep(result)


_BATCH_POOL: concurrent.futures.ThreadPoolExecutor | None = None
_BATCH_LOCK = threading.Lock()
_BATCH_THREADS = 64


def _batch_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The process-wide threads for the sync driver's batches (apart from the async runs' executor,
    so a batch inside a tool running there cannot wait for its own pool)."""
    global _BATCH_POOL
    with _BATCH_LOCK:
        if _BATCH_POOL is None:
            _BATCH_POOL = concurrent.futures.ThreadPoolExecutor(_BATCH_THREADS, thread_name_prefix="qitos-batch")
        return _BATCH_POOL


# Journal operations that never write: reading control items, keeping a tool result for the next
# write. Nothing is lost when a cancellation interrupts one, so the async driver awaits them as they
# are instead of finishing them in a shielded task of their own (a task per call, most calls
# completing without any I/O).
_INTERRUPTIBLE_JOURNAL_OPS = frozenset({"control", "record_tool_result"})


class JournalCall(Effect):
    """One journal operation: ``journal.<op>(*args, **kwargs)`` or ``await journal.a<op>(...)``."""

    __slots__ = ("args", "completes_on_cancel", "journal", "kwargs", "op")

    def __init__(
        self, journal: Any, op: str, args: tuple[Any, ...] = (), kwargs: Mapping[str, Any] | None = None
    ) -> None:
        self.journal = journal
        self.op = op
        self.args = args
        self.kwargs = kwargs
        self.completes_on_cancel = op not in _INTERRUPTIBLE_JOURNAL_OPS

    def perform(self) -> Any:
        method = getattr(self.journal, self.op)
        return method(*self.args, **self.kwargs) if self.kwargs else method(*self.args)

    async def aperform(self, services: AsyncServices) -> Any:
        method = getattr(self.journal, "a" + self.op)
        return await (method(*self.args, **self.kwargs) if self.kwargs else method(*self.args))


class BlockingCall(Effect):
    """Any other blocking call: made directly by the sync driver, in the executor by the async one."""

    __slots__ = ("args", "fn")

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.fn = fn
        self.args = args

    def perform(self) -> Any:
        return self.fn(*self.args)

    async def aperform(self, services: AsyncServices) -> Any:
        return await services.run_blocking(self.fn, *self.args)


Loop = Generator[Effect, Any, _T]
"""A piece of the loop: yields effects, receives their results, returns ``_T``."""
