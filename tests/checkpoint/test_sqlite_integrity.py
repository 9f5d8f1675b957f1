"""SqliteCheckpointStore on damaged, foreign, older and newer database files, and its settings.

Damage is done with plain ``sqlite3`` on the real file, as a disk error or a stray tool would.
"""

from __future__ import annotations

import functools
import hashlib
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from qitos.checkpoint._packing import unpack
from qitos.checkpoint._records import (
    BlobIntegrityError,
    SessionSnapshot,
    SessionSnapshotCommit,
    SnapshotNotFoundError,
    StepWrite,
)
from qitos.checkpoint._sqlite_store import SCHEMA_VERSION, SqliteCheckpointStore
from qitos.core._errors import CheckpointError, ConfigurationError, SnapshotIntegrityError


def _session(store: SqliteCheckpointStore, steps: int = 3) -> list[SessionSnapshot]:
    snaps = [SessionSnapshot.create(session_id="s", parent_id=None, base_id=None, sequence=0, payload={"full": {}})]
    store.commit_session_snapshot(
        SessionSnapshotCommit(session_id="s", expected_head=None, snapshot=snaps[0], lifecycle="created")
    )
    for i in range(1, steps + 1):
        nxt = SessionSnapshot.create(
            session_id="s",
            parent_id=snaps[-1].snapshot_id,
            base_id=snaps[0].snapshot_id,
            sequence=i,
            payload={"ops": [{"append": f"note {i}"}]},
        )
        store.commit_session_snapshot(
            SessionSnapshotCommit(
                session_id="s", expected_head=snaps[-1].snapshot_id, snapshot=nxt, lifecycle="running"
            )
        )
        snaps.append(nxt)
    return snaps


def _tamper(path: Path, sql: str, *params: object) -> None:
    with sqlite3.connect(path) as conn:
        assert conn.execute(sql, params).rowcount == 1


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "sessions.db"


def test_an_overwritten_payload_is_detected_naming_the_snapshot(db: Path) -> None:
    with SqliteCheckpointStore(db) as store:
        snaps = _session(store)
    victim = snaps[2].snapshot_id
    _tamper(db, "UPDATE snapshots SET payload = ? WHERE snapshot_id = ?", '{"ops":[{"append":"forged"}]}', victim)
    with SqliteCheckpointStore(db) as store:
        with pytest.raises(SnapshotIntegrityError) as caught:
            store.get_snapshot(victim)
        assert caught.value.snapshot_id == victim
        assert victim in str(caught.value) and "altered" in str(caught.value)
        with pytest.raises(SnapshotIntegrityError) as in_chain:
            store.load_chain(snaps[3].snapshot_id)
        assert in_chain.value.snapshot_id == victim
        assert store.load_chain(snaps[1].snapshot_id) == snaps[:2]  # undamaged prefix still restores


@pytest.mark.parametrize(
    "garbage",
    [b"\xff\xfe not utf-8 \x80", b"{truncated", b""],
    ids=["invalid-utf8", "truncated-json", "empty"],
)
def test_undecodable_payload_bytes_are_detected_naming_the_snapshot(db: Path, garbage: bytes) -> None:
    with SqliteCheckpointStore(db) as store:
        snaps = _session(store)
    victim = snaps[1].snapshot_id
    _tamper(db, "UPDATE snapshots SET payload = ? WHERE snapshot_id = ?", garbage, victim)
    with SqliteCheckpointStore(db) as store:
        with pytest.raises(SnapshotIntegrityError) as caught:
            store.get_snapshot(victim)
        assert caught.value.snapshot_id == victim


