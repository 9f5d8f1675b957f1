"""ToolThreads: the bounded threads of async runs' sync tools, on real threads and event loops."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import pytest

from qitos.engine._tool_threads import ToolThreads


def test_results_and_exceptions_come_back_to_the_loop_and_to_submit() -> None:
    threads = ToolThreads(2)

    async def main() -> tuple[int, str]:
        value = await threads.run_soon(lambda: 6 * 7)
        with pytest.raises(ZeroDivisionError):
            await threads.run_soon(lambda: 1 / 0)
        return value, await threads.run_soon(lambda: threading.current_thread().name)

    value, name = asyncio.run(main())
    assert value == 42 and name.startswith("qitos-tool_")
    assert threads.submit(pow, 2, exp=10).result(timeout=5) == 1024
    with pytest.raises(KeyError):
        threads.submit({}.__getitem__, "missing").result(timeout=5)
    threads.shutdown()


def test_no_more_than_max_workers_calls_run_at_once_and_threads_are_reused() -> None:
    threads = ToolThreads(3)
    running, most, lock = 0, 0, threading.Lock()
    together = threading.Barrier(3, timeout=10)  # three calls at a time meet here

    def call() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        together.wait()
        time.sleep(0.01)  # a fourth thread, if there were one, would be counted meanwhile
        with lock:
            running -= 1

    async def main() -> None:
        await asyncio.gather(*(threads.run_soon(call) for _ in range(12)))
        for _ in range(50):  # one at a time: the threads already started take them
            await threads.run_soon(lambda: None)

    asyncio.run(main())
    assert most == 3 and threads.threads == 3
    threads.shutdown()


def test_a_cancelled_call_finishes_unobserved_and_one_not_started_is_skipped() -> None:
    threads = ToolThreads(1)
    started, release, ran = threading.Event(), threading.Event(), []

    def slow() -> str:
        started.set()
        release.wait(5)
        ran.append("slow")
        return "late"

    async def main() -> None:
        first = threads.run_soon(slow)
        queued = threads.run_soon(lambda: ran.append("queued"))
        assert await asyncio.to_thread(started.wait, 5)
        first.cancel()
        queued.cancel()  # still waiting for the one thread
        release.set()
        assert await threads.run_soon(lambda: "after") == "after"  # the thread is free again
        assert first.cancelled() and queued.cancelled()

    asyncio.run(main())
    assert ran == ["slow"]
    threads.shutdown()


def test_an_outcome_for_a_loop_that_has_closed_is_dropped() -> None:
    threads = ToolThreads(1)
    release, finished = threading.Event(), threading.Event()

    def slow() -> None:
        release.wait(5)
        finished.set()

    async def main() -> None:
        threads.run_soon(slow)  # never awaited: the loop ends first

    asyncio.run(main())
    release.set()
    assert finished.wait(5)
    assert threads.submit(lambda: "still serving").result(timeout=5) == "still serving"
    threads.shutdown()


def test_shutdown_waits_refuses_new_calls_and_can_drop_queued_ones() -> None:
    threads = ToolThreads(1)
    started, release = threading.Event(), threading.Event()

    def running_call() -> bool:
        started.set()
        return release.wait(5)

    running = threads.submit(running_call)
    queued = threads.submit(lambda: "never")
    assert started.wait(5)
    stopper = threading.Thread(target=threads.shutdown, kwargs={"cancel_futures": True})
    stopper.start()
    time.sleep(0.05)
    assert stopper.is_alive()  # waiting for the running call
    release.set()
    stopper.join(5)
    assert running.result(timeout=1) is True and queued.cancelled()
    with pytest.raises(RuntimeError, match="shutdown"):
        threads.submit(lambda: None)
    with pytest.raises(ValueError, match="max_workers"):
        ToolThreads(0)


def test_it_is_an_executor_for_run_in_executor_too() -> None:
    threads = ToolThreads(2)

    async def main() -> int:
        return await asyncio.get_running_loop().run_in_executor(threads, sum, [1, 2, 3])

    assert isinstance(threads, concurrent.futures.Executor) and asyncio.run(main()) == 6
    threads.shutdown()
