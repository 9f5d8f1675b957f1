"""The fleet benchmark's floors: what any design on DBOS + PostgreSQL pays on this machine, with no agent.

Each floor runs 2 ``fleet_floor_worker.py`` processes (the project venv's python, ``--concurrency``
8 each, DBOS configured as qitos' workers configure it) on a database of its own in the bench's
cluster, and enqueues ``sessions`` workflows from the bench process with ``DBOSClient.enqueue``
exactly as ``qitos.distributed.Fleet`` does (queue name, workflow name and id in the options, one
``str`` argument). The wall time runs from the first enqueue to every workflow being ``SUCCESS`` in
DBOS's ``workflow_status`` table (polled every 10 ms, as the qitos run polls its sessions):

- ``empty``: the workflow returns at once: DBOS's enqueue, dispatch and completion alone;
- ``steps``: the bench process creates each session's head row (one autocommit ``INSERT``) before
  enqueueing it, and the workflow does what a ten-step session with one non-idempotent call per
  step minimally writes: per step an intent row (~100 bytes) and a compare-and-swap of the head with
  a snapshot row (~300 bytes) in one statement, 20 prepared autocommit statements per session.

Afterwards every row is checked (10 intents and 10 snapshots per session, every head moved).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from fleet_floor_worker import APP_NAME, DBOS_SCHEMA, EMPTY_WORKFLOW, QUEUE, STEPS, STEPS_WORKFLOW, dbos_url
from fleet_procs import stop_workers

__all__ = ["FLOOR_KINDS", "FloorRun", "cpu_seconds", "run_floor"]

HERE = Path(__file__).resolve().parent
WORKER = HERE / "fleet_floor_worker.py"
FLOOR_KINDS = ("empty", "steps")
_WORKFLOWS = {"empty": EMPTY_WORKFLOW, "steps": STEPS_WORKFLOW}
_TABLES = (
    "CREATE TABLE floor_heads (session text PRIMARY KEY, head text NOT NULL)",
    "CREATE TABLE floor_intents (session text NOT NULL, step int NOT NULL, data bytea NOT NULL,"
    " PRIMARY KEY (session, step))",
    "CREATE TABLE floor_snapshots (digest text PRIMARY KEY, session text NOT NULL, data bytea NOT NULL)",
)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class FloorRun:
    """One floor run: ``sessions`` workflows over the workers in ``wall`` seconds, and the CPU spent."""

    kind: str
    sessions: int
    wall: float
    worker_cpu: float
    submit_cpu: float

    @property
    def rate(self) -> float:
        """Sessions (workflows) per second over the wall time."""
        return self.sessions / self.wall

    @property
    def worker_cpu_ms(self) -> float:
        """The worker processes' CPU time during the run per session, in ms."""
        return self.worker_cpu / self.sessions * 1000

    @property
    def submit_cpu_ms(self) -> float:
        """The enqueuing (bench) process's CPU time during the run per session, in ms."""
        return self.submit_cpu / self.sessions * 1000


def _database(dsn: str, name: str) -> str:
    """A fresh database ``name`` in ``dsn``'s cluster, with the floor's tables; its URL."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(dsn)
    url = urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))
    with psycopg.connect(url, autocommit=True) as conn:
        for table in _TABLES:
            conn.execute(table)
    return url


def _start(url: str, kind: str, concurrency: int, err_path: Path) -> subprocess.Popen[str]:
    with err_path.open("w", encoding="utf-8") as err:
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), url, kind, str(concurrency)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if '"ready": true' not in line:
        proc.kill()
        proc.wait(timeout=10)
        raise SystemExit(f"floor worker did not start ({line!r}): {err_path.read_text(encoding='utf-8')[-2000:]}")
    return proc


def _finished(conn: psycopg.Connection[Any], workflow: str) -> tuple[int, int]:
    """How many of the floor's workflows are ``SUCCESS``, and how many ended otherwise (error, cancelled)."""
    row = conn.execute(
        f"SELECT count(*) FILTER (WHERE status = 'SUCCESS'),"
        f" count(*) FILTER (WHERE status NOT IN ('SUCCESS', 'PENDING', 'ENQUEUED'))"
        f' FROM "{DBOS_SCHEMA}".workflow_status WHERE name = %s',
        (workflow,),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _check_rows(conn: psycopg.Connection[Any], sessions: int) -> None:
    intents, snapshots, unmoved = conn.execute(
        "SELECT (SELECT count(*) FROM floor_intents), (SELECT count(*) FROM floor_snapshots),"
        " (SELECT count(*) FROM floor_heads WHERE head = '')"
    ).fetchone() or (0, 0, 0)
    if intents != STEPS * sessions or snapshots != STEPS * sessions or unmoved:
        raise SystemExit(f"durable-step floor: {intents} intents, {snapshots} snapshots, {unmoved} unmoved heads")


def run_floor(
    dsn: str, tmp: Path, sessions: int, *, kind: str, workers: int = 2, concurrency: int = 8, tag: int = 0
) -> FloorRun:
    """Run floor ``kind`` (``empty`` or ``steps``): ``sessions`` workflows over ``workers`` fresh processes."""
    from dbos import DBOSClient

    if kind not in _WORKFLOWS:
        raise ValueError(f"floor kind is one of {FLOOR_KINDS}, got {kind!r}")
    workflow = _WORKFLOWS[kind]
    url = _database(dsn, f"fleet_floor_{kind}")
    procs: list[subprocess.Popen[str]] = []
    client: Any = None
    try:
        # One after the other: the first one's launch creates DBOS's system tables.
        for k in range(workers):
            procs.append(_start(url, kind, concurrency, tmp / f"floor-{kind}-{k}.err"))
        client = DBOSClient(
            system_database_url=dbos_url(url), dbos_system_schema=DBOS_SCHEMA, application_name=APP_NAME
        )
        with psycopg.connect(url, autocommit=True, prepare_threshold=0) as conn:
            ids = [f"floor-{tag}-{n}" for n in range(sessions)]
            cpu = [cpu_seconds(proc.pid) for proc in procs]
            own = time.process_time()
            start = time.perf_counter()
            for session_id in ids:
                if kind == "steps":  # the session row, as a submit creates it before enqueueing the run
                    conn.execute("INSERT INTO floor_heads (session, head) VALUES (%s, '')", (session_id,))
                options: Any = {"queue_name": QUEUE, "workflow_name": workflow, "workflow_id": session_id}
                client.enqueue(options, session_id)
            deadline = time.monotonic() + 600
            while True:
                done, failed = _finished(conn, workflow)
                if failed:
                    raise SystemExit(f"floor {kind}: {failed} workflows did not succeed (see {tmp}/floor-{kind}-*.err)")
                if done == sessions:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"floor {kind}: {sessions - done} workflows unfinished after 600 s")
                time.sleep(0.01)
            wall = time.perf_counter() - start
            own = time.process_time() - own
            worker_cpu = sum(cpu_seconds(proc.pid) for proc in procs) - sum(cpu)
            if kind == "steps":
                _check_rows(conn, sessions)
    finally:
        if client is not None:
            client.destroy()
        stop_workers(procs)
    return FloorRun(kind=kind, sessions=sessions, wall=wall, worker_cpu=worker_cpu, submit_cpu=own)
