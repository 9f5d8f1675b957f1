"""Fan-out: a branch decision's candidates explored in forked child sessions, the selector choosing
among their outcomes (real SQLite)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import driven
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.core._agent_module import AgentModule
from qitos.core._decision import Action, Decision, Observation
from qitos.core._errors import ConfigurationError
from qitos.core._state import StateSchema
from qitos.core._tool import ToolRegistry, tool
from qitos.engine._engine import Engine
from qitos.engine._fanout import CandidateOutcome, FanoutSelector
from qitos.engine._subagent import FanoutRequest
from qitos.sessions._step_journal import restore as restore_chain
from qitos.viewer._data import lineage

pytestmark = pytest.mark.usefixtures("driver")

CALLS: list[int] = []


@dataclass
class ScoreState(StateSchema):
    """The score so far and the values added."""

    score: int = 0
    added: list[int] = field(default_factory=list)


@tool(idempotent=True)
def score(value: int) -> int:
    """Score a candidate (records the call).

    Args:
        value: the value.
    """
    CALLS.append(value)
    return value


class Explorer(AgentModule[ScoreState, Observation, Action]):
    """Step 0 branches into three candidates; later steps answer with the score."""

    def __init__(self) -> None:
        super().__init__(tool_registry=ToolRegistry([score]))

    def init_state(self, task: str, **kwargs: Any) -> ScoreState:
        return ScoreState(task=task, max_steps=5)

    def decide(self, state: ScoreState, observation: Observation) -> Decision[Any]:
        if state.current_step == 0:
            return Decision.branch(
                [Decision.act([Action(name="score", args={"value": v}, id=f"v{v}")]) for v in (2, 7, 4)]
            )
        return Decision.final(f"score {state.score}")

    def reduce(self, state: ScoreState, observation: Observation, decision: Decision[Any]) -> ScoreState:
        for result in observation.results:
            state.score += int(result.output)
            state.added = [*state.added, int(result.output)]
        return state


def best(outcomes: Sequence[CandidateOutcome], state: Any) -> int:
    return max(range(len(outcomes)), key=lambda i: outcomes[i].state.score)


def test_each_candidate_runs_in_a_fork_and_the_best_outcome_is_kept(tmp_path: Path) -> None:
    CALLS.clear()
    store = SqliteCheckpointStore(str(tmp_path / "s.db"))
    session = Engine(Explorer(), checkpoint_store=store, search=FanoutSelector(best)).session("explore")
    result = driven.run(session)
    assert result.state.final_result == "score 7"
    assert result.state.added == [7]
    fanout = next(e.payload for e in result.events if e.event_type.value == "fanout")
    assert fanout["candidates"] == 3 and fanout["chosen"] == 1
    children = fanout["child_session_ids"]
    assert len(set(children)) == 3
    assert CALLS == [2, 7, 4, 7]  # three explorations, then the chosen candidate in the session
    for child_id, value in zip(children, (2, 7, 4), strict=True):
        head = store.get_session_head(child_id)
        assert head is not None and head.metadata["parent_session_id"] == session.session_id.value
        assert restore_chain(store, child_id, head.snapshot_id).state_data["score"] == value
    tree = lineage(store, session.session_id.value)
    assert sorted(c["session_id"] for c in tree["children"]) == sorted(children)
    assert {c["relation"] for c in tree["children"]} == {"fork"}


@dataclass
class _JournalIds:
    """What a fan-out reads from a durable journal: the store and the session id."""

    store: SqliteCheckpointStore
    session_id: str


def test_exploring_the_same_step_again_finds_the_same_children_and_reruns_nothing(tmp_path: Path) -> None:
    CALLS.clear()
    store = SqliteCheckpointStore(str(tmp_path / "s.db"))
    agent = Explorer()
    session = Engine(agent, checkpoint_store=store).session("explore")
    branch = agent.decide(agent.init_state("explore"), Observation())
    selector = FanoutSelector(best)
    request = FanoutRequest(
        journal=_JournalIds(store, session.session_id.value),
        step_id=0,
        candidates=tuple(branch.candidates),
        agent=agent,
        model=None,
        state=agent.init_state("explore"),
    )
    first = selector.run_fanout(request)
    again = selector.run_fanout(request)  # as a restore of the session would
    assert first == again
    assert first[0] == 1
    assert CALLS == [2, 7, 4]  # each candidate explored once
    assert len(store.list_sessions()) == 4


def test_a_plain_run_cannot_fan_out() -> None:
    with pytest.raises(ConfigurationError, match="durable session"):
        Engine(Explorer(), search=FanoutSelector(best)).run("explore")


def test_steps_must_be_positive_and_choose_must_return_an_index(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="steps"):
        FanoutSelector(best, steps=0)
    store = SqliteCheckpointStore(str(tmp_path / "s.db"))
    session = Engine(Explorer(), checkpoint_store=store, search=FanoutSelector(lambda o, s: 9)).session("x")
    with pytest.raises(ConfigurationError, match="not an index below 3"):
        driven.run(session)
