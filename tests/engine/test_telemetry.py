"""OpenTelemetry spans of real engine runs, read back from the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode, format_span_id, format_trace_id

from qitos import AgentModule, AsyncEngine, Decision, Engine, StateSchema, ToolRegistry, tool
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.core._errors import ConfigurationError, ModelError
from qitos.core._install import install_command
from qitos.demo._notes_agent import NotesAgent, prepare_workspace, scripted_model_responses
from qitos.engine._composition import compose
from qitos.engine._events import EngineEventType
from qitos.engine._hooks import EngineHook
from qitos.engine._model_path import ModelContext
from qitos.engine._telemetry import OtelHook, OtelSettings, otel_settings
from qitos.kit.context.compaction import ClosedExchangeWindowCompactor
from qitos.models._scripted import FunctionModel, ScriptedModel
from qitos.sessions._payload import SnapshotPayload


@dataclass
class Traced:
    """A tracer provider whose finished spans can be read back."""

    provider: TracerProvider
    exporter: InMemorySpanExporter

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name.startswith(prefix)]

    def one(self, prefix: str) -> ReadableSpan:
        (span,) = self.named(prefix)
        return span


def _traced() -> Traced:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Traced(provider, exporter)


@pytest.fixture
def traced() -> Iterator[Traced]:
    t = _traced()
    yield t
    t.provider.shutdown()


def _parent(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def _id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool
def leak() -> str:
    """Return a text with secrets in it."""
    return "token sk-abcdefghijklmnop and hunter2-value"


@dataclass
class NoteState(StateSchema):
    notes: list[str] = field(default_factory=list)


class ModelAgent(AgentModule[NoteState, Any, Any]):
    """Decides through the model path only; keeps each tool output."""

    def __init__(self, *tools: Any, llm: Any = None) -> None:
        super().__init__(tool_registry=ToolRegistry(list(tools) or [add]), llm=llm)

    def init_state(self, task: str, **kwargs: Any) -> NoteState:
        return NoteState(task=task, max_steps=6)

    def reduce(self, state: NoteState, observation: Any, decision: Decision[Any]) -> NoteState:
        for result in getattr(observation, "results", ()):
            state.notes.append(result.as_text())
        return state


ADD_CALL = {
    "tool_calls": [{"id": "call-add", "name": "add", "arguments": {"a": 2, "b": 3}}],
    "usage": {"input_tokens": 40, "output_tokens": 7},
    "finish_reason": "tool_calls",
}
FINAL = {"text": "The sum is 5.", "usage": {"input_tokens": 60, "output_tokens": 5}, "finish_reason": "stop"}


def test_a_tool_calling_model_run_is_one_agent_span_with_step_chat_and_tool_spans(traced: Traced) -> None:
    model = ScriptedModel([ADD_CALL, FINAL])
    result = Engine(ModelAgent(llm=model), otel=traced.provider).run("Add 2 and 3")
    assert result.state.final_result == "The sum is 5."

    run = traced.one("invoke_agent")
    assert run.name == "invoke_agent ModelAgent" and run.parent is None
    attrs = dict(run.attributes or {})
    assert attrs["gen_ai.operation.name"] == "invoke_agent"
    assert attrs["gen_ai.agent.name"] == "ModelAgent"
    assert attrs["qitos.run.id"] == result.run_id
    assert attrs["qitos.stop_reason"] == "final" and attrs["qitos.status"] == "completed"
    assert attrs["gen_ai.usage.input_tokens"] == 100 and attrs["gen_ai.usage.output_tokens"] == 12
    assert "qitos.session.id" not in attrs  # a plain run has no session

    steps = sorted(traced.named("qitos.step"), key=lambda s: s.start_time or 0)
    assert [dict(s.attributes or {})["qitos.step.id"] for s in steps] == [0, 1]
    assert all(_parent(s) == _id(run) for s in steps)
    assert dict(steps[0].attributes or {})["qitos.decision.mode"] == "act"
    assert dict(steps[1].attributes or {})["qitos.stop_reason"] == "final"

    chats = sorted(traced.named("chat"), key=lambda s: s.start_time or 0)
    assert [c.name for c in chats] == ["chat scripted", "chat scripted"]
    assert [_parent(c) for c in chats] == [_id(steps[0]), _id(steps[1])]
    first = dict(chats[0].attributes or {})
    assert first["gen_ai.operation.name"] == "chat"
    assert first["gen_ai.system"] == first["gen_ai.provider.name"] == "scripted"
    assert first["gen_ai.request.model"] == "scripted" and first["gen_ai.response.model"] == "scripted"
    assert first["gen_ai.usage.input_tokens"] == 40 and first["gen_ai.usage.output_tokens"] == 7
    assert first["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert first["qitos.request.id"] == result.records[0].model["request_id"]  # type: ignore[index]
    assert dict(chats[1].attributes or {})["gen_ai.response.finish_reasons"] == ("stop",)

    tool_span = traced.one("execute_tool")
    assert tool_span.name == "execute_tool add" and _parent(tool_span) == _id(steps[0])
    tool_attrs = dict(tool_span.attributes or {})
    assert tool_attrs["gen_ai.operation.name"] == "execute_tool"
    assert tool_attrs["gen_ai.tool.name"] == "add" and tool_attrs["gen_ai.tool.call.id"] == "call-add"
    assert tool_span.status.status_code is StatusCode.UNSET
    # Nested in time: the tool ran after the model answered and inside its step.
    assert chats[0].end_time is not None and tool_span.start_time is not None and tool_span.end_time is not None
    assert steps[0].start_time is not None and steps[0].end_time is not None
    assert steps[0].start_time <= chats[0].start_time <= chats[0].end_time <= tool_span.start_time  # type: ignore[operator]
    assert tool_span.end_time <= steps[0].end_time <= run.end_time  # type: ignore[operator]
    assert len({s.context.trace_id for s in traced.spans() if s.context}) == 1

    # Without opting in, no content: no prompt, reply, arguments or results.
    every = {key for s in traced.spans() for key in (s.attributes or {})}
    assert not every & {"gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.tool.call.arguments"}


def test_content_is_recorded_only_on_opt_in_and_then_redacted(traced: Traced) -> None:
    call = {"tool_calls": [{"id": "c1", "name": "leak", "arguments": {}}]}
    model = ScriptedModel([call, "done, key was hunter2-value"])
    settings = OtelSettings(tracer_provider=traced.provider, capture_content=True, secrets=("hunter2-value",))
    Engine(ModelAgent(leak, llm=model), otel=settings).run("Find the key")

    assert dict(traced.one("invoke_agent").attributes or {})["qitos.task"] == "Find the key"
    first, second = sorted(traced.named("chat"), key=lambda s: s.start_time or 0)
    prompt = str(dict(first.attributes or {})["gen_ai.input.messages"])
    assert '"role": "user"' in prompt and "Find the key" in prompt and '"parts"' in prompt
    reply = str(dict(first.attributes or {})["gen_ai.output.messages"])
    assert '"type": "tool_call"' in reply and '"name": "leak"' in reply
    # The tool result reached the second prompt; secrets never reach a span.
    second_prompt = str(dict(second.attributes or {})["gen_ai.input.messages"])
    assert "tool_call_response" in second_prompt and "[REDACTED]" in second_prompt
    tool_attrs = dict(traced.one("execute_tool").attributes or {})
    assert tool_attrs["gen_ai.tool.call.arguments"] == "{}"
    assert tool_attrs["gen_ai.tool.call.result"] == "token [REDACTED] and [REDACTED]"
    for span in traced.spans():
        for value in (span.attributes or {}).values():
            assert "hunter2-value" not in str(value) and "sk-abcdefghijklmnop" not in str(value)


def test_a_compacted_request_carries_its_receipt_on_the_chat_span(tmp_path: Path, traced: Traced) -> None:
    root, _ = prepare_workspace(tmp_path / "ws")
    model = ScriptedModel(scripted_model_responses(root), max_input_units=2400)
    engine = Engine(
        NotesAgent(root, policy="model"),
        model=model,
        context=ModelContext(compaction_policy=ClosedExchangeWindowCompactor()),
        otel=traced.provider,
    )
    result = engine.run("Index")
    receipts = [e for e in result.events if e.event_type is EngineEventType.COMPACTION]
    assert receipts, "the demo script must overflow its window"

    events = [(chat, e) for chat in traced.named("chat") for e in chat.events if e.name == "qitos.compaction"]
    assert len(events) == len(receipts)
    by_id = {dict(e.attributes or {})["qitos.compaction.receipt_id"]: (chat, e) for chat, e in events}
    for receipt in receipts:
        chat, event = by_id[receipt.payload["receipt_id"]]
        attrs = dict(event.attributes or {})
        assert attrs["qitos.compaction.omitted"] == len(receipt.payload["input_exchange_ids"]) > 0
        assert attrs["qitos.compaction.policy"] == receipt.payload["policy_id"]
        assert dict(chat.attributes or {})["qitos.step.id"] == receipt.step_id


def test_a_failed_model_call_marks_the_chat_step_and_run_spans_as_errors(traced: Traced) -> None:
    def broken(view: Any) -> Any:
        raise ModelError("HTTP 503 from upstream", status_code=503)

    result = Engine(ModelAgent(llm=FunctionModel(broken, model_id="broken-1")), otel=traced.provider).run("t")
    assert result.state.stop_reason == "unrecoverable_error"

    chat = traced.one("chat")
    assert chat.name == "chat broken-1"
    assert chat.status.status_code is StatusCode.ERROR and chat.status.description == "HTTP 503 from upstream"
    assert dict(chat.attributes or {})["error.type"] == "ModelError"
    (exception,) = [e for e in chat.events if e.name == "exception"]
    assert dict(exception.attributes or {})["exception.type"] == "ModelError"

    step = traced.one("qitos.step")
    assert step.status.status_code is StatusCode.ERROR
    assert dict(step.attributes or {})["qitos.step.committed"] is False
    (step_exception,) = [e for e in step.events if e.name == "exception"]
    assert "raise ModelError" in str(dict(step_exception.attributes or {})["exception.stacktrace"])

    run = traced.one("invoke_agent")
    assert run.status.status_code is StatusCode.ERROR and "HTTP 503" in str(run.status.description)
    assert dict(run.attributes or {})["qitos.status"] == "failed"


def test_a_failed_tool_call_is_an_error_span_and_the_run_goes_on(traced: Traced) -> None:
    bad = {"tool_calls": [{"id": "c-bad", "name": "add", "arguments": {"a": "x"}}]}
    Engine(ModelAgent(llm=ScriptedModel([bad, "gave up"])), otel=traced.provider).run("t")
    span = traced.one("execute_tool")
    assert span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {})["error.type"] == "invalid_arguments"
    assert traced.one("invoke_agent").status.status_code is StatusCode.UNSET


def test_a_hook_error_is_recorded_without_failing_the_span(traced: Traced) -> None:
    class Raising(EngineHook):
        def on_step_end(self, ctx: Any) -> None:
            raise RuntimeError("hook broke")

    Engine(ModelAgent(llm=ScriptedModel(["ok"])), hooks=[Raising()], otel=traced.provider).run("t")
    run = traced.one("invoke_agent")
    (event,) = [e for e in run.events if e.name == "exception"]
    assert "hook broke" in str(dict(event.attributes or {})["exception.message"])
    assert run.status.status_code is StatusCode.UNSET


# --------------------------------------------------------------------------- durable sessions

_SESSIONS: dict[str, Any] = {}


@tool
def pause_after_this() -> str:
    """Ask the running session to pause (it does at the next boundary)."""
    _SESSIONS["current"].pause()
    time.sleep(0.02)  # past the journal's control poll interval, so the next boundary sees the request
    return "pause requested"


def _session_script() -> list[Any]:
    return [{"tool_calls": [{"id": "p1", "name": "pause_after_this", "arguments": {}}]}, "finished"]


def test_a_resumed_session_run_links_to_the_earlier_runs_span(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    first, second = _traced(), _traced()
    store = SqliteCheckpointStore(db)
    composition = compose(
        lambda: ModelAgent(pause_after_this), store=store, model=ScriptedModel(_session_script()), otel=first.provider
    )
    session = composition.session("pause, then finish")
    _SESSIONS["current"] = session
    paused = session.run()
    assert paused.state.stop_reason == "paused"
    store.close()

    run1 = first.one("invoke_agent")
    attrs1 = dict(run1.attributes or {})
    sid = session.session_id.value
    assert attrs1["qitos.session.id"] == attrs1["gen_ai.conversation.id"] == sid
    assert attrs1["qitos.stop_reason"] == "paused"
    pauses = [e for e in run1.events if e.name == "qitos.pause"]
    assert [dict(e.attributes or {})["qitos.pause.by"] for e in pauses] == ["pause_request"]
    reader = SqliteCheckpointStore(db)
    head1 = reader.get_session_head(sid)
    assert head1 is not None and attrs1["qitos.snapshot.id"] == head1.snapshot_id
    (step0,) = first.named("qitos.step")
    step_snapshot = str(dict(step0.attributes or {})["qitos.snapshot.id"])
    assert SnapshotPayload.of(reader.get_snapshot(step_snapshot)).step_id == 1  # the boundary that committed step 0
    reader.close()

    # Another store handle and another provider: all the second run knows comes from the store.
    store2 = SqliteCheckpointStore(db)
    again = compose(
        lambda: ModelAgent(pause_after_this), store=store2, model=ScriptedModel(["finished"]), otel=second.provider
    )
    resumed = again.restore(sid).run()
    store2.close()
    assert resumed.state.final_result == "finished"

    run2 = second.one("invoke_agent")
    attrs2 = dict(run2.attributes or {})
    assert attrs2["qitos.run.resumed"] is True
    assert attrs2["qitos.resumed_from.snapshot.id"] == head1.snapshot_id
    assert run2.context is not None and run1.context is not None
    assert run2.context.trace_id != run1.context.trace_id
    (link,) = run2.links
    assert link.context.trace_id == run1.context.trace_id and link.context.span_id == run1.context.span_id
    assert dict(link.attributes or {}) == {"qitos.link.kind": "resumes", "qitos.run.id": attrs1["qitos.run.id"]}


def test_the_link_is_to_the_latest_run_and_an_untraced_run_breaks_the_chain(tmp_path: Path) -> None:
    traced1, traced3 = _traced(), _traced()
    store = SqliteCheckpointStore(str(tmp_path / "s.db"))
    model = ScriptedModel(["one", "two", "three", "four"])
    plain = compose(lambda: ModelAgent(), store=store, model=model)
    with_spans = [compose(lambda: ModelAgent(), store=store, model=model, otel=t.provider) for t in (traced1, traced3)]
    session = with_spans[0].session("t")
    session.run()
    sid = session.session_id.value
    plain.restore(sid).run(steering="again")  # an untraced run in between
    with_spans[1].restore(sid).run(steering="and again")
    store.close()
    assert traced1.one("invoke_agent").links == ()
    run3 = traced3.one("invoke_agent")
    assert run3.links == ()  # the latest run before it had no span to link to
    (steer,) = [e for e in run3.events if e.name == "qitos.steer"]
    assert "qitos.steer.position" in (steer.attributes or {})
    assert "qitos.steer.text" not in (steer.attributes or {})  # content only on opt-in
    run1 = traced1.one("invoke_agent")
    assert run1.context is not None
    head_payload_trace = {
        "trace_id": format_trace_id(run1.context.trace_id),
        "span_id": format_span_id(run1.context.span_id),
    }
    store = SqliteCheckpointStore(str(tmp_path / "s.db"))
    payloads = [SnapshotPayload.of(store.get_snapshot(s)) for s in store.list_session_snapshots(sid)]
    store.close()
    assert head_payload_trace in [p.trace for p in payloads if p.trace is not None]


# --------------------------------------------------------------------------- off by default


def test_without_otel_the_engine_has_no_telemetry_hook_and_events_carry_no_content() -> None:
    engine = Engine(ModelAgent(llm=ScriptedModel([ADD_CALL, FINAL])))
    assert not any(isinstance(h, OtelHook) for h in engine.hooks)
    assert engine.model_content_events is False
    result = engine.run("t")
    requests = [e for e in result.events if e.event_type is EngineEventType.MODEL_REQUEST]
    responses = [e for e in result.events if e.event_type is EngineEventType.MODEL_RESPONSE]
    assert len(requests) == len(responses) == 2
    assert "messages" not in requests[0].payload and "message" not in responses[0].payload
    assert responses[0].payload["usage"] == {"input_tokens": 40, "output_tokens": 7}
    assert responses[0].payload["finish_reason"] == "tool_calls"


def test_otel_option_forms() -> None:
    provider = TracerProvider()
    assert otel_settings(None) is None and otel_settings(False) is None
    assert otel_settings(True) == OtelSettings()
    assert otel_settings(provider) == OtelSettings(tracer_provider=provider)
    settings = OtelSettings(capture_content=True)
    assert otel_settings(settings) is settings
    with pytest.raises(ConfigurationError, match="otel= takes True, a TracerProvider or OtelSettings"):
        otel_settings("yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="otel="):
        Engine(ModelAgent(), otel=42)  # type: ignore[arg-type]


def test_agent_run_takes_otel(traced: Traced) -> None:
    answer = ModelAgent(llm=ScriptedModel(["fine"])).run("t", trace=False, otel=traced.provider)
    assert answer == "fine"
    assert traced.one("invoke_agent").name == "invoke_agent ModelAgent"


def test_concurrent_async_runs_keep_their_own_span_trees(traced: Traced) -> None:
    async def both() -> list[Any]:
        engines = [
            AsyncEngine(ModelAgent(llm=ScriptedModel([ADD_CALL, FINAL])), otel=traced.provider) for _ in range(2)
        ]
        return list(await asyncio.gather(*(e.arun(f"task {i}") for i, e in enumerate(engines))))

    results = asyncio.run(both())
    runs = traced.named("invoke_agent")
    assert len(runs) == 2 and {dict(r.attributes or {})["qitos.run.id"] for r in runs} == {r.run_id for r in results}
    for run in runs:
        assert run.context is not None
        in_trace = [s for s in traced.spans() if s.context and s.context.trace_id == run.context.trace_id]
        steps = [s for s in in_trace if s.name == "qitos.step"]
        assert len(steps) == 2 and {_parent(s) for s in steps} == {_id(run)}
        assert len([s for s in in_trace if s.name.startswith("chat")]) == 2
        assert len([s for s in in_trace if s.name.startswith("execute_tool")]) == 1


_SUBPROCESS_PRELUDE = """
import sys
sys.path.insert(0, {tests!r})
from engine.test_telemetry import FINAL, ModelAgent
from qitos import Engine
from qitos.models._scripted import ScriptedModel
"""


def _run_python(code: str) -> subprocess.CompletedProcess[str]:
    tests = str(Path(__file__).resolve().parents[1])
    return subprocess.run(
        [sys.executable, "-c", _SUBPROCESS_PRELUDE.format(tests=tests) + code],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_otel_true_uses_the_global_tracer_provider() -> None:
    code = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
Engine(ModelAgent(llm=ScriptedModel([FINAL])), otel=True).run("t")
print(sorted(s.name for s in exporter.get_finished_spans()))
"""
    proc = _run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['chat scripted', 'invoke_agent ModelAgent', 'qitos.step']"


