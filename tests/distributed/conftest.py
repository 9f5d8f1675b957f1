"""The fleet tests' fixtures: a fresh fleet database per test and a Fleet on it (DBOS is imported
only by the tests that start workers, which skip without it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleet_app import composition
from pg_server import drop_schema, fresh_schema
from qitos.distributed import Fleet
from qitos.distributed._naming import dbos_schema


@pytest.fixture
def fleet_db(pg_dsn: str) -> Iterator[str]:
    """A fleet database URL on a fresh schema (store and DBOS's tables), dropped afterwards."""
    schema = fresh_schema()
    db = f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}schema={schema}"
    yield db
    drop_schema(pg_dsn, schema)
    drop_schema(pg_dsn, dbos_schema(db))


@pytest.fixture
def fleet(fleet_db: str) -> Iterator[Fleet]:
    """A Fleet of the fleet test agent on ``fleet_db``."""
    instance = Fleet(composition, db=fleet_db)
    yield instance
    instance.close()
