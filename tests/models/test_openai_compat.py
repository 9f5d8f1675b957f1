"""OpenAICompatibleModel against a real chat-completions server on 127.0.0.1 (plain and SSE)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pickle
import warnings
from typing import Any

import httpx
import pytest
from loopback_chat_server import (
    LoopbackChatServer,
    Reply,
    completion,
    delta_chunk,
    json_reply,
    sse_reply,
    unused_port,
    usage_chunk,
)

import qitos.models._base as model_base
from qitos.core._codec import canonical_json
from qitos.core._errors import ConfigurationError, ContextError, ModelError
from qitos.core._exchange import ExchangeLog
from qitos.core._output import OutputSpec
from qitos.core._state import StopReason
from qitos.core._tool import tool
from qitos.core.context import TokenCounter
from qitos.core.request_view import ReasoningPolicy, RequestView
from qitos.engine._engine import Engine
from qitos.engine.runtime import RuntimeBudget
from qitos.kit._agent import Agent
from qitos.kit.parsers._base import ParseError
from qitos.kit.parsers._native import decision_from_tool_calls
from qitos.models._base import ModelRequestsDisabledError, Usage
from qitos.models._openai_compat import MissingAPIKeyWarning, OpenAICompatibleModel, to_openai_messages

ADD_TOOL = {
    "name": "add",
    "description": "Add two integers.",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}
MUL_TOOL = {**ADD_TOOL, "name": "multiply", "description": "Multiply two integers."}
KEY = "sk-test-SECRET-0123456789abcdef"


def view_of(
    *turns: dict[str, Any], tools: list[dict[str, Any]] | None = None, tool_use_policy: str = "auto"
) -> RequestView:
    """A RequestView: a system instruction, the task, then optional closed turns (assistant + tools)."""
    log = ExchangeLog(log_id="test-log")
    ex = log.open([{"role": "user", "content": "What is 2 + 3?"}])
    for turn in turns:
        log.record_output(ex.exchange_id, turn["assistant"])
        for call_id, result in turn.get("results", {}).items():
            log.record_tool_result(ex.exchange_id, call_id, result)
        log.close(ex.exchange_id)
        ex = log.open(turn.get("next_inputs", []))
    return RequestView.from_exchange_log(
        log,
        instructions=[{"role": "system", "content": "You are terse."}],
        tool_schemas=tools or [],
        tool_use_policy=tool_use_policy,
    )


@pytest.fixture
def server() -> Any:
    with LoopbackChatServer() as srv:
        yield srv


def model_for(server: LoopbackChatServer, **options: Any) -> OpenAICompatibleModel:
    options.setdefault("backoff_base", 0.001)
    options.setdefault("backoff_max", 0.01)
    return OpenAICompatibleModel("loopback-model", base_url=server.url, api_key=KEY, **options)


# --------------------------------------------------------------------------- plain requests


def test_plain_completion_sends_chat_messages_and_reads_text_usage_and_finish_reason(
    server: LoopbackChatServer,
) -> None:
    server.push(json_reply(completion("5", usage=(21, 2))))
    model = model_for(server, temperature=0.0, max_tokens=64, max_input_units=8000)

    response = model.complete(view_of())

    assert response.text == "5"
    assert response.tool_calls == ()
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (21, 2, 23)
    assert response.finish_reason == "stop"
    assert response.model == "loopback-model"
    assert response.raw["id"] == "chatcmpl-1"
    [request] = server.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["Authorization"] == f"Bearer {KEY}"
    assert request.body == {
        "model": "loopback-model",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 2 + 3?"},
        ],
        "temperature": 0.0,
        "max_tokens": 64,
    }
    assert (model.max_input_units, model.unit) == (8000, "tokens")


def test_tool_call_round_trip_keeps_calls_and_results_paired(server: LoopbackChatServer) -> None:
    server.push(
        json_reply(completion(tool_calls=[{"id": "call_9", "name": "add", "arguments": '{"a": 2, "b": 3}'}])),
        json_reply(completion("The sum is 5.")),
    )
    model = model_for(server)

    first = model.complete(view_of(tools=[ADD_TOOL]))
    decision = decision_from_tool_calls(first, tool_names=["add"])
    assert decision.mode == "act"
    [action] = decision.actions
    assert (action.id, action.name, dict(action.args)) == ("call_9", "add", {"a": 2, "b": 3})

    turn = {"assistant": first.message(), "results": {"call_9": "5"}}
    second = model.complete(view_of(turn, tools=[ADD_TOOL]))
    assert decision_from_tool_calls(second).final_answer == "The sum is 5."

    sent = server.requests[1].body
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {"name": "add", "description": "Add two integers.", "parameters": ADD_TOOL["parameters"]},
        }
    ]
    assert sent["tool_choice"] == "auto"
    assistant, tool_msg = sent["messages"][2], sent["messages"][3]
    assert assistant["role"] == "assistant" and assistant["content"] == ""
    [call] = assistant["tool_calls"]
    assert call["id"] == "call_9" and call["type"] == "function" and call["function"]["name"] == "add"
    assert json.loads(call["function"]["arguments"]) == {"a": 2, "b": 3}
    assert tool_msg == {"role": "tool", "tool_call_id": "call_9", "content": "5"}


def test_required_tool_use_policy_is_sent_as_tool_choice(server: LoopbackChatServer) -> None:
    server.push(json_reply(completion(tool_calls=[{"id": "c", "name": "add", "arguments": '{"a":1,"b":1}'}])))
    model_for(server).complete(view_of(tools=[ADD_TOOL, MUL_TOOL], tool_use_policy="required"))
    assert server.requests[0].body["tool_choice"] == "required"


def test_required_with_a_single_tool_is_sent_as_that_named_tool(server: LoopbackChatServer) -> None:
    server.push(json_reply(completion(tool_calls=[{"id": "c", "name": "add", "arguments": '{"a":1,"b":1}'}])))
    model_for(server).complete(view_of(tools=[ADD_TOOL], tool_use_policy="required"))
    assert server.requests[0].body["tool_choice"] == {"type": "function", "function": {"name": "add"}}


def test_wrong_tool_name_and_malformed_arguments_are_kept_and_reported(server: LoopbackChatServer) -> None:
    server.push(
        json_reply(
            completion(
                tool_calls=[
                    {"id": "c1", "name": "subtract", "arguments": '{"a": 1}'},
                    {"id": "c2", "name": "add", "arguments": '{"a": 1, "b": '},
                ]
            )
        )
    )
    response = model_for(server).complete(view_of(tools=[ADD_TOOL]))

    wrong, malformed = response.tool_calls
    assert wrong.name == "subtract" and wrong.arguments == {"a": 1}
    assert malformed.arguments is None and malformed.raw_arguments == '{"a": 1, "b": '
    with pytest.raises(ParseError) as info:
        decision_from_tool_calls(response, tool_names=["add"])
    assert "no tool named 'subtract'" in info.value.feedback
    assert "available: add" in info.value.feedback
    assert "not a JSON object" in info.value.feedback and '{"a": 1, "b": ' in info.value.feedback
    # The assistant message stays valid for the exchange log, raw arguments included.
    log = ExchangeLog(log_id="x")
    ex = log.open([{"role": "user", "content": "t"}])
    log.record_output(ex.exchange_id, response.message())
    recorded = log.exchange(ex.exchange_id).output
    assert recorded is not None
    assert dict(recorded.tool_calls[1].arguments) == {"_raw_arguments": '{"a": 1, "b": '}


# --------------------------------------------------------------------------- streaming


def test_streaming_delivers_text_deltas_in_order_and_usage_from_the_last_chunk(server: LoopbackChatServer) -> None:
    server.push(
        sse_reply(
            [
                delta_chunk(content="The "),
                delta_chunk(content="sum "),
                delta_chunk(content="is 5."),
                delta_chunk(finish_reason="stop"),
                usage_chunk(30, 4),
            ]
        )
    )
    deltas: list[str] = []

    response = model_for(server).complete(view_of(), on_delta=deltas.append)

    assert deltas == ["The ", "sum ", "is 5."]
    assert response.text == "The sum is 5."
    assert response.finish_reason == "stop"
    assert response.usage.total_tokens == 34
    body = server.requests[0].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert server.requests[0].headers["Accept"] == "text/event-stream"


def test_streaming_accumulates_interleaved_tool_call_deltas_by_index(server: LoopbackChatServer) -> None:
    server.push(
        sse_reply(
            [
                delta_chunk(tool_calls=[{"index": 0, "id": "call_a", "function": {"name": "add", "arguments": ""}}]),
                delta_chunk(tool_calls=[{"index": 1, "id": "call_b", "function": {"name": "add", "arguments": '{"a'}}]),
                delta_chunk(tool_calls=[{"index": 0, "function": {"arguments": '{"a": 1, '}}]),
                delta_chunk(tool_calls=[{"index": 1, "function": {"arguments": '": 5, "b": 6}'}}]),
                delta_chunk(tool_calls=[{"index": 0, "function": {"arguments": '"b": 2}'}}]),
                delta_chunk(finish_reason="tool_calls"),
            ]
        )
    )
    deltas: list[str] = []
    response = model_for(server).complete(view_of(tools=[ADD_TOOL]), on_delta=deltas.append)

    assert deltas == []
    assert response.text is None
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [
        ("call_a", "add", {"a": 1, "b": 2}),
        ("call_b", "add", {"a": 5, "b": 6}),
    ]
    assert response.finish_reason == "tool_calls"


def test_a_malformed_stream_chunk_raises_a_model_error_naming_it(server: LoopbackChatServer) -> None:
    server.push(sse_reply([delta_chunk(content="ok"), "{not json"]))
    with pytest.raises(ModelError, match="malformed stream chunk"):
        model_for(server).complete(view_of(), on_delta=lambda _: None)


def test_a_stream_without_done_or_finish_reason_is_an_error_not_an_answer(server: LoopbackChatServer) -> None:
    server.push(sse_reply([delta_chunk(content="The sum")], done=False))
    with pytest.raises(ModelError, match="stream ended before completion"):
        model_for(server).complete(view_of(), on_delta=lambda _: None)


def test_a_stream_cut_after_text_was_delivered_is_not_retried(server: LoopbackChatServer) -> None:
    server.push(sse_reply([delta_chunk(content="partial "), delta_chunk(content="more")], drop_after_chunks=1))
    deltas: list[str] = []
    with pytest.raises(ModelError) as info:
        model_for(server, max_retries=3).complete(view_of(), on_delta=deltas.append)
    assert deltas == ["partial "]
    assert len(server.requests) == 1
    assert "ended before completion" in str(info.value) or "interrupted" in str(info.value)


# --------------------------------------------------------------------------- servers that refuse to stream

REFUSALS = {
    "json-detail": json_reply({"detail": "Streaming is not supported when tools are given"}),
    "empty-body": Reply(status=200, body=b"", headers={"Content-Type": "text/event-stream"}),
    "http-400": json_reply({"error": {"message": "stream=true is not supported with tools"}}, status=400),
}


@pytest.mark.parametrize("refusal", sorted(REFUSALS))
def test_a_server_that_refuses_to_stream_with_tools_is_asked_again_without_streaming(
    server: LoopbackChatServer, refusal: str
) -> None:
    server.refuse_streaming_with_tools = REFUSALS[refusal]
    server.push(
        json_reply(completion(tool_calls=[{"id": "c1", "name": "add", "arguments": '{"a": 2, "b": 3}'}])),
        json_reply(completion(tool_calls=[{"id": "c2", "name": "add", "arguments": '{"a": 1, "b": 1}'}])),
        sse_reply([delta_chunk(content="5"), delta_chunk(finish_reason="stop")]),
    )
    model = model_for(server, max_retries=0)  # the second request is not a retry: none are allowed here
    events: list[dict[str, Any]] = []
    model.subscribe(lambda kind, payload: events.append({"kind": kind, **payload}))

    first = model.complete(view_of(tools=[ADD_TOOL]), on_delta=lambda _: None)
    assert first.tool_calls[0].arguments == {"a": 2, "b": 3}
    assert [r.body.get("stream", False) for r in server.requests] == [True, False]
    [event] = events
    assert event["kind"] == "model_retry" and event["reason"] == "stream refused"
    assert "without streaming" in event["hint"] and "--no-stream" in event["hint"]

    second = model.complete(view_of(tools=[ADD_TOOL]), on_delta=lambda _: None)  # refused once: not streamed
    assert second.tool_calls[0].id == "c2" and server.requests[2].body.get("stream", False) is False
    deltas: list[str] = []
    plain = model.complete(view_of(), on_delta=deltas.append)  # a request without tools still streams
    assert plain.text == "5" and deltas == ["5"] and server.requests[3].body["stream"] is True
    assert len(events) == 1


def test_a_completion_sent_in_place_of_a_stream_is_the_answer(server: LoopbackChatServer) -> None:
    server.push(json_reply(completion("The sum is 5.")))  # a server that ignores "stream": true
    deltas: list[str] = []
    response = model_for(server).complete(view_of(), on_delta=deltas.append)
    assert response.text == "The sum is 5." and deltas == ["The sum is 5."]
    assert len(server.requests) == 1 and response.usage.input_tokens == 11


def test_stream_false_never_streams(server: LoopbackChatServer) -> None:
    server.push(json_reply(completion("5")))
    deltas: list[str] = []
    response = model_for(server, stream=False).complete(view_of(tools=[ADD_TOOL]), on_delta=deltas.append)
    assert response.text == "5" and deltas == [] and "stream" not in server.requests[0].body


@pytest.mark.parametrize("message", ["unknown model", "the upstream model rejected the request"])
def test_an_error_about_something_else_is_not_taken_for_a_refusal_to_stream(
    server: LoopbackChatServer, message: str
) -> None:
    server.push(json_reply({"error": {"message": message}}, status=400))
    with pytest.raises(ModelError, match=message):
        model_for(server).complete(view_of(tools=[ADD_TOOL]), on_delta=lambda _: None)
    assert len(server.requests) == 1


def test_acomplete_falls_back_the_same_way(server: LoopbackChatServer) -> None:
    server.refuse_streaming_with_tools = REFUSALS["empty-body"]
    server.push(json_reply(completion("5")))
    model = model_for(server, max_retries=0)
    response = asyncio.run(model.acomplete(view_of(tools=[ADD_TOOL]), on_delta=lambda _: None))
    assert response.text == "5" and [r.body.get("stream", False) for r in server.requests] == [True, False]


def test_an_agent_run_against_a_refusing_server_finishes_and_its_events_carry_the_hint(
    server: LoopbackChatServer, policy_agent: Any
) -> None:
    server.refuse_streaming_with_tools = REFUSALS["json-detail"]
    server.push(
        json_reply(completion(tool_calls=[{"id": "c1", "name": "add", "arguments": '{"a": 2, "b": 3}'}])),
        json_reply(completion("The sum is 5.")),
    )

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    agent = policy_agent(lambda state, obs: None, tools=[add], llm=model_for(server))
    events: list[Any] = []  # a listener makes the run live: the engine asks to stream
    result = Engine(agent).run("What is 2 + 3?", on_event=events.append)
    assert result.state.final_result == "The sum is 5."
    retries = [e.payload for e in events if e.event_type.value == "model_retry"]
    assert len(retries) == 1 and retries[0]["reason"] == "stream refused" and retries[0]["hint"]
    assert [r.body.get("stream", False) for r in server.requests] == [True, False, False]


# --------------------------------------------------------------------------- typed answers


@dataclasses.dataclass(frozen=True)
class Sum:
    a: int
    b: int
    total: int


def test_a_typed_answer_goes_out_as_the_final_answer_tool_by_default(server: LoopbackChatServer) -> None:
    arguments = json.dumps({"a": 2, "b": 3, "total": 5})
    server.push(json_reply(completion(tool_calls=[{"id": "f1", "name": "final_answer", "arguments": arguments}])))
    agent = Agent(model_for(server), instructions="Add.", output_type=Sum)
    assert agent.run("2 + 3?", trace=False) == Sum(2, 3, 5)
    body = server.requests[0].body
    assert "response_format" not in body and body["tool_choice"] == "auto"
    [sent] = body["tools"]
    assert sent["function"]["name"] == "final_answer" and sent["function"]["parameters"]["required"] == [
        "a",
        "b",
        "total",
    ]


@pytest.mark.parametrize("kind", ["json_schema", "json_object"])
def test_a_server_that_takes_a_schema_gets_it_as_response_format(server: LoopbackChatServer, kind: str) -> None:
    server.push(
        json_reply(completion('{"a": 2, "b": 3, "total": "five"}')),
        json_reply(completion('{"a": 2, "b": 3, "total": 5}')),
    )

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    agent = Agent(model_for(server, response_format=kind), tools=[add], output_type=Sum)
    result = agent.run("2 + 3?", trace=False, return_state=True)
    assert result.state.output == Sum(2, 3, 5)
    body = server.requests[0].body
    schema = OutputSpec.of(Sum).schema
    expected = (
        {"type": "json_schema", "json_schema": {"name": "final_answer", "schema": schema, "strict": False}}
        if kind == "json_schema"
        else {"type": "json_object", "schema": schema}
    )
    assert body["response_format"] == expected
    assert [t["function"]["name"] for t in body["tools"]] == ["add"]  # the schema is not also a tool
    assert "answer.total: expected integer" in server.requests[1].body["messages"][-1]["content"]


def test_a_tool_choice_naming_the_final_answer_becomes_none_with_a_response_format(server: LoopbackChatServer) -> None:
    log = ExchangeLog(log_id="typed")
    log.open([{"role": "user", "content": "2 + 3?"}])
    spec = OutputSpec.of(Sum)
    view = RequestView.from_exchange_log(
        log,
        tool_schemas=[spec.tool_schema()],
        capability_requirements=["structured_output"],
        tool_use_policy="final_answer",
    )
    assert model_for(server).build_payload(view)["tool_choice"] == {
        "type": "function",
        "function": {"name": "final_answer"},
    }
    payload = model_for(server, response_format="json_schema").build_payload(view)
    assert (
        "tools" not in payload and "tool_choice" not in payload and payload["response_format"]["type"] == "json_schema"
    )
    with pytest.raises(ConfigurationError, match="response_format must be 'json_schema', 'json_object' or None"):
        model_for(server, response_format="xml")


# --------------------------------------------------------------------------- credentials


def _offline(base_url: str, **options: Any) -> OpenAICompatibleModel:
    """The adapter for ``base_url`` over httpx's MockTransport: no network, a fixed answer."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=completion("5"))

    transport = httpx.MockTransport(handler)
    return OpenAICompatibleModel("m", base_url=base_url, transport=transport, async_transport=transport, **options)


