"""FunctionModel and ``llm=<plain function>``: a callable is a model, anything else is refused."""

from __future__ import annotations

from typing import Any

import pytest

from qitos.core._errors import ConfigurationError
from qitos.core._exchange import ExchangeLog
from qitos.core._tool import tool
from qitos.core.request_view import RequestView
from qitos.engine._engine import Engine
from qitos.models._base import ModelResponse, ToolCall
from qitos.models._function import FunctionModel, as_model
from qitos.models._openai_compat import OpenAICompatibleModel
from qitos.models._scripted import ScriptedModel


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def test_agent_module_llm_accepts_a_function_of_messages_returning_text(policy_agent: Any) -> None:
    seen: list[list[dict[str, Any]]] = []

    def llm(messages: list[dict[str, Any]]) -> str:
        seen.append(messages)
        return "Paris"

    answer = policy_agent(lambda state, obs: None, llm=llm).run("Capital of France?", trace=False)

    assert answer == "Paris"
    [messages] = seen
    assert messages[-1]["role"] == "user" and "Capital of France?" in messages[-1]["content"]


def test_a_function_llm_can_call_tools_over_several_turns(policy_agent: Any) -> None:
    def llm(messages: list[dict[str, Any]]) -> ModelResponse:
        if messages[-1]["role"] != "tool":
            call = ToolCall(id="c1", name="add", arguments={"a": 2, "b": 3}, raw_arguments='{"a": 2, "b": 3}')
            return ModelResponse(tool_calls=(call,), finish_reason="tool_calls")
        return ModelResponse(text=f"The sum is {messages[-1]['content']}.", finish_reason="stop")

    result = policy_agent(lambda state, obs: None, tools=[add], llm=llm).run("2 + 3?", return_state=True, trace=False)

    assert result.state.final_result == "The sum is 5."
    assert result.step_count == 2


def test_the_engine_wraps_a_function_llm_as_a_function_model(policy_agent: Any) -> None:
    def my_llm(messages: list[dict[str, Any]]) -> str:
        return "ok"

    engine = Engine(policy_agent(lambda state, obs: None, llm=my_llm))
    assert isinstance(engine.model, FunctionModel)
    assert engine.model.takes == "messages" and engine.model.model_id.endswith("my_llm")
    scripted = ScriptedModel(["ok"])
    assert Engine(policy_agent(lambda state, obs: None, llm=scripted)).model is scripted


@pytest.mark.parametrize("bad", [42, "gpt-4o", OpenAICompatibleModel, ScriptedModel])
def test_an_llm_that_is_neither_a_model_nor_a_function_is_refused_at_construction(policy_agent: Any, bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="llm must be a model adapter"):
        policy_agent(lambda state, obs: None, llm=bad)
    with pytest.raises(ConfigurationError, match="llm must be a model adapter"):
        as_model(bad)


def test_engine_model_argument_is_checked_like_llm(policy_agent: Any) -> None:
    with pytest.raises(ConfigurationError, match="llm must be a model adapter"):
        Engine(policy_agent(lambda state, obs: None), model=3.5)  # type: ignore[arg-type]


def test_function_model_takes_the_view_or_its_messages() -> None:
    log = ExchangeLog(log_id="x")
    log.open([{"role": "user", "content": "hello"}])
    view = RequestView.from_exchange_log(log, instructions=[{"role": "system", "content": "be brief"}])

    by_view = FunctionModel(lambda v: f"{len(v.messages())} messages")
    by_messages = FunctionModel(lambda messages: messages[-1]["content"].upper(), takes="messages")

    assert by_view.complete(view).text == "2 messages"
    deltas: list[str] = []
    assert by_messages.complete(view, on_delta=deltas.append).text == "HELLO"
    assert deltas == ["HELLO"]
    assert by_messages.requests == [view]
    with pytest.raises(ConfigurationError, match="takes"):
        FunctionModel(lambda v: "x", takes="prompt")  # type: ignore[arg-type]
