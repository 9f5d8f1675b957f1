"""Parallel tool calls: ``concurrency_safe`` calls of one decision run together, others are barriers.

Each behaviour runs through both drivers (the ``driver`` fixture): threads for sync tools in the
sync driver, the event loop and its bounded executor in the async one.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import delegate_agents as da
import driven
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.core._agent_module import AgentModule
from qitos.core._decision import Action, Decision, Observation
from qitos.core._errors import ConfigurationError
from qitos.core._state import StateSchema
from qitos.core._tool import ToolRegistry, tool
from qitos.engine._call_plan import plan_calls
from qitos.engine._engine import Engine

pytestmark = pytest.mark.usefixtures("driver")

SLOW = 0.3


@dataclass
class CallState(StateSchema):
    """What the agent saw: the outputs of its one tool step, in the order they came back."""

    outputs: list[str] = field(default_factory=list)


class Clock:
    """Tools that record when each call started and ended (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: dict[str, tuple[float, float]] = {}

    def _span(self, name: str, started: float) -> None:
        with self.lock:
            self.spans[name] = (started, time.perf_counter())

    @tool(concurrency_safe=True)
    def fetch(self, key: str) -> str:
        """Fetch (safe to run alongside others).

        Args:
            key: what to fetch.
        """
        started = time.perf_counter()
        time.sleep(SLOW)
        self._span(key, started)
        return f"fetched {key}"

    @tool(concurrency_safe=True)
    async def afetch(self, key: str) -> str:
        """Fetch asynchronously (safe to run alongside others).

        Args:
            key: what to fetch.
        """
        started = time.perf_counter()
        await asyncio.sleep(SLOW)
        self._span(key, started)
        return f"afetched {key}"

    @tool
    def write(self, key: str) -> str:
        """Write (not safe to run alongside others: a barrier).

        Args:
            key: what to write.
        """
        started = time.perf_counter()
        time.sleep(SLOW)
        self._span(key, started)
        return f"wrote {key}"


class OneStep(AgentModule[CallState, Observation, Action]):
    """Calls the given actions in one decision, then answers."""

    def __init__(self, clock: Clock, actions: list[Action]) -> None:
        registry = ToolRegistry()
        registry.include(clock)
        super().__init__(tool_registry=registry)
        self.actions = actions

    def init_state(self, task: str, **kwargs: Any) -> CallState:
        return CallState(task=task, max_steps=4)

    def decide(self, state: CallState, observation: Observation) -> Decision[Any]:
        if state.current_step == 0:
            return Decision.act(list(self.actions))
        return Decision.final("done")

    def reduce(self, state: CallState, observation: Observation, decision: Decision[Any]) -> CallState:
        state.outputs.extend(r.as_text() for r in observation.results)
        return state


def _actions(*calls: tuple[str, str]) -> list[Action]:
    return [Action(name=name, args={"key": key}, id=f"c-{key}") for name, key in calls]


def test_three_concurrency_safe_tools_finish_in_well_under_their_sum() -> None:
    clock = Clock()
    agent = OneStep(clock, _actions(("fetch", "a"), ("fetch", "b"), ("fetch", "c")))
    started = time.perf_counter()
    result = driven.run(Engine(agent), "fetch three")
    wall = time.perf_counter() - started
    assert result.state.outputs == ["fetched a", "fetched b", "fetched c"]
    assert wall < 0.7, f"three 300 ms calls took {wall:.3f} s"


def test_async_tools_run_together_too() -> None:
    clock = Clock()
    agent = OneStep(clock, _actions(("afetch", "a"), ("afetch", "b"), ("afetch", "c")))
    started = time.perf_counter()
    result = driven.run(Engine(agent), "fetch three")
    wall = time.perf_counter() - started
    assert result.state.outputs == ["afetched a", "afetched b", "afetched c"]
    assert wall < 0.7, f"three 300 ms async calls took {wall:.3f} s"


def test_a_non_safe_tool_between_them_is_a_barrier_and_results_keep_decision_order() -> None:
    clock = Clock()
    agent = OneStep(clock, _actions(("fetch", "a"), ("fetch", "b"), ("write", "w"), ("fetch", "c"), ("fetch", "d")))
    result = driven.run(Engine(agent), "fetch, write, fetch")
    assert result.state.outputs == ["fetched a", "fetched b", "wrote w", "fetched c", "fetched d"]
    spans = clock.spans
    write_start, write_end = spans["w"]
    assert max(spans["a"][1], spans["b"][1]) <= write_start  # the barrier waits for what came before
    assert min(spans["c"][0], spans["d"][0]) >= write_end  # and nothing after it starts early
    assert abs(spans["a"][0] - spans["b"][0]) < SLOW / 2  # a and b overlapped
    assert abs(spans["c"][0] - spans["d"][0]) < SLOW / 2
    act = next(e for e in result.events if e.event_type.value == "act")
    assert [c["call_id"] for c in act.payload["calls"]] == ["c-a", "c-b", "c-w", "c-c", "c-d"]


def test_max_parallel_tools_bounds_how_many_run_at_once() -> None:
    clock = Clock()
    agent = OneStep(clock, _actions(("fetch", "a"), ("fetch", "b"), ("fetch", "c"), ("fetch", "d")))
    started = time.perf_counter()
    result = driven.run(Engine(agent, max_parallel_tools=2), "fetch four, two at a time")
    wall = time.perf_counter() - started
    assert result.state.outputs == ["fetched a", "fetched b", "fetched c", "fetched d"]
    assert wall >= 2 * SLOW * 0.95  # two waves
    spans = sorted(clock.spans.values())
    for i, (start, _) in enumerate(spans):
        running = sum(1 for s, e in spans if s <= start < e)
        assert running <= 2, f"call {i} started while {running - 1} others ran"


def test_max_parallel_tools_must_be_a_positive_int() -> None:
    agent = OneStep(Clock(), [])
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ConfigurationError, match="max_parallel_tools"):
            Engine(agent, max_parallel_tools=bad)  # type: ignore[arg-type]


