"""PostgresCheckpointStore beyond the conformance suite, on a real server (see pg_server.py).

Exact bytes (never jsonb), the one-statement commit, control positions and notifications,
connections the server kills (idle, mid-commit, a listener), byte flips in every table, the
schema's migrations and the extra's lazy import.
"""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pg_server import drop_schema, fresh_schema, pg_store
from qitos.checkpoint._postgres_store import SCHEMA_VERSION, PostgresCheckpointStore, _drive
from qitos.checkpoint._records import BlobIntegrityError, ControlItem, SessionSnapshot, SessionSnapshotCommit, StepWrite
from qitos.core._errors import (
    CheckpointError,
    ConfigurationError,
    IntegrityError,
    SessionBusyError,
    SnapshotIntegrityError,
)
from qitos.core._install import install_command

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(pg_dsn: str) -> Iterator[PostgresCheckpointStore]:
    with pg_store(pg_dsn) as instance:
        yield instance


def _first(session_id: str, payload: dict[str, Any] | None = None) -> SessionSnapshot:
    return SessionSnapshot.create(
        session_id=session_id, parent_id=None, base_id=None, sequence=0, payload=payload or {"full": {}}
    )


def _create(store: PostgresCheckpointStore, session_id: str, payload: dict[str, Any] | None = None) -> SessionSnapshot:
    first = _first(session_id, payload)
    store.commit_session_snapshot(
        SessionSnapshotCommit(
            session_id=session_id,
            expected_head=None,
            snapshot=first,
            lifecycle="created",
            session_metadata={"task": "Index notes"},
        )
    )
    return first


def _next(head: SessionSnapshot, payload: dict[str, Any]) -> SessionSnapshot:
    return SessionSnapshot.create(
        session_id=head.session_id,
        parent_id=head.snapshot_id,
        base_id=head.base_id or head.snapshot_id,
        sequence=head.sequence + 1,
        payload=payload,
    )


