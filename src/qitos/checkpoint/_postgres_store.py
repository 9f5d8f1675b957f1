"""``PostgresCheckpointStore``: the checkpoint store in a PostgreSQL schema, for many machines.

Install with the ``qitos-kernel[postgres]`` extra (psycopg 3 and psycopg_pool). Design:

- sync methods run on psycopg's ``ConnectionPool``, the async twins natively on an
  ``AsyncConnectionPool`` (one per event loop), never ``asyncio.run`` per call and never behind a
  store-wide lock. Connections are autocommit, so a one-statement method is one round trip; a
  connection idle for ``check_idle_after`` seconds or more is checked with
  ``ConnectionPool.check_connection`` before use (cloud databases drop idle connections during
  long model calls). ``prepare_threshold`` is passed to psycopg (None for PgBouncer in
  transaction mode);
- the head commit is ONE statement at READ COMMITTED: the conditional ``UPDATE`` of the head
  (``WHERE snapshot_id = expected``, or an ``INSERT ... ON CONFLICT DO NOTHING`` for a new session)
  with the snapshot, blob and operation inserts in data-modifying CTEs that run only when the head
  moved. When nothing moved, one lookup tells ``HeadConflictError`` from an unknown session, a
  used operation id or a missing parent;
- payloads are ``bytea`` holding their exact canonical JSON bytes (a Zstandard frame when at least
  ``compress_min_bytes`` long and 10% smaller, as in SQLite); snapshots are verified against their
  digest on every read;
- control positions come from a counter in the head row (``UPDATE ... RETURNING``), and the append
  sends ``pg_notify`` in the same statement; :meth:`PostgresCheckpointStore.wait_for_control`
  LISTENs for it (a slow poll takes over while the listening connection is lost);
- a ``schema_version`` table and ordered migrations (:mod:`qitos.checkpoint._postgres_sql`), applied
  under an advisory lock so processes opening the same schema at once migrate it once.

Each method is written once, as a *plan*: a generator that yields ``(sql, params)`` and receives
the rows, driven by a sync or an async runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final, TypeVar

from qitos.checkpoint._groups import GroupWriter, Pending
from qitos.checkpoint._packing import PackingError, pack, unpack
from qitos.checkpoint._postgres_sql import SCHEMA_VERSION, StoreSql
from qitos.checkpoint._records import (
    ControlItem,
    DuplicateOperationError,
    PruneReport,
    SessionCommitReceipt,
    SessionHeadRecord,
    SessionLease,
    SessionPosition,
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
    check_lease_owner,
    check_lease_ttl,
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
    verified_position,
    verified_step_writes,
    verified_write,
    write_digest,
)
from qitos.checkpoint.store import CheckpointStore
from qitos.core._errors import (
    CheckpointError,
    ConfigurationError,
    HeadConflictError,
    IntegrityError,
    SessionNotFoundError,
    SnapshotIntegrityError,
)
from qitos.core._install import install_command

if TYPE_CHECKING:
    import psycopg_pool

__all__ = ["APPLICATION_NAME", "SCHEMA_VERSION", "ControlAnnouncements", "PostgresCheckpointStore", "TableSize"]

APPLICATION_NAME: Final = "qitos"
"""The ``application_name`` of the store's connections (unless the DSN names one)."""

_T = TypeVar("_T")
# Pending writes per statement: a step's are a handful; a larger batch is split (in one transaction),
# which keeps each statement's parameters (8 a write) far below PostgreSQL's limit of 65,535.
_WRITES_PER_STATEMENT = 64

Rows = list[tuple[Any, ...]]
Query = tuple[str, Sequence[Any] | Mapping[str, Any]]
Plan = Generator[Query, Rows, _T]
"""A store operation: yields each statement with its parameters, receives its rows, returns the result."""

_COMMIT_ATTEMPTS: Final = 8  # a refused commit whose lookup finds nothing wrong (a race) is retried


def _psycopg() -> tuple[Any, Any, Any]:
    """psycopg, psycopg_pool and the store's connection classes, imported on first use (``import
    qitos`` never imports psycopg)."""
    try:
        import psycopg
        import psycopg_pool

        from qitos.checkpoint import _postgres_connections
    except ImportError as exc:
        raise ConfigurationError(
            f"PostgresCheckpointStore needs the postgres extra: {install_command('postgres')} ({exc})"
        ) from exc
    return psycopg, psycopg_pool, _postgres_connections


@dataclass(frozen=True, slots=True)
class TableSize:
    """One table of the store and its size on disk in bytes (with its indexes and TOAST)."""

    table: str
    bytes: int


_LIVE: weakref.WeakSet[PostgresCheckpointStore] = weakref.WeakSet()


