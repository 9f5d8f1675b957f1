"""Steering reaches the agent exactly once, also when the boundary that saw it stops.

A steering item counts as consumed only when it is handed to ``decide``: a boundary that stops for a
pause request, a lifecycle pause or a budget leaves it for the next run. Real SQLite files; every
test runs through both drivers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import driven
import session_agents as sa
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.engine._composition import Composition, compose
from qitos.engine.runtime import LifecyclePolicy, RuntimeBudget, RuntimeSnapshotContext

pytestmark = pytest.mark.usefixtures("driver")  # each test runs through both drivers


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "sessions.db")


@pytest.fixture
def side(tmp_path: Path) -> str:
    return str(tmp_path / "side.log")


def _steer_events(result: Any) -> list[str]:
    return [e.payload["text"] for e in result.events if e.event_type.value == "steer"]


def _composition(db: str, side: str, **kwargs: Any) -> Composition:
    return compose(agent=lambda: sa.NotesAgent(side), store=SqliteCheckpointStore(db), **kwargs)


def test_steering_then_a_pause_request_delivers_the_text_on_the_next_run_once(db: str, side: str) -> None:
    composition = _composition(db, side)
    session = composition.session("Index notes", target=3)
    session.steer("X")
    session.pause()

    paused = driven.run(session)
    assert paused.state.stop_reason == "paused" and paused.step_count == 0
    assert paused.state.steering_seen == [] and _steer_events(paused) == []

    resumed = driven.run(composition.restore(session.session_id.value))
    assert resumed.state.stop_reason == "final"  # the pause request was consumed by the first stop
    assert resumed.state.steering_seen == ["X"] and _steer_events(resumed) == ["X"]
    again = driven.run(composition.restore(session.session_id.value))
    assert again.state.steering_seen == ["X"] and _steer_events(again) == []


def test_steering_seen_at_a_budget_stop_waits_for_the_run_that_proceeds(db: str, side: str) -> None:
    tight = _composition(db, side, budget=RuntimeBudget(max_steps=2))
    session = tight.session("Index notes", target=4)
    first = driven.run(session)
    assert first.state.stop_reason == "max_steps_reached" and first.step_count == 2

    session.steer("X")
    stopped = driven.run(tight.restore(session.session_id.value))
    assert stopped.state.stop_reason == "max_steps_reached" and stopped.state.steering_seen == []

    roomy = _composition(db, side, budget=RuntimeBudget(max_steps=20))
    finished = driven.run(roomy.restore(session.session_id.value))
    assert finished.state.stop_reason == "final"
    assert finished.state.steering_seen == ["X"] and _steer_events(finished) == ["X"]


class PauseWhile(LifecyclePolicy):
    """Pause at every boundary while ``holding`` is set."""

    policy_id = "tests.pause_while/v1"

    def __init__(self) -> None:
        self.holding = True

    def should_pause(self, context: RuntimeSnapshotContext) -> bool:
        return self.holding and context.phase == "boundary"


def test_steering_seen_at_a_lifecycle_pause_is_delivered_when_the_policy_lets_the_run_go_on(db: str, side: str) -> None:
    policy = PauseWhile()
    composition = _composition(db, side, extensions={"policy": policy}, lifecycle={"provider": "policy"})
    session = composition.session("Index notes", target=2)
    session.steer("X")

    held = driven.run(session)
    assert held.state.stop_reason == "paused" and held.state.steering_seen == []
    held_again = driven.run(composition.restore(session.session_id.value))
    assert held_again.state.stop_reason == "paused" and held_again.state.steering_seen == []

    policy.holding = False
    released = driven.run(composition.restore(session.session_id.value))
    assert released.state.stop_reason == "final"
    assert released.state.steering_seen == ["X"] and _steer_events(released) == ["X"]


def test_a_finished_session_steered_and_paused_sees_the_text_once_when_resumed(db: str, side: str) -> None:
    composition = _composition(db, side)
    session = composition.session("Index notes", target=2)
    assert driven.run(session).state.stop_reason == "final"

    session.steer("one more thing")
    session.pause()
    paused = driven.run(composition.restore(session.session_id.value))
    assert paused.state.stop_reason == "paused" and paused.state.steering_seen == []

    resumed = driven.run(composition.restore(session.session_id.value))
    assert resumed.state.stop_reason == "final"
    assert resumed.state.steering_seen == ["one more thing"]
    assert _steer_events(resumed) == ["one more thing"]
