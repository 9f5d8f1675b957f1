"""``qitos run --session-db`` and ``qitos sessions ... --db`` with a ``postgresql://`` URL, through the CLI."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pg_server import pg_store
from qitos.checkpoint._postgres_store import PostgresCheckpointStore
from qitos.core._redaction import REDACTED


@pytest.fixture
def url(pg_dsn: str) -> Iterator[str]:
    """A postgresql:// URL naming a fresh schema (``?schema=``), dropped afterwards."""
    with pg_store(pg_dsn) as store:
        separator = "&" if "?" in pg_dsn else "?"
        yield f"{pg_dsn}{separator}schema={store.schema}"


def test_the_approval_flow_runs_on_postgres_from_the_cli(cli: Any, workdir: Path, url: str) -> None:
    started = cli.json("run", "cli_agents:ApprovalAgent", "publish hello", "--session-db", url, "--json", code=0)
    sid = str(started["session_id"])
    listed = cli.json("sessions", "list", "--db", url, "--json")
    assert [(row["session_id"], row["lifecycle"]) for row in listed["sessions"]] == [(sid, "awaiting_approval")]
    assert listed["db"] == url
    detail = cli.json("sessions", "show", sid, "--db", url, "--json")
    assert detail["integrity"] == "verified"
    cli.json("sessions", "approve", sid, "call-publish", "--db", url, "--json")
    done = cli.json("sessions", "resume", sid, "--db", url, "--json")
    assert (done["status"], done["final_result"]) == ("completed", "done: published hello")
    vacuumed = cli.json("sessions", "vacuum", "--db", url, "--json")
    assert vacuumed["bytes_after"] > 0
    assert not (workdir / ".qitos").exists()  # nothing was written locally


def test_a_password_in_the_url_is_never_printed(cli: Any, workdir: Path, pg_dsn: str) -> None:
    from qitos.checkpoint._targets import describe_target

    assert (
        describe_target("postgresql://user:hunter2@db.example/qitos")
        == f"postgresql://user:{REDACTED}@db.example/qitos"
    )
    store = PostgresCheckpointStore(pg_dsn)
    assert "hunter2" not in repr(store)
    store.close()


def test_a_password_in_the_urls_query_is_never_printed_by_the_cli_or_shown_by_the_viewer(
    cli: Any, workdir: Path, url: str
) -> None:
    from qitos.viewer._server import ViewerServer

    secret = "S3cretPw0rd-r11"
    with_password = f"{url}&password={secret}"  # libpq takes it; the test server trusts local users
    shown = [cli.run("run", "cli_agents:ApprovalAgent", "publish hello", "--session-db", with_password, code=0).output]
    for extra in ((), ("--json",)):
        shown.append(cli.run("sessions", "list", "--db", with_password, *extra, code=0).output)
    with (
        ViewerServer(str(workdir / "runs"), db=with_password, port=0) as server,
        urllib.request.urlopen(server.url.rstrip("/") + "/api/sessions", timeout=30) as response,
    ):
        body = json.loads(response.read())
    assert len(body["sessions"]) == 1
    shown.append(str(body["db"]))  # the viewer's banner says which store it shows
    for text in shown:
        assert secret not in text, text
    assert body["db"].endswith(f"&password={REDACTED}")


def _schema_state(pg_dsn: str, schema: str) -> tuple[bool, bool]:
    """Whether ``schema`` exists, and whether it holds a qitos table."""
    import psycopg

    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %s),"
            " to_regclass(format('%%I.heads', %s::text)) IS NOT NULL",
            (schema, schema),
        ).fetchone()
    assert row is not None
    return bool(row[0]), bool(row[1])


@pytest.mark.parametrize("schema", ["qitoz_misspelled", "information_schema"])
def test_read_only_commands_never_create_a_schema_and_name_the_missing_one(
    cli: Any, workdir: Path, pg_dsn: str, schema: str
) -> None:
    from qitos.viewer._server import ViewerServer

    url = f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}schema={schema}"
    before = _schema_state(pg_dsn, schema)
    assert before[1] is False
    for args in (("sessions", "list"), ("sessions", "show", "ses_x"), ("sessions", "list", "--json")):
        out = cli.run(*args, "--db", url, code=3)
        assert f"schema {schema!r}" in out.output, out.output
    with (
        ViewerServer(str(workdir / "runs"), db=url, port=0) as server,
        urllib.request.urlopen(server.url.rstrip("/") + "/api/sessions", timeout=30) as response,
    ):
        assert json.loads(response.read())["available"] is False
    assert _schema_state(pg_dsn, schema) == before  # nothing was created


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("sessions", "list", "--db", "postgresql://[x/db"), "--db"),
        (("sessions", "show", "ses_1", "--db", "postgresql://u@[::1/db?schema=s"), "--db"),
        (("run", "cli_agents:ApprovalAgent", "hi", "--session-db", "postgresql://[x/db"), "--session-db"),
        (("sessions", "list", "--db", "postgresql://u@db.example:port/db"), "--db"),
        (("worker", "--app", "cli_agents:ApprovalAgent", "--db", "postgresql://[x/db"), "--db"),
        (("trace", "serve", "--db", "postgresql://[x/db"), "--db"),
    ],
)
def test_a_malformed_store_url_is_a_usage_error_naming_the_option(
    cli: Any, workdir: Path, args: tuple[str, ...], option: str
) -> None:
    out = cli.run(*args, code=2)
    assert option in out.output and "URL" in out.output, out.output
    assert "ValueError" not in out.output
