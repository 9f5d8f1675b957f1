"""Durable sessions across real processes sharing one SQLite file.

Each test starts ``python -m session_agents ...`` subprocesses (see ``session_agents.py``): a
session started in one process is paused, approved or resumed in others.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import session_agents as sa
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.core._errors import ConfigurationError
from qitos.sessions._payload import SnapshotPayload


def _reference(tmp_path: Path, target: int, **kwargs: Any) -> dict[str, Any]:
    """The final state of an uninterrupted run, in this process, on its own database."""
    root = tmp_path / "reference"
    root.mkdir()
    composition = sa.make_composition(str(root / "ref.db"), str(root / "side.log"), **kwargs)
    result = composition.session("Index notes", target=target).run()
    composition.runtime.checkpoint_store.close()
    state: dict[str, Any] = result.state.to_dict()
    return state


def _paths(tmp_path: Path) -> tuple[str, str]:
    return str(tmp_path / "sessions.db"), str(tmp_path / "side.log")


def test_a_session_paused_by_its_policy_in_one_process_resumes_in_another_with_the_same_result(
    tmp_path: Path,
) -> None:
    db, side = _paths(tmp_path)
    expected = _reference(tmp_path, 8)

    first = sa.run_cli("run", "--db", db, "--log", side, "--target", "8", "--pause-at", "4")

    assert first["stop_reason"] == "paused"
    assert first["state"]["steps_done"] == [0, 1, 2, 3]
    sid = first["session_id"]
    inspected = sa.run_cli("inspect", "--db", db, "--session", sid)
    assert inspected["lifecycle"] == "paused"
    assert inspected["snapshot_integrity"] == "verified"

    second = sa.run_cli("run", "--db", db, "--log", side, "--session", sid)

    assert second["stop_reason"] == "final"
    assert second["state"] == expected
    begins = Counter(call for event, _, call in sa.read_side_log(side) if event == "begin")
    assert set(begins.values()) == {1}  # no call ran twice across the two processes


def test_pause_from_another_process_stops_the_run_at_a_boundary_and_it_resumes_elsewhere(tmp_path: Path) -> None:
    db, side = _paths(tmp_path)
    target = 12
    expected = _reference(tmp_path, target)
    composition = sa.make_composition(db, side)
    session = composition.session("Index notes", target=target)
    sid = session.session_id.value
    store = composition.runtime.checkpoint_store

    runner = sa.start_cli("run", "--db", db, "--log", side, "--session", sid, "--sleep", "0.04")
    deadline = time.monotonic() + 60
    while (session.inspect().budget["used"].get("steps") or 0) < 2:  # two steps are committed
        assert runner.poll() is None, runner.communicate()
        assert time.monotonic() < deadline, "the run did not start"
        time.sleep(0.005)
    receipt = session.pause()  # this test process is not the one running the session
    paused = sa.finish_cli(runner)

    assert receipt.session_id == sid and receipt.position >= 1
    assert paused["stop_reason"] == "paused"
    done = paused["state"]["steps_done"]
    assert 2 <= len(done) < target
    assert done == list(range(len(done)))
    inspection = session.inspect()
    assert inspection.lifecycle.value == "paused"
    assert inspection.tool_batch is None  # it stopped at a boundary, never midway through a step
    assert store.get_session_head(sid) is not None

    resumed = sa.run_cli("run", "--db", db, "--log", side, "--session", sid)

    assert resumed["stop_reason"] == "final"
    assert resumed["state"] == expected
    begins = Counter(call for event, _, call in sa.read_side_log(side) if event == "begin")
    assert set(begins.values()) == {1}


def test_an_approval_given_in_another_process_runs_the_call_exactly_once(tmp_path: Path) -> None:
    db, side = _paths(tmp_path)

    waiting = sa.run_cli("run", "--db", db, "--log", side, "--target", "3", "--approval-at", "1")

    assert waiting["stop_reason"] == "awaiting_approval"
    sid = waiting["session_id"]
    assert ("begin", "publish", "s1-publish") not in sa.read_side_log(side)
    here = sa.make_composition(db, side, approval_at=1)
    inspection = here.restore(sid).inspect()
    assert inspection.lifecycle.value == "awaiting_approval"
    assert inspection.tool_batch is not None
    assert [c.call_id for c in inspection.tool_batch.pending_approval] == ["s1-publish"]
    # Running again without an answer keeps waiting and runs nothing.
    assert here.restore(sid).run().state.stop_reason == "awaiting_approval"
    assert ("begin", "publish", "s1-publish") not in sa.read_side_log(side)

    sa.run_cli("approve", "--db", db, "--session", sid, "--call", "s1-publish", "--approval-at", "1")
    done = sa.run_cli("run", "--db", db, "--log", side, "--session", sid, "--approval-at", "1")

    assert done["stop_reason"] == "final"
    assert done["state"]["steps_done"] == [0, 1, 2]
    side_log = sa.read_side_log(side)
    assert side_log.count(("begin", "publish", "s1-publish")) == 1
    # The calls of step 1 that ran before the wait were not run again.
    assert side_log.count(("begin", "append_note", "s1-append")) == 1
    assert side_log.count(("begin", "index_note", "s1-index")) == 1
    by_call = {o["call"]: o for o in done["state"]["observed"]}
    assert by_call["s1-publish"]["ok"] is True
    assert here.restore(sid).inspect().tool_batch is None


def test_a_rejection_given_in_another_process_becomes_a_rejected_observation(tmp_path: Path) -> None:
    db, side = _paths(tmp_path)
    waiting = sa.run_cli("run", "--db", db, "--log", side, "--target", "3", "--approval-at", "1")
    sid = waiting["session_id"]

    sa.run_cli("reject", "--db", db, "--session", sid, "--call", "s1-publish", "--text", "not today")
    done = sa.run_cli("run", "--db", db, "--log", side, "--session", sid, "--approval-at", "1")

    assert done["stop_reason"] == "final"
    by_call = {o["call"]: o for o in done["state"]["observed"]}
    assert by_call["s1-publish"] == {"call": "s1-publish", "tool": "publish", "ok": False, "error_kind": "rejected"}
    assert ("begin", "publish", "s1-publish") not in sa.read_side_log(side)
    composition = sa.make_composition(db, side, approval_at=1)
    graph = composition.restore(sid).inspect().work_graph
    assert graph is not None
    step1 = next(s for s in graph["steps"] if s["work_item"] == "step-1")
    assert {c["work_item"]: c["outcome"] for c in step1["tool_calls"]}["s1-publish"] == "rejected"


def test_approving_a_call_that_is_not_waiting_fails_naming_the_waiting_calls(tmp_path: Path) -> None:
    db, side = _paths(tmp_path)
    composition = sa.make_composition(db, side, approval_at=0)
    session = composition.session("Index notes", target=2)
    assert session.run().state.stop_reason == "awaiting_approval"

    try:
        session.approve("s9-publish")
    except ConfigurationError as exc:
        assert "s9-publish" in str(exc) and "s0-publish" in str(exc)
    else:
        raise AssertionError("approving an unknown call did not fail")
    assert session.inspect().lifecycle.value == "awaiting_approval"


def test_four_processes_racing_run_on_one_session_exactly_one_executes(tmp_path: Path) -> None:
    db, side = _paths(tmp_path)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    composition = sa.make_composition(db, side)
    sid = composition.session("Race", target=6).session_id.value
    racers = ["a", "b", "c", "d"]
    common = ["--db", db, "--log", side, "--session", sid, "--sleep", "0.05", "--target", "6"]
    common += ["--start-barrier", str(barrier), "--parties", str(len(racers))]
    procs = [sa.start_cli("run", *common, "--name", name) for name in racers]
    outcomes = [sa.finish_cli(p) for p in procs]

    winners = [o for o in outcomes if o["ok"]]
    losers = [o for o in outcomes if not o["ok"]]
    assert len(winners) == 1, outcomes
    assert winners[0]["final_result"] == "6 notes"
    assert len(losers) == 3
    for loser in losers:
        # Refused before anything executed, naming the runner that holds the session.
        assert loser["error"] == "SessionBusyError", loser
        assert loser["session_id"] == sid and loser["owner"] and loser["expires_at"] > 0
        assert loser["owner"] in loser["message"]
    log = sa.read_side_log(side)
    begun = Counter(call for event, _, call in log if event == "begin")
    assert begun and all(count == 1 for count in begun.values()), begun  # no side effect twice
    assert len(begun) == 12
    final = composition.restore(sid).inspect()
    assert final.snapshot_integrity == "verified"
    assert final.budget["used"]["steps"] == 7


def test_a_stalled_runner_loses_its_lease_another_finishes_and_the_stalled_one_cannot_commit(
    tmp_path: Path,
) -> None:
    db, side = _paths(tmp_path)
    progress = str(tmp_path / "progress.log")
    composition = sa.make_composition(db, side, lease_ttl=1.0)
    sid = composition.session("Stall", target=6).session_id.value
    zombie = sa.start_cli(
        "run", "--db", db, "--log", side, "--session", sid, "--target", "6", "--sleep", "0.4",
        "--lease-ttl", "1.0", "--progress-log", progress,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "decide 2 -" not in (Path(progress).read_text() if Path(progress).exists() else ""):
            assert time.monotonic() < deadline, "the runner never reached step 2"
            time.sleep(0.01)
        time.sleep(0.1)  # inside step 2's first (non-idempotent) tool call
        os.kill(zombie.pid, signal.SIGSTOP)  # alive, but it neither renews nor writes
        time.sleep(1.3)  # the lease expires
        taker = sa.make_composition(db, side, lease_ttl=1.0, sleep=0.0).restore(sid)
        result = taker.run()
        assert result.state.final_result == "6 notes"
        assert result.state.steps_done == list(range(6))
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
    out = sa.finish_cli(zombie)
    assert not out["ok"] and out["error"] == "LeaseLostError", out  # the zombie's next write was refused
    log = sa.read_side_log(side)
    begun = Counter(call for event, _, call in log if event == "begin")
    assert all(count == 1 for count in begun.values()), begun  # nothing ran twice
    interrupted = [o for o in result.state.observed if o["error_kind"] == "interrupted"]
    assert [o["call"] for o in interrupted] == ["s2-append"]  # reported to the agent, not repeated
    head = composition.runtime.checkpoint_store.get_session_head(sid)
    assert head is not None
    assert composition.restore(sid).inspect().snapshot_integrity == "verified"
    assert composition.restore(sid).run().state.steps_done == list(range(6))  # the zombie changed nothing


def test_eight_processes_running_eight_sessions_on_one_file_all_complete(tmp_path: Path) -> None:
    db, _ = _paths(tmp_path)  # the file does not exist yet: the processes also race to create it
    target = 15
    procs = [
        sa.start_cli(
            "run", "--db", db, "--log", str(tmp_path / f"side{i}.log"), "--target", str(target), "--note-bytes", "512"
        )
        for i in range(8)
    ]
    results = [sa.finish_cli(p, timeout=300) for p in procs]  # fails on "database is locked" in the output

    for result in results:
        assert result["stop_reason"] == "final", result
        assert result["state"]["steps_done"] == list(range(target))
        assert "locked" not in result["_stderr"].lower()
    store = SqliteCheckpointStore(db)
    heads = {h.session_id: h for h in store.list_sessions()}
    assert set(heads) == {r["session_id"] for r in results}
    assert all(h.lifecycle == "completed" for h in heads.values())
    composition = sa.make_composition(db, str(tmp_path / "side.log"))
    for sid in heads:
        assert composition.restore(sid).inspect().snapshot_integrity == "verified"
    store.close()


def test_long_list_fields_stored_as_runs_resume_in_another_process_with_the_same_state(tmp_path: Path) -> None:
    db, side = _paths(tmp_path)
    kwargs = {"note_bytes": 1024, "tools_every": 0}
    expected = _reference(tmp_path, 150, **kwargs)

    first = sa.run_cli(
        "run", "--db", db, "--log", side, "--target", "150", "--note-bytes", "1024", "--tools-every", "0",
        "--pause-at", "90",
    )  # fmt: skip
    assert first["stop_reason"] == "paused"
    with SqliteCheckpointStore(db) as store:
        bases = [
            s for sid in store.list_session_snapshots(first["session_id"])
            if (s := SnapshotPayload.of(store.get_snapshot(sid))).state_chunks
        ]  # fmt: skip
    assert len(bases) >= 2, "90 KiB of notes should have produced bases with the notes stored as runs"
    newer, older = bases[0].state_chunks["notes"], bases[1].state_chunks["notes"]
    assert newer[: len(older) - 1] == older[:-1]  # the newer base reuses the older one's closed runs

    second = sa.run_cli(
        "run", "--db", db, "--log", side, "--session", first["session_id"], "--note-bytes", "1024", "--tools-every", "0"
    )

    assert second["stop_reason"] == "final"
    assert second["state"] == expected
