"""The OTLP/HTTP export path, against a real receiver on 127.0.0.1 that decodes the protobuf."""

from __future__ import annotations

import pytest

from otlp_receiver import otlp_receiver
from qitos import AgentModule, Decision, Engine, StateSchema, ToolRegistry, tool
from qitos.core._errors import ConfigurationError
from qitos.engine._otlp import otlp_export, otlp_tracer_provider
from qitos.models._scripted import ScriptedModel


@tool
def shout(text: str) -> str:
    """Upper-case a text."""
    return text.upper()


class ShoutAgent(AgentModule[StateSchema, object, object]):
    """One tool call through the model path, then the model's answer."""

    def __init__(self, llm: ScriptedModel) -> None:
        super().__init__(tool_registry=ToolRegistry([shout]), llm=llm)

    def init_state(self, task: str, **kwargs: object) -> StateSchema:
        return StateSchema(task=task, max_steps=4)

    def reduce(self, state: StateSchema, observation: object, decision: Decision[object]) -> StateSchema:
        return state


@pytest.fixture(autouse=True)
def _clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_SERVICE_NAME",
        "OTEL_RESOURCE_ATTRIBUTES",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")


def test_spans_reach_an_otlp_http_receiver_configured_by_the_standard_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = ScriptedModel([{"tool_calls": [{"id": "c1", "name": "shout", "arguments": {"text": "hi"}}]}, "HI"])
    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "qitos-test")
        provider = otlp_tracer_provider()
        result = Engine(ShoutAgent(model), otel=provider).run("Shout hi")
        provider.shutdown()  # flushes the batch processor
    assert result.state.final_result == "HI"
    assert set(receiver.content_types) == {"application/x-protobuf"}
    (run,) = receiver.named("invoke_agent")
    assert run.name == "invoke_agent ShoutAgent" and run.parent_span_id == ""
    assert run.resource["service.name"] == "qitos-test"
    assert run.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert run.attributes["qitos.run.id"] == result.run_id
    steps = receiver.named("qitos.step")
    assert len(steps) == 2 and {s.parent_span_id for s in steps} == {run.span_id}
    chats = receiver.named("chat scripted")
    assert len(chats) == 2 and {c.parent_span_id for c in chats} == {s.span_id for s in steps}
    assert chats[0].attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)
    (tool_span,) = receiver.named("execute_tool shout")
    assert tool_span.attributes["gen_ai.tool.call.id"] == "c1"
    assert {s.trace_id for s in receiver.spans} == {run.trace_id}


def test_otlp_export_is_a_no_op_when_disabled_and_flushes_when_enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    with otlp_export(False) as provider:
        assert provider is None
    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.url + "/v1/traces")
        with otlp_export(True) as provider:
            assert provider is not None
            Engine(ShoutAgent(ScriptedModel(["done"])), otel=provider).run("t")
        # No explicit flush: leaving the block shut the provider down, which exported the spans.
        assert [s.name for s in receiver.named("invoke_agent")] == ["invoke_agent ShoutAgent"]
        assert receiver.spans[0].resource["service.name"] == "qitos"


@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"])
def test_a_protocol_other_than_http_protobuf_is_refused(monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    monkeypatch.setenv(variable, "grpc")
    with pytest.raises(ConfigurationError, match="http/protobuf only"):
        otlp_tracer_provider()


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens there once the socket is closed


def test_without_a_collector_the_exit_neither_waits_for_retries_nor_prints_their_noise(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    import time

    endpoint = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    model = ScriptedModel(["done"])
    with otlp_export(True) as provider:
        assert Engine(ShoutAgent(model), otel=provider).run("Shout").state.final_result == "done"
        leaving = time.monotonic()
    waited = time.monotonic() - leaving
    # The exporter alone would retry with backoff (about 1 + 2 + 4 s) before giving up.
    assert waited < 1.0, f"the exit waited {waited:.1f} s"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"qitos: OpenTelemetry spans were not all exported to {endpoint}")
    assert "retrying" not in err and "Connection refused" in err
    assert not [r for r in caplog.records if "Transient error" in r.getMessage()]


def test_with_a_collector_otlp_export_sends_everything_and_says_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        with otlp_export(True) as provider:
            Engine(ShoutAgent(ScriptedModel(["done"])), otel=provider).run("Shout")
    assert receiver.named("invoke_agent")
    assert capsys.readouterr().err == ""
