"""The stock ``Agent``: one line makes a tool-calling agent that is an ordinary AgentModule, so it
runs, persists, is steered, approved, restored in another process, delegated to and put in a Team."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import agent_app
from qitos import Agent, AgentModule, Engine, compose, tool
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.core._errors import ConfigurationError
from qitos.core.memory import MemoryRecord
from qitos.engine._delegation import delegate
from qitos.engine._handoff import Team, TeamState
from qitos.eval import Dataset, EvalChangedError, Sample, evaluate, scorers
from qitos.kit._agent import AgentState
from qitos.kit.memory.markdown_file_memory import MarkdownFileMemory
from qitos.models._function import FunctionModel
from qitos.models._scripted import ScriptedModel
from session_agents import subprocess_env


@tool
def word_count(text: str) -> int:
    """Count the words of a text.

    Args:
        text: the text.
    """
    return len(text.split())


def counting_model() -> FunctionModel:
    """Calls word_count on the task, then answers with the tool's result."""

    def reply(messages: list[dict[str, Any]]) -> Any:
        last = messages[-1]
        if last["role"] == "tool":
            return f"{last['content']} words"
        task = next(m["content"] for m in messages if m["role"] == "user")
        return {"tool_calls": [{"name": "word_count", "arguments": {"text": task}}]}

    return FunctionModel(reply, takes="messages")


def test_one_line_makes_a_tool_calling_agent() -> None:
    model = counting_model()
    agent = Agent(model, tools=[word_count], instructions="Count words with the tool.")
    assert isinstance(agent, AgentModule)
    assert agent.run("the quick brown fox", trace=False) == "4 words"
    first = model.requests[0]
    assert first.messages()[:2] == [
        {"role": "system", "content": "Count words with the tool."},
        {"role": "user", "content": "the quick brown fox"},  # the task itself, not the state's repr
    ]
    assert [t["name"] for t in first.tools()] == ["word_count"]
    result = agent.run("one two", trace=False, return_state=True)  # one instance, any number of runs
    assert isinstance(result.state, AgentState) and result.state.final_result == "2 words"


def test_a_model_from_compose_and_a_step_limit() -> None:
    agent = Agent(None, tools=[word_count])
    result = compose(agent=agent, model=counting_model()).session("a b c").run()
    assert result.state.final_result == "3 words" and result.state.max_steps == 10
    looping = Agent(
        ScriptedModel([{"tool_calls": [{"name": "word_count", "arguments": {"text": "x"}}]}] * 3),
        tools=[word_count],
        max_steps=2,
    )
    stopped = looping.run("loop", trace=False, return_state=True)
    assert (stopped.state.stop_reason, stopped.step_count) == ("max_steps_reached", 2)
    assert looping.run("loop", trace=False, return_state=True, max_steps=1).step_count == 1


def test_memory_is_recalled_into_every_request(tmp_path: Path) -> None:
    memory = MarkdownFileMemory(str(tmp_path / "memory.md"))
    memory.append(MemoryRecord(role="user", content="The user's name is Ada.", step_id=0))
    model = ScriptedModel(["Hello Ada"])
    assert Agent(model, memory=memory).run("greet me", trace=False) == "Hello Ada"
    assert "The user's name is Ada." in json.dumps(model.requests[0].messages())


def test_a_durable_session_is_steered_and_approved(tmp_path: Path) -> None:
    script: list[str | dict[str, Any]] = [
        {"tool_calls": [{"id": "p1", "name": "publish", "arguments": {"title": "Notes"}}]},
        "Published the notes, briefly.",
    ]
    model = ScriptedModel(script)
    store = SqliteCheckpointStore(str(tmp_path / "agent.db"))
    agent = Agent(model, tools=[agent_app.publish], instructions=agent_app.INSTRUCTIONS)
    session = compose(agent=agent, store=store).session("Publish my notes")
    session.steer("keep it brief")
    first = session.run()
    assert first.state.stop_reason == "awaiting_approval"
    sent = model.requests[0].messages()
    assert [m["content"] for m in sent if m["role"] == "user"] == ["Publish my notes", "keep it brief"]
    session.approve("p1")
    done = session.run()
    assert done.state.final_result == "Published the notes, briefly."
    assert model.requests[1].messages()[-1] == {"role": "tool", "tool_call_id": "p1", "content": "published 'Notes'"}
    store.close()


