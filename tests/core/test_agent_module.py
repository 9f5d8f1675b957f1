"""AgentModule: its constructor parameters act or are refused; run() reports failures."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

import pytest
from rich.console import Console

from qitos import Action, AgentModule, Decision, StateSchema, compose, tool
from qitos.cli._render import LiveRenderer
from qitos.core._errors import ConfigurationError, RunFailedError
from qitos.kit.memory.markdown_file_memory import MarkdownFileMemory
from qitos.models._scripted import ScriptedModel


@dataclass
class NoteState(StateSchema):
    notes: list[str] = field(default_factory=list)
    reviewed: int = 0


class ModelAgent(AgentModule[NoteState, Any, Any]):
    """Every decision comes from the model (decide is not overridden)."""

    def init_state(self, task: str, **kwargs: Any) -> NoteState:
        return NoteState(task=task, notes=["buy milk", "call Ada"])

    def reduce(self, state: NoteState, observation: Any, decision: Decision[Any]) -> NoteState:
        return state


def test_the_default_prompt_is_the_readable_state() -> None:
    model = ScriptedModel(["two notes"])
    assert ModelAgent(llm=model).run("summarize my notes", trace=False) == "two notes"
    (user,) = [m for m in model.requests[0].messages() if m["role"] == "user"]
    assert user["content"] == "Task: summarize my notes\nNotes:\n- buy milk\n- call Ada\nReviewed: 0"
    assert "NoteState(" not in user["content"]


def test_a_failed_run_raises_with_its_result() -> None:
    agent = ModelAgent(llm=ScriptedModel([]))  # the model fails on its first request
    with pytest.raises(RunFailedError, match="ran out of responses") as caught:
        agent.run("anything", trace=False)
    error = caught.value
    assert error.stop_reason == "unrecoverable_error"
    assert error.result is not None and error.result.task_result.status == "failed"
    again = pickle.loads(pickle.dumps(error))
    assert (again.stop_reason, again.error, str(again)) == (error.stop_reason, error.error, str(error))
    result = ModelAgent(llm=ScriptedModel([])).run("anything", trace=False, return_state=True)
    assert result.task_result.status == "failed"  # return_state keeps returning the result


def test_history_is_refused_rather_than_ignored() -> None:
    with pytest.raises(ConfigurationError, match="history= is not supported"):
        ModelAgent(history=["earlier turn"])


def test_memory_must_be_a_memory(tmp_path: Any) -> None:
    with pytest.raises(ConfigurationError, match="retrieve"):
        ModelAgent(memory={"facts": 1})  # type: ignore[arg-type]
    assert ModelAgent(memory=MarkdownFileMemory(tmp_path / "m.md")).memory is not None


def test_theme_is_applied_to_the_renderer_or_refused() -> None:
    renderer = LiveRenderer(Console(record=True, width=100), live=False)
    ModelAgent(llm=ScriptedModel(["ok"])).run("t", trace=False, render=renderer, theme="mono")
    assert renderer.theme == "mono"
    with pytest.raises(ConfigurationError, match="unknown theme"):
        ModelAgent(llm=ScriptedModel(["ok"])).run("t", trace=False, render=renderer, theme="neon")
    with pytest.raises(ConfigurationError, match="no render= hook"):
        ModelAgent(llm=ScriptedModel(["ok"])).run("t", trace=False, theme="mono")


@tool
def shout(text: str) -> str:
    """Shout a text.

    Args:
        text: what to shout.
    """
    return text.upper()


class ShoutAgent(AgentModule[NoteState, Any, Any]):
    tools = (shout,)

    def init_state(self, task: str, **kwargs: Any) -> NoteState:
        return NoteState(task=task)

    def decide(self, state: NoteState, observation: Any) -> Decision[Any]:
        if state.notes:
            return Decision.final(state.notes[-1])
        return Decision.act([Action("shout", {"text": state.task})])

    def reduce(self, state: NoteState, observation: Any, decision: Decision[Any]) -> NoteState:
        state.notes.extend(r.as_text() for r in observation.results)
        return state


def test_a_class_declares_its_tools_so_compose_of_the_class_has_them() -> None:
    assert ShoutAgent().tool_registry.names() == ["shout"]
    session = compose(agent=ShoutAgent).session("hello")
    assert session.run().state.final_result == "HELLO"
    assert ShoutAgent(tool_registry=[]).tool_registry.names() == []  # an explicit registry wins
    with pytest.raises(ConfigurationError, match="tool_registry"):
        ShoutAgent(tool_registry="shout")