def test_a_remote_server_without_an_api_key_warns_once_before_the_first_request() -> None:
    model = _offline("https://api.example.com/v1")
    with pytest.warns(MissingAPIKeyWarning, match=r"api\.example\.com/v1: no API key") as caught:
        assert model.complete(view_of()).text == "5"
        model.complete(view_of())
        asyncio.run(model.acomplete(view_of()))
    assert len([w for w in caught if issubclass(w.category, MissingAPIKeyWarning)]) == 1


@pytest.mark.parametrize(
    ("base_url", "options"),
    [
        ("https://api.example.com/v1", {"api_key": KEY}),
        ("https://api.example.com/v1", {"headers": {"X-Api-Key": "a-secret-key"}}),
        ("http://127.0.0.1:8080/v1", {}),
        ("http://localhost:8080/v1", {}),
        ("http://[::1]:8080/v1", {}),
        ("http://192.168.1.20:8080/v1", {}),
    ],
)
def test_a_key_or_a_local_server_means_no_warning(base_url: str, options: dict[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", MissingAPIKeyWarning)
        assert _offline(base_url, **options).complete(view_of()).text == "5"


# --------------------------------------------------------------------------- failures and retries


def test_429_then_success_retries_and_reports_the_retry_as_an_event(server: LoopbackChatServer) -> None:
    server.push(
        json_reply({"error": {"message": "slow down"}}, status=429, headers={"retry-after-ms": "30"}),
        json_reply(completion("5")),
    )
    model = model_for(server)
    events: list[tuple[str, dict[str, Any]]] = []
    model.subscribe(lambda kind, payload: events.append((kind, payload)))

    response = model.complete(view_of())

    assert response.text == "5"
    assert len(server.requests) == 2
    assert events == [
        (
            "model_retry",
            {
                "model": "loopback-model",
                "attempt": 1,
                "max_retries": 3,
                "delay_s": 0.03,
                "reason": "HTTP 429",
                "status_code": 429,
                "error": f"loopback-model at {server.url}/chat/completions: HTTP 429: slow down",
            },
        )
    ]


def test_500_until_retries_run_out_raises_with_status_and_attempt_count(server: LoopbackChatServer) -> None:
    for _ in range(3):
        server.push(json_reply({"error": {"message": "upstream exploded"}}, status=500))
    model = model_for(server, max_retries=2)
    events: list[str] = []
    model.subscribe(lambda kind, payload: events.append(kind))

    with pytest.raises(ModelError) as info:
        model.complete(view_of())

    assert info.value.status_code == 500
    assert "upstream exploded" in str(info.value)
    assert "gave up after 3 attempts" in str(info.value)
    assert info.value.body is not None and "upstream exploded" in info.value.body
    assert len(server.requests) == 3
    assert events == ["model_retry", "model_retry"]


def test_400_raises_at_once_with_the_providers_message(server: LoopbackChatServer) -> None:
    server.push(
        json_reply({"error": {"message": "messages[1].content: too long", "type": "invalid_request"}}, status=400)
    )
    with pytest.raises(ModelError) as info:
        model_for(server).complete(view_of())
    assert info.value.status_code == 400
    assert "HTTP 400" in str(info.value) and "messages[1].content: too long" in str(info.value)
    assert len(server.requests) == 1
    restored = pickle.loads(pickle.dumps(info.value))
    assert (restored.status_code, str(restored)) == (400, str(info.value))


def test_retry_after_longer_than_allowed_stops_instead_of_waiting(server: LoopbackChatServer) -> None:
    server.push(json_reply({"error": "busy"}, status=503, headers={"Retry-After": "3600"}))
    with pytest.raises(ModelError, match="retry after 3600 s"):
        model_for(server, max_retry_after=5).complete(view_of())


def test_a_timeout_becomes_a_model_error_after_the_retries(server: LoopbackChatServer) -> None:
    server.push(Reply(delay=1.0, body=b"{}"), Reply(delay=1.0, body=b"{}"))
    model = model_for(server, timeout=0.2, max_retries=1)
    with pytest.raises(ModelError) as info:
        model.complete(view_of())
    assert "timed out after 0.2 s" in str(info.value)
    assert "gave up after 2 attempts" in str(info.value)
    assert info.value.status_code is None


def test_connection_refused_is_retried_then_reported(server: LoopbackChatServer) -> None:
    model = OpenAICompatibleModel(
        "m", base_url=f"http://127.0.0.1:{unused_port()}/v1", max_retries=1, backoff_base=0.001
    )
    events: list[str] = []
    model.subscribe(lambda kind, payload: events.append(payload["reason"]))
    with pytest.raises(ModelError, match="connection failed"):
        model.complete(view_of())
    assert len(events) == 1 and "ConnectError" in events[0]


def test_a_dropped_connection_is_retried(server: LoopbackChatServer) -> None:
    server.push(Reply(drop=True), json_reply(completion("5")))
    assert model_for(server).complete(view_of()).text == "5"
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"<html>Bad Gateway</html>", "not JSON"),
        ({"id": "x", "choices": []}, "no 'choices'"),
        ({"choices": [{"index": 0}]}, "no 'message'"),
        ([1, 2], "expected a JSON object"),
        ({"error": {"message": "quota exceeded"}}, "quota exceeded"),
    ],
)
def test_malformed_response_bodies_raise_model_errors_naming_the_problem(
    server: LoopbackChatServer, body: Any, problem: str
) -> None:
    server.push(json_reply(body))
    with pytest.raises(ModelError) as info:
        model_for(server).complete(view_of())
    assert problem in str(info.value)
    assert info.value.body


