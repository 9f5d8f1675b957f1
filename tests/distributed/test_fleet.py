"""The fleet on DBOS: real PostgreSQL, real ``qitos worker`` processes, sessions from the store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fleet_procs import ROOT, side_counts, start_worker, stop_workers, until, workers

pytest.importorskip("dbos", reason="the fleet tests need dbos (pip install 'qitos[fleet]')")

from qitos.core._errors import ConfigurationError, SessionNotFoundError
from qitos.distributed import Fleet
from qitos.distributed._naming import dbos_schema

STEPS = 10


def _assert_each_step_once(side_log: Path, tasks: list[str]) -> None:
    counts = side_counts(side_log)
    for task in tasks:
        for step in range(STEPS):
            assert counts[("begin", task, str(step))] == 1, (task, step, counts[("begin", task, str(step))])
    doubled = {key: n for key, n in counts.items() if n > 1}
    assert not doubled


def _run_fleet(fleet: Fleet, fleet_db: str, tmp_path: Path, sessions: int, timeout: float) -> None:
    side_log = tmp_path / "side.log"
    tasks = [f"task-{n}" for n in range(sessions)]
    # Four at a time each, 20 ms per call: one worker alone cannot drain the queue before the other polls.
    with workers(fleet_db, side_log, 2, concurrency=4, step_sleep=0.02) as procs:
        ids = fleet.submit_many(tasks, target=STEPS)
        outcomes = fleet.wait(ids, timeout=timeout)
        assert all(proc.poll() is None for proc in procs)
    assert sorted({o.lifecycle for o in outcomes.values()}) == ["completed"]
    _assert_each_step_once(side_log, tasks)
    owners = _workflow_executors(fleet_db, ids)
    assert len(owners) == 2, f"both workers ran sessions: {owners}"


def _workflow_executors(fleet_db: str, ids: list[str]) -> set[str]:
    return _first_runs(fleet_db, ids, "executor_id")


def _first_runs(fleet_db: str, ids: list[str], column: str) -> set[str]:
    """``column`` of the sessions' first runs (workflows ``qitos-{id}-0``) in DBOS's workflow_status."""
    import psycopg

    from qitos.checkpoint._targets import postgres_dsn

    dsn, _ = postgres_dsn(fleet_db)
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            f'SELECT {column} FROM "{dbos_schema(fleet_db)}".workflow_status WHERE workflow_uuid = ANY(%s)',
            ([f"qitos-{sid}-0" for sid in ids],),
        ).fetchall()
    return {row[0] for row in rows}


def _workflow_ids(fleet_db: str, session_id: str) -> list[str]:
    import psycopg

    from qitos.checkpoint._targets import postgres_dsn

    dsn, _ = postgres_dsn(fleet_db)
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            f'SELECT workflow_uuid FROM "{dbos_schema(fleet_db)}".workflow_status WHERE workflow_uuid LIKE %s',
            (f"qitos-{session_id}-%",),
        ).fetchall()
    return sorted(row[0] for row in rows)


def test_twenty_sessions_over_two_worker_processes_all_finish_each_step_once(
    fleet: Fleet, fleet_db: str, tmp_path: Path
) -> None:
    _run_fleet(fleet, fleet_db, tmp_path, 20, timeout=90)


@pytest.mark.slow
def test_two_hundred_sessions_over_two_worker_processes_all_finish_each_step_once(
    fleet: Fleet, fleet_db: str, tmp_path: Path
) -> None:
    _run_fleet(fleet, fleet_db, tmp_path, 200, timeout=300)


def test_a_prefetched_run_waits_for_a_slot_holding_its_sessions_lease_and_is_not_redispatched(
    fleet: Fleet, fleet_db: str, tmp_path: Path
) -> None:
    side_log = tmp_path / "side.log"
    # One slot, one run prefetched; a 2 s lease, so a supervisor takes a dequeued run with no live
    # lease after 2 s for the run of a dead worker. The first session takes 10 x 0.3 s.
    options = {"concurrency": 1, "lease_ttl": 2.0, "step_sleep": 0.3, "extra_args": ("--prefetch", "1")}
    with workers(fleet_db, side_log, 1, **options) as procs:
        first, second = fleet.submit_many(["first", "second"], target=STEPS)
        until(lambda: fleet.results([first])[first].lifecycle == "running", timeout=30, what="the first run")
        # The second run is dequeued and waits; after half the grace it holds its session's lease,
        # on the same worker, while the first session is still running.
        lease = until(lambda: fleet.store.get_lease(second), timeout=10, what="the waiting run's lease")
        assert f":{procs[0].pid}:" in lease.owner and lease.expires_at > time.time()
        assert fleet.results([second])[second].lifecycle == "created"
        time.sleep(2.5)  # past the grace: a supervisor pass would have re-dispatched a run with no lease
        assert fleet.results([second])[second].lifecycle in ("created", "running")
        outcomes = fleet.wait([first, second], timeout=60)
    assert {o.lifecycle for o in outcomes.values()} == {"completed"}
    _assert_each_step_once(side_log, ["first", "second"])
    lines = side_log.read_text(encoding="utf-8").splitlines()
    assert max(i for i, line in enumerate(lines) if " first " in line) < lines.index("begin second 0")  # one slot
    assert _workflow_ids(fleet_db, second) == [f"qitos-{second}-0"]  # not re-dispatched
    assert _first_runs(fleet_db, [first, second], "status") == {"SUCCESS"}


def _notices(directory: Path) -> list[str]:
    """The ``qitos worker:`` lines on the stderr of the one worker whose side log is in ``directory``."""
    (err,) = directory.glob("worker-*.err")
    return [line for line in err.read_text(encoding="utf-8").splitlines() if line.startswith("qitos worker:")]


def test_a_worker_started_with_other_limits_changes_them_for_the_queue_and_both_workers_say_so(
    fleet_db: str, tmp_path: Path
) -> None:
    """DBOS keeps one limit of runs per worker on the queue, and the last worker to start sets it."""
    first, second, third = (tmp_path / name for name in ("first", "second", "third"))
    for directory in (first, second, third):
        directory.mkdir()
    with workers(fleet_db, first / "side.log", 1, concurrency=3):  # asks for 3 + 3 prefetched
        assert _notices(first) == []
        with workers(fleet_db, second / "side.log", 1, concurrency=1):  # asks for 1 + 1
            told = until(lambda: _notices(first), timeout=10, what="the first worker's notice")
            with workers(fleet_db, third / "side.log", 1, concurrency=1):  # as the second: no change
                time.sleep(1.5)  # past a supervisor pass of the first worker
                assert _notices(first) == told
                assert _notices(third) == []
    assert told == [
        "qitos worker: queue 'qitos' now hands each of its workers at most 2 runs, as a worker started with"
        " other --concurrency or --prefetch asked; this worker asked for 6 (--concurrency 3 + --prefetch 3)"
        " and now runs at most 2 at once. The workers of one queue share this limit: start them with the"
        " same values."
    ]
    assert _notices(second) == [
        "qitos worker: queue 'qitos' handed each of its workers at most 6 runs, as a worker started before"
        " with other --concurrency or --prefetch asked; now it hands every one of them 2 runs, as this"
        " worker asks."
    ]


def test_a_worker_refuses_a_negative_prefetch() -> None:
    from fleet_app import composition
    from qitos.distributed import Worker

    with pytest.raises(ConfigurationError, match="prefetch"):
        Worker(composition, db="postgresql://nobody@/nowhere", prefetch=-1)


_APPROVER = textwrap.dedent(
    """
    import json, sys
    from fleet_app import composition
    from qitos.distributed import Fleet

    fleet = Fleet(composition, db=sys.argv[1])
    first = fleet.approve(sys.argv[2], "s1-publish")
    again = fleet.approve(sys.argv[2], "s1-publish")
    fleet.close()
    print(json.dumps([first.position, again.position]))
    """
)


def test_an_approval_from_a_third_process_resumes_the_session_once(fleet: Fleet, fleet_db: str, tmp_path: Path) -> None:
    side_log = tmp_path / "side.log"
    with workers(fleet_db, side_log, 2, concurrency=4):
        sid = fleet.submit("approve-me", target=STEPS)
        until(lambda: fleet.results([sid])[sid].lifecycle == "awaiting_approval", timeout=60, what="awaiting approval")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]))
        out = subprocess.run(
            [sys.executable, "-c", _APPROVER, fleet_db, sid], env=env, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        first, again = json.loads(out.stdout.strip().splitlines()[-1])
        assert first == again  # the repeated approval named the same continuation
        until(lambda: fleet.results([sid])[sid].lifecycle == "completed", timeout=60, what="the resumed session")
        # A late repeat, after the session moved on, names the same answer and starts nothing;
        # answering the call the other way is refused.
        assert fleet.approve(sid, "s1-publish").position == first
        with pytest.raises(ConfigurationError, match="already answered approve"):
            fleet.reject(sid, "s1-publish")
    assert _workflow_ids(fleet_db, sid) == [f"qitos-{sid}-0", f"qitos-{sid}-{first}"]
    counts = side_counts(side_log)
    assert counts[("publish", "approve-me", "0")] == 1
    _assert_each_step_once(side_log, ["approve-me"])


def test_a_sigkilled_workers_sessions_finish_on_the_other_worker_nothing_lost_or_repeated(
    fleet: Fleet, fleet_db: str, tmp_path: Path
) -> None:
    side_log = tmp_path / "side.log"
    tasks = [f"kill-{n}" for n in range(6)]
    options: dict[str, Any] = {"concurrency": 8, "lease_ttl": 2.0, "step_sleep": 1.0}
    procs = [start_worker(fleet_db, side_log, **options)]
    try:
        victim = procs[0]
        ids = fleet.submit_many(tasks, target=STEPS)
        store = fleet.store

        def victim_runs_all() -> bool:
            leases = [store.get_lease(sid) for sid in ids]
            return all(lease is not None and f":{victim.pid}:" in lease.owner for lease in leases)

        def a_call_is_open() -> bool:
            counts = side_counts(side_log)
            return any(key[0] == "begin" and ("end", *key[1:]) not in counts for key in counts)

        until(victim_runs_all, timeout=60, what="the victim worker to run every session")
        procs.append(start_worker(fleet_db, side_log, **options))
        # Starting the second worker can take seconds on a loaded machine: kill only while the victim
        # is inside a call, so the kill always lands where nothing may be repeated.
        until(a_call_is_open, timeout=60, what="the victim to be inside a call")
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        outcomes = fleet.wait(ids, timeout=90)
        assert procs[1].poll() is None
    finally:
        stop_workers(procs)
    assert sorted({o.lifecycle for o in outcomes.values()}) == ["completed"]
    counts = side_counts(side_log)
    doubled = {key: n for key, n in counts.items() if n > 1}
    assert not doubled, f"a non-idempotent call ran twice: {doubled}"
    cut_short = 0
    for task in tasks:
        # Each step's call ran once, except at most the one the kill landed in: its start was
        # recorded, and if the kill came before the tool began it is reported interrupted, not run.
        never_began = [step for step in range(STEPS) if counts[("begin", task, str(step))] == 0]
        assert len(never_began) <= 1, (task, never_began)
        cut_short += len(never_began)
    interrupted = [key for key in counts if key[0] == "begin" and ("end", *key[1:]) not in counts]
    assert interrupted or cut_short, "the victim was killed inside calls, which must not be repeated"


def test_a_rejection_resumes_the_session_without_the_call(fleet: Fleet, fleet_db: str, tmp_path: Path) -> None:
    side_log = tmp_path / "side.log"
    with workers(fleet_db, side_log, 1, concurrency=2):
        sid = fleet.submit("approve-no", target=STEPS)
        until(lambda: fleet.results([sid])[sid].lifecycle == "awaiting_approval", timeout=60, what="awaiting")
        receipt = fleet.reject(sid, "s1-publish", "not today")
        assert not receipt.approved
        outcome = fleet.wait([sid], timeout=60)[sid]
    assert outcome.lifecycle == "completed"
    assert side_counts(side_log)[("publish", "approve-no", "0")] == 0
    _assert_each_step_once(side_log, ["approve-no"])


def test_sessions_submit_on_the_command_line_is_run_by_a_worker(fleet: Fleet, fleet_db: str, tmp_path: Path) -> None:
    side_log = tmp_path / "side.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]))
    with workers(fleet_db, side_log, 1, concurrency=2):
        out = subprocess.run(
            [sys.executable, "-c", "from qitos.cli.app import main; main()", "sessions", "submit", "cli-task",
             "--app", "fleet_app:composition", "--db", fleet_db, "--json"],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        sid = json.loads(out.stdout)["session_id"]
        until(lambda: fleet.results([sid])[sid].lifecycle == "completed", timeout=60, what="the submitted session")
    _assert_each_step_once(side_log, ["cli-task"])


def _worker_set_up(fleet: Fleet, fleet_db: str, tmp_path: Path, *extra_args: str) -> tuple[int, int, str]:
    """What one ``record`` call in a worker process found: frozen objects, the youngest collector
    threshold and the event loop policy's module."""
    gc_log = tmp_path / f"set-up{len(extra_args)}.log"
    env = {"QITOS_FLEET_GC_LOG": str(gc_log)}
    with workers(fleet_db, tmp_path / "side.log", 1, concurrency=1, extra_args=extra_args, extra_env=env):
        ids = fleet.submit_many(["probe"], target=1)
        assert fleet.wait(ids, timeout=60)[ids[0]].lifecycle == "completed"
    frozen, youngest, policy = gc_log.read_text(encoding="utf-8").split()
    return int(frozen), int(youngest), policy


