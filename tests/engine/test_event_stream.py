"""EventStream: thread-safe emit, fan-out subscribe, a slow consumer never blocks anyone."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from qitos import Action, AsyncEngine, Decision, Engine, tool
from qitos.engine._events import EngineEvent, EngineEventType, EventStream
from qitos.engine._hooks import EngineHook, HookContext


@tool
def tick(n: int) -> str:
    """A quick tool."""
    return str(n)


def n_steps(n: int) -> Any:
    def policy(state: Any, observation: Any) -> Decision[Any]:
        if state.current_step >= n:
            return Decision.final("done")
        return Decision.act([Action("tick", {"n": state.current_step})])

    return policy


def _event(i: int, kind: EngineEventType = EngineEventType.STEP_START) -> EngineEvent:
    return EngineEvent(kind, i, payload={"i": i})


async def _drain(queue: asyncio.Queue[Any]) -> list[EngineEvent]:
    items: list[EngineEvent] = []
    while True:
        item = await queue.get()
        if item is None:
            return items
        items.append(item)


def test_emit_close_and_async_iteration() -> None:
    async def main() -> list[int]:
        stream = EventStream()
        received: list[int] = []

        async def consume() -> None:
            async for event in stream:
                received.append(event.step_id)

        consumer = asyncio.create_task(consume())
        await asyncio.sleep(0)  # let the iterator subscribe
        stream.emit(_event(1))
        stream.emit_sync(_event(2))
        stream.close()
        stream.emit(_event(3))  # after close: ignored
        await asyncio.wait_for(consumer, 2)
        return received

    assert asyncio.run(main()) == [1, 2]


def test_two_subscribers_both_receive_everything() -> None:
    async def main() -> tuple[list[int], list[int]]:
        stream = EventStream()
        a, b = stream.subscribe(), stream.subscribe()
        for i in range(100):
            stream.emit(_event(i))
        stream.close()
        return [e.step_id for e in await _drain(a)], [e.step_id for e in await _drain(b)]

    first, second = asyncio.run(main())
    assert first == second == list(range(100))


def test_a_late_subscriber_after_close_gets_the_history_and_the_end() -> None:
    async def main() -> list[int]:
        stream = EventStream()
        stream.subscribe()
        stream.emit(_event(7))
        stream.close()
        return [e.step_id for e in await _drain(stream.subscribe())]

    assert asyncio.run(main()) == [7]


def test_emit_from_many_threads_delivers_every_event_in_per_thread_order() -> None:
    threads_n, per_thread = 4, 500

    async def main() -> list[EngineEvent]:
        stream = EventStream(max_queue=100_000)
        queue = stream.subscribe()

        def producer(t: int) -> None:
            for i in range(per_thread):
                stream.emit(EngineEvent(EngineEventType.DECIDE, i, agent_id=f"t{t}"))

        workers = [threading.Thread(target=producer, args=(t,)) for t in range(threads_n)]
        for worker in workers:
            worker.start()

        def join_all() -> None:
            for worker in workers:
                worker.join()

        await asyncio.to_thread(join_all)
        stream.close()
        return await _drain(queue)

    events = asyncio.run(main())
    assert len(events) == threads_n * per_thread
    for t in range(threads_n):
        assert [e.step_id for e in events if e.agent_id == f"t{t}"] == list(range(per_thread))


def test_a_full_queue_drops_model_deltas_first_and_never_lifecycle_events() -> None:
    async def main() -> tuple[list[EngineEvent], int]:
        stream = EventStream(max_queue=5)
        queue = stream.subscribe()
        stream.emit(_event(0, EngineEventType.RUN_START))
        for i in range(1, 5):
            stream.emit(_event(i, EngineEventType.MODEL_DELTA))
        for i in range(5, 10):
            stream.emit(_event(i, EngineEventType.STEP_END))
        stream.close()
        events = await _drain(queue)
        return events, stream.dropped

    events, dropped = asyncio.run(main())
    kinds = [e.event_type for e in events]
    assert kinds.count(EngineEventType.STEP_END) == 5 and kinds[0] is EngineEventType.RUN_START
    assert dropped == 4 and EngineEventType.MODEL_DELTA not in kinds
    assert [e.step_id for e in events] == [0, 5, 6, 7, 8, 9]


def test_a_slow_subscriber_does_not_block_the_engine_or_a_fast_subscriber(policy_agent: Any) -> None:
    async def main() -> tuple[list[int], list[int], int, int]:
        stream = EventStream()
        fast_q, slow_q = stream.subscribe(), stream.subscribe()
        engine = Engine(policy_agent(n_steps(20), tools=[tick], max_steps=100))
        loop = asyncio.get_running_loop()
        run = loop.run_in_executor(None, lambda: engine.run("t", on_event=stream.emit))
        run.add_done_callback(lambda _: stream.close())

        slow_seen: list[int] = []

        async def slow() -> None:
            while True:
                item = await slow_q.get()
                if item is None:
                    return
                slow_seen.append(item.step_id)
                await asyncio.sleep(0.005)

        slow_task = asyncio.create_task(slow())
        fast = await asyncio.wait_for(_drain(fast_q), 10)
        await asyncio.wait_for(run, 10)
        backlog_when_engine_done = slow_q.qsize()
        seen_when_engine_done = len(slow_seen)
        await asyncio.wait_for(slow_task, 30)
        return [e.step_id for e in fast], slow_seen, backlog_when_engine_done, seen_when_engine_done

    fast, slow, backlog, seen_then = asyncio.run(main())
    assert len(fast) > 100  # 21 steps of ~8 events
    assert backlog > 50 and seen_then < len(fast) // 2  # the engine finished far ahead of the slow reader
    assert slow == fast  # and the slow reader still got every event, in order


def test_a_slow_arun_stream_consumer_sees_events_after_the_engine_finished(policy_agent: Any) -> None:
    finished = threading.Event()

    class Done(EngineHook):
        def on_run_end(self, ctx: HookContext) -> None:
            finished.set()

    async_engine = AsyncEngine(policy_agent(n_steps(20), tools=[tick], max_steps=100), hooks=[Done()])

    async def main() -> tuple[int, int]:
        consumed = 0
        consumed_when_finished = -1
        async for _event in async_engine.arun_stream("t"):
            consumed += 1
            if finished.is_set() and consumed_when_finished < 0:
                consumed_when_finished = consumed
            await asyncio.sleep(0.005)
        return consumed, consumed_when_finished

    total, at_finish = asyncio.run(main())
    assert 0 < at_finish < total // 2


def test_subscribe_outside_a_running_loop_queues_events_for_plain_code() -> None:
    stream = EventStream()
    queue = stream.subscribe()  # plain synchronous code, as the seed's signature allows
    stream.emit(EngineEvent(EngineEventType.STEP_START, 1))
    stream.emit(EngineEvent(EngineEventType.STEP_END, 1))
    stream.close()
    assert [queue.get_nowait().event_type for _ in range(2)] == [EngineEventType.STEP_START, EngineEventType.STEP_END]
    assert queue.get_nowait() is None


def test_a_queue_subscribed_outside_a_loop_delivers_on_the_loop_that_awaits_it() -> None:
    stream = EventStream()
    queue = stream.subscribe()
    stream.emit(EngineEvent(EngineEventType.RUN_START, 0))  # before anyone awaits: waits in the queue

    def produce() -> None:
        for step in range(1, 200):
            stream.emit(EngineEvent(EngineEventType.STEP_START, step))
        stream.close()

    async def consume() -> list[int]:
        first = await queue.get()
        worker = threading.Thread(target=produce)  # events now come from another thread
        worker.start()
        steps = [first.step_id]
        while (item := await queue.get()) is not None:
            steps.append(item.step_id)
        worker.join()
        return steps

    assert asyncio.run(consume()) == list(range(200))
