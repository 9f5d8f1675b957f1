"""Cost of a durable session step, side by side with LangGraph 1.2 SqliteSaver, in one run.

    .venv/bin/python bench/session_durability.py [--n 1000] [--no-langgraph]

Workload (the same on both sides): N steps, each appending 1 KiB of new text to the state. The 1 KiB
chunks are random letters seeded by the step (unique, not trivially compressible) and are built
before timing starts.

- qitos: a session of an ``AgentModule`` whose ``decide`` hook appends the chunk to a list field
  and returns ``Decision.wait`` (no tool); ``reduce`` changes nothing. Sessions are durable on
  ``SqliteCheckpointStore`` (WAL, ``synchronous=NORMAL``), once with ``durability="sync"`` (commit
  every boundary) and once with ``durability="batched"`` (16 boundaries / 50 ms per group commit).
- LangGraph 1.2 (``langgraph==1.2.24`` + ``langgraph-checkpoint-sqlite``) in its own venv
  (``bench/.venvs/langgraph``, created and completed by this script when something is missing): a
  two-node graph ``decide -> act -> decide ...``; ``decide`` appends the chunk through an
  ``operator.add`` channel, ``act`` is a no-op that counts the step; ``SqliteSaver`` on a WAL
  connection with ``synchronous=NORMAL``, ``durability="sync"``. One step = one decide/act cycle.
- anchor: a raw SQLite WAL autocommit ``INSERT`` of 1 KiB (``synchronous=NORMAL``).

Per-step time: the time between consecutive step ends (a qitos ``on_step_end`` hook; LangGraph's
``act`` updates in ``stream_mode="updates"``); the mean is the whole run divided by N. Database size:
the main file after a ``wal_checkpoint(TRUNCATE)``. Restore: a fresh process (subprocess) times,
after its imports, opening the store and rebuilding the head's state (qitos: ``Composition.restore``
plus the head chain's materialization, ``step_journal.restore`` + ``from_dict``; LangGraph:
compiling the graph and ``get_state``); median of three processes.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import random
import shutil
import sqlite3
import statistics
import string
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.core._agent_module import AgentModule
from qitos.core._decision import Action, Decision
from qitos.core._state import StateSchema
from qitos.core._tool import ToolRegistry, tool
from qitos.engine._composition import compose
from qitos.engine._engine import Engine
from qitos.engine._hooks import EngineHook, HookContext
from qitos.sessions._payload import SnapshotPayload

HERE = Path(__file__).resolve().parent
LANGGRAPH_VENV = HERE / ".venvs" / "langgraph"
LANGGRAPH_PINS = {"langgraph": "1.2.24", "langgraph-checkpoint-sqlite": None}
KIB = 1024
MB = 1_000_000
TARGETS = {"us_per_step": 100.0, "ratio": 30.0, "drift": 1.5, "db_mb": 2.5, "restore_ms": 2.0, "floor_multiple": 2.5}


def chunks(n: int) -> list[str]:
    """N distinct 1 KiB texts (random letters and spaces, seeded by the step)."""
    letters = string.ascii_letters + " "
    return ["".join(random.Random(i).choices(letters, k=KIB)) for i in range(n)]


# --------------------------------------------------------------------------- the qitos side


@dataclass
class BenchState(StateSchema):
    """The benchmark state: the appended chunks."""

    items: list[str] = field(default_factory=list)


class BenchAgent(AgentModule[BenchState, Any, Any]):
    """Appends one precomputed 1 KiB chunk per step in ``decide``; no tool; then answers."""

    def __init__(self, data: list[str] | None = None, tool_registry: ToolRegistry | None = None) -> None:
        super().__init__(tool_registry=tool_registry)
        self.data = data or []

    def init_state(self, task: str, **kwargs: Any) -> BenchState:
        n = int(kwargs.get("n", len(self.data)))
        return BenchState(task=task, max_steps=n + 2)

    def decide(self, state: BenchState, observation: Any) -> Decision[Any]:
        step = state.current_step
        if step >= len(self.data):
            return Decision.final("done")
        state.items.append(self.data[step])
        return Decision.wait()

    def reduce(self, state: BenchState, observation: Any, decision: Decision[Any]) -> BenchState:
        return state


@dataclass
class RecordState(StateSchema):
    """The dict variant's state: one record (a dict with the chunk) per step."""

    records: list[dict[str, Any]] = field(default_factory=list)


