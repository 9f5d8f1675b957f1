"""The fleet supervisor re-dispatches only sessions whose runner vanished (an expired, unreleased lease)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pg_server import drop_schema, fresh_schema

pytest.importorskip("dbos", reason="the fleet tests need dbos (pip install 'qitos[fleet]')")

from fleet_app import composition
from qitos.distributed import Worker


@pytest.fixture
def worker(pg_dsn: str) -> Iterator[Worker]:
    schema = fresh_schema()
    instance = Worker(composition, db=f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}schema={schema}")
    yield instance
    instance.composition.runtime.checkpoint_store.close()
    drop_schema(pg_dsn, schema)


def test_a_released_lease_or_a_never_started_session_is_not_redispatched(worker: Worker) -> None:
    """Nothing is enqueued (the worker is not even started: an enqueue would fail)."""
    store = worker.composition.runtime.checkpoint_store
    queued = worker.composition.session("never started")
    ended = worker.composition.session("released")
    lease = store.acquire_lease(ended.session_id.value, "someone:1:x", ttl_seconds=30)
    store.release_lease(lease)
    assert store.get_session_head(queued.session_id.value) is not None
    assert worker.supervise_once() == 0
    assert worker.redispatched == 0


def test_a_live_lease_is_not_redispatched(worker: Worker) -> None:
    store = worker.composition.runtime.checkpoint_store
    session = worker.composition.session("held")
    store.acquire_lease(session.session_id.value, "someone:1:y", ttl_seconds=30)
    assert worker.supervise_once() == 0


def test_a_fleet_refuses_a_concurrency_that_is_not_a_positive_int(pg_dsn: str) -> None:
    from qitos.core.errors import ConfigurationError
    from qitos.distributed import Fleet

    for bad in (0, -1, True, 2.5):
        with pytest.raises(ConfigurationError, match="concurrency"):
            Fleet(composition, db=pg_dsn, concurrency=bad)  # type: ignore[arg-type]