# --------------------------------------------------------------------------- secrets and guards


def test_the_api_key_never_appears_in_errors_bodies_events_or_repr(server: LoopbackChatServer) -> None:
    echo = {"error": {"message": f"invalid api key {KEY}"}}
    server.push(json_reply(echo, status=500), json_reply(echo, status=401))
    model = OpenAICompatibleModel(
        "loopback-model",
        base_url=server.url,
        api_key=KEY,
        headers={"X-Api-Token": "tok-SECRET-HEADER-VALUE"},
        backoff_base=0.001,
    )
    payloads: list[dict[str, Any]] = []
    model.subscribe(lambda kind, payload: payloads.append(payload))

    with pytest.raises(ModelError) as info:
        model.complete(view_of())

    everything = " ".join(
        [str(info.value), info.value.body or "", repr(model), json.dumps(payloads), str(model.describe())]
    )
    assert KEY not in everything
    assert "invalid api key ***" in str(info.value)
    assert server.requests[0].headers["X-Api-Token"] == "tok-SECRET-HEADER-VALUE"
    assert model.api_key == KEY and KEY in model.secrets()


def test_requests_are_refused_while_model_requests_are_disabled(
    server: LoopbackChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(model_base, "ALLOW_MODEL_REQUESTS", False)
    with pytest.raises(ModelRequestsDisabledError, match="ALLOW_MODEL_REQUESTS"):
        model_for(server).complete(view_of())
    assert server.requests == []


def test_a_tool_result_without_its_call_is_refused_before_sending() -> None:
    with pytest.raises(ContextError, match="without a preceding assistant call"):
        to_openai_messages([{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c9", "content": "5"}])
    with pytest.raises(ContextError, match="without results"):
        to_openai_messages(
            [
                {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "name": "add", "arguments": {}}]},
                {"role": "user", "content": "next"},
            ]
        )


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"base_url": "127.0.0.1:8000"}, "base_url"),
        ({"base_url": "http://x", "unit": "words"}, "unit"),
        ({"base_url": "http://x", "max_input_units": 0}, "max_input_units"),
        ({"base_url": "http://x", "max_retries": -1}, "max_retries"),
        ({"base_url": "http://x", "timeout": 0}, "timeout"),
    ],
)
def test_bad_constructor_arguments_are_configuration_errors(options: dict[str, Any], problem: str) -> None:
    from qitos.core._errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=problem):
        OpenAICompatibleModel("m", **options)