class RecordBenchAgent(AgentModule[RecordState, Any, Any]):
    """Appends one dict per step (step number, the 1 KiB chunk, a tag list); no tool."""

    def __init__(self, data: list[str] | None = None) -> None:
        super().__init__()
        self.data = data or []

    def init_state(self, task: str, **kwargs: Any) -> RecordState:
        return RecordState(task=task, max_steps=int(kwargs.get("n", len(self.data))) + 2)

    def decide(self, state: RecordState, observation: Any) -> Decision[Any]:
        step = state.current_step
        if step >= len(self.data):
            return Decision.final("done")
        state.records.append({"step": step, "text": self.data[step], "tags": ["bench", f"s{step % 7}"]})
        return Decision.wait()

    def reduce(self, state: RecordState, observation: Any, decision: Decision[Any]) -> RecordState:
        return state


@tool
def noop() -> str:
    """Do nothing, once (the non-idempotent tool of the tool-step variant)."""
    return "ok"


@tool(idempotent=True)
def noop_idempotent() -> str:
    """Do nothing (safe to repeat: the idempotent tool-step variant)."""
    return "ok"


class ToolBenchAgent(BenchAgent):
    """The same appends, each step also calling one no-op tool (a decision made without a model)."""

    def __init__(self, data: list[str] | None = None, *, idempotent: bool = False) -> None:
        super().__init__(data, ToolRegistry([noop_idempotent if idempotent else noop]))
        self.tool_name = "noop_idempotent" if idempotent else "noop"

    def decide(self, state: BenchState, observation: Any) -> Decision[Any]:
        decision = super().decide(state, observation)
        return Decision.act([Action(self.tool_name, {})]) if decision.mode == "wait" else decision


class CountingStore(SqliteCheckpointStore):
    """The SQLite store, with the count of its write transactions (its group writer's groups)."""

    @property
    def writes(self) -> int:
        return self._groups.groups


