"""Which calls of one decision run together: the one place the engine decides it.

A decision's calls are split, in order, into groups. Consecutive calls whose tools are declared
``concurrency_safe`` form one group and run at the same time (``qitos.engine._effects.ToolBatch``);
every other call is a group of its own, a barrier: it starts after everything before it has
finished, and nothing after it starts before it ends. Never grouped, whatever their flag says:
unknown tools, tools that need approval (a call waits for its approval first) and sub-agent tools
(a delegated call is a child session of its own).
"""

from __future__ import annotations

from collections.abc import Sequence

from qitos.core._decision import Action
from qitos.core._tool import ToolRegistry
from qitos.engine._subagent import SubAgentRunner

__all__ = ["may_run_together", "plan_calls"]


def may_run_together(registry: ToolRegistry, action: Action) -> bool:
    """Whether ``action`` may run concurrently with its concurrency-safe neighbours."""
    spec = registry.get(action.name)
    return (
        spec is not None
        and spec.concurrency_safe
        and not spec.needs_approval
        and not isinstance(spec.func, SubAgentRunner)
    )


def plan_calls(registry: ToolRegistry, actions: Sequence[Action]) -> list[tuple[Action, ...]]:
    """``actions`` split into groups run one after another (see the module docstring)."""
    groups: list[tuple[Action, ...]] = []
    run: list[Action] = []
    for action in actions:
        if may_run_together(registry, action):
            run.append(action)
            continue
        if run:
            groups.append(tuple(run))
            run = []
        groups.append((action,))
    if run:
        groups.append(tuple(run))
    return groups
