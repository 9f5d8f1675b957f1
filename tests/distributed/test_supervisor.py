"""The fleet supervisor: a dead worker's dequeued run finishes elsewhere; an answer from anywhere resumes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fleet_procs import ROOT, side_counts, start_worker, stop_workers, until, workers

pytest.importorskip("dbos", reason="the fleet tests need dbos (pip install 'qitos[fleet]')")

from delegate_agents import ParentAgent, ParentState
from fleet_app import delegating
from qitos.checkpoint.store import CheckpointStore
from qitos.distributed import Fleet, Worker
from qitos.distributed._naming import dbos_schema
from qitos.engine._composition import compose
from qitos.engine._hooks import EngineHook, HookContext
from qitos.sessions._control import answer_approval

STEPS = 10
_CLI = "from qitos.cli.app import main; main()"


def _cli_approve(session_id: str, call_id: str, fleet_db: str, *options: str) -> str:
    """``qitos sessions approve`` in a process of its own (it only appends the answer to the store); its output."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]))
    approve = [sys.executable, "-c", _CLI, "sessions", "approve", session_id, call_id, "--db", fleet_db, *options]
    out = subprocess.run(approve, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _workflows(pg_dsn: str, fleet_db: str, session_id: str) -> dict[str, str]:
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(
            f'SELECT workflow_uuid, status FROM "{dbos_schema(fleet_db)}".workflow_status WHERE workflow_uuid LIKE %s',
            (f"qitos-{session_id}-%",),
        ).fetchall()
    return dict(rows)


def test_a_run_whose_worker_died_before_taking_the_lease_finishes_on_another_worker(
    fleet: Fleet, fleet_db: str, pg_dsn: str, tmp_path: Path
) -> None:
    side_log, hang = tmp_path / "side.log", tmp_path / "hang"
    # This worker dequeues the run and hangs while it builds the agent, before the lease.
    victim = start_worker(fleet_db, side_log, lease_ttl=2, extra_env={"QITOS_FLEET_HANG_FILE": str(hang)})
    procs = [victim]
    try:
        hang.touch()
        sid = fleet.submit("orphan", target=STEPS)
        until(lambda: Path(f"{hang}.hung").exists(), timeout=60, what="the victim to dequeue the run")
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        assert fleet.store.get_lease(sid) is None  # it never held the session
        assert fleet.results([sid])[sid].lifecycle == "created"
        procs.append(start_worker(fleet_db, side_log, lease_ttl=2))
        outcome = fleet.wait([sid], timeout=60)[sid]
    finally:
        stop_workers(procs)
    assert outcome.lifecycle == "completed"
    counts = side_counts(side_log)
    assert all(counts[("begin", "orphan", str(step))] == 1 for step in range(STEPS))
    runs = _workflows(pg_dsn, fleet_db, sid)
    assert runs == {f"qitos-{sid}-0": "CANCELLED", f"qitos-{sid}-0-r": "SUCCESS"}


def test_an_approval_given_with_the_cli_resumes_the_session_on_the_fleet(
    fleet: Fleet, fleet_db: str, pg_dsn: str, tmp_path: Path
) -> None:
    """``qitos sessions approve`` only appends the answer; a worker's supervisor hears it and resumes."""
    side_log = tmp_path / "side.log"
    with workers(fleet_db, side_log, 2, concurrency=4):
        sid = fleet.submit("approve-by-cli", target=STEPS)
        until(lambda: fleet.results([sid])[sid].lifecycle == "awaiting_approval", timeout=60, what="awaiting")
        said = _cli_approve(sid, "s1-publish", fleet_db)
        until(lambda: fleet.results([sid])[sid].lifecycle == "completed", timeout=60, what="the resumed session")
    assert said.strip() == "approved s1-publish; a fleet worker on queue 'qitos' continues the session"
    counts = side_counts(side_log)
    assert counts[("publish", "approve-by-cli", "0")] == 1
    assert all(counts[("begin", "approve-by-cli", str(step))] == 1 for step in range(STEPS))
    assert sorted(_workflows(pg_dsn, fleet_db, sid).values()) == ["SUCCESS", "SUCCESS"]


def test_an_answer_given_while_no_worker_listened_is_taken_in_by_the_next_worker_to_start(
    fleet: Fleet, fleet_db: str, pg_dsn: str, tmp_path: Path
) -> None:
    """A supervisor that starts listening first looks at every waiting session (only those: the
    store lists the waiting heads alone), so an answer nobody heard still resumes its session."""
    side_log = tmp_path / "side.log"
    with workers(fleet_db, side_log, 1, concurrency=2):
        waiting, done = fleet.submit_many(["approve-unheard", "plain"], target=STEPS)
        until(lambda: fleet.results([waiting])[waiting].lifecycle == "awaiting_approval", timeout=60, what="awaiting")
        assert fleet.wait([done], timeout=60)[done].lifecycle == "completed"
    _cli_approve(waiting, "s1-publish", fleet_db, "--json")  # no worker runs: nobody hears it, nothing is enqueued
    assert [head.session_id for head in fleet.store.list_sessions(lifecycles=("awaiting_approval",))] == [waiting]
    assert len(_workflows(pg_dsn, fleet_db, waiting)) == 1  # only its first run
    with workers(fleet_db, side_log, 1, concurrency=2):
        until(lambda: fleet.results([waiting])[waiting].lifecycle == "completed", timeout=60, what="the resumed one")
    counts = side_counts(side_log)
    assert counts[("publish", "approve-unheard", "0")] == 1
    assert all(counts[("begin", "approve-unheard", str(step))] == 1 for step in range(STEPS))
    assert sorted(_workflows(pg_dsn, fleet_db, waiting).values()) == ["SUCCESS", "SUCCESS"]


def _assert_the_child_ran_once(side_log: Path) -> None:
    """The delegating parent's child did each of its calls once, the approved one after the answer."""
    lines = side_log.read_text(encoding="utf-8").splitlines()
    assert [line for line in lines if line.startswith("begin")] == [
        "begin work w0",
        "begin work w1",
        "begin publish p1",
        "begin work w2",
    ]


def test_an_answer_to_a_delegated_child_resumes_the_parent_on_the_fleet(
    fleet_db: str, pg_dsn: str, tmp_path: Path
) -> None:
    """The child's call awaits approval; the CLI answers it (stored on the child); the parent's run resumes it."""
    side_log = tmp_path / "side.log"
    parents = Fleet(delegating, db=fleet_db)
    try:
        with workers(fleet_db, side_log, 1, concurrency=2, app="fleet_app:delegating"):
            sid = parents.submit("parent")
            until(lambda: parents.results([sid])[sid].lifecycle == "awaiting_approval", timeout=60, what="awaiting")
            said = _cli_approve(sid, "p1", fleet_db)
            until(lambda: parents.results([sid])[sid].lifecycle == "completed", timeout=60, what="the parent")
    finally:
        parents.close()
    assert said.strip() == "approved p1; a fleet worker on queue 'qitos' continues the session"  # the child's call
    _assert_the_child_ran_once(side_log)
    runs = _workflows(pg_dsn, fleet_db, sid)
    assert len(runs) == 2 and set(runs.values()) == {"SUCCESS"}, runs


class _AnswerAsTheParentsRunEnds(EngineHook):
    """Approves the delegated child's call once, when the parent's run ends waiting on it: the run
    has committed its last boundary and still holds the parent's lease, so the answer's own run
    would find the session busy."""

    def __init__(self) -> None:
        self.store: CheckpointStore | None = None
        self.session_id = ""
        self.answered = False

    def on_run_end(self, ctx: HookContext) -> None:
        state: Any = ctx.state
        if self.answered or not isinstance(state, ParentState) or state.stop_reason != "awaiting_approval":
            return
        assert self.store is not None
        self.answered = True
        answer_approval(self.store, self.session_id, "p1", approved=True)


def test_an_answer_to_a_delegated_child_given_as_the_parents_run_ends_is_taken_in_by_that_run(
    fleet_db: str, tmp_path: Path
) -> None:
    side_log = tmp_path / "side.log"
    hook = _AnswerAsTheParentsRunEnds()
    parents = compose(lambda: ParentAgent(str(side_log), child_steps=3, approval_at=1), hooks=[hook])
    worker = Worker(parents, db=fleet_db)  # its runs only: no DBOS, no supervisor
    try:
        hook.store = worker.store
        hook.session_id = worker.composition.session("parent").session_id.value
        ended = asyncio.run(worker.arun_session(hook.session_id))
        head = worker.store.get_session_head(hook.session_id)
    finally:
        worker.store.close()
    assert hook.answered
    assert (ended, head is not None and head.lifecycle) == ("final", "completed")
    _assert_the_child_ran_once(side_log)


def test_a_run_whose_store_connections_are_killed_resumes_and_finishes(
    fleet: Fleet, fleet_db: str, pg_dsn: str, tmp_path: Path
) -> None:
    """The server ends the worker's store connections mid-session: the run resumes, nothing is repeated."""
    side_log, name = tmp_path / "side.log", f"qitos-cut-{os.getpid()}"
    with workers(f"{fleet_db}&application_name={name}", side_log, 1, concurrency=2, step_sleep=0.1):
        sid = fleet.submit("cut", target=STEPS)
        until(lambda: fleet.results([sid])[sid].sequence >= 3, timeout=60, what="a few steps")
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s", (name,)
            ).fetchone()
        assert row is not None and row[0] >= 1
        outcome = fleet.wait([sid], timeout=60)[sid]
    assert outcome.lifecycle == "completed"
    counts = side_counts(side_log)
    assert all(counts[("begin", "cut", str(step))] == 1 for step in range(STEPS))


