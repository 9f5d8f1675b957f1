"""qitos.checkpoint: where sessions are stored.

The ``CheckpointStore`` contract (``qitos.checkpoint.store``) and its implementations: the
in-process ``InMemoryCheckpointStore`` (``memory_store``, imported eagerly) and the
``SqliteCheckpointStore`` (``sqlite_store``), which loads on first access so ``import qitos`` never
imports ``sqlite3``::

    from qitos.checkpoint import SqliteCheckpointStore
    composition = compose(agent=MyAgent, checkpoint_store=SqliteCheckpointStore("sessions.db"))
"""

from __future__ import annotations

import importlib
from typing import Any

from qitos.checkpoint.memory_store import InMemoryCheckpointStore
from qitos.checkpoint.store import CheckpointStore

__all__ = ["CheckpointStore", "InMemoryCheckpointStore", "SqliteCheckpointStore"]

_LAZY = {"SqliteCheckpointStore": "qitos.checkpoint.sqlite_store"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'qitos.checkpoint' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
