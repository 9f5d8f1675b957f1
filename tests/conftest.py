"""Shared fixtures: a small policy-driven agent used by the engine, trace and API tests.

``policy_agent(policy, tools=..., reduce=...)`` builds a real ``AgentModule`` whose ``decide`` is the
plain function ``policy(state, observation) -> Decision | None`` and whose default ``reduce`` appends
the step's tool outputs (as text) to ``state.log``. Everything runs through the real engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest

from pg_server import pg_dsn  # noqa: F401  (the PostgreSQL server fixture, for every test folder)
from qitos import AgentModule, Decision, StateSchema, ToolRegistry


@dataclass
class LogState(StateSchema):
    """State of the shared test agent: one line per observed tool output."""

    log: list[str] = field(default_factory=list)


Policy = Callable[[LogState, Any], "Decision[Any] | None"]
Reducer = Callable[[LogState, Any, "Decision[Any]"], LogState]


class PolicyAgent(AgentModule[LogState, Any, Any]):
    """An agent whose decide/reduce are plain functions given at construction."""

    def __init__(
        self,
        policy: Policy,
        *,
        tools: Iterable[Any] = (),
        reduce: Reducer | None = None,
        max_steps: int = 10,
        **kwargs: Any,
    ) -> None:
        super().__init__(tool_registry=ToolRegistry(tools), **kwargs)
        self._policy = policy
        self._reduce = reduce
        self._max_steps = max_steps

    def init_state(self, task: str, **kwargs: Any) -> LogState:
        return LogState(task=task, max_steps=int(kwargs.get("state_max_steps", self._max_steps)))

    def decide(self, state: LogState, observation: Any) -> Decision[Any] | None:
        return self._policy(state, observation)

    def reduce(self, state: LogState, observation: Any, decision: Decision[Any]) -> LogState:
        if self._reduce is not None:
            return self._reduce(state, observation, decision)
        for result in getattr(observation, "results", ()):
            state.log.append(result.as_text())
        return state


@pytest.fixture
def policy_agent() -> type[PolicyAgent]:
    """The PolicyAgent class (construct it with a policy function)."""
    return PolicyAgent
