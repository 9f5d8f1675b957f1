"""The bounded threads that run async runs' sync tools and other blocking calls.

A ``concurrent.futures.ThreadPoolExecutor`` reached through ``loop.run_in_executor`` costs about
30 µs of CPU a call on this kind of machine: a ``concurrent.futures.Future`` with its condition
variable, the pool's idle semaphore, and an asyncio future chained to the first one. A sync tool
that returns in microseconds paid that at every step. :class:`ToolThreads` hands a call to its
threads through a ``queue.SimpleQueue`` and puts the outcome straight on a future of the asking
event loop (:meth:`ToolThreads.run_soon`), about a third of that. It is a
``concurrent.futures.Executor`` too (:meth:`ToolThreads.submit`), for callers that need one.

Threads are started as calls need them, up to ``max_workers``, and then kept. They are daemon
threads: a call still running when the interpreter exits is abandoned there, where a
``ThreadPoolExecutor`` would wait for it (nobody awaits such a call any more: its run is over).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["ToolThreads"]

_T = TypeVar("_T")


class ToolThreads(concurrent.futures.Executor):
    """At most ``max_workers`` threads for blocking calls; ``name`` prefixes the threads' names."""

    def __init__(self, max_workers: int, *, name: str = "qitos-tool") -> None:
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise ValueError(f"max_workers must be a positive int, got {max_workers!r}")
        self.max_workers = max_workers
        self._name = name
        self._queue: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards the counts below, never a call
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads done with their last call and not promised another
        self._closed = False

    def run_soon(self, fn: Callable[[], _T]) -> asyncio.Future[_T]:
        """Run ``fn()`` in one of the threads; its result or exception on a future of the running loop.

        Cancelling the future does not stop a call already running (threads cannot be
        interrupted): it finishes unobserved. A call not yet started when its future is cancelled
        is skipped.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_T] = loop.create_future()
        self._put(_LoopWork(fn, loop, future))
        return future

    def submit(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[_T]:
        """``concurrent.futures.Executor.submit``: ``fn(*args, **kwargs)`` in one of the threads."""
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        self._put(_FutureWork(functools.partial(fn, *args, **kwargs), future))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more calls; with ``cancel_futures`` drop the calls not started yet; with
        ``wait`` return once the running ones have finished."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    work = self._queue.get_nowait()
                except queue.Empty:
                    break
                if work is not None:
                    work.cancel()
        for _ in threads:
            self._queue.put(None)  # one stop per thread, after the calls already queued
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    @property
    def threads(self) -> int:
        """How many threads have been started so far (at most ``max_workers``)."""
        return len(self._threads)

    def _put(self, work: _Work) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new calls after shutdown")
            if self._idle:
                self._idle -= 1
            elif len(self._threads) < self.max_workers:
                thread = threading.Thread(target=self._serve, name=f"{self._name}_{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
        self._queue.put(work)

    def _serve(self) -> None:
        while (work := self._queue.get()) is not None:
            work.run()
            del work  # not kept alive while this thread waits for the next call
            with self._lock:
                self._idle += 1


class _Work:
    __slots__ = ()

    def run(self) -> None:
        raise NotImplementedError

    def cancel(self) -> None:
        raise NotImplementedError


class _LoopWork(_Work):
    """A call whose outcome goes to an asyncio future, set on its own loop."""

    __slots__ = ("fn", "future", "loop")

    def __init__(self, fn: Callable[[], object], loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any]) -> None:
        self.fn, self.loop, self.future = fn, loop, future

    def run(self) -> None:
        if self.future.cancelled():  # nobody waits for it any more
            return
        try:
            result = self.fn()
        except BaseException as exc:  # the awaiting task gets it, as from run_in_executor
            self._deliver(_fail, exc)
        else:
            self._deliver(_resolve, result)

    def cancel(self) -> None:
        self._deliver(_cancel, None)

    def _deliver(self, setter: Callable[[asyncio.Future[Any], Any], None], value: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is left to tell
            self.loop.call_soon_threadsafe(setter, self.future, value)


class _FutureWork(_Work):
    """A call whose outcome goes to a ``concurrent.futures.Future`` (``submit``)."""

    __slots__ = ("fn", "future")

    def __init__(self, fn: Callable[[], object], future: concurrent.futures.Future[Any]) -> None:
        self.fn, self.future = fn, future

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            result = self.fn()
        except BaseException as exc:  # as ThreadPoolExecutor does
            self.future.set_exception(exc)
        else:
            self.future.set_result(result)

    def cancel(self) -> None:
        self.future.cancel()


def _resolve(future: asyncio.Future[Any], result: object) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _cancel(future: asyncio.Future[Any], _: object) -> None:
    future.cancel()
