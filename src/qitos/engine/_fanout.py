"""Fan-out: a branch decision's candidates explored in forked child sessions, the selector choosing
among their outcomes.

::

    def best(outcomes, state):                      # the CandidateOutcome of each candidate
        return max(range(len(outcomes)), key=lambda i: outcomes[i].state.score)

    Engine(agent, checkpoint_store=store, search=FanoutSelector(best, steps=2)).session(task).run()

When the agent returns ``Decision.branch([...])`` in a durable session, the engine forks one child
session per candidate from the session's head (the boundary before this step), with an operation
id derived from the session, step and candidate index, so a restore finds the same children and
never forks twice. Each child runs the candidate as its decision at this step, then goes on as the
agent would for ``steps`` steps in all (its own budget), and stops. ``choose(outcomes, state)``
returns the index of the candidate to keep; the session then goes on with that candidate as its
decision (its calls run in the session itself: the children are explorations, their side effects
are their own, so fan out candidates whose tools are free of side effects or idempotent). The
``fanout`` event names the children and the choice; the children appear as forks in the lineage.

Without a durable session there is nothing to fork: ``select`` (the plain BranchSelector method)
raises ``ConfigurationError``. Fork from a session with ``durability="sync"`` (a batched session's
head may lag behind the step being explored).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from qitos.core._agent_module import AgentModule
from qitos.core._decision import Decision
from qitos.core._errors import ConfigurationError
from qitos.engine._engine import Engine
from qitos.engine._subagent import FanoutRequest, FanoutRunner
from qitos.engine.runtime import RuntimeBudget
from qitos.engine.session_runtime import restore_session

__all__ = ["CandidateOutcome", "FanoutSelector"]


@dataclass(frozen=True, kw_only=True)
class CandidateOutcome:
    """How one candidate's child session ended."""

    index: int
    session_id: str
    decision: Decision[Any]
    state: Any
    stop_reason: str | None
    final_result: Any


Chooser = Callable[[Sequence[CandidateOutcome], Any], int]


class _Pinned(AgentModule[Any, Any, Any]):
    """The agent, except that at ``step`` its decision is ``decision`` (the candidate explored)."""

    def __init__(self, agent: AgentModule[Any, Any, Any], decision: Decision[Any], step: int) -> None:
        super().__init__(tool_registry=agent.tool_registry, llm=agent.llm, model_parser=agent.model_parser)
        self.inner = agent
        self.decision = decision
        self.step = step

    def init_state(self, task: str, **kwargs: object) -> Any:
        return self.inner.init_state(task, **kwargs)

    def reduce(self, state: object, observation: object, decision: Decision[Any]) -> Any:
        return self.inner.reduce(state, observation, decision)

    def build_system_prompt(self, state: object) -> str | None:
        return self.inner.build_system_prompt(state)

    def prepare(self, state: object) -> str:
        return self.inner.prepare(state)

    def should_stop(self, state: object) -> bool:
        return self.inner.should_stop(state)

    def decide(self, state: Any, observation: Any) -> Decision[Any] | None:
        if state.current_step == self.step:
            return self.decision
        return self.inner.decide(state, observation)


class FanoutSelector(FanoutRunner):
    """A BranchSelector that explores every candidate in a forked child session (see the module docstring).

    Args:
        choose: ``(outcomes, state) -> index`` of the candidate to keep.
        steps: how many steps each child runs, the candidate's included.
    """

    def __init__(self, choose: Chooser, *, steps: int = 1) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ConfigurationError(f"FanoutSelector: steps must be a positive int, got {steps!r}")
        self.choose = choose
        self.steps = steps

    def select(self, candidates: Sequence[Decision[Any]], state: Any) -> Decision[Any]:
        """Refused: fan-out forks sessions, so it needs a durable session (``Session.run``)."""
        raise ConfigurationError("FanoutSelector explores candidates in forked sessions: run a durable session")

    def run_fanout(self, request: FanoutRequest) -> tuple[int, list[str]]:
        """Fork and run each candidate's child in this thread; the chosen index and the children."""
        outcomes = [self._explore(request, i, c) for i, c in enumerate(request.candidates)]
        return self._chosen(outcomes, request), [o.session_id for o in outcomes]

    async def arun_fanout(self, request: FanoutRequest) -> tuple[int, list[str]]:
        """Async twin of :meth:`run_fanout` (the children run one after another on the loop)."""
        outcomes = []
        for i, candidate in enumerate(request.candidates):
            child = await asyncio.to_thread(self._fork, request, i, candidate)
            outcomes.append(self._outcome(i, candidate, child.session_id.value, await child.arun()))
        return self._chosen(outcomes, request), [o.session_id for o in outcomes]

    def _fork(self, request: FanoutRequest, index: int, candidate: Decision[Any]) -> Any:
        store = getattr(request.journal, "store", None)
        parent_id = str(getattr(request.journal, "session_id", ""))
        if store is None or not parent_id:
            raise ConfigurationError("fan-out needs the session's durable journal")
        parent = restore_session(Engine(request.agent, checkpoint_store=store, model=request.model), parent_id)
        forked = parent.fork(operation_id=f"fanout:{parent_id}:{request.step_id}:{index}")
        pinned = _Pinned(request.agent, candidate, request.step_id)
        budget = RuntimeBudget(max_steps=request.step_id + self.steps)
        engine = Engine(pinned, checkpoint_store=store, model=request.model, budget=budget)
        return restore_session(engine, forked.session_id.value)

    def _explore(self, request: FanoutRequest, index: int, candidate: Decision[Any]) -> CandidateOutcome:
        child = self._fork(request, index, candidate)
        return self._outcome(index, candidate, child.session_id.value, child.run())

    def _outcome(self, index: int, candidate: Decision[Any], session_id: str, result: Any) -> CandidateOutcome:
        state = result.state
        return CandidateOutcome(
            index=index,
            session_id=session_id,
            decision=candidate,
            state=state,
            stop_reason=state.stop_reason,
            final_result=state.final_result,
        )

    def _chosen(self, outcomes: list[CandidateOutcome], request: FanoutRequest) -> int:
        index = self.choose(outcomes, request.state)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(outcomes):
            raise ConfigurationError(f"FanoutSelector.choose returned {index!r}, not an index below {len(outcomes)}")
        return index
