"""Durable sessions (seed 001): ``Session``, its receipts and inspection, and the store-backed journal.

A Session is a durable identity; each ``run()`` is a new Run through the one Engine loop; each
committed boundary is an immutable snapshot whose id is the SHA-256 of its content.

Storage grows with what is new: a snapshot holds its step's state changes and a reference to the
new exchange entries; a full state is rewritten only when the deltas outgrow it (the payload format
and the rule are in ``qitos.sessions.step_journal``). A fork's first snapshot points at its parent's.

One owner at a time: ``run()`` holds the session's lease (``qitos.sessions.lease``) from before it
reads the head until the run ends; every write carries the lease's fencing token, so a second
runner gets ``SessionBusyError`` and a runner that lost its lease can write nothing.

Crash safety, at the fewest write transactions that keep it (store "pending writes", keyed by the
head the step started from):

- a model's decision is written as soon as it is made (its output is never requested twice);
- a non-idempotent call's intent is written before it runs, together with a decision made without
  a model (free to make again) and any results still waiting;
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
  milliseconds, and always at a pause, an approval wait, the end of a run, and before any step whose
  decision carries tool calls or came from a model (so side effects and model calls are never
  repeated). A crash can lose up to ``batch_steps - 1`` buffered tool-free boundaries (or
  ``batch_ms``), which are then re-run from the last committed one. ``inspect()`` reports the lag.
"""

from __future__ import annotations

import asyncio
import importlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from qitos.checkpoint.memory_store import InMemoryCheckpointStore
from qitos.checkpoint.packing import unpack
from qitos.checkpoint.store import (
    CheckpointStore,
    ControlItem,
    DuplicateOperationError,
    SessionHeadRecord,
    SessionSnapshot,
    SessionSnapshotCommit,
    utc_now,
)
from qitos.core.codec import sha256_hex
from qitos.core.errors import (
    CheckpointError,
    ConfigurationError,
    IntegrityError,
    SessionNotFoundError,
)
from qitos.core.exchange import ExchangeLog
from qitos.core.identity import (
    AgentIdentity,
    AttemptIdentity,
    RunIdentity,
    SessionIdentity,
    SnapshotIdentity,
    WorkItemIdentity,
)
from qitos.core.redaction import Redactor, model_credentials
from qitos.core.request_view import RequestView
from qitos.core.state import StateSchema
from qitos.core.task import Task
from qitos.engine.events import EngineResult
from qitos.engine.loop import EngineLoop
from qitos.sessions.journal import (
    PendingStep,
    ResumePoint,
)
from qitos.sessions.lease import DEFAULT_LEASE_TTL, LeaseKeeper
from qitos.sessions.step_journal import APPROVAL_KINDS, FORMAT, RestoredSession, SessionJournal, materialize, restore
from qitos.sessions.stored_view import view_from_record

__all__ = [
    "PauseReceipt",
    "Session",
    "SessionForkReceipt",
    "SessionHead",
    "SessionHost",
    "SessionInspection",
    "SessionJournal",
    "SessionLifecycle",
    "SessionReference",
    "SessionSettings",
    "SteeringReceipt",
    "ToolBatchSnapshot",
    "ToolCallStatus",
    "anew_session",
    "new_session",
    "restore_session",
]


class SessionReference(Protocol):
    """A name bound in a composition (``qitos.engine.composition.ResolverReference`` is one)."""

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

    def restore(self, session_id: str) -> Session: ...


class SessionLifecycle(StrEnum):
    """Where a session stands."""

    CREATED = "created"
    RUNNING = "running"
    PAUSED = "paused"
    AWAITING_APPROVAL = "awaiting_approval"
    COMPLETED = "completed"
    STOPPED = "stopped"
    FAILED = "failed"


@dataclass(frozen=True, kw_only=True)
class SessionHead:
    """A session's durable head: its latest snapshot."""

    session_id: str
    snapshot_id: str
    sequence: int
    lifecycle: str
    updated_at: str


@dataclass(frozen=True, kw_only=True)
class PauseReceipt:
    """A durable pause request; the run stops at its next boundary (never midway)."""

    session_id: str
    position: int
    requested_at: str
    status: str = "requested"


@dataclass(frozen=True, kw_only=True)
class SteeringReceipt:
    """A durable steering item; the loop takes it in once, at its next boundary."""

    session_id: str
    position: int
    text_digest: str
    submitted_at: str


@dataclass(frozen=True, kw_only=True)
class ApprovalReceipt:
    """A durable answer to a tool call awaiting approval."""

    session_id: str
    call_id: str
    approved: bool
    position: int
    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class SessionForkReceipt:
    """Records where a forked session came from."""

    parent_session_id: str
    parent_snapshot_id: str
    child_session_id: str
    operation_id: str | None
    created_at: str


