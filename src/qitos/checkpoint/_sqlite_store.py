"""``SqliteCheckpointStore``: the checkpoint store in one SQLite file, safe for many processes.

Design (many processes may share the file; a commit is atomic and a crash loses nothing committed):

- stdlib ``sqlite3``; per store and process one writing connection and one reading connection
  (WAL readers never wait for the writer), opened lazily, shared by threads behind locks and
  re-opened in a child after ``fork()`` (a connection inherited across ``fork()`` is never used
  nor closed by the child);
- group commit (:mod:`qitos.checkpoint._groups`): the writes of every session waiting are one
  transaction, each write in a savepoint of its own, so a refused compare-and-swap or fence rolls
  back that write alone; a write is acknowledged once its group has committed. A sync caller
  writes its group in its own thread; an async caller's group is written on its event loop, and
  its reads run there too (no thread hop);
- WAL journal, ``synchronous=NORMAL`` by default (``FULL`` on request), ``busy_timeout``; WAL
  checkpoints run on a background thread (:mod:`qitos.checkpoint._wal_checkpointer`), not inside
  whichever commit crosses the log's size limit;
- every group is one ``BEGIN IMMEDIATE`` transaction that commits on success and rolls back on
  any ``BaseException``; ``SQLITE_BUSY``/locked is retried with bounded, jittered backoff (an async
  group waits on its event loop, not inside SQLite), so
  "database is locked" never reaches the caller unless the file stays locked for
  ``retry_timeout`` seconds (then a :class:`~qitos.core._errors.CheckpointError` says so);
- a ``schema_version`` table and ordered migrations, each applied in one transaction together
  with its version row; a file written by a newer schema is refused;
- fixed SQL strings (compiled once and reused from sqlite3's statement cache); payloads stored
  as compact canonical JSON text, as a Zstandard frame (``qitos.checkpoint._packing``) when at least
  ``compress_min_bytes`` long and the frame is at least 10% smaller; the digest always covers the
  uncompressed JSON. Rows written as zlib or raw deflate by earlier versions still read.

What a crash can lose: with ``synchronous="NORMAL"`` in WAL mode a committed transaction
survives a process crash; a power loss or OS crash may roll back the most recent commits (never
corrupt the file). ``synchronous="FULL"`` makes each commit durable against power loss too.
"""

from __future__ import annotations

import asyncio
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
from dataclasses import replace
from pathlib import Path
from typing import Any, Final, Literal, ParamSpec, TypeVar

from qitos.checkpoint import _sqlite_sql as sql
from qitos.checkpoint._groups import GroupWriter, Pending
from qitos.checkpoint._packing import PackingError, pack, unpack
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
    NO_WRITES_DIGEST,
    chain_oldest_first,
    check_after,
    check_blobs,
    check_control,
    check_fence,
    check_lease_owner,
    check_lease_ttl,
    check_write_base,
    control_digest,
    fold_write_digests,
    head_digest,
    mentioned_digests,
    metadata_digest,
    name_set,
    next_lease,
    renewed_lease,
    stored_object,
    stored_text,
    verified_head,
    verified_step_writes,
    verified_write,
    write_digest,
)
from qitos.checkpoint._wal_checkpointer import SAFETY_NET_PAGES, WalCheckpointer
from qitos.checkpoint.store import SyncCheckpointStore
from qitos.core._errors import (
    CheckpointError,
    ConfigurationError,
    HeadConflictError,
    IntegrityError,
    SessionNotFoundError,
    SnapshotIntegrityError,
    UsageError,
)

__all__ = ["SCHEMA_VERSION", "SqliteCheckpointStore"]

SCHEMA_VERSION: Final[int] = sql.SCHEMA_VERSION
"""The schema version this code writes; older files are migrated to it on open."""

