"""The async driver: many runs on one event loop, awaited models and tools, a bounded
executor for sync tools, cancellation of one run among many, backpressure on a slow stream consumer.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import session_agents as sa
from qitos import Action, AgentModule, AsyncEngine, Decision, StateSchema, ToolRegistry, tool
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.core._errors import ConfigurationError
from qitos.engine._composition import compose
from qitos.engine._events import EngineEvent
from qitos.engine._hooks import EngineHook, HookContext
from qitos.models._base import DeltaCallback, ModelAdapter, ModelResponse, ToolCall


@tool
def double(n: int) -> int:
    """Double n."""
    return 2 * n


class AwaitingModel(ModelAdapter):
    """Calls ``double`` on the number in the task, then answers with the tool's result.

    Each call awaits ``latency`` seconds; ``complete`` is never used by the async driver.
    """

    def __init__(self, latency: float = 0.05) -> None:
        self.latency = latency
        self.calls = 0

    def complete(self, view: Any, *, on_delta: DeltaCallback | None = None) -> ModelResponse:
        raise AssertionError("the async driver must await acomplete")

    async def acomplete(self, view: Any, *, on_delta: DeltaCallback | None = None) -> ModelResponse:
        self.calls += 1
        await asyncio.sleep(self.latency)
        messages = view.messages()
        if messages[-1]["role"] == "tool":
            return ModelResponse(text=f"answer {messages[-1]['content']}")
        number = int(re.search(r"number (\d+)", messages[0]["content"]).group(1))  # type: ignore[union-attr]
        return ModelResponse(
            tool_calls=(ToolCall.from_raw(id="c1", name="double", raw_arguments=json.dumps({"n": number})),)
        )


@dataclass
class PlainState(StateSchema):
    pass


class ModelAgent(AgentModule[PlainState, Any, Any]):
    def init_state(self, task: str, **kwargs: Any) -> PlainState:
        return PlainState(task=task, max_steps=5)

    def prepare(self, state: PlainState) -> str:
        return state.task

    def reduce(self, state: PlainState, observation: Any, decision: Any) -> PlainState:
        return state


def test_a_thousand_concurrent_runs_with_an_awaiting_model_all_finish_with_their_own_results() -> None:
    model = AwaitingModel(latency=0.05)
    engine = AsyncEngine(ModelAgent(tool_registry=ToolRegistry([double]), llm=model))

    async def main() -> list[Any]:
        return await asyncio.gather(*(engine.arun(f"number {i}") for i in range(1000)))

    started = time.perf_counter()
    results = asyncio.run(main())
    elapsed = time.perf_counter() - started
    assert [r.state.final_result for r in results] == [f"answer {2 * i}" for i in range(1000)]
    assert all(r.state.stop_reason == "final" and r.step_count == 2 for r in results)
    assert model.calls == 2000
    # One after another this would take 1000 x 2 x 0.05 s = 100 s; in flight together, a few seconds.
    assert elapsed < 30, elapsed


def test_cancelling_one_run_among_many_leaves_the_others_untouched(tmp_path: Path) -> None:
    ended: dict[str, Any] = {}

    class Capture(EngineHook):
        def on_run_end(self, ctx: HookContext) -> None:
            ended[ctx.state.task] = ctx.result

    engine = AsyncEngine(
        ModelAgent(tool_registry=ToolRegistry([double]), llm=AwaitingModel(latency=0.2)),
        hooks=[Capture()],
        trace_logdir=str(tmp_path),
    )

    async def main() -> list[Any]:
        tasks = [asyncio.create_task(engine.arun(f"number {i}")) for i in range(20)]
        await asyncio.sleep(0.05)
        tasks[7].cancel()
        return await asyncio.gather(*tasks, return_exceptions=True)

    outcomes = asyncio.run(main())
    assert isinstance(outcomes[7], asyncio.CancelledError)
    others = [o for i, o in enumerate(outcomes) if i != 7]
    assert [o.state.final_result for o in others] == [f"answer {2 * i}" for i in range(20) if i != 7]
    cancelled = ended["number 7"]
    assert cancelled.state.stop_reason == "cancelled_immediate"
    assert cancelled.events[-1].event_type.value == "run_end"
    assert [e.event_type.value for e in cancelled.events].count("run_end") == 1
    manifest = json.loads((Path(cancelled.run_dir) / "manifest.json").read_text())
    assert manifest["status"] == "stopped"
    assert manifest["summary"]["stop_reason"] == "cancelled_immediate"


def _threads_agent(policy_agent: Any, tools: list[Any], actions: list[Action]) -> Any:
    def policy(state: Any, observation: Any) -> Decision[Any]:
        return Decision.final("done") if state.current_step else Decision.act(actions)

    return policy_agent(policy, tools=tools)


def test_async_and_sync_tools_mixed_in_one_decision_each_run_where_they_belong(policy_agent: Any) -> None:
    @tool
    async def fetch(key: str) -> str:
        """An awaited lookup."""
        await asyncio.sleep(0.01)
        return f"{key}@{threading.current_thread().name}"

    @tool
    def compute(key: str) -> str:
        """A blocking computation."""
        return f"{key}@{threading.current_thread().name}"

    actions = [Action("fetch", {"key": "a"}), Action("compute", {"key": "b"}), Action("fetch", {"key": "c"})]
    engine = AsyncEngine(_threads_agent(policy_agent, [fetch, compute], actions), tool_workers=2)

    async def main() -> tuple[Any, str]:
        return await engine.arun("t"), threading.current_thread().name

    result, loop_thread = asyncio.run(main())
    outputs = [r.output for r in result.records[0].observation.results]
    assert [o.split("@")[0] for o in outputs] == ["a", "b", "c"]  # decision order
    assert outputs[0].split("@")[1] == loop_thread and outputs[2].split("@")[1] == loop_thread
    assert outputs[1].split("@")[1].startswith("qitos-tool")


def test_a_blocking_sync_tool_does_not_stall_other_runs_beyond_the_executor(policy_agent: Any) -> None:
    release = threading.Event()

    @tool
    def block() -> str:
        """Holds its executor thread until released."""
        release.wait(10)
        return "released"

    @tool
    async def quick() -> str:
        """Awaits briefly."""
        await asyncio.sleep(0.005)
        return "quick"

    @tool
    def small() -> str:
        """A short sync call."""
        return "small"

    def policy(state: Any, observation: Any) -> Decision[Any]:
        if state.current_step >= 3:
            return Decision.final("done")
        if state.task == "blocker":
            return Decision.act([Action("block", {})])
        return Decision.act([Action("quick", {}), Action("small", {})])

    engine = AsyncEngine(policy_agent(policy, tools=[block, quick, small]), tool_workers=2)

    async def main() -> tuple[list[float], float]:
        blocker = asyncio.create_task(engine.arun("blocker"))
        await asyncio.sleep(0.05)  # the blocker now holds one of the two executor threads
        started = time.perf_counter()
        others = await asyncio.gather(*(engine.arun(f"run {i}") for i in range(20)))
        took = time.perf_counter() - started
        assert not blocker.done()
        assert all(r.state.final_result == "done" for r in others)
        release.set()
        await blocker
        return [took], started

    (took,), _ = asyncio.run(main())
    assert took < 5  # the 20 runs finished while the blocker still held its thread


def test_a_tool_timeout_applies_to_async_and_sync_tools(policy_agent: Any) -> None:
    hold = threading.Event()

    @tool(timeout=0.05)
    async def slow_async() -> str:
        """Awaits too long."""
        await asyncio.sleep(5)
        return "late"

    @tool(timeout=0.05)
    def slow_sync() -> str:
        """Blocks too long."""
        hold.wait(5)
        return "late"

    actions = [Action("slow_async", {}), Action("slow_sync", {})]
    engine = AsyncEngine(_threads_agent(policy_agent, [slow_async, slow_sync], actions))
    result = asyncio.run(engine.arun("t"))
    hold.set()
    assert [r.error_kind for r in result.records[0].observation.results] == ["timeout", "timeout"]


def test_streamed_model_deltas_arrive_as_model_delta_events_in_order() -> None:
    class Streaming(AwaitingModel):
        async def acomplete(self, view: Any, *, on_delta: DeltaCallback | None = None) -> ModelResponse:
            assert on_delta is not None
            for piece in ("The ", "answer ", "is ", "42"):
                on_delta(piece)
                await asyncio.sleep(0)
            return ModelResponse(text="The answer is 42")

    class ThreadStreaming(ModelAdapter):
        """Only ``complete``: the default ``acomplete`` calls it in a worker thread."""

        def complete(self, view: Any, *, on_delta: DeltaCallback | None = None) -> ModelResponse:
            assert on_delta is not None
            for piece in ("one ", "two ", "three"):
                on_delta(piece)
            return ModelResponse(text="one two three")

    for model, expected in ((Streaming(), "The answer is 42"), (ThreadStreaming(), "one two three")):
        engine = AsyncEngine(ModelAgent(llm=model))

        async def main(engine: AsyncEngine[Any, Any, Any] = engine) -> list[EngineEvent]:
            return [event async for event in engine.arun_stream("number 1")]

        events = asyncio.run(main())
        types = [e.event_type.value for e in events]
        deltas = [e.payload["text"] for e in events if e.event_type.value == "model_delta"]
        assert "".join(deltas) == expected
        assert types.index("model_delta") < types.index("decide")
        assert events[-1].payload["final_result"] == expected


def test_a_slow_stream_consumer_makes_the_run_wait_instead_of_buffering(policy_agent: Any) -> None:
    produced: list[int] = []
    consumed: list[int] = []

    class Count(EngineHook):
        def on_event(self, event: Any) -> None:
            produced.append(1)

        def on_step_end(self, ctx: HookContext) -> None:
            lag.append(len(produced) - len(consumed))

    lag: list[int] = []
    agent = policy_agent(lambda s, o: Decision.wait("more"), max_steps=120)
    engine = AsyncEngine(agent, hooks=[Count()], max_queue=16)

    async def main() -> None:
        async for _ in engine.arun_stream("t"):
            consumed.append(1)
            await asyncio.sleep(0.0005)

    asyncio.run(main())
    assert len(consumed) == len(produced)
    # A step emits a handful of events; the run never got more than the bound plus one step ahead.
    assert max(lag) <= 16 + 10, max(lag)


def test_engine_cancel_reaches_every_run_in_progress(policy_agent: Any) -> None:
    @tool
    async def tick() -> str:
        """Awaits a little."""
        await asyncio.sleep(0.01)
        return "tick"

    agent = policy_agent(lambda s, o: Decision.act([Action("tick", {})]), tools=[tick], max_steps=10_000)
    engine = AsyncEngine(agent)

    async def main() -> list[Any]:
        runs = [asyncio.create_task(engine.arun("t")) for _ in range(5)]
        await asyncio.sleep(0.1)
        engine.engine.cancel()
        return list(await asyncio.gather(*runs))

    results = asyncio.run(main())
    assert [r.state.stop_reason for r in results] == ["cancelled"] * 5
    assert all(0 < r.step_count < 10_000 for r in results)


def test_an_async_tool_runs_to_completion_under_the_sync_driver(policy_agent: Any) -> None:
    @tool
    async def later(n: int) -> int:
        """Awaits, then answers."""
        await asyncio.sleep(0.001)
        return n + 1

    agent = _threads_agent(policy_agent, [later], [Action("later", {"n": 1})])
    assert agent.tool_registry.get("later").parameters["properties"] == {"n": {"type": "integer"}}
    result = AsyncEngine(agent).run("t")  # the synchronous driver
    assert result.records[0].observation.results[0].output == 2


def test_the_sync_call_path_refuses_an_async_tool_inside_a_running_loop() -> None:
    @tool
    async def later() -> str:
        """Awaits."""
        return "x"

    registry = ToolRegistry([later])

    async def main() -> Any:
        return registry.call("later", {}, call_id="c"), await registry.acall("later", {}, call_id="d")

    refused, awaited = asyncio.run(main())
    assert refused.ok is False and refused.error_kind == "tool_error"
    assert "acall" in (refused.error or "")
    assert awaited.ok is True and awaited.output == "x"


def test_a_cancelled_arun_abandons_the_model_call_and_raises_cancelled_error_to_its_awaiter() -> None:
    agent = ModelAgent(tool_registry=ToolRegistry([double]), llm=AwaitingModel(latency=5))
    engine = AsyncEngine(agent)

    async def main() -> None:
        task = asyncio.create_task(engine.arun("number 3"))
        await asyncio.sleep(0.05)
        task.cancel()
        await task

    started = time.perf_counter()
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())
    assert time.perf_counter() - started < 3  # the model call in flight was abandoned


def test_many_sessions_are_created_and_run_on_one_loop_with_asession_and_arun(tmp_path: Path) -> None:
    store = SqliteCheckpointStore(str(tmp_path / "sessions.db"))
    composition = compose(
        agent=lambda: ModelAgent(tool_registry=ToolRegistry([double]), llm=AwaitingModel(latency=0.01)), store=store
    )

    async def main() -> list[Any]:
        sessions = await asyncio.gather(*(composition.asession(f"number {i}") for i in range(30)))
        return list(await asyncio.gather(*(s.arun() for s in sessions)))

    results = asyncio.run(main())
    assert [r.state.final_result for r in results] == [f"answer {2 * i}" for i in range(30)]
    assert sorted(h.lifecycle for h in store.list_sessions()) == ["completed"] * 30


def test_the_async_session_controls_steer_pause_approve_and_inspect(tmp_path: Path) -> None:
    side = str(tmp_path / "side.log")
    composition = sa.make_composition(str(tmp_path / "sessions.db"), side, approval_at=1)

    async def main() -> tuple[Any, ...]:
        session = await composition.asession("Index notes", target=3)
        waiting = await session.arun()
        inspection = await session.ainspect()
        assert inspection.tool_batch is not None
        (call,) = inspection.tool_batch.pending_approval
        await session.aapprove(call.call_id)
        await session.asteer("mind the tags")
        pause = await session.apause()
        paused = await session.arun()
        finished = await session.arun()
        with pytest.raises(ConfigurationError, match="awaiting approval"):
            await session.areject("no-such-call")
        return waiting, inspection, pause, paused, finished, await session.ainspect()

    waiting, inspection, pause, paused, finished, last = asyncio.run(main())
    assert waiting.state.stop_reason == "awaiting_approval" and inspection.lifecycle.value == "awaiting_approval"
    assert pause.position > 0 and paused.state.stop_reason == "paused"
    assert finished.state.stop_reason == "final" and finished.state.steering_seen == ["mind the tags"]
    assert last.lifecycle.value == "completed"
    assert [e for e, tool, _ in sa.read_side_log(side) if tool == "publish"] == ["begin", "end"]


def test_cancelling_a_run_cancels_the_async_tool_it_awaits(policy_agent: Any) -> None:
    seen: list[str] = []

    @tool
    async def wait_long() -> str:
        """Awaits for a long time."""
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return "late"

    agent = _threads_agent(policy_agent, [wait_long], [Action("wait_long", {})])
    ended: list[Any] = []

    class Capture(EngineHook):
        def on_run_end(self, ctx: HookContext) -> None:
            ended.append(ctx.result)

    engine = AsyncEngine(agent, hooks=[Capture()])

    async def main() -> None:
        task = asyncio.create_task(engine.arun("t"))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    started = time.perf_counter()
    asyncio.run(main())
    assert time.perf_counter() - started < 5
    assert seen == ["cancelled"]
    assert ended[0].state.stop_reason == "cancelled_immediate" and ended[0].step_count == 0


def test_a_compositions_sessions_share_one_bounded_executor_for_sync_tools(tmp_path: Path) -> None:
    def factory() -> Any:
        return sa.NotesAgent(str(tmp_path / "side.log"))

    shared = compose(agent=factory, tool_workers=3)
    first, second = shared.engine(), shared.engine()
    assert first.tool_executor is second.tool_executor
    with pytest.raises(ConfigurationError, match="tool_workers"):
        compose(agent=factory, tool_workers=0)


def test_a_cancelled_session_run_commits_its_boundary_and_the_next_run_finishes_it_once(tmp_path: Path) -> None:
    side = str(tmp_path / "side.log")
    composition = sa.make_composition(str(tmp_path / "sessions.db"), side, sleep=0.05)

    async def main() -> tuple[Any, Any]:
        session = await composition.asession("Index notes", target=6)
        task = asyncio.create_task(session.arun())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        stopped = await session.ainspect()
        await asyncio.sleep(0.1)  # a sync tool cut off by the cancel finishes in its thread
        return stopped, await composition.restore(session.session_id.value).arun()

    stopped, finished = asyncio.run(main())
    assert stopped.lifecycle.value == "stopped"  # cancelled_immediate: the last boundary was committed
    assert finished.state.stop_reason == "final" and finished.state.steps_done == list(range(6))
    begins = [call for event, tool, call in sa.read_side_log(side) if event == "begin" and tool == "append_note"]
    assert len(begins) == len(set(begins))  # no non-idempotent call ran twice


def test_arestore_gives_the_session_restore_gives_and_resumes_it_on_the_loop(tmp_path: Path) -> None:
    from fleet_app import FleetAgent
    from qitos.core._errors import SessionNotFoundError
    from qitos.engine._composition import compose

    composition = compose(FleetAgent, store=str(tmp_path / "s.db"))
    sid = composition.session("resume me", target=3).session_id.value

    async def main() -> tuple[str, str, int]:
        session = await composition.arestore(sid)
        result = await session.arun()
        with pytest.raises(SessionNotFoundError):
            await composition.arestore("ses_missing")
        return session.session_id.value, str(result.state.final_result), result.state.done

    sync = composition.restore(sid)
    assert asyncio.run(main()) == (sid, "3 steps", 3)
    assert sync.state_type.__name__ == "FleetState"
