"""A durable run outlives a store hiccup: the PostgreSQL server ending the store's connections.

A run's heartbeat renews its session's lease during a tool call longer than the lease; when one
renewal fails, the next attempt (on a fresh connection) must succeed, so the run keeps its lease,
the call's result is kept and the session finishes, under ``run`` and ``arun``. Likewise a release
that fails once is tried again: a lease left behind turns the session's next run away as busy. A
write that fails mid-step ends the run with the store's error and leaves the session to resume,
never marked failed for a fault that was not its own.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import charge_agents as ca
from pg_server import drop_schema, fresh_schema
from qitos.checkpoint._postgres_store import PostgresCheckpointStore
from qitos.core._errors import CheckpointError
from qitos.sessions._lease import LeaseKeeper


@pytest.fixture
def pg_db(pg_dsn: str) -> Iterator[tuple[PostgresCheckpointStore, str]]:
    """A store on a fresh schema whose connections carry an application name of their own; both.

    Its pool checks no idle connection before use (``check_idle_after``): the server may end a
    connection between that check and its use anyway, and here it always does.
    """
    schema, name = fresh_schema(), f"qitos-hb-{uuid.uuid4().hex[:8]}"
    separator = "&" if "?" in pg_dsn else "?"
    store = PostgresCheckpointStore(f"{pg_dsn}{separator}application_name={name}", schema=schema, check_idle_after=600)
    yield store, name
    store.close()
    drop_schema(pg_dsn, schema)


def _kill_connections(dsn: str, name: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s", (name,)
        ).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.parametrize("driver", ["run", "arun"])
def test_a_store_hiccup_during_a_call_longer_than_the_lease_neither_loses_the_lease_nor_the_result(
    pg_dsn: str, pg_db: tuple[PostgresCheckpointStore, str], tmp_path: Path, driver: str
) -> None:
    db, name = pg_db
    ledger = tmp_path / "ledger"
    composition = ca.charge_composition(db, str(ledger), sleep=7.0, lease_ttl=3.0)
    session = composition.session("A")
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            if driver == "run":
                outcome["result"] = session.run()
            else:
                outcome["result"] = asyncio.run(session.arun())
        except BaseException as exc:  # reported below
            outcome["error"] = exc

    runner = threading.Thread(target=run)
    runner.start()
    deadline = time.monotonic() + 30
    while "begin A-0" not in ca.ledger(ledger):
        assert time.monotonic() < deadline and runner.is_alive(), outcome
        time.sleep(0.01)
    killed = 0
    for _ in range(2):  # twice during the 7 s call: each time every connection of the store ends
        time.sleep(1.5)
        killed += _kill_connections(pg_dsn, name)
    runner.join(60)
    assert killed >= 2
    assert "error" not in outcome, outcome
    result = outcome["result"]
    assert result.state.stop_reason == "final"
    assert ca.observed({"observed": result.state.observed}) == {"A-0": "ok"}
    assert ca.ledger(ledger).count("begin A-0") == 1


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_release_that_meets_a_killed_connection_still_gives_the_lease_up(
    pg_dsn: str, pg_db: tuple[PostgresCheckpointStore, str], tmp_path: Path, driver: str
) -> None:
    store, name = pg_db
    sid = ca.charge_composition(store, str(tmp_path / "ledger")).session("A").session_id.value
    keeper = LeaseKeeper(store, sid, ttl_seconds=30.0)
    if driver == "sync":
        keeper.acquire()
        assert _kill_connections(pg_dsn, name) >= 1
        keeper.release()
    else:

        async def hold_then_release() -> None:
            await keeper.aacquire()
            assert _kill_connections(pg_dsn, name) >= 1
            await keeper.arelease()

        asyncio.run(hold_then_release())
    with PostgresCheckpointStore(pg_dsn, schema=store.schema) as reader:  # connections of its own
        lease = reader.get_lease(sid)
    assert lease is not None and lease.expires_at <= time.time()  # given up, not left to lapse in 30 s


@pytest.mark.parametrize("driver", ["run", "arun"])
def test_a_store_failure_mid_step_leaves_the_session_to_resume_instead_of_marking_it_failed(
    pg_dsn: str, pg_db: tuple[PostgresCheckpointStore, str], tmp_path: Path, driver: str
) -> None:
    """The first call ends every store connection; the second call's start cannot be written. The run
    raises the store's error and the session stays where its last durable write left it."""
    store, name = pg_db
    ledger = tmp_path / "ledger"

    def cut(call: str) -> None:
        if call == "A-0" and "begin A-1" not in ca.ledger(ledger):
            assert _kill_connections(pg_dsn, name) >= 1

    composition = ca.charge_composition(store, str(ledger), after_begin=cut)
    session = composition.session("A", calls=2)
    # the server's message, or the client's when a pipelined group meets the closed connection first
    with pytest.raises(CheckpointError, match=r"terminating connection|server closed the connection"):
        session.run() if driver == "run" else asyncio.run(session.arun())
    assert store.get_session_head(session.session_id.value).lifecycle != "failed"  # type: ignore[union-attr]

    result = composition.restore(session.session_id.value).run()
    assert result.state.stop_reason == "final"
    # A-0's result went with the failed write: it ran, so it is interrupted; A-1 never began, so it ran now.
    assert ca.observed({"observed": result.state.observed}) == {"A-0": "interrupted", "A-1": "ok"}
    assert [line for line in ca.ledger(ledger) if line.startswith("begin")] == ["begin A-0", "begin A-1"]