def test_a_session_is_restored_in_another_process_by_building_the_same_agent(tmp_path: Path) -> None:
    db = str(tmp_path / "agent.db")
    call = {"tool_calls": [{"id": "p1", "name": "publish", "arguments": {"title": "Notes"}}]}
    composition = compose(agent=agent_app.make_agent([call]), store=db)
    session = composition.session("Publish my notes")
    assert session.run().state.stop_reason == "awaiting_approval"
    composition.runtime.checkpoint_store.close()

    args = ["--db", db, "--session", session.session_id.value, "--approve", "p1", "--script", json.dumps(["Done."])]
    done = subprocess.run(
        [sys.executable, "-m", "agent_app", "resume", *args],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    outcome = json.loads(done.stdout.splitlines()[-1])
    assert outcome == {"stop_reason": "final", "final_result": "Done.", "state_type": "AgentState"}


def test_an_agent_instance_is_delegated_to_as_a_durable_child_session(tmp_path: Path) -> None:
    researcher = Agent(ScriptedModel(["Paris"]), instructions="You answer geography questions.")
    lead_model = ScriptedModel(
        [
            {"tool_calls": [{"id": "d1", "name": "research", "arguments": {"task": "Capital of France?"}}]},
            "It is Paris.",
        ]
    )
    lead = Agent(lead_model, tools=[delegate("research", researcher, max_steps=3)])
    store = SqliteCheckpointStore(str(tmp_path / "team.db"))
    session = Engine(lead, checkpoint_store=store).session("Ask the researcher")
    assert session.run().state.final_result == "It is Paris."
    work_graph = session.inspect().work_graph
    assert work_graph is not None
    [call] = work_graph["steps"][0]["tool_calls"]
    assert call["child"]["lifecycle"] == "completed"
    assert lead_model.requests[1].messages()[-1]["content"] == "Paris"
    store.close()


@tool
def refund(order: str) -> str:
    """Refund an order.

    Args:
        order: the order id.
    """
    return f"refunded {order}"


def test_stock_agents_are_team_members_and_the_team_survives_a_restore(tmp_path: Path) -> None:
    script: list[str | dict[str, Any]] = [
        {"tool_calls": [{"id": "h1", "name": "transfer_to_billing", "arguments": {"reason": "a refund"}}]},
        {"tool_calls": [{"id": "r1", "name": "refund", "arguments": {"order": "A-7"}}]},
        "Refunded A-7.",
    ]
    model = ScriptedModel(script)

    def team() -> Team:
        return Team(
            {
                "triage": Agent(None, instructions="You route requests."),
                "billing": Agent(None, instructions="You handle billing.", tools=[refund]),
            },
            first="triage",
            llm=model,
        )

    db = str(tmp_path / "team.db")
    session = compose(agent=team, store=db).session("Refund order A-7")
    result = session.run()
    assert result.state.final_result == "Refunded A-7."
    assert isinstance(result.state, AgentState) and isinstance(result.state, TeamState)
    assert result.state.active_agent == "billing"
    assert model.requests[1].messages()[0] == {"role": "system", "content": "You handle billing."}
    again = compose(agent=team, store=db).restore(session.session_id.value)
    assert again.inspect().snapshot_integrity == "verified" and again.state_type is type(result.state)


def test_an_agent_module_instance_names_an_agent_on_the_command_line(tmp_path: Path) -> None:
    env = {**subprocess_env(), "AGENT_APP_SCRIPT": json.dumps(["Nothing to publish."])}
    done = subprocess.run(
        [sys.executable, "-m", "qitos.cli.app", "run", "agent_app:agent", "Publish nothing", "--json"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["final_result"] == "Nothing to publish."


def test_an_agent_instance_is_evaluated(tmp_path: Path) -> None:
    model = FunctionModel(lambda messages: messages[-1]["content"].upper(), takes="messages")
    data = Dataset([Sample("alpha", "ALPHA", id="a"), Sample("beta", "BETA", id="b")], name="words")
    report = evaluate(Agent(model), data, scorers=[scorers.exact()], store=str(tmp_path / "evals.db"), name="agent")
    assert report.status == "complete" and report.metrics["exact"]["mean"] == 1.0
    assert sorted(s.answer for s in report.samples) == ["ALPHA", "BETA"]
    again = Agent(model)  # the same configuration continues the eval: nothing runs again
    assert (
        evaluate(again, data, scorers=[scorers.exact()], store=str(tmp_path / "evals.db"), name="agent").completed == 2
    )
    other = Agent(model, instructions="Shout.")
    with pytest.raises(EvalChangedError, match=r"agent_config\.instructions_digest"):
        evaluate(other, data, scorers=[scorers.exact()], store=str(tmp_path / "evals.db"), name="agent")


def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(TypeError, match="model"):
        Agent()  # type: ignore[call-arg]  # the class alone never stands for a configured agent
    with pytest.raises(ConfigurationError, match="instructions must be a string"):
        Agent(None, instructions=["be brief"])  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="tools must be a list of tools"):
        Agent(None, tools="word_count")
    with pytest.raises(ConfigurationError, match="max_steps must be a positive int"):
        Agent(None, max_steps=0)
    with pytest.raises(ConfigurationError, match="llm must be a model adapter"):
        Agent(ScriptedModel)  # type: ignore[arg-type]  # the class, not an instance
    with pytest.raises(ConfigurationError, match=r"unknown argument\(s\) \['depth'\]"):
        Agent(None).init_state("t", depth=3)


def test_describe_names_what_makes_the_agent_without_its_model() -> None:
    one = Agent(ScriptedModel([]), tools=[word_count], instructions="Be brief.")
    other = Agent(ScriptedModel([]), tools=[word_count], instructions="Be thorough.")
    assert one.describe()["tools"] == ["word_count"] and one.describe()["agent"] == "qitos.kit._agent:Agent"
    assert one.describe()["instructions_digest"] != other.describe()["instructions_digest"]
    assert one.describe()["tools_digest"] == other.describe()["tools_digest"]
