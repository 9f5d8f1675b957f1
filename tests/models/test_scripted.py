"""ScriptedModel and FunctionModel: real adapters for tests, and the ModelResponse records."""

from __future__ import annotations

import asyncio
import json
import pickle
import threading
from typing import Any

import pytest

from qitos.core._codec import digest
from qitos.core._errors import ConfigurationError, ModelError
from qitos.core._exchange import ExchangeLog
from qitos.core.context import ContextContribution
from qitos.core.request_view import RequestView
from qitos.models._base import ModelAdapter, ModelResponse, ToolCall, Usage, request_digest
from qitos.models._function import FunctionModel
from qitos.models._scripted import ScriptedModel


def view_of(task: str = "task") -> RequestView:
    log = ExchangeLog(log_id="scripted-test")
    log.open([{"role": "user", "content": task}])
    return RequestView.from_exchange_log(log, instructions=[{"role": "system", "content": "sys"}])


def test_scripted_responses_come_back_in_order_in_all_three_shapes() -> None:
    given = ModelResponse(text="third", usage=Usage(input_tokens=5, output_tokens=1), model="custom")
    model = ScriptedModel(
        [
            "plain final answer",
            {"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}], "text": "adding"},
            given,
        ]
    )

    first, second, third = (model.complete(view_of(str(i))) for i in range(3))

    assert (first.text, first.tool_calls, first.finish_reason) == ("plain final answer", (), "stop")
    [call] = second.tool_calls
    assert (call.id, call.name, call.arguments, json.loads(call.raw_arguments)) == (
        "call_1_0",
        "add",
        {"a": 1, "b": 2},
        {"a": 1, "b": 2},
    )
    assert second.text == "adding" and second.finish_reason == "tool_calls"
    assert third is given
    assert [v.messages()[-1]["content"] for v in model.requests] == ["0", "1", "2"]
    assert model.remaining == 0


def test_running_out_of_responses_is_a_clear_model_error() -> None:
    model = ScriptedModel(["only one"])
    model.complete(view_of())
    with pytest.raises(ModelError, match=r"ran out of responses: request #2 but the script has 1"):
        model.complete(view_of())
    assert len(model.requests) == 2


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        (42, "expected str, mapping or ModelResponse"),
        ({"tool_call": []}, "unknown keys"),
        ({}, "needs 'text' or at least one tool call"),
        ({"tool_calls": [{"arguments": {}}]}, "'name' must be a non-empty string"),
        ({"tool_calls": [{"name": "x", "arguments": [1]}]}, "'arguments' must be a mapping"),
        ({"tool_calls": "add"}, "'tool_calls' must be a list"),
        ({"text": 3}, "'text' must be a string"),
    ],
)
def test_a_malformed_script_is_refused_at_construction_naming_the_response(bad: Any, problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem) as info:
        ScriptedModel(["fine", bad])
    assert "#1" in str(info.value)


def test_raw_string_arguments_script_a_malformed_tool_call() -> None:
    model = ScriptedModel([{"tool_calls": [{"name": "add", "arguments": '{"a": 1,'}]}])
    [call] = model.complete(view_of()).tool_calls
    assert call.arguments is None and call.raw_arguments == '{"a": 1,'


def test_on_delta_receives_the_text_in_chunks_that_join_to_the_text() -> None:
    deltas: list[str] = []
    response = ScriptedModel(["The notes are indexed now."]).complete(view_of(), on_delta=deltas.append)
    assert len(deltas) > 1 and "".join(deltas) == response.text


def test_capacity_is_declared_and_validated() -> None:
    model = ScriptedModel([], max_input_units=4096, unit="tokens")
    assert (model.max_input_units, model.unit) == (4096, "tokens")
    assert model.describe() == {
        "adapter": "ScriptedModel",
        "model_id": "scripted",
        "max_input_units": 4096,
        "unit": "tokens",
        "tokenizer": None,
    }
    with pytest.raises(ConfigurationError, match="unit"):
        ScriptedModel([], unit="bytes")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="max_input_units"):
        ScriptedModel([], max_input_units=-5)


def test_function_model_coerces_what_the_function_returns_and_records_views() -> None:
    def policy(view: RequestView) -> Any:
        last = view.messages()[-1]["content"]
        return {"tool_calls": [{"name": "echo", "arguments": {"text": last}}]} if last == "call" else f"echo {last}"

    model = FunctionModel(policy)
    assert model.complete(view_of("call")).tool_calls[0].arguments == {"text": "call"}
    assert model.complete(view_of("hi")).text == "echo hi"
    assert len(model.requests) == 2


def test_function_model_errors_propagate_unchanged() -> None:
    def broken(view: RequestView) -> Any:
        raise ModelError("provider down", status_code=503)

    with pytest.raises(ModelError) as info:
        FunctionModel(broken).complete(view_of())
    assert info.value.status_code == 503


