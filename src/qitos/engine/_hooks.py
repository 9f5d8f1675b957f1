"""Engine hooks: observe a run at fixed points without changing the loop.

Subclass ``EngineHook`` and override what you need. A hook that raises is reported as an ``error``
event (naming the hook and method) and the run continues; it is never silently swallowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["HOOK_METHODS", "EngineHook", "HookContext"]

HOOK_METHODS = (
    "on_run_start",
    "on_before_decide",
    "on_after_decide",
    "on_before_act",
    "on_after_act",
    "on_before_reduce",
    "on_after_reduce",
    "on_step_end",
    "on_run_end",
)


@dataclass
class HookContext:
    """What a hook sees: the run, the step, and the values of the phase that just ran."""

    run_id: str
    step_id: int
    state: Any
    decision: Any = None
    observation: Any = None
    record: Any = None
    result: Any = None
    journal: Any = None  # on_run_start: the run's RunJournal (a SessionJournal for a durable session)


class EngineHook:
    """Base class of engine hooks; every method is optional.

    ``wants_model_content``: set True in a hook that needs the prompt and the reply in the
    ``model_request``/``model_response`` events (they carry only ids, model and usage otherwise).
    ``wants_model_deltas``: set False in an ``on_event`` hook that ignores ``model_delta`` events, so
    that it alone does not make the engine stream model replies.
    """

    wants_model_content: bool = False
    wants_model_deltas: bool = True

    def on_run_start(self, ctx: HookContext) -> None:
        """Before the first step (``ctx.journal`` is the run's journal)."""

    def on_before_decide(self, ctx: HookContext) -> None:
        """Before DECIDE."""

    def on_after_decide(self, ctx: HookContext) -> None:
        """After DECIDE (``ctx.decision`` is set)."""

    def on_before_act(self, ctx: HookContext) -> None:
        """Before ACT."""

    def on_after_act(self, ctx: HookContext) -> None:
        """After ACT (``ctx.observation`` is set)."""

    def on_before_reduce(self, ctx: HookContext) -> None:
        """Before REDUCE."""

    def on_after_reduce(self, ctx: HookContext) -> None:
        """After REDUCE (``ctx.state`` is the new state)."""

    def on_step_end(self, ctx: HookContext) -> None:
        """After a step is committed (``ctx.record`` is its StepRecord)."""

    def on_run_end(self, ctx: HookContext) -> None:
        """After the run ends (``ctx.result`` is the EngineResult)."""

    def on_event(self, event: Any) -> None:
        """Every event as it is emitted (renderers use this)."""
