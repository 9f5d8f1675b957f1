"""Every row a restore trusts is verified: one flipped byte anywhere is detected and named.

A real session on a real SQLite file, killed with kill -9 inside a step (so the step's decision,
tool starts and a tool result are pending writes), then one byte of one row is flipped with plain
sqlite3, as a disk or an outside writer would. Restoring, running or inspecting must name the
table, the row and the session (IntegrityError), never restore wrong data as "verified" and never
run a tool again because a damaged row hid that it had started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import session_agents as sa
from pg_server import drop_schema, fresh_schema
from qitos.core._errors import IntegrityError

Flip = Callable[[bytes], bytes]


def _flip_one_byte(index: int, new: int) -> Flip:
    def flip(raw: bytes) -> bytes:
        return raw[:index] + bytes([new]) + raw[index + 1 :]

    return flip


def _killed_mid_step(tmp_path: Path, db: str | None = None) -> tuple[str, str, str]:
    """A session killed inside step 2's second tool call (index_note), after append_note's result
    (in a SQLite file, or in the store ``db`` names)."""
    side, marker = str(tmp_path / "side.log"), str(tmp_path / "hang")
    db = db or str(tmp_path / "s.db")
    composition = sa.make_composition(db, side)
    session = composition.session("Index notes", target=4)
    sid = session.session_id.value
    session.steer("keep it short")
    composition.runtime.checkpoint_store.close()
    proc = sa.start_cli(
        "run", "--db", db, "--log", side, "--session", sid, "--target", "4", "--hang-at", "2",
        "--hang-marker", marker, "--hang-tool", "index_note",
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not os.path.exists(marker):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never reached the hang"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    return db, side, sid


def _rewrite(db: str, sql_select: str, sql_update: str, params: tuple[object, ...], flip: Flip) -> None:
    with sqlite3.connect(db) as con:
        (raw,) = con.execute(sql_select, params).fetchone()
        data = raw.encode("utf-8") if isinstance(raw, str) else bytes(raw)
        changed = flip(data)
        assert changed != data
        value: object = changed  # kept as bytes when it is no longer valid text (a flipped high bit)
        if isinstance(raw, str):
            with contextlib.suppress(UnicodeDecodeError):
                value = changed.decode("utf-8")
        assert con.execute(sql_update, (value, *params)).rowcount == 1


def _write_row(key: str, kind: str) -> tuple[str, str, tuple[object, ...]]:
    return (
        "SELECT {col} FROM writes WHERE kind = ? AND key = ?",
        "UPDATE writes SET {col} = ? WHERE kind = ? AND key = ?",
        (kind, key),
    )


@pytest.fixture
def killed(tmp_path: Path) -> tuple[str, str, str]:
    return _killed_mid_step(tmp_path)


def _check_detected(db: str, side: str, sid: str, table: str, row: str) -> None:
    begun_before = sa.read_side_log(side)
    composition = sa.make_composition(db, side)
    with pytest.raises(IntegrityError) as on_run:
        composition.restore(sid).run()
    error = on_run.value
    assert (error.table, error.session_id) == (table, sid), str(error)
    assert row in error.row and table in str(error) and sid in str(error)
    assert sa.read_side_log(side) == begun_before  # nothing ran on damaged data
    inspection = composition.restore(sid).inspect()
    assert inspection.snapshot_integrity.startswith("corrupt:") and table in inspection.snapshot_integrity
    composition.runtime.checkpoint_store.close()


def test_the_killed_session_restores_verified_without_damage(killed: tuple[str, str, str]) -> None:
    db, side, sid = killed
    composition = sa.make_composition(db, side)
    assert composition.restore(sid).inspect().snapshot_integrity == "verified"
    result = composition.restore(sid).run()
    assert result.state.steps_done == list(range(4))
    assert result.state.steering_seen == ["keep it short"]
    begins = [call for event, tool, call in sa.read_side_log(side) if event == "begin" and tool == "append_note"]
    assert sorted(begins) == [f"s{i}-append" for i in range(4)]  # s2-append's result was recorded: not re-run


def test_a_flipped_byte_in_a_recorded_tool_result_is_detected(killed: tuple[str, str, str]) -> None:
    db, side, sid = killed
    select, update, params = _write_row("s2-append", "tool_result")
    # The result's text "noted 16 chars at step 2" becomes "noted 16 chars at step 3".
    with sqlite3.connect(db) as con:
        (payload,) = con.execute(select.format(col="payload"), params).fetchone()
    index = payload.index("step 2") + 5
    _rewrite(db, select.format(col="payload"), update.format(col="payload"), params, _flip_one_byte(index, ord("3")))
    _check_detected(db, side, sid, "writes", "tool_result/s2-append")


def test_a_flipped_byte_in_a_decision_rows_kind_is_detected_and_no_call_runs_twice(
    killed: tuple[str, str, str],
) -> None:
    db, side, sid = killed
    select, update, params = _write_row("s2-append", "tool_started")
    # "tool_started" becomes "tool_ctarted": the start of the non-idempotent call would vanish.
    _rewrite(db, select.format(col="kind"), update.format(col="kind"), params, _flip_one_byte(5, ord("c")))
    _check_detected(db, side, sid, "writes", "tool_ctarted/s2-append")


def test_a_flipped_high_bit_in_a_pending_write_is_detected_not_a_decode_error(killed: tuple[str, str, str]) -> None:
    db, side, sid = killed
    select, update, params = _write_row("s2-append", "tool_result")
    _rewrite(db, select.format(col="payload"), update.format(col="payload"), params, _flip_one_byte(3, 0xC3))
    _check_detected(db, side, sid, "writes", "s2-append")


def test_a_flipped_byte_in_the_head_rows_lifecycle_is_detected(killed: tuple[str, str, str]) -> None:
    db, side, sid = killed
    with sqlite3.connect(db) as con:
        con.execute("UPDATE heads SET lifecycle = 'crdated' WHERE session_id = ?", (sid,))
    composition = sa.make_composition(db, side)
    with pytest.raises(IntegrityError) as caught:
        composition.restore(sid)
    assert (caught.value.table, caught.value.row, caught.value.session_id) == ("heads", sid, sid)
    with pytest.raises(IntegrityError, match="heads"):
        composition.runtime.checkpoint_store.list_sessions()


def test_a_flipped_byte_in_the_task_is_detected_not_shown_as_verified(killed: tuple[str, str, str]) -> None:
    db, side, sid = killed
    select = "SELECT metadata FROM sessions WHERE session_id = ?"
    update = "UPDATE sessions SET metadata = ? WHERE session_id = ?"
    with sqlite3.connect(db) as con:
        (metadata,) = con.execute(select, (sid,)).fetchone()
    index = metadata.index("Index notes")
    _rewrite(db, select, update, (sid,), _flip_one_byte(index, ord("J")))
    composition = sa.make_composition(db, side)
    with pytest.raises(IntegrityError) as caught:
        composition.restore(sid)
    assert (caught.value.table, caught.value.session_id) == ("sessions", sid)


def test_a_flipped_byte_in_a_steering_item_is_detected(killed: tuple[str, str, str]) -> None:
    db, side, sid = killed
    select = "SELECT payload FROM control WHERE session_id = ? AND position = 1"
    update = "UPDATE control SET payload = ? WHERE session_id = ? AND position = 1"
    with sqlite3.connect(db) as con:
        (payload,) = con.execute(select, (sid,)).fetchone()
    _rewrite(db, select, update, (sid,), _flip_one_byte(payload.index("short"), ord("S")))
    composition = sa.make_composition(db, side)
    inspection = composition.restore(sid).inspect()
    assert "control row 1" in inspection.snapshot_integrity and sid in inspection.snapshot_integrity
    with pytest.raises(IntegrityError) as caught:
        composition.runtime.checkpoint_store.list_control(sid)
    assert (caught.value.table, caught.value.row) == ("control", "1")


def test_a_lost_steering_item_is_reported_missing_not_skipped(killed: tuple[str, str, str]) -> None:
    db, side, sid = killed
    with sqlite3.connect(db) as con:  # as a truncated file loses the page holding it
        con.execute("DELETE FROM control WHERE session_id = ? AND position = 1", (sid,))
    composition = sa.make_composition(db, side)
    with pytest.raises(IntegrityError, match="missing") as caught:
        composition.runtime.checkpoint_store.list_control(sid)
    assert (caught.value.table, caught.value.row, caught.value.session_id) == ("control", "1", sid)
    assert "missing" in composition.restore(sid).inspect().snapshot_integrity


# --------------------------------------------------------------------------- the key columns of a pending write
# A pending write is found by its key (session, base snapshot); a row whose key was altered is not
# found at all, so its own digest cannot speak for it. The head's tally of its step's writes does.


@pytest.mark.parametrize("column", ["base_snapshot_id", "session_id"])
def test_one_changed_character_in_a_pending_writes_key_is_detected_and_no_call_runs_twice(
    killed: tuple[str, str, str], column: str
) -> None:
    db, side, sid = killed
    select, update, params = _write_row("s2-append", "tool_started")
    # "ses_..." becomes "sesZ...", a hex snapshot id gets a "Z": the start of s2-append would vanish.
    _rewrite(db, select.format(col=column), update.format(col=column), params, _flip_one_byte(3, ord("Z")))
    _check_detected(db, side, sid, "writes", "step on")


def test_a_lost_pending_write_is_reported_missing_not_taken_for_a_call_that_never_started(
    killed: tuple[str, str, str],
) -> None:
    db, side, sid = killed
    with sqlite3.connect(db) as con:  # as a damaged page or a rolled-back log loses the row holding it
        assert con.execute("DELETE FROM writes WHERE kind = 'tool_started' AND key = 's2-append'").rowcount == 1
    _check_detected(db, side, sid, "writes", "step on")
    inspection = sa.make_composition(db, side).restore(sid).inspect()
    assert "records 3 pending write(s) of its unfinished step, 2 are stored" in inspection.snapshot_integrity


def test_a_damaged_tally_in_the_head_row_is_detected(killed: tuple[str, str, str]) -> None:
    db, side, sid = killed
    with sqlite3.connect(db) as con:
        assert con.execute("UPDATE heads SET writes_count = 2 WHERE session_id = ?", (sid,)).rowcount == 1
    _check_detected(db, side, sid, "writes", "step on")


def test_a_finished_step_leaves_no_pending_writes_behind(killed: tuple[str, str, str]) -> None:
    db, side, sid = killed
    composition = sa.make_composition(db, side)
    composition.restore(sid).run()
    composition.runtime.checkpoint_store.close()
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT COUNT(*) FROM writes").fetchone() == (0,)
        assert con.execute("SELECT writes_count, writes_digest FROM heads").fetchall() == [(0, "")]


@pytest.mark.parametrize("column", ["base_snapshot_id", "session_id"])
def test_on_postgresql_a_changed_key_of_a_pending_write_is_detected_and_no_call_runs_twice(
    tmp_path: Path, pg_dsn: str, column: str
) -> None:
    import psycopg

    schema = fresh_schema()
    db = f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}schema={schema}"
    try:
        _, side, sid = _killed_mid_step(tmp_path, db)
        with psycopg.connect(pg_dsn, autocommit=True) as con:
            where = f'FROM "{schema}".writes WHERE kind = %s AND key = %s'
            row = con.execute(f"SELECT {column} {where}", ("tool_started", "s2-append")).fetchone()
            assert row is not None
            (value,) = row
            changed = value[:3] + "Z" + value[4:]
            updated = con.execute(f'UPDATE "{schema}".writes SET {column} = %s WHERE kind = %s AND key = %s',
                                  (changed, "tool_started", "s2-append"))  # fmt: skip
            assert updated.rowcount == 1
        _check_detected(db, side, sid, "writes", "step on")
    finally:
        drop_schema(pg_dsn, schema)


def test_on_postgresql_the_writes_of_a_committed_step_are_deleted_with_its_commit(tmp_path: Path, pg_dsn: str) -> None:
    import psycopg

    schema = fresh_schema()
    db = f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}schema={schema}"
    try:
        composition = sa.make_composition(db, str(tmp_path / "side.log"), approval_at=2)
        session = composition.session("Index notes", target=4)
        session.run()  # steps 0 and 1 ran their calls; step 2 waits for the approval of its publish call
        with psycopg.connect(pg_dsn, autocommit=True) as con:
            left = con.execute(f'SELECT count(*) FROM "{schema}".writes').fetchone()
            tally = con.execute(f'SELECT writes_count FROM "{schema}".heads').fetchall()
        assert left == (0,) and tally == [(0,)]  # the waiting step's calls so far are in its snapshot
        session.approve("s2-publish")
        assert session.run().state.steps_done == list(range(4))
        with psycopg.connect(pg_dsn, autocommit=True) as con:
            assert con.execute(f'SELECT count(*) FROM "{schema}".writes').fetchone() == (0,)
        composition.runtime.checkpoint_store.close()
    finally:
        drop_schema(pg_dsn, schema)