def test_altered_metadata_columns_are_detected(db: Path) -> None:
    with SqliteCheckpointStore(db) as store:
        snaps = _session(store)
    _tamper(db, "UPDATE snapshots SET sequence = 99 WHERE snapshot_id = ?", snaps[1].snapshot_id)
    _tamper(db, "UPDATE snapshots SET created_at = 'yesterday' WHERE snapshot_id = ?", snaps[2].snapshot_id)
    _tamper(db, "UPDATE snapshots SET session_id = CAST(X'FF00' AS TEXT) WHERE snapshot_id = ?", snaps[3].snapshot_id)
    with SqliteCheckpointStore(db) as store:
        for victim in snaps[1:]:
            with pytest.raises(SnapshotIntegrityError) as caught:
                store.get_snapshot(victim.snapshot_id)
            assert caught.value.snapshot_id == victim.snapshot_id


def test_a_corrupted_compressed_payload_is_detected(db: Path) -> None:
    big = {"full": {"text": "compressible " * 4000}}
    with SqliteCheckpointStore(db, compress_min_bytes=1024) as store:
        first = SessionSnapshot.create(session_id="s", parent_id=None, base_id=None, sequence=0, payload=big)
        store.commit_session_snapshot(
            SessionSnapshotCommit(session_id="s", expected_head=None, snapshot=first, lifecycle="created")
        )
        assert store.get_snapshot(first.snapshot_id).payload == big
    with sqlite3.connect(db) as conn:
        encoding, stored = conn.execute("SELECT encoding, payload FROM snapshots").fetchone()
    assert encoding == "zstd" and len(stored) < 1000  # compressed on disk
    assert (
        unpack(stored)
        == SessionSnapshot.create(session_id="s", parent_id=None, base_id=None, sequence=0, payload=big)
        .canonical_payload()
        .encode()
    )
    _tamper(db, "UPDATE snapshots SET payload = ? WHERE snapshot_id = ?", stored[:-8] + b"\x00" * 8, first.snapshot_id)
    with SqliteCheckpointStore(db) as store, pytest.raises(SnapshotIntegrityError) as caught:
        store.get_snapshot(first.snapshot_id)
    assert caught.value.snapshot_id == first.snapshot_id


def test_small_payloads_are_stored_as_readable_json_text(db: Path) -> None:
    with SqliteCheckpointStore(db) as store:
        snaps = _session(store, steps=1)
    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "SELECT encoding, typeof(payload), payload FROM snapshots WHERE snapshot_id = ?", (snaps[1].snapshot_id,)
        ).fetchone()
    assert row == ("json", "text", '{"ops":[{"append":"note 1"}]}')


def test_a_missing_ancestor_fails_the_chain_naming_it(db: Path) -> None:
    with SqliteCheckpointStore(db) as store:
        snaps = _session(store)
    _tamper(db, "DELETE FROM snapshots WHERE snapshot_id = ?", snaps[1].snapshot_id)
    with SqliteCheckpointStore(db) as store:
        with pytest.raises(SnapshotIntegrityError) as caught:
            store.load_chain(snaps[3].snapshot_id)
        assert caught.value.snapshot_id == snaps[3].snapshot_id
        assert snaps[1].snapshot_id in str(caught.value)


def test_a_corrupted_blob_is_detected_on_read(db: Path) -> None:
    data = b"tool output"
    key = hashlib.sha256(data).hexdigest()
    with SqliteCheckpointStore(db) as store:
        store.put_blobs({key: data})
    _tamper(db, "UPDATE blobs SET data = ? WHERE digest = ?", b"tool 0utput", key)
    with SqliteCheckpointStore(db) as store, pytest.raises(BlobIntegrityError) as caught:
        store.get_blobs([key])
    assert caught.value.digest == key


# --------------------------------------------------------------------------- schema versions

