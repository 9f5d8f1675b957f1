"""The canonical loop: phases, branch resolution, tool failures as observations, records, model path."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

import driven
from qitos import Action, AgentModule, Decision, Engine, EngineResult, StateSchema, tool
from qitos.core._errors import ConfigurationError
from qitos.core._state import apply_changes
from qitos.engine._events import StepRecord
from qitos.models._scripted import ScriptedModel

pytestmark = pytest.mark.usefixtures("driver")  # each test runs through both drivers


@tool
def echo(text: str) -> str:
    """Echo the text back."""
    return text


@tool
def explode() -> str:
    """Always fails."""
    raise RuntimeError("kaboom")


_release = threading.Event()


@tool(timeout=0.2)
def sleepy() -> str:
    """Sleeps 2 s (times out at 0.2 s)."""
    _release.wait(2.0)
    return "woke"


@tool(max_output_chars=8)
def chatty() -> str:
    """Says too much."""
    return "0123456789" * 3


def _scripted(decisions: Sequence[Decision[Any]]) -> Any:
    remaining = list(decisions)

    def policy(state: Any, observation: Any) -> Decision[Any]:
        return remaining.pop(0) if remaining else Decision.final("done")

    return policy


def test_a_multi_step_run_returns_the_engine_result(policy_agent: Any) -> None:
    policy = _scripted([Decision.act([Action("echo", {"text": "a"})]), Decision.act([Action("echo", {"text": "b"})])])
    result = driven.run(Engine(policy_agent(policy, tools=[echo])), "t")
    assert isinstance(result, EngineResult)
    assert {f.name for f in dataclasses.fields(result)} >= {"state", "records", "events", "step_count", "task_result"}
    assert result.state.log == ["a", "b"]
    assert result.step_count == 3 == len(result.records)
    assert all(isinstance(r, StepRecord) for r in result.records)
    assert [r.step_id for r in result.records] == [0, 1, 2]
    assert result.task_result is not None and result.task_result.steps == 3
    assert result.state.task == "t"


def test_the_observation_of_one_step_is_given_to_the_next_decide(policy_agent: Any) -> None:
    seen: list[Any] = []

    def policy(state: Any, observation: Any) -> Decision[Any]:
        seen.append(None if observation is None else observation.outputs)
        if state.current_step < 2:
            return Decision.act([Action("echo", {"text": f"s{state.current_step}"})])
        return Decision.final("done")

    driven.run(Engine(policy_agent(policy, tools=[echo])), "t")
    assert seen == [None, ["s0"], ["s1"]]


def test_several_actions_run_in_order_in_one_step(policy_agent: Any) -> None:
    decision: Decision[Action] = Decision.act(
        [Action("echo", {"text": "1"}), Action("echo", {"text": "2"}), Action("echo", {"text": "3"})]
    )
    result = driven.run(Engine(policy_agent(_scripted([decision]), tools=[echo])), "t")
    assert result.state.log == ["1", "2", "3"]


def test_tool_failures_become_observations_and_the_run_continues(policy_agent: Any) -> None:
    _release.clear()  # set by an earlier run of this test (the other driver)
    decisions: list[Decision[Action]] = [
        Decision.act([Action("nope", {})]),
        Decision.act([Action("echo", {})]),
        Decision.act([Action("echo", {"text": "x", "loud": True})]),
        Decision.act([Action("echo", {"text": 5})]),
        Decision.act([Action("explode", {})]),
        Decision.act([Action("sleepy", {})]),
        Decision.act([Action("chatty", {})]),
        Decision.act([Action("echo", {"text": "still running"})]),
    ]
    agent = policy_agent(_scripted(decisions), tools=[echo, explode, sleepy, chatty], max_steps=20)
    started = time.perf_counter()
    result = driven.run(Engine(agent), "t")
    elapsed = time.perf_counter() - started
    _release.set()
    agent.tool_registry.close()
    kinds = [r.observation.results[0].error_kind for r in result.records[:-1]]
    assert kinds == [
        "unknown_tool",
        "invalid_arguments",
        "invalid_arguments",
        "invalid_arguments",
        "tool_error",
        "timeout",
        None,
        None,
    ]
    log = result.state.log
    assert "no tool named 'nope'" in log[0]
    assert "missing required argument 'text'" in log[1]
    assert "unexpected argument 'loud'" in log[2]
    assert "expected string" in log[3]
    assert "RuntimeError: kaboom" in log[4]
    assert "timed out" in log[5]
    assert log[6].startswith("01234567") and "truncated" in log[6]
    assert result.records[6].observation.results[0].truncated is True
    assert log[7] == "still running"
    assert result.state.stop_reason == "final"
    assert elapsed < 2.0  # the 2 s tool did not hold the loop
    assert sum(1 for r in result.records for t in r.observation.results if not t.ok) == 6


def test_branch_resolves_to_the_first_candidate_by_default(policy_agent: Any) -> None:
    branch: Decision[Action] = Decision.branch(
        [Decision.act([Action("echo", {"text": "first"})]), Decision.act([Action("echo", {"text": "second"})])]
    )
    result = driven.run(Engine(policy_agent(_scripted([branch]), tools=[echo])), "t")
    assert result.state.log == ["first"]
    assert result.records[0].decision.mode == "act"
    fanout = [e for e in result.events if e.event_type.value == "fanout"]
    assert fanout[0].payload == {"candidates": 2}


def test_a_custom_branch_selector_chooses(policy_agent: Any) -> None:
    class Last:
        def select(self, candidates: Sequence[Decision[Any]], state: Any) -> Decision[Any]:
            return candidates[-1]

    branch: Decision[Action] = Decision.branch(
        [Decision.act([Action("echo", {"text": "a"})]), Decision.final("picked the last")]
    )
    result = policy_agent(_scripted([branch]), tools=[echo]).run("t", return_state=True, search=Last(), trace=False)
    assert result.state.final_result == "picked the last" and result.state.log == []


def test_wait_takes_no_action(policy_agent: Any) -> None:
    result = driven.run(Engine(policy_agent(_scripted([Decision.wait("later")]), tools=[echo])), "t")
    assert result.records[0].observation.results == ()
    assert result.step_count == 2


def test_reduce_may_return_a_new_state_object(policy_agent: Any) -> None:
    def reduce(state: Any, observation: Any, decision: Any) -> Any:
        return dataclasses.replace(state, log=[*state.log, "new"])

    result = driven.run(
        Engine(policy_agent(_scripted([Decision.act([Action("echo", {"text": "x"})])]), tools=[echo], reduce=reduce)),
        "t",
    )
    assert result.state.log == ["new", "new"]


def test_reduce_returning_another_type_is_a_configuration_error(policy_agent: Any) -> None:
    events: list[Any] = []
    engine = Engine(policy_agent(_scripted([]), reduce=lambda s, o, d: StateSchema()))
    with pytest.raises(ConfigurationError, match="reduce must return a LogState, got StateSchema"):
        driven.run(engine, "t", on_event=events.append)
    assert events[-1].event_type.value == "run_end" and events[-1].payload["stop_reason"] == "unrecoverable_error"


def test_decide_returning_something_else_is_a_configuration_error(policy_agent: Any) -> None:
    with pytest.raises(ConfigurationError, match="must return a Decision or None"):
        driven.run(Engine(policy_agent(lambda s, o: "final answer")), "t")


def test_init_state_returning_something_else_is_a_configuration_error() -> None:
    class Bad(AgentModule[Any, Any, Any]):
        def init_state(self, task: str, **kwargs: Any) -> Any:
            return {"task": task}

        def reduce(self, state: Any, observation: Any, decision: Any) -> Any:
            return state

    with pytest.raises(ConfigurationError, match="init_state must return a StateSchema"):
        driven.run(Engine(Bad()), "t")


def test_engine_needs_an_agent_module() -> None:
    with pytest.raises(ConfigurationError, match="AgentModule"):
        Engine(object())  # type: ignore[arg-type]


def test_no_model_configured_is_a_clear_error(policy_agent: Any) -> None:
    with pytest.raises(ConfigurationError, match="no model is configured"):
        driven.run(Engine(policy_agent(lambda s, o: None)), "t")


def test_step_diffs_replay_to_the_final_state(policy_agent: Any) -> None:
    decisions: list[Decision[Action]] = [Decision.act([Action("echo", {"text": str(i)})]) for i in range(5)]

    def reduce(state: Any, observation: Any, decision: Any) -> Any:
        for output in observation.outputs:
            state.log.append(output)
            state.metrics[f"seen_{output}"] = True
        return state

    result = driven.run(Engine(policy_agent(_scripted(decisions), tools=[echo], reduce=reduce)), "t")
    data: dict[str, Any] = {}
    for record in result.records:
        apply_changes(data, record.state_diff)
    assert data == result.state.to_dict()
    later = result.records[3].state_diff
    assert {"op": "extend", "field": "log", "start": 3, "items": ["3"]} in later
    assert not any(op["op"] == "set" and op["field"] == "log" for op in later)  # a delta, not the whole list


def test_the_model_path_runs_tool_calls_then_takes_text_as_the_final_answer(policy_agent: Any) -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "echo", "arguments": {"text": "from the model"}, "id": "m1"}]},
            "The notes are indexed.",
        ]
    )
    result = driven.run(Engine(policy_agent(lambda s, o: None, tools=[echo], llm=model)), "index the notes")
    assert result.state.log == ["from the model"]
    assert result.state.final_result == "The notes are indexed."
    assert result.records[0].decision.actions[0].id == "m1"
    assert result.records[0].model is not None and result.records[0].model["response"]["tool_calls"]
    assert len(model.requests) == 2


def test_an_unusable_model_reply_becomes_wait_with_feedback_never_a_final_answer(policy_agent: Any) -> None:
    model = ScriptedModel([{"tool_calls": [{"name": "missing_tool", "arguments": {}}]}, "ok, done"])
    result = driven.run(Engine(policy_agent(lambda s, o: None, tools=[echo], llm=model)), "t")
    first = result.records[0].decision
    assert first.mode == "wait" and "missing_tool" in first.meta["feedback"]
    assert result.state.final_result == "ok, done" and result.step_count == 2


def test_repair_feedback_is_sent_once_in_the_next_request(policy_agent: Any) -> None:
    bad = {"tool_calls": [{"id": "b1", "name": "missing_tool", "arguments": {}}, {"id": "b2", "name": "echo"}]}
    model = ScriptedModel([bad, "ok, done"])
    result = driven.run(Engine(policy_agent(lambda s, o: None, tools=[echo], llm=model)), "t")
    feedback = result.records[0].decision.meta["feedback"]
    sent = model.requests[1].messages()
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool"]
    assert sum(feedback in str(m.get("content")) for m in sent) == 1
    assert sent[2]["content"] == f"ERROR (not run): {feedback}"
    assert sent[3]["content"] == "ERROR (not run): see the result of call b1"
    assert result.state.final_result == "ok, done"


def test_repair_feedback_for_a_reply_without_calls_is_the_next_input(policy_agent: Any) -> None:
    model = ScriptedModel([{"text": "", "tool_calls": []}, "ok, done"])
    result = driven.run(Engine(policy_agent(lambda s, o: None, tools=[echo], llm=model)), "t")
    feedback = result.records[0].decision.meta["feedback"]
    sent = model.requests[1].messages()
    assert [m["role"] for m in sent] == ["user", "assistant", "user"] and sent[2]["content"] == feedback
    assert result.state.final_result == "ok, done"


def test_sync_events_are_framed_and_each_step_is_bracketed(policy_agent: Any) -> None:
    policy = _scripted([Decision.act([Action("echo", {"text": "a"})]), Decision.wait()])
    streamed: list[Any] = []
    result = driven.run(Engine(policy_agent(policy, tools=[echo])), "t", on_event=streamed.append)
    types = [e.event_type.value for e in result.events]
    assert [e.event_type.value for e in streamed] == types
    assert types[0] == "run_start" and types[-1] == "run_end"
    assert types.count("run_start") == 1 and types.count("run_end") == 1
    for step in range(result.step_count):
        step_types = [
            e.event_type.value for e in result.events if e.step_id == step and e.event_type.value != "run_start"
        ]
        assert step_types[0] == "step_start" and step_types[-1] == "step_end"
        assert step_types.index("decide") < step_types.index("act") < step_types.index("reduce")
        assert step_types.index("reduce") < step_types.index("check_stop")
    steps_seen = [e.step_id for e in result.events]
    assert steps_seen == sorted(steps_seen)


def test_an_init_state_error_propagates_after_the_stream_ended_with_run_end() -> None:
    class Broken(AgentModule[Any, Any, Any]):
        def init_state(self, task: str, **kwargs: Any) -> Any:
            raise KeyError("missing corpus")

        def reduce(self, state: Any, observation: Any, decision: Any) -> Any:
            return state

    streamed: list[Any] = []
    with pytest.raises(KeyError, match="missing corpus"):
        driven.run(Engine(Broken()), "t", on_event=streamed.append)
    types = [e.event_type.value for e in streamed]
    assert types == ["run_start", "error", "run_end"]
    assert streamed[-1].ok is False and "missing corpus" in (streamed[-1].error or "")
