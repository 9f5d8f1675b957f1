"""``qitos sessions show``/``list`` and CLI error lines never print a secret (issue 16)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qitos import compose
from qitos.checkpoint.sqlite_store import SqliteCheckpointStore
from qitos.core.redaction import REDACTED
from secret_agents import API_KEY, TASK_KEY, KeyedModel, SecretAgent


def _session(db: Path) -> str:
    store = SqliteCheckpointStore(str(db))
    session = compose(agent=SecretAgent, store=store, model=KeyedModel()).session(f"deploy with {TASK_KEY}")
    session.run()
    store.close()
    return session.session_id.value


def test_sessions_show_and_list_never_print_the_key(cli: Any, workdir: Path) -> None:
    sid = _session(workdir / "s.db")
    for args in (
        ("sessions", "show", sid, "--db", "s.db"),
        ("sessions", "show", sid, "--db", "s.db", "--json"),
        ("sessions", "list", "--db", "s.db"),
        ("sessions", "list", "--db", "s.db", "--json"),
    ):
        out = cli.run(*args, code=0).stdout
        assert TASK_KEY not in out and API_KEY not in out, args
        assert REDACTED in out, args
    detail = cli.json("sessions", "show", sid, "--db", "s.db", "--json")
    assert detail["session"]["task"] == f"deploy with {REDACTED}"


def test_an_error_line_does_not_repeat_a_token(cli: Any, workdir: Path) -> None:
    _session(workdir / "s.db")
    result = cli.run("sessions", "show", TASK_KEY, "--db", "s.db", code=3)
    assert f"session '{REDACTED}' not found" in result.stderr and TASK_KEY not in result.stderr