@dataclass(frozen=True, kw_only=True)
class ToolCallStatus:
    """One call of an in-flight tool batch."""

    call_id: str
    tool: str
    args: Mapping[str, Any]
    status: str  # awaiting_approval | approved | rejected | started | completed | failed | not_started
    needs_approval: bool = False
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class ToolBatchSnapshot:
    """The tool calls of a step that has not finished."""

    step_id: int
    calls: tuple[ToolCallStatus, ...]

    @property
    def pending_approval(self) -> tuple[ToolCallStatus, ...]:
        """Calls waiting for a human."""
        return tuple(c for c in self.calls if c.status == "awaiting_approval")


@dataclass(frozen=True, kw_only=True)
class SessionInspection:
    """Read-only inspection result backed by the current durable head."""

    head: SessionHead
    lifecycle: SessionLifecycle
    capabilities: tuple[str, ...]
    snapshot_integrity: str
    budget: Mapping[str, Any]
    work_graph: Mapping[str, Any] | None
    last_request_view: RequestView | None
    task: str
    tool_batch: ToolBatchSnapshot | None


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
        self._journal: SessionJournal | None = None

    @property
    def store(self) -> CheckpointStore:
        """The bound checkpoint store."""
        store = self.engine.checkpoint_store
        if store is None:
            raise ConfigurationError("this engine has no checkpoint_store; pass Engine(checkpoint_store=...)")
        return store  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"Session({self.session_id.value!r})"

    # ---- running

    def run(self, *, steering: str | None = None) -> EngineResult[Any]:
        """Run or resume through the one canonical Engine loop (the sync driver, this thread).

        The run takes the session's lease first: if another runner holds it, SessionBusyError
        names that runner and nothing executes. The lease is renewed while the run goes on and
        released when it ends (see ``qitos.sessions.lease``).
        """
        if steering is not None:
            self.steer(steering)
        store = self.store
        sid = self.session_id.value
        lease = self._lease_keeper(store, sid)
        lease.acquire()
        try:
            head = _require_head(store, sid)  # read under the lease: no other runner moves it now
            journal, resume = self._prepare_run(store, restore(store, sid, head.snapshot_id), lease)
            lease.start_heartbeat()
            return self.engine.run(self._task_or_load(), journal=journal, resume=resume, run_id=self.run_id.value)
        finally:
            lease.release()

    async def arun(self, *, steering: str | None = None) -> EngineResult[Any]:
        """``run`` through the async driver, on the running event loop.

        The lease, the journal's store operations and the model/tool calls are awaited, so many
        sessions run at once in one process. Rebuilding the head from the store (a chain of reads)
        runs in a worker thread. Cancelling the awaiting task stops the run as
        ``Engine.cancel(immediate=True)`` would, commits its last boundary, releases the lease and
        raises ``CancelledError``.
        """
        if steering is not None:
            await self.asteer(steering)
        store = self.store
        sid = self.session_id.value
        lease = self._lease_keeper(store, sid)
        await lease.aacquire()
        try:
            head = await store.aget_session_head(sid)
            if head is None:
                raise SessionNotFoundError(sid)
            restored = await asyncio.to_thread(restore, store, sid, head.snapshot_id)
            journal, resume = self._prepare_run(store, restored, lease)
            lease.start_async_heartbeat()
            task = self._task_or_load()
            return await self.engine.arun(task, journal=journal, resume=resume, run_id=self.run_id.value)
        finally:
            await lease.arelease()

    def _lease_keeper(self, store: CheckpointStore, sid: str) -> LeaseKeeper:
        runtime = self._composition.runtime if self._composition is not None else None
        return LeaseKeeper(store, sid, ttl_seconds=runtime.lease_ttl if runtime else DEFAULT_LEASE_TTL)

    def _prepare_run(
        self, store: CheckpointStore, restored: RestoredSession, lease: LeaseKeeper
    ) -> tuple[SessionJournal, ResumePoint]:
        """The journal and resume point of a new run from the restored head (no I/O)."""
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
        )
        self._journal = journal
        resume = ResumePoint(
            state=state,
            log=restored.log,
            budget_used={
                **(restored.snapshot.payload.get("budget_used") or {}),
                "control_position": restored.control_position,
                "pause_position": restored.pause_position,
            },
            pending=restored.pending,
            carry_changes=restored.carry_changes,
        )
        return journal, resume

    def _redactor(self) -> Redactor:
        """The redaction policy for what this session writes: patterns plus the model's credentials."""
        return Redactor(model_credentials(self.engine.model))

    def pause(self) -> PauseReceipt:
        """Request cooperative pause; durable status is returned at a boundary."""
        item = self.store.append_control(self.session_id.value, "pause", {"requested_at": utc_now()})
        return _pause_receipt(item)

    async def apause(self) -> PauseReceipt:
        """Async twin of :meth:`pause`."""
        item = await self.store.aappend_control(self.session_id.value, "pause", {"requested_at": utc_now()})
        return _pause_receipt(item)

    def steer(self, text: str) -> SteeringReceipt:
        """Durably submit one canonical steering item to this Session."""
        _check_steering(text)
        item = self.store.append_control(self.session_id.value, "steer", {"text": self._redactor().redact_value(text)})
        return _steering_receipt(item, text)

    async def asteer(self, text: str) -> SteeringReceipt:
        """Async twin of :meth:`steer`."""
        _check_steering(text)
        payload = {"text": self._redactor().redact_value(text)}
        item = await self.store.aappend_control(self.session_id.value, "steer", payload)
        return _steering_receipt(item, text)

    def approve(self, call_id: str) -> ApprovalReceipt:
        """Approve a tool call awaiting approval; the next ``run()`` executes it."""
        self._check_awaiting(self.inspect(), call_id)
        return self._answer(call_id, True, None)

    async def aapprove(self, call_id: str) -> ApprovalReceipt:
        """Async twin of :meth:`approve`."""
        self._check_awaiting(await self.ainspect(), call_id)
        return await self._aanswer(call_id, True, None)

    def reject(self, call_id: str, reason: str | None = None) -> ApprovalReceipt:
        """Reject a tool call awaiting approval; the next ``run()`` reports the rejection to the agent."""
        self._check_awaiting(self.inspect(), call_id)
        return self._answer(call_id, False, reason)

    async def areject(self, call_id: str, reason: str | None = None) -> ApprovalReceipt:
        """Async twin of :meth:`reject`."""
        self._check_awaiting(await self.ainspect(), call_id)
        return await self._aanswer(call_id, False, reason)

    def _check_awaiting(self, inspection: SessionInspection, call_id: str) -> None:
        batch = inspection.tool_batch
        waiting = {c.call_id for c in batch.pending_approval} if batch else set()
        if call_id not in waiting:
            raise ConfigurationError(
                f"session {self.session_id.value}: no tool call {call_id!r} is awaiting approval "
                f"(awaiting: {sorted(waiting) or 'none'})"
            )

    def _answer(self, call_id: str, approved: bool, reason: str | None) -> ApprovalReceipt:
        kind = "approve" if approved else "reject"
        payload = self._redactor().redact_value({"call_id": call_id, "reason": reason})
        item = self.store.append_control(self.session_id.value, kind, payload)
        return ApprovalReceipt(
            session_id=item.session_id, call_id=call_id, approved=approved, position=item.position, reason=reason
        )

    async def _aanswer(self, call_id: str, approved: bool, reason: str | None) -> ApprovalReceipt:
        kind = "approve" if approved else "reject"
        payload = self._redactor().redact_value({"call_id": call_id, "reason": reason})
        item = await self.store.aappend_control(self.session_id.value, kind, payload)
        return ApprovalReceipt(
            session_id=item.session_id, call_id=call_id, approved=approved, position=item.position, reason=reason
        )

    def capabilities(self) -> frozenset[str]:
        """What this session supports with its store."""
        caps = {"run", "pause", "steer", "fork", "inspect", "approve"}
        if not isinstance(self.store, InMemoryCheckpointStore):
            caps.add("cross_process_restore")
        return frozenset(caps)

    # ---- forking

    def fork(
        self, snapshot: SessionSnapshot | SnapshotIdentity | str | None = None, *, operation_id: str | None = None
    ) -> Session:
        """Create an isolated durable child from one verified immutable snapshot."""
        store = self.store
        sid = self.session_id.value
        if operation_id is not None:
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
        source = store.get_snapshot(snapshot_id)
        source_state = materialize(store, snapshot_id)  # verifies the whole chain the child will share
        child_id = SessionIdentity.new().value
        # The child's first snapshot adds nothing: state, log and request view come from the chain.
        inherited = ("step_id", "budget_used", "stop_reason", "pending")
        payload: dict[str, Any] = {k: source.payload[k] for k in inherited if k in source.payload}
        payload.update(
            state={"delta": []},
            control_position=0,
            lifecycle=source_state.lifecycle,
            fork_of={"session_id": source.session_id, "snapshot_id": snapshot_id},
        )
        child = SessionSnapshot.create(
            session_id=child_id,
            parent_id=snapshot_id,
            base_id=source.base_id or snapshot_id,
            sequence=source.sequence + 1,
            payload=payload,
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
        """Read the durable head: lifecycle, integrity, budget, work graph, last request, tool batch."""
        store = self.store
        sid = self.session_id.value
        record = _require_head(store, sid)
        head = SessionHead(
            session_id=sid,
            snapshot_id=record.snapshot_id,
            sequence=record.sequence,
            lifecycle=record.lifecycle,
            updated_at=record.updated_at,
        )
        restored: RestoredSession | None = None
        try:
            restored = restore(store, sid, record.snapshot_id)
            store.list_control(sid)  # control items are verified too (digests, none missing)
            integrity = "verified"
        except IntegrityError as exc:
            integrity = f"corrupt: {exc}"
            restored = None
        payload = restored.snapshot.payload if restored else {}
        used = dict(payload.get("budget_used") or {})
        used["steps"] = int(payload.get("step_id", 0))
        used["control_position"] = restored.control_position if restored else 0
        budget: dict[str, Any] = {"used": used}
        if restored is not None:
            state_data = restored.state_data
            task = self._task_or_load()
            engine_budget = self.engine.budget
            budget["limits"] = {
                "max_steps": state_data.get("max_steps"),
                "max_runtime_seconds": task.budget.max_runtime_seconds or engine_budget.max_runtime_seconds,
                "max_tokens": task.budget.max_tokens or engine_budget.max_tokens,
            }
        journal = self._journal
        budget["durability"] = {
            "mode": journal.mode
            if journal
            else (self._composition.runtime.durability if self._composition else "sync"),
            "unflushed_boundaries": journal.unflushed if journal else 0,
        }
        view = None
        view_id = restored.request_view if restored else None
        if view_id and restored is not None:
            raw = store.get_blobs([view_id]).get(view_id)
            if raw is not None:
                view = view_from_record(json.loads(unpack(raw)), restored.log)
        return SessionInspection(
            head=head,
            lifecycle=SessionLifecycle(record.lifecycle),
            capabilities=tuple(sorted(self.capabilities())),
            snapshot_integrity=integrity,
            budget=budget,
            work_graph=self._work_graph(store, sid) if restored else None,
            last_request_view=view,
            task=self._task_or_load().objective,
            tool_batch=self._tool_batch(restored.pending if restored else None),
        )

    async def ainspect(self) -> SessionInspection:
        """Async twin of :meth:`inspect` (its reads run in a worker thread)."""
        return await asyncio.to_thread(self.inspect)

    def _tool_batch(self, pending: PendingStep | None) -> ToolBatchSnapshot | None:
        if pending is None:
            return None
        approvals = {
            str(i.payload.get("call_id")): i
            for i in self.store.list_control(self.session_id.value, kinds=APPROVAL_KINDS)
        }
        registry = self.engine.agent.tool_registry
        calls = []
        for action in pending.decision.get("actions") or []:
            call_id = action["id"]
            spec = registry.get(action["name"])
            needs = bool(spec and spec.needs_approval)
            result = pending.results.get(call_id)
            error = None
            if result is not None:
                status = (
                    "completed"
                    if result.get("ok")
                    else ("rejected" if result.get("error_kind") == "rejected" else "failed")
                )
                error = result.get("error")
            elif call_id in pending.started:
                status = "started"
            elif needs and call_id in approvals:
                status = "approved" if approvals[call_id].kind == "approve" else "rejected"
            elif needs:
                status = "awaiting_approval"
            else:
                status = "not_started"
            calls.append(
                ToolCallStatus(
                    call_id=call_id,
                    tool=action["name"],
                    args=dict(action.get("args") or {}),
                    status=status,
                    needs_approval=needs,
                    error=error,
                )
            )
        return ToolBatchSnapshot(step_id=pending.step_id, calls=tuple(calls))

    def _work_graph(self, store: CheckpointStore, sid: str, limit: int = 500) -> dict[str, Any]:
        steps: dict[int, dict[str, Any]] = {}
        snapshot_ids = store.list_session_snapshots(sid)[:limit]
        run_id: str | None = None
        for snapshot_id in reversed(snapshot_ids):
            try:
                snap = store.get_snapshot(snapshot_id)
            except CheckpointError:
                continue
            run_id = snap.payload.get("run_id", run_id)  # written on a run's first snapshot only
            for step in snap.payload.get("step") or []:
                item = steps.setdefault(
                    step["step_id"],
                    {"work_item": f"step-{step['step_id']}", "kind": "step", "attempts": [], "tool_calls": []},
                )
                item["attempts"].append({"run_id": run_id, "snapshot_id": snapshot_id, "outcome": "committed"})
                item["mode"] = step.get("mode")
                item["tool_calls"] = [
                    {
                        "work_item": c["call_id"],
                        "tool": c["tool"],
                        "outcome": "ok" if c["ok"] else (c.get("error_kind") or "error"),
                    }
                    for c in step.get("calls") or []
                ]
            pending = snap.payload.get("pending")
            if pending:
                item = steps.setdefault(
                    pending["step_id"],
                    {"work_item": f"step-{pending['step_id']}", "kind": "step", "attempts": [], "tool_calls": []},
                )
                item["attempts"].append(
                    {"run_id": run_id, "snapshot_id": snapshot_id, "outcome": snap.payload.get("lifecycle")}
                )
        return {"session_id": sid, "steps": [steps[k] for k in sorted(steps)]}

    def _task_or_load(self) -> Task:
        if self._task is None:
            record = _require_head(self.store, self.session_id.value)
            self._task = Task.from_dict(record.metadata.get("task") or {"objective": ""})
        return self._task


def _pause_receipt(item: ControlItem) -> PauseReceipt:
    return PauseReceipt(session_id=item.session_id, position=item.position, requested_at=item.created_at)


def _check_steering(text: str) -> None:
    if not isinstance(text, str) or not text.strip():
        raise ConfigurationError("steering text must be a non-empty string")


def _steering_receipt(item: ControlItem, text: str) -> SteeringReceipt:
    return SteeringReceipt(
        session_id=item.session_id,
        position=item.position,
        text_digest=sha256_hex(text),
        submitted_at=item.created_at,
    )


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
        target: Any = importlib.import_module(module_name)
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
    raise ConfigurationError(f"cannot import the session's state type {name!r} in this process")


def _agent_identity(engine: EngineLoop[Any, Any, Any]) -> AgentIdentity:
    cls = type(engine.agent)
    return AgentIdentity(f"agt_{sha256_hex(f'{cls.__module__}:{cls.__qualname__}')[:24]}")


def new_session(
    engine: EngineLoop[Any, Any, Any], task: str | Task, *, composition: SessionHost | None = None, **state_kwargs: Any
) -> Session:
    """Create a durable session: initialise the state and commit its first snapshot."""
    store, commit, session = _first_snapshot(engine, task, composition, state_kwargs)
    store.commit_session_snapshot(commit)
    return session


async def anew_session(
    engine: EngineLoop[Any, Any, Any], task: str | Task, *, composition: SessionHost | None = None, **state_kwargs: Any
) -> Session:
    """Async twin of :func:`new_session` (the first snapshot is committed with the store's async method)."""
    store, commit, session = _first_snapshot(engine, task, composition, state_kwargs)
    await store.acommit_session_snapshot(commit)
    return session


def _first_snapshot(
    engine: EngineLoop[Any, Any, Any],
    task: str | Task,
    composition: SessionHost | None,
    state_kwargs: Mapping[str, Any],
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
    session_id = SessionIdentity.new()
    redactor = Redactor(model_credentials(engine.model))  # nothing stored holds a secret (qitos.core.redaction)
    full = redactor.redact_value(state.to_dict())
    log = ExchangeLog(f"log-{session_id.value}")
    payload: dict[str, Any] = {
        "format": FORMAT,
        "step_id": 0,
        "lifecycle": SessionLifecycle.CREATED.value,
        "stop_reason": None,
        "budget_used": {},
        "control_position": 0,
        "pending": None,
        "step": [],
        "request_view": None,
        "state": {"full": full},
        "log": {"log_id": log.log_id, "position": 0, "digest": log.digest, "chunks": []},
    }
    snapshot = SessionSnapshot.create(
        session_id=session_id.value, parent_id=None, base_id=None, sequence=0, payload=payload
    )
    created_at = utc_now()
    agent_id = _agent_identity(engine)
    references = composition.runtime.references if composition is not None else ()
    metadata = {
        "agent_id": agent_id.value,
        "agent": f"{type(engine.agent).__module__}:{type(engine.agent).__qualname__}",
        "state_type": _state_type_name(type(state)),
        "task": redactor.redact_value(the_task.to_dict()),
        "created_at": created_at,
        "parent_session_id": None,
        "fork_snapshot_id": None,
        "references": [{"name": r.name, "kind": r.kind, "provider": r.provider} for r in references],
    }
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
    store = engine.checkpoint_store
    if store is None:
        raise ConfigurationError("restoring a session needs an engine with a checkpoint_store")
    head = _require_head(store, session_id)
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
    )
