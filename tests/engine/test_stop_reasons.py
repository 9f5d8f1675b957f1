"""Every StopReason the kernel can produce is reached through a real run."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import driven
from qitos import Action, Decision, Engine, StopReason, Task, TaskBudget, TaskResource, tool
from qitos.core._task import EnvSpec
from qitos.engine._hooks import EngineHook, HookContext
from qitos.engine._policies import CriticVerdict
from qitos.engine.runtime import LifecyclePolicy, RuntimeBudget, RuntimeSnapshotContext
from qitos.models._scripted import ScriptedModel

pytestmark = pytest.mark.usefixtures("driver")  # each test runs through both drivers


@tool
def noop() -> str:
    """Do nothing."""
    return "ok"


deleted: list[str] = []


@tool(needs_approval=True)
def delete(path: str) -> str:
    """Delete a file (needs a human's approval)."""
    deleted.append(path)
    return f"deleted {path}"


def act_forever(state: Any, observation: Any) -> Decision[Any]:
    return Decision.act([Action("noop", {})])


def _events(result: Any) -> list[str]:
    return [e.event_type.value for e in result.events]


def _assert_stopped(result: Any, reason: StopReason, status: str) -> None:
    assert result.state.stop_reason == reason.value
    assert result.task_result.stop_reason == reason.value
    assert result.task_result.status == status
    end = result.events[-1]
    assert end.event_type.value == "run_end"
    assert end.payload["stop_reason"] == reason.value and end.payload["status"] == status
    assert _events(result).count("run_start") == 1 and _events(result).count("run_end") == 1


def test_final(policy_agent: Any) -> None:
    def policy(state: Any, observation: Any) -> Decision[Any]:
        return Decision.final("42") if state.current_step == 1 else Decision.act([Action("noop", {})])

    result = driven.run(Engine(policy_agent(policy, tools=[noop])), "answer")
    _assert_stopped(result, StopReason.FINAL, "completed")
    assert result.state.final_result == "42" and result.step_count == 2


def test_final_result_set_in_reduce_stops_with_final(policy_agent: Any) -> None:
    def reduce(state: Any, observation: Any, decision: Any) -> Any:
        state.final_result = "The answer is 42."
        return state

    result = driven.run(Engine(policy_agent(act_forever, tools=[noop], reduce=reduce)), "t")
    _assert_stopped(result, StopReason.FINAL, "completed")
    assert result.step_count == 1


def test_max_steps_reached_uses_the_state_limit(policy_agent: Any) -> None:
    result = driven.run(Engine(policy_agent(act_forever, tools=[noop], max_steps=3)), "t")
    _assert_stopped(result, StopReason.MAX_STEPS_REACHED, "stopped")
    assert result.step_count == 3 and len(result.records) == 3


def test_a_step_limit_from_a_budget_stops_with_the_same_one_name(policy_agent: Any) -> None:
    result = driven.run(Engine(policy_agent(act_forever, tools=[noop]), budget=RuntimeBudget(max_steps=2)), "t")
    _assert_stopped(result, StopReason.MAX_STEPS_REACHED, "stopped")
    assert result.state.stop_reason == "max_steps_reached" and result.step_count == 2
    task = Task(objective="t", budget=TaskBudget(max_steps=1))
    by_task = driven.run(Engine(policy_agent(act_forever, tools=[noop])), task)
    _assert_stopped(by_task, StopReason.MAX_STEPS_REACHED, "stopped")


def test_budget_time(policy_agent: Any) -> None:
    def slow_policy(state: Any, observation: Any) -> Decision[Any]:
        time.sleep(0.05)
        return Decision.act([Action("noop", {})])

    engine = Engine(
        policy_agent(slow_policy, tools=[noop], max_steps=1000), budget=RuntimeBudget(max_runtime_seconds=0.2)
    )
    started = time.monotonic()
    result = driven.run(engine, "t")
    assert time.monotonic() - started < 2.0
    _assert_stopped(result, StopReason.BUDGET_TIME, "stopped")
    assert 1 <= result.step_count < 1000


def test_budget_tokens_counts_model_usage(policy_agent: Any) -> None:
    call = {"tool_calls": [{"name": "noop", "arguments": {}}], "usage": {"input_tokens": 60, "output_tokens": 10}}
    model = ScriptedModel([call] * 5)
    engine = Engine(policy_agent(lambda s, o: None, tools=[noop], llm=model), budget=RuntimeBudget(max_tokens=100))
    result = driven.run(engine, "t")
    _assert_stopped(result, StopReason.BUDGET_TOKENS, "stopped")
    assert result.step_count == 2  # 70 tokens < 100 after one step, 140 >= 100 after two
    assert result.task_result.token_usage["total_tokens"] == 140
    assert model.remaining == 3


def test_agent_stop(policy_agent: Any) -> None:
    class Stopper(policy_agent):  # type: ignore[misc]
        def should_stop(self, state: Any) -> bool:
            return len(state.log) >= 2

    result = driven.run(Engine(Stopper(act_forever, tools=[noop])), "t")
    _assert_stopped(result, StopReason.AGENT_STOP, "completed")
    assert result.step_count == 2


def test_set_stop_in_reduce_seed_example(policy_agent: Any) -> None:
    def reduce(state: Any, observation: Any, decision: Any) -> Any:
        if state.current_step == 1:
            state.set_stop(StopReason.MAX_STEPS_REACHED, final_result="Done.")
        return state

    result = driven.run(Engine(policy_agent(act_forever, tools=[noop], reduce=reduce)), "t")
    assert result.state.stop_reason == "max_steps_reached" and result.state.final_result == "Done."
    assert result.step_count == 2


def test_critic_stop(policy_agent: Any) -> None:
    class Enough:
        def evaluate(self, state: Any, decision: Any, observation: Any) -> CriticVerdict:
            return CriticVerdict("stop", "enough") if state.current_step >= 1 else CriticVerdict()

    result = driven.run(Engine(policy_agent(act_forever, tools=[noop]), critics=[Enough()]), "t")
    _assert_stopped(result, StopReason.CRITIC_STOP, "stopped")
    assert result.step_count == 2


class CountdownEnv:
    """A tiny real environment: terminal after ``steps`` calls to ``step``."""

    capabilities = frozenset({"countdown"})

    def __init__(self, steps: int) -> None:
        self.left = steps
        self.seen: list[list[str]] = []
        self.reset_with: Task | None = None

    def reset(self, task: Task) -> Any:
        self.reset_with = task
        return f"start {self.left}"

    def step(self, actions: Sequence[Any]) -> Any:
        self.seen.append([a.name for a in actions])
        self.left -= 1
        return f"left {self.left}"

    def is_terminal(self) -> bool:
        return self.left <= 0

    def close(self) -> None:
        self.left = 0


def test_env_terminal(policy_agent: Any) -> None:
    seen: list[Any] = []

    def policy(state: Any, observation: Any) -> Decision[Any]:
        seen.append(observation.env)
        return Decision.act([Action("tick", {})])

    env = CountdownEnv(3)
    task = Task(objective="count", env_spec=EnvSpec(kind="countdown", capabilities=("countdown",)))
    result = driven.run(Engine(policy_agent(policy), env=env), task)
    _assert_stopped(result, StopReason.ENV_TERMINAL, "completed")
    assert result.step_count == 3 and env.seen == [["tick"]] * 3
    assert env.reset_with is task
    assert seen == ["start 3", "left 2", "left 1"]


def test_paused_by_a_lifecycle_policy(policy_agent: Any) -> None:
    contexts: list[RuntimeSnapshotContext] = []

    class PauseAtTwo(LifecyclePolicy):
        policy_id = "test.pause-at-two/v1"

        def should_pause(self, context: RuntimeSnapshotContext) -> bool:
            contexts.append(context)
            return context.phase == "boundary" and context.step_id == 2

    result = driven.run(Engine(policy_agent(act_forever, tools=[noop]), lifecycle=PauseAtTwo()), "t")
    _assert_stopped(result, StopReason.PAUSED, "stopped")
    assert result.step_count == 2
    assert {c.phase for c in contexts} == {"boundary", "act"}
    assert any(c.pending_tool_call is not None and c.pending_tool_call.name == "noop" for c in contexts)
    pause = [e for e in result.events if e.event_type.value == "pause"]
    assert pause and pause[0].payload["by"] == "test.pause-at-two/v1"


def test_awaiting_approval(policy_agent: Any) -> None:
    agent = policy_agent(lambda s, o: Decision.act([Action("delete", {"path": "notes.txt"}, "call-1")]), tools=[delete])
    result = driven.run(Engine(agent), "t")
    _assert_stopped(result, StopReason.AWAITING_APPROVAL, "stopped")
    assert result.step_count == 0
    approval = [e for e in result.events if e.event_type.value == "approval"]
    assert approval[0].payload == {
        "call_id": "call-1",
        "tool": "delete",
        "args": {"path": "notes.txt"},
        "status": "pending",
    }
    assert deleted == []  # the tool did not run


def test_cancelled_after_the_step(policy_agent: Any) -> None:
    class CancelAfterFirst(EngineHook):
        engine: Engine[Any, Any, Any]

        def on_step_end(self, ctx: HookContext) -> None:
            self.engine.cancel()

    hook = CancelAfterFirst()
    engine = Engine(policy_agent(act_forever, tools=[noop]), hooks=[hook])
    hook.engine = engine
    result = driven.run(engine, "t")
    _assert_stopped(result, StopReason.CANCELLED, "stopped")
    assert result.step_count == 1 and len(result.records) == 1


def test_cancelled_immediate_from_another_thread(policy_agent: Any) -> None:
    started = threading.Event()
    release = threading.Event()

    @tool
    def block() -> str:
        """Wait until released."""
        started.set()
        release.wait(5)
        return "released"

    engine = Engine(policy_agent(lambda s, o: Decision.act([Action("block", {})]), tools=[block]))

    def canceller() -> None:
        started.wait(5)
        engine.cancel(immediate=True)
        release.set()

    thread = threading.Thread(target=canceller)
    thread.start()
    result = driven.run(engine, "t")
    thread.join()
    _assert_stopped(result, StopReason.CANCELLED_IMMEDIATE, "stopped")
    assert result.step_count == 0 and result.records == []  # the step was not committed


def test_task_validation_failed_names_the_missing_resource(policy_agent: Any, tmp_path: Path) -> None:
    calls: list[int] = []

    def policy(state: Any, observation: Any) -> Decision[Any]:
        calls.append(1)
        return Decision.final("never")

    task = Task(objective="read", resources=[TaskResource(kind="file", path="paper.pdf", required=True)])
    result = driven.run(Engine(policy_agent(policy)), task, workspace=str(tmp_path))
    _assert_stopped(result, StopReason.TASK_VALIDATION_FAILED, "failed")
    assert result.step_count == 0 and calls == []
    assert "paper.pdf" in (result.task_result.error or "")
    assert "paper.pdf" in (result.events[-1].error or "")


def test_unrecoverable_error_when_reduce_raises(policy_agent: Any) -> None:
    def reduce(state: Any, observation: Any, decision: Any) -> Any:
        raise RuntimeError("reduce exploded")

    result = driven.run(Engine(policy_agent(act_forever, tools=[noop], reduce=reduce)), "t")
    _assert_stopped(result, StopReason.UNRECOVERABLE_ERROR, "failed")
    assert "reduce exploded" in (result.task_result.error or "")
    errors = [e for e in result.events if e.event_type.value == "error"]
    assert errors and "RuntimeError: reduce exploded" in (errors[0].error or "")
    assert "Traceback" in errors[0].payload["traceback"]


def test_context_budget_exceeded_with_a_tiny_declared_capacity(policy_agent: Any) -> None:
    model = ScriptedModel(["never sent"], max_input_units=5)
    result = driven.run(Engine(policy_agent(lambda s, o: None, llm=model)), "a task longer than five characters")
    _assert_stopped(result, StopReason.CONTEXT_BUDGET_EXCEEDED, "failed")
    assert result.step_count == 0
    assert "ContextBudgetExceededError" in (result.task_result.error or "")
    assert model.remaining == 1 and model.requests == []  # nothing was sent