_T = TypeVar("_T")
_P = ParamSpec("_P")
_Work = Callable[[sqlite3.Cursor], Any]  # a write, run in a group transaction


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
        self._lock = threading.Lock()  # the reading connection (and opening connections)
        self._write_lock = threading.Lock()  # the writing connection: held by a group's writer
        self._conn: sqlite3.Connection | None = None  # writes, one group at a time
        self._cursor: sqlite3.Cursor | None = None
        self._reader: sqlite3.Connection | None = None  # reads (WAL: they never wait for a writer)
        self._rcursor: sqlite3.Cursor | None = None
        self._checkpointer: WalCheckpointer | None = None
        self._groups: GroupWriter[_Work] = self._group_writer()
        self._busy_ms = busy_timeout_ms  # the writing connection's busy timeout now (see _try_group)
        self._pid = os.getpid()
        self._closed = False
        _LIVE.add(self)

    def __repr__(self) -> str:
        return f"SqliteCheckpointStore({self.path!r}, synchronous={self.synchronous!r})"

    # ---- connections, group transactions, retries

    def _forget_parent_connection(self) -> None:
        """In a forked child: drop the parent's locks, connections and writer without touching them."""
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        _INHERITED.extend(c for c in (self._conn, self._reader) if c is not None)
        self._conn = self._cursor = self._reader = self._rcursor = None
        self._checkpointer = None  # the parent's thread does not exist here; _open starts a new one
        self._groups = self._group_writer()
        self._busy_ms = self._busy_timeout_ms
        self._pid = os.getpid()

    def _group_writer(self) -> GroupWriter[_Work]:
        return GroupWriter(self._write_group, awrite_group=self._awrite_group, name="qitos-sqlite-writer")

    def _check_usable(self) -> None:
        if self._closed:
            raise CheckpointError(f"{self!r} is closed")
        if self._pid != os.getpid():  # forked without os.register_at_fork hooks running
            self._forget_parent_connection()

    def _writer_cursor(self) -> sqlite3.Cursor:
        """The writing connection's one reused cursor (cheaper than ``conn.execute``'s new one)."""
        self._check_usable()
        if self._cursor is None:
            self._conn = self._open()
            self._cursor = self._conn.cursor()
            if self.path != ":memory:":
                self._checkpointer = WalCheckpointer(self._connect)
        return self._cursor

    def _reader_cursor(self) -> sqlite3.Cursor:
        """The reading connection's cursor (the writing one for ``:memory:``, a database of its own)."""
        self._check_usable()
        if self.path == ":memory:":
            return self._writer_cursor()
        if self._rcursor is None:
            self._reader = self._open()
            self._rcursor = self._reader.cursor()
        return self._rcursor

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

    def _read(self, fn: Callable[[sqlite3.Cursor], _T]) -> _T:
        """Run ``fn`` on the reading connection, retrying while the database is busy (rare in WAL)."""
        lock = self._write_lock if self.path == ":memory:" else self._lock
        deadline: float | None = None
        attempt = 0
        while True:
            with lock:
                try:
                    return fn(self._reader_cursor())
                except sqlite3.OperationalError as exc:
                    if not _is_busy(exc):
                        raise self._error(exc) from exc
                    busy = exc
                except sqlite3.Error as exc:
                    raise self._error(exc) from exc
            deadline, delay = self._retry_delay(busy, deadline, attempt)
            time.sleep(delay)
            attempt += 1

    def _write(self, work: Callable[[sqlite3.Cursor], _T]) -> _T:
        """Write ``work`` in the next group transaction (see ``qitos.checkpoint._groups``)."""
        result: _T = self._groups.run(work)
        return result

    async def _awrite(self, work: Callable[[sqlite3.Cursor], _T]) -> _T:
        """Async twin of :meth:`_write`: the group is written on the event loop (:meth:`_awrite_group`)."""
        result: _T = await self._groups.arun(work)
        return result

    def _write_group(self, group: list[Pending[_Work]]) -> None:
        """One ``BEGIN IMMEDIATE`` transaction for the whole group, each piece of work in a savepoint
        of its own (a refused one is rolled back alone), retried whole while the database is busy or
        locked by another process (SQLite's busy timeout first, then the store's backoff)."""
        deadline: float | None = None
        attempt = 0
        while True:
            busy = self._try_group(group, wait=True)
            if busy is None:
                return
            deadline, delay = self._retry_delay(busy, deadline, attempt)
            time.sleep(delay)
            attempt += 1

    async def _awrite_group(self, group: list[Pending[_Work]]) -> None:
        """:meth:`_write_group` on the event loop of the sessions waiting for it: a group is a few
        hundred microseconds of work, and done here it needs no thread (a writer thread would wait for
        the event loop's GIL at every statement). When another process holds the database, the
        group does not wait inside SQLite: the event loop goes on and the group is tried again."""
        deadline: float | None = None
        attempt = 0
        while True:
            busy = self._try_group(group, wait=False)
            if busy is None:
                return
            deadline, delay = self._retry_delay(busy, deadline, attempt)
            await asyncio.sleep(delay)
            attempt += 1

    def _try_group(self, group: list[Pending[_Work]], *, wait: bool) -> sqlite3.OperationalError | None:
        """Write ``group`` once; the busy error when the database was locked (nothing written)."""
        with self._write_lock:
            try:
                cur = self._writer_cursor()
                busy_ms = self._busy_timeout_ms if wait else 0
                if self._busy_ms != busy_ms:
                    cur.execute(f"PRAGMA busy_timeout = {busy_ms}")
                    self._busy_ms = busy_ms
                _write_in_transaction(cur, group, self._error)
                if self._checkpointer is not None:
                    self._checkpointer.committed()
                return None
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise self._error(exc) from exc
                return exc
            except sqlite3.Error as exc:
                raise self._error(exc) from exc

    def _retry_delay(self, busy: sqlite3.OperationalError, deadline: float | None, attempt: int) -> tuple[float, float]:
        """The deadline and how long to wait before the next attempt on a busy database (1 ms .. 64 ms,
        jittered); CheckpointError once it has stayed locked for ``retry_timeout`` seconds."""
        now = time.monotonic()
        if deadline is None:
            deadline = now + self._retry_timeout
        if now >= deadline:
            raise CheckpointError(
                f"{self.path}: the database stayed locked by other writers for {self._retry_timeout:g} s "
                f"({attempt + 1} attempts); last SQLite error: {busy}"
            ) from busy
        return deadline, 0.001 * 2 ** min(attempt, 6) * random.uniform(0.5, 1.0)

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
        row = self._read(lambda cur: _one(cur.execute(sql.HEAD_GET, (session_id,))))
        return None if row is None else verified_head(*row)

    def commit_session_snapshot(self, request: SessionSnapshotCommit) -> SessionCommitReceipt:
        """Atomically persist an immutable snapshot (and blobs) and advance its head (CAS)."""
        return self._write(self._commit_work(request))

    async def acommit_session_snapshot(self, request: SessionSnapshotCommit) -> SessionCommitReceipt:
        return await self._awrite(self._commit_work(request))

    def _commit_work(self, request: SessionSnapshotCommit) -> Callable[[sqlite3.Cursor], SessionCommitReceipt]:
        """A head commit's work in a group transaction (validated and encoded here, before it)."""
        payload_json = request.validate()
        metadata = request.session_metadata
        metadata_json = None if metadata is None else json_text(metadata, "session_metadata")
        blobs = check_blobs(request.blobs) if request.blobs else []
        snapshot = request.snapshot
        encoding, stored = self._encode(payload_json)
        session_id = request.session_id
        expected = request.expected_head
        operation_id = request.operation_id

        def commit(cur: sqlite3.Cursor) -> SessionCommitReceipt:
            execute = cur.execute
            control_seq = 0
            now = utc_now()
            digest = head_digest(session_id, snapshot.snapshot_id, snapshot.sequence, request.lifecycle, now)
            head = (snapshot.snapshot_id, snapshot.sequence, request.lifecycle, now, digest)
            if expected is None:
                if execute(sql.HEAD_CREATE, (session_id, *head)).rowcount != 1:
                    actual = _one(execute(sql.HEAD_ID, (session_id,)))
                    raise HeadConflictError(session_id, None, None if actual is None else actual[0])
                meta = metadata_json or "{}"
                execute(sql.METADATA_CREATE, (session_id, meta, metadata_digest(session_id, meta)))
            else:
                now_s = time.time()
                token = request.lease_token
                if token is None:
                    check_fence(session_id, _lease(cur, session_id), None, now_s)
                    row = _one(execute(sql.HEAD_ADVANCE, (*head, session_id, expected)))
                else:  # the fence is checked by the UPDATE itself: one statement on the hot path
                    fenced = (*head, session_id, expected, session_id, token, now_s)
                    row = _one(execute(sql.HEAD_ADVANCE_FENCED, fenced))
                if row is not None:
                    control_seq = int(row[0])
                else:
                    actual = _one(execute(sql.HEAD_ID, (session_id,)))
                    if actual is None:
                        raise SessionNotFoundError(session_id)
                    check_fence(session_id, _lease(cur, session_id), token, now_s)
                    raise HeadConflictError(session_id, expected, actual[0])
                if metadata_json is not None:
                    execute(sql.METADATA_SET, (metadata_json, metadata_digest(session_id, metadata_json), session_id))
            if operation_id is not None:
                owner = _one(execute(sql.OPERATION_GET, (operation_id,)))
                if owner is not None:
                    raise DuplicateOperationError(operation_id, owner[0])
            parent_id = snapshot.parent_id
            # A head always names a stored snapshot, so a parent equal to the head just matched exists.
            if (
                parent_id is not None
                and parent_id != expected
                and _one(execute(sql.SNAPSHOT_SESSION, (parent_id,))) is None
            ):
                raise SnapshotNotFoundError(parent_id)
            execute(
                sql.SNAPSHOT_INSERT,
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
                cur.executemany(sql.BLOB_INSERT, blobs)
            if operation_id is not None:
                execute(sql.OPERATION_INSERT, (operation_id, session_id, snapshot.snapshot_id, now))
            return SessionCommitReceipt(
                session_id=session_id,
                snapshot_id=snapshot.snapshot_id,
                previous_head=expected,
                sequence=snapshot.sequence,
                committed_at=now,
                control_seq=control_seq,
            )

        return commit

    def find_session_by_operation(self, operation_id: str) -> str | None:
        """The session a commit with this ``operation_id`` created, or None."""
        row = self._read(lambda cur: _one(cur.execute(sql.OPERATION_GET, (operation_id,))))
        return None if row is None else str(row[0])

    def get_snapshot(self, snapshot_id: str) -> SessionSnapshot:
        """Read one verified snapshot; SnapshotNotFoundError or SnapshotIntegrityError."""
        rows = self._read(lambda cur: _snapshot_rows(cur, sql.SNAPSHOT_GET, (snapshot_id,), snapshot_id))
        if not rows:
            raise SnapshotNotFoundError(snapshot_id)
        return _snapshot(rows[0])

    def load_chain(self, snapshot_id: str) -> list[SessionSnapshot]:
        """The snapshot and its ancestors back to and including its base, oldest first, verified."""
        rows, _ = self._read(lambda cur: _chain_rows(cur, snapshot_id))
        if not rows:
            raise SnapshotNotFoundError(snapshot_id)
        return SessionSnapshot.from_stored_rows([_stored_row(row) for row in rows])

    def list_sessions(self, *, lifecycles: Iterable[str] | None = None) -> list[SessionHeadRecord]:
        """Every session head (only those in ``lifecycles``, when given), in creation order."""
        wanted = name_set(lifecycles, "lifecycles")
        if wanted is not None and not wanted:
            return []
        statement = sql.HEAD_LIST if wanted is None else sql.head_list_in(len(wanted))
        params = sorted(wanted or ())
        rows = self._read(lambda cur: cur.execute(statement, params).fetchall())
        return [verified_head(*row) for row in rows]

    def list_session_snapshots(self, session_id: str) -> list[str]:
        """The session's head chain within the session, newest first."""

        def read(cur: sqlite3.Cursor) -> list[str]:
            ids = [row[0] for row in cur.execute(sql.SESSION_CHAIN, (session_id,))]
            if not ids and _one(cur.execute(sql.HEAD_ID, (session_id,))) is None:
                raise SessionNotFoundError(session_id)
            return ids

        return self._read(read)

    # ---- pending writes

    def put_writes(self, writes: Sequence[StepWrite]) -> list[bool]:
        """Store pending writes in one transaction; per write, whether it was new (first wins)."""
        work = self._put_work(writes)
        return [] if work is None else self._write(work)

    async def aput_writes(self, writes: Sequence[StepWrite]) -> list[bool]:
        work = self._put_work(writes)
        return [] if work is None else await self._awrite(work)

    def _put_work(self, writes: Sequence[StepWrite]) -> Callable[[sqlite3.Cursor], list[bool]] | None:
        """Pending writes' work in a group transaction (None: nothing to write)."""
        rows = []
        for w in writes:
            payload_json = w.payload_json()
            digest = write_digest(w, payload_json)
            rows.append((w.session_id, w.base_snapshot_id, w.kind, w.key, w.step_id, payload_json, digest))
        if not rows:
            return None

        def put(cur: sqlite3.Cursor) -> list[bool]:
            # The tally of each (session, base) whose base is its session's head: the digest so far.
            tallies: dict[tuple[str, str], str | None] = {}
            fenced: set[str] = set()
            now = time.time()
            for write in writes:
                pair = (write.session_id, write.base_snapshot_id)
                if pair not in tallies:
                    base = _one(cur.execute(sql.WRITE_BASE, pair))
                    check_write_base(write, None if base is None else base[0])
                    tallies[pair] = base[2] if base[1] == write.base_snapshot_id else None
                if write.session_id not in fenced:
                    check_fence(write.session_id, _lease(cur, write.session_id), write.lease_token, now)
                    fenced.add(write.session_id)
            stored = [cur.execute(sql.WRITE_INSERT, row).rowcount == 1 for row in rows]
            for pair, tally in tallies.items():
                if tally is None:
                    continue
                new = [row[6] for row, is_new in zip(rows, stored, strict=True) if is_new and row[:2] == pair]
                if new:
                    fold = fold_write_digests(_unhex(tally, pair[0]), new)
                    cur.execute(sql.WRITE_TALLY, (len(new), sql.tally_hex(fold), *pair))
            return stored

        return put

    def get_writes(self, session_id: str, base_snapshot_id: str) -> list[StepWrite]:
        """Pending writes of the step that started at ``base_snapshot_id``, in write order, verified
        (on the session's head: against the head's tally of them too)."""
        rows = self._read(lambda cur: cur.execute(sql.WRITE_LIST, (session_id, base_snapshot_id)).fetchall())
        tally = rows.pop(0) if rows and rows[0][0] == 0 else None
        out = []
        for _, step_id, kind_raw, key_raw, payload_raw, digest in rows:
            kind = stored_text(kind_raw, "writes", "?", session_id)
            key = stored_text(key_raw, "writes", kind, session_id)
            out.append(verified_write(session_id, base_snapshot_id, step_id, kind, key, payload_raw, digest))
        if tally is not None:
            digests = [row[5] for row in rows]
            verified_step_writes(
                session_id, base_snapshot_id, int(tally[1]), _unhex(tally[5], session_id), out, digests
            )
        return out

    # ---- control items

    def append_control(self, session_id: str, kind: str, payload: Mapping[str, Any]) -> ControlItem:
        """Durably append one control item; the store assigns its position (a counter in the head row)."""
        return self._write(self._append_work(session_id, kind, payload))

    async def aappend_control(self, session_id: str, kind: str, payload: Mapping[str, Any]) -> ControlItem:
        return await self._awrite(self._append_work(session_id, kind, payload))

    def _append_work(
        self, session_id: str, kind: str, payload: Mapping[str, Any]
    ) -> Callable[[sqlite3.Cursor], ControlItem]:
        payload_json = check_control(session_id, kind, payload)

        def append(cur: sqlite3.Cursor) -> ControlItem:
            row = _one(cur.execute(sql.CONTROL_NEXT, (session_id,)))
            if row is None:
                raise SessionNotFoundError(session_id)
            position = int(row[0])
            now = utc_now()
            digest = control_digest(session_id, position, kind, payload_json, now)
            cur.execute(sql.CONTROL_INSERT, (session_id, position, kind, payload_json, now, digest))
            return ControlItem(
                session_id=session_id,
                position=position,
                kind=kind,
                payload=stored_object(payload_json, "control", str(position), session_id),
                created_at=now,
            )

        return append

    def list_control(self, session_id: str, *, after: int = 0, kinds: Iterable[str] | None = None) -> list[ControlItem]:
        """Control items with position > ``after`` (optionally only ``kinds``), by position, verified.

        The head row's counter says how many items exist: a missing item (a damaged or truncated
        file) raises IntegrityError instead of being skipped silently.
        """
        wanted = name_set(kinds, "kinds")
        start = check_after(after)

        def read(cur: sqlite3.Cursor) -> tuple[int, list[Any]]:
            seq = _one(cur.execute(sql.CONTROL_SEQ, (session_id,)))
            if seq is None:
                raise SessionNotFoundError(session_id)
            return int(seq[0]), cur.execute(sql.CONTROL_LIST, (session_id, start)).fetchall()

        count, rows = self._read(read)
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
        return self._write(self._acquire_work(session_id, owner, ttl_seconds, take_over_from))

    async def aacquire_lease(
        self, session_id: str, owner: str, *, ttl_seconds: float, take_over_from: str | None = None
    ) -> SessionLease:
        return await self._awrite(self._acquire_work(session_id, owner, ttl_seconds, take_over_from))

    def _acquire_work(
        self, session_id: str, owner: str, ttl_seconds: float, take_over_from: str | None
    ) -> Callable[[sqlite3.Cursor], SessionLease]:
        ttl = check_lease_ttl(ttl_seconds)
        check_lease_owner(owner, take_over_from)

        def acquire(cur: sqlite3.Cursor) -> SessionLease:
            head = _one(cur.execute(sql.HEAD_AND_CONTROL_SEQ, (session_id,)))
            if head is None:
                raise SessionNotFoundError(session_id)
            lease = next_lease(_lease(cur, session_id), session_id, owner, ttl, time.time(), take_over_from)
            cur.execute(sql.LEASE_PUT, (session_id, lease.owner, lease.token, lease.expires_at))
            return replace(lease, head_snapshot_id=head[0], control_seq=int(head[1]))

        return acquire

    def renew_lease(self, lease: SessionLease, *, ttl_seconds: float) -> SessionLease:
        """Extend a held lease; LeaseLostError if it expired or was taken over."""
        return self._write(self._renew_work(lease, ttl_seconds))

    async def arenew_lease(self, lease: SessionLease, *, ttl_seconds: float) -> SessionLease:
        return await self._awrite(self._renew_work(lease, ttl_seconds))

    def _renew_work(self, lease: SessionLease, ttl_seconds: float) -> Callable[[sqlite3.Cursor], SessionLease]:
        ttl = check_lease_ttl(ttl_seconds)

        def renew(cur: sqlite3.Cursor) -> SessionLease:
            renewed = renewed_lease(_lease(cur, lease.session_id), lease, ttl, time.time())
            cur.execute(sql.LEASE_PUT, (renewed.session_id, renewed.owner, renewed.token, renewed.expires_at))
            return renewed

        return renew

    def release_lease(self, lease: SessionLease) -> None:
        """Give the lease up now (a no-op if it is no longer current); its token stays used."""
        self._write(_release_work(lease))

    async def arelease_lease(self, lease: SessionLease) -> None:
        await self._awrite(_release_work(lease))

    def get_lease(self, session_id: str) -> SessionLease | None:
        """The session's current lease row (possibly lapsed), or None if it never had one."""
        return self._read(lambda cur: _lease(cur, session_id))

    # ---- blobs

    def put_blobs(self, blobs: Mapping[str, bytes]) -> None:
        """Store content-addressed blobs (key = sha256 hex of the bytes, verified)."""
        checked = check_blobs(blobs)
        if checked:
            self._write(lambda cur: cur.executemany(sql.BLOB_INSERT, checked))

    async def aput_blobs(self, blobs: Mapping[str, bytes]) -> None:
        checked = check_blobs(blobs)
        if checked:
            await self._awrite(lambda cur: cur.executemany(sql.BLOB_INSERT, checked))

    def get_blobs(self, digests: Iterable[str]) -> dict[str, bytes]:
        """The stored blobs among ``digests`` (absent digests are absent from the result); verified."""
        wanted = json.dumps(sorted(name_set(digests, "digests") or ()))
        rows = self._read(lambda cur: cur.execute(sql.BLOB_GET, (wanted,)).fetchall())
        found = {str(digest): bytes(data) for digest, data in rows}
        check_blobs(found)  # BlobIntegrityError if stored bytes were altered
        return found

    # ---- retention

    def prune(self, *, keep: Iterable[str] = ()) -> PruneReport:
        """Delete snapshots not reachable from a head or ``keep`` (with their writes), then the
        blobs that only they mentioned (see ``mentioned_digests``). One write transaction: no
        commit can start to reference a blob while it is being judged unreferenced."""
        return self._write(self._prune_work(keep))

    async def aprune(self, *, keep: Iterable[str] = ()) -> PruneReport:
        return await self._awrite(self._prune_work(keep))

    def _prune_work(self, keep: Iterable[str]) -> Callable[[sqlite3.Cursor], PruneReport]:
        named = sorted(name_set(keep, "keep") or ())

        def prune(cur: sqlite3.Cursor) -> PruneReport:
            cur.execute(sql.KEEP_TABLE)
            cur.execute(sql.KEEP_CLEAR)
            cur.executemany(sql.KEEP_INSERT, [(snapshot_id,) for snapshot_id in named])
            missing = _one(cur.execute(sql.KEEP_MISSING))
            if missing is not None:
                raise SnapshotNotFoundError(missing[0])
            candidates: set[str] = set()
            doomed = cur.execute(sql.PRUNE_DOOMED).fetchall()
            for row in doomed:
                candidates |= mentioned_digests(_payload_or_empty(row))
            cur.execute(sql.PRUNE, (json.dumps([row[0] for row in doomed]),))
            for (payload,) in cur.execute(sql.DOOMED_WRITES).fetchall():
                candidates |= mentioned_digests(payload)
            cur.execute(sql.PRUNE_WRITES)
            cur.execute(sql.KEEP_CLEAR)
            kept = int(_one(cur.execute(sql.SNAPSHOT_COUNT))[0])
            dropped = _drop_blobs(cur, candidates)
            return PruneReport(deleted_snapshots=len(doomed), kept_snapshots=kept, deleted_blobs=dropped)

        return prune

    def vacuum(self) -> None:
        """Rebuild the file to reclaim space freed by pruning, then truncate the WAL (on the writing
        connection, between two groups: VACUUM runs outside any transaction)."""
        with self._write_lock:
            try:
                cur = self._writer_cursor()
                cur.execute("VACUUM")
                cur.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:
                raise self._error(exc) from exc

    async def avacuum(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.vacuum)

    def close(self) -> None:
        """Close this process's connections; later calls raise CheckpointError. Idempotent."""
        with self._write_lock, self._lock:
            if self._checkpointer is not None:
                self._checkpointer.close()
                self._checkpointer = None
            if self._pid == os.getpid():
                for conn in (self._conn, self._reader):
                    if conn is not None:
                        conn.close()
            self._conn = self._cursor = self._reader = self._rcursor = None
            self._closed = True
        self._groups.close()

    async def aclose(self) -> None:
        self.close()

    async def _offload(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Reads run inline on the event loop (WAL readers never wait for a writer); writes have
        async twins of their own that join a group (:meth:`_awrite`)."""
        return fn(*args, **kwargs)


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
    present = {row[0] for row in cur.execute(sql.BLOB_PRESENT, (json.dumps(sorted(candidates)),))}
    if not present:
        return 0
    for row in cur.execute(sql.ALL_SNAPSHOTS).fetchall():
        payload = _payload_or_empty(row)
        if not payload:
            return 0
        present -= mentioned_digests(payload)
    for (payload,) in cur.execute(sql.ALL_WRITES).fetchall():
        present -= mentioned_digests(payload)
    if present:
        cur.execute(sql.BLOB_DELETE, (json.dumps(sorted(present)),))
    return len(present)


def _unhex(stored: Any, session_id: str) -> int:
    """A stored tally digest ('' for none); IntegrityError names the head row when it is damaged."""
    try:
        return int(stored, 16) if stored else NO_WRITES_DIGEST
    except (TypeError, ValueError) as exc:
        raise IntegrityError(
            "heads", session_id, f"its tally of pending writes is unreadable: {exc}", session_id=session_id
        ) from exc


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


def _write_in_transaction(
    cur: sqlite3.Cursor, group: list[Pending[_Work]], error: Callable[[sqlite3.Error], CheckpointError]
) -> None:
    """Run each piece of ``group``'s work in a savepoint of one transaction, setting its outcome."""
    execute = cur.execute
    execute("BEGIN IMMEDIATE")
    try:
        for pending in group:
            pending.error = None
            execute("SAVEPOINT work")
            try:
                pending.result = pending.work(cur)
            except (CheckpointError, UsageError, sqlite3.Error) as exc:
                if isinstance(exc, sqlite3.OperationalError) and _is_busy(exc):
                    raise  # the group is retried whole
                execute("ROLLBACK TO work")
                pending.error = error(exc) if isinstance(exc, sqlite3.Error) else exc
            execute("RELEASE work")
        execute("COMMIT")
    except BaseException:
        if cur.connection.in_transaction:
            with contextlib.suppress(sqlite3.Error):  # SQLite already rolled back; keep the first error
                execute("ROLLBACK")
        raise


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
    for migration in sql.MIGRATIONS:

        def apply(cur: sqlite3.Cursor, migration: sql.Migration = migration) -> None:
            cur.execute(sql.SCHEMA_TABLE)
            if _schema_version(cur, path) < migration.version:
                for statement in migration.statements:
                    cur.execute(statement)
                if migration.backfill is not None:
                    migration.backfill(cur)
                cur.execute(sql.SCHEMA_RECORD, (migration.version, migration.name, utc_now()))

        _in_transaction(cur, apply)


def _schema_version(cur: sqlite3.Cursor, path: str) -> int:
    if _one(cur.execute(sql.SCHEMA_EXISTS)) is None:
        return 0
    version = int(_one(cur.execute(sql.SCHEMA_VERSION_GET))[0])
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
        ends = _one(cur.execute(sql.CHAIN_ENDS, (snapshot_id,)))
        if ends is not None:
            rowid, session_id, base_id, base_rowid = ends
            if base_id is not None and base_rowid is not None and base_rowid <= rowid:
                by_id = {row[0]: row for row in cur.execute(sql.CHAIN_RANGE, (base_rowid, rowid, session_id))}
                chain: list[Any] = []
                current = by_id.get(snapshot_id)
                while current is not None and len(chain) < len(by_id):
                    chain.append(current)
                    if current[0] == base_id:
                        chain.reverse()
                        return chain, False
                    current = by_id.get(current[2])
        rows = cur.execute(sql.CHAIN, (snapshot_id, MAX_CHAIN)).fetchall()
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


def _release_work(lease: SessionLease) -> Callable[[sqlite3.Cursor], None]:
    def release(cur: sqlite3.Cursor) -> None:
        cur.execute(sql.LEASE_RELEASE, (lease.session_id, lease.token, lease.owner))

    return release


def _lease(cur: sqlite3.Cursor, session_id: str) -> SessionLease | None:
    row = _one(cur.execute(sql.LEASE_GET, (session_id,)))
    if row is None:
        return None
    owner, token, expires_at = row
    return SessionLease(session_id=session_id, owner=str(owner), token=int(token), expires_at=float(expires_at))