# The version-1 schema exactly as it was first released; never edit (it is history).
_V1_SCHEMA = [
    "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)",
    "CREATE TABLE snapshots (snapshot_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, "
    "parent_id TEXT, base_id TEXT, sequence INTEGER NOT NULL, created_at TEXT NOT NULL, "
    "payload TEXT NOT NULL)",
    "CREATE TABLE heads (session_id TEXT PRIMARY KEY, snapshot_id TEXT NOT NULL, "
    "sequence INTEGER NOT NULL, lifecycle TEXT NOT NULL, updated_at TEXT NOT NULL, metadata TEXT NOT NULL)",
    "CREATE TABLE writes (session_id TEXT NOT NULL, base_snapshot_id TEXT NOT NULL, "
    "kind TEXT NOT NULL, key TEXT NOT NULL, step_id INTEGER NOT NULL, payload TEXT NOT NULL, "
    "PRIMARY KEY (session_id, base_snapshot_id, kind, key))",
    "CREATE TABLE control (session_id TEXT NOT NULL, position INTEGER NOT NULL, "
    "kind TEXT NOT NULL, payload TEXT NOT NULL, created_at TEXT NOT NULL, "
    "PRIMARY KEY (session_id, position)) WITHOUT ROWID",
    "CREATE TABLE blobs (digest TEXT PRIMARY KEY, data BLOB NOT NULL)",
    "INSERT INTO schema_version VALUES (1, 'initial schema', '2026-01-01T00:00:00.000000Z')",
]


def test_a_version_1_database_is_migrated_and_its_data_kept(db: Path) -> None:
    first = SessionSnapshot.create(
        session_id="old", parent_id=None, base_id=None, sequence=0, payload={"full": {"notes": ["kept"]}}
    )
    with sqlite3.connect(db) as conn:
        for statement in _V1_SCHEMA:
            conn.execute(statement)
        conn.execute(
            "INSERT INTO snapshots VALUES (?, 'old', NULL, NULL, 0, ?, ?)",
            (first.snapshot_id, first.created_at, first.canonical_payload()),
        )
        conn.execute(
            "INSERT INTO heads VALUES ('old', ?, 0, 'paused', 'then', '{\"agent\":\"a\"}')", (first.snapshot_id,)
        )
        conn.execute("INSERT INTO control VALUES ('old', 1, 'steer', '{\"text\":\"hi\"}', 'then')")
    with SqliteCheckpointStore(db) as store:
        assert store.get_snapshot(first.snapshot_id) == first
        head = store.get_session_head("old")
        assert head is not None and (head.lifecycle, dict(head.metadata)) == ("paused", {"agent": "a"})
        assert [item.payload for item in store.list_control("old")] == [{"text": "hi"}]
        child = SessionSnapshot.create(
            session_id="child", parent_id=first.snapshot_id, base_id=None, sequence=0, payload={"full": {}}
        )
        store.commit_session_snapshot(  # uses the version-2 operations table
            SessionSnapshotCommit(
                session_id="child", expected_head=None, snapshot=child, lifecycle="created", operation_id="fork-1"
            )
        )
        assert store.find_session_by_operation("fork-1") == "child"
    with sqlite3.connect(db) as conn:
        versions = conn.execute("SELECT version, name FROM schema_version ORDER BY version").fetchall()
        encodings = conn.execute("SELECT DISTINCT encoding FROM snapshots").fetchall()
    assert [v for v, _ in versions] == list(range(1, SCHEMA_VERSION + 1))
    assert encodings == [("json",)]


def test_a_fresh_database_records_every_migration_once(db: Path) -> None:
    for _ in range(2):
        with SqliteCheckpointStore(db) as store:
            store.list_sessions()
    with sqlite3.connect(db) as conn:
        versions = [v for (v,) in conn.execute("SELECT version FROM schema_version ORDER BY version")]
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    assert versions == list(range(1, SCHEMA_VERSION + 1))
    assert mode == "wal"


def test_a_database_from_a_newer_schema_is_refused(db: Path) -> None:
    with SqliteCheckpointStore(db) as store:
        store.list_sessions()
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO schema_version VALUES (?, 'future', 'later')", (SCHEMA_VERSION + 1,))
    with SqliteCheckpointStore(db) as store, pytest.raises(CheckpointError, match="newer than this qitos supports"):
        store.list_sessions()


