"""The loop's side of delegation: a tool whose work is another agent's run (a child session).

``qitos.engine._delegation`` builds the tools; this module holds only what the loop needs to tell
such a call apart and hand it to its driver, so the loop does not depend on sessions:

- :class:`SubAgentRunner`: the base of a tool function that runs a sub-agent. Called as a plain
  tool (a run without a durable journal) it runs the sub-agent to its end and returns its answer.
  In a durable session the loop does not call it: it yields a :class:`SubAgentCall` instead, and the
  runner runs (or continues) the child session derived from the parent session and call id.
- :class:`ChildRequest`: what the runner is given (the parent's journal, step, call, budget left).
- :class:`ChildOutcome`: what comes back: the call's result, or a stop the parent must take too
  (the child paused or waits for an approval), and the tokens the child used in this run.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from qitos.core._state import StopReason
from qitos.core._tool import ToolResult
from qitos.engine._effects import AsyncServices, Effect
from qitos.sessions._children import child_session_id

__all__ = [
    "ChildOutcome",
    "ChildRequest",
    "FanoutCall",
    "FanoutRequest",
    "FanoutRunner",
    "SubAgentCall",
    "SubAgentRunner",
    "child_session_id",
]


@dataclass(frozen=True, kw_only=True)
class ChildRequest:
    """One delegated call as the parent's loop sees it.

    ``journal`` is the parent's durable journal (it knows the store and the parent session);
    ``tokens_left`` / ``seconds_left`` are what remains of the parent's budget (None: no limit),
    from which the child's budget is carved.
    """

    journal: Any
    parent_run_id: str
    step_id: int
    call_id: str
    tool: str
    args: Mapping[str, Any]
    tokens_left: int | None
    seconds_left: float | None


@dataclass(frozen=True, kw_only=True)
class ChildOutcome:
    """The end of one child run: a ``result`` for the parent's call, or a ``stop`` the parent takes."""

    child_session_id: str
    result: ToolResult | None = None
    stop: StopReason | None = None
    tokens: int = 0


class SubAgentRunner(ABC):
    """Base of a tool function that delegates to a sub-agent (see the module docstring)."""

    @abstractmethod
    def __call__(self, **args: Any) -> Any:
        """A plain (non-durable) run of the sub-agent; returns its final answer."""

    @abstractmethod
    def child_session(self, store: Any, session_id: str) -> Any:
        """The ``Session`` facade of an existing child (inspection and control go through it)."""

    @abstractmethod
    def run_child(self, request: ChildRequest) -> ChildOutcome:
        """Run or continue the durable child session of ``request`` in this thread."""

    @abstractmethod
    async def arun_child(self, request: ChildRequest) -> ChildOutcome:
        """Async twin of :meth:`run_child` (the child runs through the async driver)."""


class SubAgentCall(Effect):
    """The driver runs a delegated call's child session (``run_child`` / awaited ``arun_child``)."""

    __slots__ = ("request", "runner")

    def __init__(self, runner: SubAgentRunner, request: ChildRequest) -> None:
        self.runner = runner
        self.request = request

    def perform(self) -> ChildOutcome:
        return self.runner.run_child(self.request)

    async def aperform(self, services: AsyncServices) -> ChildOutcome:
        return await self.runner.arun_child(self.request)


@dataclass(frozen=True, kw_only=True)
class FanoutRequest:
    """A branch decision to explore: its candidates, where they come from, and the agent to run them."""

    journal: Any
    step_id: int
    candidates: tuple[Any, ...]
    agent: Any
    model: Any
    state: Any


class FanoutRunner(ABC):
    """Base of a BranchSelector that explores candidates in forked child sessions (``qitos.engine._fanout``)."""

    @abstractmethod
    def select(self, candidates: Any, state: Any) -> Any:
        """The BranchSelector method, for a run without a durable journal."""

    @abstractmethod
    def run_fanout(self, request: FanoutRequest) -> tuple[int, list[str]]:
        """Run each candidate in a forked child; the chosen index and the children's session ids."""

    @abstractmethod
    async def arun_fanout(self, request: FanoutRequest) -> tuple[int, list[str]]:
        """Async twin of :meth:`run_fanout`."""


class FanoutCall(Effect):
    """The driver explores a branch decision's candidates (``run_fanout`` / awaited ``arun_fanout``)."""

    __slots__ = ("request", "runner")

    def __init__(self, runner: FanoutRunner, request: FanoutRequest) -> None:
        self.runner = runner
        self.request = request

    def perform(self) -> tuple[int, list[str]]:
        return self.runner.run_fanout(self.request)

    async def aperform(self, services: AsyncServices) -> tuple[int, list[str]]:
        return await self.runner.arun_fanout(self.request)
