"""The fleet benchmark's anchor: LangGraph 1.2 + PostgresSaver in 2 processes, the same sessions as qitos' workers.

Each process is ``fleet_langgraph_child.py`` run by the LangGraph venv's python (``bench/.venvs/langgraph``,
made by ``postgres_durability.ensure_langgraph_venv``) on a database of its own in the bench's
cluster. LangGraph has no queue or fleet, so the sessions are split statically (session ``n`` runs in
process ``n % 2``). The wall time runs from the release of both processes (each has printed ``READY``:
imported, its pool connected, ``setup()`` done) to both having printed ``DONE``.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from postgres_durability import ensure_langgraph_venv

__all__ = ["AnchorRun", "run_langgraph"]

HERE = Path(__file__).resolve().parent
CHILD = HERE / "fleet_langgraph_child.py"
STEPS = 10


@dataclass(frozen=True)
class AnchorRun:
    """One anchor run: ``sessions`` over ``processes`` processes in ``wall`` seconds."""

    saver: str
    sessions: int
    processes: int
    in_flight: int
    wall: float
    per_process: tuple[float, ...]
    cpu: float

    @property
    def cpu_ms_per_session(self) -> float:
        """CPU time of all processes (during the run) per session, in ms."""
        return self.cpu / self.sessions * 1000

    @property
    def rate(self) -> float:
        """Sessions per second over the wall time."""
        return self.sessions / self.wall


def _database(dsn: str, name: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return psycopg.conninfo.make_conninfo(dsn, dbname=name)


def _line(proc: subprocess.Popen[str], err: Path, expected: str | None = None) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line or (expected is not None and line != expected):
        proc.kill()
        proc.wait(timeout=10)
        raise SystemExit(f"LangGraph anchor process: got {line!r}:\n{err.read_text(encoding='utf-8')[-3000:]}")
    return line


def run_langgraph(
    dsn: str, tmp: Path, sessions: int, *, saver: str = "sync", processes: int = 2, in_flight: int = 8
) -> AnchorRun:
    """Run ``sessions`` ten-step sessions over ``processes`` LangGraph processes; checks every final state."""
    python = str(ensure_langgraph_venv())
    db = _database(dsn, f"langgraph_fleet_{saver}")
    side_log = tmp / f"lg-{saver}.log"
    side_log.unlink(missing_ok=True)  # a previous round's
    procs: list[subprocess.Popen[str]] = []
    errs: list[Path] = []
    try:
        # One after the other: the first one's setup() creates the tables, so the second's finds them.
        for k in range(processes):
            errs.append(tmp / f"lg-{saver}-{k}.err")
            with errs[-1].open("w", encoding="utf-8") as err:
                argv = [python, str(CHILD), db, saver, str(k), str(processes), str(sessions), str(in_flight)]
                procs.append(
                    subprocess.Popen(
                        [*argv, str(side_log)],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=err,
                        text=True,
                    )
                )
            _line(procs[-1], errs[-1], "READY")
        start = time.perf_counter()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc, err in zip(procs, errs, strict=True):
            _line(proc, err, "DONE")
        wall = time.perf_counter() - start
        summaries = [json.loads(_line(proc, err)) for proc, err in zip(procs, errs, strict=True)]
        for proc in procs:
            proc.wait(timeout=60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    checked = sum(s["checked"] for s in summaries)
    if checked != sessions or any(s["bad"] for s in summaries):
        raise SystemExit(f"LangGraph anchor: {checked} of {sessions} threads checked, some not at {STEPS} steps")
    lines = side_log.read_text(encoding="utf-8").splitlines()
    if len(lines) != 2 * STEPS * sessions or len(set(lines)) != len(lines):
        raise SystemExit(f"LangGraph anchor: {len(lines)} side-log lines, expected {2 * STEPS * sessions} distinct")
    return AnchorRun(
        saver=saver,
        sessions=sessions,
        processes=processes,
        in_flight=in_flight,
        wall=wall,
        per_process=tuple(s["elapsed"] for s in summaries),
        cpu=sum(s["cpu"] for s in summaries),
    )
