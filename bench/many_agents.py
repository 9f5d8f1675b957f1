"""Many agents: the cost of delegation to durable child sessions, and parallel tool calls.

    .venv/bin/python bench/many_agents.py [--children 10] [--steps 5] [--repeat 3]

Delegation (SQLite, ``durability="sync"``, a fresh database file per measurement):

- delegated: a parent session of ``children + 1`` steps; steps 0..children-1 each delegate one task
  to a sub-agent (``qitos.engine._delegation``) whose child session does ``steps`` tool steps (a
  trivial tool) and answers; the last step answers. Time of the parent's ``run()``.
- parent alone: the same parent with a trivial tool in place of the delegation (its own steps and
  calls, no children). Time of its ``run()``.
- plain: ``children`` plain sessions of the same sub-agent, each created and run to its end
  (``Engine.session(task).run()``), one after another.

Framework cost per child step = (delegated - parent alone) / (children * steps), against plain /
(children * steps): both include creating the session, its lease and its first snapshot, so the
ratio is what delegation adds (the parent's call records, the derived child id lookup, the
``delegate`` events, the result's return). Target: within 1.5x.

Parallel calls: one decision with 8 ``concurrency_safe`` tools that each sleep 100 ms, against one
decision with one such call; wall time of the step, plain ``Engine.run`` through the sync driver
(threads) and ``arun`` through the async driver (the event loop and its executor). Target: <= 1.3x.

After one warm-up, each measurement runs ``--repeat`` times (the order rotating) on its own
database file; medians are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from qitos.checkpoint._sqlite_store import SqliteCheckpointStore  # noqa: E402
from qitos.core._agent_module import AgentModule  # noqa: E402
from qitos.core._decision import Action, Decision, Observation  # noqa: E402
from qitos.core._state import StateSchema  # noqa: E402
from qitos.core._tool import ToolRegistry, tool  # noqa: E402
from qitos.engine._delegation import delegate  # noqa: E402
from qitos.engine._engine import Engine  # noqa: E402


@dataclass
class BenchState(StateSchema):
    """Outputs seen."""

    outputs: list[str] = field(default_factory=list)


@tool
def work(i: int) -> str:
    """A trivial tool.

    Args:
        i: the step.
    """
    return f"w{i}"


@tool(concurrency_safe=True)
def slow(i: int) -> str:
    """A 100 ms call that may run alongside others.

    Args:
        i: which call.
    """
    time.sleep(0.1)
    return f"s{i}"


class Scripted(AgentModule[BenchState, Observation, Action]):
    """``n`` steps; step i makes ``calls(i)``; then a final answer."""

    def __init__(self, n: int, calls: Callable[[int], list[Action]], tools: list[Any]) -> None:
        super().__init__(tool_registry=ToolRegistry(tools))
        self.n = n
        self.calls = calls

    def init_state(self, task: str, **kwargs: Any) -> BenchState:
        return BenchState(task=task, max_steps=self.n + 2)

    def decide(self, state: BenchState, observation: Observation) -> Decision[Any]:
        i = state.current_step
        if i >= self.n:
            return Decision.final(f"done:{state.task}")
        return Decision.act(self.calls(i))

    def reduce(self, state: BenchState, observation: Observation, decision: Decision[Any]) -> BenchState:
        state.outputs = [*state.outputs, *(r.as_text() for r in observation.results)]
        return state


def child_agent(steps: int) -> Callable[[], Scripted]:
    return lambda: Scripted(steps, lambda i: [Action(name="work", args={"i": i}, id=f"w{i}")], [work])


def time_delegated(root: Path, children: int, steps: int) -> float:
    store = SqliteCheckpointStore(str(root / "delegated.db"))
    helper = delegate("helper", child_agent(steps))
    parent = Scripted(children, lambda i: [Action(name="helper", args={"task": f"t{i}"}, id=f"d{i}")], [helper])
    session = Engine(parent, checkpoint_store=store).session("delegate")
    started = time.perf_counter()
    result = session.run()
    elapsed = time.perf_counter() - started
    if result.state.outputs != [f"done:t{i}" for i in range(children)]:
        raise SystemExit(f"unexpected parent outputs {result.state.outputs}")
    return elapsed


def time_parent_alone(root: Path, children: int) -> float:
    store = SqliteCheckpointStore(str(root / "alone.db"))
    parent = Scripted(children, lambda i: [Action(name="work", args={"i": i}, id=f"d{i}")], [work])
    session = Engine(parent, checkpoint_store=store).session("alone")
    started = time.perf_counter()
    session.run()
    return time.perf_counter() - started


def time_plain(root: Path, children: int, steps: int) -> float:
    store = SqliteCheckpointStore(str(root / "plain.db"))
    factory = child_agent(steps)
    started = time.perf_counter()
    for i in range(children):
        Engine(factory(), checkpoint_store=store).session(f"t{i}").run()
    return time.perf_counter() - started


def time_parallel(calls: int, driver: str) -> float:
    agent = Scripted(1, lambda i: [Action(name="slow", args={"i": j}, id=f"s{j}") for j in range(calls)], [slow])
    engine = Engine(agent)
    started = time.perf_counter()
    if driver == "sync":
        engine.run("parallel")
    else:
        asyncio.run(engine.arun("parallel"))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--children", type=int, default=10)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    delegated, alone, plain = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        time_plain(Path(tmp), args.children, args.steps)  # warm-up (imports, first SQLite file)
    measures = [
        (plain, lambda root: time_plain(root, args.children, args.steps)),
        (alone, lambda root: time_parent_alone(root, args.children)),
        (delegated, lambda root: time_delegated(root, args.children, args.steps)),
    ]
    for r in range(args.repeat):
        # The order rotates between repeats, so no side always runs first on a cold cache.
        for samples, measure in measures[r % 3 :] + measures[: r % 3]:
            with tempfile.TemporaryDirectory() as tmp:
                samples.append(measure(Path(tmp)))
    child_steps = args.children * args.steps
    d, a, p = statistics.median(delegated), statistics.median(alone), statistics.median(plain)
    per_child = (d - a) / child_steps * 1e3
    per_plain = p / child_steps * 1e3
    print(f"delegation: {args.children} children x {args.steps} steps, SQLite sync durability")
    print(f"  parent with children   {d * 1e3:9.1f} ms")
    print(f"  parent alone           {a * 1e3:9.1f} ms")
    print(f"  plain child sessions   {p * 1e3:9.1f} ms")
    print(f"  per child step: delegated {per_child:.3f} ms, plain session {per_plain:.3f} ms")
    print(f"  ratio {per_child / per_plain:.2f}x (target <= 1.5x)")
    print("parallel calls: 8 concurrency_safe tools of 100 ms vs one call")
    for driver in ("sync", "async"):
        one = statistics.median(time_parallel(1, driver) for _ in range(args.repeat))
        eight = statistics.median(time_parallel(8, driver) for _ in range(args.repeat))
        ratio = eight / one
        print(
            f"  {driver:5s}: one {one * 1e3:7.1f} ms, eight {eight * 1e3:7.1f} ms, ratio {ratio:.2f}x (target <= 1.3x)"
        )


if __name__ == "__main__":
    main()