# --------------------------------------------------------------------------- async twin


def test_acomplete_plain_and_streaming_match_the_sync_path(server: LoopbackChatServer) -> None:
    server.push(
        json_reply({"error": {"message": "busy"}}, status=503, headers={"retry-after-ms": "5"}),
        json_reply(completion(tool_calls=[{"id": "c1", "name": "add", "arguments": '{"a": 2, "b": 3}'}])),
        sse_reply([delta_chunk(content="5"), delta_chunk(content="!", finish_reason="stop")]),
    )
    model = model_for(server)
    retries: list[int] = []
    model.subscribe(lambda kind, payload: retries.append(payload["status_code"]))

    async def run() -> tuple[Any, Any, list[str]]:
        first = await model.acomplete(view_of(tools=[ADD_TOOL]))
        deltas: list[str] = []
        second = await model.acomplete(view_of(), on_delta=deltas.append)
        await model.aclose()
        return first, second, deltas

    first, second, deltas = asyncio.run(run())
    assert retries == [503]
    assert first.tool_calls[0].arguments == {"a": 2, "b": 3}
    assert (second.text, deltas) == ("5!", ["5", "!"])


def test_developer_messages_go_out_in_the_configured_role_and_the_target_is_declared() -> None:
    messages = [{"role": "developer", "content": "rules"}, {"role": "user", "content": "hi"}]
    assert to_openai_messages(messages)[0] == {"role": "system", "content": "rules"}
    assert to_openai_messages(messages, developer_role="developer")[0]["role"] == "developer"
    model = OpenAICompatibleModel("m", base_url="http://127.0.0.1:9/v1")
    assert model.request_target() == {
        "provider": "openai-compatible",
        "model": "m",
        "transport": "http",
        "api_mode": "chat",
    }
    assert model.url == "http://127.0.0.1:9/v1/chat/completions"