class StepClock(EngineHook):
    """Records ``perf_counter`` at every step end."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_step_end(self, ctx: HookContext) -> None:
        self.ends.append(time.perf_counter())


def _db_size(path: Path) -> int:
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return path.stat().st_size


def _step_times(start: float, ends: list[float], n: int) -> list[float]:
    marks = [start, *ends[:n]]
    return [b - a for a, b in itertools.pairwise(marks)]


def run_qitos(n: int, data: list[str], workdir: Path, durability: str) -> dict[str, Any]:
    """Run one durable session of N steps; per-step times, size, and restore in a fresh process."""
    path = workdir / f"qitos-{durability}.db"
    clock = StepClock()
    store = CountingStore(path)
    composition = compose(agent=lambda: BenchAgent(data), store=store, durability=durability, hooks=[clock])
    session = composition.session("bench", n=n)
    before = store.writes
    cpu = time.process_time()
    start = time.perf_counter()
    result = session.run()
    total = time.perf_counter() - start
    cpu = time.process_time() - cpu
    writes = store.writes - before
    if len(result.state.items) != n or result.state.final_result != "done":
        raise SystemExit(f"qitos {durability}: the run did not finish its {n} appends: {result.task_result}")
    snapshots = len(store.list_session_snapshots(session.session_id.value))
    store.close()
    steps = _step_times(start, clock.ends, n)
    restores = [_restore_child([sys.executable, __file__, "--restore-child", str(path), session.session_id.value])]
    restores += [_restore_child(restores[0]["argv"]) for _ in range(2)]
    if any(r["items"] != n for r in restores):
        raise SystemExit(f"qitos restore rebuilt the wrong state: {restores}")
    return {
        "mean_us": total / n * 1e6,
        "cpu_us": cpu / n * 1e6,
        "first_us": statistics.fmean(steps[:100]) * 1e6,
        "last_us": statistics.fmean(steps[-100:]) * 1e6,
        "db_bytes": _db_size(path),
        "restore_ms": statistics.median(r["ms"] for r in restores),
        "chain": restores[0]["chain"],
        "runs": restores[0]["runs"],
        "commits": snapshots - 1,
        "writes_per_step": writes / n,
    }


def run_qitos_tool_steps(n: int, data: list[str], workdir: Path, *, idempotent: bool) -> dict[str, Any]:
    """A sync session of :class:`ToolBenchAgent`: what a durable step that calls a tool costs."""
    kind = "idempotent" if idempotent else "once"
    store = CountingStore(workdir / f"qitos-tool-steps-{kind}.db")
    composition = compose(agent=lambda: ToolBenchAgent(data, idempotent=idempotent), store=store)
    session = composition.session("bench", n=n)
    before = store.writes
    start = time.perf_counter()
    result = session.run()
    total = time.perf_counter() - start
    writes = store.writes - before
    store.close()
    if len(result.state.items) != n or result.state.final_result != "done":
        raise SystemExit(f"qitos tool steps did not finish their {n} appends: {result.task_result}")
    return {"mean_us": total / n * 1e6, "writes_per_step": writes / n}


def run_qitos_records(n: int, data: list[str], workdir: Path) -> dict[str, Any]:
    """A sync session appending a dict per step: the database size with structured items."""
    path = workdir / "qitos-records.db"
    store = SqliteCheckpointStore(path)
    session = compose(agent=lambda: RecordBenchAgent(data), store=store).session("bench", n=n)
    start = time.perf_counter()
    result = session.run()
    total = time.perf_counter() - start
    store.close()
    if len(result.state.records) != n or result.state.final_result != "done":
        raise SystemExit(f"qitos records did not finish their {n} appends: {result.task_result}")
    return {"mean_us": total / n * 1e6, "db_bytes": _db_size(path)}


def run_qitos_volatile(n: int, data: list[str]) -> dict[str, Any]:
    """The same agent run by ``Engine.run`` with no store (nothing durable): the engine's own share."""
    start = time.perf_counter()
    result = Engine(BenchAgent(data)).run("bench", n=n)
    total = time.perf_counter() - start
    if len(result.state.items) != n:
        raise SystemExit(f"qitos without a store did not finish its {n} appends: {result.task_result}")
    return {"mean_us": total / n * 1e6}


def _restore_child(argv: list[str]) -> dict[str, Any]:
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"restore process failed: {argv}\n{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    result["argv"] = argv
    return result


def restore_child(db: str, session_id: str) -> None:
    """In a fresh process: time opening the store and rebuilding the head's state (after imports)."""
    import qitos.engine.session_runtime  # noqa: F401 - imported lazily by Composition.restore; not timed
    from qitos.sessions._step_journal import restore

    start = time.perf_counter()
    store = SqliteCheckpointStore(db)
    session = compose(agent=BenchAgent, store=store).restore(session_id)
    head = store.get_session_head(session_id)
    assert head is not None
    restored = restore(store, session_id, head.snapshot_id)
    state = session.state_type.from_dict(restored.state_data)
    elapsed = time.perf_counter() - start
    chain = store.load_chain(head.snapshot_id)
    runs = sum(len(refs) for refs in SnapshotPayload.of(chain[0]).state_chunks.values())
    print(json.dumps({"ms": elapsed * 1e3, "items": len(state.items), "chain": len(chain), "runs": runs}))


# --------------------------------------------------------------------------- the raw SQLite anchor


def run_raw_sqlite(n: int, data: list[str], workdir: Path) -> dict[str, Any]:
    """N autocommit INSERTs of 1 KiB into a WAL table with synchronous=NORMAL."""
    path = workdir / "raw.db"
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, data TEXT)")
    start = time.perf_counter()
    for item in data[:n]:
        con.execute("INSERT INTO t (data) VALUES (?)", (item,))
    total = time.perf_counter() - start
    con.close()
    return {"mean_us": total / n * 1e6}


# --------------------------------------------------------------------------- this machine's floors

