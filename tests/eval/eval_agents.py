"""Agents for the eval tests, importable by the subprocesses the tests start (``eval_agents:Name``).

- ``Upper``: answers its task in upper case without a model; ``boom`` raises, ``hang`` waits in an
  async tool for a minute, ``slow`` takes a few tool steps of 50 ms each.
- ``Asker``: asks its model at every step (the model path) with tools ``lookup`` and ``add``.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import Any

from qitos import Action, AgentModule, Decision, StateSchema, tool

RUNS_FILE = "QITOS_TEST_EVAL_RUNS"  # when set: a file each decide of Upper appends its task to


@tool(idempotent=True)
async def wait(seconds: float) -> str:
    """Wait.

    Args:
        seconds: how long.
    """
    await asyncio.sleep(seconds)
    return "waited"


@dataclass
class UpperState(StateSchema):
    waits: list[str] = field(default_factory=list)


class Upper(AgentModule[UpperState, Any, Any]):
    tools = (wait,)

    def init_state(self, task: str, **kwargs: Any) -> UpperState:
        return UpperState(task=task, max_steps=8)

    def decide(self, state: UpperState, observation: Any) -> Decision[Any]:
        runs = os.environ.get(RUNS_FILE)
        if runs:
            with open(runs, "a", encoding="utf-8") as handle:
                handle.write(f"{state.task}|{state.current_step}\n")
        task = state.task
        if task.startswith("boom"):
            raise RuntimeError(f"the agent broke on {task!r}")
        if task.startswith("hang") and not state.waits:
            return Decision.act([Action("wait", {"seconds": 60})])
        if task.startswith("slow") and len(state.waits) < 3:
            return Decision.act([Action("wait", {"seconds": 0.05})])
        return Decision.final(task.upper())

    def reduce(self, state: UpperState, observation: Any, decision: Decision[Any]) -> UpperState:
        for result in getattr(observation, "results", ()):
            state.waits.append(result.as_text())
        return state


@tool(idempotent=True)
def lookup(word: str) -> str:
    """Look a word up.

    Args:
        word: the word.
    """
    return f"{word}:{len(word)}"


@tool()
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: first.
        b: second.
    """
    return a + b


class Asker(AgentModule[StateSchema, Any, Any]):
    tools = (lookup, add)

    def init_state(self, task: str, **kwargs: Any) -> StateSchema:
        return StateSchema(task=task, max_steps=6)

    def reduce(self, state: StateSchema, observation: Any, decision: Decision[Any]) -> StateSchema:
        return state


def _fleet_composition() -> Any:
    from qitos.engine._composition import compose

    return compose(agent=Upper)


fleet_composition = _fleet_composition()
"""``Upper`` for fleet workers (``qitos worker --app eval_agents:fleet_composition``)."""


STALL_FILE = "QITOS_TEST_EVAL_STALL"  # when set: the first decide of a task starting "stall" blocks this many seconds


class Staller(AgentModule[UpperState, Any, Any]):
    """Blocks the event loop once (a process stalled past its lease), in its second step."""

    tools = (wait,)

    def init_state(self, task: str, **kwargs: Any) -> UpperState:
        return UpperState(task=task, max_steps=8)

    def decide(self, state: UpperState, observation: Any) -> Decision[Any]:
        marker = os.environ.get(STALL_FILE)
        if marker and state.waits and not os.path.exists(marker):
            with open(marker, "w", encoding="utf-8") as handle:
                handle.write(state.task)
            import time

            time.sleep(1.5)
        if len(state.waits) < 2:
            return Decision.act([Action("wait", {"seconds": 0.01})])
        return Decision.final(state.task.upper())

    def reduce(self, state: UpperState, observation: Any, decision: Decision[Any]) -> UpperState:
        for result in getattr(observation, "results", ()):
            state.waits.append(result.as_text())
        return state
