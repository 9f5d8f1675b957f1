"""Parent and child agents for the delegation tests, and a subprocess entry point.

Importable as ``delegate_agents`` (the tests put ``tests`` on ``PYTHONPATH``), so a parent session
created in one process is run, killed and restored in others; the snapshots name their state types
as ``delegate_agents:ParentState`` / ``delegate_agents:ChildState``.

``ChildAgent`` does ``steps`` tool steps, then answers ``answer:<task>``. Step ``i`` calls ``work``
(call id ``w{i}``, **not idempotent**): it writes ``begin work w{i}`` to the side-effect log,
sleeps ``sleep`` seconds, writes ``end work w{i}``. At ``approval_at`` it also calls ``publish``
(call id ``p{i}``), which needs a human's approval. Its reducer appends the step index to
``steps_done``, so a step run twice shows up there.

``ParentAgent`` delegates once (call id ``d0``) to ``helper`` (the child), then answers with the
output it got (or ``failed: <error>``).

``BatchAgent`` makes one decision of three ``concurrency_safe`` calls that run together: ``b0`` and
``b1`` of ``send`` (not idempotent), ``b2`` of ``probe`` (idempotent); each logs begin/end and sleeps
``sleep`` seconds. Then it answers with the outputs it saw.

``python -m delegate_agents run --db DB --session SID --log LOG [--sleep S] [--agent parent|batch]``
runs the session and prints a JSON summary.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.checkpoint.store import CheckpointStore
from qitos.core._agent_module import AgentModule
from qitos.core._decision import Action, Decision, Observation
from qitos.core._state import StateSchema
from qitos.core._tool import ToolRegistry, tool
from qitos.engine._delegation import delegate
from qitos.engine._engine import Engine
from qitos.engine.session_runtime import Session, restore_session
from session_agents import start_module

__all__ = ["BatchAgent", "ChildAgent", "ChildState", "ParentAgent", "ParentState", "main", "parent_engine", "start_cli"]


@dataclass
class ChildState(StateSchema):
    """The child's state: the steps it reduced."""

    steps: int = 5
    steps_done: list[int] = field(default_factory=list)


@dataclass
class ParentState(StateSchema):
    """The parent's state: what its delegated call returned."""

    answers: list[str] = field(default_factory=list)


