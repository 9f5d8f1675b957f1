"""Handoff: the conversation moves to another agent on the same exchange log, with a loop guard,
durably (a restored session continues under the agent it was handed to)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import driven
import session_agents as sa
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.core._agent_module import AgentModule
from qitos.core._decision import Action, Decision, Observation
from qitos.core._errors import ConfigurationError
from qitos.core._tool import ToolRegistry, tool
from qitos.engine._engine import Engine
from qitos.engine._handoff import Team, TeamState
from qitos.engine.session_runtime import restore_session
from qitos.models._scripted import ScriptedModel

pytestmark = pytest.mark.usefixtures("driver")


@dataclass
class DeskState(TeamState):
    """Which member decided each step, and what the tools said."""

    deciders: list[str] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)


@tool
def look_up(query: str) -> str:
    """Look something up.

    Args:
        query: what.
    """
    return f"found {query}"


@tool
def refund(order: str) -> str:
    """Refund an order.

    Args:
        order: the order id.
    """
    return f"refunded {order}"


class Member(AgentModule[DeskState, Observation, Action]):
    """A member with a script of decisions (by its own step count); None: the model path."""

    def __init__(self, name: str, tools: list[Any], script: list[Decision[Any] | None] | None = None) -> None:
        super().__init__(tool_registry=ToolRegistry(tools))
        self.name = name
        self.script = script

    def init_state(self, task: str, **kwargs: Any) -> DeskState:
        return DeskState(task=task, max_steps=10)

    def build_system_prompt(self, state: DeskState) -> str | None:
        return f"You are the {self.name} agent."

    def decide(self, state: DeskState, observation: Observation) -> Decision[Any] | None:
        state.deciders = [*state.deciders, self.name]
        if self.script is None:
            return None
        mine = sum(1 for d in state.deciders if d == self.name) - 1
        return self.script[mine]

    def reduce(self, state: DeskState, observation: Observation, decision: Decision[Any]) -> DeskState:
        state.seen = [*state.seen, *(r.as_text() for r in observation.results)]
        return state


def _scripted_team() -> Team:
    triage = Member("triage", [look_up], [Decision.act([Action(name="transfer_to_billing", args={}, id="h1")])])
    billing = Member(
        "billing",
        [refund],
        [
            Decision.act([Action(name="transfer_to_triage", args={}, id="h2")]),  # straight back: refused
            Decision.act([Action(name="refund", args={"order": "42"}, id="r1")]),
            Decision.final("refunded 42"),
        ],
    )
    return Team({"triage": triage, "billing": billing}, first="triage")


def test_a_handoff_survives_a_restore_and_ping_pong_is_refused(tmp_path: Path) -> None:
    store = SqliteCheckpointStore(str(tmp_path / "s.db"))
    engine = Engine(_scripted_team(), checkpoint_store=store, lifecycle=sa.PauseAtStep(1))
    session = engine.session("refund order 42")
    first = driven.run(session)
    assert first.state.stop_reason == "paused"
    handoffs = [e.payload for e in first.events if e.event_type.value == "handoff"]
    assert handoffs == [{"from": "triage", "to": "billing", "call_id": "h1"}]
    # Another engine and team (as in another process): the session goes on under billing.
    restored = restore_session(Engine(_scripted_team(), checkpoint_store=store), session.session_id.value)
    done = driven.run(restored)
    state = done.state
    assert state.final_result == "refunded 42"
    assert state.active_agent == "billing"
    assert state.deciders == ["triage", "billing", "billing", "billing"]
    assert [h["to"] for h in state.handoffs] == ["billing"]
    assert any("just handed the conversation" in s for s in state.seen)
    assert "refunded 42" in state.seen
    assert not [e for e in done.events if e.event_type.value == "handoff"]


def test_the_exchange_log_continues_under_the_new_agents_instructions_and_tools() -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "transfer_to_billing", "arguments": {"reason": "billing question"}}]},
            {"tool_calls": [{"name": "refund", "arguments": {"order": "7"}}]},
            "Refunded order 7.",
        ]
    )
    team = Team(
        {"triage": Member("triage", [look_up]), "billing": Member("billing", [refund])}, first="triage", llm=model
    )
    result = driven.run(Engine(team), "refund order 7")
    assert result.state.final_result == "Refunded order 7."
    first, second, third = model.requests
    assert "You are the triage agent." in str(first.messages())
    assert [t["name"] for t in first.tools()] == ["look_up", "transfer_to_billing"]
    assert "You are the billing agent." in str(second.messages())
    assert [t["name"] for t in second.tools()] == ["refund", "transfer_to_triage"]
    # The same log: the billing agent's request still holds the user's task and the handoff call.
    assert "refund order 7" in str(second.messages())
    assert "transfer_to_billing" in str(second.messages())
    assert "refunded 7" in str(third.messages())


def test_max_handoffs_stops_a_loop() -> None:
    bounce: list[Decision[Action]] = [
        Decision.act([Action(name="transfer_to_b", args={}, id=f"x{i}")]) for i in range(3)
    ]
    back: list[Decision[Action]] = [
        Decision.act([Action(name="look_up", args={"query": "q"}, id=f"l{i}")]) for i in range(3)
    ]
    a = Member("a", [look_up], [bounce[0], bounce[1], bounce[2], Decision.final("a gave up")])
    b = Member(
        "b",
        [look_up],
        [
            back[0],
            Decision.act([Action(name="transfer_to_a", args={}, id="y0")]),
            back[1],
            Decision.act([Action(name="transfer_to_a", args={}, id="y1")]),
        ],
    )
    team = Team({"a": a, "b": b}, first="a", max_handoffs=2)
    result = driven.run(Engine(team), "bounce")
    state = result.state
    assert [h["to"] for h in state.handoffs] == ["b", "a"]
    assert sum("no more handoffs" in s for s in state.seen) == 2
    assert state.final_result == "a gave up"


def test_a_team_refuses_a_first_member_it_does_not_have() -> None:
    with pytest.raises(ConfigurationError, match="not a member"):
        Team({"a": Member("a", [])}, first="b")
