"""AsyncEngine: arun, arun_stream, run, engine, agent, event_stream; event order always holds."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from qitos import Action, AgentModule, AsyncEngine, Decision, Engine, EngineResult, tool
from qitos.engine._events import EngineEvent, EngineEventType
from qitos.engine._hooks import EngineHook, HookContext
from qitos.engine.runtime import RuntimeBudget


@tool
def step_tool(n: int) -> str:
    """A quick tool."""
    return f"step {n}"


def three_steps(state: Any, observation: Any) -> Decision[Any]:
    if state.current_step == 2:
        return Decision.final("finished")
    return Decision.act([Action("step_tool", {"n": state.current_step})])


def _types(events: list[EngineEvent]) -> list[str]:
    return [e.event_type.value for e in events]


def _assert_framed(events: list[EngineEvent]) -> None:
    types = _types(events)
    assert types[0] == "run_start" and types[-1] == "run_end"
    assert types.count("run_start") == 1 and types.count("run_end") == 1


def test_arun_returns_the_same_result_as_engine_run(policy_agent: Any) -> None:
    async_engine = AsyncEngine(policy_agent(three_steps, tools=[step_tool]))
    result = asyncio.run(async_engine.arun("t"))
    sync = Engine(policy_agent(three_steps, tools=[step_tool])).run("t")
    assert isinstance(result, EngineResult)
    assert result.state.to_dict() == sync.state.to_dict()
    assert _types(result.events) == _types(sync.events)


def test_arun_does_not_block_the_event_loop(policy_agent: Any) -> None:
    @tool
    def slow() -> str:
        """Blocks its thread for a while."""
        time.sleep(0.3)
        return "slow"

    agent = policy_agent(
        lambda s, o: Decision.final("x") if s.current_step else Decision.act([Action("slow", {})]), tools=[slow]
    )

    async def main() -> int:
        ticks = 0
        task = asyncio.create_task(AsyncEngine(agent).arun("t"))
        while not task.done():
            ticks += 1
            await asyncio.sleep(0.01)
        await task
        return ticks

    assert asyncio.run(main()) >= 10


def test_arun_stream_yields_events_live_run_start_first_run_end_last(policy_agent: Any) -> None:
    async_engine = AsyncEngine(policy_agent(three_steps, tools=[step_tool]))

    async def main() -> tuple[list[EngineEvent], list[bool]]:
        events: list[EngineEvent] = []
        active: list[bool] = [async_engine.event_stream is None]
        async for event in async_engine.arun_stream("t"):
            active.append(async_engine.event_stream is not None)
            events.append(event)
        active.append(async_engine.event_stream is None)
        return events, active

    events, active = asyncio.run(main())
    _assert_framed(events)
    assert all(active)
    assert _types(events).count("step_end") == 3
    assert events[-1].payload["stop_reason"] == "final"
    assert all(isinstance(e, EngineEvent) and isinstance(e.event_type, EngineEventType) for e in events)


def test_arun_stream_ends_with_run_end_when_reduce_raises(policy_agent: Any) -> None:
    def reduce(state: Any, observation: Any, decision: Any) -> Any:
        raise RuntimeError("bad reduce")

    async_engine = AsyncEngine(policy_agent(three_steps, tools=[step_tool], reduce=reduce))

    async def main() -> list[EngineEvent]:
        return [event async for event in async_engine.arun_stream("t")]

    events = asyncio.run(main())
    _assert_framed(events)
    assert "error" in _types(events)
    assert events[-1].payload["stop_reason"] == "unrecoverable_error" and events[-1].ok is False


def test_arun_stream_re_raises_an_init_state_error_after_run_end() -> None:
    class Broken(AgentModule[Any, Any, Any]):
        def init_state(self, task: str, **kwargs: Any) -> Any:
            raise LookupError("no such corpus")

        def reduce(self, state: Any, observation: Any, decision: Any) -> Any:
            return state

    async_engine = AsyncEngine(Broken())
    events: list[EngineEvent] = []

    async def main() -> None:
        async for event in async_engine.arun_stream("t"):
            events.append(event)

    with pytest.raises(LookupError, match="no such corpus"):
        asyncio.run(main())
    _assert_framed(events)
    assert events[-1].ok is False and "no such corpus" in (events[-1].error or "")
    assert async_engine.event_stream is None


def test_breaking_out_of_the_stream_cancels_the_run_immediately(policy_agent: Any) -> None:
    ended: list[Any] = []

    class Capture(EngineHook):
        def on_run_end(self, ctx: HookContext) -> None:
            ended.append(ctx.result)

    agent = policy_agent(
        lambda s, o: Decision.act([Action("step_tool", {"n": 0})]), tools=[step_tool], max_steps=100_000
    )
    async_engine = AsyncEngine(agent, hooks=[Capture()])

    async def main() -> None:
        async for event in async_engine.arun_stream("t"):
            if event.event_type.value == "step_end" and event.step_id == 2:
                break

    asyncio.run(main())
    assert len(ended) == 1
    result = ended[0]
    assert result.state.stop_reason == "cancelled_immediate"
    assert result.step_count < 100_000
    _assert_framed(result.events)
    assert result.events[-1].payload["stop_reason"] == "cancelled_immediate"


def test_cancelling_the_engine_mid_stream_ends_the_stream_with_run_end(policy_agent: Any) -> None:
    agent = policy_agent(
        lambda s, o: Decision.act([Action("step_tool", {"n": 0})]), tools=[step_tool], max_steps=100_000
    )
    async_engine = AsyncEngine(agent)

    async def main() -> list[EngineEvent]:
        events = []
        async for event in async_engine.arun_stream("t"):
            events.append(event)
            if event.event_type.value == "step_start" and event.step_id == 3:
                async_engine.engine.cancel(immediate=True)
        return events

    events = asyncio.run(main())
    _assert_framed(events)
    assert events[-1].payload["stop_reason"] == "cancelled_immediate"


def test_run_is_the_synchronous_fallback_and_properties_expose_the_engine(policy_agent: Any) -> None:
    agent = policy_agent(three_steps, tools=[step_tool])
    async_engine = AsyncEngine(agent, budget=RuntimeBudget(max_steps=1))
    assert isinstance(async_engine.engine, Engine)
    assert async_engine.agent is agent is async_engine.engine.agent
    assert async_engine.engine.budget.max_steps == 1  # keyword arguments reach the Engine
    assert async_engine.event_stream is None
    result = async_engine.run("t")
    assert result.state.stop_reason == "max_steps_reached" and result.step_count == 1


def test_two_streams_on_two_threads_do_not_mix(policy_agent: Any) -> None:
    outcomes: dict[str, list[str]] = {}

    def consume(name: str) -> None:
        async_engine = AsyncEngine(policy_agent(three_steps, tools=[step_tool]))

        async def main() -> list[str]:
            return [str(e.payload.get("task", "")) async for e in async_engine.arun_stream(name)][:1]

        outcomes[name] = asyncio.run(main())

    threads = [threading.Thread(target=consume, args=(n,)) for n in ("alpha", "beta")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert outcomes == {"alpha": ["alpha"], "beta": ["beta"]}


def test_engine_event_fields_match_the_seed(policy_agent: Any) -> None:
    result = asyncio.run(AsyncEngine(policy_agent(three_steps, tools=[step_tool])).arun("t"))
    event = result.events[0]
    for name in ("event_type", "step_id", "agent_id", "phase", "ok", "payload", "error", "ts"):
        assert hasattr(event, name), name
    assert event.event_type is EngineEventType.RUN_START and event.step_id == 0 and event.ok is True
    assert event.ts.endswith("+00:00") and "T" in event.ts
    assert result.events[-1].ts >= event.ts
    for name in ("STEP_START", "STEP_END", "DECIDE", "ACT", "REDUCE", "CRITIC", "CHECK_STOP", "HANDOFF"):
        assert hasattr(EngineEventType, name)
    for name in ("DELEGATE", "FANOUT", "ERROR", "RUN_START", "RUN_END", "MODEL_DELTA", "PAUSE", "STEER"):
        assert hasattr(EngineEventType, name)
    assert {"compaction", "checkpoint"} <= {t.value for t in EngineEventType}