def test_store_connections_killed_again_and_again_during_calls_longer_than_the_lease_leave_no_session_stuck(
    fleet: Fleet, fleet_db: str, pg_dsn: str, tmp_path: Path
) -> None:
    """Every call lasts longer than the lease, so the heartbeat renews it meanwhile; the server ends
    all the workers' connections every 0.7 s. No session may be left unfinished, no call repeated."""
    side_log, name = tmp_path / "side.log", f"qitos-attack-{os.getpid()}"
    tasks = [f"attack-{n}" for n in range(12)]
    options = {"concurrency": 6, "lease_ttl": 1.5, "step_sleep": 2.5}
    with workers(f"{fleet_db}&application_name={name}", side_log, 2, **options):
        ids = fleet.submit_many(tasks, target=2)
        until(lambda: side_counts(side_log)[("begin", tasks[0], "0")], timeout=60, what="the first call")
        killed = 0
        for _ in range(12):
            time.sleep(0.7)
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
                    (name,),
                ).fetchone()
            killed += row[0] if row else 0
        outcomes = fleet.wait(ids, timeout=120)
    assert killed >= 12
    stuck = {sid: o.lifecycle for sid, o in outcomes.items() if o.lifecycle != "completed"}
    assert not stuck, f"{len(stuck)} of {len(ids)} sessions stuck: {stuck}"
    counts = side_counts(side_log)
    doubled = {key: n for key, n in counts.items() if n > 1}
    assert not doubled, f"a non-idempotent call ran twice: {doubled}"