# --------------------------------------------------------------------------- real-server compatibility


def test_an_assistant_tool_call_message_is_sent_with_empty_content_not_null() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "add"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "name": "add", "arguments": {"a": 1}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
        {"role": "assistant", "content": ""},
    ]
    out = to_openai_messages(messages)
    assert [m["content"] for m in out] == ["add", "", "1", ""]


def test_a_500_whose_body_says_the_request_failed_validation_is_not_retried(server: LoopbackChatServer) -> None:
    body = {
        "error": {
            "message": "1 validation error:\n  {'type': 'string_type', 'msg': 'Input should be a valid string'}",
            "type": "internal_server_error",
        }
    }
    server.push(json_reply(body, status=500), json_reply(completion("never sent")))
    model = model_for(server, max_retries=3)
    retries: list[str] = []
    model.subscribe(lambda kind, payload: retries.append(kind))

    with pytest.raises(ModelError) as info:
        model.complete(view_of())

    assert info.value.status_code == 500 and "validation error" in str(info.value)
    assert "gave up" not in str(info.value)
    assert len(server.requests) == 1 and retries == []


@pytest.mark.parametrize("status", [404, 422])
def test_a_rejected_request_is_not_retried(server: LoopbackChatServer, status: int) -> None:
    server.push(json_reply({"detail": "Not Found"}, status=status), json_reply(completion("never sent")))
    with pytest.raises(ModelError) as info:
        model_for(server, max_retries=3).complete(view_of())
    assert info.value.status_code == status
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("policy", "satisfied", "sent"),
    [
        ("auto", False, "auto"),
        ("none", True, "none"),
        ("required", False, {"type": "function", "function": {"name": "add"}}),
        ("required", True, "auto"),
        ("add", False, {"type": "function", "function": {"name": "add"}}),
        ("add", True, "auto"),
    ],
)
def test_the_views_tool_use_policy_drives_tool_choice_per_request(
    server: LoopbackChatServer, policy: str, satisfied: bool, sent: Any
) -> None:
    server.push(json_reply(completion("ok")))
    log = ExchangeLog(log_id="policy-log")
    log.open([{"role": "user", "content": "What is 2 + 3?"}])
    view = RequestView.from_exchange_log(
        log, tool_schemas=[ADD_TOOL], tool_use_policy=policy, tool_use_satisfied=satisfied
    )
    model_for(server).complete(view)
    assert server.requests[0].body["tool_choice"] == sent


