"""OpenTelemetry spans for engine runs, with the GenAI semantic conventions (extra ``qitos-kernel[otel]``).

Off unless asked for: ``Engine(agent, otel=...)`` (also ``compose(..., otel=...)`` and
``agent.run(..., otel=...)``) takes ``True`` (the global tracer provider), a ``TracerProvider``, or
:class:`OtelSettings` (a provider plus content capture). Nothing sends anything anywhere unless the
provider has an exporter (``qitos.engine._otlp`` builds one from the ``OTEL_EXPORTER_OTLP_*``
variables). opentelemetry is imported only when a run asks for spans, and a run without them pays
nothing: the bridge is an ``EngineHook`` appended to the engine's hooks, fed by the events the engine
emits anyway and by the ACT hooks (for tool results and their durations).

The spans of one run::

    invoke_agent {agent}      gen_ai.operation.name, gen_ai.agent.name, qitos.run.id, qitos.session.id
    |                         (= gen_ai.conversation.id), qitos.snapshot.id (the head the run left),
    |                         qitos.resumed_from.snapshot.id, qitos.stop_reason, qitos.status, usage totals
    +- qitos.step             qitos.step.id, qitos.decision.mode, qitos.stop_reason, qitos.step.committed,
       |                      qitos.snapshot.id (the snapshot that made the step durable, once written)
       +- chat {model}        gen_ai.operation.name=chat, gen_ai.system and gen_ai.provider.name,
       |                      gen_ai.request.model, gen_ai.response.model, gen_ai.usage.input_tokens /
       |                      output_tokens, gen_ai.response.finish_reasons, qitos.request.id
       +- execute_tool {tool} gen_ai.operation.name=execute_tool, gen_ai.tool.name, gen_ai.tool.call.id,
                              gen_ai.tool.type; error.type and status ERROR when the call failed

Span events: ``qitos.compaction`` on the chat span whose request omitted exchanges
(``qitos.compaction.receipt_id``, ``qitos.compaction.omitted``, ``qitos.compaction.policy``),
``qitos.model_retry`` on the chat span, ``qitos.pause``, ``qitos.steer`` and ``qitos.approval`` on the
open step span (else the run span), and ``exception`` (type, message, stack trace) with status ERROR
on the innermost open span for every error event. A hook's own error adds the event but does not
mark the span failed (the run goes on).

Timing: run, step and chat spans start and end at their events' timestamps. Tools report no start
event (adding one would cost every step of every run): their spans are laid end to end from the
start of ACT, each as long as its result's measured ``duration_ms``. While a run, a step or a model
call is open its span is the current OpenTelemetry context of the engine's thread, so spans of
instrumented libraries (an HTTP client inside a model adapter or a tool) nest under it.

Resumed sessions: a durable run writes its span's trace and span id with its first snapshot (payload
key ``trace``, beside ``run_id``; see ``qitos.sessions._step_journal``). The session's next run, in
any process, starts a new trace whose run span carries a Link to that span context
(``qitos.link.kind=resumes``, ``qitos.run.id`` of the earlier run). A fork shares its parent's
chain, so the child's first run links to the run that wrote the snapshot it forked from. A run
without spans in between writes no ``trace``, and the run after it has no link.

Content (the prompt as ``gen_ai.input.messages``, the reply as ``gen_ai.output.messages``, tool
arguments and results, steering texts, the task) is recorded only with ``capture_content=True``,
and always through the same redaction as trace files (``Redactor`` with the model's api key and
``secrets()``).

Per-run span state lives in a ContextVar, so runs on different threads or asyncio tasks (each
engine run keeps to one) do not mix.
"""

from __future__ import annotations

import importlib.metadata
import json
import time
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from qitos.core._errors import ConfigurationError
from qitos.core._install import DISTRIBUTION, install_command
from qitos.engine._events import EngineEvent, EngineEventType, RuntimePhase
from qitos.engine._hooks import EngineHook, HookContext
from qitos.sessions._step_journal import SessionJournal
from qitos.trace._redact import Redactor

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider

