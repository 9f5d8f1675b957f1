"""Budgets (TaskBudget over RuntimeBudget, one step limit) and the preflight of required resources."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import driven
from qitos import Action, Decision, Engine, Task, TaskBudget, TaskResource, tool
from qitos.core._task import EnvSpec, TaskValidationError
from qitos.engine.runtime import RuntimeBudget
from qitos.models._scripted import ScriptedModel

pytestmark = pytest.mark.usefixtures("driver")  # each test runs through both drivers


@tool
def noop() -> str:
    """Do nothing."""
    return "ok"


def act_forever(state: Any, observation: Any) -> Decision[Any]:
    return Decision.act([Action("noop", {})])


def _run(agent: Any, task: Any, budget: RuntimeBudget | None = None, **kwargs: Any) -> Any:
    return driven.run(Engine(agent, budget=budget), task, **kwargs)


# --------------------------------------------------------------------------- step limit


def test_task_budget_max_steps_overrides_the_runtime_budget(policy_agent: Any) -> None:
    task = Task(objective="t", budget=TaskBudget(max_steps=2))
    result = _run(policy_agent(act_forever, tools=[noop], max_steps=50), task, RuntimeBudget(max_steps=7))
    assert result.step_count == 2 and result.state.stop_reason == "max_steps_reached"
    assert result.state.max_steps == 2


def test_runtime_budget_applies_when_the_task_budget_leaves_max_steps_none(policy_agent: Any) -> None:
    task = Task(objective="t", budget=TaskBudget(max_runtime_seconds=60.0))
    result = _run(policy_agent(act_forever, tools=[noop], max_steps=50), task, RuntimeBudget(max_steps=3))
    assert result.step_count == 3 and result.state.stop_reason == "max_steps_reached"
    assert result.state.max_steps == 3


def test_the_state_limit_applies_when_no_budget_sets_one(policy_agent: Any) -> None:
    result = _run(policy_agent(act_forever, tools=[noop], max_steps=4), "t", RuntimeBudget())
    assert result.step_count == 4 and result.state.stop_reason == "max_steps_reached"
    assert result.state.max_steps == 4


def test_the_effective_limit_is_written_back_into_the_state_before_the_first_step(policy_agent: Any) -> None:
    seen: list[int] = []

    def policy(state: Any, observation: Any) -> Decision[Any]:
        seen.append(state.max_steps)
        return Decision.act([Action("noop", {})])

    task = Task(objective="t", budget=TaskBudget(max_steps=3))
    result = _run(policy_agent(policy, tools=[noop], max_steps=50), task, RuntimeBudget(max_steps=20))
    assert seen == [3, 3, 3]
    assert result.state.max_steps == 3


def test_a_task_budget_larger_than_the_state_default_raises_the_state_limit(policy_agent: Any) -> None:
    task = Task(objective="t", budget=TaskBudget(max_steps=12))
    result = _run(policy_agent(act_forever, tools=[noop], max_steps=5), task)
    assert result.step_count == 12 and result.state.max_steps == 12


def test_agent_run_max_steps_is_the_one_limit(policy_agent: Any) -> None:
    result = policy_agent(act_forever, tools=[noop], max_steps=50).run("t", return_state=True, max_steps=3, trace=False)
    assert result.step_count == 3 and result.state.max_steps == 3


def test_init_state_kwargs_reach_init_state(policy_agent: Any) -> None:
    result = policy_agent(act_forever, tools=[noop]).run("t", return_state=True, trace=False, state_max_steps=2)
    assert result.step_count == 2 and result.state.stop_reason == "max_steps_reached"


# --------------------------------------------------------------------------- time and tokens


def test_task_time_budget_overrides_the_runtime_time_budget(policy_agent: Any) -> None:
    def slow(state: Any, observation: Any) -> Decision[Any]:
        time.sleep(0.03)
        return Decision.act([Action("noop", {})])

    task = Task(objective="t", budget=TaskBudget(max_runtime_seconds=0.1))
    started = time.monotonic()
    result = _run(policy_agent(slow, tools=[noop], max_steps=1000), task, RuntimeBudget(max_runtime_seconds=60.0))
    assert result.state.stop_reason == "budget_time"
    assert time.monotonic() - started < 5.0


def test_runtime_time_budget_applies_when_the_task_leaves_it_none(policy_agent: Any) -> None:
    def slow(state: Any, observation: Any) -> Decision[Any]:
        time.sleep(0.03)
        return Decision.act([Action("noop", {})])

    task = Task(objective="t", budget=TaskBudget(max_steps=1000))
    result = _run(policy_agent(slow, tools=[noop], max_steps=1000), task, RuntimeBudget(max_runtime_seconds=0.1))
    assert result.state.stop_reason == "budget_time" and result.step_count < 1000


def test_task_token_budget_overrides_the_runtime_token_budget(policy_agent: Any) -> None:
    call = {"tool_calls": [{"name": "noop", "arguments": {}}], "usage": {"input_tokens": 5, "output_tokens": 5}}
    model = ScriptedModel([call] * 20)
    task = Task(objective="t", budget=TaskBudget(max_tokens=30))
    agent = policy_agent(lambda s, o: None, tools=[noop], llm=model, max_steps=100)
    result = _run(agent, task, RuntimeBudget(max_tokens=1_000_000))
    assert result.state.stop_reason == "budget_tokens"
    assert result.step_count == 3


# --------------------------------------------------------------------------- preflight


def test_present_required_resources_pass_preflight(policy_agent: Any, tmp_path: Path) -> None:
    (tmp_path / "paper.pdf").write_bytes(b"%PDF")
    (tmp_path / "data").mkdir()
    task = Task(
        objective="t",
        resources=[
            TaskResource(kind="file", path="paper.pdf"),
            TaskResource(kind="dir", path="data"),
            TaskResource(kind="url", uri="https://arxiv.org/abs/2501.12345"),
            TaskResource(kind="file", path="missing-but-optional.txt", required=False),
        ],
    )
    result = _run(policy_agent(lambda s, o: Decision.final("ok")), task, workspace=str(tmp_path))
    assert result.state.stop_reason == "final"


def test_an_absolute_resource_path_ignores_the_workspace(policy_agent: Any, tmp_path: Path) -> None:
    target = tmp_path / "abs.txt"
    target.write_text("x")
    task = Task(objective="t", resources=[TaskResource(kind="file", path=str(target))])
    result = _run(policy_agent(lambda s, o: Decision.final("ok")), task, workspace="/nonexistent")
    assert result.state.stop_reason == "final"


@pytest.mark.parametrize(
    ("resource", "named"),
    [
        (TaskResource(kind="file", path="paper.pdf"), "paper.pdf"),
        (TaskResource(kind="dir", path="corpus"), "corpus"),
        (TaskResource(kind="artifact", path="runs/r1/steps.jsonl"), "runs/r1/steps.jsonl"),
        (TaskResource(kind="url", uri="not-a-url"), "not-a-url"),
    ],
)
def test_a_missing_required_resource_stops_before_the_first_step(
    policy_agent: Any, tmp_path: Path, resource: TaskResource, named: str
) -> None:
    decided: list[int] = []

    def policy(state: Any, observation: Any) -> Decision[Any]:
        decided.append(1)
        return Decision.final("no")

    result = _run(policy_agent(policy), Task(objective="t", resources=[resource]), workspace=str(tmp_path))
    assert result.state.stop_reason == "task_validation_failed"
    assert result.step_count == 0 and result.records == [] and decided == []
    assert named in (result.task_result.error or "")
    assert [e.event_type.value for e in result.events] == ["run_start", "error", "run_end"]


def test_every_missing_resource_is_named(policy_agent: Any, tmp_path: Path) -> None:
    task = Task(
        objective="t",
        resources=[TaskResource(kind="file", path="a.txt"), TaskResource(kind="file", path="b.txt")],
    )
    result = _run(policy_agent(lambda s, o: Decision.final("no")), task, workspace=str(tmp_path))
    assert "a.txt" in (result.task_result.error or "") and "b.txt" in (result.task_result.error or "")


def test_a_bad_resource_kind_is_a_clear_error_before_any_run() -> None:
    with pytest.raises(TaskValidationError, match="must be one of file, dir, url, artifact"):
        Task(objective="t", resources=[TaskResource(kind="ftp", path="x")])  # type: ignore[arg-type]


def test_a_task_needing_env_capabilities_fails_preflight_without_an_env(policy_agent: Any) -> None:
    task = Task(objective="t", env_spec=EnvSpec(kind="browser", capabilities=("click",)))
    result = _run(policy_agent(lambda s, o: Decision.final("no")), task)
    assert result.state.stop_reason == "task_validation_failed"
    assert "click" in (result.task_result.error or "")


def test_a_task_needing_missing_env_capabilities_names_them(policy_agent: Any) -> None:
    class Env:
        capabilities = frozenset({"read"})

        def reset(self, task: Any) -> str:
            return "ready"

        def step(self, actions: Any) -> str:
            return "stepped"

        def is_terminal(self) -> bool:
            return False

        def close(self) -> None:
            return None

    task = Task(objective="t", env_spec=EnvSpec(kind="host", capabilities=("read", "write")))
    result = driven.run(Engine(policy_agent(lambda s, o: Decision.final("no")), env=Env()), task)
    assert result.state.stop_reason == "task_validation_failed"
    assert "write" in (result.task_result.error or "") and result.step_count == 0
