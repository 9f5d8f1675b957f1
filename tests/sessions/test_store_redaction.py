"""Nothing a session writes to its store holds a secret: the task's sk- key and the model's
configured credentials are redacted in the task metadata, the state, pending writes (decision, tool
arguments, tool error text), the exchange log and the request view, and the session still restores."""

from __future__ import annotations

from pathlib import Path

from qitos import compose
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.core._redaction import REDACTED
from secret_agents import API_KEY, HEADER_SECRET, TASK_KEY, KeyedModel, SecretAgent, stored_texts

SECRETS = (TASK_KEY, API_KEY, HEADER_SECRET)


def test_a_session_database_holds_no_task_key_or_configured_credential(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    composition = compose(agent=SecretAgent, store=SqliteCheckpointStore(str(db)), model=KeyedModel())
    session = composition.session(f"log in as ann with {TASK_KEY}")
    result = session.run()
    assert result.state.final_result is not None
    assert any("login refused" in seen for seen in result.state.seen)  # the tool ran and failed
    composition.runtime.checkpoint_store.close()
    on_disk = stored_texts(db)
    assert "login refused" in on_disk and REDACTED in on_disk  # the data is there, redacted
    for secret in SECRETS:
        assert secret not in on_disk, secret

    again = compose(agent=SecretAgent, store=SqliteCheckpointStore(str(db)), model=KeyedModel())
    restored = again.restore(session.session_id.value)
    inspection = restored.inspect()
    assert inspection.snapshot_integrity == "verified"
    assert TASK_KEY not in str(inspection.task) and REDACTED in str(inspection.task)


def test_steering_text_is_redacted_before_it_is_stored(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    composition = compose(agent=SecretAgent, store=SqliteCheckpointStore(str(db)), model=KeyedModel())
    session = composition.session("plain task")
    session.steer(f"use {API_KEY} and {TASK_KEY}")
    composition.runtime.checkpoint_store.close()
    on_disk = stored_texts(db)
    assert API_KEY not in on_disk and TASK_KEY not in on_disk and f"use {REDACTED} and {REDACTED}" in on_disk


def test_passwords_in_connection_urls_reach_no_postgres_row_span_or_sessions_show(pg_dsn: str) -> None:
    """URLs with a password in the query (any scheme, every secret key) or after an empty user name,
    in the task, the tool arguments, results and errors, and the final answer."""
    import subprocess
    import sys

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from pg_server import drop_schema, fresh_schema
    from qitos.engine._telemetry import OtelSettings
    from secret_agents import REDIS_PASSWORD, URL_PASSWORDS, URL_TASK, UrlAgent, pg_stored_texts

    passwords = [*URL_PASSWORDS.values(), REDIS_PASSWORD]
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    schema = fresh_schema()
    db = f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}schema={schema}"
    try:
        otel = OtelSettings(tracer_provider=provider, capture_content=True)
        composition = compose(agent=UrlAgent, store=db, otel=otel)
        session = composition.session(URL_TASK)
        result = session.run()
        composition.runtime.checkpoint_store.close()
        assert result.state.final_result is not None and len(result.state.seen) == 3  # every call ran
        assert any("cannot reach" in seen for seen in result.state.seen)

        stored = pg_stored_texts(pg_dsn, schema)
        spans = "\n".join(
            str(value) for span in exporter.get_finished_spans() for value in (span.attributes or {}).values()
        )
        cli = [
            sys.executable,
            "-c",
            "from qitos.cli.app import main; main()",
            "sessions",
            "show",
            session.session_id.value,
        ]
        shown = subprocess.run([*cli, "--db", db], capture_output=True, text=True, timeout=120, check=True).stdout
        shown += subprocess.run(
            [*cli, "--db", db, "--json"], capture_output=True, text=True, timeout=120, check=True
        ).stdout
        for where, text in (("postgres", stored), ("spans", spans), ("sessions show", shown)):
            assert "cache:6379" in text and REDACTED in text, where  # the URLs are there, redacted
            leaked = [p for p in passwords if p in text]
            assert not leaked, (where, leaked)
    finally:
        provider.shutdown()
        drop_schema(pg_dsn, schema)
