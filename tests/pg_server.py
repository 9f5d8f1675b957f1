"""The PostgreSQL server the tests use, and a fresh schema per test.

``scripts/test.sh`` starts a private cluster (``scripts/postgres.sh``) and exports its DSN as
``QITOS_TEST_PG_DSN``. Without it, the ``pg_dsn`` fixture starts one for the test session itself
(``postgres.sh start --fast``) and stops it at the end; when none can be started the PostgreSQL
tests skip with the reason, except in CI (``CI=true``), where that is a failure.

Importable as ``pg_server`` (the tests directory is on ``sys.path``).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

__all__ = ["DSN_ENV", "drop_schema", "fresh_schema", "pg_dsn", "pg_store"]

DSN_ENV = "QITOS_TEST_PG_DSN"
_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "postgres.sh"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"PostgreSQL tests must run in CI: {reason}")
    pytest.skip(f"no PostgreSQL server: {reason}")


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """The DSN of a running PostgreSQL server (the one test.sh started, or one started here)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unavailable("psycopg is not installed (pip install 'qitos[postgres]')")
    dsn = os.environ.get(DSN_ENV)
    if dsn:
        yield dsn
        return
    try:
        started = subprocess.run(
            ["bash", str(_SCRIPT), "start", "--fast"], capture_output=True, text=True, timeout=180, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        _unavailable(f"{_SCRIPT.name} start failed: {exc}")
    if started.returncode != 0:
        last = (started.stderr.strip().splitlines() or ["(no output)"])[-1]
        _unavailable(f"{_SCRIPT.name} start failed: {last}")
    values: dict[str, str] = {}
    for line in started.stdout.splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export ") :].partition("=")
            values[name] = shlex.split(value)[0]
    try:
        yield values[DSN_ENV]
    finally:
        subprocess.run(["bash", str(_SCRIPT), "stop", values["QITOS_TEST_PG_DIR"]], check=False, timeout=60)


def fresh_schema() -> str:
    """A schema name no other test uses."""
    return f"t_{uuid.uuid4().hex[:16]}"


def drop_schema(dsn: str, schema: str) -> None:
    """Drop a test's schema with everything in it."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@contextmanager
def pg_store(dsn: str, **options: Any) -> Iterator[Any]:
    """A PostgresCheckpointStore on a fresh schema, closed and dropped afterwards."""
    from qitos.checkpoint._postgres_store import PostgresCheckpointStore

    schema = options.pop("schema", None) or fresh_schema()
    store = PostgresCheckpointStore(dsn, schema=schema, **options)
    try:
        yield store
    finally:
        store.close()
        drop_schema(dsn, schema)