__all__ = [
    "INSTRUMENTATION_NAME",
    "OtelHook",
    "OtelOption",
    "OtelSettings",
    "TracedEngine",
    "otel_hook",
    "otel_settings",
]


class TracedEngine(Protocol):
    """What the tracing hook reads from its engine (``EngineLoop`` is one; a protocol, so the loop
    can import this module without this module importing the loop)."""

    agent: Any
    model: Any


INSTRUMENTATION_NAME = "qitos"
"""The instrumentation scope name of every span qitos makes."""

E = EngineEventType


@dataclass(frozen=True, kw_only=True)
class OtelSettings:
    """How a run is traced.

    Args:
        tracer_provider: the provider spans go to (None: the global one, ``trace.get_tracer_provider()``).
        capture_content: record prompts, replies, tool arguments/results and steering texts (redacted).
        secrets: extra exact values to redact from captured content (the model's api key and
            ``secrets()`` are always redacted).
    """

    tracer_provider: TracerProvider | None = None
    capture_content: bool = False
    secrets: tuple[str, ...] = ()


OtelOption: TypeAlias = "bool | OtelSettings | TracerProvider | None"
"""What ``otel=`` accepts: None/False (off), True (global provider), a TracerProvider, OtelSettings."""


def otel_settings(option: OtelOption) -> OtelSettings | None:
    """The settings ``option`` stands for, or None when tracing is off."""
    if option is None or option is False:
        return None
    if option is True:
        return OtelSettings()
    if isinstance(option, OtelSettings):
        return option
    if callable(getattr(option, "get_tracer", None)):
        return OtelSettings(tracer_provider=option)
    raise ConfigurationError(f"otel= takes True, a TracerProvider or OtelSettings, got {type(option).__name__}")


def otel_hook(option: OtelOption, *, engine: TracedEngine) -> OtelHook | None:
    """The tracing hook for ``engine`` when ``option`` turns tracing on, else None."""
    settings = otel_settings(option)
    return None if settings is None else OtelHook(settings, engine=engine)


@dataclass
class _RunSpans:
    """The open spans and bookkeeping of one traced run."""

    run_id: str
    started_ns: int
    resumed: bool
    task: str = ""
    run: Span | None = None
    step: Span | None = None
    chat: Span | None = None
    # Attached OpenTelemetry contexts, innermost last: (owner, token).
    attached: list[tuple[str, object]] = field(default_factory=list)
    journal: SessionJournal | None = None
    commits: int = 0
    act_started_ns: int = 0
    compactions: list[EngineEvent] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0


