"""The ``Engine``: the canonical loop (``qitos.engine._loop.EngineLoop``) plus durable sessions.

``Engine.run`` / ``Engine.arun`` run a task through the one loop with the sync / async driver;
``Engine.session(task)`` starts a durable Session on the engine's checkpoint store and
``Engine.restore(session_id)`` continues one. The loop itself,
its phases and its drivers are described in ``qitos.engine._loop`` and ``qitos.engine._drivers``.
"""

from __future__ import annotations

from typing import Any, TypeVar

from qitos.core._state import StateSchema
from qitos.core._task import Task
from qitos.engine._loop import DEFAULT_TOOL_WORKERS, EngineLoop, status_for_stop_reason
from qitos.engine.session_runtime import Session, new_session, restore_session

__all__ = ["DEFAULT_TOOL_WORKERS", "Engine", "status_for_stop_reason"]

StateT = TypeVar("StateT", bound=StateSchema)
ObservationT = TypeVar("ObservationT")
ActionT = TypeVar("ActionT")


class Engine(EngineLoop[StateT, ObservationT, ActionT]):
    """Runs an AgentModule through the canonical loop; see ``EngineLoop`` for every argument."""

    def session(self, task: str | Task, **state_kwargs: Any) -> Session:
        """A new durable Session for ``task`` bound to this engine's checkpoint store."""
        return new_session(self, task, **state_kwargs)

    def restore(self, session_id: str) -> Session:
        """The durable Session ``session_id`` from this engine's checkpoint store, at its head (in any
        process, with a store that outlives it). Raises SessionNotFoundError for an unknown id."""
        return restore_session(self, session_id)
