"""The documented code examples and signatures of the core API (State and Task; AgentModule, Engine,
AsyncEngine), run as written."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qitos import (
    Action,
    AgentModule,
    AsyncEngine,
    Decision,
    Engine,
    EngineResult,
    StateSchema,
    StopReason,
    Task,
    TaskBudget,
    TaskResource,
    ToolRegistry,
    tool,
)
from qitos.engine._events import EngineEvent, EngineEventType, EventStream
from qitos.models._scripted import ScriptedModel

# --------------------------------------------------------------------------- state and task


@dataclass
class ResearchState(StateSchema):
    scratchpad: list[str] = field(default_factory=list)
    sources_visited: list[str] = field(default_factory=list)
    confidence: float = 0.0


@tool
def read_file(path: str) -> str:
    """Read a file of the workspace."""
    return Path(path).read_text(encoding="utf-8") if Path(path).exists() else f"(no file {path})"


class ResearchAgent(AgentModule[ResearchState, Any, Any]):
    """The seed's research agent: reads, then answers; stops itself with set_stop when told to."""

    def init_state(self, task: str, **kwargs: Any) -> ResearchState:
        return ResearchState(
            task=task,
            max_steps=int(kwargs.get("max_steps", 20)),
        )

    def decide(self, state: ResearchState, observation: Any) -> Decision[Any] | None:
        if not state.sources_visited:
            return Decision.act(
                actions=[Action(name="read_file", args={"path": "paper.pdf"})],
                rationale="Need to read the file before summarizing.",
            )
        return Decision.wait(rationale="Waiting for environment to reset.")

    def reduce(self, state: ResearchState, observation: Any, decision: Decision[Any]) -> ResearchState:
        some_terminal_condition = bool(state.sources_visited)
        for action in decision.actions:
            state.sources_visited.append(action.args["path"])
            state.scratchpad.extend(observation.outputs)
        if some_terminal_condition:
            state.set_stop(StopReason.MAX_STEPS_REACHED, final_result="Done.")
        return state


def test_research_state_subclass_and_init_state_kwargs() -> None:
    agent = ResearchAgent(tool_registry=ToolRegistry([read_file]))
    state = agent.init_state("Summarize", max_steps=7)
    assert isinstance(state, ResearchState) and state.task == "Summarize" and state.max_steps == 7
    assert agent.init_state("x").max_steps == 20
    assert state.to_dict()["scratchpad"] == [] and "confidence" in state.to_dict()


def test_set_stop_in_reduce_ends_the_run_at_the_next_stop_check() -> None:
    agent = ResearchAgent(tool_registry=ToolRegistry([read_file]))
    result = agent.run("Summarize the findings in paper.pdf", return_state=True, trace=False)
    assert result.state.stop_reason == "max_steps_reached" and result.state.final_result == "Done."
    assert result.step_count == 2 and result.state.sources_visited == ["paper.pdf"]


def test_setting_final_result_directly_completes_the_run() -> None:
    class Answer(ResearchAgent):
        def reduce(self, state: ResearchState, observation: Any, decision: Decision[Any]) -> ResearchState:
            state.final_result = "The answer is 42."
            return state

    assert Answer(tool_registry=ToolRegistry([read_file])).run("q", trace=False) == "The answer is 42."


def test_the_seed_task_runs_with_agent_run(tmp_path: Path) -> None:
    task = Task(
        id="research-001",
        objective="Summarize the findings in paper.pdf",
        resources=[
            TaskResource(kind="file", path="paper.pdf", required=True),
        ],
        budget=TaskBudget(max_steps=25, max_runtime_seconds=300.0),
        success_criteria=["Summary covers abstract, methods, and conclusions"],
        constraints={"output_format": "markdown"},
    )
    agent = ResearchAgent(tool_registry=ToolRegistry([read_file]))
    missing = agent.run(task, return_state=True, trace=False, workspace=str(tmp_path))
    assert missing.state.stop_reason == "task_validation_failed" and missing.step_count == 0
    assert "paper.pdf" in (missing.task_result.error or "")

    (tmp_path / "paper.pdf").write_text("attention")
    result = agent.run(task, return_state=True, trace=False, workspace=str(tmp_path))
    assert isinstance(result, EngineResult)
    assert result.state.final_result == "Done." and result.state.max_steps == 25
    assert result.task_result is not None and result.task_result.task_id == "research-001"
    assert result.task_result.success_criteria == ("Summary covers abstract, methods, and conclusions",)


