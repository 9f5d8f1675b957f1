"""Runtime settings consulted by the loop: ``RuntimeBudget``, ``LifecyclePolicy`` and its context."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qitos.core._decision import Action

__all__ = ["LifecyclePolicy"]


@dataclass(frozen=True)
class RuntimeBudget:
    """Engine-wide default limits; a Task's TaskBudget overrides each field it sets."""

    max_steps: int | None = None
    max_runtime_seconds: float | None = None
    max_tokens: int | None = None


@dataclass(frozen=True)
class RuntimeSnapshotContext:
    """What a LifecyclePolicy sees at a boundary.

    ``phase`` is ``"boundary"`` at the start of a step and ``"act"`` just before a tool call, in which
    case ``pending_tool_call`` is that call.
    """

    step_id: int
    phase: str
    pending_tool_call: Action | None
    state: Any
    run_id: str | None = None
    session_id: str | None = None


class LifecyclePolicy:
    """Replaceable cooperative lifecycle policy; never a worker scheduler.

    ``should_pause`` is consulted at every boundary and before each tool call; returning True pauses
    the run there (lifecycle ``paused``). Nothing is interrupted midway.
    """

    policy_id: str = "qitos.lifecycle.never/v1"

    def should_pause(self, context: RuntimeSnapshotContext) -> bool:
        """Whether to pause at this boundary."""
        return False


class NeverPause(LifecyclePolicy):
    """The default policy: never pauses."""
