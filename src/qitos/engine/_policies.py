"""Pluggable judgments in the loop: branch selection, critics and stop criteria."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from qitos.core._decision import Decision, Observation
from qitos.core._state import StateSchema, StopReason

__all__ = [
    "BranchSelector",
    "Critic",
    "CriticVerdict",
    "FinalResultCriteria",
    "FirstCandidateSelector",
    "StopCriteria",
]


@runtime_checkable
class BranchSelector(Protocol):
    """Resolves a ``branch`` decision to one of its candidates: the search step of a run."""

    def select(self, candidates: Sequence[Decision[Any]], state: Any) -> Decision[Any]:
        """The chosen candidate."""
        ...


class FirstCandidateSelector:
    """The default selector: the first candidate."""

    def select(self, candidates: Sequence[Decision[Any]], state: Any) -> Decision[Any]:
        """The first candidate."""
        return candidates[0]


@dataclass(frozen=True)
class CriticVerdict:
    """A critic's judgment of a step: continue, stop the run, or retry the step."""

    action: Literal["continue", "stop", "retry"] = "continue"
    reason: str | None = None


@runtime_checkable
class Critic(Protocol):
    """Judges each step after REDUCE.

    ``retry`` restores the state from before the step and runs the step again (its tools run again),
    with the reason passed to the agent as observation feedback; after ``max_critic_retries`` the
    step stands. To make that possible the engine encodes the state before each step while critics
    are configured: a per-step cost proportional to the state, paid only by runs with critics.
    """

    def evaluate(self, state: Any, decision: Decision[Any], observation: Observation) -> CriticVerdict | None:
        """The verdict, or None to continue."""
        ...


@runtime_checkable
class StopCriteria(Protocol):
    """Decides whether the run should stop after a step."""

    def check(self, state: StateSchema) -> StopReason | str | None:
        """A stop reason to stop with, or None to go on."""
        ...


class FinalResultCriteria:
    """Stop with ``final`` once ``state.final_result`` is set (the default criterion)."""

    def check(self, state: StateSchema) -> StopReason | None:
        """``final`` when a final result exists."""
        return StopReason.FINAL if state.final_result is not None else None