def test_a_worker_process_freezes_its_start_up_objects_and_runs_sessions_on_uvloop(
    fleet: Fleet, fleet_db: str, tmp_path: Path
) -> None:
    """``qitos worker`` tunes the cyclic collector (``tune_collector``) and, by default, runs its
    sessions on uvloop when it is installed (``use_event_loop``); ``--loop asyncio`` keeps asyncio's."""
    pytest.importorskip("uvloop", reason="the fleet extra installs uvloop")
    frozen, youngest, policy = _worker_set_up(fleet, fleet_db, tmp_path)
    assert frozen > 10_000  # DBOS, SQLAlchemy and the app, built before the worker was ready
    assert youngest == 10_000
    assert policy == "uvloop"
    assert _worker_set_up(fleet, fleet_db, tmp_path, "--loop", "asyncio")[2].startswith("asyncio")


def test_a_worker_refuses_an_unknown_event_loop() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]))
    out = subprocess.run(
        [sys.executable, "-c", "from qitos.cli.app import main; main()", "worker", "--app", "fleet_app:composition",
         "--db", "postgresql://nobody@/none?host=/nonexistent", "--loop", "trio"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "--loop must be one of auto, uvloop, asyncio; got 'trio'" in out.stderr


_SERVE = textwrap.dedent(
    """
    import json, sys
    from fleet_app import composition
    from qitos.distributed import Fleet

    fleet = Fleet(composition, db=sys.argv[1], concurrency=3)
    worker = fleet.serve()
    try:
        ids = fleet.submit_many(["served-0", "served-1", "served-2", "served-3"], target=3)
        outcomes = fleet.wait(ids, timeout=60)
    finally:
        worker.stop()
        fleet.close()
    print(json.dumps(sorted(o.lifecycle for o in outcomes.values())))
    """
)


def test_a_fleet_serves_its_own_sessions_in_process(fleet_db: str, tmp_path: Path) -> None:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]),
        QITOS_FLEET_SIDE_LOG=str(tmp_path / "side.log"),
    )
    out = subprocess.run([sys.executable, "-c", _SERVE, fleet_db], env=env, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["completed"] * 4


def test_a_paused_session_is_continued_by_steering_it(fleet: Fleet, fleet_db: str, tmp_path: Path) -> None:
    """And only then: the supervisors hear the pause item too, and leave the paused session alone."""
    side_log = tmp_path / "side.log"
    with workers(fleet_db, side_log, 1, concurrency=2, step_sleep=0.2):
        sid = fleet.submit("pause-me", target=STEPS)
        until(lambda: fleet.results([sid])[sid].lifecycle == "running", timeout=60, what="the session to run")
        fleet.pause(sid)
        paused = fleet.wait([sid], timeout=60)[sid]
        assert paused.lifecycle == "paused"
        time.sleep(1.5)  # several supervisor passes
        assert fleet.results([sid])[sid].sequence == paused.sequence
        steps_before = side_counts(side_log)
        fleet.steer(sid, "carry on")
        done = fleet.wait([sid], timeout=60)[sid]
    assert done.lifecycle == "completed"
    assert sum(steps_before.values()) < sum(side_counts(side_log).values())
    _assert_each_step_once(side_log, ["pause-me"])


def test_submit_many_over_several_batches_keeps_the_order_of_the_tasks(
    fleet: Fleet, fleet_db: str, tmp_path: Path
) -> None:
    """More tasks than one batch: created a few at once, enqueued a batch per transaction, ids in order."""
    tasks = [f"order-{n}" for n in range(150)]
    with workers(fleet_db, tmp_path / "side.log", 1, concurrency=8):
        ids = fleet.submit_many(tasks, target=1)
        outcomes = fleet.wait(ids, timeout=120)
    assert len(set(ids)) == len(tasks)
    objectives = [(fleet.store.get_session_head(sid).metadata or {})["task"]["objective"] for sid in ids]  # type: ignore[union-attr]
    assert objectives == tasks
    assert {o.lifecycle for o in outcomes.values()} == {"completed"}
    assert _workflow_ids(fleet_db, ids[-1]) == [f"qitos-{ids[-1]}-0"]


def test_wait_returns_once_all_settled_in_any_order_and_names_the_unsettled(fleet: Fleet) -> None:
    ids = [fleet.composition.session(f"wait-{i}", target=1).session_id.value for i in range(40)]

    def settle_last_first() -> None:
        for sid in reversed(ids):  # the first one waited for settles last, the last ones beyond its window
            time.sleep(0.005)
            fleet.composition.restore(sid).run()

    runner = threading.Thread(target=settle_last_first)
    runner.start()
    outcomes = fleet.wait(ids, timeout=30, poll=0.01)
    runner.join()
    assert list(outcomes) == ids and {o.lifecycle for o in outcomes.values()} == {"completed"}
    never = fleet.composition.session("never run", target=1).session_id.value
    done = fleet.composition.session("run", target=1).session_id.value
    fleet.composition.restore(done).run()
    with pytest.raises(TimeoutError, match=f"^1 sessions did not settle in 0.3s: \\['{never}'\\]"):
        fleet.wait([never, done], timeout=0.3, poll=0.01)
    with pytest.raises(SessionNotFoundError):
        fleet.wait([never, "ses_unknown"], timeout=30)  # at once, not after the timeout
