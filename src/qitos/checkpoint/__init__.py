"""qitos.checkpoint: where sessions are stored.

The ``CheckpointStore`` contract (``qitos.checkpoint.store``) and its implementations: the
in-process ``InMemoryCheckpointStore`` (imported eagerly), the ``SqliteCheckpointStore`` and the
``PostgresCheckpointStore`` (extra ``qitos-kernel[postgres]``), which load on first access so
``import qitos`` never imports ``sqlite3`` or psycopg. ``open_store`` opens a store from the text
naming it: a path, ``sqlite:///...`` or a ``postgresql://`` DSN::

    from qitos.checkpoint import SqliteCheckpointStore
    composition = compose(agent=MyAgent, checkpoint_store=SqliteCheckpointStore("sessions.db"))
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from qitos.checkpoint._memory_store import InMemoryCheckpointStore
from qitos.checkpoint.store import CheckpointStore

if TYPE_CHECKING:  # for type checkers and the API reference; at run time they load on first access
    from qitos.checkpoint._postgres_store import PostgresCheckpointStore
    from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
    from qitos.checkpoint._targets import open_store

__all__ = [
    "CheckpointStore",
    "InMemoryCheckpointStore",
    "PostgresCheckpointStore",
    "SqliteCheckpointStore",
    "open_store",
]

_LAZY = {
    "SqliteCheckpointStore": "qitos.checkpoint._sqlite_store",
    "PostgresCheckpointStore": "qitos.checkpoint._postgres_store",
    "open_store": "qitos.checkpoint._targets",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'qitos.checkpoint' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