FLOOR_RESTORE_SCRIPT = r"""
import json, sqlite3, sys, time
start = time.perf_counter()
con = sqlite3.connect(sys.argv[1])
(text,) = con.execute("SELECT state FROM floor WHERE id = 1").fetchone()
items = json.loads(text)
elapsed = time.perf_counter() - start
print(json.dumps({"ms": elapsed * 1e3, "items": len(items)}))
"""


def _floor_commits(path: Path, data: list[str], *, autocheckpoint: int, pending_write: bool = False) -> float:
    """µs per plain-sqlite3 durable step commit into a new file (see :func:`run_floors`); with
    ``pending_write``, each step first writes one small keyed row in a transaction of its own (a tool
    call's start, before the call runs), so a step is two transactions."""
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    con.execute(f"PRAGMA wal_autocheckpoint={autocheckpoint}")
    con.execute("CREATE TABLE heads (session_id TEXT PRIMARY KEY, snapshot_id TEXT NOT NULL)")
    con.execute("CREATE TABLE steps (snapshot_id TEXT PRIMARY KEY, parent_id TEXT, payload TEXT NOT NULL)")
    con.execute("CREATE TABLE writes (base TEXT NOT NULL, key TEXT NOT NULL, payload TEXT, PRIMARY KEY (base, key))")
    con.execute("INSERT INTO heads VALUES ('floor', '')")
    cur = con.cursor()
    head = ""
    start = time.perf_counter()
    for item in data:
        step_id = hashlib.sha256(item.encode()).hexdigest()
        if pending_write:
            cur.execute("BEGIN IMMEDIATE")
            cur.execute("INSERT INTO writes VALUES (?, 'call', '{\"name\":\"noop\"}')", (head,))
            cur.execute("COMMIT")
        cur.execute("BEGIN IMMEDIATE")
        moved = cur.execute(
            "UPDATE heads SET snapshot_id = ? WHERE session_id = 'floor' AND snapshot_id = ?", (step_id, head)
        )
        if moved.rowcount != 1:
            raise SystemExit("floor: the head did not move")
        cur.execute("INSERT INTO steps VALUES (?, ?, ?)", (step_id, head, item))
        cur.execute("COMMIT")
        head = step_id
    elapsed = time.perf_counter() - start
    con.close()
    return elapsed / len(data) * 1e6


def run_floors(n: int, data: list[str], workdir: Path) -> dict[str, Any]:
    """What the two absolute targets cost with plain ``sqlite3`` and no framework, on this machine.

    - commit: per step, the least a durable, content-addressed step commit does in SQL: ``BEGIN
      IMMEDIATE``, a compare-and-swap ``UPDATE`` of the session's head row, an ``INSERT`` of the
      step's 1 KiB keyed by its SHA-256, ``COMMIT``; WAL with ``synchronous=NORMAL``. Measured
      twice: with SQLite's default automatic checkpoints (copying the log back into the file, which
      a long-running store must do somewhere), and with them off (the log grows without bound).
    - restore: a fresh process opens a file holding the final state as one JSON row, reads it
      and parses it (no verification, no decompression, no typed state); median of three.
    """
    commit_us = _floor_commits(workdir / "floor-checkpointed.db", data[:n], autocheckpoint=1000)
    two_us = _floor_commits(workdir / "floor-two.db", data[:n], autocheckpoint=1000, pending_write=True)
    commit_no_checkpoint_us = _floor_commits(workdir / "floor.db", data[:n], autocheckpoint=0)
    path = workdir / "floor-state.db"
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("CREATE TABLE floor (id INTEGER PRIMARY KEY, state TEXT NOT NULL)")
    con.execute("INSERT INTO floor VALUES (1, ?)", (json.dumps(data[:n]),))
    con.close()
    argv = [sys.executable, "-c", FLOOR_RESTORE_SCRIPT, str(path)]
    restores = [_restore_child(argv) for _ in range(3)]
    if any(r["items"] != n for r in restores):
        raise SystemExit(f"floor restore read the wrong state: {restores}")
    return {
        "commit_us": commit_us,
        "two_commits_us": two_us,
        "commit_no_checkpoint_us": commit_no_checkpoint_us,
        "restore_ms": statistics.median(r["ms"] for r in restores),
    }


# --------------------------------------------------------------------------- the LangGraph side