def test_a_tool_choice_given_to_the_constructor_wins_over_the_view(server: LoopbackChatServer) -> None:
    server.push(json_reply(completion("ok")))
    model_for(server, tool_choice="none").complete(view_of(tools=[ADD_TOOL], tool_use_policy="required"))
    assert server.requests[0].body["tool_choice"] == "none"


def test_a_view_without_tools_sends_no_tool_choice(server: LoopbackChatServer) -> None:
    server.push(json_reply(completion("ok")))
    model_for(server).complete(view_of())
    assert "tool_choice" not in server.requests[0].body and "tools" not in server.requests[0].body


def test_a_tool_use_policy_naming_an_unknown_tool_is_refused() -> None:
    log = ExchangeLog(log_id="x")
    log.open([{"role": "user", "content": "t"}])
    with pytest.raises(ConfigurationError, match="subtract"):
        RequestView.from_exchange_log(log, tool_schemas=[ADD_TOOL], tool_use_policy="subtract")


def test_the_reasoning_effort_of_the_view_is_sent_as_reasoning_effort(server: LoopbackChatServer) -> None:
    server.push(json_reply(completion("ok")), json_reply(completion("ok")))
    log = ExchangeLog(log_id="x")
    log.open([{"role": "user", "content": "t"}])
    model = model_for(server)
    model.complete(RequestView.from_exchange_log(log, reasoning_policy=ReasoningPolicy(effort="low")))
    model.complete(RequestView.from_exchange_log(log))
    assert server.requests[0].body["reasoning_effort"] == "low"
    assert "reasoning_effort" not in server.requests[1].body
    with pytest.raises(ConfigurationError, match="effort"):
        ReasoningPolicy(effort="extreme")