class OtelHook(EngineHook):
    """Turns one engine's events into OpenTelemetry spans (see the module docstring)."""

    def __init__(self, settings: OtelSettings, *, engine: TracedEngine) -> None:
        try:
            from opentelemetry import context as otel_context
            from opentelemetry import trace
        except ImportError as exc:
            raise ConfigurationError(f"OpenTelemetry support needs the otel extra: {install_command('otel')}") from exc
        self.settings = settings
        self.engine = engine
        self.wants_model_content = settings.capture_content
        self.wants_model_deltas = False  # spans do not need streamed text; tracing must not change requests
        self._trace = trace
        self._context = otel_context
        provider = settings.tracer_provider or trace.get_tracer_provider()
        self._tracer: Tracer = provider.get_tracer(INSTRUMENTATION_NAME, _qitos_version())
        self._redact = _redactor(engine.model, settings.secrets)
        self._current: ContextVar[_RunSpans | None] = ContextVar(f"qitos_otel_{id(self)}", default=None)
        self._handlers = {
            E.STEP_START: self._step_start,
            E.DECIDE: self._decide,
            E.MODEL_REQUEST: self._model_request,
            E.MODEL_RESPONSE: self._model_response,
            E.MODEL_RETRY: self._model_retry,
            E.COMPACTION: self._compaction,
            E.PAUSE: self._pause,
            E.STEER: self._steer,
            E.APPROVAL: self._approval,
            E.ERROR: self._error,
            E.STEP_END: self._step_end,
            E.RUN_END: self._run_end,
        }

    # ------------------------------------------------------------------ hook methods

    def on_event(self, event: EngineEvent) -> None:
        """Route one engine event to the span it opens, closes or annotates."""
        if event.event_type is E.RUN_START:
            self._run_start(event)
            return
        handler = self._handlers.get(event.event_type)
        spans = self._current.get()
        if handler is not None and spans is not None:
            handler(spans, event)

    def on_run_start(self, ctx: HookContext) -> None:
        """Open the run span (the journal gives the session, its head and the earlier run's trace)."""
        spans = self._current.get()
        if spans is None or spans.run is not None:
            return
        journal = ctx.journal if isinstance(ctx.journal, SessionJournal) else None
        spans.journal = journal
        self._open_run(spans, journal)

    def on_before_act(self, ctx: HookContext) -> None:
        """Note when ACT starts: tool spans are laid out from here."""
        spans = self._current.get()
        if spans is not None:
            spans.act_started_ns = time.time_ns()

    def on_after_act(self, ctx: HookContext) -> None:
        """One ``execute_tool`` span per tool result of the step."""
        spans = self._current.get()
        observation = ctx.observation
        results = getattr(observation, "results", ())
        if spans is None or not results:
            return
        parent = spans.step or spans.run
        capture = self.settings.capture_content
        args = {a.id: a.args for a in getattr(ctx.decision, "actions", ())} if capture else {}
        now = time.time_ns()
        cursor = spans.act_started_ns or now
        for result in results:
            end = min(now, cursor + int(result.duration_ms * 1e6))
            attributes: dict[str, Any] = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": result.name,
                "gen_ai.tool.call.id": result.call_id,
                "gen_ai.tool.type": "function",
            }
            if capture:
                attributes["gen_ai.tool.call.arguments"] = self._json(args.get(result.call_id, {}))
                attributes["gen_ai.tool.call.result"] = self._redact(result.as_text())
            if not result.ok:
                attributes["error.type"] = result.error_kind or "error"
            span = self._tracer.start_span(
                f"execute_tool {result.name}",
                context=self._in(parent),
                kind=self._trace.SpanKind.INTERNAL,
                attributes=attributes,
                start_time=cursor,
            )
            if not result.ok:
                message = self._redact(result.error or "")
                _exception_event(span, result.error_kind or "error", message, None, end)
                span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, message))
            span.end(end_time=end)
            cursor = end

    # ------------------------------------------------------------------ run

    def _run_start(self, event: EngineEvent) -> None:
        payload = event.payload
        run_id = str(payload.get("run_id") or "")
        spans = _RunSpans(
            run_id=run_id,
            started_ns=_ns(event),
            resumed=bool(payload.get("resumed")),
            task=str(payload.get("task", "")),
        )
        self._current.set(spans)

    def _open_run(self, spans: _RunSpans, journal: SessionJournal | None) -> Span:
        engine = self.engine
        agent_name = type(engine.agent).__name__
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": agent_name,
            "qitos.run.id": spans.run_id,
            "qitos.run.resumed": spans.resumed,
        }
        if self.settings.capture_content and spans.task:
            attributes["qitos.task"] = self._redact(spans.task)
        model = engine.model
        if model is not None:
            provider = getattr(model, "provider", None)
            if isinstance(provider, str) and provider:
                attributes["gen_ai.system"] = attributes["gen_ai.provider.name"] = provider
            model_id = getattr(model, "model_id", None)
            if isinstance(model_id, str) and model_id:
                attributes["gen_ai.request.model"] = model_id
        links = []
        if journal is not None:
            attributes["qitos.session.id"] = attributes["gen_ai.conversation.id"] = journal.session_id
            attributes["qitos.resumed_from.snapshot.id"] = journal.head_id
            spans.commits = journal.commits
            link = self._link_to(journal.previous_trace, journal.previous_run_id)
            if link is not None:
                links.append(link)
        span = self._tracer.start_span(
            f"invoke_agent {agent_name}",
            kind=self._trace.SpanKind.INTERNAL,
            attributes=attributes,
            links=links,
            start_time=spans.started_ns,
        )
        spans.run = span
        self._attach(spans, "run", span)
        if journal is not None:
            context = span.get_span_context()
            journal.trace_context = {
                "trace_id": self._trace.format_trace_id(context.trace_id),
                "span_id": self._trace.format_span_id(context.span_id),
            }
        return span

    def _link_to(self, trace: Mapping[str, str] | None, run_id: str | None) -> Any:
        if not trace:
            return None
        try:
            trace_id, span_id = int(trace["trace_id"], 16), int(trace["span_id"], 16)
        except (KeyError, TypeError, ValueError):
            return None  # an unreadable record: no link rather than a failed run
        context = self._trace.SpanContext(
            trace_id=trace_id,
            span_id=span_id,
            is_remote=True,
            trace_flags=self._trace.TraceFlags(self._trace.TraceFlags.SAMPLED),
        )
        attributes = {"qitos.link.kind": "resumes"}
        if run_id:
            attributes["qitos.run.id"] = run_id
        return self._trace.Link(context, attributes)

    def _run_end(self, spans: _RunSpans, event: EngineEvent) -> None:
        # A run that failed before it started (no on_run_start) still gets its one span.
        run = spans.run if spans.run is not None else self._open_run(spans, None)
        end = _ns(event)
        if spans.chat is not None:
            self._end_chat(spans, end)
        if spans.step is not None:
            self._end_step(spans, end, committed=False)
        payload = event.payload
        for key in ("stop_reason", "status", "steps"):
            if payload.get(key) is not None:
                run.set_attribute(f"qitos.{key}", payload[key])
        run.set_attribute("gen_ai.usage.input_tokens", spans.input_tokens)
        run.set_attribute("gen_ai.usage.output_tokens", spans.output_tokens)
        if spans.journal is not None:
            run.set_attribute("qitos.snapshot.id", spans.journal.head_id)
        if not event.ok:
            run.set_status(self._trace.Status(self._trace.StatusCode.ERROR, self._redact(event.error or "failed")))
        self._detach(spans, "run")
        run.end(end_time=end)
        self._current.set(None)

    # ------------------------------------------------------------------ steps

    def _step_start(self, spans: _RunSpans, event: EngineEvent) -> None:
        if spans.step is not None:
            self._end_step(spans, _ns(event), committed=False)
        span = self._tracer.start_span(
            "qitos.step",
            context=self._in(spans.run),
            attributes={"qitos.step.id": event.step_id},
            start_time=_ns(event),
        )
        spans.step = span
        if spans.journal is not None:
            spans.commits = spans.journal.commits
        self._attach(spans, "step", span)

    def _decide(self, spans: _RunSpans, event: EngineEvent) -> None:
        if spans.step is not None:
            spans.step.set_attribute("qitos.decision.mode", str(event.payload.get("mode", "")))
            if event.payload.get("resumed"):
                spans.step.set_attribute("qitos.step.resumed", True)

    def _step_end(self, spans: _RunSpans, event: EngineEvent) -> None:
        step = spans.step
        if step is None:
            return
        reason = event.payload.get("stop_reason")
        if reason is not None:
            step.set_attribute("qitos.stop_reason", str(reason))
        journal = spans.journal
        if journal is not None and journal.commits != spans.commits:
            # A snapshot was written during this step (in batched mode it may hold several steps).
            step.set_attribute("qitos.snapshot.id", journal.head_id)
            spans.commits = journal.commits
        self._end_step(spans, _ns(event), committed=True)

    def _end_step(self, spans: _RunSpans, end: int, *, committed: bool) -> None:
        step = spans.step
        if step is None:
            return
        step.set_attribute("qitos.step.committed", committed)
        self._detach(spans, "step")
        step.end(end_time=end)
        spans.step = None

    # ------------------------------------------------------------------ model calls

    def _model_request(self, spans: _RunSpans, event: EngineEvent) -> None:
        payload = event.payload
        provider = str(payload.get("provider") or "unspecified")
        model = str(payload.get("model") or "unspecified")
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.system": provider,
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
            "qitos.request.id": str(payload.get("request_id") or ""),
            "qitos.step.id": event.step_id,
        }
        messages = payload.get("messages")
        if self.settings.capture_content and isinstance(messages, list):
            attributes["gen_ai.input.messages"] = self._json([_message_parts(m) for m in messages])
        span = self._tracer.start_span(
            f"chat {model}",
            context=self._in(spans.step or spans.run),
            kind=self._trace.SpanKind.CLIENT,
            attributes=attributes,
            start_time=_ns(event),
        )
        for receipt in spans.compactions:
            self._add_compaction(span, receipt)
        spans.compactions.clear()
        spans.chat = span
        self._attach(spans, "chat", span)

    def _model_response(self, spans: _RunSpans, event: EngineEvent) -> None:
        span = spans.chat
        if span is None:
            return
        payload = event.payload
        if event.ok:
            usage = payload.get("usage") or {}
            input_tokens, output_tokens = int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))
            spans.input_tokens += input_tokens
            spans.output_tokens += output_tokens
            span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", output_tokens)
            if payload.get("model"):
                span.set_attribute("gen_ai.response.model", str(payload["model"]))
            if payload.get("finish_reason"):
                span.set_attribute("gen_ai.response.finish_reasons", [str(payload["finish_reason"])])
            span.set_attribute("qitos.response.tool_calls", int(payload.get("tool_calls", 0)))
            message = payload.get("message")
            if self.settings.capture_content and isinstance(message, Mapping):
                parts = _message_parts(message)
                if payload.get("finish_reason"):
                    parts["finish_reason"] = str(payload["finish_reason"])
                span.set_attribute("gen_ai.output.messages", self._json([parts]))
        else:
            self._fail(span, event.error or "the model call failed", None, _ns(event))
        self._end_chat(spans, _ns(event))

    def _end_chat(self, spans: _RunSpans, end: int) -> None:
        chat = spans.chat
        if chat is None:
            return
        self._detach(spans, "chat")
        chat.end(end_time=end)
        spans.chat = None

    def _model_retry(self, spans: _RunSpans, event: EngineEvent) -> None:
        span = spans.chat or spans.step or spans.run
        if span is not None:
            attributes: dict[str, Any] = {
                f"qitos.retry.{k}": v for k, v in event.payload.items() if _attribute_value(v)
            }
            span.add_event("qitos.model_retry", attributes, timestamp=_ns(event))

    def _compaction(self, spans: _RunSpans, event: EngineEvent) -> None:
        if event.phase is RuntimePhase.DECIDE and spans.chat is None:
            spans.compactions.append(event)  # emitted while the request is built: goes on its chat span
            return
        span = spans.chat or spans.step or spans.run
        if span is not None:
            self._add_compaction(span, event)

    def _add_compaction(self, span: Span, event: EngineEvent) -> None:
        payload = event.payload
        omitted = payload.get("input_exchange_ids") or []
        attributes: dict[str, Any] = {
            "qitos.compaction.receipt_id": str(payload.get("receipt_id", "")),
            "qitos.compaction.omitted": len(omitted) if isinstance(omitted, list) else 0,
            "qitos.compaction.policy": str(payload.get("policy_id", "")),
        }
        span.add_event("qitos.compaction", attributes, timestamp=_ns(event))

    # ------------------------------------------------------------------ control and errors

    def _pause(self, spans: _RunSpans, event: EngineEvent) -> None:
        self._control_event(spans, "qitos.pause", event, ("by", "before_call"))

    def _approval(self, spans: _RunSpans, event: EngineEvent) -> None:
        self._control_event(spans, "qitos.approval", event, ("call_id", "tool", "status"))

    def _steer(self, spans: _RunSpans, event: EngineEvent) -> None:
        keys = ("position", "text") if self.settings.capture_content else ("position",)
        self._control_event(spans, "qitos.steer", event, keys)

    def _control_event(self, spans: _RunSpans, name: str, event: EngineEvent, keys: Iterable[str]) -> None:
        span = spans.step or spans.run
        if span is None:
            return
        attributes: dict[str, Any] = {"qitos.step.id": event.step_id}
        for key in keys:
            value = event.payload.get(key)
            if value is not None:
                attributes[f"{name}.{key}"] = self._redact(value) if isinstance(value, str) else value
        span.add_event(name, attributes, timestamp=_ns(event))

    def _error(self, spans: _RunSpans, event: EngineEvent) -> None:
        # Before on_run_start (the run failed to start) the error still lands on the run's span.
        span = spans.chat or spans.step or spans.run or self._open_run(spans, None)
        error = event.error or "error"
        traceback = event.payload.get("traceback")
        stack = traceback if isinstance(traceback, str) else None
        if "hook" in event.payload:
            kind, _, message = _split_error(self._redact(error))
            _exception_event(span, kind, message, stack, _ns(event))  # the run goes on: no ERROR status
            return
        self._fail(span, error, stack, _ns(event))

    def _fail(self, span: Span, error: str, stack: str | None, at: int) -> None:
        kind, _, message = _split_error(self._redact(error))
        _exception_event(span, kind, message, stack and self._redact(stack), at)
        span.set_attribute("error.type", kind)
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, message))

    # ------------------------------------------------------------------ plumbing

    def _in(self, parent: Span | None) -> Context | None:
        return None if parent is None else self._trace.set_span_in_context(parent)

    def _attach(self, spans: _RunSpans, owner: str, span: Span) -> None:
        spans.attached.append((owner, self._context.attach(self._trace.set_span_in_context(span))))

    def _detach(self, spans: _RunSpans, owner: str) -> None:
        # Contexts are detached innermost first, down to and including ``owner``'s.
        while spans.attached:
            name, token = spans.attached.pop()
            self._context.detach(token)  # type: ignore[arg-type]
            if name == owner:
                return

    def _json(self, value: Any) -> str:
        return self._redact(json.dumps(value, ensure_ascii=False, default=str))


