"""Naming a store by text: qitos.checkpoint._targets.open_store and compose(store=...)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pg_server import pg_store
from qitos.checkpoint._postgres_store import PostgresCheckpointStore
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.checkpoint._targets import describe_target, open_store, postgres_dsn, sqlite_path, store_exists
from qitos.core._errors import ConfigurationError
from qitos.engine._composition import compose


def test_paths_and_sqlite_urls_name_sqlite_files(tmp_path: Path) -> None:
    assert sqlite_path("runs/s.db") == "runs/s.db"
    assert sqlite_path("sqlite:///runs/s.db") == "runs/s.db"
    assert sqlite_path("sqlite:////abs/s.db") == "/abs/s.db"
    assert sqlite_path("postgresql://host/db") is None
    with pytest.raises(ConfigurationError, match="sqlite:///"):
        sqlite_path("sqlite://s.db")
    target = tmp_path / "s.db"
    assert not store_exists(str(target))
    with open_store(f"sqlite:///{target}") as store:
        assert isinstance(store, SqliteCheckpointStore) and store.path == str(target)
        store.list_sessions()
    assert store_exists(str(target)) and describe_target(str(target)) == str(target)


def test_a_postgres_url_keeps_its_parameters_and_takes_out_the_schema() -> None:
    assert postgres_dsn("postgresql://u@/db?host=/tmp/x&schema=s1") == ("postgresql://u@/db?host=/tmp/x", "s1")
    assert postgres_dsn("postgres://h:5433/db") == ("postgres://h:5433/db", None)
    # the other parameters reach libpq byte for byte: "%20" stays "%20" (libpq reads "+" literally)
    options = "postgresql://u@/db?options=-c%20statement_timeout%3D5s&schema=s%5F2&password=a+b"
    assert postgres_dsn(options) == ("postgresql://u@/db?options=-c%20statement_timeout%3D5s&password=a+b", "s_2")


def test_a_postgres_url_passes_server_options_through(pg_dsn: str) -> None:
    import psycopg  # present whenever pg_dsn is

    with pg_store(pg_dsn) as named:
        separator = "&" if "?" in pg_dsn else "?"
        store = open_store(f"{pg_dsn}{separator}options=-c%20statement_timeout%3D4321&schema={named.schema}")
        try:
            assert isinstance(store, PostgresCheckpointStore)
            with psycopg.connect(store.dsn) as conn:  # the DSN the store's pool connects with
                assert conn.execute("SHOW statement_timeout").fetchone() == ("4321ms",)
        finally:
            store.close()


def test_a_postgres_url_opens_the_postgres_store_on_its_schema(pg_dsn: str) -> None:
    with pg_store(pg_dsn) as named:
        separator = "&" if "?" in pg_dsn else "?"
        store = open_store(f"{pg_dsn}{separator}schema={named.schema}")
        try:
            assert isinstance(store, PostgresCheckpointStore) and store.schema == named.schema
            assert store.list_sessions() == []
        finally:
            store.close()


def test_compose_accepts_a_postgres_url_and_the_session_restores_from_it(pg_dsn: str, policy_agent: object) -> None:
    from qitos import Action, Decision, tool

    @tool
    def note(text: str) -> str:
        """Note a text.

        Args:
            text: The text.
        """
        return text

    def policy(state: object, observation: object) -> Decision[object]:
        if not getattr(state, "log", None):
            return Decision.act([Action("note", {"text": "hi"}, id="n1")])
        return Decision.final("done")

    with pg_store(pg_dsn) as named:
        separator = "&" if "?" in pg_dsn else "?"
        url = f"{pg_dsn}{separator}schema={named.schema}"
        composition = compose(agent=lambda: policy_agent(policy, tools=[note]), store=url)  # type: ignore[operator]
        store = composition.runtime.checkpoint_store
        try:
            assert isinstance(store, PostgresCheckpointStore)
            session = composition.session("note hi")
            result = session.run()
            assert result.state.final_result == "done"
            restored = composition.restore(session.session_id.value)
            assert restored.inspect().snapshot_integrity == "verified"
        finally:
            store.close()
