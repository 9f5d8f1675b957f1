"""Nothing a session writes to its store holds a secret: the task's sk- key and the model's
configured credentials are redacted in the task metadata, the state, pending writes (decision, tool
arguments, tool error text), the exchange log and the request view, and the session still restores."""

from __future__ import annotations

from pathlib import Path

from qitos import compose
from qitos.checkpoint.sqlite_store import SqliteCheckpointStore
from qitos.core.redaction import REDACTED
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