class _StallOnce(EngineHook):
    """Blocks the event loop (and so the run's lease heartbeat) for ``seconds`` after the first act:
    the run stalls past its lease, and nobody takes the session over meanwhile."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.stalled = False

    def on_after_act(self, ctx: HookContext) -> None:
        if not self.stalled:
            self.stalled = True
            time.sleep(self.seconds)


def test_a_run_that_loses_its_lease_with_nobody_taking_over_is_continued_to_the_end(
    fleet_db: str, tmp_path: Path
) -> None:
    """Ending such a run as ``lease_lost`` (a successful workflow for DBOS) would leave the session
    running with no runner and nothing to continue it."""
    from charge_agents import ChargeAgent, observed
    from charge_agents import ledger as ledger_lines

    ledger, stall = tmp_path / "ledger", _StallOnce(3.0)
    payers = compose(lambda: ChargeAgent(str(ledger)), hooks=[stall], lease_ttl=1.0)
    worker = Worker(payers, db=fleet_db)  # its runs only: no DBOS, no supervisor
    try:
        sid = worker.composition.session("A").session_id.value
        ended = asyncio.run(worker.arun_session(sid))
        head = worker.store.get_session_head(sid)
        state = worker.composition.restore(sid).run().state  # a finished session: its state, no step
    finally:
        worker.store.close()
    assert stall.stalled
    assert (ended, head is not None and head.lifecycle) == ("final", "completed")
    assert observed({"observed": state.observed}) == {"A-0": "interrupted"}  # its result went with the lease
    assert [line for line in ledger_lines(ledger) if line.startswith("begin")] == ["begin A-0"]  # run once
