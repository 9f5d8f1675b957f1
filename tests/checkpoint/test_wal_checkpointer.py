"""Background WAL checkpoints: commits stop paying for them, and nothing is lost when they run."""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

from qitos.checkpoint._records import SessionSnapshot, SessionSnapshotCommit
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.checkpoint._wal_checkpointer import SAFETY_NET_PAGES, WalCheckpointer


def _commit_steps(store: SqliteCheckpointStore, steps: int) -> list[str]:
    first = SessionSnapshot.create(session_id="s", parent_id=None, base_id=None, sequence=0, payload={"full": {}})
    store.commit_session_snapshot(
        SessionSnapshotCommit(session_id="s", expected_head=None, snapshot=first, lifecycle="created")
    )
    ids = [first.snapshot_id]
    for i in range(1, steps + 1):
        nxt = SessionSnapshot.create(
            session_id="s", parent_id=ids[-1], base_id=ids[0], sequence=i, payload={"note": f"{i:04d} " + "x" * 900}
        )
        store.commit_session_snapshot(
            SessionSnapshotCommit(session_id="s", expected_head=ids[-1], snapshot=nxt, lifecycle="running")
        )
        ids.append(nxt.snapshot_id)
    return ids


def _wait_for(predicate: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(predicate) and predicate():
            return True
        time.sleep(0.01)
    return False


def test_committed_pages_reach_the_main_file_without_a_commit_checkpointing(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    store = SqliteCheckpointStore(db, compress_min_bytes=None)  # ~1 KB per row, as written
    _commit_steps(store, 300)  # ~300 commits: far below the writer's own safety-net checkpoint
    checkpointer = store._checkpointer
    assert checkpointer is not None
    assert _wait_for(lambda: checkpointer.checkpoints >= 2), "the background thread never checkpointed"
    assert checkpointer.last_error is None
    # The main file holds the copied pages: more than the empty schema's few pages.
    assert db.stat().st_size > 30 * 8192  # ~300 KB of payloads; an empty schema is a few pages
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 1000  # a new connection's default
    assert store._conn is not None
    assert store._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == SAFETY_NET_PAGES
    store.close()
    assert checkpointer._thread is not None and not checkpointer._thread.is_alive()


def test_every_commit_reads_back_after_background_checkpoints_and_reopen(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    with SqliteCheckpointStore(db) as store:
        ids = _commit_steps(store, 400)
    with SqliteCheckpointStore(db) as store:
        chain = store.load_chain(ids[-1])
        assert [s.snapshot_id for s in chain] == ids
        assert chain[-1].payload["note"].startswith("0400 ")
        head = store.get_session_head("s")
        assert head is not None and head.snapshot_id == ids[-1]


def test_a_failing_checkpoint_is_recorded_and_does_not_stop_the_thread(tmp_path: Path) -> None:
    calls: list[int] = []

    def connect() -> sqlite3.Connection:
        calls.append(1)
        if len(calls) == 1:
            raise sqlite3.OperationalError("unable to open database file")
        return sqlite3.connect(tmp_path / "ok.db")

    checkpointer = WalCheckpointer(connect, every=1)
    checkpointer.committed()
    assert _wait_for(lambda: checkpointer.last_error is not None)
    checkpointer.committed()
    assert _wait_for(lambda: checkpointer.checkpoints == 1)
    checkpointer.close()


def test_a_forked_child_commits_with_its_own_checkpointer(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    store = SqliteCheckpointStore(db)
    ids = _commit_steps(store, 130)
    parent_checkpointer = store._checkpointer
    pid = os.fork()
    if pid == 0:  # child: must not touch the parent's thread or connection
        code = 1
        try:
            nxt = SessionSnapshot.create(
                session_id="s", parent_id=ids[-1], base_id=ids[0], sequence=len(ids), payload={"note": "child"}
            )
            store.commit_session_snapshot(
                SessionSnapshotCommit(session_id="s", expected_head=ids[-1], snapshot=nxt, lifecycle="running")
            )
            code = 0 if store._checkpointer is not parent_checkpointer and store._checkpointer is not None else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    head = store.get_session_head("s")
    assert head is not None and head.sequence == len(ids)
    store.close()


def test_forking_while_checkpoints_run_never_leaves_the_child_hung(tmp_path: Path) -> None:
    # A child forked while the thread is inside SQLite would inherit SQLite's mutexes locked.
    db = tmp_path / "sessions.db"
    store = SqliteCheckpointStore(db, compress_min_bytes=None)
    _commit_steps(store, 200)
    checkpointer = store._checkpointer
    assert checkpointer is not None
    stop = threading.Event()

    def storm() -> None:  # keep the thread checkpointing back to back
        while not stop.is_set():
            checkpointer.committed()

    side = threading.Thread(target=storm, daemon=True)
    side.start()
    hung = 0
    try:
        for _ in range(40):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = 0 if store.get_session_head("s") is not None else 2
                finally:
                    os._exit(code)
            deadline = time.monotonic() + 10.0
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    assert os.waitstatus_to_exitcode(status) == 0
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    hung += 1
                    break
                time.sleep(0.002)
    finally:
        stop.set()
        side.join()
        store.close()
    assert hung == 0, f"{hung} of 40 forked children hung"