LANGGRAPH_SCRIPT = r"""
import json, operator, random, sqlite3, statistics, string, sys, time
from typing import Annotated, TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

mode, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
imported = time.perf_counter()


class State(TypedDict):
    items: Annotated[list[str], operator.add]
    step: int


def build(data):
    def decide(state):
        return {"items": [data[state["step"]]]}

    def act(state):
        return {"step": state["step"] + 1}

    graph = StateGraph(State)
    graph.add_node("decide", decide)
    graph.add_node("act", act)
    graph.add_edge(START, "decide")
    graph.add_edge("decide", "act")
    graph.add_conditional_edges("act", lambda s: END if s["step"] >= n else "decide")
    con = sqlite3.connect(path, check_same_thread=False)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    return graph.compile(checkpointer=SqliteSaver(con)), con


config = {"configurable": {"thread_id": "bench"}, "recursion_limit": 2 * n + 10}
if mode == "run":
    letters = string.ascii_letters + " "
    data = ["".join(random.Random(i).choices(letters, k=1024)) for i in range(n)]
    app, con = build(data)
    ends = []
    cpu = time.process_time()
    start = time.perf_counter()
    for update in app.stream({"items": [], "step": 0}, config, stream_mode="updates", durability="sync"):
        if "act" in update:
            ends.append(time.perf_counter())
    total = time.perf_counter() - start
    cpu = time.process_time() - cpu
    state = app.get_state(config).values
    assert len(state["items"]) == n and state["step"] == n, (len(state["items"]), state["step"])
    marks = [start, *ends]
    steps = [b - a for a, b in zip(marks, marks[1:])]
    con.close()
    print(json.dumps({
        "mean_us": total / n * 1e6,
        "cpu_us": cpu / n * 1e6,
        "first_us": statistics.fmean(steps[:100]) * 1e6,
        "last_us": statistics.fmean(steps[-100:]) * 1e6,
    }))
else:
    start = time.perf_counter()
    app, con = build([])
    state = app.get_state(config).values
    elapsed = time.perf_counter() - start
    print(json.dumps({"ms": elapsed * 1e3, "items": len(state["items"])}))
"""


def ensure_langgraph_venv() -> Path:
    """bench/.venvs/langgraph with the pinned LangGraph and the SQLite saver; installs what is missing."""
    python = LANGGRAPH_VENV / "bin" / "python"
    if not python.exists():
        base = shutil.which("python3") or sys.executable
        print(f"creating {LANGGRAPH_VENV} ...", flush=True)
        subprocess.run([base, "-m", "venv", str(LANGGRAPH_VENV)], check=True)
    probe = (
        "import importlib.metadata as m, json\n"
        "out = {}\n"
        "for name in ('langgraph', 'langgraph-checkpoint-sqlite'):\n"
        "    try: out[name] = m.version(name)\n"
        "    except m.PackageNotFoundError: out[name] = None\n"
        "print(json.dumps(out))\n"
    )
    found = json.loads(subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True).stdout)
    missing = [
        f"{name}=={pin}" if pin else name
        for name, pin in LANGGRAPH_PINS.items()
        if found.get(name) is None or (pin is not None and found[name] != pin)
    ]
    if missing:
        print(f"installing into {LANGGRAPH_VENV}: {' '.join(missing)}", flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *missing], check=True)
    return python


