"""Durable sessions: ``Session``, its receipts and inspection, and the store-backed journal.

A Session is a durable identity; each ``run()`` is a new Run through the one Engine loop; each
committed boundary is an immutable snapshot whose id is the SHA-256 of its content.

Storage grows with what is new: a snapshot holds its step's state changes and a reference to the
new exchange entries; a full state is rewritten only when the deltas outgrow it (the payload format
and the rule are in ``qitos.sessions._step_journal``). A fork's first snapshot points at its parent's.

One owner at a time: ``run()`` holds the session's lease (``qitos.sessions._lease``) from before it
reads the head until the run ends; every write carries the lease's fencing token, so a second
runner gets ``SessionBusyError`` and a runner that lost its lease can write nothing.

Crash safety, at the fewest write transactions that keep it (store "pending writes", keyed by the
head the step started from):

- a model's decision is written as soon as it is made (its output is never requested twice);
- a non-idempotent call's intent is written when the call begins (in the thread that runs a sync
  tool, not while the call waits for one; see ``qitos.engine._call_start``), together with a
  decision made without a model (free to make again) and any results still waiting;
- an idempotent call needs no intent: a restore runs it again;
- a non-idempotent call's result is written before the step's next call starts; the result of the
  step's last call rides with the step's boundary, which holds the whole outcome.

So a tool-free step, or one whose calls are all idempotent, is one transaction (its boundary), and
a step with one non-idempotent call two. A restore continues the step: no second model call, no
call with a recorded result re-run, an interrupted call re-run only if its tool is idempotent,
otherwise reported to the agent as ``interrupted``. That includes a last call that finished just
before a crash in the rest of its step (REDUCE, critics): its effect stands and the agent is told
to check it, since its result was not yet durable.

Durability modes:

- ``sync`` (default): every boundary is committed before the next step starts. A crash loses at
  most the step in progress, whose decision and tool outcomes are recovered from pending writes.
- ``batched``: boundaries are group-committed every ``batch_steps`` boundaries or ``batch_ms``
  milliseconds, and always at a pause, an approval wait, the end of a run, before any step whose
  decision carries tool calls or came from a model, and at the end of a step that ran a
  non-idempotent call (so side effects and model calls are never repeated, and such a call's
  result is never lost with the batch). A crash can lose up to ``batch_steps - 1`` buffered tool-free boundaries (or
  ``batch_ms``), which are then re-run from the last committed one. ``inspect()`` reports the lag.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, TextIO

from qitos.checkpoint._memory_store import InMemoryCheckpointStore
from qitos.checkpoint._records import (
    DuplicateOperationError,
    SessionCommitReceipt,
    SessionHeadRecord,
    SessionLease,
    SessionSnapshot,
    SessionSnapshotCommit,
    utc_now,
)
from qitos.checkpoint.store import CheckpointStore
from qitos.core._codec import check_text, sha256_hex
from qitos.core._errors import (
    ConfigurationError,
    SessionNotFoundError,
)
from qitos.core._exchange import ExchangeLog
from qitos.core._identity import (
    AgentIdentity,
    AttemptIdentity,
    RunIdentity,
    SessionIdentity,
    SnapshotIdentity,
    WorkItemIdentity,
)
from qitos.core._redaction import Redactor, model_credentials
from qitos.core._state import StateSchema
from qitos.core._task import Task
from qitos.engine._agent_ref import agent_reference, import_recorded
from qitos.engine._events import EngineResult
from qitos.engine._loop import EngineLoop
from qitos.engine._progress import progress_printer
from qitos.sessions._control import (
    ApprovalReceipt,
    PauseReceipt,
    SteeringReceipt,
    aanswer_approval,
    answer_approval,
    apause_session,
    asteer_session,
    pause_session,
    steer_session,
)
from qitos.sessions._inspection import (
    SessionInspection,
    SessionLifecycle,
    inspect_session,
    session_capabilities,
)
from qitos.sessions._journal import (
    ResumePoint,
)
from qitos.sessions._lease import DEFAULT_LEASE_TTL, LeaseKeeper
from qitos.sessions._step_journal import (
    RestoredSession,
    SessionJournal,
    arestore,
    arestore_created,
    first_payload,
    fork_payload,
    materialize,
    restore,
    restore_created,
)

__all__ = ["Session", "SessionInspection"]


class SessionReference(Protocol):
    """A name bound in a composition (``qitos.engine._composition.ResolverReference`` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def provider(self) -> str: ...


class SessionSettings(Protocol):
    """The run settings a Session takes from its composition's runtime (``Runtime`` is one)."""

    @property
    def durability(self) -> str: ...
    @property
    def batch_steps(self) -> int: ...
    @property
    def batch_ms(self) -> float: ...
    @property
    def lease_ttl(self) -> float: ...
    @property
    def references(self) -> tuple[Any, ...]: ...


class SessionHost(Protocol):
    """What a Session needs from the composition that made it (``Composition`` is one).

    A protocol, so this module depends on nothing above it: composition imports sessions, never
    the other way round.
    """

    @property
    def runtime(self) -> SessionSettings: ...

    @property
    def agent_factory(self) -> Callable[[], Any]: ...

    def restore(self, session_id: str) -> Session: ...


@dataclass(frozen=True, kw_only=True)
class SessionForkReceipt:
    """Records where a forked session came from."""

    parent_session_id: str
    parent_snapshot_id: str
    child_session_id: str
    operation_id: str | None
    created_at: str


# --------------------------------------------------------------------------- the facade


class Session:
    """Scoped client for one durable Session identity.

    The facade stores identifiers and cooperative control only. Agent state is reconstructed from
    the canonical snapshot and executed by ``Engine.run``.
    """

    def __init__(
        self,
        *,
        engine: EngineLoop[Any, Any, Any],
        session_id: SessionIdentity,
        run_id: RunIdentity,
        agent_id: AgentIdentity,
        references: Iterable[SessionReference],
        created_at: str,
        state_type: type[StateSchema],
        work_item_id: WorkItemIdentity,
        attempt_id: AttemptIdentity,
        fork_receipt: SessionForkReceipt | None = None,
        composition: SessionHost | None = None,
        task: Task | None = None,
        head: SessionHeadRecord | None = None,
    ) -> None:
        self.engine = engine
        self.session_id = session_id
        self.run_id = run_id
        self.agent_id = agent_id
        self.references = tuple(references)
        self.created_at = created_at
        self.state_type = state_type
        self.work_item_id = work_item_id
        self.attempt_id = attempt_id
        self.fork_receipt = fork_receipt
        self._composition = composition
        self._task = task
        self._head = head  # the head it was restored from (see _granted_head)
        # The first snapshot, when this Session created the session and has not run it yet.
        self._created: SessionSnapshot | None = None
        self._journal: SessionJournal | None = None

    @property
    def store(self) -> CheckpointStore:
        """The bound checkpoint store."""
        store = self.engine.checkpoint_store
        if store is None:
            raise ConfigurationError("this engine has no checkpoint_store; pass Engine(checkpoint_store=...)")
        return store

    def __repr__(self) -> str:
        return f"Session({self.session_id.value!r})"

    # ---- running

    def run(self, *, steering: str | None = None, progress: bool | TextIO = False) -> EngineResult[Any]:
        """Run or resume through the one canonical Engine loop (the sync driver, this thread).

        The run takes the session's lease first: if another runner holds it, SessionBusyError
        names that runner and nothing executes. The lease is renewed while the run goes on and
        released when it ends (see ``qitos.sessions._lease``). ``progress=True`` prints a line per
        step to stderr (or to the text stream given), rendered from the run's events
        (``qitos.engine._progress``).
        """
        printer = progress_printer(progress)
        if steering is not None:
            self.steer(steering)
        store = self.store
        sid = self.session_id.value
        lease = self._lease_keeper(store, sid)
        granted = lease.acquire()
        try:
            # read under the lease: no other runner moves it now
            head = self._granted_head(granted) or _require_head(store, sid)
            created, self._created = self._created, None
            if created is not None and created.snapshot_id == head.snapshot_id:
                restored = restore_created(store, created)  # what this Session just wrote: no read
            else:
                restored = restore(store, sid, head.snapshot_id)
            journal, resume = self._prepare_run(store, restored, lease, control_seq=head.control_seq)
            lease.start_heartbeat()
            return self.engine.run(
                self._task_or_load(), journal=journal, resume=resume, run_id=self.run_id.value, on_event=printer
            )
        finally:
            lease.release()

    async def arun(self, *, steering: str | None = None, progress: bool | TextIO = False) -> EngineResult[Any]:
        """``run`` through the async driver, on the running event loop.

        The lease, the journal's store operations and the model/tool calls are awaited, so many
        sessions run at once in one process. Cancelling the awaiting task stops the run as
        ``Engine.cancel(immediate=True)`` would, commits its last boundary, releases the lease and
        raises ``CancelledError``. ``progress`` as for :meth:`run`.
        """
        printer = progress_printer(progress)
        if steering is not None:
            await self.asteer(steering)
        store = self.store
        sid = self.session_id.value
        lease = self._lease_keeper(store, sid)
        granted = await lease.aacquire()
        try:
            head = self._granted_head(granted) or await store.aget_session_head(sid)
            if head is None:
                raise SessionNotFoundError(sid)
            created, self._created = self._created, None
            if created is not None and created.snapshot_id == head.snapshot_id:
                restored = await arestore_created(store, created)
            else:
                restored = await arestore(store, sid, head.snapshot_id)
            journal, resume = self._prepare_run(store, restored, lease, control_seq=head.control_seq)
            lease.start_async_heartbeat()
            task = self._task_or_load()
            return await self.engine.arun(
                task, journal=journal, resume=resume, run_id=self.run_id.value, on_event=printer
            )
        finally:
            await lease.arelease()

    def _created_as(self, commit: SessionSnapshotCommit, receipt: SessionCommitReceipt) -> None:
        """Remember the head this Session just created (its first run need not read it back)."""
        self._created = commit.snapshot
        self._head = SessionHeadRecord(
            session_id=receipt.session_id,
            snapshot_id=receipt.snapshot_id,
            sequence=receipt.sequence,
            lifecycle=commit.lifecycle,
            updated_at=receipt.committed_at,
            metadata=commit.session_metadata or {},
            control_seq=receipt.control_seq,
        )

    def _granted_head(self, granted: SessionLease) -> SessionHeadRecord | None:
        """The head this Session was restored from, if the lease was granted on that very head (it
        cannot move now), with the control position at that moment; None: read it again."""
        head = self._head
        if head is None or granted.head_snapshot_id != head.snapshot_id or granted.control_seq is None:
            return None
        return replace(head, control_seq=granted.control_seq)

    def _lease_keeper(self, store: CheckpointStore, sid: str) -> LeaseKeeper:
        runtime = self._composition.runtime if self._composition is not None else None
        return LeaseKeeper(store, sid, ttl_seconds=runtime.lease_ttl if runtime else DEFAULT_LEASE_TTL)

    def _prepare_run(
        self, store: CheckpointStore, restored: RestoredSession, lease: LeaseKeeper, *, control_seq: int | None
    ) -> tuple[SessionJournal, ResumePoint]:
        """The journal and resume point of a new run from the restored head (no I/O); ``control_seq``
        is that head's control counter (SessionHeadRecord.control_seq)."""
        runtime = self._composition.runtime if self._composition is not None else None
        state = self.state_type.from_dict(restored.state_data)
        self.run_id = RunIdentity.new()
        self.attempt_id = AttemptIdentity.new()
        journal = SessionJournal(
            store,
            self.session_id.value,
            restored,
            run_id=self.run_id.value,
            mode=runtime.durability if runtime else "sync",
            batch_steps=runtime.batch_steps if runtime else 16,
            batch_ms=runtime.batch_ms if runtime else 50.0,
            lease=lease,
            redactor=self._redactor(),
            control_seq=control_seq,
        )
        self._journal = journal
        resume = ResumePoint(
            state=state,
            log=restored.log,
            budget_used={
                **restored.budget_used,
                "control_position": restored.control_position,
                "pause_position": restored.pause_position,
            },
            pending=restored.pending,
            carry_changes=restored.carry_changes,
            fresh=restored.snapshot.sequence == 0 and restored.lifecycle == SessionLifecycle.CREATED.value,
        )
        return journal, resume

    def _redactor(self) -> Redactor:
        """The redaction policy for what this session writes: patterns plus the model's credentials."""
        return Redactor(model_credentials(self.engine.model))

    def pause(self) -> PauseReceipt:
        """Request cooperative pause; durable status is returned at a boundary.

        It reaches the child sessions of delegated calls in progress too (``pause_session``).
        """
        return pause_session(self.store, self.session_id.value)

    async def apause(self) -> PauseReceipt:
        """Async twin of :meth:`pause`."""
        return await apause_session(self.store, self.session_id.value)

    def steer(self, text: str) -> SteeringReceipt:
        """Durably submit one canonical steering item to this Session (while a delegated call is in
        progress, to the child doing the work: see ``steer_session``)."""
        return steer_session(self.store, self.session_id.value, text, redactor=self._redactor())

    async def asteer(self, text: str) -> SteeringReceipt:
        """Async twin of :meth:`steer`."""
        return await asteer_session(self.store, self.session_id.value, text, redactor=self._redactor())

    def approve(self, call_id: str) -> ApprovalReceipt:
        """Approve a tool call awaiting approval; the next ``run()`` executes it.

        A call a delegated child waits for (``inspect().tool_batch`` lists it with the child's
        ``session_id``) is answered in that child; the next ``run()`` of this session continues it.
        """
        return self._answer(call_id, True, None)

    async def aapprove(self, call_id: str) -> ApprovalReceipt:
        """Async twin of :meth:`approve`."""
        return await self._aanswer(call_id, True, None)

    def reject(self, call_id: str, reason: str | None = None) -> ApprovalReceipt:
        """Reject a tool call awaiting approval; the next ``run()`` reports the rejection to the agent."""
        return self._answer(call_id, False, reason)

    async def areject(self, call_id: str, reason: str | None = None) -> ApprovalReceipt:
        """Async twin of :meth:`reject`."""
        return await self._aanswer(call_id, False, reason)

    def _answer(self, call_id: str, approved: bool, reason: str | None) -> ApprovalReceipt:
        return answer_approval(
            self.store,
            self.session_id.value,
            call_id,
            approved=approved,
            reason=reason,
            redactor=self._redactor(),
            inspection=self.inspect(),
        )

    async def _aanswer(self, call_id: str, approved: bool, reason: str | None) -> ApprovalReceipt:
        return await aanswer_approval(
            self.store,
            self.session_id.value,
            call_id,
            approved=approved,
            reason=reason,
            redactor=self._redactor(),
            inspection=await self.ainspect(),
        )

    def capabilities(self) -> frozenset[str]:
        """What this session supports with its store."""
        return session_capabilities(self.store)

    # ---- forking

    def fork(
        self, snapshot: SessionSnapshot | SnapshotIdentity | str | None = None, *, operation_id: str | None = None
    ) -> Session:
        """Create an isolated durable child from one verified immutable snapshot."""
        store = self.store
        sid = self.session_id.value
        if operation_id is not None:
            check_text(operation_id, "operation_id")
            existing = store.find_session_by_operation(operation_id)
            if existing is not None:
                return self._open_child(existing)
        if snapshot is None:
            snapshot_id = _require_head(store, sid).snapshot_id
        elif isinstance(snapshot, SessionSnapshot):
            snapshot_id = snapshot.snapshot_id
        elif isinstance(snapshot, SnapshotIdentity):
            snapshot_id = snapshot.value
        else:
            snapshot_id = str(snapshot)
            check_text(snapshot_id, "snapshot")
        source = store.get_snapshot(snapshot_id)
        source_state = materialize(store, snapshot_id)  # verifies the whole chain the child will share
        child_id = SessionIdentity.new().value
        payload = fork_payload(source, source_state.lifecycle)
        child = SessionSnapshot.create(
            session_id=child_id,
            parent_id=snapshot_id,
            base_id=source.base_id or snapshot_id,
            sequence=source.sequence + 1,
            payload=payload.to_json(),
        )
        created_at = utc_now()
        head = _require_head(store, sid)
        metadata = dict(head.metadata)
        metadata.update(
            parent_session_id=source.session_id,
            fork_snapshot_id=snapshot_id,
            fork_operation_id=operation_id,
            created_at=created_at,
        )
        lifecycle = source_state.lifecycle
        try:
            store.commit_session_snapshot(
                SessionSnapshotCommit(
                    session_id=child_id,
                    expected_head=None,
                    snapshot=child,
                    lifecycle=lifecycle,
                    session_metadata=metadata,
                    operation_id=operation_id,
                )
            )
        except DuplicateOperationError:
            existing = store.find_session_by_operation(operation_id or "")
            if existing is None:
                raise
            return self._open_child(existing)
        return self._open_child(child_id)

    def _open_child(self, child_id: str) -> Session:
        if self._composition is not None:
            return self._composition.restore(child_id)
        return restore_session(self.engine, child_id)

    # ---- inspection

    def inspect(self) -> SessionInspection:
        """Read the durable head: lifecycle, integrity, budget, work graph, last request, tool batch
        (``qitos.sessions._inspection``, plus this runtime's budget limits and journal lag)."""
        budget = self.engine.budget
        journal = self._journal
        mode = self._composition.runtime.durability if self._composition else "sync"
        return inspect_session(
            self.store,
            self.session_id.value,
            limits={
                "max_runtime_seconds": self._task_or_load().budget.max_runtime_seconds or budget.max_runtime_seconds,
                "max_tokens": self._task_or_load().budget.max_tokens or budget.max_tokens,
            },
            durability={
                "mode": journal.mode if journal else mode,
                "unflushed_boundaries": journal.unflushed if journal else 0,
            },
        )

    async def ainspect(self) -> SessionInspection:
        """Async twin of :meth:`inspect` (its reads run in a worker thread)."""
        return await asyncio.to_thread(self.inspect)

    def _task_or_load(self) -> Task:
        if self._task is None:
            record = _require_head(self.store, self.session_id.value)
            self._task = Task.from_dict(record.metadata.get("task") or {"objective": ""})
        return self._task


def _require_head(store: CheckpointStore, session_id: str) -> SessionHeadRecord:
    head = store.get_session_head(session_id)
    if head is None:
        raise SessionNotFoundError(session_id)
    return head


def _state_type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _resolve_state_type(name: str, engine: EngineLoop[Any, Any, Any]) -> type[StateSchema]:
    module_name, _, qualname = name.partition(":")
    try:
        target: Any = import_recorded(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
        if isinstance(target, type) and issubclass(target, StateSchema):
            return target
    except (ImportError, AttributeError):
        pass
    # A state class defined in a script's __main__: ask the agent for one of the same name.
    probe = engine.agent.init_state("")
    if type(probe).__qualname__ == qualname:
        return type(probe)
    raise ConfigurationError(
        f"cannot import the session's state type {name!r} in this process, and the agent given makes "
        f"{type(probe).__qualname__}: restore with the agent the session was made with"
    )


def _agent_identity(engine: EngineLoop[Any, Any, Any]) -> AgentIdentity:
    cls = type(engine.agent)
    return AgentIdentity(f"agt_{sha256_hex(f'{cls.__module__}:{cls.__qualname__}')[:24]}")


def new_session(
    engine: EngineLoop[Any, Any, Any],
    task: str | Task,
    *,
    composition: SessionHost | None = None,
    session_id: str | None = None,
    metadata: Mapping[str, object] | None = None,
    **state_kwargs: object,
) -> Session:
    """Create a durable session: initialise the state and commit its first snapshot.

    ``session_id``: a given id instead of a fresh one (a delegated child's is derived from its
    parent's call); ``metadata``: extra session metadata (the child's link to its parent).
    """
    store, commit, session = _first_snapshot(engine, task, composition, state_kwargs, session_id, metadata)
    session._created_as(commit, store.commit_session_snapshot(commit))
    return session


async def anew_session(
    engine: EngineLoop[Any, Any, Any],
    task: str | Task,
    *,
    composition: SessionHost | None = None,
    session_id: str | None = None,
    metadata: Mapping[str, object] | None = None,
    **state_kwargs: object,
) -> Session:
    """Async twin of :func:`new_session` (the first snapshot is committed with the store's async method)."""
    store, commit, session = _first_snapshot(engine, task, composition, state_kwargs, session_id, metadata)
    session._created_as(commit, await store.acommit_session_snapshot(commit))
    return session


def _first_snapshot(
    engine: EngineLoop[Any, Any, Any],
    task: str | Task,
    composition: SessionHost | None,
    state_kwargs: Mapping[str, object],
    given_id: str | None = None,
    extra_metadata: Mapping[str, object] | None = None,
) -> tuple[CheckpointStore, SessionSnapshotCommit, Session]:
    """A new session's first snapshot commit and its Session facade (no I/O)."""
    store = engine.checkpoint_store
    if store is None:
        store = engine.checkpoint_store = InMemoryCheckpointStore()
    the_task = Task.coerce(task)
    state = engine.agent.init_state(the_task.objective, **state_kwargs)
    if not isinstance(state, StateSchema):
        raise ConfigurationError(f"init_state must return a StateSchema, got {type(state).__name__}")
    if not state.task:
        state.task = the_task.objective
    state.drain_changes()
    session_id = SessionIdentity(given_id) if given_id is not None else SessionIdentity.new()
    redactor = Redactor(model_credentials(engine.model))  # nothing stored holds a secret (qitos.core._redaction)
    full = redactor.redact_value(state.to_dict())
    payload = first_payload(full, ExchangeLog(f"log-{session_id.value}"), SessionLifecycle.CREATED.value)
    snapshot = SessionSnapshot.create(
        session_id=session_id.value, parent_id=None, base_id=None, sequence=0, payload=payload.to_json()
    )
    created_at = utc_now()
    agent_id = _agent_identity(engine)
    references = composition.runtime.references if composition is not None else ()
    metadata = {
        "agent_id": agent_id.value,
        "agent": f"{type(engine.agent).__module__}:{type(engine.agent).__qualname__}",
        # what another process imports to rebuild the agent (qitos.engine._agent_ref)
        "agent_ref": agent_reference(
            *((composition.agent_factory,) if composition is not None else ()), type(engine.agent)
        ),
        "state_type": _state_type_name(type(state)),
        "task": redactor.redact_value(the_task.to_dict()),
        "created_at": created_at,
        "parent_session_id": None,
        "fork_snapshot_id": None,
        "references": [{"name": r.name, "kind": r.kind, "provider": r.provider} for r in references],
    }
    if extra_metadata:
        metadata.update(redactor.redact_value(dict(extra_metadata)))
    commit = SessionSnapshotCommit(
        session_id=session_id.value,
        expected_head=None,
        snapshot=snapshot,
        lifecycle=SessionLifecycle.CREATED.value,
        session_metadata=metadata,
    )
    session = Session(
        engine=engine,
        session_id=session_id,
        run_id=RunIdentity.new(),
        agent_id=agent_id,
        references=references,
        created_at=created_at,
        state_type=type(state),
        work_item_id=WorkItemIdentity.new(),
        attempt_id=AttemptIdentity.new(),
        composition=composition,
        task=the_task,
    )
    return store, commit, session


def restore_session(
    engine: EngineLoop[Any, Any, Any], session_id: str, *, composition: SessionHost | None = None
) -> Session:
    """The Session for ``session_id`` from the store's durable head (works across processes)."""
    check_text(session_id, "session_id")  # no store can look up text that has no UTF-8 form
    return _session_from_head(engine, _require_head(_engine_store(engine), session_id), composition)


async def arestore_session(
    engine: EngineLoop[Any, Any, Any], session_id: str, *, composition: SessionHost | None = None
) -> Session:
    """Async twin of :func:`restore_session` (the head is awaited)."""
    check_text(session_id, "session_id")
    head = await _engine_store(engine).aget_session_head(session_id)
    if head is None:
        raise SessionNotFoundError(session_id)
    return _session_from_head(engine, head, composition)


def _engine_store(engine: EngineLoop[Any, Any, Any]) -> CheckpointStore:
    store = engine.checkpoint_store
    if store is None:
        raise ConfigurationError("restoring a session needs an engine with a checkpoint_store")
    return store


def _session_from_head(
    engine: EngineLoop[Any, Any, Any], head: SessionHeadRecord, composition: SessionHost | None
) -> Session:
    """The Session a head record describes (no I/O)."""
    session_id = head.session_id
    meta = head.metadata
    state_type = _resolve_state_type(str(meta.get("state_type", "")), engine)
    fork_receipt = None
    if meta.get("fork_snapshot_id"):
        fork_receipt = SessionForkReceipt(
            parent_session_id=str(meta.get("parent_session_id")),
            parent_snapshot_id=str(meta.get("fork_snapshot_id")),
            child_session_id=session_id,
            operation_id=meta.get("fork_operation_id"),
            created_at=str(meta.get("created_at", "")),
        )
    references = composition.runtime.references if composition is not None else ()
    return Session(
        engine=engine,
        session_id=SessionIdentity(session_id),
        run_id=RunIdentity.new(),
        agent_id=AgentIdentity(str(meta.get("agent_id") or _agent_identity(engine).value)),
        references=references,
        created_at=str(meta.get("created_at", "")),
        state_type=state_type,
        work_item_id=WorkItemIdentity.new(),
        attempt_id=AttemptIdentity.new(),
        fork_receipt=fork_receipt,
        composition=composition,
        task=Task.from_dict(meta.get("task") or {"objective": ""}),
        head=head,
    )