def _expected_tokens(body: dict[str, Any], completion_texts: list[str]) -> tuple[int, int]:
    counter = TokenCounter()
    prompt = sum(counter.count(canonical_json(m)) for m in body["messages"])
    prompt += sum(counter.count(canonical_json(t)) for t in body.get("tools", []))
    return prompt, sum(counter.count(t) for t in completion_texts)


def test_a_stream_without_usage_is_counted_locally_and_marked_estimated(server: LoopbackChatServer) -> None:
    server.push(
        sse_reply([delta_chunk(content="The sum "), delta_chunk(content="is 5."), delta_chunk(finish_reason="stop")])
    )
    response = model_for(server).complete(view_of(), on_delta=lambda _: None)

    prompt, completion_tokens = _expected_tokens(server.requests[0].body, ["The sum is 5."])
    assert response.usage == Usage(input_tokens=prompt, output_tokens=completion_tokens, estimated=True)
    assert prompt > 0 and completion_tokens > 0
    assert response.to_dict()["usage"]["estimated"] is True


def test_a_body_without_usage_counts_text_and_tool_calls_locally(server: LoopbackChatServer) -> None:
    body = completion(tool_calls=[{"id": "c", "name": "add", "arguments": '{"a": 2, "b": 3}'}])
    del body["usage"]
    server.push(json_reply(body))
    response = model_for(server).complete(view_of(tools=[ADD_TOOL]))

    prompt, completion_tokens = _expected_tokens(server.requests[0].body, ["add", '{"a": 2, "b": 3}'])
    assert (response.usage.input_tokens, response.usage.output_tokens) == (prompt, completion_tokens)
    assert response.usage.estimated