def run_langgraph(n: int, workdir: Path) -> dict[str, Any]:
    """The LangGraph side, in its own venv; returns the same figures as :func:`run_qitos`."""
    python = str(ensure_langgraph_venv())
    path = workdir / "langgraph.db"
    out = subprocess.run(
        [python, "-c", LANGGRAPH_SCRIPT, "run", str(path), str(n)], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"the LangGraph run failed:\n{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    argv = [python, "-c", LANGGRAPH_SCRIPT, "restore", str(path), str(n)]
    restores = [_restore_child(argv) for _ in range(3)]
    if any(r["items"] != n for r in restores):
        raise SystemExit(f"LangGraph restore rebuilt the wrong state: {restores}")
    result["restore_ms"] = statistics.median(r["ms"] for r in restores)
    result["db_bytes"] = _db_size(path)
    return result


# --------------------------------------------------------------------------- report


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def report(
    n: int,
    sync: dict[str, Any],
    batched: dict[str, Any],
    raw: dict[str, Any],
    floors: dict[str, Any],
    lg: dict[str, Any] | None,
) -> None:
    """Print the table, the ratios and the targets."""
    cols = [("qitos sync", sync), ("qitos batched", batched)] + ([("LangGraph sync", lg)] if lg else [])
    rows = [
        ("µs per step (mean)", "mean_us", "{:,.0f}"),
        ("CPU µs per step (mean)", "cpu_us", "{:,.0f}"),
        ("µs per step, first 100", "first_us", "{:,.0f}"),
        ("µs per step, last 100", "last_us", "{:,.0f}"),
        ("database size (MB)", "db_bytes", "{:,.2f}"),
        ("restore in a fresh process (ms)", "restore_ms", "{:,.2f}"),
    ]
    print(f"\nDurable session steps: N={n}, 1 KiB appended per step, SQLite WAL synchronous=NORMAL\n")
    print(f"{'':34}" + "".join(f"{name:>16}" for name, _ in cols))
    for label, key, fmt in rows:
        cells = []
        for _, figures in cols:
            value = figures[key] / MB if key == "db_bytes" else figures[key]
            cells.append(f"{fmt.format(value):>16}")
        print(f"{label:34}" + "".join(cells))
    print(f"{'last 100 / first 100':34}" + "".join(f"{f['last_us'] / f['first_us']:>16.2f}" for _, f in cols))
    print(f"{'snapshots committed':34}{sync['commits']:>16}{batched['commits']:>16}")
    print(f"{'snapshots read to restore the head':34}{sync['chain']:>16}{batched['chain']:>16}")
    print(f"{'state runs read to restore the head':34}{sync['runs']:>16}{batched['runs']:>16}")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nmachine: raw SQLite WAL autocommit INSERT of 1 KiB {raw['mean_us']:.1f} µs; load average {load}")
    print("\nwhere a qitos sync step's time goes")
    print(f"  the same agent with no store (Engine.run, nothing durable)  {sync['no_store_us']:>8,.0f} µs")
    durability_us = sync["mean_us"] - sync["no_store_us"]
    print(f"  durability: the boundary's snapshot and its commit          {durability_us:>8,.0f} µs")
    once, again = sync["tool_once"], sync["tool_idempotent"]
    print(
        f"  a sync step that also calls one no-op tool (not idempotent) {once['mean_us']:>8,.0f} µs"
        "   (+ the call's start, durable before it runs)"
    )
    print(f"  a sync step that also calls one idempotent no-op tool       {again['mean_us']:>8,.0f} µs")
    print("\nwrite transactions per step (crash-safety minimum in brackets)")
    print(f"  no tool                              {sync['writes_per_step']:>5.2f}  [1]")
    print(f"  one idempotent tool call             {again['writes_per_step']:>5.2f}  [1]")
    print(f"  one non-idempotent tool call         {once['writes_per_step']:>5.2f}  [2]")
    print(f"  batched, no tool                     {batched['writes_per_step']:>5.2f}  [1/16]")
    state_mb = n * KIB / MB
    print("\nthis machine's floors (plain sqlite3, no framework; see run_floors)")
    print(
        f"  durable step commit in SQL (CAS head + 1 KiB row)   {floors['commit_us']:>8,.0f} µs"
        f"   qitos sync is {sync['mean_us'] / floors['commit_us']:.1f}x it"
    )
    print(f"    the same with checkpoints off (unbounded log)        {floors['commit_no_checkpoint_us']:>8,.0f} µs")
    print(
        f"  two transactions (a call's start, then the commit)    {floors['two_commits_us']:>8,.0f} µs"
        f"   qitos non-idempotent tool step is {once['mean_us'] / floors['two_commits_us']:.1f}x it"
    )
    print(
        f"  dict items: database after {n} steps of a 1 KiB record   {sync['records']['db_bytes'] / MB:>8,.2f} MB"
        f"   ({sync['records']['mean_us']:,.0f} µs per step)"
    )
    print(
        f"  fresh-process read + parse of the state ({state_mb:.1f} MB)  {floors['restore_ms']:>8,.2f} ms"
        f"   qitos restore is {sync['restore_ms'] / floors['restore_ms']:.1f}x it"
    )
    if lg:
        print("\nratios (LangGraph / qitos)")
        pairs = (("µs per step", "mean_us"), ("CPU per step", "cpu_us"), ("database size", "db_bytes"))
        for label, key in (*pairs, ("restore", "restore_ms")):
            print(f"  {label:16} sync {lg[key] / sync[key]:>10,.1f}x   batched {lg[key] / batched[key]:>10,.1f}x")
    print("\ntargets (qitos sync)")
    checks = [
        (f"<= {TARGETS['us_per_step']:.0f} µs per durable step", sync["mean_us"] <= TARGETS["us_per_step"]),
        (
            f">= {TARGETS['ratio']:.0f}x less than LangGraph per step",
            None if lg is None else lg["mean_us"] / sync["mean_us"] >= TARGETS["ratio"],
        ),
        (f"last 100 within {TARGETS['drift']}x of first 100", sync["last_us"] <= TARGETS["drift"] * sync["first_us"]),
        (f"database <= {TARGETS['db_mb']} MB after {n} steps", sync["db_bytes"] <= TARGETS["db_mb"] * MB),
        (
            f"database <= {TARGETS['db_mb']} MB after {n} steps of a dict item",
            sync["records"]["db_bytes"] <= TARGETS["db_mb"] * MB,
        ),
        (
            "write transactions at the crash-safety minimum (1 / 1 / 2)",
            # a run's own transactions (creating it, taking and releasing its lease, the end) are
            # spread over its steps: allow 8 per run
            sync["writes_per_step"] <= 1 + 8 / n
            and again["writes_per_step"] <= 1 + 8 / n
            and once["writes_per_step"] <= 2 + 8 / n,
        ),
        (
            f"sync step within {TARGETS['floor_multiple']}x of its SQL floor (1 and 2 transactions)",
            sync["mean_us"] <= TARGETS["floor_multiple"] * floors["commit_us"]
            and once["mean_us"] <= TARGETS["floor_multiple"] * floors["two_commits_us"],
        ),
        (f"restore <= {TARGETS['restore_ms']:.0f} ms after import", sync["restore_ms"] <= TARGETS["restore_ms"]),
    ]
    below_floor = {
        0: floors["commit_us"] > TARGETS["us_per_step"],
        4: floors["restore_ms"] > TARGETS["restore_ms"],
    }
    for index, (label, ok) in enumerate(checks):
        note = "  (under this machine's plain-sqlite3 floor above)" if not ok and below_floor.get(index) else ""
        print(f"  {'n/a ' if ok is None else _verdict(ok)}  {label}{note}")


def main() -> None:
    """Run both sides and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="steps per run (default 1000)")
    parser.add_argument("--no-langgraph", action="store_true", help="skip the LangGraph side")
    parser.add_argument("--restore-child", nargs=2, metavar=("DB", "SESSION"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.restore_child:
        restore_child(*args.restore_child)
        return
    if args.n < 200:
        parser.error("--n must be at least 200 (first and last 100 steps are compared)")
    data = chunks(args.n)
    with tempfile.TemporaryDirectory(prefix="qitos-durability-") as tmp:
        workdir = Path(tmp)
        raw = run_raw_sqlite(args.n, data, workdir)
        floors = run_floors(args.n, data, workdir)
        sync = run_qitos(args.n, data, workdir, "sync")
        sync["no_store_us"] = run_qitos_volatile(args.n, data)["mean_us"]
        sync["tool_once"] = run_qitos_tool_steps(args.n, data, workdir, idempotent=False)
        sync["tool_idempotent"] = run_qitos_tool_steps(args.n, data, workdir, idempotent=True)
        sync["records"] = run_qitos_records(args.n, data, workdir)
        batched = run_qitos(args.n, data, workdir, "batched")
        lg = None if args.no_langgraph else run_langgraph(args.n, workdir)
        report(args.n, sync, batched, raw, floors, lg)


if __name__ == "__main__":
    main()
