"""Cost of a durable session step on PostgreSQL, side by side with LangGraph 1.2 PostgresSaver, in one run.

    .venv/bin/python bench/postgres_durability.py [--n 1000] [--no-langgraph] [--dsn postgresql://...]

Workload (the same on every side): N steps, each appending 1 KiB of new text to the state (the
random-letter chunks of ``session_durability.py``, built before timing starts).

- qitos: a session of ``session_durability.BenchAgent`` (``decide`` appends the chunk and returns
  ``Decision.wait``) on ``PostgresCheckpointStore``, ``durability="sync"`` (a commit per boundary).
- LangGraph 1.2 (``langgraph==1.2.24`` + ``langgraph-checkpoint-postgres``) in its own venv
  (``bench/.venvs/langgraph``, completed by this script when something is missing): the two-node
  graph ``decide -> act`` of ``session_durability.py`` on ``PostgresSaver``, ``durability="sync"``.
- the floor: this machine's plain one-statement commit with psycopg, the same shape as qitos' head
  commit (a CTE: compare-and-swap ``UPDATE`` of a head row + ``INSERT`` of the step's 1 KiB keyed by
  its SHA-256), prepared, autocommit, one round trip. It runs *interleaved* with the qitos run: one
  floor commit (on its own connection and database) at every qitos step end, timed apart and
  subtracted from qitos' time, so both see the same load on this shared machine.

Without ``--dsn`` the script starts a private cluster (``scripts/postgres.sh start``: unix socket,
fsync and synchronous_commit on, as a default installation, plus ``pg_stat_statements``) and stops it
at the end; each side gets a database of its own. Statements per step are counted by the server
(``pg_stat_statements``: every statement a side sent, BEGIN/COMMIT included). Table sizes include
indexes and TOAST, sampled at N/4, N/2 and N steps. Means and medians are both printed: on a
loaded machine the median is the steadier figure.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from session_durability import BenchAgent, StepClock, chunks

from qitos.checkpoint._postgres_store import PostgresCheckpointStore
from qitos.engine._composition import compose
from qitos.engine._hooks import EngineHook, HookContext

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LANGGRAPH_VENV = HERE / ".venvs" / "langgraph"
LANGGRAPH_PINS = {"langgraph": "1.2.24", "langgraph-checkpoint-postgres": None, "psycopg[binary]": None}
MB = 1_000_000
TARGETS = {"ratio": 5.0, "floor_multiple": 2.0}


# --------------------------------------------------------------------------- the server


class Cluster:
    """A private cluster from scripts/postgres.sh, or the server a DSN names; one database per side."""

    def __init__(self, dsn: str | None) -> None:
        self._dir: str | None = None
        if dsn is None:
            env = {**os.environ, "QITOS_PG_SERVER_OPTIONS": "-c shared_preload_libraries=pg_stat_statements"}
            started = subprocess.run(
                ["bash", str(ROOT / "scripts" / "postgres.sh"), "start"],
                capture_output=True,
                text=True,
                check=False,
                env=env,
            )
            if started.returncode != 0:
                raise SystemExit(f"could not start PostgreSQL:\n{started.stderr}")
            values = dict(
                line[len("export ") :].split("=", 1)
                for line in started.stdout.splitlines()
                if line.startswith("export ")
            )
            self._dir = shlex.split(values["QITOS_TEST_PG_DIR"])[0]
            dsn = shlex.split(values["QITOS_TEST_PG_DSN"])[0]
        self.dsn = dsn
        self.counts_statements = False
        with psycopg.connect(dsn, autocommit=True) as conn:
            try:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                conn.execute("SELECT pg_stat_statements_reset()")
                self.counts_statements = True
            except psycopg.Error:  # not preloaded on a server given with --dsn
                pass

    def statements(self, database: str) -> int | None:
        """Statements the server has run in ``database`` (None: pg_stat_statements is not loaded)."""
        if not self.counts_statements:
            return None
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT COALESCE(sum(s.calls), 0) FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
                "WHERE d.datname = %s",
                (database,),
            ).fetchone()
        return int(row[0])

    def database(self, name: str) -> str:
        """A fresh database ``name`` (dropped first if it exists); its DSN."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return psycopg.conninfo.make_conninfo(self.dsn, dbname=name)

    def settings(self) -> dict[str, str]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('fsync', 'synchronous_commit', 'server_version', 'wal_sync_method', 'shared_buffers')"
            ).fetchall()
        return {name: setting for name, setting in rows}

    def close(self) -> None:
        if self._dir is not None:
            subprocess.run(["bash", str(ROOT / "scripts" / "postgres.sh"), "stop", self._dir], check=False)