def _sql(dsn: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description is not None else []


class _CountingCursor:
    """A real psycopg cursor that counts the statements sent through it."""

    def __init__(self, cur: psycopg.Cursor[Any]) -> None:
        self._cur = cur
        self.statements: list[str] = []

    def execute(self, query: str, params: Any = None) -> Any:
        self.statements.append(query)
        return self._cur.execute(query, params)

    @property
    def rownumber(self) -> int | None:
        return self._cur.rownumber

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()


# --------------------------------------------------------------------------- bytes and statements


def test_payloads_are_stored_as_their_exact_canonical_bytes_and_no_column_is_jsonb(pg_dsn: str) -> None:
    with pg_store(pg_dsn, compress_min_bytes=None) as store:
        payload = {"z": 1, "a": {"é": "日本", "b": [3, 2, 1]}, "m": 1.5}
        first = _create(store, "s", payload)
        stored = _sql(pg_dsn, f'SELECT encoding, payload FROM "{store.schema}".snapshots')
        assert stored == [("json", first.canonical_payload().encode("utf-8"))]
        jsonb = _sql(
            pg_dsn,
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = %s AND data_type IN ('json', 'jsonb')",
            (store.schema,),
        )
        assert jsonb == []
        assert store.get_snapshot(first.snapshot_id) == first


def test_a_head_commit_is_one_statement_and_a_refused_one_adds_one_lookup(store: PostgresCheckpointStore) -> None:
    first = _create(store, "s")
    second = _next(first, {"ops": [1]})
    with psycopg.connect(store.dsn, autocommit=True) as raw:
        counted = _CountingCursor(raw.cursor())
        commit = SessionSnapshotCommit(
            session_id="s", expected_head=first.snapshot_id, snapshot=second, lifecycle="running"
        )
        receipt = _drive(counted, store._plan_commit(commit), psycopg.Error)
        assert receipt.snapshot_id == second.snapshot_id
        assert len(counted.statements) == 1
        assert counted.statements[0].startswith("WITH head AS (UPDATE")

        counted.statements.clear()
        stale = SessionSnapshotCommit(
            session_id="s", expected_head=first.snapshot_id, snapshot=_next(first, {"ops": [2]}), lifecycle="running"
        )
        with pytest.raises(Exception, match="head") as caught:
            _drive(counted, store._plan_commit(stale), psycopg.Error)
        assert type(caught.value).__name__ == "HeadConflictError"
        assert len(counted.statements) == 2  # the refused statement and the one lookup


def test_control_positions_stay_unique_under_concurrent_appends(pg_dsn: str, store: PostgresCheckpointStore) -> None:
    _create(store, "s")
    errors: list[BaseException] = []

    def append(name: str) -> None:
        try:
            with PostgresCheckpointStore(pg_dsn, schema=store.schema) as mine:
                for i in range(20):
                    mine.append_control("s", "steer", {"text": f"{name}-{i}"})
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=append, args=(f"t{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    items = store.list_control("s")
    assert [item.position for item in items] == list(range(1, 81))
    assert len({item.payload["text"] for item in items}) == 80


# --------------------------------------------------------------------------- notifications


def test_a_notify_wakes_a_waiting_session_long_before_its_timeout(pg_dsn: str, store: PostgresCheckpointStore) -> None:
    _create(store, "s")
    _create(store, "other")
    got: list[list[ControlItem]] = []
    waiter = threading.Thread(target=lambda: got.append(store.wait_for_control("s", after=0, timeout=60)))
    waiter.start()
    with PostgresCheckpointStore(pg_dsn, schema=store.schema) as elsewhere:
        _wait_for_listener(pg_dsn)
        elsewhere.append_control("other", "steer", {"text": "not for s"})  # another session's notify
        time.sleep(0.2)
        assert waiter.is_alive()
        started = time.monotonic()
        item = elsewhere.append_control("s", "approve", {"call_id": "c1"})
    waiter.join(timeout=30)
    assert not waiter.is_alive()
    assert got == [[item]]
    assert time.monotonic() - started < 20  # woken by the notify: the wait itself was 60 s


def test_an_async_waiter_is_woken_by_a_notify(pg_dsn: str, store: PostgresCheckpointStore) -> None:
    _create(store, "s")

    async def scenario() -> tuple[list[ControlItem], ControlItem, float]:
        waiting = asyncio.create_task(store.await_control("s", after=0, timeout=60))
        await asyncio.to_thread(_wait_for_listener, pg_dsn)
        started = time.monotonic()
        item = await store.aappend_control("s", "pause", {})
        items = await asyncio.wait_for(waiting, timeout=30)
        return items, item, time.monotonic() - started

    items, item, waited = asyncio.run(scenario())
    assert items == [item]
    assert waited < 20


def test_a_waiter_whose_listening_connection_is_killed_falls_back_to_polling(pg_dsn: str) -> None:
    with pg_store(pg_dsn, poll_interval=0.2) as store:
        _create(store, "s")
        got: list[list[ControlItem]] = []
        waiter = threading.Thread(target=lambda: got.append(store.wait_for_control("s", after=0, timeout=60)))
        waiter.start()
        pid = _wait_for_listener(pg_dsn)
        _sql(pg_dsn, "SELECT pg_terminate_backend(%s)", (pid,))
        time.sleep(0.5)  # the waiter notices, polls and listens again
        with PostgresCheckpointStore(pg_dsn, schema=store.schema) as elsewhere:
            item = elsewhere.append_control("s", "steer", {"text": "still delivered"})
        waiter.join(timeout=30)
        assert not waiter.is_alive()
        assert got == [[item]]


def _wait_for_listener(dsn: str, timeout: float = 30.0) -> int:
    """The pid of a backend that has run LISTEN (the waiter is listening)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = _sql(dsn, "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN %%' AND state = 'idle'")
        if rows:
            return int(rows[0][0])
        time.sleep(0.02)
    raise AssertionError("no waiter started listening")


# --------------------------------------------------------------------------- connections the server kills


def test_idle_pooled_connections_killed_by_the_server_are_replaced(pg_dsn: str) -> None:
    with pg_store(pg_dsn, check_idle_after=0, min_size=2) as store:
        _create(store, "s")
        killed = _sql(
            pg_dsn,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'qitos' AND pid <> pg_backend_pid()",
        )
        assert killed
        time.sleep(0.2)
        head = store.get_session_head("s")
        assert head is not None and head.lifecycle == "created"


def test_a_commit_killed_mid_transaction_leaves_the_session_restorable(
    pg_dsn: str, store: PostgresCheckpointStore
) -> None:
    first = _create(store, "s")
    second = _next(first, {"ops": ["killed"]})
    outcome: list[BaseException | None] = []

    def commit() -> None:
        try:
            store.commit_session_snapshot(
                SessionSnapshotCommit(
                    session_id="s", expected_head=first.snapshot_id, snapshot=second, lifecycle="running"
                )
            )
            outcome.append(None)
        except BaseException as exc:  # inspected below
            outcome.append(exc)

    with psycopg.connect(pg_dsn) as locker:  # holds the head row, so the commit waits inside its statement
        locker.execute(f"SELECT 1 FROM \"{store.schema}\".heads WHERE session_id = 's' FOR UPDATE")
        committer = threading.Thread(target=commit)
        committer.start()
        deadline = time.monotonic() + 30
        while True:
            waiting = _sql(
                pg_dsn,
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'WITH head AS%%'",
            )
            if waiting:
                break
            assert time.monotonic() < deadline, "the commit never reached the server"
            time.sleep(0.01)
        _sql(pg_dsn, "SELECT pg_terminate_backend(%s)", (waiting[0][0],))
        committer.join(timeout=30)
        locker.rollback()
    assert len(outcome) == 1 and isinstance(outcome[0], CheckpointError)
    head = store.get_session_head("s")
    assert head is not None and head.snapshot_id == first.snapshot_id
    assert store.load_chain(head.snapshot_id) == [first]
    store.commit_session_snapshot(
        SessionSnapshotCommit(session_id="s", expected_head=first.snapshot_id, snapshot=second, lifecycle="running")
    )
    assert store.load_chain(second.snapshot_id) == [first, second]


def test_an_unreachable_server_is_a_clear_error_without_the_password() -> None:
    store = PostgresCheckpointStore("postgresql://qitos:s3cret@/nodb?host=/nonexistent-dir&connect_timeout=2")
    with pytest.raises(CheckpointError, match="cannot connect") as caught:
        store.list_sessions()
    assert "s3cret" not in str(caught.value)
    store.close()


# --------------------------------------------------------------------------- byte flips


def _damaged_store(store: PostgresCheckpointStore) -> tuple[SessionSnapshot, str]:
    head = _create(store, "s", {"full": {"notes": ["a" * 64]}})
    store.put_writes(
        [StepWrite(session_id="s", base_snapshot_id=head.snapshot_id, step_id=1, kind="tool_result", key="c1",
                   payload={"text": "the recorded result"})]
    )  # fmt: skip
    store.append_control("s", "steer", {"text": "left"})
    data = b"a blob body"
    digest = hashlib.sha256(data).hexdigest()
    store.put_blobs({digest: data})
    return head, digest


@pytest.mark.parametrize(
    ("table", "column", "where"),
    [
        ("snapshots", "payload", "true"),
        ("sessions", "metadata", "true"),
        ("writes", "payload", "true"),
        ("control", "payload", "true"),
        ("blobs", "data", "true"),
    ],
)
def test_a_flipped_byte_in_any_table_is_detected_and_named(pg_dsn: str, table: str, column: str, where: str) -> None:
    with pg_store(pg_dsn, compress_min_bytes=None) as store:
        head, digest = _damaged_store(store)
        _sql(
            pg_dsn,
            f'UPDATE "{store.schema}".{table} SET {column} = '
            f"set_byte({column}, 5, get_byte({column}, 5) # 1) WHERE {where}",
        )
        reads = {
            "snapshots": lambda: store.load_chain(head.snapshot_id),
            "sessions": lambda: store.get_session_head("s"),
            "writes": lambda: store.get_writes("s", head.snapshot_id),
            "control": lambda: store.list_control("s"),
            "blobs": lambda: store.get_blobs([digest]),
        }
        with pytest.raises(IntegrityError) as caught:
            reads[table]()
        if table in ("snapshots", "writes"):  # a restore's one read of both checks them the same way
            with pytest.raises(IntegrityError) as restoring:
                store.load_chain_with_writes("s", head.snapshot_id)
            assert (restoring.value.table, restoring.value.row) == (caught.value.table, caught.value.row)
        error = caught.value
        assert error.table == table
        if table == "snapshots":
            assert isinstance(error, SnapshotIntegrityError) and error.row == head.snapshot_id
        elif table == "blobs":
            assert isinstance(error, BlobIntegrityError) and error.row == digest
        else:
            assert error.session_id == "s"
            assert error.row == {"sessions": "s", "writes": "tool_result/c1", "control": "1"}[table]


def test_a_changed_head_row_and_a_deleted_control_item_are_detected(
    pg_dsn: str, store: PostgresCheckpointStore
) -> None:
    _create(store, "s")
    for text in ("one", "two", "three"):
        store.append_control("s", "steer", {"text": text})
    _sql(pg_dsn, f"UPDATE \"{store.schema}\".heads SET lifecycle = 'crdated'")
    with pytest.raises(IntegrityError) as caught:
        store.get_session_head("s")
    assert (caught.value.table, caught.value.row, caught.value.session_id) == ("heads", "s", "s")
    with pytest.raises(IntegrityError):
        store.list_sessions()
    with pytest.raises(IntegrityError) as positions:  # the heads-only read checks the row too
        store.get_session_positions(["s"])
    assert (positions.value.table, positions.value.row) == ("heads", "s")
    _sql(pg_dsn, f'DELETE FROM "{store.schema}".control WHERE position = 3')
    with pytest.raises(IntegrityError, match="missing") as missing:
        store.list_control("s")
    assert (missing.value.table, missing.value.row) == ("control", "3")


# --------------------------------------------------------------------------- schema and lifecycle


def test_the_schema_records_its_version_and_a_newer_one_is_refused(pg_dsn: str) -> None:
    schema = fresh_schema()
    try:
        with PostgresCheckpointStore(pg_dsn, schema=schema) as store:
            store.list_sessions()
        versions = _sql(pg_dsn, f'SELECT version FROM "{schema}".schema_version ORDER BY version')
        assert versions == [(v,) for v in range(1, SCHEMA_VERSION + 1)]
        _sql(
            pg_dsn,
            f"INSERT INTO \"{schema}\".schema_version VALUES (%s, 'from the future', 'now')",
            (SCHEMA_VERSION + 1,),
        )
        with PostgresCheckpointStore(pg_dsn, schema=schema) as newer, pytest.raises(CheckpointError, match="newer"):
            newer.list_sessions()
    finally:
        drop_schema(pg_dsn, schema)


def test_a_version_1_schema_loses_the_unused_writes_index_and_keeps_its_rows(pg_dsn: str) -> None:
    """Migration 2 drops ``writes_base``: every read of pending writes goes by the primary key."""
    schema = fresh_schema()
    indexes = f"SELECT indexname FROM pg_indexes WHERE schemaname = '{schema}' AND tablename = 'writes'"
    try:
        with PostgresCheckpointStore(pg_dsn, schema=schema) as store:
            head = _create(store, "s")
            write = StepWrite(session_id="s", base_snapshot_id=head.snapshot_id, step_id=1, kind="tool_result",
                              key="c1", payload={"text": "kept"})  # fmt: skip
            store.put_writes([write])
        assert _sql(pg_dsn, indexes) == [("writes_pkey",)]
        # The schema as version 1 left it: the index back, no tally, no record of versions 2 and 3.
        _sql(pg_dsn, f'CREATE INDEX writes_base ON "{schema}".writes (base_snapshot_id)')
        _sql(pg_dsn, f'ALTER TABLE "{schema}".heads DROP COLUMN writes_count, DROP COLUMN writes_digest')
        _sql(pg_dsn, f'DELETE FROM "{schema}".schema_version WHERE version >= 2')
        with PostgresCheckpointStore(pg_dsn, schema=schema) as store:
            assert [w.payload for w in store.get_writes("s", head.snapshot_id)] == [{"text": "kept"}]
        assert sorted(_sql(pg_dsn, indexes)) == [("writes_pkey",)]
        assert _sql(pg_dsn, f'SELECT version FROM "{schema}".schema_version ORDER BY version') == [(1,), (2,), (3,)]
    finally:
        drop_schema(pg_dsn, schema)


def test_stores_opening_one_new_schema_at_once_migrate_it_once(pg_dsn: str) -> None:
    schema = fresh_schema()
    errors: list[BaseException] = []

    def open_and_use(n: int) -> None:
        try:
            with PostgresCheckpointStore(pg_dsn, schema=schema) as store:
                _create(store, f"s{n}")
        except BaseException as exc:  # reported below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=open_and_use, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert _sql(pg_dsn, f'SELECT count(*) FROM "{schema}".schema_version') == [(SCHEMA_VERSION,)]
        assert _sql(pg_dsn, f'SELECT count(*) FROM "{schema}".heads') == [(4,)]
    finally:
        drop_schema(pg_dsn, schema)


@pytest.mark.timeout(120)
def test_the_async_twins_work_from_one_event_loop_after_another_and_each_run_ends(
    store: PostgresCheckpointStore,
) -> None:
    first = _create(store, "s")
    for _ in range(4):  # each asyncio.run is a new loop: the store opens a pool for it, closed as it ends
        started = time.monotonic()
        head = asyncio.run(store.aget_session_head("s"))
        assert head is not None and head.snapshot_id == first.snapshot_id
        assert time.monotonic() - started < 30  # the loop's end did not wait on the pool's workers


def test_an_event_loops_connections_are_all_closed_when_it_ends(pg_dsn: str) -> None:
    """``asyncio.run`` cancels the pool's workers together with the task that closes the pool."""
    application_name = f"qitos_loops_{fresh_schema()}"
    separator = "&" if "?" in pg_dsn else "?"
    schema = fresh_schema()
    dsn = f"{pg_dsn}{separator}application_name={application_name}"
    store = PostgresCheckpointStore(dsn, schema=schema, min_size=4, max_size=4)  # all open before use

    async def busy() -> None:  # eight at once on the four connections
        await asyncio.gather(*(store.aget_session_head("s") for _ in range(8)))

    def open_connections() -> int:
        query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
        deadline = time.monotonic() + 5
        while (count := int(_sql(pg_dsn, query, (application_name,))[0][0])) and time.monotonic() < deadline:
            time.sleep(0.05)  # a closed connection's server process takes a moment to go
        return count

    try:
        for _ in range(3):
            asyncio.run(busy())
            assert open_connections() == 0
    finally:
        store.close()
        drop_schema(pg_dsn, schema)


def test_without_prepared_statements_for_pgbouncer_everything_works(pg_dsn: str) -> None:
    with pg_store(pg_dsn, prepare_threshold=None) as store:
        head = _create(store, "s")
        for i in range(8):  # past psycopg's default threshold of 5
            nxt = _next(head, {"ops": [i]})
            store.commit_session_snapshot(
                SessionSnapshotCommit(session_id="s", expected_head=head.snapshot_id, snapshot=nxt, lifecycle="running")
            )
            head = nxt
        assert len(store.load_chain(head.snapshot_id)) == 9


def test_bad_options_are_refused_naming_them(pg_dsn: str) -> None:
    with pytest.raises(ConfigurationError, match="schema"):
        PostgresCheckpointStore(pg_dsn, schema="Robert'); DROP TABLE students;--")
    with pytest.raises(ConfigurationError, match="min_size"):
        PostgresCheckpointStore(pg_dsn, min_size=3, max_size=2)
    with pytest.raises(ConfigurationError, match="check_idle_after"):
        PostgresCheckpointStore(pg_dsn, check_idle_after=-1)


def test_importing_qitos_never_imports_psycopg_and_a_missing_extra_is_named() -> None:
    code = (
        "import sys\n"
        "import qitos, qitos.checkpoint._postgres_store, qitos.checkpoint._targets, qitos.cli._sessions\n"
        "print('psycopg' in sys.modules, 'psycopg_pool' in sys.modules)\n"
        "sys.modules['psycopg'] = None\n"
        "from qitos.checkpoint._targets import open_store\n"
        "try:\n"
        "    open_store('postgresql://localhost/x')\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True)
    first, second = out.stdout.strip().splitlines()
    assert first == "False False"
    assert second.startswith("ConfigurationError") and install_command("postgres") in second


def test_a_live_lease_of_a_runner_known_dead_is_taken_over_with_a_new_token(store: PostgresCheckpointStore) -> None:
    _create(store, "s")
    dead = store.acquire_lease("s", "worker-1", ttl_seconds=60)
    with pytest.raises(SessionBusyError, match="worker-1"):
        store.acquire_lease("s", "worker-2", ttl_seconds=60, take_over_from="someone-else")
    taken = store.acquire_lease("s", "worker-2", ttl_seconds=60, take_over_from="worker-1")
    assert (taken.owner, taken.token) == ("worker-2", dead.token + 1)
    assert store.get_lease("s") == taken


def test_many_first_calls_at_once_on_an_event_loop_open_one_pool(pg_dsn: str) -> None:
    """A worker starts its sessions together: the loop's pool is opened once, not once per call."""
    schema, name = fresh_schema(), f"qitos-first-calls-{time.monotonic_ns()}"
    dsn = f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}application_name={name}"
    store = PostgresCheckpointStore(dsn, schema=schema, min_size=1, max_size=2)

    async def main() -> int:
        heads = await asyncio.gather(*(store.aget_session_head(f"s{n}") for n in range(20)))
        assert heads == [None] * 20
        with psycopg.connect(pg_dsn) as conn:
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)).fetchone()
        assert row is not None
        return int(row[0])

    try:
        assert asyncio.run(main()) <= 2  # the pool's max_size; one pool per call would have made 20
    finally:
        store.close()
        drop_schema(pg_dsn, schema)