def test_reported_usage_is_not_marked_estimated(server: LoopbackChatServer) -> None:
    server.push(json_reply(completion("5", usage=(21, 2))))
    usage = model_for(server).complete(view_of()).usage
    assert usage == Usage(input_tokens=21, output_tokens=2) and not usage.estimated
    assert "estimated" not in usage.to_dict()


@pytest.mark.parametrize(("tokenizer", "estimated"), [(None, True), ("cl100k_base", False)])
def test_the_request_views_token_counts_say_whether_they_are_the_models_own(
    server: LoopbackChatServer, policy_agent: Any, tokenizer: str | None, estimated: bool
) -> None:
    # A SmolLM2 server counted with cl100k was labelled exact; only a declared tokenizer is exact.
    server.push(json_reply(completion("hello", model="smollm2-135m")))
    model = model_for(server, max_input_units=2048, tokenizer=tokenizer)
    result = Engine(policy_agent(lambda state, obs: None, llm=model)).run("Say hello.")
    request_view = result.records[0].request_view
    assert request_view is not None
    units = request_view["units"]
    assert units["counter"] == ["tokens", "cl100k_base"] and units["tokenizer"] == "cl100k_base"
    assert units["estimated"] is estimated
    assert model.describe()["tokenizer"] == tokenizer


def test_an_empty_tokenizer_name_is_refused(server: LoopbackChatServer) -> None:
    with pytest.raises(ConfigurationError, match="tokenizer"):
        model_for(server, tokenizer="")


def test_an_agent_on_a_stream_without_usage_hits_its_token_budget(
    server: LoopbackChatServer, policy_agent: Any
) -> None:
    # The model keeps calling a tool; only the estimated usage can stop the run at its token budget.
    for i in range(6):
        server.push(
            sse_reply(
                [
                    delta_chunk(tool_calls=[{"index": 0, "id": f"c{i}", "function": {"name": "add", "arguments": ""}}]),
                    delta_chunk(tool_calls=[{"index": 0, "function": {"arguments": '{"a": 1, "b": 2}'}}]),
                    delta_chunk(finish_reason="tool_calls"),
                ]
            )
        )

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    agent = policy_agent(lambda state, obs: None, tools=[add], llm=model_for(server))
    events: list[Any] = []  # a listener makes the run live, so the model is asked to stream
    result = Engine(agent, budget=RuntimeBudget(max_tokens=5)).run("add forever", on_event=events.append)

    assert len(server.requests) == 1
    assert result.state.stop_reason == StopReason.BUDGET_TOKENS.value
