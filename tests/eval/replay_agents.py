"""Agents for the replay and cache tests (``replay_agents:Name``, importable by subprocesses too).

``Prompted`` asks its model at every step (tools ``lookup`` and ``add`` from ``eval_agents``) with
the system prompt ``PROMPT``; ``Reworded`` is the same agent with one line of that prompt changed,
``ToolsChanged`` the same with a third tool; ``Gated`` and ``SlowPrompted`` hold a sample between
two steps or inside a tool call. ``Lowering`` (for comparisons) answers like
``eval_agents.Upper`` but in lower case when the task starts with ``b``.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Sequence
from typing import Any, ClassVar

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
    tools: ClassVar[Sequence[Any]] = (lookup, add)
    prompt = PROMPT

    def init_state(self, task: str, **kwargs: Any) -> StateSchema:
        return StateSchema(task=task, max_steps=6)

    def build_system_prompt(self, state: StateSchema) -> str | None:
        return self.prompt

    def reduce(self, state: StateSchema, observation: Any, decision: Decision[Any]) -> StateSchema:
        return state


STEP_GATE = threading.Event()
"""``Gated`` waits for this before its second step (a test holds a sample between two steps)."""
GATE_FILE = "QITOS_TEST_GATE_FILE"  # when set: the file ``Gated`` creates once it waits


class Gated(Prompted):
    """``Prompted`` that, before its second step, waits for ``STEP_GATE`` (blocking its process)."""

    def decide(self, state: StateSchema, observation: Any) -> Any:
        if state.current_step == 1 and not STEP_GATE.is_set():
            marker = os.environ.get(GATE_FILE)
            if marker:
                with open(marker, "w", encoding="utf-8") as handle:
                    handle.write(state.task)
            while not STEP_GATE.is_set():
                time.sleep(0.05)
        return None


LOOKUP_GATE = threading.Event()
"""``SlowPrompted``'s ``lookup`` waits for this (a test holds its samples inside a tool call)."""


@tool(idempotent=True, name="lookup")
async def slow_lookup(word: str) -> str:
    """Look a word up.

    Args:
        word: the word.
    """
    while not LOOKUP_GATE.is_set():
        await asyncio.sleep(0.02)
    return f"{word}:{len(word)}"


class SlowPrompted(Prompted):
    """``Prompted`` whose ``lookup`` waits for ``LOOKUP_GATE`` (the same schema, so the same requests)."""

    tools = (slow_lookup, add)


class Reworded(Prompted):
    prompt = REWORDED


class ToolsChanged(Prompted):
    tools = (lookup, add, count)


class Lowering(Upper):
    def decide(self, state: UpperState, observation: Any) -> Decision[Any]:
        if state.task.startswith("b"):
            return Decision.final(state.task.lower())
        return super().decide(state, observation)