def test_a_file_that_is_not_a_database_raises_naming_the_path(db: Path) -> None:
    db.write_bytes(b"this is a text file, not SQLite " * 200)
    with SqliteCheckpointStore(db) as store, pytest.raises(CheckpointError) as caught:
        store.list_sessions()
    assert str(db) in str(caught.value)
    assert not isinstance(caught.value, sqlite3.Error)


def test_a_missing_directory_raises_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "dir" / "sessions.db"
    with SqliteCheckpointStore(path) as store, pytest.raises(CheckpointError, match="is not a directory"):
        store.list_sessions()
    assert not path.parent.exists()


# --------------------------------------------------------------------------- settings and transactions


def test_synchronous_modes_are_applied_and_bad_options_refused(db: Path) -> None:
    for mode, level in [("NORMAL", 1), ("FULL", 2)]:
        with SqliteCheckpointStore(db, synchronous=mode) as store:  # type: ignore[arg-type]
            assert store._read(lambda conn: conn.execute("PRAGMA synchronous").fetchone()[0]) == level
    with pytest.raises(ConfigurationError, match="synchronous"):
        SqliteCheckpointStore(db, synchronous="OFF")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="busy_timeout_ms"):
        SqliteCheckpointStore(db, busy_timeout_ms=-1)
    with pytest.raises(ConfigurationError, match="retry_timeout"):
        SqliteCheckpointStore(db, retry_timeout=0)
    with pytest.raises(ConfigurationError, match="compress_min_bytes"):
        SqliteCheckpointStore(db, compress_min_bytes=-5)


def test_an_interrupt_inside_a_transaction_rolls_it_back(db: Path) -> None:
    with SqliteCheckpointStore(db) as store:
        store.list_sessions()

        def half_done(conn: sqlite3.Cursor) -> None:
            conn.execute(
                "INSERT INTO heads (session_id, snapshot_id, sequence, lifecycle, updated_at) "
                "VALUES ('half', 'x', 0, 'running', 'now')"
            )
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            store._write(half_done)
        assert store.get_session_head("half") is None
        _session(store, steps=1)  # the connection is usable afterwards
        assert [h.session_id for h in store.list_sessions()] == ["s"]


