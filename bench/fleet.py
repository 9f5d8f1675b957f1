"""The fleet on DBOS: sessions per second over 2 workers, approval -> resumed, a killed worker's sessions.

    .venv/bin/python bench/fleet.py [--sessions 200] [--approvals 20] [--rounds 3] [--dsn postgresql://...]
        [--no-langgraph] [--langgraph-saver sync|async|both] [--no-floor]

Workers are real ``qitos worker --app fleet_app:composition`` processes (``tests/fleet_app.py``: a
session of ten steps, one non-idempotent tool call each, committed with ``durability="sync"``).

- throughput: 2 workers (``--concurrency 8`` each, with their default prefetch of 8); this process
  submits ``--sessions`` sessions (creating each in the store and enqueueing its run) and waits
  until all are completed; sessions/s is the count over the wall time from the first submit to the
  last completion.
- the anchor, right after each qitos throughput run on the same cluster (a database of its own):
  LangGraph 1.2 + ``PostgresSaver`` in 2 processes (``fleet_langgraph.py``), the same ``--sessions``
  ten-step sessions with the same non-idempotent side-log call per step, ``durability="sync"``, 8 in
  flight per process, split statically (session n in process n % 2: no dispatch). Both savers run by
  default (``--langgraph-saver``): sync ``PostgresSaver`` with 8 threads on a ``ConnectionPool``, and
  ``AsyncPostgresSaver`` with 8 tasks on an ``AsyncConnectionPool``; the ratio is against the faster.
  ``--rounds`` (3) alternates a qitos run and each anchor run, so a change of load on this shared
  machine hits every side; each side's median round is reported.
- the floor, in the same rounds (``fleet_floor.py``; ``--no-floor`` skips it): 2 worker processes of
  the project venv with DBOS configured as qitos' workers (concurrency 8 each with 8 runs
  prefetched, queue polling 0.05 s, the garbage collector set up as ``qitos worker`` sets it),
  ``--sessions`` workflows enqueued from this process with ``DBOSClient.enqueue`` as ``Fleet`` does,
  timed from the first enqueue to all ``SUCCESS``. Two lines: empty workflows (DBOS's dispatch
  alone), and DBOS + 2 prepared autocommit statements per step on an async pool (an intent row; a
  head compare-and-swap with a snapshot row), the head row created before the enqueue: what a
  ten-step session with a non-idempotent call per step minimally writes, with no agent, engine,
  journal, digests or compression. Worker CPU per session is printed for qitos and each floor.
- approval -> resumed: ``--approvals`` sessions wait for an approval; each is approved in turn from
  this process (a third process to both workers) and timed until a worker has committed the
  resumed session's next boundary; p50 and max.
- killed worker: one worker runs 6 sessions (``lease_ttl=2`` s, 2 s per call) alone, a second
  starts, the first is SIGKILLed; timed until every session is held by the surviving worker.

Without ``--dsn`` a private cluster is started (``scripts/postgres.sh start``: fsync on) and stopped.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "tests" / "distributed")]

from fleet_floor import FLOOR_KINDS, FloorRun, cpu_seconds, run_floor  # noqa: E402
from fleet_langgraph import AnchorRun, run_langgraph  # noqa: E402
from fleet_procs import start_worker, stop_workers, until  # noqa: E402

from fleet_app import composition  # noqa: E402
from qitos.distributed import Fleet  # noqa: E402

STEPS = 10
Run = TypeVar("Run")


def _cluster(dsn: str | None) -> tuple[str, str | None]:
    if dsn:
        return dsn, None
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "postgres.sh"), "start"], capture_output=True, text=True, check=True
    )
    values = dict(
        line[len("export ") :].split("=", 1) for line in out.stdout.splitlines() if line.startswith("export ")
    )
    return values["QITOS_TEST_PG_DSN"].strip("'\""), values["QITOS_TEST_PG_DIR"].strip("'\"")


def _db(dsn: str, schema: str) -> str:
    return f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"


@dataclass(frozen=True)
class QitosRun:
    """One qitos throughput run: sessions/s and CPU ms per session (the workers', the submitting process's)."""

    rate: float
    worker_cpu_ms: float
    submit_cpu_ms: float


def throughput(dsn: str, tmp: Path, sessions: int, *, tag: int = 0) -> QitosRun:
    """``sessions`` ten-step sessions submitted to 2 fresh workers (schema ``bench_tp_{pid}_{tag}``)."""
    db = _db(dsn, f"bench_tp_{os.getpid()}_{tag}")
    fleet = Fleet(composition, db=db)
    procs = [start_worker(db, tmp / "tp.log", concurrency=8) for _ in range(2)]
    try:
        cpu = [cpu_seconds(proc.pid) for proc in procs]
        own = time.process_time()
        start = time.perf_counter()
        ids = fleet.submit_many([f"tp-{tag}-{n}" for n in range(sessions)], target=STEPS)
        outcomes = fleet.wait(ids, timeout=600, poll=0.01)
        elapsed = time.perf_counter() - start
        own = time.process_time() - own
        workers = sum(cpu_seconds(proc.pid) for proc in procs) - sum(cpu)
    finally:
        stop_workers(procs)
        fleet.close()
    assert {o.lifecycle for o in outcomes.values()} == {"completed"}
    return QitosRun(sessions / elapsed, workers / sessions * 1000, own / sessions * 1000)


def approvals(dsn: str, tmp: Path, count: int) -> list[float]:
    db = _db(dsn, f"bench_ap_{os.getpid()}")
    fleet = Fleet(composition, db=db)
    procs = [start_worker(db, tmp / "ap.log", concurrency=8) for _ in range(2)]
    store = fleet.store
    try:
        ids = fleet.submit_many([f"approve-{n}" for n in range(count)], target=STEPS)
        until(
            lambda: all(h.lifecycle == "awaiting_approval" for h in (store.get_session_head(s) for s in ids) if h),
            timeout=120,
            what="sessions awaiting approval",
        )
        times = []
        for sid in ids:
            head = store.get_session_head(sid)
            assert head is not None
            start = time.perf_counter()
            fleet.approve(sid, "s1-publish")
            while True:
                now = store.get_session_head(sid)
                if now is not None and now.sequence > head.sequence:
                    break
                time.sleep(0.001)
            times.append(time.perf_counter() - start)
        fleet.wait(ids, timeout=120)
    finally:
        stop_workers(procs)
        fleet.close()
    return times


def killed(dsn: str, tmp: Path, lease_ttl: float) -> float:
    db = _db(dsn, f"bench_kill_{os.getpid()}")
    fleet = Fleet(composition, db=db)
    store = fleet.store
    # Calls long enough (20 s a session) that the victim is still running all six when the second
    # worker is up, however long that worker takes to start on a loaded machine.
    options = {"concurrency": 8, "lease_ttl": lease_ttl, "step_sleep": 2.0}
    procs = [start_worker(db, tmp / "kill.log", **options)]
    try:
        victim = procs[0]
        ids = fleet.submit_many([f"kill-{n}" for n in range(6)], target=STEPS)

        def owners() -> list[str]:
            return [lease.owner if lease else "" for lease in (store.get_lease(s) for s in ids)]

        until(lambda: all(f":{victim.pid}:" in o for o in owners()), timeout=60, what="the victim to run all")
        procs.append(start_worker(db, tmp / "kill.log", **options))
        survivor = procs[1].pid
        victim.send_signal(signal.SIGKILL)
        start = time.perf_counter()
        victim.wait()
        until(lambda: all(f":{survivor}:" in o for o in owners()), timeout=60, what="the survivor", poll=0.005)
        resumed = time.perf_counter() - start
        fleet.wait(ids, timeout=120)
    finally:
        stop_workers(procs)
        fleet.close()
    return resumed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--approvals", type=int, default=20)
    parser.add_argument("--lease-ttl", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3, help="alternating throughput rounds of each side")
    parser.add_argument("--dsn")
    parser.add_argument("--no-langgraph", action="store_true", help="skip the LangGraph + PostgresSaver anchor")
    parser.add_argument(
        "--langgraph-saver", choices=["sync", "async", "both"], default="both", help="the anchor's saver(s)"
    )
    parser.add_argument("--no-floor", action="store_true", help="skip the DBOS / DBOS + statements floors")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    savers = ["sync", "async"] if args.langgraph_saver == "both" else [args.langgraph_saver]
    if args.no_langgraph:
        savers = []
    dsn, cluster_dir = _cluster(args.dsn)
    qitos_runs: list[QitosRun] = []
    anchor_runs: dict[str, list[AnchorRun]] = {saver: [] for saver in savers}
    floor_runs: dict[str, list[FloorRun]] = {kind: [] for kind in ([] if args.no_floor else FLOOR_KINDS)}
    try:
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            print(f"load average: {_load()} (2-core machine shared with other work)")
            for tag in range(args.rounds):  # the sides alternate, so a change of load hits both
                qitos_runs.append(throughput(dsn, tmp, args.sessions, tag=tag))
                for saver in savers:
                    anchor_runs[saver].append(run_langgraph(dsn, tmp, args.sessions, saver=saver))
                for kind, runs in floor_runs.items():
                    runs.append(run_floor(dsn, tmp, args.sessions, kind=kind, tag=tag))
            times = approvals(dsn, tmp, args.approvals)
            resumed = killed(dsn, tmp, args.lease_ttl)
    finally:
        if cluster_dir:
            subprocess.run(["bash", str(ROOT / "scripts" / "postgres.sh"), "stop", cluster_dir], check=False)
    print(f"load average at the end: {_load()}")
    p50 = statistics.median(times) * 1000
    qitos = _median(qitos_runs, key=lambda run: run.rate)
    print(
        f"throughput: {args.sessions} ten-step sessions, 2 processes each side, {args.rounds} alternating rounds"
        f" (the median round; every round's sessions/s in brackets)"
    )
    print(
        f"  qitos, 2 workers x concurrency 8 on DBOS: {qitos.rate:.1f} sessions/s {_rates(r.rate for r in qitos_runs)};"
        f" CPU per session: workers {qitos.worker_cpu_ms:.1f} ms, submitting process {qitos.submit_cpu_ms:.1f} ms"
    )
    anchors = {saver: _median(runs, key=lambda run: run.rate) for saver, runs in anchor_runs.items()}
    for saver, anchor in anchors.items():
        print(
            f"  {_anchor_label(anchor)}: {anchor.rate:.1f} sessions/s {_rates(r.rate for r in anchor_runs[saver])};"
            f" CPU per session {anchor.cpu_ms_per_session:.1f} ms"
        )
    best = max(anchors.values(), key=lambda anchor: anchor.rate, default=None)
    if best is not None:
        print(f"  ratio qitos / LangGraph ({best.saver}, the faster here): {qitos.rate / best.rate:.2f}x")
    floors = {kind: _median(runs, key=lambda run: run.rate) for kind, runs in floor_runs.items()}
    for kind, floor in floors.items():
        print(
            f"  floor: {_FLOOR_LABELS[kind]}: {floor.rate:.1f} sessions/s {_rates(r.rate for r in floor_runs[kind])};"
            f" CPU per session: workers {floor.worker_cpu_ms:.1f} ms, enqueuing process {floor.submit_cpu_ms:.1f} ms"
        )
    if floors:
        ratios = ", ".join(f"{qitos.rate / floor.rate:.2f}x of {_FLOOR_SHORT[kind]}" for kind, floor in floors.items())
        extra = ", ".join(
            f"{qitos.worker_cpu_ms - floor.worker_cpu_ms:.1f} ms more than {_FLOOR_SHORT[kind]}"
            for kind, floor in floors.items()
        )
        print(f"  ratio qitos / floor: {ratios}")
        print(f"  qitos' workers' CPU per session: {qitos.worker_cpu_ms:.1f} ms, {extra}")
    print(f"approval -> resumed (n={len(times)}): p50 {p50:.1f} ms, max {max(times) * 1000:.1f} ms")
    print(
        f"killed worker: all 6 sessions held by the survivor {resumed:.2f} s after SIGKILL (lease {args.lease_ttl} s)"
    )
    print("targets:")
    print(f"  {'PASS' if qitos.rate >= 100 else 'FAIL'}  >= 100 sessions/s across 2 workers")
    if "steps" in floors:
        floor = floors["steps"]
        print(
            f"  info  the floor beside it, DBOS + 2 statements per step on these parts: {floor.rate:.1f} sessions/s"
            f" (qitos {qitos.rate / floor.rate:.2f}x of it; 100/s is {'within' if floor.rate >= 100 else 'beyond'}"
            " the floor here)"
        )
        cpu = qitos.worker_cpu_ms / floor.worker_cpu_ms
        print(
            f"  {'PASS' if cpu <= 2 else 'FAIL'}  workers' CPU per session <= 2x the floor's"
            f" ({qitos.worker_cpu_ms:.1f} vs {floor.worker_cpu_ms:.1f} ms: {cpu:.2f}x)"
        )
    else:
        print("  n/a   the floor beside it: not run (--no-floor)")
    print(f"  {'PASS' if p50 <= 100 else 'FAIL'}  approval -> resumed p50 <= 100 ms")
    print(
        f"  {'PASS' if resumed <= args.lease_ttl + 1 else 'FAIL'}  killed worker's sessions resumed within lease + 1 s"
    )
    if best is None:
        print("  n/a   LangGraph + PostgresSaver in 2 processes: not run (--no-langgraph)")
    else:
        ratio = qitos.rate / best.rate
        print(
            f"  {'PASS' if ratio >= 2.5 else 'FAIL'}  >= 2.5x LangGraph + PostgresSaver in 2 processes ({best.saver}):"
            f" {qitos.rate:.1f} vs {best.rate:.1f} sessions/s, {ratio:.2f}x"
        )


_FLOOR_LABELS = {
    "empty": "DBOS empty async workflows over 2 workers x concurrency 8",
    "steps": "DBOS + 2 statements per step (20 per session, head row at submit) over 2 workers x concurrency 8",
}
_FLOOR_SHORT = {"empty": "the DBOS floor", "steps": "the DBOS + statements floor"}


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def _rates(rates: Iterable[float]) -> str:
    return "[" + ", ".join(f"{rate:.1f}" for rate in rates) + "]"


def _median(runs: list[Run], *, key: Callable[[Run], float]) -> Run:
    """The run whose ``key`` is the median (the upper one of an even count)."""
    return sorted(runs, key=key)[len(runs) // 2]


def _anchor_label(anchor: AnchorRun) -> str:
    kind = (
        f"PostgresSaver, {anchor.in_flight} threads on a ConnectionPool"
        if anchor.saver == "sync"
        else f"AsyncPostgresSaver, {anchor.in_flight} tasks on an AsyncConnectionPool"
    )
    return f"LangGraph 1.2 + {kind}, {anchor.processes} processes, static split"


if __name__ == "__main__":
    main()