def test_acomplete_default_runs_complete_off_the_event_loop_thread() -> None:
    seen: list[str] = []

    def policy(view: RequestView) -> str:
        seen.append(threading.current_thread().name)
        return "ok"

    response = asyncio.run(FunctionModel(policy).acomplete(view_of()))
    assert response.text == "ok" and seen and seen[0] != threading.main_thread().name


def test_model_response_round_trips_through_json() -> None:
    response = ModelResponse(
        text="t",
        tool_calls=(
            ToolCall(id="a", name="add", arguments={"a": 1}, raw_arguments='{"a": 1}'),
            ToolCall.from_raw(id="b", name="add", raw_arguments="{oops"),
        ),
        usage=Usage(input_tokens=3, output_tokens=4),
        finish_reason="tool_calls",
        model="m",
        raw={"id": "x", "nested": [1, {"k": object()}]},
    )
    data = json.loads(json.dumps(response.to_dict()))
    back = ModelResponse.from_dict(data)
    assert back == response  # raw is not compared
    assert back.tool_calls[1].arguments is None and back.tool_calls[1].raw_arguments == "{oops"
    assert data["raw"]["nested"][1]["k"].startswith("<object object")
    assert back.usage.total_tokens == 7


def test_duplicate_or_empty_tool_call_ids_are_made_unique_everywhere() -> None:
    response = ModelResponse(
        tool_calls=(
            ToolCall(id="", name="a", arguments={}, raw_arguments="{}"),
            ToolCall(id="x", name="b", arguments={}, raw_arguments="{}"),
            ToolCall(id="x", name="c", arguments={}, raw_arguments="{}"),
        )
    )
    ids = [c.id for c in response.tool_calls]
    assert ids == ["call_0", "x", "x_2"]
    assert [c["id"] for c in response.message()["tool_calls"]] == ids


def test_a_listener_added_by_subscribe_hears_events_until_unsubscribed() -> None:
    class Emitting(ModelAdapter):
        model_id = "emitting"

        def complete(self, view: RequestView, *, on_delta: Any = None) -> ModelResponse:
            self.emit("model_retry", {"attempt": 1})
            return ModelResponse(text="ok")

    model = Emitting()
    heard: list[tuple[str, dict[str, Any]]] = []
    unsubscribe = model.subscribe(lambda kind, payload: heard.append((kind, payload)))
    model.complete(view_of())
    unsubscribe()
    model.complete(view_of())
    assert heard == [("model_retry", {"attempt": 1})]
    assert repr(model) == "Emitting(model_id='emitting', max_input_units=None, unit='characters')"


def test_request_digest_depends_on_messages_and_tools_only() -> None:
    a, b = view_of("same"), view_of("same")
    assert request_digest(a) == request_digest(b)
    assert request_digest(a) != request_digest(view_of("different"))


def test_model_errors_and_scripted_errors_pickle() -> None:
    with pytest.raises(ModelError) as info:
        ScriptedModel([]).complete(view_of())
    restored = pickle.loads(pickle.dumps(info.value))
    assert str(restored) == str(info.value)


def test_importing_qitos_models_pulls_in_no_optional_dependency() -> None:
    import subprocess
    import sys

    code = (
        "import sys, qitos.models; "
        "from qitos.models import ScriptedModel, ReplayModel, FunctionModel, ModelAdapter; "
        "print(sorted(m for m in ('httpx', 'cyllama', 'mcp') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    lazy = "from qitos.models import OpenAICompatibleModel; print(OpenAICompatibleModel.__module__)"
    out = subprocess.run([sys.executable, "-c", lazy], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "qitos.models._openai_compat"


def test_adapters_declare_their_request_target() -> None:
    log = ExchangeLog(log_id="target")
    log.open([{"role": "user", "content": "t"}])
    view = RequestView.from_exchange_log(log, model=ScriptedModel(["a"], model_id="script-1"))
    assert (view.target.provider, view.target.model, view.target.transport) == ("scripted", "script-1", "in-process")


def test_request_digest_is_the_digest_of_the_parsed_messages_and_tools() -> None:
    log = ExchangeLog(log_id="digest-test")
    first = log.open([{"role": "user", "content": 'été, 日本語, "quoted" \\ and\nnewline'}])
    log.record_output(
        first.exchange_id,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "name": "add", "arguments": {"b": 2, "a": 1}}],
        },
    )
    log.record_tool_result(first.exchange_id, "c1", {"sum": 3})
    log.close(first.exchange_id)
    log.open([{"role": "user", "content": "next"}])
    view = RequestView.from_exchange_log(
        log,
        instructions=[{"role": "system", "content": "sys"}],
        tool_schemas=[{"name": "add", "description": "Add.", "parameters": {"type": "object", "properties": {}}}],
        context_contributions=[ContextContribution(contribution_id="notes", source="memory", content="remember ü")],
    )
    assert view.context_json and view.tool_schemas_json and len(view.selected_items_json) == 4

    assert request_digest(view) == digest({"messages": view.messages(), "tools": view.tools()})