def test_a_lock_held_too_long_becomes_a_checkpoint_error_not_a_raw_sqlite_error(db: Path) -> None:
    with SqliteCheckpointStore(db, busy_timeout_ms=0, retry_timeout=0.3) as store:
        store.list_sessions()
        blocker = sqlite3.connect(db, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            started = time.monotonic()
            with pytest.raises(CheckpointError, match="stayed locked") as caught:
                _session(store, steps=0)
            assert 0.25 <= time.monotonic() - started < 5
            assert not isinstance(caught.value, sqlite3.Error)
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()


def test_a_briefly_held_lock_is_waited_out_by_retries(db: Path) -> None:
    with SqliteCheckpointStore(db, busy_timeout_ms=0, retry_timeout=10) as store:
        store.list_sessions()
        blocker = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        blocker.execute("BEGIN IMMEDIATE")
        release = threading.Timer(0.2, lambda: blocker.execute("ROLLBACK"))
        release.start()
        try:
            snaps = _session(store, steps=1)
        finally:
            release.join()
            blocker.close()
        head = store.get_session_head("s")
        assert head is not None and head.snapshot_id == snaps[-1].snapshot_id


def test_a_pruned_snapshot_is_gone_from_the_file_after_vacuum(db: Path) -> None:
    with SqliteCheckpointStore(db) as store:
        snaps = _session(store, steps=2)
        secret = "unreachable secret " * 500
        dead_end = SessionSnapshot.create(
            session_id="s", parent_id=snaps[-1].snapshot_id, base_id=None, sequence=3, payload={"full": secret}
        )
        rewind = SessionSnapshot.create(
            session_id="s", parent_id=snaps[-1].snapshot_id, base_id=None, sequence=3, payload={"full": "kept"}
        )
        for head, new in [(snaps[-1], dead_end), (dead_end, rewind)]:
            store.commit_session_snapshot(
                SessionSnapshotCommit(session_id="s", expected_head=head.snapshot_id, snapshot=new, lifecycle="r")
            )
        assert store.prune().deleted_snapshots == 1
        store.vacuum()
        with pytest.raises(SnapshotNotFoundError):
            store.get_snapshot(dead_end.snapshot_id)
        assert store.load_chain(rewind.snapshot_id) == [rewind]
    assert b"unreachable secret" not in db.read_bytes()


def test_reads_leave_no_open_read_snapshot_behind(db: Path) -> None:
    # A statement left half-read would pin a WAL snapshot and stop other processes' checkpoints.
    with SqliteCheckpointStore(db) as store:
        snaps = _session(store, steps=2)
        store.append_control("s", "steer", {"text": "a"})
        store.put_writes(
            [StepWrite(session_id="s", base_snapshot_id=snaps[2].snapshot_id, step_id=3, kind="k", key="v", payload={})]
        )
        data = b"blob"
        store.put_blobs({hashlib.sha256(data).hexdigest(): data})
        reads: list[Callable[[], object]] = [
            lambda: store.get_session_head("s"),
            lambda: store.get_session_head("ghost"),
            lambda: store.find_session_by_operation("none"),
            lambda: store.get_snapshot(snaps[1].snapshot_id),
            lambda: store.load_chain(snaps[2].snapshot_id),
            store.list_sessions,
            lambda: store.list_session_snapshots("s"),
            lambda: store.list_control("s"),
            lambda: store.get_writes("s", snaps[2].snapshot_id),
            lambda: store.get_blobs([hashlib.sha256(data).hexdigest()]),
        ]
        other = sqlite3.connect(db, isolation_level=None, timeout=0.2)
        other.execute("CREATE TABLE probe (n INTEGER)")  # another process's writes, in a table of its own
        try:
            for position, read in enumerate(reads, start=100):
                read()
                other.execute("INSERT INTO probe VALUES (?)", (position,))
                busy, _, _ = other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                assert busy == 0, f"read #{position - 100} left a read snapshot open"
        finally:
            other.close()


def _two_interleaved_sessions(store: SqliteCheckpointStore, steps: int) -> dict[str, list[str]]:
    ids: dict[str, list[str]] = {"a": [], "b": []}
    for i in range(steps + 1):
        for name in ("a", "b"):
            chain = ids[name]
            snap = SessionSnapshot.create(
                session_id=name,
                parent_id=chain[-1] if chain else None,
                base_id=chain[0] if chain else None,
                sequence=i,
                payload={"full": {}} if not chain else {"note": f"{name}{i}"},
            )
            store.commit_session_snapshot(
                SessionSnapshotCommit(
                    session_id=name,
                    expected_head=chain[-1] if chain else None,
                    snapshot=snap,
                    lifecycle="running",
                )
            )
            chain.append(snap.snapshot_id)
    return ids


def test_a_chain_within_one_session_is_read_as_one_range_among_other_sessions_rows(db: Path) -> None:
    from qitos.checkpoint._sqlite_store import _chain_rows

    with SqliteCheckpointStore(db) as store:
        ids = _two_interleaved_sessions(store, 20)
        for name in ("a", "b"):
            chain = store.load_chain(ids[name][-1])
            assert [s.snapshot_id for s in chain] == ids[name]
            assert chain[-1].payload == {"note": f"{name}20"}
            _, walked = store._read(functools.partial(_chain_rows, snapshot_id=ids[name][-1]))
            assert walked is False
        # A fork's chain crosses into its parent session: the recursive walk reads it.
        fork = SessionSnapshot.create(
            session_id="fork", parent_id=ids["a"][5], base_id=ids["a"][0], sequence=6, payload={"note": "f"}
        )
        store.commit_session_snapshot(
            SessionSnapshotCommit(session_id="fork", expected_head=None, snapshot=fork, lifecycle="running")
        )
        rows, walked = store._read(lambda cur: _chain_rows(cur, fork.snapshot_id))
        assert walked is True and len(rows) == 7
        assert [s.snapshot_id for s in store.load_chain(fork.snapshot_id)] == [*ids["a"][:6], fork.snapshot_id]


def test_a_relinked_parent_inside_the_range_falls_back_and_names_the_missing_ancestor(db: Path) -> None:
    with SqliteCheckpointStore(db) as store:
        ids = _two_interleaved_sessions(store, 6)
    # Point a middle snapshot at an ancestor that does not exist (its digest then fails too).
    _tamper(db, "DELETE FROM snapshots WHERE snapshot_id = ?", ids["a"][3])
    with SqliteCheckpointStore(db) as store:
        with pytest.raises(SnapshotIntegrityError, match=ids["a"][3]) as caught:
            store.load_chain(ids["a"][-1])
        assert caught.value.snapshot_id == ids["a"][-1]
        assert [s.snapshot_id for s in store.load_chain(ids["b"][-1])] == ids["b"]  # the other session is intact


def test_chains_still_load_after_vacuum_renumbers_rows(db: Path) -> None:
    with SqliteCheckpointStore(db) as store:
        ids = _two_interleaved_sessions(store, 10)
        store.vacuum()
    with SqliteCheckpointStore(db) as store:
        for name in ("a", "b"):
            assert [s.snapshot_id for s in store.load_chain(ids[name][-1])] == ids[name]


def test_an_incompressible_large_payload_is_still_compressed_and_reads_back(db: Path) -> None:
    import random
    import string

    noise = "".join(random.Random(7).choices(string.ascii_letters + string.digits, k=120_000))
    payload = {"full": {"noise": noise}}
    with SqliteCheckpointStore(db) as store:
        first = SessionSnapshot.create(session_id="s", parent_id=None, base_id=None, sequence=0, payload=payload)
        store.commit_session_snapshot(
            SessionSnapshotCommit(session_id="s", expected_head=None, snapshot=first, lifecycle="created")
        )
    with sqlite3.connect(db) as conn:
        encoding, stored = conn.execute("SELECT encoding, payload FROM snapshots").fetchone()
    assert encoding == "zstd" and len(stored) < 0.85 * len(noise)  # entropy coding still saves ~25 %
    assert unpack(stored) == first.canonical_payload().encode()
    with SqliteCheckpointStore(db) as store:
        assert store.get_snapshot(first.snapshot_id).payload == payload


@pytest.mark.parametrize("encoding", ["zlib", "deflate"])
def test_rows_compressed_by_earlier_versions_still_read_and_verify(db: Path, encoding: str) -> None:
    payload = {"full": {"text": "an older row " * 200}}
    with SqliteCheckpointStore(db) as store:
        first = SessionSnapshot.create(session_id="s", parent_id=None, base_id=None, sequence=0, payload=payload)
        store.commit_session_snapshot(
            SessionSnapshotCommit(session_id="s", expected_head=None, snapshot=first, lifecycle="created")
        )
    raw = first.canonical_payload().encode()
    if encoding == "zlib":
        old = zlib.compress(raw)
    else:
        deflater = zlib.compressobj(1, zlib.DEFLATED, -12, 5)
        old = deflater.compress(raw) + deflater.flush()
    _tamper(db, "UPDATE snapshots SET encoding = ?, payload = ?", encoding, old)
    with SqliteCheckpointStore(db) as store:
        assert store.get_snapshot(first.snapshot_id).payload == payload
    _tamper(db, "UPDATE snapshots SET payload = ?", old[:-6] + b"\x00" * 6)
    with SqliteCheckpointStore(db) as store, pytest.raises(SnapshotIntegrityError) as caught:
        store.get_snapshot(first.snapshot_id)
    assert caught.value.snapshot_id == first.snapshot_id