def test_task_budget_and_resource_examples() -> None:
    budget = TaskBudget(
        max_steps=30,
        max_runtime_seconds=180.0,
        max_tokens=100_000,
    )
    resources = [
        TaskResource(kind="file", path="data/corpus.txt", required=True),
        TaskResource(kind="dir", path="output/", required=False),
        TaskResource(kind="url", uri="https://arxiv.org/abs/2501.12345", required=True),
        TaskResource(kind="artifact", path="runs/agent_20260407/steps.jsonl"),
    ]
    assert budget.max_tokens == 100_000 and len(resources) == 4


def test_the_four_decision_factories() -> None:
    act: Decision[Action] = Decision.act(
        actions=[Action(name="read_file", args={"path": "paper.pdf"})],
        rationale="Need to read the file before summarizing.",
    )
    final: Decision[Action] = Decision.final(
        answer="The paper proposes a novel attention mechanism that reduces memory usage by 40%.",
        rationale="Finished reading all sections.",
    )
    wait: Decision[Action] = Decision.wait(rationale="Waiting for environment to reset.")
    branch: Decision[Action] = Decision.branch(
        candidates=[
            Decision.act([Action(name="search", args={"query": "attention mechanism"})]),
            Decision.act([Action(name="read_file", args={"path": "intro.txt"})]),
        ],
        rationale="Exploring two strategies in parallel.",
    )
    assert [d.mode for d in (act, final, wait, branch)] == ["act", "final", "wait", "branch"]


# --------------------------------------------------------------------------- agent and engine


def test_agent_module_constructor_matches_the_seed() -> None:
    params = inspect.signature(AgentModule.__init__).parameters
    assert list(params) == ["self", "tool_registry", "llm", "model_parser", "memory", "history", "config"]
    assert all(params[n].default is None for n in ("tool_registry", "llm", "model_parser", "memory", "history"))
    assert params["config"].kind is inspect.Parameter.VAR_KEYWORD
    model = ScriptedModel(["ok"])
    agent = ResearchAgent(llm=model, temperature=0.2, persona="careful")
    assert agent.config == {"temperature": 0.2, "persona": "careful"} and agent.llm is model
    assert isinstance(agent.tool_registry, ToolRegistry) and len(agent.tool_registry) == 0


def test_only_init_state_and_reduce_are_required_and_optional_hooks_have_seed_defaults() -> None:
    assert AgentModule.__abstractmethods__ == frozenset({"init_state", "reduce"})

    class Minimal(AgentModule[StateSchema, Any, Any]):
        def init_state(self, task: str, **kwargs: Any) -> StateSchema:
            return StateSchema(task=task)

        def reduce(self, state: StateSchema, observation: Any, decision: Decision[Any]) -> StateSchema:
            return state

    agent = Minimal()
    state = agent.init_state("t")
    assert agent.build_system_prompt(state) is None
    assert agent.prepare(state) == str(state)
    assert agent.decide(state, None) is None
    assert agent.should_stop(state) is False


SEED_RUN_PARAMETERS = [
    ("task", inspect.Parameter.empty),
    ("return_state", False),
    ("hooks", None),
    ("render_hooks", None),
    ("engine_kwargs", None),
    ("workspace", None),
    ("max_steps", None),
    ("env", None),
    ("parser", None),
    ("search", None),
    ("critics", None),
    ("stop_criteria", None),
    ("history_policy", None),
    ("trace", None),
    ("render", None),
    ("trace_logdir", "./runs"),
    ("trace_prefix", None),
    ("theme", "research"),
]


# Parameters qitos adds after the documented ones, in order: otel, progress.
ADDED_RUN_PARAMETERS = [("otel", None), ("progress", False)]


def test_agent_run_signature_matches_the_seed() -> None:
    params = list(inspect.signature(AgentModule.run).parameters.values())
    assert [(p.name, p.default) for p in params[1:-1]] == SEED_RUN_PARAMETERS + ADDED_RUN_PARAMETERS
    assert params[-1].name == "state_kwargs" and params[-1].kind is inspect.Parameter.VAR_KEYWORD