# --------------------------------------------------------------------------- plans


def _seq_scans(dsn: str, schema: str, application_name: str) -> dict[str, int]:
    """Whole-table scans of ``schema``'s tables so far, once the store's server processes (which
    report their counts when they exit) are gone."""
    deadline = time.monotonic() + 10
    while _sql(dsn, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (application_name,))[0][0]:
        assert time.monotonic() < deadline, "the store's connections did not end"
        time.sleep(0.05)
    counts: dict[str, int] = {}
    for _ in range(50):  # a process that just ended may not have reported yet
        seen = dict(_sql(dsn, "SELECT relname, seq_scan FROM pg_stat_user_tables WHERE schemaname = %s", (schema,)))
        if seen == counts:
            break
        counts = seen
        time.sleep(0.1)
    return counts


def test_a_sessions_statements_find_rows_by_key_and_never_scan_a_table(pg_dsn: str) -> None:
    """Generic plans (which the store's connections keep) guess ten rows for every array: a
    statement that joins an array to a table could then scan the whole table at every step."""
    from fleet_app import FleetAgent
    from qitos.engine._composition import compose

    schema, application_name = fresh_schema(), f"qitos_plans_{fresh_schema()}"
    separator = "&" if "?" in pg_dsn else "?"
    dsn = f"{pg_dsn}{separator}application_name={application_name}"

    def run(sessions: range, *, create: bool = False) -> list[str]:
        store = PostgresCheckpointStore(dsn, schema=schema, prepare_threshold=0)  # every statement prepared
        composition = compose(FleetAgent, store=store)
        try:
            if create:
                return [composition.session(f"t{i}", target=2).session_id.value for i in sessions]
            for i in sessions[: len(sessions) // 2]:
                composition.restore(ids[i]).run()

            async def arun_rest() -> None:
                for i in sessions[len(sessions) // 2 :]:
                    await (await composition.arestore(ids[i])).arun()

            asyncio.run(arun_rest())
            return []
        finally:
            store.close()

    try:
        ids = run(range(300), create=True)
        run(range(0, 40))  # tables with rows in them, and statistics
        before = _seq_scans(pg_dsn, schema, application_name)
        run(range(40, 60))
        after = _seq_scans(pg_dsn, schema, application_name)
        assert {table: after[table] - before.get(table, 0) for table in after} == dict.fromkeys(after, 0)
    finally:
        drop_schema(pg_dsn, schema)


def test_the_many_heads_reads_find_each_head_by_key_though_planned_on_a_small_table(pg_dsn: str) -> None:
    """What Fleet.wait reads at every poll. A generic plan is made once per connection, here while
    the table holds three sessions: it must still look each head up by key at three hundred."""
    from fleet_app import FleetAgent
    from qitos.engine._composition import compose

    schema, application_name = fresh_schema(), f"qitos_plans_{fresh_schema()}"
    separator = "&" if "?" in pg_dsn else "?"
    dsn = f"{pg_dsn}{separator}application_name={application_name}"
    try:
        with PostgresCheckpointStore(dsn, schema=schema) as store:  # the schema (its set-up scans each table)
            ids = [compose(FleetAgent, store=store).session("t0", target=2).session_id.value]
        before = _seq_scans(pg_dsn, schema, application_name)
        store = PostgresCheckpointStore(dsn, schema=schema, min_size=1, max_size=1, prepare_threshold=0)
        composition = compose(FleetAgent, store=store)
        try:
            ids += [composition.session(f"t{i}", target=2).session_id.value for i in range(1, 3)]
            assert len(store.get_session_positions(ids)) == len(store.get_session_heads(ids)) == 3
            ids += [composition.session(f"t{i}", target=2).session_id.value for i in range(3, 300)]
            for start in range(0, 100, 20):
                assert len(store.get_session_positions(ids[start : start + 20])) == 20
                heads = store.get_session_heads([*ids[start : start + 20], "ses_unknown"])
                assert sorted(heads) == sorted(ids[start : start + 20])
        finally:
            store.close()
        after = _seq_scans(pg_dsn, schema, application_name)
        assert (after["heads"], after["sessions"]) == (before["heads"], before["sessions"])
    finally:
        drop_schema(pg_dsn, schema)