def _ns(event: EngineEvent) -> int:
    return int(event.ts_epoch * 1e9)


def _split_error(error: str) -> tuple[str, str, str]:
    kind, sep, message = error.partition(": ")
    if sep and kind.replace(".", "").isidentifier():
        return kind, sep, message
    return "error", "", error


def _exception_event(span: Span, kind: str, message: str, stack: str | None, at: int) -> None:
    attributes = {"exception.type": kind, "exception.message": message}
    if stack:
        attributes["exception.stacktrace"] = stack
    span.add_event("exception", attributes, timestamp=at)


def _attribute_value(value: object) -> bool:
    return isinstance(value, str | bool | int | float)


def _message_parts(message: Mapping[str, Any]) -> dict[str, Any]:
    """A provider-neutral message in the GenAI conventions' shape: ``{role, parts: [...]}``."""
    role = str(message.get("role", "user"))
    parts: list[dict[str, Any]] = []
    content = message.get("content")
    if role == "tool":
        parts.append({"type": "tool_call_response", "id": message.get("tool_call_id"), "response": content})
    elif content:
        parts.append({"type": "text", "content": content})
    for call in message.get("tool_calls") or ():
        if isinstance(call, Mapping):
            arguments = call.get("arguments")
            parts.append({"type": "tool_call", "id": call.get("id"), "name": call.get("name"), "arguments": arguments})
    return {"role": role, "parts": parts}


def _redactor(model: object, extra: Iterable[str]) -> Redactor:
    redact = Redactor(extra)
    key = getattr(model, "api_key", None)
    if isinstance(key, str):
        redact.add(key)
    secrets = getattr(model, "secrets", None)
    if callable(secrets):
        for secret in secrets():
            redact.add(secret)
    return redact


def _qitos_version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
