"""qitos.checkpoint: where sessions are stored.

The ``CheckpointStore`` contract (``qitos.checkpoint.store``) and its implementations: the
in-process ``InMemoryCheckpointStore`` (``memory_store``, imported eagerly), the
``SqliteCheckpointStore`` (``sqlite_store``) and the ``PostgresCheckpointStore`` (``postgres_store``,
extra ``qitos-kernel[postgres]``), which load on first access so ``import qitos`` never imports ``sqlite3``
or psycopg. ``open_store`` (``targets``) opens a store from the text naming it: a path,
``sqlite:///...`` or a ``postgresql://`` DSN::

    from qitos.checkpoint import SqliteCheckpointStore
    composition = compose(agent=MyAgent, checkpoint_store=SqliteCheckpointStore("sessions.db"))
"""

from __future__ import annotations

import importlib
from typing import Any

from qitos.checkpoint.memory_store import InMemoryCheckpointStore
from qitos.checkpoint.store import CheckpointStore

__all__ = [
    "CheckpointStore",
    "InMemoryCheckpointStore",
    "PostgresCheckpointStore",
    "SqliteCheckpointStore",
    "open_store",
]

_LAZY = {
    "SqliteCheckpointStore": "qitos.checkpoint.sqlite_store",
    "PostgresCheckpointStore": "qitos.checkpoint.postgres_store",
    "open_store": "qitos.checkpoint.targets",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'qitos.checkpoint' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
