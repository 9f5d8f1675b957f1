"""Names sessions and evals recorded before a module became private keep loading: the agent a
session records (``agent``, ``agent_ref``), its state type, and the agent an eval pins."""

from __future__ import annotations

import importlib

import pytest

from qitos import Agent, Engine, StateSchema
from qitos.cli._agents import load_agent
from qitos.demo import NotesAgent, NotesState
from qitos.engine import Team
from qitos.engine._agent_ref import MOVED_MODULES, import_recorded
from qitos.engine.session_runtime import _resolve_state_type, _state_type_name
from qitos.eval._runner import agent_reference


@pytest.mark.parametrize(("old", "new"), sorted(MOVED_MODULES.items()))
def test_a_moved_module_loads_from_its_old_name_and_leaves_no_module_behind(old: str, new: str) -> None:
    assert import_recorded(old) is importlib.import_module(new)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


def test_the_table_names_where_qitos_own_agents_and_states_live_now() -> None:
    assert {cls.__module__ for cls in (StateSchema, NotesAgent, NotesState, Agent, Team)} <= set(MOVED_MODULES.values())


def test_a_session_recorded_with_the_demo_agents_old_path_loads_its_agent() -> None:
    assert load_agent("qitos.demo.notes_agent:NotesAgent") is NotesAgent


def test_a_session_recorded_with_an_old_state_type_path_restores_that_type() -> None:
    engine = Engine(NotesAgent())
    assert _resolve_state_type("qitos.demo.notes_agent:NotesState", engine) is NotesState
    assert _resolve_state_type("qitos.core.state:StateSchema", engine) is StateSchema
    # new sessions record where the class lives now, which loads the same way
    assert _resolve_state_type(_state_type_name(NotesState), engine) is NotesState


def test_an_eval_pins_a_moved_agent_by_the_name_earlier_evals_pinned() -> None:
    assert agent_reference(NotesAgent) == "qitos.demo.notes_agent:NotesAgent"
    assert agent_reference(NotesAgent()) == "qitos.demo.notes_agent:NotesAgent"
    assert load_agent(agent_reference(NotesAgent)) is NotesAgent
