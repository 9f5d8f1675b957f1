"""``EngineLoop``: the one canonical decide -> act -> reduce loop (``Engine`` adds sessions to it).

Every entry point runs this loop: ``AgentModule.run``, ``Engine.run``, ``AsyncEngine.arun`` /
``arun_stream`` and ``Session.run`` / ``Session.arun`` (with a durable journal). The loop is written
once, free of I/O: it is a generator (``EngineLoop._execute``) that yields an effect whenever it needs the
model, a tool, the store or an environment (``qitos.engine._effects``), and one of two drivers
(``qitos.engine._drivers``) performs them: :func:`~qitos.engine._drivers.drive` in the calling thread
for ``run``, :class:`~qitos.engine._drivers.AsyncDriver` on an event loop for ``arun``. Per step:

1. boundary: cancellation, pause requests and the LifecyclePolicy, steering intake, budgets;
2. DECIDE: the agent's ``decide`` hook, or the model path when it returns None;
3. branch resolution by the BranchSelector;
4. ACT: tool calls through the ToolRegistry (or the Env); failures become observations. The
   calls of one decision run in the groups ``qitos.engine._call_plan`` makes: consecutive
   ``concurrency_safe`` calls together (at most ``max_parallel_tools`` at a time), every other call
   alone; results keep the decision's order. A sub-agent tool's call in a durable session runs a
   child session (``qitos.engine._delegation``);
5. REDUCE: ``agent.reduce(state, observation, decision)``;
6. CRITICS and CHECK_STOP;
7. COMMIT: the step record, the state diff, the journal boundary, events.

Steering is taken in at a boundary only when the step goes on to DECIDE, and counts as consumed
(the control cursor moves past it) only once it has been handed to ``decide`` / the exchange log: a
boundary that stops (pause request, lifecycle pause, budget) leaves it for the next run. A pause
request is consumed by the stop it causes (``pause_position``), independently of the cursor.

The trace is a projection of what was committed: a step's record goes to ``steps.jsonl`` after its
boundary is durable (for a durable journal: when the journal reports it flushed), never before.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from qitos.checkpoint.store import CheckpointStore
from qitos.core._agent_module import AgentModule
from qitos.core._decision import Action, Decision, Observation
from qitos.core._errors import CheckpointError, ConfigurationError, ContextError, UsageError
from qitos.core._identity import RunIdentity
from qitos.core._redaction import Redactor, model_credentials
from qitos.core._state import StateSchema, StopReason
from qitos.core._task import Env, Task, TaskResult
from qitos.core._tool import ToolResult
from qitos.core.request_view import CompactionPolicy, SummarizingCompactionPolicy
from qitos.engine._agent_context import check_history_policy
from qitos.engine._call_plan import plan_calls
from qitos.engine._call_start import RecordedStart, StepResults
from qitos.engine._drivers import AsyncDriver, Backpressure, drive
from qitos.engine._effects import BOUNDARY, BlockingCall, JournalCall, Loop, StartedToolCall, ToolBatch, ToolCall
from qitos.engine._event_redaction import redact_event, redacting_sink
from qitos.engine._events import EngineEvent, EngineEventType, EngineResult, RuntimePhase, StepRecord
from qitos.engine._handoff import handoff_of
from qitos.engine._hooks import HOOK_METHODS, EngineHook, HookContext
from qitos.engine._model_path import ModelContext, ModelPath, record_results
from qitos.engine._policies import (
    BranchSelector,
    Critic,
    CriticVerdict,
    FinalResultCriteria,
    FirstCandidateSelector,
    StopCriteria,
)
from qitos.engine._run_context import RunContext, StopRun
from qitos.engine._subagent import (
    ChildOutcome,
    ChildRequest,
    FanoutCall,
    FanoutRequest,
    FanoutRunner,
    SubAgentCall,
    SubAgentRunner,
    child_session_id,
)
from qitos.engine._telemetry import OtelOption, otel_hook
from qitos.engine._tool_threads import ToolThreads
from qitos.engine.runtime import LifecyclePolicy, RuntimeBudget, RuntimeSnapshotContext
from qitos.kit.parsers._base import DecisionParser
from qitos.models._function import ModelSource, as_model
from qitos.sessions._journal import BoundaryCommit, ControlBatch, PendingStep, ResumePoint, RunJournal
from qitos.trace._writer import TraceWriter

__all__ = ["DEFAULT_TOOL_WORKERS", "EngineLoop", "status_for_stop_reason"]

StateT = TypeVar("StateT", bound=StateSchema)
ObservationT = TypeVar("ObservationT")
ActionT = TypeVar("ActionT")

E = EngineEventType
P = RuntimePhase
_now = time.time
# The per-step events are built with tuple.__new__ (EngineEvent is an immutable NamedTuple): the
# same object as EngineEvent(...), without a Python-level call, six times per step.
_fast_event = tuple.__new__

DEFAULT_TOOL_WORKERS = 8
"""Size of the process-wide executor that runs sync tools for async runs given no executor of their own."""

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
        StopReason.MAX_STEPS_REACHED,
        "budget_steps",  # the same stop, as sessions stored by earlier versions name it
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


class EngineLoop(Generic[StateT, ObservationT, ActionT]):
    """Runs an AgentModule through the canonical loop (``qitos.engine._engine.Engine`` is the public class).

    Args:
        agent: the agent to run.
        budget: default limits (a Task's TaskBudget overrides each field it sets).
        parser: a text protocol parser for model output (defaults to ``agent.model_parser``).
        stop_criteria: extra StopCriteria (FinalResultCriteria always applies).
        critics: Critics consulted after each REDUCE.
        env: an Env that executes actions instead of the ToolRegistry.
        history_policy: a compaction policy shaping what the model sees of the run's history (used when
            ``context`` names none; see ``qitos.engine._agent_context``); anything else is refused.
        trace_writer: a TraceWriter; or pass ``trace_logdir`` to create one.
        hooks: EngineHooks.
        search: the BranchSelector for ``branch`` decisions (default: first candidate).
        model: the model adapter (defaults to ``agent.llm``); a plain function ``messages -> text``
            is wrapped as a ``FunctionModel``, anything else raises ConfigurationError.
        lifecycle: a LifecyclePolicy consulted at every boundary and before each tool call.
        context: model-path settings (contributors, budget policy, compactor); see ``qitos.engine._model_path``.
        checkpoint_store: the store used by ``Engine.session``.
        max_critic_retries: how often one step may be retried on a critic's request.
        otel: OpenTelemetry spans: ``True`` (the global tracer provider), a TracerProvider, or
            ``OtelSettings``; off when None/False (see ``qitos.engine._telemetry``).
        tool_workers: size of this engine's own executor for sync tools and other blocking calls
            made by async runs (``arun``); None: ``tool_executor``, else a process-wide executor of
            ``DEFAULT_TOOL_WORKERS`` threads shared by all engines.
        tool_executor: an executor to use for that instead (shared with other engines, say).
        max_parallel_tools: how many ``concurrency_safe`` calls of one decision may run at the same
            time (1: every call runs alone, in order).
    """

    def __init__(
        self,
        agent: AgentModule[StateT, ObservationT, ActionT],
        *,
        budget: RuntimeBudget | None = None,
        parser: DecisionParser | None = None,
        stop_criteria: Iterable[StopCriteria] | None = None,
        critics: Iterable[Critic] | None = None,
        env: Env | None = None,
        history_policy: CompactionPolicy | SummarizingCompactionPolicy | None = None,
        trace_writer: TraceWriter | None = None,
        hooks: Iterable[Any] | None = None,
        search: BranchSelector | None = None,
        model: ModelSource | None = None,
        lifecycle: LifecyclePolicy | None = None,
        context: object = None,
        checkpoint_store: CheckpointStore | None = None,
        trace_logdir: str | None = None,
        trace_prefix: str | None = None,
        max_critic_retries: int = 2,
        otel: OtelOption = None,
        tool_workers: int | None = None,
        tool_executor: concurrent.futures.Executor | None = None,
        max_parallel_tools: int = DEFAULT_TOOL_WORKERS,
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
        self.history_policy = check_history_policy(history_policy, context)
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
        if tool_workers is not None and (isinstance(tool_workers, bool) or tool_workers < 1):
            raise ConfigurationError(f"tool_workers must be a positive int, got {tool_workers!r}")
        if tool_workers is not None and tool_executor is not None:
            raise ConfigurationError("pass tool_workers or tool_executor, not both")
        self.tool_workers = tool_workers
        self._tool_executor = tool_executor
        if isinstance(max_parallel_tools, bool) or not isinstance(max_parallel_tools, int) or max_parallel_tools < 1:
            raise ConfigurationError(f"max_parallel_tools must be a positive int, got {max_parallel_tools!r}")
        self.max_parallel_tools = max_parallel_tools
        # The runs in progress (several at once under arun); cancel() reaches each of them.
        self._active: set[RunContext] = set()
        telemetry = otel_hook(otel, engine=self)
        if telemetry is not None:
            self.hooks.append(telemetry)
        self.model_content_events = any(getattr(h, "wants_model_content", False) for h in self.hooks)
        self._hook_table = self._build_hook_table()
        self._event_listeners = [h for h in self.hooks if _overrides(h, "on_event")]
        # Streaming (model_delta events) only for listeners that want it: tracing must not change requests.
        self._delta_listeners = [h for h in self._event_listeners if getattr(h, "wants_model_deltas", True)]
        self._model_path: ModelPath | None = None

    # ------------------------------------------------------------------ public API

    def cancel(self, *, immediate: bool = False) -> None:
        """Stop the runs in progress: after the current step (``cancelled``), or as soon as the
        current phase ends without committing the step (``immediate=True``, ``cancelled_immediate``).

        To stop one run among several ``arun`` calls, cancel the task awaiting it instead.
        """
        for run in list(self._active):
            run.request_cancel(immediate=immediate)

    @property
    def tool_executor(self) -> concurrent.futures.Executor:
        """The bounded executor async runs use for sync tools and other blocking calls."""
        executor = self._tool_executor
        if executor is None:
            if self.tool_workers is None:
                return _shared_executor()
            executor = self._tool_executor = ToolThreads(self.tool_workers)
        return executor

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
        event as it is emitted (and makes the model stream, unless it has ``wants_model_deltas =
        False``, as ``qitos.engine._progress.ProgressPrinter`` has). Effects are performed in the
        calling thread (the sync driver).
        """
        return drive(
            self._execute(
                Task.coerce(task),
                workspace=workspace,
                max_steps=max_steps,
                journal=journal or RunJournal(),
                resume=resume,
                run_id=run_id or RunIdentity.new().value,
                on_event=on_event,
                state_kwargs=state_kwargs,
            )
        )

    async def arun(
        self,
        task: str | Task,
        *,
        workspace: str | None = None,
        max_steps: int | None = None,
        journal: RunJournal | None = None,
        resume: ResumePoint | None = None,
        run_id: str | None = None,
        on_event: Callable[[EngineEvent], None] | None = None,
        backpressure: Backpressure | None = None,
        **state_kwargs: Any,
    ) -> EngineResult[StateT]:
        """``run`` through the async driver, on the running event loop (see ``qitos.engine._drivers``).

        ``backpressure``: a bounded event consumer the run waits for at its boundaries (used by
        ``AsyncEngine.arun_stream``). Cancelling the awaiting task stops the run as
        ``cancel(immediate=True)`` does, then raises ``CancelledError``.
        """
        driver = AsyncDriver(self.tool_executor, backpressure=backpressure)
        return await driver.drive(
            self._execute(
                Task.coerce(task),
                workspace=workspace,
                max_steps=max_steps,
                journal=journal or RunJournal(),
                resume=resume,
                run_id=run_id or RunIdentity.new().value,
                on_event=on_event,
                state_kwargs=state_kwargs,
                boundary_yields=True,
            )
        )

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
        boundary_yields: bool = False,
    ) -> Loop[EngineResult[StateT]]:
        """The whole run as a generator of effects (see the module docstring); a driver runs it."""
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
                payload={
                    "run_id": run_id,
                    "task": task.objective,
                    "resumed": resume is not None and not resume.fresh,
                    "run_dir": run_dir,
                },
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
        run.live = (on_event is not None and getattr(on_event, "wants_model_deltas", True)) or bool(
            self._delta_listeners
        )
        stop: StopReason | None = None
        raised: BaseException | None = None
        self._active.add(run)
        try:
            stop = yield from self._preflight(run)
            if stop is None:
                stop = yield from self._steps(run, boundary_yields)
        except StopRun as signal:
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
            if isinstance(exc, CheckpointError) and run.journal.durable:
                # The store failed under the run (a lost connection, a write refused to a fenced-off
                # runner): no outcome of the session's, so none is committed. The session stays at
                # its last durable boundary and pending writes, for a later run to resume, and the
                # error reaches the caller.
                raised = exc
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
        finally:
            self._active.discard(run)
        result = yield from self._finish(run, stop, writer, commit_stop=not isinstance(raised, CheckpointError))
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
    ) -> RunContext:
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
        limit = self._step_limit(task, max_steps, state)
        if limit < state.current_step:
            limit = state.current_step
        state.max_steps = limit
        used = dict(resume.budget_used) if resume else {}
        run = RunContext(
            run_id=run_id,
            task=task,
            state=state,
            journal=journal,
            emit=emit,
            workspace=workspace,
            started=time.monotonic(),
            max_steps=limit,
            max_runtime=task.budget.max_runtime_seconds or self.budget.max_runtime_seconds,
            max_tokens=task.budget.max_tokens or self.budget.max_tokens,
            log=resume.log if resume else None,
            tokens_used=int(used.get("tokens", 0)),
            events=events,
            control_position=int(used.get("control_position", 0)),
            pause_position=int(used.get("pause_position", 0)),
            pending=resume.pending if resume else None,
            elapsed_before=float(used.get("elapsed_seconds", 0.0)),
            step_changes=list(resume.carry_changes) if resume else [],
            first_step=state.current_step,
            tokens_before=int(used.get("tokens", 0)),
        )
        if self._hook_table["on_run_start"]:
            ctx = HookContext(run_id, state.current_step, state, journal=journal)
            self._call_hooks("on_run_start", run, ctx)
        return run

    def _step_limit(self, task: Task, max_steps: int | None, state: StateSchema) -> int:
        # One step limit per run: the task budget, else the engine budget, else the state's own.
        if task.budget.max_steps is not None:
            return task.budget.max_steps
        if max_steps is not None:
            return max_steps
        if self.budget.max_steps is not None:
            return self.budget.max_steps
        return state.max_steps

    def _preflight(self, run: RunContext) -> Loop[StopReason | None]:
        state = run.state
        if state.stop_reason in _RESUMABLE:
            state.stop_reason = None
        elif state.stop_reason is not None:
            # A finished session continues only when steered with a new instruction.
            control = yield JournalCall(run.journal, "control", (state.current_step,))
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
            run.observation = Observation(env=(yield BlockingCall(self.env.reset, run.task)))
        return None

    def _boundary(self, run: RunContext, control: ControlBatch | None) -> StopReason | None:
        """The boundary's checks, given the control items a durable journal reported (else None).

        Stop conditions come first; steering is taken in only when the step goes on.
        """
        state = run.state
        step_id = state.current_step
        if run.cancel:
            return StopReason.CANCELLED_IMMEDIATE if run.cancel_immediate else StopReason.CANCELLED
        if control is not None and control.pause_requested:
            run.pause_position = max(run.pause_position, control.pause_position)
            run.emit(EngineEvent(E.PAUSE, step_id, phase=P.BOUNDARY, payload={"by": "pause_request"}))
            return StopReason.PAUSED
        if self.lifecycle is not None and run.pending is None:
            context = RuntimeSnapshotContext(step_id, "boundary", None, state, run.run_id)
            if self.lifecycle.should_pause(context):
                run.emit(EngineEvent(E.PAUSE, step_id, phase=P.BOUNDARY, payload={"by": self.lifecycle.policy_id}))
                return StopReason.PAUSED
        if run.pending is not None:
            return None  # finish the interrupted step before any budget check (steering waits for DECIDE)
        if step_id >= run.max_steps:
            return StopReason.MAX_STEPS_REACHED
        if run.max_runtime is not None and self._elapsed(run) >= run.max_runtime:
            return StopReason.BUDGET_TIME
        if run.max_tokens is not None and run.tokens_used >= run.max_tokens:
            return StopReason.BUDGET_TOKENS
        if control is not None and control.steering:
            self._take_steering(run, control)
        return None

    def _take_steering(self, run: RunContext, control: ControlBatch) -> None:
        """Hand the steering to the DECIDE that follows this boundary (only a boundary that lets its
        step go on takes it in, so only now does the cursor pass it)."""
        step_id = run.state.current_step
        for item in control.steering:
            run.steering.append(item.text)
            run.emit(
                EngineEvent(E.STEER, step_id, phase=P.BOUNDARY, payload={"position": item.position, "text": item.text})
            )
        run.control_position = max(run.control_position, control.last_position)

    def _steps(self, run: RunContext, boundary_yields: bool) -> Loop[StopReason]:
        """Boundaries and steps until a stop (one generator for the whole run, not one per step).

        ``boundary_yields``: yield ``BOUNDARY`` at each boundary (the async driver uses it; the sync
        driver would only skip it). A phase that may need effects (the model, a branch, the journal,
        tools that need something around their call) is entered with ``yield from`` only when it
        does, so a plain step runs in this one generator.
        """
        plain_call = ToolCall(self.agent.tool_registry, "", None, "")  # refilled for each plain call
        while True:
            if boundary_yields:
                yield BOUNDARY
            control = (yield self._control_call(run)) if run.journal.durable else None
            stop = self._boundary(run, control)
            if stop is not None:
                return stop
            step = _Step(run, with_snapshot=bool(self.critics))  # announces step_start
            while True:  # one pass per step, another when a critic sends the step back
                # DECIDE: the agent's decide hook, else the model path; then one decision is kept
                if run.pending is not None and run.pending.step_id == step.id:
                    decision = self._resumed_decision(run, step, run.pending)
                else:
                    decided = self._ask_agent(run, step)
                    if decided is None:
                        decided = yield from self._model_decide(run, step)
                    if decided.mode == "branch" or run.journal.durable:
                        decided = yield from self._settle_decision(run, step, decided)
                    decision = self._decided(run, step.id, decided)
                # ACT: the tool calls (or the Env); their results are the observation
                observation = self._act_without_tools(run, step.id, decision)
                if observation is None and self._calls_are_plain(run, decision, plain_call):
                    results: list[ToolResult] = []
                    for action in decision.actions:
                        results.append((yield self._plain_call(run, plain_call, action)))
                    observation = self._acted(run, step.id, decision, results)
                elif observation is None:
                    observation = yield from self._act(run, step.id, decision)
                # REDUCE, then the critics, who may send the step back to DECIDE
                self._reduce(run, step.id, decision, observation)
                if not self.critics or not self._critic_retry(run, step, decision, observation):
                    break
            # CHECK_STOP and COMMIT
            stop, record = self._close_step(run, step, decision, observation)
            if run.journal.durable:
                yield from self._commit_step(run, record, stop)
            elif run.writer is not None:
                run.writer.step(record.to_dict())
            self._end_step(run, record)
            if stop is not None:
                return stop

    # ------------------------------------------------------------------ step phases

    def _control_call(self, run: RunContext) -> JournalCall:
        """The effect that reads a durable journal's control items at a boundary."""
        return JournalCall(run.journal, "control", (run.state.current_step,))

    def _ask_agent(self, run: RunContext, step: _Step) -> Decision[Any] | None:
        """The agent's ``decide`` hook, around its hooks; None sends DECIDE down the model path."""
        state = run.state
        if self._hook_table["on_before_decide"]:
            self._call_hooks("on_before_decide", run, HookContext(run.run_id, step.id, state))
        seen: Any = _with_steering(run.observation, run.steering) if run.steering else run.observation
        decided: Decision[Any] | None = self.agent.decide(state, seen)
        step.model_entry = step.view_summary = None
        step.log_entries = _NO_ENTRIES
        if decided is not None and not isinstance(decided, Decision):
            raise ConfigurationError(
                f"{type(self.agent).__name__}.decide must return a Decision or None, got {type(decided).__name__}"
            )
        return decided

    def _settle_decision(self, run: RunContext, step: _Step, decided: Decision[Any]) -> Loop[Decision[Any]]:
        """What a ``branch`` decision (resolved to one candidate, in forked child sessions when the
        selector fans out) or a durable journal (the decision is recorded) needs before ``_decided``."""
        run.steering.clear()
        if decided.mode != "branch":
            decision = decided
        elif isinstance(self.search, FanoutRunner) and run.journal.durable:
            decision = yield from self._fan_out(run, step.id, decided, self.search)
        else:
            decision = self._resolve_branch(run, step.id, decided)
        changes = _state_changes(run.state)
        if changes:
            run.step_changes.extend(changes)
        if run.journal.durable:
            yield from self._record_decision(
                run, step.id, decision, step.model_entry, step.view_summary, step.log_entries, changes
            )
        return decision

    def _decided(self, run: RunContext, step_id: int, decision: Decision[Any]) -> Decision[Any]:
        """DECIDE is over: the steering it saw is used up, the state changes made while deciding join
        the step's (both already done when ``_settle_decision`` ran: then nothing is left to do), the
        decision is announced, its hooks run, and an immediate cancel may stop the step."""
        run.steering.clear()
        changes = _state_changes(run.state)
        if changes:
            run.step_changes.extend(changes)
        mode: dict[str, Any] = {"mode": decision.mode}
        run.emit(_fast_event(EngineEvent, (E.DECIDE, step_id, None, P.DECIDE, True, mode, None, _now())))
        if self._hook_table["on_after_decide"]:
            self._call_hooks("on_after_decide", run, HookContext(run.run_id, step_id, run.state, decision))
        if run.cancel_immediate:
            self._immediate_cancel_point(run)
        return decision

    def _calls_are_plain(self, run: RunContext, decision: Decision[Any], plain_call: ToolCall) -> bool:
        """Whether every call of ``decision`` is plain: made through the registry one after the
        other, with nothing to journal, check or approve around it (then ``plain_call`` serves them)."""
        if self.env is not None or run.pending is not None or self.lifecycle is not None:
            return False
        registry = plain_call.registry = self.agent.tool_registry  # the agent may swap it
        actions = decision.actions
        if len(actions) > 1 and self.max_parallel_tools > 1 and len(plan_calls(registry, actions)) < len(actions):
            return False  # some calls run together
        for action in actions:
            spec = registry.get(action.name)
            if spec is None or spec.needs_approval:
                return False
        return True

    def _plain_call(self, run: RunContext, call: ToolCall, action: Action) -> ToolCall:
        """The run's one plain ``ToolCall`` refilled for ``action`` (no allocation per call, see
        effects), once an immediate cancel had its chance to stop the step (as after every call)."""
        if run.cancel_immediate:
            self._immediate_cancel_point(run)
        call.name, call.args, call.call_id = action.name, action.args, action.id
        return call

    def _act(self, run: RunContext, step_id: int, decision: Decision[Any]) -> Loop[Observation]:
        """ACT for calls that are not plain: through the Env, in concurrent groups, or each with
        what it needs (journal records, the LifecyclePolicy, an approval, a child session)."""
        if self.env is not None:
            return (yield from self._act_env(run, step_id, decision, self.env))
        pending = run.pending
        actions = decision.actions
        together = len(actions) > 1 and self.max_parallel_tools > 1
        groups = plan_calls(self.agent.tool_registry, actions) if together else [(action,) for action in actions]
        results: list[ToolResult] = []
        for group in groups:
            if len(group) > 1:
                results.extend((yield from self._call_batch(run, step_id, group, pending)))
            else:
                results.append((yield from self._call_tool(run, step_id, group[0], pending)))
            if run.cancel_immediate:
                self._immediate_cancel_point(run)
        return self._acted(run, step_id, decision, results)

    def _reduce(self, run: RunContext, step_id: int, decision: Decision[Any], observation: Observation) -> None:
        """REDUCE: the agent folds the observation into its state (in place, or as a new state)."""
        if run.cancel_immediate:
            self._immediate_cancel_point(run)
        state = run.state
        if self._hook_table["on_before_reduce"]:
            self._call_hooks("on_before_reduce", run, HookContext(run.run_id, step_id, state, decision, observation))
        new_state = self.agent.reduce(state, observation, decision)  # type: ignore[arg-type]
        if new_state is not None and new_state is not state:
            state = run.state = self._adopt_new_state(run, state, new_state)
        run.emit(_fast_event(EngineEvent, (E.REDUCE, step_id, None, P.REDUCE, True, {}, None, _now())))
        if self._hook_table["on_after_reduce"]:
            self._call_hooks("on_after_reduce", run, HookContext(run.run_id, step_id, state, decision, observation))

    def _critic_retry(self, run: RunContext, step: _Step, decision: Decision[Any], observation: Observation) -> bool:
        """The critics' verdicts on the step; True when one asks for a retry the step may still make
        (the state is then put back as it was when the step began)."""
        step.verdicts, verdict = self._critics(run, step.id, decision, observation)
        step.verdict = verdict
        snapshot = step.snapshot
        if verdict is None or verdict.action != "retry" or step.retries >= self.max_critic_retries or not snapshot:
            return False
        step.retries += 1
        run.state = type(run.state).from_dict(snapshot)
        run.step_changes = [{"op": "set", "field": k, "value": v} for k, v in snapshot.items()]
        run.observation = Observation(feedback=f"critic asked to retry: {verdict.reason or ''}".strip())
        run.pending = None
        return True

    def _close_step(
        self, run: RunContext, step: _Step, decision: Decision[Any], observation: Observation
    ) -> tuple[StopReason | None, StepRecord]:
        """CHECK_STOP, then the step's record: the state moves to the next step."""
        state = run.state
        if decision.mode == "final" and state.final_result is None:
            state.final_result = decision.final_answer
        stop = self._check_stop(run, decision, step.verdict)
        stop_value = stop.value if stop is not None else None
        payload = {"stop_reason": stop_value}
        run.emit(_fast_event(EngineEvent, (E.CHECK_STOP, step.id, None, P.CHECK_STOP, True, payload, None, _now())))
        if stop is not None and state.stop_reason is None:
            state.stop_reason = stop.value
        state.current_step = step.id + 1
        changes = run.step_changes
        changes.extend(state.drain_changes())
        run.step_changes = []
        record = StepRecord(
            step.id,
            decision,
            observation,
            changes,
            step.started,
            (time.perf_counter() - step.t0) * 1000.0,
            step.model_entry,
            step.view_summary,
            step.verdicts,
            stop_value,
        )
        run.records.append(record)
        run.pending = None
        run.observation = observation
        return stop, record

    def _commit_step(self, run: RunContext, record: StepRecord, stop: StopReason | None) -> Loop[None]:
        """COMMIT to a durable journal: the step's boundary (the trace follows once it is durable)."""
        lifecycle = "running" if stop is None else _lifecycle_for(stop)
        boundary = self._boundary_commit(run, record.state_diff, lifecycle, stop, record=record)
        yield JournalCall(run.journal, "commit", (boundary,))
        run.last_commit = boundary
        if run.writer is not None:
            self._trace_committed(run)

    def _end_step(self, run: RunContext, record: StepRecord) -> None:
        """The step is committed: ``step_end`` is announced and the ``on_step_end`` hooks run."""
        payload = {"stop_reason": record.stop_reason}
        step_id = record.step_id
        run.emit(_fast_event(EngineEvent, (E.STEP_END, step_id, None, P.COMMIT, True, payload, None, _now())))
        if self._hook_table["on_step_end"]:
            ctx = HookContext(run.run_id, step_id, run.state, record.decision, record.observation, record)
            self._call_hooks("on_step_end", run, ctx)

    def _adopt_new_state(self, run: RunContext, old: Any, new: Any) -> Any:
        # reduce returned a new object instead of mutating: record it whole (O(state), only in this case).
        if not isinstance(new, type(old)):
            raise ConfigurationError(f"reduce must return a {type(old).__name__}, got {type(new).__name__}")
        old.drain_changes()
        new.drain_changes()
        run.step_changes = [{"op": "set", "field": k, "value": v} for k, v in new.to_dict().items()]
        return new

    # ------------------------------------------------------------------ phases

    def _resumed_decision(self, run: RunContext, step: _Step, pending: PendingStep) -> Decision[Any]:
        """The decision of an interrupted step being finished (it is never decided again)."""
        resumed = Decision.from_dict(pending.decision)
        run.emit(EngineEvent(E.DECIDE, step.id, phase=P.DECIDE, payload={"mode": resumed.mode, "resumed": True}))
        step.model_entry, step.view_summary = pending.model, pending.request_view
        return resumed

    def _resolve_branch(self, run: RunContext, step_id: int, decision: Decision[Any]) -> Decision[Any]:
        """The candidate the BranchSelector picks from a ``branch`` decision."""
        chosen: Decision[Any] = self.search.select(decision.candidates, run.state)
        run.emit(EngineEvent(E.FANOUT, step_id, phase=P.BRANCH, payload={"candidates": len(decision.candidates)}))
        return chosen

    def _fan_out(
        self, run: RunContext, step_id: int, decision: Decision[Any], runner: FanoutRunner
    ) -> Loop[Decision[Any]]:
        """A selector that asked for fan-out: each candidate runs in a forked child session, the
        selector chooses among their outcomes, and this run goes on with the chosen candidate."""
        request = FanoutRequest(
            journal=run.journal,
            step_id=step_id,
            candidates=tuple(decision.candidates),
            agent=self.agent,
            model=self.model,
            state=run.state,
        )
        index, children = yield FanoutCall(runner, request)
        payload = {"candidates": len(decision.candidates), "child_session_ids": children, "chosen": index}
        run.emit(EngineEvent(E.FANOUT, step_id, phase=P.BRANCH, payload=payload))
        chosen: Decision[Any] = decision.candidates[index]
        return chosen

    def _record_decision(
        self,
        run: RunContext,
        step_id: int,
        decision: Decision[Any],
        model_entry: dict[str, Any] | None,
        view_summary: dict[str, Any] | None,
        log_entries: list[dict[str, Any]],
        changes: list[dict[str, Any]],
    ) -> Loop[None]:
        """The decision (and what DECIDE did) is made durable before any tool runs."""
        pending = PendingStep(
            step_id=step_id,
            decision=decision.to_dict(),
            model=model_entry,
            request_view=view_summary,
            log_entries=list(log_entries),
            state_changes=list(changes),
            control_position=run.control_position,
            approval_calls=self._approval_calls(decision),
        )
        run.pending = pending
        yield JournalCall(run.journal, "record_decision", (pending,))
        if run.writer is not None:
            self._trace_committed(run)  # a batched journal flushes its buffer first

    def _approval_calls(self, decision: Decision[Any]) -> list[str]:
        """The ids of the decision's calls whose tools need a human's approval."""
        registry = self.agent.tool_registry
        return [a.id for a in decision.actions if (spec := registry.get(a.name)) is not None and spec.needs_approval]

    def _model_decide(self, run: RunContext, step: _Step) -> Loop[Decision[Any]]:
        """DECIDE down the model path: what the model was asked and answered is kept in ``step``."""
        step_id = step.id
        if self.model is None:
            raise ConfigurationError(
                f"{type(self.agent).__name__}.decide returned None (the model path) but no model is configured; "
                "pass AgentModule(llm=...), Engine(model=...) or compose(model=...)"
            )
        model_path = self._model_path
        if model_path is None or model_path.model is not self.model or model_path.parser is not self.parser:
            context = self.context if isinstance(self.context, ModelContext) else None
            model_path = self._model_path = ModelPath(
                self.agent,
                self.model,
                self.parser,
                context,
                content_events=self.model_content_events,
                history_policy=self.history_policy,
            )
        try:
            outcome = yield from model_path.decide(run, step_id)
        except ContextError as exc:
            stop = StopReason.CONTEXT_BUDGET_EXCEEDED if "budget" in type(exc).__name__.lower() else None
            if stop is None:
                raise
            run.emit(EngineEvent(E.ERROR, step_id, phase=P.DECIDE, ok=False, error=str(exc)))
            raise StopRun(stop, f"{type(exc).__name__}: {exc}") from exc
        if outcome.tokens:
            run.tokens_used += outcome.tokens
        run.last_request_view = outcome.view
        step.model_entry, step.view_summary, step.log_entries = (
            outcome.model_entry,
            outcome.view_summary,
            outcome.log_entries,
        )
        return outcome.decision

    def _act_without_tools(self, run: RunContext, step_id: int, decision: Decision[Any]) -> Observation | None:
        """ACT's hook; the whole of ACT for a decision that calls nothing (else None: calls follow)."""
        state = run.state
        if self._hook_table["on_before_act"]:
            ctx = HookContext(run.run_id, step_id, state, decision)
            self._call_hooks("on_before_act", run, ctx)
        if run.cancel_immediate:
            self._immediate_cancel_point(run)
        if decision.mode == "act":
            return None
        observation = Observation()
        run.emit(EngineEvent(E.ACT, step_id, phase=P.ACT, payload={"calls": []}))
        if self._hook_table["on_after_act"]:
            self._call_hooks("on_after_act", run, HookContext(run.run_id, step_id, state, decision, observation))
        return observation

    def _act_env(self, run: RunContext, step_id: int, decision: Decision[Any], env: Env) -> Loop[Observation]:
        """ACT through the Env instead of the tool registry."""
        observation = Observation(env=(yield BlockingCall(env.step, decision.actions)))
        run.emit(EngineEvent(E.ACT, step_id, phase=P.ACT, payload={"calls": len(decision.actions), "env": True}))
        if self._hook_table["on_after_act"]:
            ctx = HookContext(run.run_id, step_id, run.state, decision, observation)
            self._call_hooks("on_after_act", run, ctx)
        return observation

    def _acted(self, run: RunContext, step_id: int, decision: Decision[Any], results: list[ToolResult]) -> Observation:
        """The observation of a step's tool calls, recorded in the exchange log and announced."""
        if run.cancel_immediate:
            self._immediate_cancel_point(run)  # the last call's result arrived: a cancel can stop the step
        observation = Observation(results=tuple(results))
        if run.log is not None:
            record_results(run.log, results)
        for result in results:
            if type(result.output) is dict and result.ok:  # cheap gate before the handoff check
                move = handoff_of(self.agent.tool_registry.get(result.name), result)
                if move is not None:
                    payload = {**move, "call_id": result.call_id}
                    run.emit(EngineEvent(E.HANDOFF, step_id, phase=P.ACT, payload=payload))
        payload = {"calls": [_call_summary(r) for r in results]}
        run.emit(_fast_event(EngineEvent, (E.ACT, step_id, None, P.ACT, True, payload, None, _now())))
        if self._hook_table["on_after_act"]:
            ctx = HookContext(run.run_id, step_id, run.state, decision, observation)
            self._call_hooks("on_after_act", run, ctx)
        return observation

    def _call_tool(
        self, run: RunContext, step_id: int, action: Action, pending: PendingStep | None
    ) -> Loop[ToolResult]:
        registry = self.agent.tool_registry
        spec = registry.get(action.name)
        if pending is not None:
            recorded = pending.results.get(action.id)
            if recorded is not None:
                return ToolResult.from_dict(recorded)
        runner = spec.func if spec is not None and isinstance(spec.func, SubAgentRunner) else None
        # Started before a crash, no result recorded: re-run only what is safe to repeat (a delegated
        # call instead continues its child session, which is durable on its own).
        if (
            pending is not None
            and action.id in pending.started
            and runner is None
            and (spec is None or not spec.idempotent)
        ):
            result = _interrupted(action)
            yield from self._record_result(run, step_id, pending, result)
            return result
        self._lifecycle_before_call(run, step_id, action)
        if spec is not None and spec.needs_approval:
            control = yield JournalCall(run.journal, "control", (step_id,), {"fresh": True})
            approval = control.approvals.get(action.id)
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
                raise StopRun(StopReason.AWAITING_APPROVAL)
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
                yield from self._record_result(run, step_id, pending, result)
                return result
        if pending is not None and runner is not None:
            return (yield from self._delegate(run, step_id, action, pending, runner))
        if pending is not None:
            called: ToolResult
            if spec is not None and spec.idempotent:
                pending.started.add(action.id)
                yield JournalCall(run.journal, "record_tool_started", (step_id, action), _IDEMPOTENT)
                called = yield ToolCall(registry, action.name, action.args, action.id)
            else:
                # Recorded started when it begins (in the thread that runs it), not while it waits.
                start = RecordedStart(run.journal, pending, step_id, action)
                called = yield StartedToolCall(registry, action, start, StepResults(run.journal, pending, step_id))
            yield from self._record_result(run, step_id, pending, called)
            return called
        plain: ToolResult = yield ToolCall(registry, action.name, action.args, action.id)
        return plain

    def _lifecycle_before_call(self, run: RunContext, step_id: int, action: Action) -> None:
        if self.lifecycle is not None:
            context = RuntimeSnapshotContext(step_id, "act", action, run.state, run.run_id)
            if self.lifecycle.should_pause(context):
                run.emit(EngineEvent(E.PAUSE, step_id, phase=P.ACT, payload={"before_call": action.id}))
                raise StopRun(StopReason.PAUSED)

    def _call_batch(
        self, run: RunContext, step_id: int, group: tuple[Action, ...], pending: PendingStep | None
    ) -> Loop[list[ToolResult]]:
        """Concurrency-safe calls run together (``call_plan`` made the group); results in order.

        Per call as in ``_call_tool``: a recorded result is reused, a started non-idempotent call is
        reported interrupted, each start is recorded when the call begins and each result as it arrives.
        """
        registry = self.agent.tool_registry
        slots: list[ToolResult | None] = [None] * len(group)
        to_run: list[Action] = []
        positions: list[int] = []
        for index, action in enumerate(group):
            if pending is not None:
                recorded = pending.results.get(action.id)
                if recorded is not None:
                    slots[index] = ToolResult.from_dict(recorded)
                    continue
                spec = registry.get(action.name)
                if action.id in pending.started and (spec is None or not spec.idempotent):
                    interrupted = slots[index] = _interrupted(action)
                    yield from self._record_result(run, step_id, pending, interrupted)
                    continue
            self._lifecycle_before_call(run, step_id, action)
            to_run.append(action)
            positions.append(index)
        if to_run:
            results: StepResults | None = None
            starts: dict[str, RecordedStart] = {}
            if pending is not None:
                results = StepResults(run.journal, pending, step_id)
                for action in to_run:
                    spec = registry.get(action.name)
                    if spec is not None and spec.idempotent:
                        pending.started.add(action.id)
                        yield JournalCall(run.journal, "record_tool_started", (step_id, action), _IDEMPOTENT)
                    else:
                        starts[action.id] = RecordedStart(run.journal, pending, step_id, action)
            batch = ToolBatch(registry, to_run, limit=self.max_parallel_tools, results=results, starts=starts)
            done: list[ToolResult] = yield batch
            for index, result in zip(positions, done, strict=True):
                slots[index] = result
        return [r for r in slots if r is not None]

    def _delegate(
        self, run: RunContext, step_id: int, action: Action, pending: PendingStep, runner: SubAgentRunner
    ) -> Loop[ToolResult]:
        """A delegated call: run (or, after a restore, continue) its child session to a result.

        The child's session id is derived from this session and the call id, so a restore finds it
        again; the call is recorded started once. A child that pauses or waits for an approval stops
        this run the same way (its step stays pending and the next run continues the child).
        """
        parent_id = str(getattr(run.journal, "session_id", ""))
        child_id = child_session_id(parent_id, action.id)
        resumed = action.id in pending.started
        if not resumed:
            pending.started.add(action.id)
            yield JournalCall(run.journal, "record_tool_started", (step_id, action))
        ids = {"parent_session_id": parent_id, "child_session_id": child_id, "call_id": action.id, "tool": action.name}
        run.emit(
            EngineEvent(
                E.DELEGATE, step_id, phase=P.ACT, payload={**ids, "status": "resumed" if resumed else "started"}
            )
        )
        request = ChildRequest(
            journal=run.journal,
            parent_run_id=run.run_id,
            step_id=step_id,
            call_id=action.id,
            tool=action.name,
            args=dict(action.args),
            tokens_left=None if run.max_tokens is None else max(0, run.max_tokens - run.tokens_used),
            seconds_left=None if run.max_runtime is None else max(0.0, run.max_runtime - self._elapsed(run)),
        )
        outcome: ChildOutcome = yield SubAgentCall(runner, request)
        run.tokens_used += outcome.tokens
        if outcome.stop is not None:
            run.emit(EngineEvent(E.DELEGATE, step_id, phase=P.ACT, payload={**ids, "status": outcome.stop.value}))
            if outcome.stop is StopReason.PAUSED:
                # The pause request that reached the child came through this session: it is consumed too.
                control = yield JournalCall(run.journal, "control", (step_id,), {"fresh": True})
                if control.pause_requested:
                    run.pause_position = max(run.pause_position, control.pause_position)
            raise StopRun(outcome.stop)
        result = outcome.result
        if result is None:
            raise UsageError(f"sub-agent tool {action.name!r} returned neither a result nor a stop")
        status = "completed" if result.ok else "failed"
        run.emit(EngineEvent(E.DELEGATE, step_id, phase=P.ACT, ok=result.ok, payload={**ids, "status": status}))
        yield from self._record_result(run, step_id, pending, result)
        return result

    def _record_result(
        self, run: RunContext, step_id: int, pending: PendingStep | None, result: ToolResult
    ) -> Loop[None]:
        if pending is not None:
            pending.results[result.call_id] = result.to_dict()
            yield JournalCall(run.journal, "record_tool_result", (step_id, result))

    def _critics(
        self, run: RunContext, step_id: int, decision: Decision[Any], observation: Observation
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

    def _check_stop(self, run: RunContext, decision: Decision[Any], verdict: CriticVerdict | None) -> StopReason | None:
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

    def _finish(
        self, run: RunContext, stop: StopReason | None, writer: TraceWriter | None, *, commit_stop: bool = True
    ) -> Loop[EngineResult[StateT]]:
        state = run.state
        reason = stop or StopReason.UNRECOVERABLE_ERROR
        if state.stop_reason != reason.value:
            state.stop_reason = reason.value
        status = status_for_stop_reason(reason)
        lifecycle = _lifecycle_for(reason)
        commit_error: Exception | None = None
        try:
            # Inside the try: a state the codec cannot encode (CodecError) fails here too, and the
            # run must still end with run_end and a finished trace.
            changes = run.step_changes + state.drain_changes()
            run.step_changes = []
            if run.journal.durable:
                if commit_stop:
                    boundary = self._boundary_commit(run, changes, lifecycle, reason, pending=run.pending)
                    if not _repeats(run.last_commit, boundary, run.log):
                        yield JournalCall(run.journal, "commit", (boundary,))
                yield JournalCall(run.journal, "close")
                if writer is not None:
                    self._trace_committed(run)
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
            # The run's own steps, tokens and time; a resumed session run also gives the session's.
            summary: dict[str, Any] = {
                "stop_reason": reason.value,
                "final_result": state.final_result,
                "steps": state.current_step - run.first_step,
                "token_usage": {"total_tokens": run.tokens_used - run.tokens_before},
                "elapsed_seconds": round(elapsed - run.elapsed_before, 6),
                "error": run.error,
            }
            if run.first_step or run.tokens_before or run.elapsed_before:
                session_total = {"steps": state.current_step, "total_tokens": run.tokens_used}
                summary["session"] = {**session_total, "elapsed_seconds": round(elapsed, 6)}
            writer.finish(status, summary)
        if self._hook_table["on_run_end"]:
            ctx = HookContext(run.run_id, state.current_step, state, result=result)
            self._call_hooks("on_run_end", run, ctx)
        if commit_error is not None:
            raise commit_error
        return result

    def _boundary_commit(
        self,
        run: RunContext,
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
            pause_position=run.pause_position,
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

    def _call_hooks(self, name: str, run: RunContext, ctx: HookContext) -> None:
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

    def _immediate_cancel_point(self, run: RunContext) -> None:
        if run.cancel_immediate and run.cancel:
            raise StopRun(StopReason.CANCELLED_IMMEDIATE)

    def _trace_committed(self, run: RunContext) -> None:
        """Write the records of the steps the journal has made durable since the last call."""
        writer = run.writer
        if writer is not None:
            for record in run.journal.drain_committed():
                writer.step(record.to_dict())

    def _elapsed(self, run: RunContext) -> float:
        return run.elapsed_before + (time.monotonic() - run.started)


def _overrides(hook: object, name: str) -> bool:
    method = getattr(type(hook), name, None)
    if method is None:
        return False
    base = getattr(EngineHook, name, None)
    return method is not base


_NO_ENTRIES: list[dict[str, Any]] = []  # shared and never mutated (a list is copied before it is kept)
_IDEMPOTENT: dict[str, Any] = {"idempotent": True}  # record_tool_started's keywords for a call safe to repeat


class _Step:
    """What the loop knows of the step under way, shared by its phases (one per step)."""

    __slots__ = (
        "id",
        "log_entries",
        "model_entry",
        "retries",
        "snapshot",
        "started",
        "t0",
        "verdict",
        "verdicts",
        "view_summary",
    )

    def __init__(self, run: RunContext, *, with_snapshot: bool) -> None:
        """The step that goes on past its boundary: its clock starts and ``step_start`` is announced."""
        state = run.state
        step_id = self.id = state.current_step
        # the state as the step began, for a critic's retry (only kept when there are critics)
        self.snapshot: dict[str, Any] | None = state.to_dict() if with_snapshot else None
        self.started = time.time()
        self.t0 = time.perf_counter()
        self.retries = 0
        self.model_entry: dict[str, Any] | None = None
        self.view_summary: dict[str, Any] | None = None
        self.log_entries: list[dict[str, Any]] = _NO_ENTRIES
        self.verdicts: list[dict[str, Any]] = _NO_VERDICTS
        self.verdict: CriticVerdict | None = None
        run.emit(_fast_event(EngineEvent, (E.STEP_START, step_id, None, P.DECIDE, True, {}, None, _now())))


_NO_VERDICTS: list[dict[str, Any]] = []  # a step without critics (shared and never mutated)


def _state_changes(state: StateSchema) -> list[dict[str, Any]]:
    """The state changes made since the last drain; the ``__dict__`` probe skips the drain's call
    when nothing was recorded (the common case while deciding)."""
    return state.drain_changes() if state.__dict__.get("_q_changes") else _NO_ENTRIES


def _interrupted(action: Action) -> ToolResult:
    return ToolResult(
        call_id=action.id,
        name=action.name,
        ok=False,
        error_kind="interrupted",
        error="the call was interrupted (the process stopped while it ran); it was not repeated "
        "because the tool is not idempotent. Check its effects before calling it again.",
    )


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


def _repeats(last: BoundaryCommit | None, end: BoundaryCommit, log: Any) -> bool:
    """Whether the end-of-run boundary ``end`` would record nothing the run's ``last`` step boundary
    did not (the step that ended the run commits the run's outcome already): then it is not written.
    Only the elapsed time in ``budget_used`` would differ."""
    if last is None or end.state_changes or end.pending is not None or last.pending is not None:
        return False
    return (
        (last.step_id, last.lifecycle, last.stop_reason, last.control_position, last.pause_position)
        == (end.step_id, end.lifecycle, end.stop_reason, end.control_position, end.pause_position)
        and last.request_view is end.request_view
        and last.log_position == log.position
    )


def _with_steering(observation: object, steering: list[str]) -> Observation:
    base = observation if isinstance(observation, Observation) else Observation(env=observation)
    text = "\n".join(steering)
    feedback = f"{base.feedback}\n{text}" if base.feedback else text
    return Observation(results=base.results, env=base.env, feedback=feedback)


_SHARED_EXECUTOR: ToolThreads | None = None
_SHARED_LOCK = threading.Lock()


def _shared_executor() -> ToolThreads:
    """The process-wide bounded executor (``DEFAULT_TOOL_WORKERS`` threads, created on first use)."""
    global _SHARED_EXECUTOR
    with _SHARED_LOCK:
        if _SHARED_EXECUTOR is None:
            _SHARED_EXECUTOR = ToolThreads(DEFAULT_TOOL_WORKERS)
        return _SHARED_EXECUTOR
