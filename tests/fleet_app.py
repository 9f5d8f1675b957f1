"""The agent the fleet tests run in worker processes (``--app fleet_app:composition``).

Each session does ``target`` steps; step ``i`` calls ``record`` (**not idempotent**), which writes
``begin``/``end`` lines naming the session's task and step to ``$QITOS_FLEET_SIDE_LOG``, so a
repeated call is visible afterwards. A task starting with ``approve`` also calls ``publish`` (needs
approval) at step 1. ``$QITOS_FLEET_STEP_SLEEP`` seconds pass in every call;
``$QITOS_FLEET_LEASE_TTL`` sets the composition's lease; with ``$QITOS_FLEET_GC_LOG`` set,
``record`` also appends the process's set-up there (``<frozen objects> <youngest collector
threshold> <event loop policy's module>``). While the file ``$QITOS_FLEET_HANG_FILE`` names exists,
building the agent (which a worker does for each run before it takes the session's lease) writes
``<that file>.hung`` and hangs: a worker that dies there has dequeued a run and holds no lease.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from dataclasses import dataclass

from delegate_agents import ParentAgent
from qitos.core._agent_module import AgentModule
from qitos.core._decision import Action, Decision, Observation
from qitos.core._state import StateSchema
from qitos.core._tool import ToolRegistry, tool
from qitos.engine._composition import compose

__all__ = ["FleetAgent", "FleetState", "composition", "delegating"]


@dataclass
class FleetState(StateSchema):
    """How many steps are done out of ``target``."""

    target: int = 10
    done: int = 0


def _log(line: str) -> None:
    path = os.environ.get("QITOS_FLEET_SIDE_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


class FleetTools:
    """``record`` (not idempotent) and ``publish`` (needs approval)."""

    @tool
    def record(self, task: str, step: int) -> str:
        """Record one step (not idempotent).

        Args:
            task: the session's task.
            step: the step.
        """
        _log(f"begin {task} {step}")
        gc_log = os.environ.get("QITOS_FLEET_GC_LOG")
        if gc_log:
            with open(gc_log, "a", encoding="utf-8") as fh:
                policy = type(asyncio.get_event_loop_policy()).__module__
                fh.write(f"{gc.get_freeze_count()} {gc.get_threshold()[0]} {policy}\n")
        pause = float(os.environ.get("QITOS_FLEET_STEP_SLEEP", "0"))
        if pause:
            time.sleep(pause)
        _log(f"end {task} {step}")
        return "ok"

    @tool(needs_approval=True)
    def publish(self, task: str) -> str:
        """Publish (needs a human's approval).

        Args:
            task: the session's task.
        """
        _log(f"publish {task} 0")
        return "published"


class FleetAgent(AgentModule[FleetState, Observation, Action]):
    """``target`` steps of one ``record`` call each, then a final answer."""

    def __init__(self) -> None:
        hang = os.environ.get("QITOS_FLEET_HANG_FILE")
        if hang and os.path.exists(hang):
            with open(f"{hang}.hung", "w", encoding="utf-8"):
                pass
            time.sleep(3600)
        registry = ToolRegistry()
        registry.include(FleetTools())
        super().__init__(tool_registry=registry)

    def init_state(self, task: str, **kwargs: object) -> FleetState:
        target = int(str(kwargs.get("target", 10)))
        return FleetState(task=task, target=target, max_steps=target + 5)

    def decide(self, state: FleetState, observation: Observation) -> Decision[Action] | None:
        if state.done >= state.target:
            return Decision.final(f"{state.done} steps")
        step = state.done
        actions = [Action("record", {"task": state.task, "step": step}, f"s{step}-record")]
        if step == 1 and state.task.startswith("approve"):
            actions.append(Action("publish", {"task": state.task}, "s1-publish"))
        return Decision.act(actions)

    def reduce(self, state: FleetState, observation: Observation, decision: Decision[Action]) -> FleetState:
        if decision.mode == "act":
            state.done += 1
        return state


composition = compose(FleetAgent, lease_ttl=float(os.environ.get("QITOS_FLEET_LEASE_TTL", "30")))


def _delegating_parent() -> ParentAgent:
    side_log = os.environ.get("QITOS_FLEET_SIDE_LOG") or os.devnull
    return ParentAgent(side_log, child_steps=3, approval_at=1)


delegating = compose(_delegating_parent, lease_ttl=float(os.environ.get("QITOS_FLEET_LEASE_TTL", "30")))
"""A parent (``delegate_agents.ParentAgent``) whose delegated child calls ``publish`` (needs approval)."""
