"""The ``Engine``: the one canonical decide -> act -> reduce loop.

Every entry point runs this loop: ``AgentModule.run``, ``Engine.run``, ``AsyncEngine`` (in a worker
thread) and ``Session.run`` (with a durable journal). Per step:

1. boundary: cancellation, pause requests and the LifecyclePolicy, steering intake, budgets;
2. DECIDE: the agent's ``decide`` hook, or the model path when it returns None;
3. branch resolution by the BranchSelector;
4. ACT: tool calls through the ToolRegistry (or the Env); failures become observations;
5. REDUCE: ``agent.reduce(state, observation, decision)``;
6. CRITICS and CHECK_STOP;
7. COMMIT: the step record, the state diff, the journal boundary, events.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from qitos.core.agent_module import AgentModule
from qitos.core.decision import Action, Decision, Observation
from qitos.core.errors import ConfigurationError, ContextError, UsageError
from qitos.core.identity import RunIdentity
from qitos.core.redaction import Redactor, model_credentials
from qitos.core.state import StateSchema, StopReason
from qitos.core.task import Env, Task, TaskResult
from qitos.core.tool import ToolResult
from qitos.engine.event_redaction import redact_event, redacting_sink
from qitos.engine.events import EngineEvent, EngineEventType, EngineResult, RuntimePhase, StepRecord
from qitos.engine.hooks import HOOK_METHODS, EngineHook, HookContext
from qitos.engine.policies import BranchSelector, Critic, CriticVerdict, FinalResultCriteria, FirstCandidateSelector
from qitos.engine.runtime import LifecyclePolicy, RuntimeBudget, RuntimeSnapshotContext
from qitos.engine.telemetry import OtelOption, otel_hook
from qitos.models.function import as_model
from qitos.sessions.journal import BoundaryCommit, ControlBatch, PendingStep, ResumePoint, RunJournal
from qitos.trace.writer import TraceWriter

__all__ = ["Engine", "status_for_stop_reason"]

StateT = TypeVar("StateT", bound=StateSchema)
ObservationT = TypeVar("ObservationT")
ActionT = TypeVar("ActionT")

E = EngineEventType
P = RuntimePhase
_now = time.time
# The per-step events are built with tuple.__new__ (EngineEvent is an immutable NamedTuple): the
# same object as EngineEvent(...), without a Python-level call, six times per step.
_fast_event = tuple.__new__

_COMPLETED = frozenset({StopReason.FINAL, StopReason.AGENT_STOP, StopReason.ENV_TERMINAL})
_FAILED = frozenset(
    {StopReason.UNRECOVERABLE_ERROR, StopReason.TASK_VALIDATION_FAILED, StopReason.CONTEXT_BUDGET_EXCEEDED}
)
_RESUMABLE = frozenset(
    {
        StopReason.PAUSED,
        StopReason.AWAITING_APPROVAL,
        StopReason.CANCELLED,
        StopReason.CANCELLED_IMMEDIATE,
        StopReason.BUDGET_TIME,
        StopReason.BUDGET_TOKENS,
        StopReason.BUDGET_STEPS,
        StopReason.MAX_STEPS_REACHED,
        StopReason.UNRECOVERABLE_ERROR,
    }
)


def status_for_stop_reason(reason: str | None) -> str:
    """The manifest/task status for a stop reason: ``completed``, ``stopped`` or ``failed``."""
    if reason in _COMPLETED:
        return "completed"
    if reason in _FAILED:
        return "failed"
    return "stopped"


class _StopRun(Exception):
    """Internal: leave the loop with a stop reason (never escapes the engine)."""

    def __init__(self, reason: StopReason, detail: str | None = None) -> None:
        super().__init__(reason.value)
        self.reason = reason
        self.detail = detail


@dataclass
class _Run:
    """Mutable bookkeeping of one run (never persisted as such)."""

    run_id: str
    task: Task
    state: Any
    journal: RunJournal
    emit: Callable[[EngineEvent], None]
    workspace: str | None
    started: float
    max_steps: int
    steps_from_budget: bool
    max_runtime: float | None
    max_tokens: int | None
    log: Any = None
    tokens_used: int = 0
    records: list[StepRecord] = field(default_factory=list)
    events: list[EngineEvent] = field(default_factory=list)
    observation: Any = None
    control_position: int = 0
    pending: PendingStep | None = None
    step_changes: list[dict[str, Any]] = field(default_factory=list)
    steering: list[str] = field(default_factory=list)
    last_request_view: Any = None
    error: str | None = None
    elapsed_before: float = 0.0
    writer: TraceWriter | None = None
    run_dir: str | None = None
    live: bool = False


class Engine(Generic[StateT, ObservationT, ActionT]):
    """Runs an AgentModule through the canonical loop.

    Args:
        agent: the agent to run.
        budget: default limits (a Task's TaskBudget overrides each field it sets).
        parser: a text protocol parser for model output (defaults to ``agent.model_parser``).
        stop_criteria: extra StopCriteria (FinalResultCriteria always applies).
        critics: Critics consulted after each REDUCE.
        env: an Env that executes actions instead of the ToolRegistry.
        history_policy: reserved for history adapters; stored as given.
        trace_writer: a TraceWriter; or pass ``trace_logdir`` to create one.
        hooks: EngineHooks.
        search: the BranchSelector for ``branch`` decisions (default: first candidate).
        model: the model adapter (defaults to ``agent.llm``).
        lifecycle: a LifecyclePolicy consulted at every boundary and before each tool call.
        context: model-path settings (contributors, budget policy, compactor); see ``qitos.engine.model_path``.
        checkpoint_store: the store used by ``Engine.session``.
        max_critic_retries: how often one step may be retried on a critic's request.
        otel: OpenTelemetry spans: ``True`` (the global tracer provider), a TracerProvider, or
            ``OtelSettings``; off when None/False (see ``qitos.engine.telemetry``).
    """

    def __init__(
        self,
        agent: AgentModule[StateT, ObservationT, ActionT],
        *,
        budget: RuntimeBudget | None = None,
        parser: Any = None,
        stop_criteria: Iterable[Any] | None = None,
        critics: Iterable[Critic] | None = None,
        env: Env | None = None,
        history_policy: Any = None,
        trace_writer: TraceWriter | None = None,
        hooks: Iterable[Any] | None = None,
        search: BranchSelector | None = None,
        model: Any = None,
        lifecycle: LifecyclePolicy | None = None,
        context: Any = None,
        checkpoint_store: Any = None,
        trace_logdir: str | None = None,
        trace_prefix: str | None = None,
        max_critic_retries: int = 2,
        otel: OtelOption = None,
    ) -> None:
        if not isinstance(agent, AgentModule):
            raise ConfigurationError(f"Engine needs an AgentModule, got {type(agent).__name__}")
        self.agent = agent
        self.budget = budget or RuntimeBudget()
        self.parser = parser if parser is not None else agent.model_parser
        self.stop_criteria = [FinalResultCriteria(), *(stop_criteria or [])]
        # FinalResultCriteria is checked inline on the hot path; these are the others.
        self._extra_stop_criteria = [c for c in self.stop_criteria if not isinstance(c, FinalResultCriteria)]
        self.critics = list(critics or [])
        self.env = env
        self.history_policy = history_policy
        self.trace_writer = trace_writer
        self.trace_logdir = trace_logdir
        self.trace_prefix = trace_prefix
        self.hooks = list(hooks or [])
        self.search: BranchSelector = search or FirstCandidateSelector()
        self.model = as_model(model if model is not None else agent.llm)  # a plain callable -> FunctionModel
        self.lifecycle = lifecycle
        self.context = context
        self.checkpoint_store = checkpoint_store
        self.max_critic_retries = max_critic_retries
        # Plain flags (set from any thread; reads and writes of a bool are atomic in CPython).
        self._cancel = False
        self._cancel_immediate = False
        telemetry = otel_hook(otel, engine=self)
        if telemetry is not None:
            self.hooks.append(telemetry)
        self.model_content_events = any(getattr(h, "wants_model_content", False) for h in self.hooks)
        self._hook_table = self._build_hook_table()
        self._event_listeners = [h for h in self.hooks if _overrides(h, "on_event")]
        # Streaming (model_delta events) only for listeners that want it: tracing must not change requests.
        self._delta_listeners = [h for h in self._event_listeners if getattr(h, "wants_model_deltas", True)]
        self._model_path: Any = None

    # ------------------------------------------------------------------ public API

    def cancel(self, *, immediate: bool = False) -> None:
        """Stop the run: after the current step (``cancelled``), or as soon as the current phase
        ends without committing the step (``immediate=True``, ``cancelled_immediate``)."""
        self._cancel_immediate = self._cancel_immediate or immediate
        self._cancel = True

    def run(
        self,
        task: str | Task,
        *,
        workspace: str | None = None,
        max_steps: int | None = None,
        journal: RunJournal | None = None,
        resume: ResumePoint | None = None,
        run_id: str | None = None,
        on_event: Callable[[EngineEvent], None] | None = None,
        **state_kwargs: Any,
    ) -> EngineResult[StateT]:
        """Run ``task`` to a stop and return the EngineResult.

        ``journal``/``resume`` are how durable sessions drive the loop; ``on_event`` receives each
        event as it is emitted (the AsyncEngine uses it).
        """
        self._cancel = False
        self._cancel_immediate = False
        return self._execute(
            Task.coerce(task),
            workspace=workspace,
            max_steps=max_steps,
            journal=journal or RunJournal(),
            resume=resume,
            run_id=run_id or RunIdentity.new().value,
            on_event=on_event,
            state_kwargs=state_kwargs,
        )

    def session(self, task: str | Task, **kwargs: Any) -> Any:
        """A new durable Session for ``task`` bound to this engine's checkpoint store."""
        from qitos.engine.session_runtime import new_session

        return new_session(self, task, **kwargs)

    # ------------------------------------------------------------------ the loop

    def _execute(
        self,
        task: Task,
        *,
        workspace: str | None,
        max_steps: int | None,
        journal: RunJournal,
        resume: ResumePoint | None,
        run_id: str,
        on_event: Callable[[EngineEvent], None] | None,
        state_kwargs: Mapping[str, Any],
    ) -> EngineResult[StateT]:
        writer = self._trace_writer()
        events: list[EngineEvent] = []
        emit = self._event_sinks(events, writer, on_event)
        run_dir = (
            writer.start(run_id, {"task": task.to_dict(), "agent": type(self.agent).__qualname__}) if writer else None
        )
        emit(
            EngineEvent(
                E.RUN_START,
                0,
                phase=P.INIT,
                payload={"run_id": run_id, "task": task.objective, "resumed": resume is not None, "run_dir": run_dir},
            )
        )
        try:
            run = self._start(task, workspace, max_steps, journal, resume, run_id, emit, events, state_kwargs)
        except BaseException as exc:
            # No state exists yet: report the failure, close the stream with run_end, and raise.
            error = f"{type(exc).__name__}: {exc}"
            emit(EngineEvent(E.ERROR, 0, phase=P.INIT, ok=False, error=error))
            emit(EngineEvent(E.RUN_END, 0, phase=P.END, ok=False, error=error, payload={"status": "failed"}))
            if writer is not None:
                writer.finish(
                    "failed", {"stop_reason": StopReason.UNRECOVERABLE_ERROR.value, "error": error, "steps": 0}
                )
            raise
        run.writer, run.run_dir = writer, run_dir
        run.live = on_event is not None or bool(self._delta_listeners)
        stop: StopReason | None = None
        raised: BaseException | None = None
        try:
            stop = self._preflight(run)
            while stop is None:
                stop = self._boundary(run)
                if stop is None:
                    stop = self._step(run)
        except _StopRun as signal:
            stop = signal.reason
            if signal.detail:
                run.error = signal.detail
        except UsageError as exc:
            stop, raised = StopReason.UNRECOVERABLE_ERROR, exc
            run.error = f"{type(exc).__name__}: {exc}"
            run.emit(EngineEvent(E.ERROR, run.state.current_step, phase=P.END, ok=False, error=run.error))
        except (KeyboardInterrupt, SystemExit) as exc:
            # Interrupted from outside: finish the run's records (manifest "stopped"), then re-raise.
            stop, raised = StopReason.CANCELLED_IMMEDIATE, exc
            run.error = f"interrupted by {type(exc).__name__}"
        except Exception as exc:
            stop = StopReason.UNRECOVERABLE_ERROR
            run.error = f"{type(exc).__name__}: {exc}"
            run.emit(
                EngineEvent(
                    E.ERROR,
                    run.state.current_step,
                    phase=P.END,
                    ok=False,
                    error=run.error,
                    payload={"traceback": traceback.format_exc()},
                )
            )
        result = self._finish(run, stop, writer)
        if raised is not None:
            raise raised
        return result

    def _start(
        self,
        task: Task,
        workspace: str | None,
        max_steps: int | None,
        journal: RunJournal,
        resume: ResumePoint | None,
        run_id: str,
        emit: Callable[[EngineEvent], None],
        events: list[EngineEvent],
        state_kwargs: Mapping[str, Any],
    ) -> _Run:
        if resume is not None:
            state = resume.state
        else:
            state = self.agent.init_state(task.objective, **state_kwargs)
            if not isinstance(state, StateSchema):
                raise ConfigurationError(
                    f"{type(self.agent).__name__}.init_state must return a StateSchema, got {type(state).__name__}"
                )
            if not state.task:
                state.task = task.objective
        limit, from_budget = self._step_limit(task, max_steps, state)
        if limit < state.current_step:
            limit = state.current_step
        state.max_steps = limit
        used = dict(resume.budget_used) if resume else {}
        run = _Run(
            run_id=run_id,
            task=task,
            state=state,
            journal=journal,
            emit=emit,
            workspace=workspace,
            started=time.monotonic(),
            max_steps=limit,
            steps_from_budget=from_budget,
            max_runtime=task.budget.max_runtime_seconds or self.budget.max_runtime_seconds,
            max_tokens=task.budget.max_tokens or self.budget.max_tokens,
            log=resume.log if resume else None,
            tokens_used=int(used.get("tokens", 0)),
            events=events,
            control_position=int(used.get("control_position", 0)),
            pending=resume.pending if resume else None,
            elapsed_before=float(used.get("elapsed_seconds", 0.0)),
            step_changes=list(resume.carry_changes) if resume else [],
        )
        if self._hook_table["on_run_start"]:
            ctx = HookContext(run_id, state.current_step, state, journal=journal)
            self._call_hooks("on_run_start", run, ctx)
        return run

    def _step_limit(self, task: Task, max_steps: int | None, state: StateSchema) -> tuple[int, bool]:
        # One step limit per run: the task budget, else the engine budget, else the state's own.
        if task.budget.max_steps is not None:
            return task.budget.max_steps, True
        if max_steps is not None:
            return max_steps, True
        if self.budget.max_steps is not None:
            return self.budget.max_steps, True
        return state.max_steps, False

    def _preflight(self, run: _Run) -> StopReason | None:
        state = run.state
        if state.stop_reason in _RESUMABLE:
            state.stop_reason = None
        elif state.stop_reason is not None:
            # A finished session continues only when steered with a new instruction.
            control = run.journal.control(state.current_step)
            if not control.steering:
                return StopReason(state.stop_reason)
            state.stop_reason = None
            state.final_result = None
        if state.current_step > 0 or run.pending is not None:
            return None  # a resumed run was checked when it started
        problems = run.task.missing_resources(run.workspace)
        spec = run.task.env_spec
        if spec is not None and spec.capabilities:
            if self.env is None:
                problems.append(f"the task needs an environment with {list(spec.capabilities)} but none is set")
            else:
                missing = set(spec.capabilities) - set(getattr(self.env, "capabilities", ()))
                if missing:
                    problems.append(f"the environment lacks capabilities {sorted(missing)}")
        if problems:
            run.error = "task validation failed: " + "; ".join(problems)
            run.emit(EngineEvent(E.ERROR, 0, phase=P.INIT, ok=False, error=run.error))
            return StopReason.TASK_VALIDATION_FAILED
        if self.env is not None:
            run.observation = Observation(env=self.env.reset(run.task))
        return None

    def _boundary(self, run: _Run) -> StopReason | None:
        state = run.state
        step_id = state.current_step
        if self._cancel:
            return StopReason.CANCELLED_IMMEDIATE if self._cancel_immediate else StopReason.CANCELLED
        if run.journal.durable:
            reason = self._take_control(run, run.journal.control(step_id))
            if reason is not None:
                return reason
        if self.lifecycle is not None and run.pending is None:
            context = RuntimeSnapshotContext(step_id, "boundary", None, state, run.run_id)
            if self.lifecycle.should_pause(context):
                run.emit(EngineEvent(E.PAUSE, step_id, phase=P.BOUNDARY, payload={"by": self.lifecycle.policy_id}))
                return StopReason.PAUSED
        if run.pending is not None:
            return None  # finish the interrupted step before any budget check
        if step_id >= run.max_steps:
            return StopReason.BUDGET_STEPS if run.steps_from_budget else StopReason.MAX_STEPS_REACHED
        if run.max_runtime is not None and self._elapsed(run) >= run.max_runtime:
            return StopReason.BUDGET_TIME
        if run.max_tokens is not None and run.tokens_used >= run.max_tokens:
            return StopReason.BUDGET_TOKENS
        return None

    def _take_control(self, run: _Run, control: ControlBatch) -> StopReason | None:
        step_id = run.state.current_step
        for item in control.steering:
            run.steering.append(item.text)
            run.emit(
                EngineEvent(E.STEER, step_id, phase=P.BOUNDARY, payload={"position": item.position, "text": item.text})
            )
        run.control_position = max(run.control_position, control.last_position)
        if control.pause_requested:
            run.emit(EngineEvent(E.PAUSE, step_id, phase=P.BOUNDARY, payload={"by": "pause_request"}))
            return StopReason.PAUSED
        return None

    def _step(self, run: _Run) -> StopReason | None:
        state = run.state
        step_id = state.current_step
        started = time.time()
        t0 = time.perf_counter()
        run.emit(_fast_event(EngineEvent, (E.STEP_START, step_id, None, P.DECIDE, True, {}, None, _now())))
        snapshot = state.to_dict() if self.critics else None
        retries = 0
        while True:
            decision, model_entry, view_summary = self._decide(run, step_id)
            observation = self._act(run, step_id, decision)
            if self._cancel_immediate:
                self._immediate_cancel_point()
            if self._hook_table["on_before_reduce"]:
                self._call_hooks(
                    "on_before_reduce", run, HookContext(run.run_id, step_id, state, decision, observation)
                )
            new_state = self.agent.reduce(state, observation, decision)  # type: ignore[arg-type]
            if new_state is not None and new_state is not state:
                state = run.state = self._adopt_new_state(run, state, new_state)
            run.emit(_fast_event(EngineEvent, (E.REDUCE, step_id, None, P.REDUCE, True, {}, None, _now())))
            if self._hook_table["on_after_reduce"]:
                ctx = HookContext(run.run_id, step_id, state, decision, observation)
                self._call_hooks("on_after_reduce", run, ctx)
            verdicts, verdict = self._critics(run, step_id, decision, observation) if self.critics else _NO_VERDICT
            if verdict is not None and verdict.action == "retry" and retries < self.max_critic_retries and snapshot:
                retries += 1
                state = run.state = type(state).from_dict(snapshot)
                run.step_changes = [{"op": "set", "field": k, "value": v} for k, v in snapshot.items()]
                run.observation = Observation(feedback=f"critic asked to retry: {verdict.reason or ''}".strip())
                run.pending = None
                continue
            break
        if decision.mode == "final" and state.final_result is None:
            state.final_result = decision.final_answer
        stop = self._check_stop(run, decision, verdict)
        stop_value = stop.value if stop is not None else None
        payload = {"stop_reason": stop_value}
        run.emit(_fast_event(EngineEvent, (E.CHECK_STOP, step_id, None, P.CHECK_STOP, True, payload, None, _now())))
        if stop is not None and state.stop_reason is None:
            state.stop_reason = stop.value
        state.current_step = step_id + 1
        changes = run.step_changes
        changes.extend(state.drain_changes())
        run.step_changes = []
        duration_ms = (time.perf_counter() - t0) * 1000.0
        record = StepRecord(
            step_id,
            decision,
            observation,
            changes,
            started,
            duration_ms,
            model_entry,
            view_summary,
            verdicts,
            stop_value,
        )
        run.records.append(record)
        run.pending = None
        run.observation = observation
        lifecycle = "running" if stop is None else _lifecycle_for(stop)
        if run.journal.durable:
            run.journal.commit(self._boundary_commit(run, changes, lifecycle, stop, record=record))
        if run.writer is not None:
            run.writer.step(record.to_dict())
        payload = {"stop_reason": stop_value}
        run.emit(_fast_event(EngineEvent, (E.STEP_END, step_id, None, P.COMMIT, True, payload, None, _now())))
        if self._hook_table["on_step_end"]:
            ctx = HookContext(run.run_id, step_id, state, decision, observation, record)
            self._call_hooks("on_step_end", run, ctx)
        return stop

    def _adopt_new_state(self, run: _Run, old: Any, new: Any) -> Any:
        # reduce returned a new object instead of mutating: record it whole (O(state), only in this case).
        if not isinstance(new, type(old)):
            raise ConfigurationError(f"reduce must return a {type(old).__name__}, got {type(new).__name__}")
        old.drain_changes()
        new.drain_changes()
        run.step_changes = [{"op": "set", "field": k, "value": v} for k, v in new.to_dict().items()]
        return new

    # ------------------------------------------------------------------ phases

    def _decide(self, run: _Run, step_id: int) -> tuple[Decision[Any], dict[str, Any] | None, dict[str, Any] | None]:
        pending = run.pending
        if pending is not None and pending.step_id == step_id:
            resumed = Decision.from_dict(pending.decision)
            run.emit(EngineEvent(E.DECIDE, step_id, phase=P.DECIDE, payload={"mode": resumed.mode, "resumed": True}))
            return resumed, pending.model, pending.request_view
        state = run.state
        if self._hook_table["on_before_decide"]:
            ctx = HookContext(run.run_id, step_id, state)
            self._call_hooks("on_before_decide", run, ctx)
        observation = run.observation
        if run.steering:
            observation = _with_steering(observation, run.steering)
        decision: Decision[Any] | None = self.agent.decide(state, observation)
        model_entry: dict[str, Any] | None = None
        view_summary: dict[str, Any] | None = None
        log_entries: list[dict[str, Any]] = []
        if decision is None:
            decision, model_entry, view_summary, log_entries = self._model_decide(run, step_id)
        elif not isinstance(decision, Decision):
            raise ConfigurationError(
                f"{type(self.agent).__name__}.decide must return a Decision or None, got {type(decision).__name__}"
            )
        run.steering.clear()
        if decision.mode == "branch":
            chosen = self.search.select(decision.candidates, state)
            run.emit(EngineEvent(E.FANOUT, step_id, phase=P.BRANCH, payload={"candidates": len(decision.candidates)}))
            decision = chosen
        changes = state.drain_changes() if state.__dict__.get("_q_changes") else []
        if changes:
            run.step_changes.extend(changes)
        if run.journal.durable:
            # The decision (and what DECIDE did) is durable before any tool runs.
            pending = PendingStep(
                step_id=step_id,
                decision=decision.to_dict(),
                model=model_entry,
                request_view=view_summary,
                log_entries=log_entries,
                state_changes=changes,
                control_position=run.control_position,
            )
            run.pending = pending
            run.journal.record_decision(pending)
        payload = {"mode": decision.mode}
        run.emit(_fast_event(EngineEvent, (E.DECIDE, step_id, None, P.DECIDE, True, payload, None, _now())))
        if self._hook_table["on_after_decide"]:
            ctx = HookContext(run.run_id, step_id, state, decision)
            self._call_hooks("on_after_decide", run, ctx)
        if self._cancel_immediate:
            self._immediate_cancel_point()
        return decision, model_entry, view_summary

    def _model_decide(
        self, run: _Run, step_id: int
    ) -> tuple[Decision[Any], dict[str, Any] | None, dict[str, Any] | None, list[dict[str, Any]]]:
        if self.model is None:
            raise ConfigurationError(
                f"{type(self.agent).__name__}.decide returned None (the model path) but no model is configured; "
                "pass AgentModule(llm=...), Engine(model=...) or compose(model=...)"
            )
        if self._model_path is None:
            from qitos.engine.model_path import ModelPath

            self._model_path = ModelPath(self)
        try:
            outcome = self._model_path.decide(run, step_id)
        except ContextError as exc:
            stop = StopReason.CONTEXT_BUDGET_EXCEEDED if "budget" in type(exc).__name__.lower() else None
            if stop is None:
                raise
            run.emit(EngineEvent(E.ERROR, step_id, phase=P.DECIDE, ok=False, error=str(exc)))
            raise _StopRun(stop, f"{type(exc).__name__}: {exc}") from exc
        if outcome.tokens:
            run.tokens_used += outcome.tokens
        run.last_request_view = outcome.view
        return outcome.decision, outcome.model_entry, outcome.view_summary, outcome.log_entries

    def _act(self, run: _Run, step_id: int, decision: Decision[Any]) -> Observation:
        state = run.state
        if self._hook_table["on_before_act"]:
            ctx = HookContext(run.run_id, step_id, state, decision)
            self._call_hooks("on_before_act", run, ctx)
        if self._cancel_immediate:
            self._immediate_cancel_point()
        if decision.mode != "act":
            observation = Observation()
            run.emit(EngineEvent(E.ACT, step_id, phase=P.ACT, payload={"calls": []}))
            if self._hook_table["on_after_act"]:
                self._call_hooks("on_after_act", run, HookContext(run.run_id, step_id, state, decision, observation))
            return observation
        if self.env is not None:
            observation = Observation(env=self.env.step(decision.actions))
            run.emit(EngineEvent(E.ACT, step_id, phase=P.ACT, payload={"calls": len(decision.actions), "env": True}))
            if self._hook_table["on_after_act"]:
                ctx = HookContext(run.run_id, step_id, state, decision, observation)
                self._call_hooks("on_after_act", run, ctx)
            return observation
        pending = run.pending
        results: list[ToolResult] = []
        for action in decision.actions:
            results.append(self._call_tool(run, step_id, action, pending))
            if self._cancel_immediate:
                self._immediate_cancel_point()
        observation = Observation(results=tuple(results))
        if self._model_path is not None:
            self._model_path.record_results(run, results)
        payload = {"calls": [_call_summary(r) for r in results]}
        run.emit(_fast_event(EngineEvent, (E.ACT, step_id, None, P.ACT, True, payload, None, _now())))
        if self._hook_table["on_after_act"]:
            ctx = HookContext(run.run_id, step_id, state, decision, observation)
            self._call_hooks("on_after_act", run, ctx)
        return observation

    def _call_tool(self, run: _Run, step_id: int, action: Action, pending: PendingStep | None) -> ToolResult:
        registry = self.agent.tool_registry
        spec = registry.get(action.name)
        if pending is not None:
            recorded = pending.results.get(action.id)
            if recorded is not None:
                return ToolResult.from_dict(recorded)
        # Started before a crash, no result recorded: re-run only what is safe to repeat.
        if pending is not None and action.id in pending.started and (spec is None or not spec.idempotent):
            result = ToolResult(
                call_id=action.id,
                name=action.name,
                ok=False,
                error_kind="interrupted",
                error="the call was interrupted (the process stopped while it ran); it was not repeated "
                "because the tool is not idempotent. Check its effects before calling it again.",
            )
            self._record_result(run, step_id, pending, result)
            return result
        if self.lifecycle is not None:
            context = RuntimeSnapshotContext(step_id, "act", action, run.state, run.run_id)
            if self.lifecycle.should_pause(context):
                run.emit(EngineEvent(E.PAUSE, step_id, phase=P.ACT, payload={"before_call": action.id}))
                raise _StopRun(StopReason.PAUSED)
        if spec is not None and spec.needs_approval:
            approval = run.journal.control(step_id, fresh=True).approvals.get(action.id)
            if approval is None:
                run.emit(
                    EngineEvent(
                        E.APPROVAL,
                        step_id,
                        phase=P.ACT,
                        payload={
                            "call_id": action.id,
                            "tool": action.name,
                            "args": dict(action.args),
                            "status": "pending",
                        },
                    )
                )
                raise _StopRun(StopReason.AWAITING_APPROVAL)
            run.emit(
                EngineEvent(
                    E.APPROVAL,
                    step_id,
                    phase=P.ACT,
                    payload={"call_id": action.id, "status": "approved" if approval.approved else "rejected"},
                )
            )
            if not approval.approved:
                result = ToolResult(
                    call_id=action.id,
                    name=action.name,
                    ok=False,
                    error_kind="rejected",
                    error=f"a human rejected this call: {approval.reason or 'no reason given'}",
                )
                self._record_result(run, step_id, pending, result)
                return result
        if pending is not None:
            pending.started.add(action.id)
            run.journal.record_tool_started(step_id, action)
            result = registry.call(action.name, action.args, call_id=action.id)
            self._record_result(run, step_id, pending, result)
            return result
        return registry.call(action.name, action.args, call_id=action.id)

    def _record_result(self, run: _Run, step_id: int, pending: PendingStep | None, result: ToolResult) -> None:
        if pending is not None:
            pending.results[result.call_id] = result.to_dict()
            run.journal.record_tool_result(step_id, result)

    def _critics(
        self, run: _Run, step_id: int, decision: Decision[Any], observation: Observation
    ) -> tuple[list[dict[str, Any]], CriticVerdict | None]:
        if not self.critics:
            return [], None
        verdicts: list[dict[str, Any]] = []
        decisive: CriticVerdict | None = None
        for critic in self.critics:
            verdict = critic.evaluate(run.state, decision, observation) or CriticVerdict()
            verdicts.append({"critic": type(critic).__name__, "action": verdict.action, "reason": verdict.reason})
            if verdict.action != "continue" and decisive is None:
                decisive = verdict
        run.emit(EngineEvent(E.CRITIC, step_id, phase=P.CRITIC, payload={"verdicts": verdicts}))
        return verdicts, decisive

    def _check_stop(self, run: _Run, decision: Decision[Any], verdict: CriticVerdict | None) -> StopReason | None:
        state = run.state
        if state.stop_reason:
            return StopReason(state.stop_reason)
        if verdict is not None and verdict.action == "stop":
            return StopReason.CRITIC_STOP
        if state.final_result is not None:
            return StopReason.FINAL
        for criteria in self._extra_stop_criteria:
            reason = criteria.check(state)
            if reason:
                return StopReason(reason)
        if self.agent.should_stop(state):
            return StopReason.AGENT_STOP
        if self.env is not None and self.env.is_terminal():
            return StopReason.ENV_TERMINAL
        return None

    # ------------------------------------------------------------------ end of run

    def _finish(self, run: _Run, stop: StopReason | None, writer: TraceWriter | None) -> EngineResult[StateT]:
        state = run.state
        reason = stop or StopReason.UNRECOVERABLE_ERROR
        state.stop_reason = reason.value
        status = status_for_stop_reason(reason)
        lifecycle = _lifecycle_for(reason)
        changes = run.step_changes + state.drain_changes()
        run.step_changes = []
        commit_error: Exception | None = None
        try:
            if run.journal.durable:
                run.journal.commit(self._boundary_commit(run, changes, lifecycle, reason, pending=run.pending))
            run.journal.close()
        except Exception as exc:
            # The last boundary could not be made durable (for example another writer moved the head):
            # the run still ends with run_end and a finished trace, then the error is raised.
            commit_error = exc
            status = "failed"
            run.error = f"{type(exc).__name__}: {exc}"
            run.emit(EngineEvent(E.ERROR, state.current_step, phase=P.COMMIT, ok=False, error=run.error))
        elapsed = self._elapsed(run)
        task_result = TaskResult(
            task_id=run.task.id,
            status=status,  # type: ignore[arg-type]
            stop_reason=reason.value,
            final_result=state.final_result,
            steps=state.current_step,
            success_criteria=tuple(run.task.success_criteria),
            error=run.error,
            elapsed_seconds=elapsed,
            token_usage={"total_tokens": run.tokens_used},
        )
        run.emit(
            EngineEvent(
                E.RUN_END,
                state.current_step,
                phase=P.END,
                ok=status != "failed",
                payload={
                    "stop_reason": reason.value,
                    "status": status,
                    "steps": state.current_step,
                    "final_result": state.final_result,
                },
                error=run.error,
            )
        )
        result: EngineResult[StateT] = EngineResult(
            state=state,
            records=run.records,
            events=run.events,
            step_count=state.current_step,
            task_result=task_result,
            run_id=run.run_id,
            run_dir=run.run_dir,
        )
        if writer is not None:
            writer.finish(
                status,
                {
                    "stop_reason": reason.value,
                    "final_result": state.final_result,
                    "steps": state.current_step,
                    "token_usage": {"total_tokens": run.tokens_used},
                    "elapsed_seconds": round(elapsed, 6),
                    "error": run.error,
                },
            )
        if self._hook_table["on_run_end"]:
            ctx = HookContext(run.run_id, state.current_step, state, result=result)
            self._call_hooks("on_run_end", run, ctx)
        if commit_error is not None:
            raise commit_error
        return result

    def _boundary_commit(
        self,
        run: _Run,
        changes: list[dict[str, Any]],
        lifecycle: str,
        stop: StopReason | None,
        *,
        record: StepRecord | None = None,
        pending: PendingStep | None = None,
    ) -> BoundaryCommit:
        return BoundaryCommit(
            step_id=run.state.current_step,
            state=run.state,
            state_changes=changes,
            log=run.log,
            lifecycle=lifecycle,
            stop_reason=stop.value if stop else None,
            budget_used={
                "steps": run.state.current_step,
                "tokens": run.tokens_used,
                "elapsed_seconds": round(self._elapsed(run), 6),
                "control_position": run.control_position,
            },
            control_position=run.control_position,
            pending=pending,
            record=record,
            request_view=run.last_request_view,
        )

    # ------------------------------------------------------------------ plumbing

    def _trace_writer(self) -> TraceWriter | None:
        writer = self.trace_writer
        if writer is None and self.trace_logdir is not None:
            writer = TraceWriter(self.trace_logdir, prefix=self.trace_prefix)
        if writer is not None:
            writer.redact.add_all(model_credentials(self.model))
        return writer

    def _event_sinks(
        self,
        events: list[EngineEvent],
        writer: TraceWriter | None,
        on_event: Callable[[EngineEvent], None] | None,
    ) -> Callable[[EngineEvent], None]:
        listeners = self._event_listeners
        redactor = writer.redact if writer is not None else Redactor(model_credentials(self.model))
        if writer is None and on_event is None and not listeners:
            return redacting_sink(events.append, redactor)

        def record(event: EngineEvent) -> None:
            events.append(event)
            if writer is not None:
                writer.event(event.to_dict())
            if on_event is not None:
                on_event(event)

        def emit(event: EngineEvent) -> None:
            # Listeners see the event first, so an error they raise is recorded before it (run_end stays last).
            for hook in listeners:
                try:
                    hook.on_event(event)
                except Exception as exc:
                    error = f"hook {type(hook).__name__}.on_event raised {type(exc).__name__}: {exc}"
                    failure = EngineEvent(
                        E.ERROR, event.step_id, ok=False, error=error, payload={"hook": type(hook).__name__}
                    )
                    record(redact_event(failure, redactor))
            record(event)

        return redacting_sink(emit, redactor)

    def _build_hook_table(self) -> dict[str, list[Any]]:
        return {name: [h for h in self.hooks if _overrides(h, name)] for name in HOOK_METHODS}

    def _call_hooks(self, name: str, run: _Run, ctx: HookContext) -> None:
        for hook in self._hook_table[name]:
            try:
                getattr(hook, name)(ctx)
            except Exception as exc:
                run.emit(
                    EngineEvent(
                        E.ERROR,
                        ctx.step_id,
                        ok=False,
                        error=f"hook {type(hook).__name__}.{name} raised {type(exc).__name__}: {exc}",
                        payload={"hook": type(hook).__name__, "method": name},
                    )
                )

    def _immediate_cancel_point(self) -> None:
        if self._cancel_immediate and self._cancel:
            raise _StopRun(StopReason.CANCELLED_IMMEDIATE)

    def _elapsed(self, run: _Run) -> float:
        return run.elapsed_before + (time.monotonic() - run.started)


def _overrides(hook: Any, name: str) -> bool:
    method = getattr(type(hook), name, None)
    if method is None:
        return False
    base = getattr(EngineHook, name, None)
    return method is not base


_NO_VERDICT: tuple[list[dict[str, Any]], CriticVerdict | None] = ([], None)


def _call_summary(result: ToolResult) -> dict[str, Any]:
    if result.ok:
        return {"call_id": result.call_id, "tool": result.name, "ok": True}
    return {"call_id": result.call_id, "tool": result.name, "ok": False, "error_kind": result.error_kind}


def _lifecycle_for(reason: StopReason) -> str:
    if reason is StopReason.PAUSED:
        return "paused"
    if reason is StopReason.AWAITING_APPROVAL:
        return "awaiting_approval"
    return status_for_stop_reason(reason)


def _with_steering(observation: Any, steering: list[str]) -> Observation:
    base = observation if isinstance(observation, Observation) else Observation(env=observation)
    text = "\n".join(steering)
    feedback = f"{base.feedback}\n{text}" if base.feedback else text
    return Observation(results=base.results, env=base.env, feedback=feedback)
