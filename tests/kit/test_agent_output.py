"""Typed output: ``Agent(output_type=...)`` (and any AgentModule's ``output_type``) makes the final
answer a validated object, repaired like a bad tool call, bounded by the step budget, returned
typed, and kept typed in the state through sessions and a restore in another process."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import agent_app
from qitos import Agent, AgentModule, Decision, StateSchema, compose, tool
from qitos.core._errors import ConfigurationError
from qitos.core._output import FINAL_ANSWER_TOOL, STRUCTURED_OUTPUT
from qitos.kit._agent import AgentState, typed_state
from qitos.models._scripted import ScriptedModel
from session_agents import subprocess_env


@dataclass(frozen=True)
class City:
    name: str
    population: int


class Country(BaseModel):
    name: str
    capital: str


def answer(args: dict[str, Any], call_id: str = "f1") -> dict[str, Any]:
    return {"tool_calls": [{"id": call_id, "name": FINAL_ANSWER_TOOL, "arguments": args}]}


@tool
def lookup(name: str) -> str:
    """Look a city up.

    Args:
        name: the city.
    """
    return f"{name}: 2,100,000 people"


def test_the_final_answer_is_a_validated_object_returned_typed() -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [{"id": "l1", "name": "lookup", "arguments": {"name": "Paris"}}]},
            answer({"name": "Paris", "population": 2100000}),
        ]
    )
    agent = Agent(model, tools=[lookup], output_type=City)
    city = agent.run("How many people live in Paris?", trace=False)
    assert city == City("Paris", 2100000) and isinstance(city, City)
    first = model.requests[0]
    assert [t["name"] for t in first.tools()] == ["lookup", FINAL_ANSWER_TOOL]
    assert (
        STRUCTURED_OUTPUT in first.capability_requirements and first.output_schema() == first.tools()[1]["parameters"]
    )
    result = Agent(ScriptedModel([answer({"name": "Oslo", "population": 700000})]), output_type=City).run(
        "Oslo?", trace=False, return_state=True
    )
    assert type(result.state) is typed_state(City) and issubclass(type(result.state), AgentState)
    state: Any = result.state  # the typed state built for output_type
    assert state.output == City("Oslo", 700000)
    assert json.loads(state.final_result) == {"name": "Oslo", "population": 700000}
    assert result.records[-1].decision.meta == {"output": {"name": "Oslo", "population": 700000}}


def test_an_answer_that_does_not_validate_is_repaired_like_a_bad_tool_call() -> None:
    model = ScriptedModel([answer({"name": "Paris"}, "f1"), answer({"name": "Paris", "population": 2100000}, "f2")])
    result = Agent(model, output_type=City).run("Paris?", trace=False, return_state=True)
    assert result.state.output == City("Paris", 2100000) and result.step_count == 2
    first = result.records[0].decision
    assert first.mode == "wait" and "missing required argument 'population'" in first.meta["feedback"]
    sent = model.requests[1].messages()
    assert sent[-1]["role"] == "tool" and sent[-1]["tool_call_id"] == "f1"
    assert sent[-1]["content"].startswith("ERROR (not run): Your final answer is not a valid City: ")
    assert sum("missing required argument" in str(m.get("content")) for m in sent) == 1  # once


def test_a_json_text_reply_is_accepted_and_other_text_is_sent_back() -> None:
    model = ScriptedModel(["Paris has about two million people.", '```json\n{"name": "Paris", "population": 2}\n```'])
    result = Agent(model, output_type=City).run("Paris?", trace=False, return_state=True)
    assert result.state.output == City("Paris", 2)
    feedback = result.records[0].decision.meta["feedback"]
    assert "the answer is not JSON" in feedback
    assert model.requests[1].messages()[-1] == {"role": "user", "content": feedback}


def test_repairs_are_bounded_by_the_step_budget() -> None:
    model = ScriptedModel([answer({"name": 3}, f"f{i}") for i in range(3)])
    agent = Agent(model, output_type=City, max_steps=3)
    result = agent.run("Paris?", trace=False, return_state=True)
    assert (result.state.stop_reason, result.step_count, result.state.output) == ("max_steps_reached", 3, None)
    assert result.state.final_result is None  # never a fake answer
    assert Agent(ScriptedModel([answer({})]), output_type=City, max_steps=1).run("x", trace=False) is None


def test_the_final_answer_must_come_alone() -> None:
    both = {
        "tool_calls": [
            {"id": "l1", "name": "lookup", "arguments": {"name": "Paris"}},
            {"id": "f1", "name": FINAL_ANSWER_TOOL, "arguments": {"name": "Paris", "population": 1}},
        ]
    }
    model = ScriptedModel([both, answer({"name": "Paris", "population": 1}, "f2")])
    result = Agent(model, tools=[lookup], output_type=City).run("Paris?", trace=False, return_state=True)
    assert result.records[0].observation.results == ()  # nothing ran
    assert "call final_answer alone" in result.records[0].decision.meta["feedback"]
    assert result.state.output == City("Paris", 1)


def test_a_pydantic_model_is_an_output_type_and_survives_a_session_restore(tmp_path: Path) -> None:
    db = str(tmp_path / "typed.db")
    agent = Agent(
        ScriptedModel([answer({"name": "France"}), answer({"name": "France", "capital": "Paris"})]), output_type=Country
    )
    composition = compose(agent=agent, store=db)
    session = composition.session("Capital of France?")
    result = session.run()
    assert result.state.output == Country(name="France", capital="Paris")
    assert "capital: Field required" in result.records[0].decision.meta["feedback"]
    composition.runtime.checkpoint_store.close()
    again = compose(agent=Agent(None, output_type=Country), store=db).restore(session.session_id.value)
    restored = again.run()  # finished: nothing runs, the state comes back from the store
    assert restored.state.output == Country(name="France", capital="Paris") and isinstance(
        restored.state.output, Country
    )


def test_the_typed_value_is_restored_in_another_process(tmp_path: Path) -> None:
    db = str(tmp_path / "app.db")
    call = {"tool_calls": [{"id": "p1", "name": "publish", "arguments": {"title": "Notes"}}]}
    composition = compose(agent=agent_app.make_agent([call], typed=True), store=db)
    session = composition.session("Publish my notes, then say what you published")
    assert session.run().state.stop_reason == "awaiting_approval"
    composition.runtime.checkpoint_store.close()

    script = json.dumps([answer({"title": "Notes", "words": 1})])
    args = ["--db", db, "--session", session.session_id.value, "--approve", "p1", "--script", script, "--typed"]
    done = subprocess.run(
        [sys.executable, "-m", "agent_app", "resume", *args],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.splitlines()[-1])
    assert outcome["output"] == ["Notes", 1] and outcome["output_type"] == "Note"
    assert outcome["state_type"] == "AgentState[agent_app.Note]"
    plain = subprocess.run(  # a process that builds the agent without its output type cannot read the state
        [sys.executable, "-m", "agent_app", "resume", "--db", db, "--session", session.session_id.value],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plain.returncode != 0 and "AgentState[agent_app.Note]" in plain.stderr


def test_any_agent_module_can_declare_an_output_type() -> None:
    class Typed(AgentModule[StateSchema, Any, Any]):
        output_type = City

        def init_state(self, task: str, **kwargs: Any) -> StateSchema:
            return StateSchema(task=task, max_steps=3)

        def reduce(self, state: StateSchema, observation: Any, decision: Decision[Any]) -> StateSchema:
            return state

    rome = Typed(llm=ScriptedModel([answer({"name": "Rome", "population": 3})])).run("Rome?", trace=False)
    assert rome == City("Rome", 3)

    @tool(name=FINAL_ANSWER_TOOL)
    def clash(text: str) -> str:
        """A tool with the reserved name."""
        return text

    with pytest.raises(ConfigurationError, match="Typed has a tool named 'final_answer'"):
        Typed(llm=ScriptedModel(["x"]), tool_registry=[clash]).run("Rome?", trace=False)


def test_bad_typed_output_setups_are_clear_errors() -> None:
    with pytest.raises(ConfigurationError, match="output_type must be a dataclass or a pydantic model"):
        Agent(None, output_type=dict)

    @tool(name=FINAL_ANSWER_TOOL)
    def clash(text: str) -> str:
        """A tool with the reserved name."""
        return text

    with pytest.raises(ConfigurationError, match="a tool named 'final_answer'"):
        Agent(None, tools=[clash], output_type=City)
