"""Many runs in flight in one process: qitos' async driver vs LangGraph 1.2 ``ainvoke`` (issues 13, 28).

Run: .venv/bin/python bench/concurrency.py [--n 50 200 1000] [--k 3] [--latency 0.2] [--no-langgraph]
     [--postgres | --dsn postgresql://...]

N runs start at once on one event loop; each makes K model calls that take L seconds each (the
model awaits ``asyncio.sleep(L)``), with a no-op tool call between two model calls, so one run is
K model turns and K - 1 tool calls. The ideal wall time is K x L, whatever N.

- qitos: an ``AgentModule`` on the model path (``decide`` returns None) whose model adapter's
  ``acomplete`` awaits the sleep and answers with a native tool call (turns 1..K-1) or the final
  text (turn K); the tool is an ``async def`` no-op. In memory: ``AsyncEngine.arun`` x N. Durable:
  a composition over ``SqliteCheckpointStore`` (WAL, synchronous=NORMAL, ``durability="sync"``:
  every boundary committed before the next step), N sessions created with ``Composition.asession``
  and run with ``Session.arun``, creation included in the timed part. The sessions' writes share
  group commits (``qitos.checkpoint._groups``). With ``--postgres`` (a private cluster from
  ``scripts/postgres.sh start``, fsync on) or ``--dsn``, a third variant runs the durable sessions on
  ``PostgresCheckpointStore`` (a fresh schema), qitos only.
- LangGraph ``langgraph==1.2.24``: a 2-node ``StateGraph`` (model -> tool -> model ... -> END); the
  model node awaits the same sleep, the tool node is a no-op; ``app.ainvoke`` x N with
  ``asyncio.gather``. In memory: no checkpointer. Durable: ``AsyncSqliteSaver``
  (``langgraph-checkpoint-sqlite`` + ``aiosqlite``) on a WAL file with synchronous=NORMAL,
  ``durability="sync"``, one thread per run. It runs in ``bench/.venvs/langgraph`` (created with the
  packages it needs on first use, as ``bench/engine_overhead.py`` does).

Every (side, variant, N) runs in a fresh subprocess, so its peak RSS (``ru_maxrss``) is its own;
CPU seconds are the process's CPU time in the timed part, divided by N. Import and setup are not
timed. Targets at N = 1000 (issue 28): in memory within 1.5x of the ideal K x L; durable on SQLite
within 1.5x of qitos' own in-memory wall time, at least 4x faster than LangGraph durable, and at
most 2x the in-memory CPU per run; durable on PostgreSQL within 2x of the in-memory wall time.
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
TARGET_IDEAL = 1.5  # in memory: wall time / (K x L)
TARGET_DURABLE = 1.5  # durable SQLite wall time / qitos in memory
TARGET_FASTER = 4.0  # LangGraph durable wall time / qitos durable SQLite
TARGET_CPU = 2.0  # durable SQLite CPU per run / in memory
TARGET_POSTGRES = 2.0  # durable PostgreSQL wall time / qitos in memory

# --------------------------------------------------------------------------- qitos side (a subprocess)

QITOS_SCRIPT = r"""
import asyncio, json, resource, sys, time
from dataclasses import dataclass
from typing import Any

from qitos import AgentModule, AsyncEngine, StateSchema, ToolRegistry, compose, tool
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
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
        if variant == "postgres":  # path is a DSN naming a fresh schema
            from qitos.checkpoint._postgres_store import PostgresCheckpointStore

            dsn, _, schema = path.rpartition("#")
            store = PostgresCheckpointStore(dsn, schema=schema, max_size=4)
            await store.alist_sessions()  # the schema, before timing
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
    if variant != "memory":
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


def _cluster(dsn: str | None) -> tuple[str, str | None]:
    """A DSN to run on: the one given, or a private cluster's (with its directory, to stop it)."""
    if dsn:
        return dsn, None
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "postgres.sh"), "start"], capture_output=True, text=True, check=True
    )
    values = dict(
        line[len("export ") :].split("=", 1) for line in out.stdout.splitlines() if line.startswith("export ")
    )
    return values["QITOS_TEST_PG_DSN"].strip("'\""), values["QITOS_TEST_PG_DIR"].strip("'\"")


def _run(
    python: str, script: str, variant: str, n: int, k: int, latency: float, env: dict[str, str], dsn: str = ""
) -> Any:
    with tempfile.TemporaryDirectory(prefix="qitos-concurrency-") as tmp:
        path = f"{dsn}#bench_conc_{os.getpid()}_{n}" if variant == "postgres" else str(Path(tmp) / "bench.db")
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
    parser.add_argument("--postgres", action="store_true", help="also run durable on a private PostgreSQL cluster")
    parser.add_argument("--dsn", help="also run durable on this PostgreSQL server (a schema of its own)")
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
    dsn, cluster_dir = _cluster(args.dsn) if args.postgres or args.dsn else ("", None)
    variants = ("memory", "durable", "postgres") if dsn else ("memory", "durable")
    try:
        for variant in variants:
            for n in args.n:
                ours = _run(sys.executable, QITOS_SCRIPT, variant, n, args.k, args.latency, env, dsn)
                theirs = (
                    _run(lg_python, LANGGRAPH_SCRIPT, variant, n, args.k, args.latency, dict(os.environ))
                    if lg_python and variant != "postgres"
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
    finally:
        if cluster_dir is not None:
            subprocess.run(["bash", str(ROOT / "scripts" / "postgres.sh"), "stop", cluster_dir], check=False)
    print("\nratio: qitos wall time / LangGraph wall time (lower is better); RSS: peak of the process")
    _targets(figures, max(args.n), ideal)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


def _targets(figures: list[dict[str, Any]], n: int, ideal: float) -> None:
    """PASS/FAIL for each target at the largest N (issue 28), from the rows of this run."""
    rows = {r["variant"]: r for r in figures if r["n"] == n}
    memory, durable, postgres = rows.get("memory"), rows.get("durable"), rows.get("postgres")
    checks: list[tuple[str, float, float, bool]] = []  # (what, measured, target, lower is better)
    if memory:
        checks.append(("in memory: wall / ideal K x L", memory["qitos"]["wall"] / ideal, TARGET_IDEAL, True))
    if memory and durable:
        wall = durable["qitos"]["wall"] / memory["qitos"]["wall"]
        cpu = durable["qitos"]["cpu"] / memory["qitos"]["cpu"]
        checks.append(("durable SQLite: wall / qitos in memory", wall, TARGET_DURABLE, True))
        checks.append(("durable SQLite: CPU per run / in memory", cpu, TARGET_CPU, True))
    if durable and durable["langgraph"]:
        faster = durable["langgraph"]["wall"] / durable["qitos"]["wall"]
        checks.append(("durable SQLite: LangGraph wall / qitos", faster, TARGET_FASTER, False))
    if memory and postgres:
        wall = postgres["qitos"]["wall"] / memory["qitos"]["wall"]
        checks.append(("durable PostgreSQL: wall / qitos in memory", wall, TARGET_POSTGRES, True))
    print(f"targets (N={n}):")
    for what, measured, target, lower in checks:
        ok = measured <= target if lower else measured >= target
        bound = "<=" if lower else ">="
        print(f"  {'PASS' if ok else 'FAIL'}  {what} {bound} {target}x   ({measured:.2f}x)")


if __name__ == "__main__":
    sys.exit(main())
