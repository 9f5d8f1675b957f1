"""Delegation: an agent hands a task to another agent as a tool call, and the sub-agent's run is a
durable child session of its own.

::

    researcher = delegate("research", ResearchAgent, description="Research a question", max_steps=8)
    registry.register(researcher)            # the parent's agent may now call research(task=...)

The parent's model (or ``decide``) calls the tool like any other, with one argument ``task``. In a
plain run the sub-agent simply runs to its end and its final answer is the call's output. In a
durable session (``Session.run`` / ``arun``) the loop runs the call as a child session:

- the child's session id is derived from the parent session and the call id
  (``qitos.engine._subagent.child_session_id``): a restore of the parent finds the same child and
  continues it where it stopped, never from scratch and never a second one. The child's metadata
  links it to the parent's session, step, call and run (``parent_session_id``, ``delegated_from``);
- the child has its own snapshots, lease and budget: ``max_steps`` of its own, and the tokens and
  seconds left in the parent's budget (a child cannot spend more than its parent has left); the
  tokens it used count towards the parent's when its result is recorded;
- its final answer returns as the call's output; a child that stops without one (a budget, an
  error) returns a failed result (``tool_error``) saying why. A child that pauses or waits for an
  approval stops the parent too, whose step stays pending on the call; the next run of the parent
  continues the child. ``Session.pause()``, ``steer()`` and ``approve()`` of the parent reach an
  active child (see ``Session``), and ``inspect().tool_batch`` lists the child's pending approvals;
- ``delegate`` events (``started``/``resumed``, then ``completed``/``failed`` or the stop) carry
  both session ids.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from qitos.checkpoint.store import CheckpointStore
from qitos.core._agent_module import AgentModule
from qitos.core._errors import ConfigurationError, UsageError
from qitos.core._state import StopReason
from qitos.core._tool import ToolResult, ToolSpec
from qitos.engine._engine import Engine
from qitos.engine._events import EngineResult
from qitos.engine._subagent import ChildOutcome, ChildRequest, SubAgentRunner, child_session_id
from qitos.engine.runtime import RuntimeBudget
from qitos.engine.session_runtime import Session, anew_session, new_session, restore_session

__all__ = ["Delegation", "delegate"]

AgentFactory = Callable[[], AgentModule[Any, Any, Any]]

_PASS_UP = frozenset({StopReason.PAUSED, StopReason.AWAITING_APPROVAL})


class Delegation(SubAgentRunner):
    """A sub-agent the parent may call as a tool (build one with :func:`delegate`).

    Args:
        name: the tool's name.
        agent: the sub-agent's AgentModule class or a zero-argument factory (a fresh agent per run),
            or a ready AgentModule instance (which then serves every run: one that keeps no run state
            between its hooks, as ``qitos.Agent``).
        description: what the tool is for, as the parent's model reads it.
        max_steps: the child's own step budget (None: the child state's ``max_steps``).
        engine_kwargs: further ``Engine`` arguments for the child (``model``, ``hooks``, ...).
    """

    def __init__(
        self,
        name: str,
        agent: AgentFactory | AgentModule[Any, Any, Any],
        *,
        description: str | None = None,
        max_steps: int | None = None,
        engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if isinstance(agent, AgentModule):
            instance = agent
            agent = lambda: instance  # noqa: E731
        if not callable(agent):
            raise ConfigurationError(f"delegate {name!r}: agent must be an AgentModule class, factory or instance")
        if max_steps is not None and (isinstance(max_steps, bool) or max_steps < 1):
            raise ConfigurationError(f"delegate {name!r}: max_steps must be a positive int, got {max_steps!r}")
        reserved = {"budget", "checkpoint_store"} & set(engine_kwargs or {})
        if reserved:
            raise ConfigurationError(f"delegate {name!r}: {sorted(reserved)} are set by the delegation itself")
        self.name = name
        self.agent: AgentFactory = agent
        self.description = description or f"Delegate a task to the {name} agent; returns its final answer."
        self.max_steps = max_steps
        self.engine_kwargs = dict(engine_kwargs or {})

    def spec(self) -> ToolSpec:
        """The tool the parent registers: one string argument ``task``."""
        return ToolSpec(
            name=self.name,
            description=self.description,
            parameters={
                "type": "object",
                "properties": {"task": {"type": "string", "description": "the task for the sub-agent"}},
                "required": ["task"],
                "additionalProperties": False,
            },
            func=self,
        )

    # ---- plain runs

    def __call__(self, **args: Any) -> Any:
        """Run the sub-agent to its end without a store (the parent's run is not durable)."""
        result = self.engine(RuntimeBudget(max_steps=self.max_steps)).run(str(args["task"]))
        outcome = _result_of(self.name, "", result)
        if not outcome.ok:
            raise UsageError(outcome.error or "the sub-agent failed")
        return outcome.output

    # ---- durable child sessions

    def engine(self, budget: RuntimeBudget, store: CheckpointStore | None = None) -> Engine[Any, Any, Any]:
        """A fresh Engine for the sub-agent with ``budget`` (on ``store`` for a child session)."""
        agent = self.agent()
        if not isinstance(agent, AgentModule):
            raise ConfigurationError(f"delegate {self.name!r}: the factory returned {type(agent).__name__}")
        return Engine(agent, budget=budget, checkpoint_store=store, **self.engine_kwargs)

    def child_session(self, store: CheckpointStore, session_id: str) -> Session:
        """The child session ``session_id`` (for inspection and control; budget from the child's own)."""
        return restore_session(self.engine(RuntimeBudget(max_steps=self.max_steps), store), session_id)

    def run_child(self, request: ChildRequest) -> ChildOutcome:
        """Create the child session (or find it again) and run it to a stop in this thread."""
        session = self._open(request)
        if session is None:
            session = new_session(self._engine_for(request), self._task(request), **self._link(request))
        return self._outcome(request, session, session.run())

    async def arun_child(self, request: ChildRequest) -> ChildOutcome:
        """Async twin of :meth:`run_child` (the child runs through the async driver)."""
        session = await asyncio.to_thread(self._open, request)
        if session is None:
            session = await anew_session(self._engine_for(request), self._task(request), **self._link(request))
        return self._outcome(request, session, await session.arun())

    def _store(self, request: ChildRequest) -> CheckpointStore:
        store = getattr(request.journal, "store", None)
        if store is None:
            raise ConfigurationError(f"delegate {self.name!r}: a child session needs the parent's durable journal")
        return store  # type: ignore[no-any-return]

    def _engine_for(self, request: ChildRequest) -> Engine[Any, Any, Any]:
        budget = RuntimeBudget(
            max_steps=self.max_steps,
            max_tokens=request.tokens_left,
            max_runtime_seconds=request.seconds_left,
        )
        return self.engine(budget, self._store(request))

    def _open(self, request: ChildRequest) -> Session | None:
        """The existing child session of this call, restored with a fresh budget carve, or None."""
        store = self._store(request)
        child_id = self._child_id(request)
        if store.get_session_head(child_id) is None:
            return None
        return restore_session(self._engine_for(request), child_id)

    def _child_id(self, request: ChildRequest) -> str:
        return child_session_id(str(request.journal.session_id), request.call_id)

    def _task(self, request: ChildRequest) -> str:
        task = request.args.get("task")
        if not isinstance(task, str) or not task.strip():
            raise UsageError(f"delegate {self.name!r}: the call needs a non-empty 'task' string")
        return task

    def _link(self, request: ChildRequest) -> dict[str, Any]:
        parent = str(request.journal.session_id)
        return {
            "session_id": self._child_id(request),
            "metadata": {
                "parent_session_id": parent,
                "delegated_from": {
                    "session_id": parent,
                    "step_id": request.step_id,
                    "call_id": request.call_id,
                    "run_id": request.parent_run_id,
                    "tool": request.tool,
                },
            },
        }

    def _outcome(self, request: ChildRequest, session: Session, result: EngineResult[Any]) -> ChildOutcome:
        child_id = session.session_id.value
        reason = StopReason(result.state.stop_reason) if result.state.stop_reason else StopReason.UNRECOVERABLE_ERROR
        if reason in _PASS_UP:
            return ChildOutcome(child_session_id=child_id, stop=reason)
        usage = result.task_result.token_usage if result.task_result is not None else {}
        tokens = int(usage.get("total_tokens") or 0)
        return ChildOutcome(
            child_session_id=child_id, result=_result_of(self.name, request.call_id, result), tokens=tokens
        )


def _result_of(name: str, call_id: str, result: EngineResult[Any]) -> ToolResult:
    """The parent's view of a finished child run: its answer, or why it has none."""
    task_result = result.task_result
    if task_result is not None and task_result.status == "completed":
        return ToolResult(call_id=call_id, name=name, ok=True, output=result.state.final_result)
    why = (task_result.stop_reason if task_result is not None else None) or result.state.stop_reason or "unknown"
    error = task_result.error if task_result is not None else None
    detail = f": {error}" if error else ""
    return ToolResult(
        call_id=call_id,
        name=name,
        ok=False,
        error_kind="tool_error",
        error=f"the sub-agent stopped without an answer ({why}){detail}",
    )


def delegate(
    name: str,
    agent: AgentFactory | AgentModule[Any, Any, Any],
    *,
    description: str | None = None,
    max_steps: int | None = None,
    engine_kwargs: dict[str, Any] | None = None,
) -> ToolSpec:
    """A tool (ToolSpec) that delegates a task to ``agent``; register it in the parent's ToolRegistry.

    See :class:`Delegation` for the arguments and the module docstring for what a call does.
    """
    return Delegation(name, agent, description=description, max_steps=max_steps, engine_kwargs=engine_kwargs).spec()
