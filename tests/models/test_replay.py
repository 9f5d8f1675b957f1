"""ReplayModel: replaying a recorded run gives the same decisions; a diverging run is reported."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from qitos import Engine, tool
from qitos.core._errors import ConfigurationError
from qitos.core._exchange import ExchangeLog
from qitos.core.request_view import RequestView
from qitos.models._scripted import ReplayDivergenceError, ReplayModel, ScriptedModel


@tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


SCRIPT: list[Any] = [
    {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "c1"}], "text": "adding"},
    {"tool_calls": [{"name": "add", "arguments": {"a": 5, "b": 10}, "id": "c2"}]},
    "The total is 15.",
]


def record_run(policy_agent: Any, tmp_path: Path) -> tuple[Any, ScriptedModel]:
    model = ScriptedModel(SCRIPT)
    agent = policy_agent(lambda s, o: None, tools=[add], llm=model)
    return Engine(agent, trace_logdir=str(tmp_path)).run("add 2, 3 and 10"), model


def decisions(result: Any) -> list[dict[str, Any]]:
    return [r.decision.to_dict() for r in result.records]


def test_replaying_a_recorded_run_gives_the_same_decisions_without_the_original_model(
    policy_agent: Any, tmp_path: Path
) -> None:
    recorded, _ = record_run(policy_agent, tmp_path / "first")
    assert recorded.state.final_result == "The total is 15."

    replay = ReplayModel.from_trace(recorded.run_dir)
    assert [e.step for e in replay.entries] == [0, 1, 2]
    assert all(e.request_digest for e in replay.entries)
    again = Engine(policy_agent(lambda s, o: None, tools=[add], llm=replay), trace_logdir=str(tmp_path / "2")).run(
        "add 2, 3 and 10"
    )

    assert decisions(again) == decisions(recorded)
    assert again.state.log == recorded.state.log == ["5", "15"]
    assert again.state.final_result == "The total is 15."
    assert replay.remaining == 0


def test_a_run_that_asks_something_else_is_reported_with_the_step_where_it_diverged(
    policy_agent: Any, tmp_path: Path
) -> None:
    recorded, original = record_run(policy_agent, tmp_path)
    replay = ReplayModel.from_trace(recorded.run_dir)
    assert replay.complete(original.requests[0]).tool_calls[0].id == "c1"  # step 0 asks what was recorded

    log = ExchangeLog(log_id="other")
    log.open([{"role": "user", "content": "something the recording never saw"}])
    with pytest.raises(ReplayDivergenceError) as info:
        replay.complete(RequestView.from_exchange_log(log))
    assert info.value.step == 1 and info.value.index == 1
    assert "diverged at step 1" in str(info.value)
    assert info.value.expected != info.value.actual
    restored = pickle.loads(pickle.dumps(info.value))
    assert (restored.step, restored.expected) == (1, info.value.expected)


def test_more_requests_than_were_recorded_is_a_divergence() -> None:
    replay = ReplayModel(["only answer"])
    log = ExchangeLog(log_id="x")
    log.open([{"role": "user", "content": "t"}])
    view = RequestView.from_exchange_log(log)
    assert replay.complete(view).text == "only answer"
    with pytest.raises(ReplayDivergenceError, match="recording has only 1 model calls") as info:
        replay.complete(view)
    assert info.value.step is None


def test_from_trace_reports_missing_and_broken_traces(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"steps\.jsonl does not exist"):
        ReplayModel.from_trace(tmp_path / "absent")
    run = tmp_path / "run"
    run.mkdir()
    (run / "steps.jsonl").write_text('{"step_id": 0}\n{broken\n')
    with pytest.raises(ConfigurationError, match=r"steps.jsonl:2: not a JSON line"):
        ReplayModel.from_trace(run)
    (run / "steps.jsonl").write_text(json.dumps({"step_id": 0, "model": {"request_id": "r"}}) + "\n")
    with pytest.raises(ConfigurationError, match=r"steps.jsonl:1: a model entry must be an object with a 'response'"):
        ReplayModel.from_trace(run)


def test_from_trace_reads_steps_without_model_entries_and_multi_call_steps(tmp_path: Path) -> None:
    response = {"text": "hi", "tool_calls": [], "usage": {"input_tokens": 1, "output_tokens": 1}, "model": "m"}
    lines = [
        {"step_id": 0, "decision": {"mode": "wait"}},
        {"step_id": 1, "models": [{"response": response}, {"response": {**response, "text": "again"}}]},
    ]
    (tmp_path / "steps.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    replay = ReplayModel.from_trace(tmp_path, max_input_units=1000)
    assert [(e.step, e.response.text) for e in replay.entries] == [(1, "hi"), (1, "again")]
    assert replay.max_input_units == 1000 and replay.model_id == f"replay:{tmp_path.name}"
