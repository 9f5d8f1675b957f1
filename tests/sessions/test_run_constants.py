"""The task and other run constants are stored once per session, never rewritten per step."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import session_agents as sa


def _wal_bytes_of_a_run(tmp_path: Path, task: str, steps: int) -> int:
    """How far the write-ahead log grew while the session ran ``steps`` tool-free steps.

    The log is emptied after the session is created, so it holds only what the steps wrote (SQLite
    reuses it from the start after a checkpoint, so its size is the high-water mark of a run's writes).
    """
    db, side = str(tmp_path / "s.db"), str(tmp_path / "side.log")
    composition = sa.make_composition(db, side, tools_every=0)
    session = composition.session(task, target=steps)
    with sqlite3.connect(db) as con:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert Path(db + "-wal").stat().st_size == 0
    session.run()
    grown = Path(db + "-wal").stat().st_size
    composition.runtime.checkpoint_store.close()
    return grown


def test_a_ten_megabyte_task_does_not_change_what_a_step_writes(tmp_path: Path) -> None:
    (tmp_path / "small").mkdir()
    (tmp_path / "large").mkdir()
    small = _wal_bytes_of_a_run(tmp_path / "small", "Index notes", steps=30)
    large = _wal_bytes_of_a_run(tmp_path / "large", "Index notes. " + "x" * 10_000_000, steps=30)
    # Each step writes the same small delta either way: the head row that every commit rewrites
    # does not carry the task (before, each step rewrote all 10 MB of it).
    assert large <= 2 * small + 64 * 1024, (small, large)
    assert large < 1_000_000, large