def _log(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


class WorkTools:
    """The child's tools (each logs begin/end lines to the side-effect log)."""

    def __init__(self, side_log: str, sleep: float) -> None:
        self.side_log = side_log
        self.sleep = sleep

    @tool
    def work(self, call: str) -> str:
        """Do one unit of work (not idempotent).

        Args:
            call: the call id.
        """
        _log(self.side_log, f"begin work {call}")
        if self.sleep:
            time.sleep(self.sleep)
        _log(self.side_log, f"end work {call}")
        return f"worked {call}"

    @tool(needs_approval=True)
    def publish(self, call: str) -> str:
        """Publish (needs approval).

        Args:
            call: the call id.
        """
        _log(self.side_log, f"begin publish {call}")
        _log(self.side_log, f"end publish {call}")
        return f"published {call}"


class BatchTools:
    """Concurrency-safe tools that log begin/end lines."""

    def __init__(self, side_log: str, sleep: float) -> None:
        self.side_log = side_log
        self.sleep = sleep

    def _run(self, name: str, call: str) -> str:
        _log(self.side_log, f"begin {name} {call}")
        time.sleep(self.sleep)
        _log(self.side_log, f"end {name} {call}")
        return f"{name} {call}"

    @tool(concurrency_safe=True)
    def send(self, call: str) -> str:
        """Send (not idempotent; safe to run alongside others).

        Args:
            call: the call id.
        """
        return self._run("send", call)

    @tool(concurrency_safe=True, idempotent=True)
    def probe(self, call: str) -> str:
        """Probe (idempotent; safe to run alongside others).

        Args:
            call: the call id.
        """
        return self._run("probe", call)


class BatchAgent(AgentModule[ParentState, Observation, Action]):
    """One decision of three calls that run together, then an answer listing what came back."""

    def __init__(self, side_log: str = os.devnull, *, sleep: float = 0.0) -> None:
        registry = ToolRegistry()
        registry.include(BatchTools(side_log, sleep))
        super().__init__(tool_registry=registry)

    def init_state(self, task: str, **kwargs: Any) -> ParentState:
        return ParentState(task=task, max_steps=4)

    def decide(self, state: ParentState, observation: Observation) -> Decision[Any]:
        if state.current_step == 0:
            calls = [("send", "b0"), ("send", "b1"), ("probe", "b2")]
            return Decision.act([Action(name=n, args={"call": c}, id=c) for n, c in calls])
        return Decision.final(" | ".join(state.answers))

    def reduce(self, state: ParentState, observation: Observation, decision: Decision[Any]) -> ParentState:
        for result in observation.results:
            state.answers.append(result.output if result.ok else f"{result.call_id} {result.error_kind}")
        return state


class ChildAgent(AgentModule[ChildState, Observation, Action]):
    """``steps`` work steps (publish at ``approval_at``), then ``answer:<task>``."""

    def __init__(
        self, side_log: str = os.devnull, *, sleep: float = 0.0, steps: int = 5, approval_at: int | None = None
    ) -> None:
        registry = ToolRegistry()
        registry.include(WorkTools(side_log, sleep))
        super().__init__(tool_registry=registry)
        self.steps = steps
        self.approval_at = approval_at

    def init_state(self, task: str, **kwargs: Any) -> ChildState:
        return ChildState(task=task, steps=self.steps, max_steps=self.steps + 5)

    def decide(self, state: ChildState, observation: Observation) -> Decision[Any]:
        i = state.current_step
        if i >= state.steps:
            return Decision.final(f"answer:{state.task}")
        actions = [Action(name="work", args={"call": f"w{i}"}, id=f"w{i}")]
        if i == self.approval_at:
            actions.append(Action(name="publish", args={"call": f"p{i}"}, id=f"p{i}"))
        return Decision.act(actions)

    def reduce(self, state: ChildState, observation: Observation, decision: Decision[Any]) -> ChildState:
        if decision.mode == "act":
            state.steps_done.append(state.current_step)
        return state


class ParentAgent(AgentModule[ParentState, Observation, Action]):
    """Delegates ``child_task`` to ``helper`` once, then answers with what came back."""

    def __init__(
        self,
        side_log: str = os.devnull,
        *,
        sleep: float = 0.0,
        child_steps: int = 5,
        child_budget: int | None = None,
        approval_at: int | None = None,
        child_task: str = "sub",
    ) -> None:
        child = functools.partial(ChildAgent, side_log, sleep=sleep, steps=child_steps, approval_at=approval_at)
        registry = ToolRegistry([delegate("helper", child, description="Ask the helper", max_steps=child_budget)])
        super().__init__(tool_registry=registry)
        self.child_task = child_task

    def init_state(self, task: str, **kwargs: Any) -> ParentState:
        return ParentState(task=task, max_steps=5)

    def decide(self, state: ParentState, observation: Observation) -> Decision[Any]:
        if state.current_step == 0:
            return Decision.act([Action(name="helper", args={"task": self.child_task}, id="d0")])
        return Decision.final(state.answers[-1] if state.answers else "no answer")

    def reduce(self, state: ParentState, observation: Observation, decision: Decision[Any]) -> ParentState:
        for result in observation.results:
            state.answers.append(result.output if result.ok else f"failed: {result.error}")
        return state


def parent_engine(store: CheckpointStore, side_log: str = os.devnull, **options: Any) -> Engine[Any, Any, Any]:
    """An Engine for ``ParentAgent(side_log, **options)`` on ``store``."""
    return Engine(ParentAgent(side_log, **options), checkpoint_store=store)


def start_cli(*args: str) -> subprocess.Popen[str]:
    """Start ``python -m delegate_agents ARGS`` in a new process (stdout/stderr piped)."""
    return start_module("delegate_agents", *args)


def main(argv: list[str] | None = None) -> int:
    """The subprocess entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="delegate_agents")
    parser.add_argument("command", choices=["run"])
    parser.add_argument("--db", required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("--log", default=os.devnull)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--agent", choices=["parent", "batch"], default="parent")
    args = parser.parse_args(argv)
    store = SqliteCheckpointStore(args.db)
    if args.agent == "batch":
        engine = Engine(BatchAgent(args.log, sleep=args.sleep), checkpoint_store=store)
    else:
        engine = parent_engine(store, args.log, sleep=args.sleep)
    session: Session = restore_session(engine, args.session)
    result = session.run()
    print(json.dumps({"final_result": result.state.final_result, "stop_reason": result.state.stop_reason}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