class ControlAnnouncements:
    """Which sessions got control items, from the schema's LISTEN/NOTIFY channel (a connection of its own).

    :meth:`wait` returns the ids announced within a timeout, or None when it was not listening
    before the call (its first call, after a lost connection): items appended then were announced
    to nobody, so a caller that must see every one looks at the store itself when it gets None.
    """

    def __init__(self, store: PostgresCheckpointStore) -> None:
        self._store = store
        self._listener: Any = None

    def wait(self, timeout: float, *, session_id: str | None = None) -> set[str] | None:
        """The session ids announced within ``timeout`` seconds, or None (see above).

        It returns at the first announcement, or with ``session_id`` at the first for that
        session. Not listening, it starts to and returns None at once; with the server
        unreachable it returns None after the store's ``poll_interval`` (or ``timeout``).
        """
        timeout = _check_timeout(timeout)
        store = self._store
        if self._listener is None:
            self._listener = store._listen()
            if self._listener is None:
                time.sleep(min(timeout, store._poll_interval))
            return None
        announced: set[str] = set()
        try:
            for notify in self._listener.notifies(timeout=timeout):
                announced.add(notify.payload)
                if session_id is None or notify.payload == session_id:
                    break
            if announced:  # take what else is queued already, without waiting
                announced.update(n.payload for n in self._listener.notifies(timeout=0))
        except store._psycopg.Error:
            self.close()
            return None
        return announced

    def close(self) -> None:
        """Stop listening (idempotent)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()


def _after_fork_in_child() -> None:
    for store in list(_LIVE):
        store._forget_parent_pools()


os.register_at_fork(after_in_child=_after_fork_in_child)


class PostgresCheckpointStore(CheckpointStore):
    """A :class:`~qitos.checkpoint.store.CheckpointStore` in one PostgreSQL schema (see module docs).

    ``dsn`` is a libpq connection string or ``postgresql://`` URL; ``schema`` the schema holding
    the tables (created with them on first use). ``min_size``/``max_size`` bound each connection
    pool; ``pool_timeout`` is how long a call waits for a free connection. A pooled connection idle
    for at least ``check_idle_after`` seconds is checked before use (0: before every use, one
    round trip more per call). ``prepare_threshold`` is psycopg's: how often a connection runs a
    statement before preparing it (0, the default: at its first use, since the store runs a fixed
    set of statements; None: never prepare, for PgBouncer in transaction mode).
    ``compress_min_bytes`` (None: never) is the payload size from which Zstandard compression is
    tried. ``poll_interval`` is how often :meth:`wait_for_control` polls while it has no listening
    connection.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "qitos",
        min_size: int = 1,
        max_size: int = 10,
        pool_timeout: float = 30.0,
        check_idle_after: float = 1.0,
        prepare_threshold: int | None = 0,
        compress_min_bytes: int | None = 512,
        poll_interval: float = 2.0,
    ) -> None:
        if not isinstance(dsn, str) or not dsn:
            raise ConfigurationError(f"dsn must be a non-empty PostgreSQL connection string, got {dsn!r}")
        sizes_ok = isinstance(min_size, int) and isinstance(max_size, int) and 0 <= min_size <= max_size >= 1
        if not sizes_ok:
            raise ConfigurationError(f"need 0 <= min_size <= max_size, max_size >= 1; got {min_size!r}, {max_size!r}")
        for name, value in (("pool_timeout", pool_timeout), ("poll_interval", poll_interval)):
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ConfigurationError(f"{name} must be a positive number of seconds, got {value!r}")
        if not isinstance(check_idle_after, int | float) or isinstance(check_idle_after, bool) or check_idle_after < 0:
            raise ConfigurationError(f"check_idle_after must be a number of seconds >= 0, got {check_idle_after!r}")
        if prepare_threshold is not None and (not isinstance(prepare_threshold, int) or prepare_threshold < 0):
            raise ConfigurationError(f"prepare_threshold must be None or an int >= 0, got {prepare_threshold!r}")
        if compress_min_bytes is not None and (not isinstance(compress_min_bytes, int) or compress_min_bytes < 0):
            raise ConfigurationError(f"compress_min_bytes must be None or an int >= 0, got {compress_min_bytes!r}")
        self._psycopg, self._pool_module, self._connections = _psycopg()
        self.dsn = dsn
        self.sql = StoreSql(schema)
        self.schema = schema
        self._min_size = min_size
        self._max_size = max_size
        self._pool_timeout = float(pool_timeout)
        self._check_idle_after = float(check_idle_after)
        self._prepare_threshold = prepare_threshold
        self._compress_min = compress_min_bytes
        self._poll_interval = float(poll_interval)
        self._where = _describe(self._psycopg, dsn, schema)
        self._application_name = {} if "application_name" in dsn else {"application_name": APPLICATION_NAME}
        self._lock = threading.Lock()  # guards opening and closing the pools, never a call
        self._pool: psycopg_pool.ConnectionPool[Any] | None = None
        # One AsyncConnectionPool per event loop, with the task that closes it when its loop ends.
        self._apools: dict[asyncio.AbstractEventLoop, tuple[psycopg_pool.AsyncConnectionPool[Any], asyncio.Task[None]]]
        self._apools = {}
        self._apools_opening: dict[asyncio.AbstractEventLoop, asyncio.Future[Any]] = {}  # pools being opened
        self._migrated = False
        self._closed = False
        self._groups: GroupWriter[_Work] = self._group_writer()
        _LIVE.add(self)

    def __repr__(self) -> str:
        return f"PostgresCheckpointStore({self._where})"

    # ---- pools

    def _forget_parent_pools(self) -> None:
        """In a forked child: drop the parent's pools and writer without touching their threads or sockets."""
        self._lock = threading.Lock()
        self._pool = None
        self._apools = {}
        self._apools_opening = {}
        self._groups = self._group_writer()

    def _group_writer(self) -> GroupWriter[_Work]:
        return GroupWriter(self._write_group, awrite_group=self._awrite_group, name=f"qitos-pg-{self.schema}")

    def _pool_sizes(self) -> dict[str, Any]:
        """What the sync and the async pools share: sizes, wait for a connection, connection options."""
        return {
            "min_size": self._min_size,
            "max_size": self._max_size,
            "timeout": self._pool_timeout,
            "kwargs": self._connect_kwargs(),
        }

    def _connect_kwargs(self) -> dict[str, Any]:
        # application_name unless the DSN sets its own: operators can tell qitos' connections apart.
        return {"autocommit": True, "prepare_threshold": self._prepare_threshold, **self._application_name}

    def _configure(self, conn: Any) -> None:
        """Pool ``configure`` callback: prepared statements keep one generic plan (see ``StoreSql.generic_plans``)."""
        if self._prepare_threshold is not None:
            conn.execute(self.sql.generic_plans)

    async def _aconfigure(self, made: weakref.WeakSet[Any], conn: Any) -> None:
        made.add(conn)  # for _close_with_loop
        if self._prepare_threshold is not None:
            await conn.execute(self.sql.generic_plans)

    def _stamp(self, conn: Any) -> None:
        """Remember when a connection went back idle (done here, not as the pool's ``reset``
        callback: a pool with one returns every connection through a worker task, which costs a
        task switch per statement and leaves connections in transit when an event loop ends)."""
        conn.returned_at = time.monotonic()

    def _idle_too_long(self, conn: Any) -> bool:
        returned = conn.returned_at
        return returned is None or time.monotonic() - returned >= self._check_idle_after

    def _check(self, conn: Any) -> None:
        """Pool ``check`` callback: ``ConnectionPool.check_connection`` on a connection idle too long."""
        if self._idle_too_long(conn):
            self._pool_module.ConnectionPool.check_connection(conn)

    async def _acheck(self, conn: Any) -> None:
        if self._idle_too_long(conn):
            await self._pool_module.AsyncConnectionPool.check_connection(conn)

    def _ensure_open(self) -> None:
        if self._closed:
            raise CheckpointError(f"{self!r} is closed")

    def _sync_pool(self) -> psycopg_pool.ConnectionPool[Any]:
        pool = self._pool
        if pool is not None:
            return pool
        with self._lock:
            self._ensure_open()
            if self._pool is None:
                self._migrate()
                self._pool = self._pool_module.ConnectionPool(
                    self.dsn,
                    connection_class=self._connections.StoreConnection,
                    **self._pool_sizes(),
                    configure=self._configure,
                    check=self._check,
                    name=f"qitos-{self.schema}",
                    open=True,
                )
            return self._pool

    async def _async_pool(self) -> psycopg_pool.AsyncConnectionPool[Any]:
        loop = asyncio.get_running_loop()
        known = self._apools.get(loop)
        if known is not None:
            return known[0]
        # The first calls on a loop often come many at once (a worker starting its sessions): one
        # of them opens the pool, the others wait for it, so a loop never gets two.
        opening = self._apools_opening.get(loop)
        if opening is not None:
            return await asyncio.shield(opening)
        opening = self._apools_opening[loop] = loop.create_future()
        try:
            pool = await self._open_async_pool(loop)
        except BaseException as exc:
            opening.set_exception(exc)
            opening.exception()  # retrieved: the waiters, if any, get it too
            raise
        finally:
            del self._apools_opening[loop]
        opening.set_result(pool)
        return pool

    async def _open_async_pool(self, loop: asyncio.AbstractEventLoop) -> psycopg_pool.AsyncConnectionPool[Any]:
        self._ensure_open()
        if not self._migrated:
            await asyncio.to_thread(self._migrate_once)
        for stale in [other for other in self._apools if other.is_closed()]:
            del self._apools[stale]  # closed by its guard before its loop ended
        made: weakref.WeakSet[Any] = weakref.WeakSet()  # every connection the pool opens
        pool: psycopg_pool.AsyncConnectionPool[Any] = self._pool_module.AsyncConnectionPool(
            self.dsn,
            connection_class=self._connections.AsyncStoreConnection,
            **self._pool_sizes(),
            configure=functools.partial(self._aconfigure, made),
            check=self._acheck,
            name=f"qitos-{self.schema}-async",
            open=False,
        )
        try:  # with its minimum of connections made, no connection attempt is left running when the loop ends
            await pool.open(wait=True, timeout=self._pool_timeout)
        except self._pool_module.PoolTimeout as exc:
            await pool.close()
            raise CheckpointError(f"cannot connect to PostgreSQL ({self._where}): {exc}") from exc
        guard = loop.create_task(_close_with_loop(pool, made), name=f"qitos-{self.schema}-pool-guard")
        self._apools[loop] = (pool, guard)
        return pool

    def _migrate_once(self) -> None:
        with self._lock:
            self._ensure_open()
            self._migrate()

    def _migrate(self) -> None:
        """Bring the schema to SCHEMA_VERSION (caller holds ``_lock``); one transaction per migration."""
        if self._migrated:
            return
        psycopg = self._psycopg
        try:
            conn = psycopg.connect(self.dsn, autocommit=True, prepare_threshold=None)
        except psycopg.Error as exc:
            raise CheckpointError(f"cannot connect to PostgreSQL ({self._where}): {exc}") from exc
        sql = self.sql
        try:
            with conn:
                for migration in sql.migrations:
                    with conn.transaction():
                        conn.execute(sql.migration_lock, (f"qitos.migrate.{self.schema}",))
                        conn.execute(sql.create_schema)
                        conn.execute(sql.schema_table)
                        version = int(conn.execute(sql.schema_version).fetchone()[0])
                        if version > SCHEMA_VERSION:
                            raise CheckpointError(
                                f"{self._where} has checkpoint schema version {version}, newer than this qitos "
                                f"supports ({SCHEMA_VERSION}); upgrade qitos to open it"
                            )
                        if version < migration.version:
                            for statement in migration.statements:
                                conn.execute(statement)
                            conn.execute(sql.schema_record, (migration.version, migration.name, utc_now()))
        except psycopg.Error as exc:
            raise CheckpointError(f"migrating {self._where} failed: {exc}") from exc
        self._migrated = True

    # ---- running plans

    def _error(self, exc: Exception) -> CheckpointError:
        return CheckpointError(f"PostgreSQL error on {self._where}: {exc}")

    def _unavailable(self, exc: Exception) -> CheckpointError:
        """Why no pooled connection could be had (PoolTimeout, PoolClosed), as a CheckpointError."""
        if isinstance(exc, self._pool_module.PoolClosed):
            return CheckpointError(f"{self!r} is closed")
        return CheckpointError(f"no PostgreSQL connection free within {self._pool_timeout:g} s ({self._where}): {exc}")

    # The connections are taken and returned with getconn/putconn, not the pool's connection()
    # context: that one also ends a transaction on every connection it hands back (a lock and a
    # call per statement), and the store's connections are in autocommit; putconn still replaces
    # a connection left broken.

    @contextlib.contextmanager
    def _connection(self) -> Iterator[Any]:
        """A connection of the sync pool for the block, given back after it (a broken one is replaced)."""
        self._ensure_open()
        pool = self._sync_pool()
        try:
            conn = pool.getconn()
        except (self._pool_module.PoolTimeout, self._pool_module.PoolClosed) as exc:
            raise self._unavailable(exc) from exc
        try:
            yield conn
        finally:
            pool.putconn(conn)

    @contextlib.asynccontextmanager
    async def _aconnection(self) -> AsyncIterator[Any]:
        """Async twin of :meth:`_connection` (this event loop's pool)."""
        self._ensure_open()
        pool = await self._async_pool()
        try:
            conn = await pool.getconn()
        except (self._pool_module.PoolTimeout, self._pool_module.PoolClosed) as exc:
            raise self._unavailable(exc) from exc
        try:
            yield conn
        finally:
            await pool.putconn(conn)

    def _run(self, plan: Plan[_T], *, transaction: bool = False) -> _T:
        """Drive ``plan`` on one pooled connection (inside one transaction if ``transaction``)."""
        psycopg = self._psycopg
        with self._connection() as conn:
            try:
                if transaction:
                    with conn.transaction():
                        result = _drive(conn.statements, plan, psycopg.Error)
                else:
                    result = _drive(conn.statements, plan, psycopg.Error)
                self._stamp(conn)
                return result
            except psycopg.Error as exc:
                if isinstance(exc, psycopg.OperationalError):
                    self._check_pool()
                raise self._error(exc) from exc

    # ---- group commit (see qitos.checkpoint._groups): one transaction, one round trip, per group

    def _write_group(self, group: list[Pending[_Work]]) -> None:
        """Write a group on a sync pooled connection (see :meth:`_awrite_group`)."""
        psycopg = self._psycopg
        with self._connection() as conn:
            plans = _start_plans(group)
            if not plans:
                return
            try:
                with conn.pipeline() as pipeline:
                    cursors = _spare_cursors(conn, len(plans))
                    conn.execute(_BEGIN)
                    for cursor, (_, _, query) in zip(cursors, plans, strict=True):
                        cursor.execute(*query)
                    conn.execute(_COMMIT)
                    pipeline.sync()
                    rows = [c.fetchall() if c.rownumber is not None else [] for c in cursors]
            except psycopg.Error as exc:
                if exc.sqlstate is None:  # the connection failed: what the server did is not known
                    self._check_pool()
                    raise self._error(exc) from exc
                # A statement failed (or a deadlock with another process's group was broken): the
                # group was rolled back, nothing of it is written. Each piece alone instead.
                conn.rollback()
                for pending, _, _ in plans:
                    try:
                        pending.result = self._run(pending.work())
                    except Exception as exc:
                        pending.error = exc
                return
            for (pending, plan, _), answer in zip(plans, rows, strict=True):
                try:
                    pending.result = _finish(conn.statements, plan, answer)
                except psycopg.Error as exc:
                    pending.error = self._error(exc)
                except Exception as exc:
                    pending.error = exc
            self._stamp(conn)

    async def _awrite_group(self, group: list[Pending[_Work]]) -> None:
        """Write a group on this event loop's pool: every piece's first statement in one transaction,
        sent with BEGIN and COMMIT in one pipeline (one round trip, one WAL flush). A piece that needs
        more (a refused commit looks up why) goes on alone after the group is durable; a statement
        error rolls the group back and each piece is written alone, so a bad piece fails by itself."""
        psycopg = self._psycopg
        async with self._aconnection() as conn:
            plans = _start_plans(group)
            if not plans:
                return
            try:
                async with conn.pipeline() as pipeline:
                    cursors = _spare_cursors(conn, len(plans))
                    await conn.execute(_BEGIN)
                    for cursor, (_, _, query) in zip(cursors, plans, strict=True):
                        await cursor.execute(*query)
                    await conn.execute(_COMMIT)
                    await pipeline.sync()
                    rows = [await c.fetchall() if c.rownumber is not None else [] for c in cursors]
            except psycopg.Error as exc:
                if exc.sqlstate is None:
                    await self._acheck_pool()
                    raise self._error(exc) from exc
                await conn.rollback()
                for pending, _, _ in plans:
                    try:
                        pending.result = await self._arun(pending.work())
                    except Exception as exc:
                        pending.error = exc
                return
            for (pending, plan, _), answer in zip(plans, rows, strict=True):
                try:
                    pending.result = await _afinish(conn.statements, plan, answer)
                except psycopg.Error as exc:
                    pending.error = self._error(exc)
                except Exception as exc:
                    pending.error = exc
            self._stamp(conn)

    def _check_pool(self) -> None:
        """After a lost connection, check the idle ones too: the server may have ended them all at once
        (a restart, a failover), and the next call must not be handed another dead one."""
        pool = self._pool
        if pool is not None:
            with contextlib.suppress(Exception):  # the call's own error is what the caller gets
                pool.check()

    async def _arun(self, plan: Plan[_T], *, transaction: bool = False) -> _T:
        psycopg = self._psycopg
        async with self._aconnection() as conn:
            try:
                if transaction:
                    async with conn.transaction():
                        result = await _adrive(conn.statements, plan, psycopg.Error)
                else:
                    result = await _adrive(conn.statements, plan, psycopg.Error)
                self._stamp(conn)
                return result
            except psycopg.Error as exc:
                if isinstance(exc, psycopg.OperationalError):
                    await self._acheck_pool()
                raise self._error(exc) from exc

    async def _agrouped(self, plan: Callable[[], Plan[_T]]) -> _T:
        """Run ``plan`` in this event loop's next group: its first statement goes with those of every
        other session's operation waiting now, in one round trip (see :meth:`_awrite_group`)."""
        result: _T = await self._groups.arun(plan)
        return result

    async def _acheck_pool(self) -> None:
        """Async twin of :meth:`_check_pool` (this loop's pool)."""
        known = self._apools.get(asyncio.get_running_loop())
        if known is not None:
            with contextlib.suppress(Exception):
                await known[0].check()

    def _encode(self, payload_json: str) -> tuple[str, bytes]:
        raw = payload_json.encode("utf-8")
        if self._compress_min is not None and len(payload_json) >= self._compress_min:
            packed = pack(raw)
            if packed is not None:
                return "zstd", packed
        return "json", raw

    # ---- plans: sessions and snapshots

    def _plan_get_head(self, session_id: str) -> Plan[SessionHeadRecord | None]:
        rows = yield self.sql.head_get, (session_id,)
        return _pg_head(rows[0]) if rows else None

    def _plan_commit(self, request: SessionSnapshotCommit) -> Plan[SessionCommitReceipt]:
        payload_json = request.validate()
        metadata = request.session_metadata
        metadata_json = None if metadata is None else json_text(metadata, "session_metadata")
        blobs = check_blobs(request.blobs) if request.blobs else []
        snapshot = request.snapshot
        encoding, stored = self._encode(payload_json)
        session_id = request.session_id
        expected = request.expected_head
        operation_id = request.operation_id
        token = request.lease_token
        sql = self.sql
        if expected is None and metadata_json is None:
            metadata_json = "{}"
        params: dict[str, Any] = {
            "sid": session_id,
            "expected": expected,
            "id": snapshot.snapshot_id,
            "seq": snapshot.sequence,
            "lifecycle": request.lifecycle,
            "metadata": None if metadata_json is None else metadata_json.encode("utf-8"),
            "metadata_digest": None if metadata_json is None else metadata_digest(session_id, metadata_json),
            "parent": snapshot.parent_id,
            "base": snapshot.base_id,
            "created": snapshot.created_at,
            "encoding": encoding,
            "payload": stored,
            "digests": [digest for digest, _ in blobs],
            "datas": [data for _, data in blobs],
            "op": operation_id,
            "token": token,
        }
        statement = sql.commit(
            create=expected is None,
            parent=snapshot.parent_id is not None and snapshot.parent_id != expected,
            op=operation_id is not None,
            blobs=bool(blobs),
            meta=metadata_json is not None,
            token=token is not None,
        )
        for _ in range(_COMMIT_ATTEMPTS):
            now = params["now"] = utc_now()
            params["digest"] = head_digest(session_id, snapshot.snapshot_id, snapshot.sequence, request.lifecycle, now)
            try:
                rows = yield statement, params
            except Exception as exc:  # a concurrent commit took the operation id first
                if operation_id is None or getattr(exc, "sqlstate", None) != "23505":
                    raise
                rows = [(0, None)]
            if rows[0][0] == 1:
                return SessionCommitReceipt(
                    session_id=session_id,
                    snapshot_id=snapshot.snapshot_id,
                    previous_head=expected,
                    sequence=snapshot.sequence,
                    committed_at=now,
                    control_seq=int(rows[0][1]),
                )
            actual, owner, lease_token, lease_expires, clock, op_owner, parent_found = (
                yield (
                    sql.commit_refused,
                    params,
                )
            )[0]
            if expected is None:
                if actual is not None:
                    raise HeadConflictError(session_id, None, actual)
            else:
                if actual is None:
                    raise SessionNotFoundError(session_id)
                check_fence(session_id, _lease_of(session_id, owner, lease_token, lease_expires), token, clock)
                if actual != expected:
                    raise HeadConflictError(session_id, expected, actual)
            if op_owner is not None:
                raise DuplicateOperationError(operation_id or "", op_owner)
            if not parent_found:
                raise SnapshotNotFoundError(snapshot.parent_id or "")
        raise CheckpointError(
            f"commit of {snapshot.snapshot_id} to session {session_id!r} was refused {_COMMIT_ATTEMPTS} times "
            "while its head, lease, operation and parent all checked out (concurrent changes?)"
        )

    def _plan_find_operation(self, operation_id: str) -> Plan[str | None]:
        rows = yield self.sql.operation_get, (operation_id,)
        return None if not rows else str(rows[0][0])

    def _plan_get_snapshot(self, snapshot_id: str) -> Plan[SessionSnapshot]:
        rows = yield self.sql.snapshot_get, (snapshot_id,)
        if not rows:
            raise SnapshotNotFoundError(snapshot_id)
        return SessionSnapshot.from_stored_rows([_stored_row(rows[0])])[0]

    def _plan_load_chain(self, snapshot_id: str) -> Plan[list[SessionSnapshot]]:
        rows = yield self.sql.chain, {"snap": snapshot_id, "max": MAX_CHAIN}
        return _chain_of(snapshot_id, rows)

    def _plan_chain_with_writes(
        self, session_id: str, snapshot_id: str
    ) -> Plan[tuple[list[SessionSnapshot], list[StepWrite]]]:
        rows = yield self.sql.chain_with_writes, {"snap": snapshot_id, "max": MAX_CHAIN, "sid": session_id}
        chain = [row[1:] for row in rows if row[0] == "chain"]
        writes = sorted((row for row in rows if row[0] == "write"), key=lambda row: row[15])
        tally = next(((row[11], row[14]) for row in rows if row[0] == "head"), None)
        return _chain_of(snapshot_id, chain), _writes_of(
            session_id, snapshot_id, [(row[11], row[12], row[13], row[8], row[14]) for row in writes], tally
        )

    def _plan_get_heads(self, session_ids: Iterable[str]) -> Plan[dict[str, SessionHeadRecord]]:
        wanted = list(dict.fromkeys(session_ids))
        if not wanted:
            return {}
        rows = yield self.sql.head_many, (wanted,)
        return {head.session_id: head for head in map(_pg_head, rows)}

    def _plan_get_positions(
        self, session_ids: Iterable[str], lifecycles: Iterable[str] | None
    ) -> Plan[dict[str, SessionPosition]]:
        wanted = list(dict.fromkeys(session_ids))
        kinds = name_set(lifecycles, "lifecycles")
        if not wanted or (kinds is not None and not kinds):
            return {}
        if kinds is None:
            rows = yield self.sql.head_positions, (wanted,)
        else:  # only those rows come back, and only they are checked against their digests
            rows = yield self.sql.head_positions_in, (wanted, sorted(kinds))
        return {
            str(sid): verified_position(sid, snapshot_id, int(sequence), lifecycle, updated_at, digest)
            for sid, snapshot_id, sequence, lifecycle, updated_at, digest in rows
        }

    def _plan_list_sessions(self, lifecycles: Iterable[str] | None) -> Plan[list[SessionHeadRecord]]:
        wanted = name_set(lifecycles, "lifecycles")
        if wanted is not None and not wanted:
            return []
        rows = yield (self.sql.head_list, ()) if wanted is None else (self.sql.head_list_in, (sorted(wanted),))
        return [_pg_head(row) for row in rows]

    def _plan_session_snapshots(self, session_id: str) -> Plan[list[str]]:
        rows = yield self.sql.session_chain, {"sid": session_id}
        if rows and rows[0][1] == -1:
            raise SessionNotFoundError(session_id)
        return [str(row[0]) for row in rows]

    # ---- plans: pending writes, control, blobs

    def _plan_put_writes(self, writes: Sequence[StepWrite]) -> Plan[list[bool]]:
        """Up to _WRITES_PER_STATEMENT writes in one statement; more in several (run in one transaction)."""
        texts = [w.payload_json() for w in writes]
        out: list[bool] = []
        for start in range(0, len(writes), _WRITES_PER_STATEMENT):
            chunk = writes[start : start + _WRITES_PER_STATEMENT]
            params: list[Any] = []
            for write, text in zip(chunk, texts[start : start + _WRITES_PER_STATEMENT], strict=True):
                params += (write.session_id, write.base_snapshot_id, write.kind, write.key, write.step_id)
                params += (text.encode("utf-8"), write_digest(write, text), write.lease_token)
            rows = yield self.sql.writes_put(len(chunk)), params
            out += self._put_outcome(chunk, rows)
        return out

    def _put_outcome(self, writes: Sequence[StepWrite], rows: list[Any]) -> list[bool]:
        """Per write, whether it was new, from a write statement's rows (refusals raise)."""
        new: set[tuple[str, str, str, str]] = set()
        fences: list[tuple[Any, ...]] = []
        for tag, *fields in rows:
            if tag == "bad":
                base, session_id, owner = fields[:3]
                if owner is None:
                    raise SnapshotNotFoundError(base)
                raise CheckpointError(
                    f"write to session {session_id!r}: base snapshot {base} belongs to session {owner!r}, "
                    f"not to {session_id!r}"
                )
            if tag == "fence":
                fences.append(tuple(fields))
            else:
                new.add((fields[0], fields[1], fields[2], fields[3]))
        for session_id, owner, token, lease_token, lease_expires, clock in sorted(fences):
            check_fence(
                session_id,
                _lease_of(session_id, owner, int(lease_token), float(lease_expires)),
                None if token is None else int(token),
                float(clock),
            )
        if fences:  # the statement refused the batch, so the fence must have failed above
            raise CheckpointError(f"write batch fenced off for sessions {sorted(f[0] for f in fences)}")
        out: list[bool] = []
        for write in writes:
            key = (write.session_id, write.base_snapshot_id, write.kind, write.key)
            out.append(key in new)
            new.discard(key)  # a key written twice in one batch: the first occurrence is the new one
        return out

    def _plan_get_writes(self, session_id: str, base_snapshot_id: str) -> Plan[list[StepWrite]]:
        rows = yield self.sql.writes_list, {"sid": session_id, "base": base_snapshot_id}
        tally = None
        if rows and rows[0][0] == 0:  # the base is the session's head: its tally (count, digest)
            head = rows.pop(0)
            tally = (head[1], head[5])
        return _writes_of(session_id, base_snapshot_id, [row[1:] for row in rows], tally)

    def _plan_append_control(self, session_id: str, kind: str, payload: Mapping[str, Any]) -> Plan[ControlItem]:
        payload_json = check_control(session_id, kind, payload)
        now = utc_now()
        params = {
            "sid": session_id,
            "kind": kind,
            "payload": payload_json.encode("utf-8"),
            "now": now,
            "channel": self.sql.channel,
        }
        rows = yield self.sql.control_append, params
        if not rows:
            raise SessionNotFoundError(session_id)
        return ControlItem(
            session_id=session_id,
            position=int(rows[0][0]),
            kind=kind,
            payload=stored_object(payload_json, "control", str(rows[0][0]), session_id),
            created_at=now,
        )

    def _plan_list_control(
        self, session_id: str, *, after: int = 0, kinds: Iterable[str] | None = None
    ) -> Plan[list[ControlItem]]:
        wanted = name_set(kinds, "kinds")
        start = check_after(after)
        rows = yield self.sql.control_list, {"sid": session_id, "after": start}
        if not rows or rows[0][0] != -1:
            raise SessionNotFoundError(session_id)
        count = int(rows[0][5])
        items: list[ControlItem] = []
        expected = start
        for position, kind, payload, created_at, digest, _ in rows[1:]:
            where = str(position)
            payload_json = stored_text(payload, "control", where, session_id)
            if digest != control_digest(session_id, int(position), kind, payload_json, created_at):
                raise IntegrityError("control", where, "content does not match its digest", session_id=session_id)
            expected += 1
            if position != expected:
                raise IntegrityError("control", str(expected), "the item is missing", session_id=session_id)
            if wanted is None or kind in wanted:
                items.append(
                    ControlItem(
                        session_id=session_id,
                        position=int(position),
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

    # ---- plans: leases (the rules are store.py's; the clock is the database's)

    def _plan_read_lease(self, session_id: str) -> Plan[tuple[SessionLease | None, float] | None]:
        rows = yield self.sql.lease_get, (session_id,)
        if not rows:
            return None
        owner, token, expires, clock = rows[0]
        return _lease_of(session_id, owner, token, expires), float(clock)

    def _plan_swap_lease(
        self, session_id: str, current: SessionLease | None, new: SessionLease, ttl: float
    ) -> Plan[float | None]:
        """Set the lease to ``new`` (its expiry: the database clock + ``ttl``) if it is still ``current``."""
        rows = yield (
            self.sql.lease_swap,
            {
                "sid": session_id,
                "owner": new.owner,
                "token": new.token,
                "ttl": ttl,
                "old_owner": None if current is None else current.owner,
                "old_token": 0 if current is None else current.token,
                "old_expires": 0.0 if current is None else current.expires_at,
            },
        )
        return float(rows[0][0]) if rows else None

    def _plan_acquire_lease(
        self, session_id: str, owner: str, ttl_seconds: float, take_over_from: str | None
    ) -> Plan[SessionLease]:
        ttl = check_lease_ttl(ttl_seconds)
        check_lease_owner(owner, take_over_from)
        rows = yield self.sql.lease_take, {"sid": session_id, "owner": owner, "ttl": ttl, "take_over": take_over_from}
        if rows:  # granted at once (the common case); otherwise the shared rules say why not
            token, expires, head_id, control_seq = rows[0]
            return SessionLease(
                session_id=session_id,
                owner=owner,
                token=int(token),
                expires_at=float(expires),
                head_snapshot_id=head_id,
                control_seq=int(control_seq),
            )
        while True:
            found = yield from self._plan_read_lease(session_id)
            if found is None:
                raise SessionNotFoundError(session_id)
            current, clock = found
            lease = next_lease(current, session_id, owner, ttl, clock, take_over_from)
            expires = yield from self._plan_swap_lease(session_id, current, lease, ttl)
            if expires is not None:
                return replace(lease, expires_at=expires)

    def _plan_renew_lease(self, lease: SessionLease, ttl_seconds: float) -> Plan[SessionLease]:
        ttl = check_lease_ttl(ttl_seconds)
        while True:
            found = yield from self._plan_read_lease(lease.session_id)
            current, clock = (None, time.time()) if found is None else found
            renewed = renewed_lease(current, lease, ttl, clock)
            expires = yield from self._plan_swap_lease(lease.session_id, current, renewed, ttl)
            if expires is not None:
                return replace(renewed, expires_at=expires)

    def _plan_release_lease(self, lease: SessionLease) -> Plan[None]:
        yield self.sql.lease_release, (lease.session_id, lease.token, lease.owner)

    def _plan_get_lease(self, session_id: str) -> Plan[SessionLease | None]:
        found = yield from self._plan_read_lease(session_id)
        return None if found is None else found[0]

    def _plan_put_blobs(self, blobs: Mapping[str, bytes]) -> Plan[None]:
        checked = check_blobs(blobs)
        if checked:
            yield self.sql.blobs_put, ([digest for digest, _ in checked], [data for _, data in checked])

    def _plan_get_blobs(self, digests: Iterable[str]) -> Plan[dict[str, bytes]]:
        wanted = sorted(name_set(digests, "digests") or ())
        if not wanted:
            return {}
        rows = yield self.sql.blobs_get, (wanted,)
        found = {str(digest): bytes(data) for digest, data in rows}
        check_blobs(found)  # BlobIntegrityError if stored bytes were altered
        return found

    # ---- plans: retention

    def _plan_prune(self, keep: Iterable[str]) -> Plan[PruneReport]:
        named = sorted(name_set(keep, "keep") or ())
        sql = self.sql
        yield sql.prune_lock, ()
        missing = yield sql.prune_missing, (named,)
        if missing:
            raise SnapshotNotFoundError(missing[0][0])
        doomed = yield sql.prune_doomed, (named,)
        candidates: set[str] = set()
        for row in doomed:
            candidates |= mentioned_digests(_payload_or_empty(row))
        if doomed:
            yield sql.prune_snapshots, ([row[0] for row in doomed],)
        for (payload,) in (yield sql.prune_writes, ()):
            candidates |= mentioned_digests(bytes(payload))
        kept = int((yield sql.snapshot_count, ())[0][0])
        dropped = 0
        if candidates:
            present = {row[0] for row in (yield sql.blobs_present, (sorted(candidates),))}
            if present:
                # Kept payloads are scanned whole (prune is maintenance, not a hot path); if any does
                # not decode, nothing is deleted, since what it references cannot be known.
                for row in (yield sql.all_snapshots, ()):
                    payload = _payload_or_empty(row)
                    if not payload:
                        present = set()
                        break
                    present -= mentioned_digests(payload)
                for (payload,) in (yield sql.all_writes, ()) if present else ():
                    present -= mentioned_digests(bytes(payload))
                if present:
                    yield sql.blobs_delete, (sorted(present),)
                dropped = len(present)
        return PruneReport(deleted_snapshots=len(doomed), kept_snapshots=kept, deleted_blobs=dropped)

    def _plan_vacuum(self) -> Plan[None]:
        for statement in self.sql.vacuum:
            yield statement, ()

    def _plan_table_sizes(self) -> Plan[list[TableSize]]:
        rows = yield self.sql.table_sizes, (self.schema,)
        return [TableSize(str(name), int(size)) for name, size in rows]

    # ---- the contract: sync methods

    def get_session_head(self, session_id: str) -> SessionHeadRecord | None:
        """Read the current mutable head for one session (None if there is no such session)."""
        return self._run(self._plan_get_head(session_id))

    def commit_session_snapshot(self, request: SessionSnapshotCommit) -> SessionCommitReceipt:
        """Atomically persist an immutable snapshot (and blobs) and advance its head (CAS), in one statement."""
        return self._groups.run(functools.partial(self._plan_commit, request))  # type: ignore[no-any-return]

    def find_session_by_operation(self, operation_id: str) -> str | None:
        """The session a commit with this ``operation_id`` created, or None."""
        return self._run(self._plan_find_operation(operation_id))

    def get_snapshot(self, snapshot_id: str) -> SessionSnapshot:
        """Read one verified snapshot; SnapshotNotFoundError or SnapshotIntegrityError."""
        return self._run(self._plan_get_snapshot(snapshot_id))

    def load_chain(self, snapshot_id: str) -> list[SessionSnapshot]:
        """The snapshot and its ancestors back to and including its base, oldest first, verified."""
        return self._run(self._plan_load_chain(snapshot_id))

    def list_sessions(self, *, lifecycles: Iterable[str] | None = None) -> list[SessionHeadRecord]:
        """Every session head (only those in ``lifecycles``, when given), in creation order."""
        return self._run(self._plan_list_sessions(lifecycles))

    def list_session_snapshots(self, session_id: str) -> list[str]:
        """The session's head chain within the session, newest first."""
        return self._run(self._plan_session_snapshots(session_id))

    def get_session_heads(self, session_ids: Iterable[str]) -> dict[str, SessionHeadRecord]:
        """The heads of those of ``session_ids`` that exist, by session id (one statement)."""
        return self._run(self._plan_get_heads(session_ids))

    def get_session_positions(
        self, session_ids: Iterable[str], *, lifecycles: Iterable[str] | None = None
    ) -> dict[str, SessionPosition]:
        """Where the heads of those of ``session_ids`` that exist (and are in one of ``lifecycles``,
        when given) stand (one statement, heads only)."""
        return self._run(self._plan_get_positions(session_ids, lifecycles))

    def put_writes(self, writes: Sequence[StepWrite]) -> list[bool]:
        """Store pending writes (one statement, or one transaction for a large batch); per write,
        whether it was new (first wins)."""
        if not writes:
            return []
        if len(writes) > _WRITES_PER_STATEMENT:  # several statements: a transaction of their own
            return self._run(self._plan_put_writes(writes), transaction=True)
        return self._groups.run(functools.partial(self._plan_put_writes, writes))  # type: ignore[no-any-return]

    def load_chain_with_writes(
        self, session_id: str, snapshot_id: str
    ) -> tuple[list[SessionSnapshot], list[StepWrite]]:
        """The verified chain of ``snapshot_id`` and the session's pending writes on it (one statement)."""
        return self._run(self._plan_chain_with_writes(session_id, snapshot_id))

    def get_writes(self, session_id: str, base_snapshot_id: str) -> list[StepWrite]:
        """Pending writes of the step that started at ``base_snapshot_id``, in write order."""
        return self._run(self._plan_get_writes(session_id, base_snapshot_id))

    def append_control(self, session_id: str, kind: str, payload: Mapping[str, Any]) -> ControlItem:
        """Durably append one control item (position from the head's counter) and notify waiters."""
        return self._run(self._plan_append_control(session_id, kind, payload))

    def list_control(self, session_id: str, *, after: int = 0, kinds: Iterable[str] | None = None) -> list[ControlItem]:
        """Control items with position > ``after`` (optionally only ``kinds``), by position."""
        return self._run(self._plan_list_control(session_id, after=after, kinds=kinds))

    def acquire_lease(
        self, session_id: str, owner: str, *, ttl_seconds: float, take_over_from: str | None = None
    ) -> SessionLease:
        """Take (or, for its owner, renew) the session's lease; SessionBusyError if another owner holds it.

        ``take_over_from`` names a holder the caller knows is dead: its live lease is taken over.
        """
        return self._run(self._plan_acquire_lease(session_id, owner, ttl_seconds, take_over_from))

    def renew_lease(self, lease: SessionLease, *, ttl_seconds: float) -> SessionLease:
        """Extend a held lease; LeaseLostError if it expired or was taken over."""
        return self._run(self._plan_renew_lease(lease, ttl_seconds))

    def release_lease(self, lease: SessionLease) -> None:
        """Give the lease up now (a no-op if it is no longer current); its token stays used."""
        self._run(self._plan_release_lease(lease))

    def get_lease(self, session_id: str) -> SessionLease | None:
        """The session's current lease (possibly lapsed), or None if it never had one."""
        return self._run(self._plan_get_lease(session_id))

    def put_blobs(self, blobs: Mapping[str, bytes]) -> None:
        """Store content-addressed blobs (key = sha256 hex of the bytes, verified)."""
        self._run(self._plan_put_blobs(blobs))

    def get_blobs(self, digests: Iterable[str]) -> dict[str, bytes]:
        """The stored blobs among ``digests`` (absent digests are absent from the result); verified."""
        return self._run(self._plan_get_blobs(digests))

    def prune(self, *, keep: Iterable[str] = ()) -> PruneReport:
        """Delete snapshots not reachable from a head or ``keep`` (with their writes), then the
        blobs that only they mentioned, in one transaction that keeps writers out meanwhile."""
        return self._run(self._plan_prune(keep), transaction=True)

    def vacuum(self) -> None:
        """``VACUUM (ANALYZE)`` the store's tables: space freed by pruning becomes reusable."""
        self._run(self._plan_vacuum())

    def table_sizes(self) -> list[TableSize]:
        """The store's tables and their total sizes on disk, by name."""
        return self._run(self._plan_table_sizes())

    def wait_for_control(
        self, session_id: str, *, after: int = 0, timeout: float = 1.0, kinds: Iterable[str] | None = None
    ) -> list[ControlItem]:
        """Wait up to ``timeout`` seconds for control items after ``after``; [] when none came.

        LISTENs on the schema's channel on a connection of its own (taken before the first look,
        so an append between the look and the wait is not missed); while that connection is lost
        it polls every ``poll_interval`` seconds and tries to listen again.
        """
        deadline = time.monotonic() + _check_timeout(timeout)
        announcements = self.control_announcements()
        announcements.wait(0)  # listen before the first look: an append after it is announced
        try:
            while True:
                items = self.list_control(session_id, after=after, kinds=kinds)
                remaining = deadline - time.monotonic()
                if items or remaining <= 0:
                    return items
                announcements.wait(remaining, session_id=session_id)
        finally:
            announcements.close()

    def control_announcements(self) -> ControlAnnouncements:
        """The sessions that get control items from now on, as the schema's channel announces them."""
        return ControlAnnouncements(self)

    def _listen(self) -> Any:
        """A fresh connection LISTENing on the control channel, or None when it cannot be had."""
        self._ensure_open()
        psycopg = self._psycopg
        try:
            conn = psycopg.connect(self.dsn, autocommit=True, prepare_threshold=None, **self._application_name)
        except psycopg.Error:
            return None
        try:
            conn.execute(self.sql.listen)
        except psycopg.Error:
            conn.close()
            return None
        return conn

    def close(self) -> None:
        """Close the pools; later calls raise CheckpointError. Idempotent."""
        self._groups.close()
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
            apools, self._apools = self._apools, {}
        if pool is not None:
            pool.close()
        for loop, (apool, guard) in apools.items():
            if not loop.is_closed() and not loop.is_running():
                guard.cancel()
                loop.run_until_complete(apool.close())

    # ---- the contract: async twins (native, on the AsyncConnectionPool)

    async def aget_session_head(self, session_id: str) -> SessionHeadRecord | None:
        return await self._agrouped(lambda: self._plan_get_head(session_id))

    async def aget_session_heads(self, session_ids: Iterable[str]) -> dict[str, SessionHeadRecord]:
        return await self._arun(self._plan_get_heads(session_ids))

    async def aget_session_positions(
        self, session_ids: Iterable[str], *, lifecycles: Iterable[str] | None = None
    ) -> dict[str, SessionPosition]:
        return await self._arun(self._plan_get_positions(session_ids, lifecycles))

    async def acommit_session_snapshot(self, request: SessionSnapshotCommit) -> SessionCommitReceipt:
        return await self._agrouped(lambda: self._plan_commit(request))

    async def afind_session_by_operation(self, operation_id: str) -> str | None:
        return await self._arun(self._plan_find_operation(operation_id))

    async def aget_snapshot(self, snapshot_id: str) -> SessionSnapshot:
        return await self._agrouped(lambda: self._plan_get_snapshot(snapshot_id))

    async def aload_chain(self, snapshot_id: str) -> list[SessionSnapshot]:
        return await self._agrouped(lambda: self._plan_load_chain(snapshot_id))

    async def alist_sessions(self, *, lifecycles: Iterable[str] | None = None) -> list[SessionHeadRecord]:
        return await self._arun(self._plan_list_sessions(lifecycles))

    async def alist_session_snapshots(self, session_id: str) -> list[str]:
        return await self._arun(self._plan_session_snapshots(session_id))

    async def aput_writes(self, writes: Sequence[StepWrite]) -> list[bool]:
        if not writes:
            return []
        if len(writes) > _WRITES_PER_STATEMENT:
            return await self._arun(self._plan_put_writes(writes), transaction=True)
        return await self._agrouped(lambda: self._plan_put_writes(writes))

    async def aload_chain_with_writes(
        self, session_id: str, snapshot_id: str
    ) -> tuple[list[SessionSnapshot], list[StepWrite]]:
        return await self._agrouped(lambda: self._plan_chain_with_writes(session_id, snapshot_id))

    async def aget_writes(self, session_id: str, base_snapshot_id: str) -> list[StepWrite]:
        return await self._agrouped(lambda: self._plan_get_writes(session_id, base_snapshot_id))

    async def aappend_control(self, session_id: str, kind: str, payload: Mapping[str, Any]) -> ControlItem:
        return await self._agrouped(lambda: self._plan_append_control(session_id, kind, payload))

    async def alist_control(
        self, session_id: str, *, after: int = 0, kinds: Iterable[str] | None = None
    ) -> list[ControlItem]:
        return await self._agrouped(lambda: self._plan_list_control(session_id, after=after, kinds=kinds))

    async def aacquire_lease(
        self, session_id: str, owner: str, *, ttl_seconds: float, take_over_from: str | None = None
    ) -> SessionLease:
        return await self._agrouped(lambda: self._plan_acquire_lease(session_id, owner, ttl_seconds, take_over_from))

    async def arenew_lease(self, lease: SessionLease, *, ttl_seconds: float) -> SessionLease:
        return await self._agrouped(lambda: self._plan_renew_lease(lease, ttl_seconds))

    async def arelease_lease(self, lease: SessionLease) -> None:
        await self._agrouped(lambda: self._plan_release_lease(lease))

    async def aget_lease(self, session_id: str) -> SessionLease | None:
        return await self._agrouped(lambda: self._plan_get_lease(session_id))

    async def aput_blobs(self, blobs: Mapping[str, bytes]) -> None:
        await self._arun(self._plan_put_blobs(blobs))

    async def aget_blobs(self, digests: Iterable[str]) -> dict[str, bytes]:
        return await self._agrouped(lambda: self._plan_get_blobs(digests))

    async def aprune(self, *, keep: Iterable[str] = ()) -> PruneReport:
        return await self._arun(self._plan_prune(keep), transaction=True)

    async def avacuum(self) -> None:
        await self._arun(self._plan_vacuum())

    async def atable_sizes(self) -> list[TableSize]:
        """Async twin of :meth:`table_sizes`."""
        return await self._arun(self._plan_table_sizes())

    async def await_control(
        self, session_id: str, *, after: int = 0, timeout: float = 1.0, kinds: Iterable[str] | None = None
    ) -> list[ControlItem]:
        """Async twin of :meth:`wait_for_control` (an async LISTEN connection of its own)."""
        deadline = time.monotonic() + _check_timeout(timeout)
        psycopg = self._psycopg
        listener = await self._alisten()
        try:
            while True:
                items = await self.alist_control(session_id, after=after, kinds=kinds)
                remaining = deadline - time.monotonic()
                if items or remaining <= 0:
                    return items
                if listener is None:
                    await asyncio.sleep(min(self._poll_interval, remaining))
                    listener = await self._alisten()
                    continue
                try:
                    async for notify in listener.notifies(timeout=remaining):
                        if notify.payload == session_id:
                            break
                except psycopg.Error:
                    await listener.close()
                    listener = None
        finally:
            if listener is not None:
                await listener.close()

    async def _alisten(self) -> Any:
        self._ensure_open()
        psycopg = self._psycopg
        try:
            conn = await psycopg.AsyncConnection.connect(
                self.dsn, autocommit=True, prepare_threshold=None, **self._application_name
            )
        except psycopg.Error:
            return None
        try:
            await conn.execute(self.sql.listen)
        except psycopg.Error:
            await conn.close()
            return None
        return conn

    async def aclose(self) -> None:
        self._groups.close()
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
            apools, self._apools = self._apools, {}
        if pool is not None:
            await asyncio.to_thread(pool.close)
        loop = asyncio.get_running_loop()
        for owner, (apool, guard) in apools.items():
            if owner is loop:
                guard.cancel()
                await apool.close()


# --------------------------------------------------------------------------- helpers


async def _close_with_loop(pool: Any, made: weakref.WeakSet[Any]) -> None:
    """Wait until cancelled, then close ``pool`` and the connections it ``made``: a pool must be
    closed while its loop still runs.

    ``asyncio.run`` cancels every task before closing its loop, this one included; the pool's own
    workers ignore a cancellation that arrives while they run a task, so without this an
    ``asyncio.run`` that used the store would never end. The same cancellation reaches the pool's
    workers, and ``close`` then stops at waiting for them before it closes its idle connections,
    which would stay open on the server: those are closed here.
    """
    try:
        await asyncio.Event().wait()
    finally:
        with contextlib.suppress(asyncio.CancelledError):
            await pool.close()
        for conn in list(made):
            if not conn.closed:
                await conn.close()


_Work = Callable[[], Plan[Any]]  # a write: makes its plan, whose first statement joins a group
_BEGIN: Final = "BEGIN"
_COMMIT: Final = "COMMIT"


_Started = list[tuple[Pending[_Work], Plan[Any], Query]]


def _start_plans(group: list[Pending[_Work]]) -> _Started:
    """Each piece with its plan and the plan's first statement; a piece whose plan fails before it
    (a bad request) gets its error and leaves the group."""
    started = []
    for pending in group:
        plan = pending.work()
        try:
            query = next(plan)
        except StopIteration as done:
            pending.result = done.value
            continue
        except Exception as exc:
            pending.error = exc
            continue
        started.append((pending, plan, query))
    return started


def _finish(cur: Any, plan: Plan[Any], rows: Rows) -> Any:
    """Send a piece's plan its first statement's rows and drive what else it asks for (alone)."""
    try:
        query = plan.send(rows)
    except StopIteration as done:
        return done.value
    return _drive(cur, _prepended(query, plan), Exception)


async def _afinish(cur: Any, plan: Plan[Any], rows: Rows) -> Any:
    """Async twin of :func:`_finish`."""
    try:
        query = plan.send(rows)
    except StopIteration as done:
        return done.value
    return await _adrive(cur, _prepended(query, plan), Exception)


def _prepended(query: Query, plan: Plan[_T]) -> Plan[_T]:
    """``plan`` already past ``next``, as a plan that yields ``query`` first."""
    rows = yield query
    try:
        query = plan.send(rows)
        while True:
            rows = yield query
            query = plan.send(rows)
    except StopIteration as done:
        result: _T = done.value
        return result


def _spare_cursors(conn: Any, count: int) -> list[Any]:
    """``count`` cursors of ``conn`` for one pipeline (kept on the connection between groups)."""
    spare: list[Any] = conn.spare
    while len(spare) < count:
        spare.append(conn.cursor())
    return spare[:count]


def _drive(cur: Any, plan: Plan[_T], errors: type[Exception]) -> _T:
    """Run a plan's statements on a connection's sync cursor, sending each one's rows back into it."""
    try:
        query = next(plan)
        while True:
            try:
                cur.execute(*query)
                rows = cur.fetchall() if cur.rownumber is not None else []  # None: no rows; description costs more
            except errors as exc:
                query = plan.throw(exc)
                continue
            query = plan.send(rows)
    except StopIteration as done:
        result: _T = done.value
        return result


async def _adrive(cur: Any, plan: Plan[_T], errors: type[Exception]) -> _T:
    """Run a plan's statements on a connection's async cursor."""
    try:
        query = next(plan)
        while True:
            try:
                await cur.execute(*query)
                rows = await cur.fetchall() if cur.rownumber is not None else []
            except errors as exc:
                query = plan.throw(exc)
                continue
            query = plan.send(rows)
    except StopIteration as done:
        result: _T = done.value
        return result


def _check_timeout(timeout: float) -> float:
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout < 0:
        raise ConfigurationError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
    return float(timeout)


def _describe(psycopg: Any, dsn: str, schema: str) -> str:
    """Where the store is, for messages: host, port, database and schema; never the password."""
    try:
        parts = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        return f"schema {schema!r} (unparsable DSN)"
    host = parts.get("host") or "localhost"
    port = parts.get("port")
    where = f"{host}:{port}" if port else str(host)
    return f"postgresql {where}/{parts.get('dbname') or parts.get('user') or ''} schema {schema!r}"


def _chain_of(snapshot_id: str, rows: list[Any]) -> list[SessionSnapshot]:
    """The verified chain of ``snapshot_id`` from its chain rows (the columns, stop, depth)."""
    if not rows:
        raise SnapshotNotFoundError(snapshot_id)
    return SessionSnapshot.from_stored_rows([_stored_row(row) for row in chain_oldest_first(snapshot_id, rows)])


def _writes_of(
    session_id: str, base_snapshot_id: str, rows: list[Any], tally: tuple[Any, Any] | None
) -> list[StepWrite]:
    """The verified pending writes on ``base_snapshot_id`` from their rows (step, kind, key, payload,
    digest), in the order they were written; with the head's ``tally`` (count, digest as a bit
    string) when ``base_snapshot_id`` is the session's head, checked against it too."""
    writes = [verified_write(session_id, base_snapshot_id, *row) for row in rows]
    if tally is not None:
        count, bits = tally
        try:
            fold = int(bits, 2)
        except (TypeError, ValueError) as exc:
            raise IntegrityError(
                "heads", session_id, f"its tally of pending writes is unreadable: {exc}", session_id=session_id
            ) from exc
        verified_step_writes(session_id, base_snapshot_id, int(count), fold, writes, [row[4] for row in rows])
    return writes


def _payload_or_empty(row: Any) -> bytes:
    """A snapshots row's payload JSON, or b"" when it does not decode."""
    try:
        payload = _stored_row(row)[6]
    except SnapshotIntegrityError:
        return b""
    return payload if isinstance(payload, bytes) else payload.encode("utf-8")


def _stored_row(row: Any) -> StoredSnapshotRow:
    """A snapshots row as ``SessionSnapshot.from_stored_rows`` takes it, decompressed."""
    snapshot_id, session_id, parent_id, base_id, sequence, created_at, encoding, payload = row[:8]
    payload = bytes(payload)
    if encoding == "zstd":
        try:
            payload = unpack(payload)
        except (PackingError, TypeError) as exc:
            raise SnapshotIntegrityError(snapshot_id, f"compressed payload is unreadable: {exc}") from exc
    elif encoding != "json":
        raise SnapshotIntegrityError(snapshot_id, f"unknown payload encoding {encoding!r}")
    return (snapshot_id, session_id, parent_id, base_id, int(sequence), created_at, payload)


def _lease_of(session_id: str, owner: str | None, token: int, expires: float) -> SessionLease | None:
    """The lease columns of a head row as a SessionLease (None: the session never had one)."""
    if owner is None:
        return None
    return SessionLease(session_id=session_id, owner=owner, token=int(token), expires_at=float(expires))


def _pg_head(row: Any) -> SessionHeadRecord:
    session_id, snapshot_id, sequence, lifecycle, updated_at, digest, metadata_raw, meta_digest, control_seq = row
    metadata = None if metadata_raw is None else bytes(metadata_raw)
    return verified_head(
        session_id, snapshot_id, int(sequence), lifecycle, updated_at, digest, metadata, meta_digest, control_seq
    )
