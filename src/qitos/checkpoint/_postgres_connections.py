"""The PostgreSQL store's pooled connections: each keeps the cursor its statements run on (and the
cursors of a group's pipeline).

``connection.execute`` makes a new cursor, with a new adaptation context, for every statement; a
store connection runs one statement at a time, so one cursor serves them all (about 8 µs of CPU
less a statement). ``qitos.checkpoint._postgres_store`` imports this module only once psycopg is
known to be installed: ``import qitos`` never imports psycopg.
"""

from __future__ import annotations

from typing import Any

import psycopg

__all__ = ["AsyncStoreConnection", "StoreConnection"]


class StoreConnection(psycopg.Connection[Any]):
    """A sync pooled connection of the store, with its ``statements`` cursor; ``returned_at`` is
    when the store last gave it back to the pool (``time.monotonic()``; None: never)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.statements: psycopg.Cursor[Any] = self.cursor()
        self.spare: list[psycopg.Cursor[Any]] = []  # one per statement of a group's pipeline
        self.returned_at: float | None = None


class AsyncStoreConnection(psycopg.AsyncConnection[Any]):
    """An async pooled connection of the store, with its ``statements`` cursor and ``returned_at``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.statements: psycopg.AsyncCursor[Any] = self.cursor()
        self.spare: list[psycopg.AsyncCursor[Any]] = []
        self.returned_at: float | None = None
