"""Many runs in flight in one process: qitos' async driver vs LangGraph 1.2 ``ainvoke`` (issue 13).

Run: .venv/bin/python bench/concurrency.py [--n 50 200 1000] [--k 3] [--latency 0.2] [--no-langgraph]

N runs start at once on one event loop; each makes K model calls that take L seconds each (the
model awaits ``asyncio.sleep(L)``), with a no-op tool call between two model calls, so one run is
K model turns and K - 1 tool calls. The ideal wall time is K x L, whatever N.

- qitos: an ``AgentModule`` on the model path (``decide`` returns None) whose model adapter's
  ``acomplete`` awaits the sleep and answers with a native tool call (turns 1..K-1) or the final
  text (turn K); the tool is an ``async def`` no-op. In memory: ``AsyncEngine.arun`` x N. Durable:
  a composition over ``SqliteCheckpointStore`` (WAL, synchronous=NORMAL, ``durability="sync"``:
  every boundary committed before the next step), N sessions created with ``Composition.asession``
  and run with ``Session.arun``, creation included in the timed part.
- LangGraph ``langgraph==1.2.24``: a 2-node ``StateGraph`` (model -> tool -> model ... -> END); the
  model node awaits the same sleep, the tool node is a no-op; ``app.ainvoke`` x N with
  ``asyncio.gather``. In memory: no checkpointer. Durable: ``AsyncSqliteSaver``
  (``langgraph-checkpoint-sqlite`` + ``aiosqlite``) on a WAL file with synchronous=NORMAL,
  ``durability="sync"``, one thread per run. It runs in ``bench/.venvs/langgraph`` (created with the
  packages it needs on first use, as ``bench/engine_overhead.py`` does).

Every (side, variant, N) runs in a fresh subprocess, so its peak RSS (``ru_maxrss``) is its own;
CPU seconds are the process's CPU time in the timed part, divided by N. Import and setup are not
timed. Targets: at N = 1000, qitos <= 1.25x LangGraph's time in memory and <= 1.5x durable.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LG_VENV = HERE / ".venvs" / "langgraph"
LANGGRAPH_PINS = {"langgraph": "1.2.24", "langgraph-checkpoint-sqlite": None, "aiosqlite": None}
TARGET_MEMORY = 1.25
TARGET_DURABLE = 1.5

# --------------------------------------------------------------------------- qitos side (a subprocess)

QITOS_SCRIPT = r"""
import asyncio, json, resource, sys, time
from dataclasses import dataclass
from typing import Any

from qitos import AgentModule, AsyncEngine, StateSchema, ToolRegistry, compose, tool
from qitos.checkpoint.sqlite_store import SqliteCheckpointStore
from qitos.models._base import ModelAdapter, ModelResponse, ToolCall

variant, n, k, latency, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]


@tool
async def noop(turn: int) -> str:
    "Does nothing."
    return "ok"


class SleepyModel(ModelAdapter):
    def complete(self, view, *, on_delta=None):
        raise AssertionError("the async driver awaits acomplete")

    async def acomplete(self, view, *, on_delta=None):
        await asyncio.sleep(latency)
        turn = sum(1 for m in view.messages() if m["role"] == "assistant") + 1
        if turn >= k:
            return ModelResponse(text="done")
        call = ToolCall.from_raw(id=f"c{turn}", name="noop", raw_arguments=json.dumps({"turn": turn}))
        return ModelResponse(tool_calls=(call,))


@dataclass
class S(StateSchema):
    pass


class Agent(AgentModule):
    def __init__(self):
        super().__init__(tool_registry=ToolRegistry([noop]), llm=SleepyModel())

    def init_state(self, task, **kwargs):
        return S(task=task, max_steps=k + 2)

    def prepare(self, state):
        return state.task

    def reduce(self, state, observation, decision):
        return state


async def main():
    if variant == "memory":
        engine = AsyncEngine(Agent())
        cpu, start = time.process_time(), time.perf_counter()
        results = await asyncio.gather(*(engine.arun(f"run {i}") for i in range(n)))
    else:
        store = SqliteCheckpointStore(path)
        composition = compose(agent=Agent, store=store, durability="sync")

        async def one(i):
            session = await composition.asession(f"run {i}")
            return await session.arun()

        cpu, start = time.process_time(), time.perf_counter()
        results = await asyncio.gather(*(one(i) for i in range(n)))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert all(r.state.final_result == "done" and r.step_count == k for r in results), results[0].state
    if variant == "durable":
        heads = await store.alist_sessions()
        assert len(heads) == n and all(h.lifecycle == "completed" for h in heads)
        await store.aclose()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"wall": wall, "cpu": cpu, "rss_kb": rss}))


asyncio.run(main())
"""

# --------------------------------------------------------------------------- LangGraph side (its venv)

LANGGRAPH_SCRIPT = r"""
import asyncio, json, resource, sys, time
from typing import TypedDict

from langgraph.graph import END, START, StateGraph

variant, n, k, latency, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]


class State(TypedDict):
    turns: int
    out: str


async def model(state):
    await asyncio.sleep(latency)
    return {"turns": state["turns"] + 1}


async def tool(state):
    return {"out": "ok"}


graph = StateGraph(State)
graph.add_node("model", model)
graph.add_node("tool", tool)
graph.add_edge(START, "model")
graph.add_conditional_edges("model", lambda s: END if s["turns"] >= k else "tool")
graph.add_edge("tool", "model")