def test_approval_needing_and_unknown_tools_are_never_grouped() -> None:
    @tool(concurrency_safe=True, needs_approval=True)
    def publish(key: str) -> str:
        """Publish.

        Args:
            key: what.
        """
        return key

    clock = Clock()
    registry = ToolRegistry([publish])
    registry.include(clock)
    actions = _actions(("fetch", "a"), ("publish", "p"), ("fetch", "b"), ("nope", "n"), ("fetch", "c"), ("fetch", "d"))
    groups = plan_calls(registry, actions)
    assert [[a.id for a in g] for g in groups] == [["c-a"], ["c-p"], ["c-b"], ["c-n"], ["c-c", "c-d"]]


def test_in_a_durable_session_each_start_and_result_is_recorded(tmp_path: Path) -> None:
    clock = Clock()
    agent = OneStep(clock, _actions(("fetch", "a"), ("fetch", "b"), ("fetch", "c")))
    store = SqliteCheckpointStore(str(tmp_path / "s.db"))
    session = Engine(agent, checkpoint_store=store).session("fetch three durably")
    started = time.perf_counter()
    result = driven.run(session)
    wall = time.perf_counter() - started
    assert result.state.outputs == ["fetched a", "fetched b", "fetched c"]
    assert wall < 0.7 + 0.3, f"three 300 ms calls in a session took {wall:.3f} s"
    graph = session.inspect().work_graph
    assert graph is not None
    calls = graph["steps"][0]["tool_calls"]
    assert [(c["work_item"], c["outcome"]) for c in calls] == [("c-a", "ok"), ("c-b", "ok"), ("c-c", "ok")]


@pytest.mark.parametrize("driver", ["sync"], indirect=True)
def test_kill_9_during_a_batch_reruns_only_the_interrupted_idempotent_call(tmp_path: Path) -> None:
    db, side = str(tmp_path / "s.db"), str(tmp_path / "side.log")
    store = SqliteCheckpointStore(db)
    sid = Engine(da.BatchAgent(side), checkpoint_store=store).session("batch").session_id.value
    proc = da.start_cli("run", "--agent", "batch", "--db", db, "--session", sid, "--log", side, "--sleep", "30")
    deadline = time.monotonic() + 60
    while _begun(side) < 3:  # all three started together (each sleeps 30 s)
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    done = da.start_cli("run", "--agent", "batch", "--db", db, "--session", sid, "--log", side, "--sleep", "0")
    out, err = done.communicate(timeout=60)
    assert done.returncode == 0, err
    assert '"final_result": "b0 interrupted | b1 interrupted | probe b2"' in out
    lines = Path(side).read_text().splitlines()
    assert lines.count("begin send b0") == 1 and lines.count("begin send b1") == 1  # never repeated
    assert lines.count("begin probe b2") == 2  # the idempotent one ran again
    assert "end send b0" not in lines


def _begun(side: str) -> int:
    path = Path(side)
    return sum(line.startswith("begin") for line in path.read_text().splitlines()) if path.exists() else 0
