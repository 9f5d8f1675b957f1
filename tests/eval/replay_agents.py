"""Agents for the replay and cache tests (``replay_agents:Name``, importable by subprocesses too).

``Prompted`` asks its model at every step (tools ``lookup`` and ``add`` from ``eval_agents``) with
the system prompt ``PROMPT``; ``Reworded`` is the same agent with one line of that prompt changed,
``ToolsChanged`` the same with a third tool. ``Lowering`` (for comparisons) answers like
``eval_agents.Upper`` but in lower case when the task starts with ``b``.
"""

from __future__ import annotations

from typing import Any

from eval_agents import Upper, UpperState, add, lookup

from qitos import AgentModule, Decision, StateSchema, tool

PROMPT = "You answer questions about words.\nUse the tools, then answer in upper case."
REWORDED = "You answer questions about words.\nUse the tools, then answer in UPPER CASE only."


@tool(idempotent=True)
def count(word: str) -> int:
    """Count the letters of a word.

    Args:
        word: the word.
    """
    return len(word)


class Prompted(AgentModule[StateSchema, Any, Any]):
    tools = (lookup, add)
    prompt = PROMPT

    def init_state(self, task: str, **kwargs: Any) -> StateSchema:
        return StateSchema(task=task, max_steps=6)

    def build_system_prompt(self, state: StateSchema) -> str | None:
        return self.prompt

    def reduce(self, state: StateSchema, observation: Any, decision: Decision[Any]) -> StateSchema:
        return state


class Reworded(Prompted):
    prompt = REWORDED


class ToolsChanged(Prompted):
    tools = (lookup, add, count)


class Lowering(Upper):
    def decide(self, state: UpperState, observation: Any) -> Decision[Any]:
        if state.task.startswith("b"):
            return Decision.final(state.task.lower())
        return super().decide(state, observation)
