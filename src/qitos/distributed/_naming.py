"""The names the fleet shares between its processes: workflow ids, queue, schema, app loading.

A run of a session is one DBOS workflow whose id derives from the session and the control position
it answers (``qitos-{session}-{position}``), so asking twice for the same continuation starts it
once: DBOS keeps one workflow per id. The run that replaces one whose worker died adds ``-r`` to
the dead run's id, which every supervisor computes alike.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import replace

from qitos.checkpoint._targets import open_store, postgres_dsn
from qitos.core._errors import ConfigurationError
from qitos.engine._composition import Composition

__all__ = [
    "APP_NAME",
    "DEFAULT_QUEUE",
    "FLEET_METADATA",
    "WORKFLOW_NAME",
    "bind_store",
    "continuation_workflow_id",
    "dbos_schema",
    "fleet_queue",
    "load_composition",
    "redispatch_workflow_id",
    "run_workflow_id",
    "with_engine_options",
]

APP_NAME = "qitos"
"""The DBOS application name every fleet process uses (a client's enqueue names it)."""
DEFAULT_QUEUE = "qitos"
WORKFLOW_NAME = "qitos_run_session"
FLEET_METADATA = "fleet"
"""The session metadata key a Fleet's sessions carry: ``{"queue": name}`` (see :func:`fleet_queue`)."""


def fleet_queue(metadata: Mapping[str, object] | None) -> str | None:
    """The queue whose workers run a session with this metadata (a Fleet submitted it), else None."""
    mark = (metadata or {}).get(FLEET_METADATA)
    queue = mark.get("queue") if isinstance(mark, Mapping) else None
    return queue if isinstance(queue, str) else None


def run_workflow_id(session_id: str, position: int) -> str:
    """The workflow id of the run answering control position ``position`` (0: the first run)."""
    return f"qitos-{session_id}-{position}"


def continuation_workflow_id(session_id: str, answered_session_id: str, position: int) -> str:
    """The workflow id of the run of ``session_id`` that answers ``position`` of ``answered_session_id``.

    The answered session is ``session_id`` itself, or a delegated child of it, whose control
    positions are its own (so the child is named in the id, never confused with the parent's).
    """
    if answered_session_id == session_id:
        return run_workflow_id(session_id, position)
    return f"qitos-{session_id}-{answered_session_id}-{position}"


def redispatch_workflow_id(stuck_workflow_id: str) -> str:
    """The workflow id of the run that replaces ``stuck_workflow_id``, whose worker died."""
    return f"{stuck_workflow_id}-r"


def dbos_schema(db: str) -> str:
    """DBOS's system schema beside the store: ``{schema}_dbos``, or ``qitos_dbos`` without one."""
    _, schema = postgres_dsn(db)
    return f"{schema}_dbos" if schema else "qitos_dbos"


def bind_store(composition: Composition, db: str) -> Composition:
    """``composition`` with its checkpoint store replaced by the one ``db`` names."""
    runtime = replace(composition.runtime, checkpoint_store=open_store(db))
    return Composition(composition.agent_factory, runtime)


def with_engine_options(composition: Composition, **engine_kwargs: object) -> Composition:
    """``composition`` whose engines also get ``engine_kwargs`` (e.g. ``otel=`` for a worker's spans)."""
    runtime = replace(composition.runtime, engine_kwargs={**composition.runtime.engine_kwargs, **engine_kwargs})
    return Composition(composition.agent_factory, runtime)


def load_composition(target: str) -> Composition:
    """The ``Composition`` named ``pkg.module:attribute`` (a zero-argument callable returning one works)."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigurationError(f"--app is pkg.module:attribute, got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"--app {target!r}: cannot import {module_name!r}: {exc}") from exc
    value = getattr(module, attribute, None)
    if value is None:
        raise ConfigurationError(f"--app {target!r}: {module_name} has no attribute {attribute!r}")
    if not isinstance(value, Composition) and callable(value):
        value = value()
    if not isinstance(value, Composition):
        raise ConfigurationError(f"--app {target!r} is a {type(value).__name__}, not a qitos Composition")
    return value
