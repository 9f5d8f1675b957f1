"""Sessions stored by earlier qitos versions still restore, inspect, resume and finish.

``golden/format1.db`` was written by the code before snapshot format 2 (f2d125d^), and
``golden/format2.db`` by the code before leases and verified rows (4bfd7d8); both are schema 2
files (see ``golden/sessions.json``). Each holds a finished session, one awaiting approval with a
steering item taken in, and one whose long list field is stored as runs. The test opens a copy (the
store migrates it to today's schema, backfilling row digests) and checks every promise.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

import session_agents as sa
from qitos.checkpoint._sqlite_store import SCHEMA_VERSION
from qitos.core._state import StopReason
from qitos.engine._composition import compose
from qitos.engine.runtime import RuntimeBudget
from qitos.sessions._step_journal import restore

GOLDEN = Path(__file__).with_name("golden")
SESSIONS = json.loads((GOLDEN / "sessions.json").read_text(encoding="utf-8"))


@pytest.fixture(params=["format1", "format2"])
def golden(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str, dict[str, str]]:
    db = tmp_path / f"{request.param}.db"
    shutil.copyfile(GOLDEN / f"{request.param}.db", db)
    return str(db), str(tmp_path / "side.log"), SESSIONS[request.param]


def test_an_old_file_is_migrated_and_every_session_verifies(golden: tuple[str, str, dict[str, str]]) -> None:
    db, side, ids = golden
    composition = sa.make_composition(db, side)
    for key in ("finished", "awaiting", "big"):
        assert composition.restore(ids[key]).inspect().snapshot_integrity == "verified", key
    composition.runtime.checkpoint_store.close()
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] == SCHEMA_VERSION
    composition = sa.make_composition(db, side)
    finished = composition.restore(ids["finished"]).inspect()
    assert finished.lifecycle.value == "completed" and finished.task == "Index notes (finished)"
    assert finished.budget["used"]["steps"] == 4


def test_an_old_session_awaiting_approval_is_approved_and_finishes(golden: tuple[str, str, dict[str, str]]) -> None:
    db, side, ids = golden
    composition = sa.make_composition(db, side, approval_at=1)
    session = composition.restore(ids["awaiting"])
    inspection = session.inspect()
    assert inspection.lifecycle.value == "awaiting_approval"
    assert inspection.tool_batch is not None
    assert [c.call_id for c in inspection.tool_batch.pending_approval] == ["s1-publish"]
    session.approve("s1-publish")
    result = session.run()
    assert result.state.final_result == "3 notes"
    assert result.state.steering_seen == ["mind the index"]  # taken in before it was stored, never again
    assert [e for e in sa.read_side_log(side) if e[1] == "publish"] == [
        ("begin", "publish", "s1-publish"),
        ("end", "publish", "s1-publish"),
    ]


def test_an_old_session_with_runs_continues_and_forks(golden: tuple[str, str, dict[str, str]]) -> None:
    db, side, ids = golden
    composition = sa.make_composition(db, side, note_bytes=1500, tools_every=0)
    session = composition.restore(ids["big"])
    state = session.inspect()
    assert state.budget["used"]["steps"] == 71
    child = session.fork()
    child.steer("one more look")
    assert child.inspect().snapshot_integrity == "verified"
    assert child.run().state.final_result == "70 notes"


def test_an_old_session_stopped_as_budget_steps_reads_and_resumes(tmp_path: Path) -> None:
    # Written when a step limit from a budget stopped a run as "budget_steps" (now one name for
    # running out of steps, max_steps_reached): it still verifies, reads as stopped, and resumes.
    db = tmp_path / "budget_steps.db"
    shutil.copyfile(GOLDEN / "budget_steps.db", db)
    side = str(tmp_path / "side.log")
    composition = compose(agent=lambda: sa.NotesAgent(side), store=str(db), budget=RuntimeBudget(max_steps=10))
    session = composition.restore(SESSIONS["budget_steps"]["stopped"])
    inspection = session.inspect()
    assert inspection.snapshot_integrity == "verified"
    assert inspection.lifecycle.value == "stopped" and inspection.budget["used"]["steps"] == 2
    stored = restore(session.store, session.session_id.value, inspection.head.snapshot_id)
    assert stored.state_data["stop_reason"] == "budget_steps"  # the old name, as it was stored
    result = session.run()  # a stop for want of steps is resumable, under either name
    assert result.state.final_result == "3 notes" and result.state.current_step == 4
    assert StopReason(result.state.stop_reason) is StopReason.FINAL
    composition.runtime.checkpoint_store.close()
