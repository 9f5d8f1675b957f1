"""What the agent and engine add to each model request: AgentModule(memory=), Engine(history_policy=)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from qitos import Action, AgentModule, Decision, Engine, StateSchema, tool
from qitos.core._errors import ConfigurationError
from qitos.core.memory import MemoryRecord
from qitos.engine._model_path import ModelContext
from qitos.kit.context.compaction import ClosedExchangeWindowCompactor
from qitos.kit.memory.adapter import MemorySourceAdapter
from qitos.kit.memory.markdown_file_memory import MarkdownFileMemory
from qitos.models._scripted import ScriptedModel


@tool
def note(text: str) -> str:
    """Store a note.

    Args:
        text: the note.
    """
    return "stored " + text * 20


@dataclass
class S(StateSchema):
    seen: list[str] = field(default_factory=list)


class ModelAgent(AgentModule[S, Any, Any]):
    tools = (note,)

    def init_state(self, task: str, **kwargs: Any) -> S:
        return S(task=task, max_steps=12)

    def reduce(self, state: S, observation: Any, decision: Decision[Any]) -> S:
        state.seen.extend(r.as_text() for r in observation.results)
        return state


def _memory(tmp_path: Path) -> MarkdownFileMemory:
    memory = MarkdownFileMemory(str(tmp_path / "memory.md"))
    memory.append(MemoryRecord(role="user", content="The user's name is Ada.", step_id=0, record_id="name"))
    return memory


def test_agent_memory_is_recalled_into_every_request(tmp_path: Path) -> None:
    memory = _memory(tmp_path)
    calls: list[str | dict[str, Any]] = [{"tool_calls": [{"name": "note", "arguments": {"text": "x"}}]}, "hello Ada"]
    model = ScriptedModel(calls)
    assert ModelAgent(model=model, memory=memory).run("greet me", trace=False) == "hello Ada"
    for view in model.requests:
        contents = "\n".join(str(m["content"]) for m in view.messages())
        assert "The user's name is Ada." in contents
        ids = [c["contribution_id"] for c in view.summary()["contributions"]["selected"]]
        assert ids == ["memory:agent:name"]
    memory.append(MemoryRecord(role="user", content="Ada likes tea.", step_id=0, record_id="tea"))
    model = ScriptedModel(["ok"])
    ModelAgent(model=model, memory=memory).run("again", trace=False)
    assert "Ada likes tea." in str(model.requests[0].messages())  # recalled fresh on every request


def test_a_memory_already_bound_by_the_composition_is_recalled_once(tmp_path: Path) -> None:
    memory = _memory(tmp_path)
    model = ScriptedModel(["ok"])
    adapter = MemorySourceAdapter(memory, namespace="notes")
    engine = Engine(ModelAgent(memory=memory), model=model, context=ModelContext(contributors=[adapter]))
    engine.run("t")
    ids = [c["contribution_id"] for c in model.requests[0].summary()["contributions"]["selected"]]
    assert ids == ["memory:notes:name"]


def test_history_policy_is_the_compaction_policy_of_the_model_path() -> None:
    calls: list[Any] = [{"tool_calls": [{"name": "note", "arguments": {"text": f"n{i}"}}]} for i in range(8)]

    def agent() -> ModelAgent:
        return ModelAgent(model=ScriptedModel([*calls, "done"], max_input_units=2_400))

    without = agent().run("take notes", trace=False, return_state=True)
    assert without.state.stop_reason == "context_budget_exceeded"
    result = agent().run("take notes", trace=False, return_state=True, history_policy=ClosedExchangeWindowCompactor())
    assert result.state.final_result == "done"
    assert any(r.request_view and r.request_view.get("receipts") for r in result.records)


def test_history_policy_that_is_not_a_compaction_policy_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="history_policy= must be a compaction policy"):
        Engine(ModelAgent(), history_policy={"max_messages": 24})  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="two compaction policies"):
        Engine(
            ModelAgent(),
            history_policy=ClosedExchangeWindowCompactor(),
            context=ModelContext(compaction_policy=ClosedExchangeWindowCompactor(policy_id="other")),
        )


def test_actions_are_unaffected_when_decide_never_asks_the_model(tmp_path: Path) -> None:
    class Direct(ModelAgent):
        def decide(self, state: S, observation: Any) -> Decision[Any]:
            if state.seen:
                return Decision.final("noted")
            return Decision.act([Action("note", {"text": "a"})])

    assert Direct(memory=_memory(tmp_path)).run("t", trace=False) == "noted"
