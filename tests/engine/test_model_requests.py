"""The model path's requests: tool use and reasoning per request, and what the trace records of
every request (its messages, stored once) and of a request that failed (with its attempts)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from qitos.core._errors import ConfigurationError, ModelError
from qitos.core._tool import tool
from qitos.core.context import ContextRequest
from qitos.core.request_view import ReasoningPolicy, RequestView
from qitos.engine._async_engine import AsyncEngine
from qitos.engine._composition import compose
from qitos.engine._engine import Engine
from qitos.engine._model_path import ModelContext
from qitos.models._function import FunctionModel
from qitos.trace._reader import RunTrace
from qitos.viewer._data import NotFoundError, run_request


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def calling_then_answering(views: list[RequestView]) -> FunctionModel:
    """A model that calls ``add`` on its first turn and answers with the tool result on its second."""

    def reply(view: RequestView) -> Any:
        views.append(view)
        last = view.messages()[-1]
        if last["role"] == "tool":
            return f"The sum is {last['content']}."
        return {"tool_calls": [{"id": f"c{len(views)}", "name": "add", "arguments": {"a": 2, "b": 3}}]}

    return FunctionModel(reply)


# --------------------------------------------------------------------------- tool use and reasoning


def test_required_tool_use_holds_until_a_tool_was_used_then_becomes_auto(policy_agent: Any) -> None:
    views: list[RequestView] = []
    agent = policy_agent(lambda s, o: None, tools=[add, multiply], llm=calling_then_answering(views))
    result = Engine(agent, context=ModelContext(tool_use_policy="required")).run("2 + 3?")

    assert result.state.final_result == "The sum is 5."
    assert [(v.tool_use_policy, v.tool_use_satisfied, v.tool_choice()) for v in views] == [
        ("required", False, "required"),
        ("required", True, "auto"),
    ]


@pytest.mark.parametrize("policy", ["required", "add"])
def test_compose_offers_the_tool_use_policy_for_every_session(policy_agent: Any, policy: str) -> None:
    views: list[RequestView] = []
    model = calling_then_answering(views)
    composition = compose(
        agent=lambda: policy_agent(lambda s, o: None, tools=[add, multiply]), model=model, tool_use_policy=policy
    )
    result = composition.session("2 + 3?").run()
    assert result.state.final_result == "The sum is 5."
    assert [v.tool_choice() for v in views] == [policy, "auto"]  # it held until a tool was used


def test_compose_refuses_a_tool_use_policy_that_is_not_one(policy_agent: Any) -> None:
    with pytest.raises(ConfigurationError, match="tool_use_policy must be auto, required, none"):
        compose(agent=lambda: policy_agent(lambda s, o: None), tool_use_policy="")


def test_a_tool_use_function_decides_per_request(policy_agent: Any) -> None:
    views: list[RequestView] = []
    asked: list[int] = []

    def policy(request: ContextRequest) -> str:
        asked.append(request.step_id)
        return "add" if request.step_id == 0 else "none"

    agent = policy_agent(lambda s, o: None, tools=[add, multiply], llm=calling_then_answering(views))
    Engine(agent, context=ModelContext(tool_use_policy=policy)).run("2 + 3?")

    assert asked == [0, 1]
    assert [v.tool_choice() for v in views] == ["add", "none"]


def test_the_reasoning_policy_of_the_context_reaches_every_request(policy_agent: Any) -> None:
    views: list[RequestView] = []
    agent = policy_agent(lambda s, o: None, tools=[add], llm=calling_then_answering(views))
    Engine(agent, context=ModelContext(reasoning_policy=ReasoningPolicy(effort="high"))).run("2 + 3?")
    assert [v.reasoning_policy.effort for v in views] == ["high", "high"]


# --------------------------------------------------------------------------- what the trace records


def test_the_trace_stores_each_request_message_once_and_the_inspector_reads_them_back(
    policy_agent: Any, tmp_path: Path
) -> None:
    views: list[RequestView] = []
    agent = policy_agent(lambda s, o: None, tools=[add], llm=calling_then_answering(views))
    result = Engine(agent, trace_logdir=str(tmp_path)).run("2 + 3?")
    trace = RunTrace(str(result.run_dir))

    steps = trace.steps()
    assert [s["model"]["message_refs"] for s in steps] == [[[0, 0]], [[0, 2]]]  # the task, then +call +result
    assert len(trace.messages()) == 3
    for step_id, view in enumerate(views):
        inspected = run_request(trace, step_id)
        assert inspected["status"] == "ok" and inspected["attempts"] == []
        assert inspected["messages"] == view.messages()
    assert run_request(trace, 1)["messages"][-1] == {"role": "tool", "tool_call_id": "c1", "content": "5"}


def test_a_failed_request_is_recorded_with_its_messages_and_every_failed_attempt(
    policy_agent: Any, tmp_path: Path
) -> None:
    def unavailable(view: RequestView) -> Any:
        model.emit(
            "model_retry",
            {"attempt": 1, "max_retries": 1, "delay_s": 0.0, "reason": "HTTP 503", "status_code": 503, "error": "busy"},
        )
        raise ModelError("m at http://127.0.0.1/v1: HTTP 400: bad tool schema", status_code=400)

    model = FunctionModel(unavailable)
    agent = policy_agent(lambda s, o: None, tools=[add], llm=model)
    with contextlib.suppress(ModelError):  # whether a failed run raises is not what this test is about
        Engine(agent, trace_logdir=str(tmp_path)).run("2 + 3?")
    [run_dir] = list(tmp_path.iterdir())
    trace = RunTrace(str(run_dir))

    assert trace.steps() == []  # the step never committed
    inspected = run_request(trace, 0)
    assert inspected["status"] == "failed"
    assert [(a["attempt"], a["status_code"], a["final"]) for a in inspected["attempts"]] == [
        (1, 503, False),
        (2, 400, True),
    ]
    assert "bad tool schema" in inspected["attempts"][-1]["error"]
    assert inspected["messages"] == model.requests[0].messages()
    assert inspected["request_view"]["request_id"] == model.requests[0].request_id
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    [failed] = [e for e in events if e["event_type"] == "model_response"]
    assert failed["ok"] is False and failed["payload"]["status_code"] == 400
    [asked] = [e for e in events if e["event_type"] == "model_request"]
    assert asked["payload"]["message_refs"] == failed["payload"]["message_refs"] == [[0, 0]]


def test_a_step_without_a_model_request_is_not_found(policy_agent: Any, tmp_path: Path) -> None:
    from qitos.core._decision import Decision

    result = policy_agent(lambda s, o: Decision.final("no model"), tools=[add]).run(
        "t", return_state=True, trace_logdir=str(tmp_path)
    )
    with pytest.raises(NotFoundError, match="sent no model request"):
        run_request(RunTrace(str(result.run_dir)), 0)


def test_the_async_driver_records_messages_and_a_failed_request_too(policy_agent: Any, tmp_path: Path) -> None:
    def rejected(view: RequestView) -> Any:
        raise ModelError("m: HTTP 422: invalid request", status_code=422)

    model = FunctionModel(rejected)
    agent = policy_agent(lambda s, o: None, tools=[add], llm=model)
    with contextlib.suppress(ModelError):
        asyncio.run(AsyncEngine(agent, trace_logdir=str(tmp_path)).arun("2 + 3?"))
    [run_dir] = list(tmp_path.iterdir())

    inspected = run_request(RunTrace(str(run_dir)), 0)
    assert inspected["status"] == "failed"
    assert [(a["status_code"], a["final"]) for a in inspected["attempts"]] == [(422, True)]
    assert inspected["messages"] == model.requests[0].messages()