def test_without_the_otel_extra_asking_for_spans_names_the_extra() -> None:
    code = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ImportError(f"blocked {name}")
        return None
sys.meta_path.insert(0, Block())
from qitos import AgentModule, Decision, Engine, StateSchema
class Done(AgentModule):
    def init_state(self, task, **kwargs):
        return StateSchema(task=task, max_steps=2)
    def decide(self, state, observation):
        return Decision.final("ok")
    def reduce(self, state, observation, decision):
        return state
assert Engine(Done()).run("t").state.final_result == "ok"  # off: works without the extra
try:
    Engine(Done(), otel=True)
except Exception as exc:
    print(type(exc).__name__, exc)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ConfigurationError") and install_command("otel") in proc.stdout


def test_tracing_alone_does_not_make_the_engine_stream_model_replies(traced: Traced) -> None:
    class Watcher(EngineHook):
        def on_event(self, event: Any) -> None:
            pass

    def deltas(**kwargs: Any) -> int:
        result = Engine(ModelAgent(llm=ScriptedModel(["a streamed answer"])), **kwargs).run("t")
        return sum(e.event_type is EngineEventType.MODEL_DELTA for e in result.events)

    assert deltas(otel=traced.provider) == 0
    assert deltas(otel=traced.provider, hooks=[Watcher()]) > 0  # a listener that wants deltas still gets them


def test_a_run_that_fails_to_start_is_one_failed_agent_span(traced: Traced) -> None:
    class NoState(ModelAgent):
        def init_state(self, task: str, **kwargs: Any) -> Any:
            return {"task": task}

    with pytest.raises(ConfigurationError, match="must return a StateSchema"):
        Engine(NoState(), otel=traced.provider).run("t")
    (run,) = traced.spans()
    assert run.name == "invoke_agent NoState" and run.status.status_code is StatusCode.ERROR
    (exception,) = [e for e in run.events if e.name == "exception"]
    assert dict(exception.attributes or {})["exception.type"] == "ConfigurationError"