def table_bytes(dsn: str, schemas: tuple[str, ...]) -> int:
    """Total size (with indexes and TOAST) of the tables in ``schemas``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT COALESCE(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = ANY(%s) AND c.relkind = 'r'",
            (list(schemas),),
        ).fetchone()
    return int(row[0])


def _marks(n: int) -> list[int]:
    return [n // 4, n // 2, n]


# --------------------------------------------------------------------------- the qitos side


class SizeSampler(EngineHook):
    """Table sizes at the marked step ends (a separate connection; its time is taken out of qitos')."""

    def __init__(self, dsn: str, schema: str, marks: list[int]) -> None:
        self.dsn, self.schema, self.marks = dsn, schema, set(marks)
        self.sizes: dict[int, int] = {}
        self.spent = 0.0
        self.step = 0

    def on_step_end(self, ctx: HookContext) -> None:
        self.step += 1
        if self.step in self.marks:
            start = time.perf_counter()
            self.sizes[self.step] = table_bytes(self.dsn, (self.schema,))
            self.spent += time.perf_counter() - start


FLOOR_STEP = (
    "WITH moved AS (UPDATE floor_heads SET head = %(new)s WHERE id = 1 AND head = %(old)s RETURNING 1) "
    "INSERT INTO floor_steps (digest, data) SELECT %(new)s, %(data)s FROM moved"
)


class Floor(EngineHook):
    """This machine's one-statement commit floor, one commit at every qitos step end.

    A compare-and-swap of a head row and a 1 KiB row keyed by its SHA-256 in one prepared autocommit
    statement on a connection (and database) of its own; its time is taken out of qitos'.
    """

    def __init__(self, dsn: str, data: list[str]) -> None:
        self.rows = [(hashlib.sha256(chunk.encode()).hexdigest(), chunk.encode()) for chunk in data]
        self.conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=0)
        self.conn.execute("CREATE TABLE floor_heads (id int PRIMARY KEY, head text NOT NULL)")
        self.conn.execute("CREATE TABLE floor_steps (digest text PRIMARY KEY, data bytea NOT NULL)")
        self.conn.execute("INSERT INTO floor_heads VALUES (1, '')")
        self.dsn = dsn
        self.old = ""
        self.times: list[float] = []

    def on_step_end(self, ctx: HookContext) -> None:
        if len(self.times) >= len(self.rows):
            return
        digest, raw = self.rows[len(self.times)]
        start = time.perf_counter()
        if self.conn.execute(FLOOR_STEP, {"new": digest, "old": self.old, "data": raw}).rowcount != 1:
            raise SystemExit("floor: the compare-and-swap failed")
        self.times.append(time.perf_counter() - start)
        self.old = digest

    def close(self) -> dict[str, Any]:
        self.conn.close()
        return {
            "mean_us": statistics.fmean(self.times) * 1e6,
            "median_us": statistics.median(self.times) * 1e6,
            "bytes": table_bytes(self.dsn, ("public",)),
        }


