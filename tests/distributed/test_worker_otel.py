"""``qitos worker --otel`` exports the spans of the runs it serves (OTLP/HTTP, a real receiver)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_procs import start_worker, stop_workers

from otlp_receiver import Receiver, otlp_receiver
from pg_server import drop_schema, fresh_schema

pytest.importorskip("dbos", reason="the fleet tests need dbos (pip install 'qitos[fleet]')")

from fleet_app import composition
from qitos.distributed import Fleet
from qitos.distributed._naming import dbos_schema


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_SERVICE_NAME"):
        monkeypatch.delenv(name, raising=False)
    with otlp_receiver() as server:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", server.url)  # the worker process inherits it
        yield server


def test_a_worker_with_otel_exports_each_session_run(pg_dsn: str, tmp_path: Path, receiver: Receiver) -> None:
    schema = fresh_schema()
    db = f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}schema={schema}"
    proc = start_worker(db, tmp_path / "side.log", concurrency=2, extra_args=("--otel",))
    fleet = Fleet(composition, db=db)
    try:
        ids = fleet.submit_many(["traced-1", "traced-2"], target=2)
        outcomes = fleet.wait(ids, timeout=60)
        assert sorted({o.lifecycle for o in outcomes.values()}) == ["completed"]
    finally:
        fleet.close()
        stop_workers([proc])  # SIGTERM: the worker flushes its spans as it stops
        drop_schema(pg_dsn, schema)
        drop_schema(pg_dsn, dbos_schema(db))
    runs = receiver.named("invoke_agent")
    assert sorted(span.attributes["qitos.session.id"] for span in runs) == sorted(ids)
    assert len(receiver.named("qitos.step")) >= 2 * 2
