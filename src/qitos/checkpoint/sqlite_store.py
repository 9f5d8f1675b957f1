"""``SqliteCheckpointStore``: the checkpoint store in one SQLite file, safe for many processes.

Design (many processes may share the file; a commit is atomic and a crash loses nothing committed):

- stdlib ``sqlite3``; one connection per store per process, opened lazily, shared by threads
  behind a ``threading.Lock`` and re-opened in a child after ``fork()`` (a connection inherited
  across ``fork()`` is never used nor closed by the child);
- WAL journal, ``synchronous=NORMAL`` by default (``FULL`` on request), ``busy_timeout``; WAL
  checkpoints run on a background thread (:mod:`qitos.checkpoint.wal_checkpointer`), not inside
  whichever commit crosses the log's size limit;
- every write is one ``BEGIN IMMEDIATE`` transaction that commits on success and rolls back on
  any ``BaseException``; ``SQLITE_BUSY``/locked is retried with bounded, jittered backoff, so
  "database is locked" never reaches the caller unless the file stays locked for
  ``retry_timeout`` seconds (then a :class:`~qitos.core._errors.CheckpointError` says so);
- a ``schema_version`` table and ordered migrations, each applied in one transaction together
  with its version row; a file written by a newer schema is refused;
- fixed SQL strings (compiled once and reused from sqlite3's statement cache); payloads stored
  as compact canonical JSON text, as a Zstandard frame (``qitos.checkpoint.packing``) when at least
  ``compress_min_bytes`` long and the frame is at least 10% smaller; the digest always covers the
  uncompressed JSON. Rows written as zlib or raw deflate by earlier versions still read.

What a crash can lose: with ``synchronous="NORMAL"`` in WAL mode a committed transaction
survives a process crash; a power loss or OS crash may roll back the most recent commits (never
corrupt the file). ``synchronous="FULL"`` makes each commit durable against power loss too.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sqlite3
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

from qitos.checkpoint._records import (
    ControlItem,
    DuplicateOperationError,
    PruneReport,
    SessionCommitReceipt,
    SessionHeadRecord,
    SessionLease,
    SessionSnapshot,
    SessionSnapshotCommit,
    SnapshotNotFoundError,
    StepWrite,
    StoredSnapshotRow,
    json_text,
    utc_now,
)
from qitos.checkpoint._rules import (
    MAX_CHAIN,
    chain_oldest_first,
    check_after,
    check_blobs,
    check_control,
    check_fence,
    check_lease_ttl,
    check_write_base,
    control_digest,
    head_digest,
    mentioned_digests,
    metadata_digest,
    name_set,
    next_lease,
    renewed_lease,
    stored_object,
    stored_text,
    verified_head,
    verified_write,
    write_digest,
)
from qitos.checkpoint.packing import PackingError, pack, unpack
from qitos.checkpoint.store import SyncCheckpointStore
from qitos.checkpoint.wal_checkpointer import SAFETY_NET_PAGES, WalCheckpointer
from qitos.core._errors import (
    CheckpointError,
    ConfigurationError,
    HeadConflictError,
    IntegrityError,
    SessionNotFoundError,
    SnapshotIntegrityError,
)

__all__ = ["SCHEMA_VERSION", "SqliteCheckpointStore"]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class _Migration:
    version: int
    name: str
    statements: tuple[str, ...]
    # Run after the statements, in the same transaction: rewrites rows SQL alone cannot compute.
    backfill: Callable[[sqlite3.Cursor], None] | None = None


def _backfill_digests(cur: sqlite3.Cursor) -> None:
    """Migration 3: digests for the rows written before rows carried them."""
    for session_id, metadata in cur.execute("SELECT session_id, metadata FROM sessions").fetchall():
        cur.execute(
            "UPDATE sessions SET digest = ? WHERE session_id = ?", (metadata_digest(session_id, metadata), session_id)
        )
    rows = cur.execute("SELECT session_id, snapshot_id, sequence, lifecycle, updated_at FROM heads").fetchall()
    for session_id, snapshot_id, sequence, lifecycle, updated_at in rows:
        digest = head_digest(session_id, snapshot_id, sequence, lifecycle, updated_at)
        cur.execute("UPDATE heads SET digest = ? WHERE session_id = ?", (digest, session_id))
    rows = cur.execute("SELECT rowid, session_id, base_snapshot_id, step_id, kind, key, payload FROM writes").fetchall()
    for rowid, session_id, base, step_id, kind, key, payload in rows:
        write = StepWrite(session_id=session_id, base_snapshot_id=base, step_id=step_id, kind=kind, key=key, payload={})
        cur.execute("UPDATE writes SET digest = ? WHERE rowid = ?", (write_digest(write, payload), rowid))
    rows = cur.execute("SELECT session_id, position, kind, payload, created_at FROM control").fetchall()
    for session_id, position, kind, payload, created_at in rows:
        digest = control_digest(session_id, position, kind, payload, created_at)
        cur.execute(
            "UPDATE control SET digest = ? WHERE session_id = ? AND position = ?", (digest, session_id, position)
        )


# Ordered schema history. Never edit an applied migration: append a new one.
_MIGRATIONS: Final[tuple[_Migration, ...]] = (
    _Migration(
        1,
        "initial schema",
        (
            "CREATE TABLE snapshots (snapshot_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, "
            "parent_id TEXT, base_id TEXT, sequence INTEGER NOT NULL, created_at TEXT NOT NULL, "
            "payload TEXT NOT NULL)",
            "CREATE TABLE heads (session_id TEXT PRIMARY KEY, snapshot_id TEXT NOT NULL, "
            "sequence INTEGER NOT NULL, lifecycle TEXT NOT NULL, updated_at TEXT NOT NULL, "
            "metadata TEXT NOT NULL)",
            "CREATE TABLE writes (session_id TEXT NOT NULL, base_snapshot_id TEXT NOT NULL, "
            "kind TEXT NOT NULL, key TEXT NOT NULL, step_id INTEGER NOT NULL, payload TEXT NOT NULL, "
            "PRIMARY KEY (session_id, base_snapshot_id, kind, key))",
            "CREATE TABLE control (session_id TEXT NOT NULL, position INTEGER NOT NULL, "
            "kind TEXT NOT NULL, payload TEXT NOT NULL, created_at TEXT NOT NULL, "
            "PRIMARY KEY (session_id, position)) WITHOUT ROWID",
            "CREATE TABLE blobs (digest TEXT PRIMARY KEY, data BLOB NOT NULL)",
        ),
    ),
    _Migration(
        2,
        "compressed payloads and creation operation ids",
        (
            "ALTER TABLE snapshots ADD COLUMN encoding TEXT NOT NULL DEFAULT 'json'",
            "CREATE TABLE operations (operation_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, "
            "snapshot_id TEXT NOT NULL, created_at TEXT NOT NULL)",
        ),
    ),
    _Migration(
        3,
        "session leases, verified rows, metadata written once",
        (
            # The metadata (with the task) moves out of the head row, which every commit rewrites.
            "CREATE TABLE sessions (session_id TEXT PRIMARY KEY, metadata TEXT NOT NULL, digest TEXT NOT NULL)",
            "INSERT INTO sessions (session_id, metadata, digest) SELECT session_id, metadata, '' FROM heads",
            "ALTER TABLE heads DROP COLUMN metadata",
            "ALTER TABLE heads ADD COLUMN digest TEXT NOT NULL DEFAULT ''",
            "ALTER TABLE heads ADD COLUMN control_seq INTEGER NOT NULL DEFAULT 0",
            "UPDATE heads SET control_seq = "
            "(SELECT COALESCE(MAX(position), 0) FROM control WHERE control.session_id = heads.session_id)",
            "ALTER TABLE writes ADD COLUMN digest TEXT NOT NULL DEFAULT ''",
            "ALTER TABLE control ADD COLUMN digest TEXT NOT NULL DEFAULT ''",
            "CREATE TABLE leases (session_id TEXT PRIMARY KEY, owner TEXT NOT NULL, token INTEGER NOT NULL, "
            "expires_at REAL NOT NULL)",
        ),
        _backfill_digests,
    ),
)
SCHEMA_VERSION: Final[int] = _MIGRATIONS[-1].version
"""The schema version this code writes; older files are migrated to it on open."""

_SQL_SCHEMA_EXISTS = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
_SQL_SCHEMA_TABLE = (
    "CREATE TABLE IF NOT EXISTS schema_version "
    "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
)
_SQL_SCHEMA_VERSION = "SELECT COALESCE(MAX(version), 0) FROM schema_version"
_SQL_SCHEMA_RECORD = "INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)"

_SQL_HEAD_CREATE = (
    "INSERT INTO heads (session_id, snapshot_id, sequence, lifecycle, updated_at, digest) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (session_id) DO NOTHING"
)
_HEAD_ADVANCE = (
    "UPDATE heads SET snapshot_id = ?, sequence = ?, lifecycle = ?, updated_at = ?, digest = ? "
    "WHERE session_id = ? AND snapshot_id = ?"
)
_SQL_HEAD_ADVANCE = f"{_HEAD_ADVANCE} RETURNING control_seq"
_SQL_HEAD_ADVANCE_FENCED = (
    f"{_HEAD_ADVANCE} AND EXISTS (SELECT 1 FROM leases WHERE session_id = ? AND token = ? AND expires_at > ?)"
    " RETURNING control_seq"
)
_SQL_METADATA_CREATE = "INSERT INTO sessions (session_id, metadata, digest) VALUES (?, ?, ?)"
_SQL_METADATA_SET = "UPDATE sessions SET metadata = ?, digest = ? WHERE session_id = ?"
_SQL_HEAD_ID = "SELECT snapshot_id FROM heads WHERE session_id = ?"
_HEAD_COLUMNS = (
    "h.session_id, h.snapshot_id, h.sequence, h.lifecycle, h.updated_at, h.digest, "
    "CAST(m.metadata AS BLOB), m.digest, h.control_seq FROM heads h LEFT JOIN sessions m ON m.session_id = h.session_id"
)
_SQL_HEAD_GET = f"SELECT {_HEAD_COLUMNS} WHERE h.session_id = ?"
_SQL_HEAD_LIST = f"SELECT {_HEAD_COLUMNS} ORDER BY h.rowid"


def _sql_head_list_in(count: int) -> str:
    """The heads in one of ``count`` lifecycles, in creation order."""
    return f"SELECT {_HEAD_COLUMNS} WHERE h.lifecycle IN ({', '.join('?' * count)}) ORDER BY h.rowid"


_SQL_LEASE_GET = "SELECT owner, token, expires_at FROM leases WHERE session_id = ?"
_SQL_LEASE_PUT = (
    "INSERT INTO leases (session_id, owner, token, expires_at) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (session_id) DO UPDATE SET owner = excluded.owner, token = excluded.token, "
    "expires_at = excluded.expires_at"
)
_SQL_LEASE_RELEASE = "UPDATE leases SET expires_at = 0 WHERE session_id = ? AND token = ? AND owner = ?"
_SQL_SNAPSHOT_SESSION = "SELECT session_id FROM snapshots WHERE snapshot_id = ?"
_SQL_SNAPSHOT_INSERT = (
    "INSERT OR IGNORE INTO snapshots "
    "(snapshot_id, session_id, parent_id, base_id, sequence, created_at, encoding, payload) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_SNAPSHOT_COLUMNS = "snapshot_id, session_id, parent_id, base_id, sequence, created_at, encoding, payload"
_SQL_SNAPSHOT_GET = (
    "SELECT snapshot_id, session_id, parent_id, base_id, sequence, created_at, encoding, "
    "CAST(payload AS BLOB) FROM snapshots WHERE snapshot_id = ?"
)
# The snapshot and its ancestors up to its base (``stop``), in one recursive query.
_SQL_CHAIN = (
    f"WITH RECURSIVE chain({_SNAPSHOT_COLUMNS}, stop, depth) AS ("
    f" SELECT {_SNAPSHOT_COLUMNS}, base_id, 0 FROM snapshots WHERE snapshot_id = ?"
    " UNION ALL"
    " SELECT p.snapshot_id, p.session_id, p.parent_id, p.base_id, p.sequence, p.created_at, p.encoding,"
    " p.payload, chain.stop, chain.depth + 1"
    " FROM chain JOIN snapshots p ON p.snapshot_id = chain.parent_id"
    " WHERE chain.stop IS NOT NULL AND chain.snapshot_id != chain.stop AND chain.depth < ?)"
    " SELECT snapshot_id, session_id, parent_id, base_id, sequence, created_at, encoding,"
    " CAST(payload AS BLOB), stop, depth FROM chain"
)
# The chain's two ends: the snapshot's rowid and session, its base and the base's rowid.
_SQL_CHAIN_ENDS = (
    "SELECT s.rowid, s.session_id, s.base_id, b.rowid FROM snapshots s "
    "LEFT JOIN snapshots b ON b.snapshot_id = s.base_id WHERE s.snapshot_id = ?"
)
_SQL_CHAIN_RANGE = (
    "SELECT snapshot_id, session_id, parent_id, base_id, sequence, created_at, encoding, "
    "CAST(payload AS BLOB) FROM snapshots WHERE rowid BETWEEN ? AND ? AND session_id = ?"
)
# A session's head chain, newest first, staying within the session.
_SQL_SESSION_CHAIN = (
    "WITH RECURSIVE chain(snapshot_id, parent_id, depth) AS ("
    " SELECT s.snapshot_id, s.parent_id, 0 FROM heads h JOIN snapshots s ON s.snapshot_id = h.snapshot_id"
    " WHERE h.session_id = ?1"
    " UNION ALL"
    " SELECT p.snapshot_id, p.parent_id, chain.depth + 1 FROM chain"
    " JOIN snapshots p ON p.snapshot_id = chain.parent_id WHERE p.session_id = ?1)"
    " SELECT snapshot_id FROM chain ORDER BY depth"
)
_SQL_OPERATION_GET = "SELECT session_id FROM operations WHERE operation_id = ?"
_SQL_OPERATION_INSERT = "INSERT INTO operations (operation_id, session_id, snapshot_id, created_at) VALUES (?, ?, ?, ?)"
_SQL_WRITE_INSERT = (
    "INSERT OR IGNORE INTO writes (session_id, base_snapshot_id, kind, key, step_id, payload, digest) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_SQL_WRITE_LIST = (
    "SELECT step_id, CAST(kind AS BLOB), CAST(key AS BLOB), CAST(payload AS BLOB), digest FROM writes "
    "WHERE session_id = ? AND base_snapshot_id = ? ORDER BY rowid"
)
# Control positions come from a counter in the head row (never MAX()+1 over the items).
_SQL_CONTROL_NEXT = "UPDATE heads SET control_seq = control_seq + 1 WHERE session_id = ? RETURNING control_seq"
_SQL_CONTROL_SEQ = "SELECT control_seq FROM heads WHERE session_id = ?"
_SQL_HEAD_AND_CONTROL_SEQ = "SELECT snapshot_id, control_seq FROM heads WHERE session_id = ?"
_SQL_CONTROL_INSERT = (
    "INSERT INTO control (session_id, position, kind, payload, created_at, digest) VALUES (?, ?, ?, ?, ?, ?)"
)
_SQL_CONTROL_LIST = (
    "SELECT position, CAST(kind AS BLOB), CAST(payload AS BLOB), CAST(created_at AS BLOB), digest FROM control "
    "WHERE session_id = ? AND position > ? ORDER BY position"
)
_SQL_BLOB_INSERT = "INSERT OR IGNORE INTO blobs (digest, data) VALUES (?, ?)"
# One statement for any number of digests: they travel as one JSON array parameter.
_SQL_BLOB_GET = "SELECT digest, data FROM blobs WHERE digest IN (SELECT value FROM json_each(?))"
_SQL_KEEP_TABLE = "CREATE TEMP TABLE IF NOT EXISTS prune_keep (snapshot_id TEXT PRIMARY KEY)"
_SQL_KEEP_CLEAR = "DELETE FROM temp.prune_keep"
_SQL_KEEP_INSERT = "INSERT OR IGNORE INTO temp.prune_keep (snapshot_id) VALUES (?)"
_SQL_KEEP_MISSING = (
    "SELECT k.snapshot_id FROM temp.prune_keep k LEFT JOIN snapshots s ON s.snapshot_id = k.snapshot_id "
    "WHERE s.snapshot_id IS NULL ORDER BY k.snapshot_id LIMIT 1"
)
# Rows as _stored_row reads them (the payload as bytes).
_STORED_COLUMNS = "snapshot_id, session_id, parent_id, base_id, sequence, created_at, encoding, CAST(payload AS BLOB)"
# The snapshots no head and no kept snapshot reaches through parent links.
_SQL_PRUNE_DOOMED = (
    "WITH RECURSIVE reach(snapshot_id) AS ("
    " SELECT snapshot_id FROM heads UNION SELECT snapshot_id FROM temp.prune_keep"
    " UNION SELECT s.parent_id FROM snapshots s JOIN reach r ON s.snapshot_id = r.snapshot_id"
    " WHERE s.parent_id IS NOT NULL)"
    f" SELECT {_STORED_COLUMNS} FROM snapshots WHERE snapshot_id NOT IN (SELECT snapshot_id FROM reach)"
)
_SQL_PRUNE = "DELETE FROM snapshots WHERE snapshot_id IN (SELECT value FROM json_each(?))"
_SQL_DOOMED_WRITES = "SELECT payload FROM writes WHERE base_snapshot_id NOT IN (SELECT snapshot_id FROM snapshots)"
_SQL_ALL_SNAPSHOTS = f"SELECT {_STORED_COLUMNS} FROM snapshots"
_SQL_ALL_WRITES = "SELECT payload FROM writes"
_SQL_BLOB_PRESENT = "SELECT digest FROM blobs WHERE digest IN (SELECT value FROM json_each(?))"
_SQL_BLOB_DELETE = "DELETE FROM blobs WHERE digest IN (SELECT value FROM json_each(?))"
_SQL_PRUNE_WRITES = "DELETE FROM writes WHERE base_snapshot_id NOT IN (SELECT snapshot_id FROM snapshots)"
_SQL_SNAPSHOT_COUNT = "SELECT COUNT(*) FROM snapshots"

_BUSY_CODES: Final = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})

Synchronous = Literal["NORMAL", "FULL"]

# Connections inherited across fork(): kept referenced so the child never closes (or uses) them.
_INHERITED: list[sqlite3.Connection] = []
_LIVE: weakref.WeakSet[SqliteCheckpointStore] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for store in list(_LIVE):
        store._forget_parent_connection()


os.register_at_fork(after_in_child=_after_fork_in_child)


class SqliteCheckpointStore(SyncCheckpointStore):
    """A :class:`~qitos.checkpoint.store.CheckpointStore` in one SQLite file (see module docs).

    ``path`` is the database file (created on first use with its schema); ``synchronous`` is the
    WAL durability level; ``busy_timeout_ms`` is how long SQLite itself waits for a lock before
    the store's own backoff retries, for up to ``retry_timeout`` seconds in all;
    ``compress_min_bytes`` (None: never) is the payload size from which compression is tried (a
    per-step delta of ~1 KiB compresses in ~10-20 µs); ``page_size`` applies to new files.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Synchronous = "NORMAL",
        busy_timeout_ms: int = 5_000,
        retry_timeout: float = 60.0,
        compress_min_bytes: int | None = 512,
        page_size: int = 8192,
    ) -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise ConfigurationError(f"synchronous must be 'NORMAL' or 'FULL', got {synchronous!r}")
        if not isinstance(busy_timeout_ms, int) or isinstance(busy_timeout_ms, bool) or busy_timeout_ms < 0:
            raise ConfigurationError(f"busy_timeout_ms must be a non-negative int, got {busy_timeout_ms!r}")
        if not isinstance(retry_timeout, int | float) or retry_timeout <= 0:
            raise ConfigurationError(f"retry_timeout must be a positive number of seconds, got {retry_timeout!r}")
        if compress_min_bytes is not None and (not isinstance(compress_min_bytes, int) or compress_min_bytes < 0):
            raise ConfigurationError(f"compress_min_bytes must be None or an int >= 0, got {compress_min_bytes!r}")
        self.path = os.fspath(path)
        self.synchronous: Synchronous = synchronous
        self._busy_timeout_ms = busy_timeout_ms
        self._retry_timeout = float(retry_timeout)
        self._compress_min = compress_min_bytes
        if page_size not in (1024, 2048, 4096, 8192, 16384, 32768, 65536):
            raise ConfigurationError(f"page_size must be a power of two from 1024 to 65536, got {page_size!r}")
        self._page_size = page_size
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._cursor: sqlite3.Cursor | None = None
        self._checkpointer: WalCheckpointer | None = None
        self._pid = os.getpid()
        self._closed = False
        _LIVE.add(self)

    def __repr__(self) -> str:
        return f"SqliteCheckpointStore({self.path!r}, synchronous={self.synchronous!r})"

    # ---- connection, transactions, retries

    def _forget_parent_connection(self) -> None:
        """In a forked child: drop the parent's lock and connection without touching them."""
        self._lock = threading.Lock()
        if self._conn is not None:
            _INHERITED.append(self._conn)
        self._conn = self._cursor = None
        self._checkpointer = None  # the parent's thread does not exist here; _open starts a new one
        self._pid = os.getpid()

    def _connection(self) -> sqlite3.Cursor:
        if self._closed:
            raise CheckpointError(f"{self!r} is closed")
        if self._pid != os.getpid():  # forked without os.register_at_fork hooks running
            self._forget_parent_connection()
        if self._cursor is None:
            self._conn = self._open()
            self._cursor = self._conn.cursor()  # one reused cursor: cheaper than conn.execute's new one
            if self.path != ":memory:":
                self._checkpointer = WalCheckpointer(self._connect)
        return self._cursor

    def _connect(self) -> sqlite3.Connection:
        # ``timeout`` is SQLite's busy timeout (sqlite3_busy_timeout), for this and the checkpointer's connection.
        return sqlite3.connect(
            self.path,
            timeout=self._busy_timeout_ms / 1000,
            isolation_level=None,
            check_same_thread=False,
            cached_statements=64,
        )

    def _open(self) -> sqlite3.Connection:
        if self.path != ":memory:" and not self.path.startswith("file:"):
            parent = Path(self.path).parent
            if not parent.is_dir():
                raise CheckpointError(f"cannot open checkpoint database {self.path!r}: {parent} is not a directory")
        conn = self._connect()
        try:
            # Takes effect only while the file is still empty (before WAL mode is set): 8 KiB pages
            # hold five ~1.6 KB per-step snapshot rows where 4 KiB pages hold two.
            conn.execute(f"PRAGMA page_size = {self._page_size}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            # Checkpoints run on a background thread (wal_checkpointer); this is only the safety net.
            conn.execute(f"PRAGMA wal_autocheckpoint = {SAFETY_NET_PAGES}")
            _migrate(conn.cursor(), self.path)
        except BaseException:
            conn.close()
            raise
        return conn

    def _run(self, fn: Callable[[sqlite3.Cursor], _T], *, write: bool) -> _T:
        """Run ``fn`` on this process's connection (in a BEGIN IMMEDIATE transaction if ``write``),
        retrying the whole call while the database is busy or locked."""
        deadline: float | None = None
        attempt = 0
        while True:
            with self._lock:
                try:
                    cur = self._connection()
                    if not write:
                        return fn(cur)
                    result = _in_transaction(cur, fn)
                    if self._checkpointer is not None:
                        self._checkpointer.committed()
                    return result
                except sqlite3.OperationalError as exc:
                    if not _is_busy(exc):
                        raise self._error(exc) from exc
                    busy = exc
                except sqlite3.Error as exc:
                    raise self._error(exc) from exc
            now = time.monotonic()
            if deadline is None:
                deadline = now + self._retry_timeout
            if now >= deadline:
                raise CheckpointError(
                    f"{self.path}: the database stayed locked by other writers for {self._retry_timeout:g} s "
                    f"({attempt + 1} attempts); last SQLite error: {busy}"
                ) from busy
            time.sleep(0.001 * 2 ** min(attempt, 6) * random.uniform(0.5, 1.0))  # 1 ms .. 64 ms
            attempt += 1

    def _error(self, exc: sqlite3.Error) -> CheckpointError:
        return CheckpointError(f"SQLite error on {self.path}: {exc}")

    def _encode(self, payload_json: str) -> tuple[str, str | bytes]:
        size = len(payload_json)
        if self._compress_min is not None and size >= self._compress_min:
            packed = pack(payload_json.encode("utf-8"))
            if packed is not None:
                return "zstd", packed
        return "json", payload_json

    # ---- sessions and snapshots

    def get_session_head(self, session_id: str) -> SessionHeadRecord | None:
        """Read the current mutable head for one session (None if there is no such session)."""
        row = self._run(lambda cur: _one(cur.execute(_SQL_HEAD_GET, (session_id,))), write=False)
        return None if row is None else verified_head(*row)

    def commit_session_snapshot(self, request: SessionSnapshotCommit) -> SessionCommitReceipt:
        """Atomically persist an immutable snapshot (and blobs) and advance its head (CAS)."""
        payload_json = request.validate()
        metadata = request.session_metadata
        metadata_json = None if metadata is None else json_text(metadata, "session_metadata")
        blobs = check_blobs(request.blobs) if request.blobs else []
        snapshot = request.snapshot
        encoding, stored = self._encode(payload_json)
        session_id = request.session_id
        expected = request.expected_head
        operation_id = request.operation_id

        def commit(cur: sqlite3.Cursor) -> tuple[str, int]:
            execute = cur.execute
            control_seq = 0
            now = utc_now()
            digest = head_digest(session_id, snapshot.snapshot_id, snapshot.sequence, request.lifecycle, now)
            head = (snapshot.snapshot_id, snapshot.sequence, request.lifecycle, now, digest)
            if expected is None:
                if execute(_SQL_HEAD_CREATE, (session_id, *head)).rowcount != 1:
                    actual = _one(execute(_SQL_HEAD_ID, (session_id,)))
                    raise HeadConflictError(session_id, None, None if actual is None else actual[0])
                meta = metadata_json or "{}"
                execute(_SQL_METADATA_CREATE, (session_id, meta, metadata_digest(session_id, meta)))
            else:
                now_s = time.time()
                token = request.lease_token
                if token is None:
                    check_fence(session_id, _lease(cur, session_id), None, now_s)
                    row = _one(execute(_SQL_HEAD_ADVANCE, (*head, session_id, expected)))
                else:  # the fence is checked by the UPDATE itself: one statement on the hot path
                    fenced = (*head, session_id, expected, session_id, token, now_s)
                    row = _one(execute(_SQL_HEAD_ADVANCE_FENCED, fenced))
                if row is not None:
                    control_seq = int(row[0])
                else:
                    actual = _one(execute(_SQL_HEAD_ID, (session_id,)))
                    if actual is None:
                        raise SessionNotFoundError(session_id)
                    check_fence(session_id, _lease(cur, session_id), token, now_s)
                    raise HeadConflictError(session_id, expected, actual[0])
                if metadata_json is not None:
                    execute(_SQL_METADATA_SET, (metadata_json, metadata_digest(session_id, metadata_json), session_id))
            if operation_id is not None:
                owner = _one(execute(_SQL_OPERATION_GET, (operation_id,)))
                if owner is not None:
                    raise DuplicateOperationError(operation_id, owner[0])
            parent_id = snapshot.parent_id
            # A head always names a stored snapshot, so a parent equal to the head just matched exists.
            if (
                parent_id is not None
                and parent_id != expected
                and _one(execute(_SQL_SNAPSHOT_SESSION, (parent_id,))) is None
            ):
                raise SnapshotNotFoundError(parent_id)
            execute(
                _SQL_SNAPSHOT_INSERT,
                (
                    snapshot.snapshot_id,
                    session_id,
                    parent_id,
                    snapshot.base_id,
                    snapshot.sequence,
                    snapshot.created_at,
                    encoding,
                    stored,
                ),
            )
            if blobs:
                cur.executemany(_SQL_BLOB_INSERT, blobs)
            if operation_id is not None:
                execute(_SQL_OPERATION_INSERT, (operation_id, session_id, snapshot.snapshot_id, now))
            return now, control_seq

        committed_at, control_seq = self._run(commit, write=True)
        return SessionCommitReceipt(
            session_id=session_id,
            snapshot_id=snapshot.snapshot_id,
            previous_head=expected,
            sequence=snapshot.sequence,
            committed_at=committed_at,
            control_seq=control_seq,
        )

    def find_session_by_operation(self, operation_id: str) -> str | None:
        """The session a commit with this ``operation_id`` created, or None."""
        row = self._run(lambda cur: _one(cur.execute(_SQL_OPERATION_GET, (operation_id,))), write=False)
        return None if row is None else str(row[0])

    def get_snapshot(self, snapshot_id: str) -> SessionSnapshot:
        """Read one verified snapshot; SnapshotNotFoundError or SnapshotIntegrityError."""
        rows = self._run(lambda cur: _snapshot_rows(cur, _SQL_SNAPSHOT_GET, (snapshot_id,), snapshot_id), write=False)
        if not rows:
            raise SnapshotNotFoundError(snapshot_id)
        return _snapshot(rows[0])

    def load_chain(self, snapshot_id: str) -> list[SessionSnapshot]:
        """The snapshot and its ancestors back to and including its base, oldest first, verified."""
        rows, _ = self._run(lambda cur: _chain_rows(cur, snapshot_id), write=False)
        if not rows:
            raise SnapshotNotFoundError(snapshot_id)
        return SessionSnapshot.from_stored_rows([_stored_row(row) for row in rows])

    def list_sessions(self, *, lifecycles: Iterable[str] | None = None) -> list[SessionHeadRecord]:
        """Every session head (only those in ``lifecycles``, when given), in creation order."""
        wanted = name_set(lifecycles, "lifecycles")
        if wanted is not None and not wanted:
            return []
        statement = _SQL_HEAD_LIST if wanted is None else _sql_head_list_in(len(wanted))
        params = sorted(wanted or ())
        rows = self._run(lambda cur: cur.execute(statement, params).fetchall(), write=False)
        return [verified_head(*row) for row in rows]

    def list_session_snapshots(self, session_id: str) -> list[str]:
        """The session's head chain within the session, newest first."""

        def read(cur: sqlite3.Cursor) -> list[str]:
            ids = [row[0] for row in cur.execute(_SQL_SESSION_CHAIN, (session_id,))]
            if not ids and _one(cur.execute(_SQL_HEAD_ID, (session_id,))) is None:
                raise SessionNotFoundError(session_id)
            return ids

        return self._run(read, write=False)

    # ---- pending writes

    def put_writes(self, writes: Sequence[StepWrite]) -> list[bool]:
        """Store pending writes in one transaction; per write, whether it was new (first wins)."""
        rows = []
        for w in writes:
            payload_json = w.payload_json()
            digest = write_digest(w, payload_json)
            rows.append((w.session_id, w.base_snapshot_id, w.kind, w.key, w.step_id, payload_json, digest))
        if not rows:
            return []

        def put(cur: sqlite3.Cursor) -> list[bool]:
            checked: set[tuple[str, str]] = set()
            fenced: set[str] = set()
            now = time.time()
            for write in writes:
                pair = (write.session_id, write.base_snapshot_id)
                if pair not in checked:
                    base = _one(cur.execute(_SQL_SNAPSHOT_SESSION, (write.base_snapshot_id,)))
                    check_write_base(write, None if base is None else base[0])
                    checked.add(pair)
                if write.session_id not in fenced:
                    check_fence(write.session_id, _lease(cur, write.session_id), write.lease_token, now)
                    fenced.add(write.session_id)
            return [cur.execute(_SQL_WRITE_INSERT, row).rowcount == 1 for row in rows]

        return self._run(put, write=True)

    def get_writes(self, session_id: str, base_snapshot_id: str) -> list[StepWrite]:
        """Pending writes of the step that started at ``base_snapshot_id``, in write order, verified."""
        rows = self._run(
            lambda cur: cur.execute(_SQL_WRITE_LIST, (session_id, base_snapshot_id)).fetchall(), write=False
        )
        out = []
        for step_id, kind_raw, key_raw, payload_raw, digest in rows:
            kind = stored_text(kind_raw, "writes", "?", session_id)
            key = stored_text(key_raw, "writes", kind, session_id)
            out.append(verified_write(session_id, base_snapshot_id, step_id, kind, key, payload_raw, digest))
        return out

    # ---- control items

    def append_control(self, session_id: str, kind: str, payload: Mapping[str, Any]) -> ControlItem:
        """Durably append one control item; the store assigns its position (a counter in the head row)."""
        payload_json = check_control(session_id, kind, payload)

        def append(cur: sqlite3.Cursor) -> tuple[int, str]:
            row = _one(cur.execute(_SQL_CONTROL_NEXT, (session_id,)))
            if row is None:
                raise SessionNotFoundError(session_id)
            position = int(row[0])
            now = utc_now()
            digest = control_digest(session_id, position, kind, payload_json, now)
            cur.execute(_SQL_CONTROL_INSERT, (session_id, position, kind, payload_json, now, digest))
            return position, now

        position, created_at = self._run(append, write=True)
        return ControlItem(
            session_id=session_id,
            position=position,
            kind=kind,
            payload=stored_object(payload_json, "control", str(position), session_id),
            created_at=created_at,
        )

    def list_control(self, session_id: str, *, after: int = 0, kinds: Iterable[str] | None = None) -> list[ControlItem]:
        """Control items with position > ``after`` (optionally only ``kinds``), by position, verified.

        The head row's counter says how many items exist: a missing item (a damaged or truncated
        file) raises IntegrityError instead of being skipped silently.
        """
        wanted = name_set(kinds, "kinds")
        start = check_after(after)

        def read(cur: sqlite3.Cursor) -> tuple[int, list[Any]]:
            seq = _one(cur.execute(_SQL_CONTROL_SEQ, (session_id,)))
            if seq is None:
                raise SessionNotFoundError(session_id)
            return int(seq[0]), cur.execute(_SQL_CONTROL_LIST, (session_id, start)).fetchall()

        count, rows = self._run(read, write=False)
        items = []
        expected = start
        for position, kind_raw, payload_raw, created_raw, digest in rows:
            where = str(position)
            kind = stored_text(kind_raw, "control", where, session_id)
            payload_json = stored_text(payload_raw, "control", where, session_id)
            created_at = stored_text(created_raw, "control", where, session_id)
            if digest != control_digest(session_id, position, kind, payload_json, created_at):
                raise IntegrityError("control", where, "content does not match its digest", session_id=session_id)
            expected += 1
            if position != expected:
                raise IntegrityError("control", str(expected), "the item is missing", session_id=session_id)
            if wanted is None or kind in wanted:
                items.append(
                    ControlItem(
                        session_id=session_id,
                        position=position,
                        kind=kind,
                        payload=stored_object(payload_json, "control", where, session_id),
                        created_at=created_at,
                    )
                )
        if expected < count:
            raise IntegrityError(
                "control", str(expected + 1), f"the item is missing ({count} were appended)", session_id=session_id
            )
        return items

    # ---- leases

    def acquire_lease(
        self, session_id: str, owner: str, *, ttl_seconds: float, take_over_from: str | None = None
    ) -> SessionLease:
        """Take (or, for its owner, renew) the session's lease; SessionBusyError if another owner holds it."""
        ttl = check_lease_ttl(ttl_seconds)

        def acquire(cur: sqlite3.Cursor) -> SessionLease:
            head = _one(cur.execute(_SQL_HEAD_AND_CONTROL_SEQ, (session_id,)))
            if head is None:
                raise SessionNotFoundError(session_id)
            lease = next_lease(_lease(cur, session_id), session_id, owner, ttl, time.time(), take_over_from)
            cur.execute(_SQL_LEASE_PUT, (session_id, lease.owner, lease.token, lease.expires_at))
            return replace(lease, head_snapshot_id=head[0], control_seq=int(head[1]))

        return self._run(acquire, write=True)

    def renew_lease(self, lease: SessionLease, *, ttl_seconds: float) -> SessionLease:
        """Extend a held lease; LeaseLostError if it expired or was taken over."""
        ttl = check_lease_ttl(ttl_seconds)

        def renew(cur: sqlite3.Cursor) -> SessionLease:
            renewed = renewed_lease(_lease(cur, lease.session_id), lease, ttl, time.time())
            cur.execute(_SQL_LEASE_PUT, (renewed.session_id, renewed.owner, renewed.token, renewed.expires_at))
            return renewed

        return self._run(renew, write=True)

    def release_lease(self, lease: SessionLease) -> None:
        """Give the lease up now (a no-op if it is no longer current); its token stays used."""
        self._run(lambda cur: cur.execute(_SQL_LEASE_RELEASE, (lease.session_id, lease.token, lease.owner)), write=True)

    def get_lease(self, session_id: str) -> SessionLease | None:
        """The session's current lease row (possibly lapsed), or None if it never had one."""
        return self._run(lambda cur: _lease(cur, session_id), write=False)

    # ---- blobs

    def put_blobs(self, blobs: Mapping[str, bytes]) -> None:
        """Store content-addressed blobs (key = sha256 hex of the bytes, verified)."""
        checked = check_blobs(blobs)
        if checked:
            self._run(lambda cur: cur.executemany(_SQL_BLOB_INSERT, checked), write=True)

    def get_blobs(self, digests: Iterable[str]) -> dict[str, bytes]:
        """The stored blobs among ``digests`` (absent digests are absent from the result); verified."""
        wanted = json.dumps(sorted(name_set(digests, "digests") or ()))
        rows = self._run(lambda cur: cur.execute(_SQL_BLOB_GET, (wanted,)).fetchall(), write=False)
        found = {str(digest): bytes(data) for digest, data in rows}
        check_blobs(found)  # BlobIntegrityError if stored bytes were altered
        return found

    # ---- retention

    def prune(self, *, keep: Iterable[str] = ()) -> PruneReport:
        """Delete snapshots not reachable from a head or ``keep`` (with their writes), then the
        blobs that only they mentioned (see ``mentioned_digests``). One write transaction: no
        commit can start to reference a blob while it is being judged unreferenced."""
        named = sorted(name_set(keep, "keep") or ())

        def prune(cur: sqlite3.Cursor) -> PruneReport:
            cur.execute(_SQL_KEEP_TABLE)
            cur.execute(_SQL_KEEP_CLEAR)
            cur.executemany(_SQL_KEEP_INSERT, [(snapshot_id,) for snapshot_id in named])
            missing = _one(cur.execute(_SQL_KEEP_MISSING))
            if missing is not None:
                raise SnapshotNotFoundError(missing[0])
            candidates: set[str] = set()
            doomed = cur.execute(_SQL_PRUNE_DOOMED).fetchall()
            for row in doomed:
                candidates |= mentioned_digests(_payload_or_empty(row))
            cur.execute(_SQL_PRUNE, (json.dumps([row[0] for row in doomed]),))
            for (payload,) in cur.execute(_SQL_DOOMED_WRITES).fetchall():
                candidates |= mentioned_digests(payload)
            cur.execute(_SQL_PRUNE_WRITES)
            cur.execute(_SQL_KEEP_CLEAR)
            kept = int(_one(cur.execute(_SQL_SNAPSHOT_COUNT))[0])
            dropped = _drop_blobs(cur, candidates)
            return PruneReport(deleted_snapshots=len(doomed), kept_snapshots=kept, deleted_blobs=dropped)

        return self._run(prune, write=True)

    def vacuum(self) -> None:
        """Rebuild the file to reclaim space freed by pruning, then truncate the WAL."""

        def vacuum(cur: sqlite3.Cursor) -> None:
            cur.execute("VACUUM")
            cur.execute("PRAGMA wal_checkpoint(TRUNCATE)")

        self._run(vacuum, write=False)

    def close(self) -> None:
        """Close this process's connection; later calls raise CheckpointError. Idempotent."""
        with self._lock:
            if self._checkpointer is not None:
                self._checkpointer.close()
                self._checkpointer = None
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = self._cursor = None
            self._closed = True


# --------------------------------------------------------------------------- helpers


def _payload_or_empty(row: Any) -> bytes:
    """A snapshots row's payload JSON, or b"" when it does not decode."""
    try:
        payload = _stored_row(row)[6]
    except SnapshotIntegrityError:
        return b""
    return payload if isinstance(payload, bytes) else payload.encode("utf-8")


def _drop_blobs(cur: sqlite3.Cursor, candidates: set[str]) -> int:
    """Delete the ``candidates`` blobs that no remaining snapshot or pending write mentions.

    Kept payloads are scanned whole (prune is maintenance, not a hot path); if any of them does
    not decode, nothing is deleted, since what it references cannot be known."""
    if not candidates:
        return 0
    present = {row[0] for row in cur.execute(_SQL_BLOB_PRESENT, (json.dumps(sorted(candidates)),))}
    if not present:
        return 0
    for row in cur.execute(_SQL_ALL_SNAPSHOTS).fetchall():
        payload = _payload_or_empty(row)
        if not payload:
            return 0
        present -= mentioned_digests(payload)
    for (payload,) in cur.execute(_SQL_ALL_WRITES).fetchall():
        present -= mentioned_digests(payload)
    if present:
        cur.execute(_SQL_BLOB_DELETE, (json.dumps(sorted(present)),))
    return len(present)


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return (code & 0xFF) in _BUSY_CODES
    message = str(exc).lower()
    return "locked" in message or "busy" in message


def _one(cur: sqlite3.Cursor) -> Any:
    """The single row of a lookup, or None. Reads to the end, so the reused cursor's statement
    is finished and holds no read snapshot between calls (``fetchone`` would leave it open)."""
    rows = cur.fetchall()
    return rows[0] if rows else None


def _in_transaction(cur: sqlite3.Cursor, fn: Callable[[sqlite3.Cursor], _T]) -> _T:
    cur.execute("BEGIN IMMEDIATE")
    try:
        result = fn(cur)
        cur.execute("COMMIT")
    except BaseException:
        if cur.connection.in_transaction:
            with contextlib.suppress(sqlite3.Error):  # SQLite already rolled back; keep the first error
                cur.execute("ROLLBACK")
        raise
    return result


def _migrate(cur: sqlite3.Cursor, path: str) -> None:
    """Bring the file to SCHEMA_VERSION, one transaction per pending migration."""
    if _schema_version(cur, path) == SCHEMA_VERSION:
        return
    for migration in _MIGRATIONS:

        def apply(cur: sqlite3.Cursor, migration: _Migration = migration) -> None:
            cur.execute(_SQL_SCHEMA_TABLE)
            if _schema_version(cur, path) < migration.version:
                for statement in migration.statements:
                    cur.execute(statement)
                if migration.backfill is not None:
                    migration.backfill(cur)
                cur.execute(_SQL_SCHEMA_RECORD, (migration.version, migration.name, utc_now()))

        _in_transaction(cur, apply)


def _schema_version(cur: sqlite3.Cursor, path: str) -> int:
    if _one(cur.execute(_SQL_SCHEMA_EXISTS)) is None:
        return 0
    version = int(_one(cur.execute(_SQL_SCHEMA_VERSION))[0])
    if version > SCHEMA_VERSION:
        raise CheckpointError(
            f"{path} has checkpoint schema version {version}, newer than this qitos supports "
            f"({SCHEMA_VERSION}); upgrade qitos to open it"
        )
    return version


@contextlib.contextmanager
def _stored_text_checked(snapshot_id: str) -> Iterator[None]:
    """Turn SQLite's "could not decode" on a damaged text column into an integrity error."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        if "decode" in str(exc).lower():
            raise SnapshotIntegrityError(snapshot_id, f"a stored row is not valid text: {exc}") from exc
        raise


def _snapshot_rows(cur: sqlite3.Cursor, sql: str, params: tuple[Any, ...], snapshot_id: str) -> list[Any]:
    with _stored_text_checked(snapshot_id):
        return cur.execute(sql, params).fetchall()


def _chain_rows(cur: sqlite3.Cursor, snapshot_id: str) -> tuple[list[Any], bool]:
    """The rows of ``snapshot_id``'s chain, oldest first ([] if it does not exist), and whether they
    came from the recursive parent walk.

    A session's snapshots are inserted in commit order, so a chain that stays within one session
    is one rowid-range read, linked up here by parent ids. A chain that crosses into a parent
    session (a fork before its first full state), or a range that does not link up (rowids
    renumbered by VACUUM, damaged rows), falls back to the recursive query; SnapshotIntegrityError
    names what is missing when that walk does not reach the base either.
    """
    with _stored_text_checked(snapshot_id):
        ends = _one(cur.execute(_SQL_CHAIN_ENDS, (snapshot_id,)))
        if ends is not None:
            rowid, session_id, base_id, base_rowid = ends
            if base_id is not None and base_rowid is not None and base_rowid <= rowid:
                by_id = {row[0]: row for row in cur.execute(_SQL_CHAIN_RANGE, (base_rowid, rowid, session_id))}
                chain: list[Any] = []
                current = by_id.get(snapshot_id)
                while current is not None and len(chain) < len(by_id):
                    chain.append(current)
                    if current[0] == base_id:
                        chain.reverse()
                        return chain, False
                    current = by_id.get(current[2])
        rows = cur.execute(_SQL_CHAIN, (snapshot_id, MAX_CHAIN)).fetchall()
    return chain_oldest_first(snapshot_id, rows), True


def _snapshot(row: Any) -> SessionSnapshot:
    return SessionSnapshot.from_stored_rows([_stored_row(row)])[0]


def _stored_row(row: Any) -> StoredSnapshotRow:
    """A snapshots row as ``SessionSnapshot.from_stored_rows`` takes it, decompressed."""
    snapshot_id, session_id, parent_id, base_id, sequence, created_at, encoding, payload = row[:8]
    if encoding == "zstd" or encoding == "zlib" or encoding == "deflate":
        try:
            # raw deflate was written by earlier versions
            payload = zlib.decompress(payload, -15) if encoding == "deflate" else unpack(payload)
        except (zlib.error, PackingError, TypeError) as exc:
            raise SnapshotIntegrityError(snapshot_id, f"compressed payload is unreadable: {exc}") from exc
    elif encoding != "json":
        raise SnapshotIntegrityError(snapshot_id, f"unknown payload encoding {encoding!r}")
    if not isinstance(payload, bytes):
        raise SnapshotIntegrityError(snapshot_id, f"stored payload is a {type(payload).__name__}, not bytes")
    return (snapshot_id, session_id, parent_id, base_id, sequence, created_at, payload)


def _lease(cur: sqlite3.Cursor, session_id: str) -> SessionLease | None:
    row = _one(cur.execute(_SQL_LEASE_GET, (session_id,)))
    if row is None:
        return None
    owner, token, expires_at = row
    return SessionLease(session_id=session_id, owner=str(owner), token=int(token), expires_at=float(expires_at))