async def run(app, **kwargs):
    cpu, start = time.process_time(), time.perf_counter()
    results = await asyncio.gather(
        *(app.ainvoke({"turns": 0, "out": ""}, {"configurable": {"thread_id": f"t{i}"}}, **kwargs) for i in range(n))
    )
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert all(r["turns"] == k for r in results)
    return wall, cpu


async def main():
    if variant == "memory":
        wall, cpu = await run(graph.compile())
    else:
        import aiosqlite
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        conn = await aiosqlite.connect(path)
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute("PRAGMA synchronous=NORMAL")
        saver = AsyncSqliteSaver(conn)
        await saver.setup()
        wall, cpu = await run(graph.compile(checkpointer=saver), durability="sync")
        await conn.close()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"wall": wall, "cpu": cpu, "rss_kb": rss}))


asyncio.run(main())
"""


def ensure_langgraph_venv() -> Path:
    """bench/.venvs/langgraph with the pinned LangGraph, the SQLite saver and aiosqlite."""
    python = LG_VENV / "bin" / "python"
    if not python.exists():
        base = shutil.which("python3") or sys.executable
        print(f"creating {LG_VENV} ...", flush=True)
        subprocess.run([base, "-m", "venv", str(LG_VENV)], check=True)
    probe = (
        "import importlib.metadata as m, json, sys\n"
        "out = {}\n"
        "for name in sys.argv[1:]:\n"
        "    try: out[name] = m.version(name)\n"
        "    except m.PackageNotFoundError: out[name] = None\n"
        "print(json.dumps(out))\n"
    )
    found = json.loads(
        subprocess.run([str(python), "-c", probe, *LANGGRAPH_PINS], capture_output=True, text=True, check=True).stdout
    )
    missing = [
        f"{name}=={pin}" if pin else name
        for name, pin in LANGGRAPH_PINS.items()
        if found.get(name) is None or (pin is not None and found[name] != pin)
    ]
    if missing:
        print(f"installing into {LG_VENV}: {' '.join(missing)}", flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *missing], check=True)
    return python


def _run(python: str, script: str, variant: str, n: int, k: int, latency: float, env: dict[str, str]) -> Any:
    with tempfile.TemporaryDirectory(prefix="qitos-concurrency-") as tmp:
        path = str(Path(tmp) / "bench.db")
        out = subprocess.run(
            [python, "-c", script, variant, str(n), str(k), str(latency), path],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
    if out.returncode != 0:
        raise SystemExit(f"{variant} run (N={n}) failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    """Run the table and print it with the targets."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[50, 200, 1000])
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--no-langgraph", action="store_true")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    lg_python = None if args.no_langgraph else str(ensure_langgraph_venv())
    ideal = args.k * args.latency
    print(
        f"concurrency: N runs in flight, K={args.k} model calls of L={args.latency * 1000:.0f} ms each, "
        f"{os.cpu_count()} CPUs"
    )
    print(f"load average (1/5/15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"ideal wall time K x L = {ideal:.2f} s\n")
    header = f"{'variant':<9}{'N':>6}  {'qitos s':>8}  {'LangGraph s':>11}  {'ratio':>6}  {'ideal s':>7}  "
    header += f"{'qitos RSS MB':>12}  {'LG RSS MB':>9}  {'qitos CPU ms/run':>16}  {'LG CPU ms/run':>13}"
    print(header)
    figures: list[dict[str, Any]] = []
    for variant in ("memory", "durable"):
        for n in args.n:
            ours = _run(sys.executable, QITOS_SCRIPT, variant, n, args.k, args.latency, env)
            theirs = (
                _run(lg_python, LANGGRAPH_SCRIPT, variant, n, args.k, args.latency, dict(os.environ))
                if lg_python
                else None
            )
            ratio = ours["wall"] / theirs["wall"] if theirs else None
            row = {"variant": variant, "n": n, "ideal": ideal, "qitos": ours, "langgraph": theirs, "ratio": ratio}
            figures.append(row)
            lg_wall = f"{theirs['wall']:.2f}" if theirs else "-"
            lg_rss = f"{theirs['rss_kb'] / 1024:.0f}" if theirs else "-"
            lg_cpu = f"{theirs['cpu'] / n * 1000:.2f}" if theirs else "-"
            print(
                f"{variant:<9}{n:>6}  {ours['wall']:>8.2f}  {lg_wall:>11}  {f'{ratio:.2f}x' if ratio else '-':>6}  "
                f"{ideal:>7.2f}  {ours['rss_kb'] / 1024:>12.0f}  {lg_rss:>9}  "
                f"{ours['cpu'] / n * 1000:>16.2f}  {lg_cpu:>13}",
                flush=True,
            )
    print("\nratio: qitos wall time / LangGraph wall time (lower is better); RSS: peak of the process")
    if lg_python:
        print("targets:")
        for variant, target in (("memory", TARGET_MEMORY), ("durable", TARGET_DURABLE)):
            rows = [r for r in figures if r["variant"] == variant and r["n"] == max(args.n)]
            for row in rows:
                verdict = "PASS" if row["ratio"] <= target else "FAIL"
                print(f"  {verdict}  N={row['n']} {variant}: qitos <= {target}x LangGraph   ({row['ratio']:.2f}x)")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