def test_agent_run_returns_final_result_or_the_engine_result(tmp_path: Path) -> None:
    class Quick(ResearchAgent):
        def decide(self, state: ResearchState, observation: Any) -> Decision[Any] | None:
            return Decision.final("summary")

    agent = Quick()
    assert agent.run("t", trace_logdir=str(tmp_path)) == "summary"
    result = agent.run("t", return_state=True, trace_logdir=str(tmp_path))
    assert isinstance(result, EngineResult) and result.state.final_result == "summary"


def test_agent_run_passes_hooks_render_hooks_render_and_theme() -> None:
    seen: dict[str, list[str]] = {"hooks": [], "render_hooks": [], "render": []}

    class Collect:
        theme = "plain"

        def __init__(self, key: str) -> None:
            self.key = key

        def on_event(self, event: EngineEvent) -> None:
            seen[self.key].append(event.event_type.value)

    render = Collect("render")

    class Quick(ResearchAgent):
        def decide(self, state: ResearchState, observation: Any) -> Decision[Any] | None:
            return Decision.final("ok")

    Quick().run(
        "t", hooks=[Collect("hooks")], render_hooks=[Collect("render_hooks")], render=render, theme="dark", trace=False
    )
    assert seen["hooks"][0] == seen["render_hooks"][0] == seen["render"][0] == "run_start"
    assert seen["hooks"][-1] == "run_end"
    assert render.theme == "dark"


def test_agent_run_engine_kwargs_reach_the_engine() -> None:
    from qitos.engine.runtime import RuntimeBudget

    result = ResearchAgent(tool_registry=ToolRegistry([read_file])).run(
        "t", return_state=True, trace=False, engine_kwargs={"budget": RuntimeBudget(max_steps=1)}
    )
    assert result.step_count == 1 and result.state.stop_reason == "max_steps_reached"


def test_engine_takes_the_seed_constructor_arguments() -> None:
    params = inspect.signature(Engine.__init__).parameters
    for name in (
        "agent",
        "budget",
        "parser",
        "stop_criteria",
        "critics",
        "env",
        "history_policy",
        "trace_writer",
        "hooks",
    ):
        assert name in params, name
    result = Engine(ResearchAgent(tool_registry=ToolRegistry([read_file]))).run("t")
    assert isinstance(result, EngineResult)


def test_engine_result_fields_match_the_seed() -> None:
    fields = [(f.name, f.default) for f in dataclasses.fields(EngineResult)][:5]
    assert [name for name, _ in fields] == ["state", "records", "events", "step_count", "task_result"]
    assert fields[4][1] is None


def test_async_engine_seed_surface() -> None:
    agent = ResearchAgent(tool_registry=ToolRegistry([read_file]))
    async_engine = AsyncEngine(agent)
    assert async_engine.engine.agent is agent and async_engine.agent is agent
    assert async_engine.event_stream is None

    async def main() -> tuple[EngineResult[Any], list[EngineEvent]]:
        result = await async_engine.arun("t")
        events = [event async for event in async_engine.arun_stream("t")]
        return result, events

    result, events = asyncio.run(main())
    assert result.state.final_result == "Done."
    assert events[0].event_type is EngineEventType.RUN_START and events[-1].event_type is EngineEventType.RUN_END
    assert async_engine.run("t").state.final_result == "Done."


def test_engine_event_seed_fields() -> None:
    event = EngineEvent(EngineEventType.STEP_START)
    assert (event.step_id, event.agent_id, event.phase, event.ok, event.payload, event.error) == (
        0,
        None,
        None,
        True,
        {},
        None,
    )
    assert isinstance(event.ts, str) and event.ts[:4].isdigit()
    assert event.to_dict()["ts"] == event.ts


def test_event_stream_seed_methods() -> None:
    for name in ("emit", "emit_sync", "close", "__aiter__", "subscribe"):
        assert callable(getattr(EventStream, name)), name

    async def main() -> list[str]:
        stream = EventStream()
        queue = stream.subscribe()
        assert isinstance(queue, asyncio.Queue)
        stream.emit(EngineEvent(EngineEventType.RUN_START))
        stream.emit_sync(EngineEvent(EngineEventType.RUN_END))
        stream.close()
        out = []
        while (item := await queue.get()) is not None:
            out.append(item.event_type.value)
        return out

    assert asyncio.run(main()) == ["run_start", "run_end"]


def test_cancelled_immediate_is_a_stop_reason_with_the_seed_value() -> None:
    assert StopReason.CANCELLED_IMMEDIATE.value == "cancelled_immediate"