def run_qitos(cluster: Cluster, n: int, data: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The qitos session with the floor interleaved; (qitos figures, floor figures)."""
    dsn = cluster.database("qitos_bench")
    floor = Floor(cluster.database("floor_bench"), data)
    store = PostgresCheckpointStore(dsn, schema="qitos")
    store.list_sessions()  # connect and migrate before timing
    clock = StepClock()
    sampler = SizeSampler(dsn, "qitos", _marks(n))
    hooks = [clock, floor, sampler]  # the clock first: a step's time ends before the floor's commit
    composition = compose(agent=lambda: BenchAgent(data), store=store, durability="sync", hooks=hooks)
    session = composition.session("bench", n=n)
    statements_before = cluster.statements("qitos_bench")
    cpu = time.process_time()
    start = time.perf_counter()
    result = session.run()
    total = time.perf_counter() - start
    cpu = time.process_time() - cpu
    statements_after = cluster.statements("qitos_bench")
    if len(result.state.items) != n or result.state.final_result != "done":
        raise SystemExit(f"qitos: the run did not finish its {n} appends: {result.task_result}")
    restore_start = time.perf_counter()
    restored = composition.restore(session.session_id.value).inspect()
    restore_ms = (time.perf_counter() - restore_start) * 1e3
    if restored.snapshot_integrity != "verified":
        raise SystemExit(f"qitos: the session does not restore verified: {restored.snapshot_integrity}")
    store.close()
    floor_figures = floor.close()
    # A step's time runs from the previous step's end (after that step's floor commit) to its own end.
    marks = [start, *clock.ends[:n]]
    steps = [b - a - (floor.times[i - 1] if i else 0.0) for i, (a, b) in enumerate(itertools.pairwise(marks))]
    hooked = sum(floor.times) + sampler.spent
    return {
        "mean_us": (total - hooked) / n * 1e6,
        "median_us": statistics.median(steps) * 1e6,
        "cpu_us": cpu / n * 1e6,
        "first_us": statistics.fmean(steps[:100]) * 1e6,
        "last_us": statistics.fmean(steps[-100:]) * 1e6,
        "sizes": sampler.sizes,
        "statements_per_step": _per_step(statements_before, statements_after, n),
        "inspect_ms": restore_ms,
    }, floor_figures


def _per_step(before: int | None, after: int | None, n: int) -> float | None:
    return None if before is None or after is None else (after - before) / n


# --------------------------------------------------------------------------- the LangGraph side

LANGGRAPH_SCRIPT = r"""
import json, operator, random, statistics, string, sys, time
from typing import Annotated, TypedDict

import psycopg
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph

dsn, n = sys.argv[1], int(sys.argv[2])
marks = {n // 4, n // 2, n}


class State(TypedDict):
    items: Annotated[list[str], operator.add]
    step: int


def sizes():
    with psycopg.connect(dsn, autocommit=True) as conn:
        return int(conn.execute(
            "SELECT COALESCE(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind = 'r'"
        ).fetchone()[0])


letters = string.ascii_letters + " "
data = ["".join(random.Random(i).choices(letters, k=1024)) for i in range(n)]


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
config = {"configurable": {"thread_id": "bench"}, "recursion_limit": 2 * n + 10}
with PostgresSaver.from_conn_string(dsn) as saver:
    saver.setup()
    app = graph.compile(checkpointer=saver)
    ends, sampled, spent = [], {}, 0.0
    cpu = time.process_time()
    start = time.perf_counter()
    for update in app.stream({"items": [], "step": 0}, config, stream_mode="updates", durability="sync"):
        if "act" in update:
            ends.append(time.perf_counter())
            if len(ends) in marks:
                t = time.perf_counter()
                sampled[len(ends)] = sizes()
                spent += time.perf_counter() - t
    total = time.perf_counter() - start - spent
    cpu = time.process_time() - cpu
    t = time.perf_counter()
    state = app.get_state(config).values
    restore_ms = (time.perf_counter() - t) * 1e3
    assert len(state["items"]) == n and state["step"] == n, (len(state["items"]), state["step"])
marks_ = [start, *ends]
steps = [b - a for a, b in zip(marks_, marks_[1:])]
print(json.dumps({
    "mean_us": total / n * 1e6,
    "median_us": statistics.median(steps) * 1e6,
    "cpu_us": cpu / n * 1e6,
    "first_us": statistics.fmean(steps[:100]) * 1e6,
    "last_us": statistics.fmean(steps[-100:]) * 1e6,
    "sizes": sampled,
    "inspect_ms": restore_ms,
}))
"""


def ensure_langgraph_venv() -> Path:
    """bench/.venvs/langgraph with the pinned LangGraph and its PostgreSQL saver; installs what is missing."""
    python = LANGGRAPH_VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {LANGGRAPH_VENV} ...", flush=True)
        subprocess.run(["python3", "-m", "venv", str(LANGGRAPH_VENV)], check=True)
    probe = (
        "import importlib.metadata as m, json\n"
        "out = {}\n"
        f"for name in {[name.split('[')[0] for name in LANGGRAPH_PINS]!r}:\n"
        "    try: out[name] = m.version(name)\n"
        "    except m.PackageNotFoundError: out[name] = None\n"
        "print(json.dumps(out))\n"
    )
    found = json.loads(subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True).stdout)
    missing = [
        f"{name}=={pin}" if pin else name
        for name, pin in LANGGRAPH_PINS.items()
        if found.get(name.split("[")[0]) is None or (pin is not None and found[name.split("[")[0]] != pin)
    ]
    if missing:
        print(f"installing into {LANGGRAPH_VENV}: {' '.join(missing)}", flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *missing], check=True)
    return python


def run_langgraph(cluster: Cluster, n: int) -> dict[str, Any]:
    python = str(ensure_langgraph_venv())
    dsn = cluster.database("langgraph_bench")
    statements_before = cluster.statements("langgraph_bench")
    out = subprocess.run([python, "-c", LANGGRAPH_SCRIPT, dsn, str(n)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"the LangGraph run failed:\n{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    result["sizes"] = {int(step): size for step, size in result["sizes"].items()}
    result["statements_per_step"] = _per_step(statements_before, cluster.statements("langgraph_bench"), n)
    return result


# --------------------------------------------------------------------------- report


def report(n: int, qitos: dict[str, Any], floor: dict[str, Any], lg: dict[str, Any] | None, cluster: Cluster) -> None:
    settings = cluster.settings()
    cols = [("qitos sync", qitos)] + ([("LangGraph sync", lg)] if lg else [])
    print(
        f"\nDurable session steps on PostgreSQL {settings.get('server_version')}: N={n}, 1 KiB appended per step;"
        f" fsync={settings.get('fsync')}, synchronous_commit={settings.get('synchronous_commit')},"
        f" unix socket\n"
    )
    print(f"{'':36}" + "".join(f"{name:>16}" for name, _ in cols))
    rows = [
        ("µs per step (mean)", lambda f: f"{f['mean_us']:,.0f}"),
        ("µs per step (median)", lambda f: f"{f['median_us']:,.0f}"),
        ("CPU µs per step (client, mean)", lambda f: f"{f['cpu_us']:,.0f}"),
        ("µs per step, first 100", lambda f: f"{f['first_us']:,.0f}"),
        ("µs per step, last 100", lambda f: f"{f['last_us']:,.0f}"),
        ("last 100 / first 100", lambda f: f"{f['last_us'] / f['first_us']:.2f}"),
        ("statements per step (server count)", lambda f: _maybe(f["statements_per_step"])),
        *[
            (f"tables after {mark} steps (MB)", lambda f, mark=mark: f"{f['sizes'].get(mark, 0) / MB:,.2f}")
            for mark in _marks(n)
        ],
        ("table KB per step (last half)", lambda f: f"{_growth(f['sizes'], n) / 1000:,.2f}"),
        ("read the head back (ms)", lambda f: f"{f['inspect_ms']:,.1f}"),
    ]
    for label, cell in rows:
        print(f"{label:36}" + "".join(f"{cell(figures):>16}" for _, figures in cols))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print("\nthis machine's floor: one prepared autocommit statement (CAS head + 1 KiB row), interleaved")
    print(
        f"  mean {floor['mean_us']:,.0f} µs (qitos sync {qitos['mean_us'] / floor['mean_us']:.2f}x it),"
        f" median {floor['median_us']:,.0f} µs (qitos {qitos['median_us'] / floor['median_us']:.2f}x);"
        f" its tables after {n} steps {floor['bytes'] / MB:,.2f} MB; load average {load}"
    )
    if lg:
        print("\nratios (LangGraph / qitos)")
        medians = lg["median_us"] / qitos["median_us"]
        print(f"  µs per step     {lg['mean_us'] / qitos['mean_us']:>8,.1f}x   (medians {medians:,.1f}x)")
        print(f"  CPU per step    {lg['cpu_us'] / qitos['cpu_us']:>8,.1f}x")
        print(f"  tables after {n}  {lg['sizes'][n] / qitos['sizes'][n]:>8,.1f}x")
    print("\ntargets (qitos sync)")
    ratio_ok = None if lg is None else lg["mean_us"] / qitos["mean_us"] >= TARGETS["ratio"]
    floor_ok = qitos["mean_us"] <= TARGETS["floor_multiple"] * floor["mean_us"]
    checks = [
        (f">= {TARGETS['ratio']:.0f}x less than LangGraph per step (means)", ratio_ok),
        (f"within {TARGETS['floor_multiple']:.0f}x of the one-statement floor (means)", floor_ok),
        ("tables grow linearly (last half within 1.5x of the first quarter per step)", _linear(qitos["sizes"], n)),
    ]
    for label, ok in checks:
        print(f"  {'n/a ' if ok is None else ('PASS' if ok else 'FAIL')}  {label}")


def _maybe(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _growth(sizes: dict[int, int], n: int) -> float:
    """Bytes per step over the last half of the run."""
    return (sizes[n] - sizes[n // 2]) / (n - n // 2)


def _linear(sizes: dict[int, int], n: int) -> bool:
    quarter = sizes[n // 4] / (n // 4)
    return _growth(sizes, n) <= 1.5 * quarter


def main() -> None:
    """Run every side and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="steps per run (default 1000)")
    parser.add_argument("--no-langgraph", action="store_true", help="skip the LangGraph side")
    parser.add_argument("--dsn", help="an existing server to use (default: start a private cluster)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of each side (default 3)")
    args = parser.parse_args()
    if args.n < 200:
        parser.error("--n must be at least 200 (first and last 100 steps are compared)")
    data = chunks(args.n)
    cluster = Cluster(args.dsn)
    try:
        rounds: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]] = []
        for _ in range(max(1, args.rounds)):  # the sides alternate, so a change of load hits both
            qitos, floor = run_qitos(cluster, args.n, data)
            rounds.append((qitos, floor, None if args.no_langgraph else run_langgraph(cluster, args.n)))
        qitos, floor = _median_round([(q, f) for q, f, _ in rounds])
        lgs = [lg for _, _, lg in rounds if lg is not None]
        lg = _median_round([(lg, lg) for lg in lgs])[0] if lgs else None
        print(f"\nrounds (mean µs per step): qitos {[round(q['mean_us']) for q, _, _ in rounds]},"
              f" floor {[round(f['mean_us']) for _, f, _ in rounds]},"
              f" LangGraph {[round(x['mean_us']) for x in lgs]}; each side's median round is reported")  # fmt: skip
        report(args.n, qitos, floor, lg, cluster)
    finally:
        cluster.close()


def _median_round(rounds: list[tuple[dict[str, Any], dict[str, Any]]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The round whose first figures' mean is the median (with its companion figures)."""
    ordered = sorted(rounds, key=lambda pair: pair[0]["mean_us"])
    return ordered[len(ordered) // 2]


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
