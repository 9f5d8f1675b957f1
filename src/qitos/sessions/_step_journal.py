"""The store-backed journal of durable sessions, and rebuilding a session from its snapshots.

The snapshot payload is one typed record, ``qitos.sessions._payload.SnapshotPayload`` (its module
says what each field holds and how it is stored); the journal builds it and restoring reads it.

A snapshot holds the state *changes* of its step and a reference to a blob with the new exchange
entries. A full state (a new base) is written once the deltas since the last one outgrow its
payload by ``_FULL_FACTOR`` and are either ``_MIN_BASE_DELTA_BYTES`` long or ``_MAX_CHAIN_DELTAS``
snapshots deep. Because long lists are stored as shared runs, a base costs what is new since the
last one plus its references, so bases stay frequent and a restore reads a short chain: the base,
its runs and at most a few dozen deltas. Format 1 payloads (no ``chunks``) are read the same way.

Redaction: every payload and blob the journal writes (pending writes, snapshot payloads, state runs,
the stored request view) passes its ``redactor`` (``qitos.core._redaction``: token shapes plus the
model's configured credentials) in :meth:`SessionJournal._clean`, so no secret reaches the store;
the exchange-log entries were redacted when recorded. A snapshot payload's other keys hold only
counters, ids, digests and kinds, so only its ``state`` and ``pending`` parts are cleaned, and its
steps' model calls are stored as their decision writes were cleaned. A restored session sees the
marker.
Durability modes and crash safety are described in ``qitos.engine.session_runtime``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar

from qitos.checkpoint._packing import pack_or_raw, unpack
from qitos.checkpoint._records import ControlItem, SessionSnapshot, SessionSnapshotCommit, StepWrite
from qitos.checkpoint.store import CheckpointStore
from qitos.core._codec import canonical_json, encode_value, field_hints, sha256_hex
from qitos.core._decision import Action
from qitos.core._errors import CheckpointError, IntegrityError, SnapshotIntegrityError
from qitos.core._exchange import ExchangeLog
from qitos.core._redaction import Redactor
from qitos.core._state import apply_changes
from qitos.core._tool import ToolResult
from qitos.sessions._journal import Approval, BoundaryCommit, ControlBatch, PendingStep, RunJournal, SteeringItem
from qitos.sessions._lease import LeaseKeeper
from qitos.sessions._payload import FORMAT, CallSummary, ForkOrigin, LogMark, SnapshotPayload, StepSummary
from qitos.sessions._state_chunks import ChunkRef, chunk_list, join_chunks, reusable_runs
from qitos.sessions._stored_view import view_record

__all__ = [
    "RestoredSession",
    "SessionJournal",
    "arestore",
    "arestore_created",
    "first_payload",
    "fork_payload",
    "materialize",
    "restore",
    "restore_created",
]

_T = TypeVar("_T")

# A new base is written when the deltas since the last one exceed this multiple of its payload
# (so payload rewrites stay within 1/factor of the data) and the chain is long enough to matter.
_FULL_FACTOR = 3
_MIN_BASE_DELTA_BYTES = 32 * 1024
_MAX_CHAIN_DELTAS = 64
APPROVAL_KINDS = ("approve", "reject")
# The digest of a log with no entries (it does not depend on the log id).
_EMPTY_LOG_DIGEST = ExchangeLog("empty").digest
_POLL_NOW = -1e9  # a last-poll time so old that the next control check reads the store

# --------------------------------------------------------------------------- restoring


@dataclass
class RestoredSession:
    """A session rebuilt at one snapshot: its state data, exchange log and any unfinished step."""

    snapshot: SessionSnapshot
    payload: SnapshotPayload  # the snapshot's payload record
    base_id: str
    state_data: dict[str, Any]
    copied: set[str]
    log: ExchangeLog
    log_chunks: list[str]
    request_view: str | None
    pending: PendingStep | None
    carry_changes: list[dict[str, Any]]
    state_bytes: int = 0  # the base snapshot's payload size: what the materialization rule compares to
    delta_bytes: int = 0
    deltas: int = 0  # snapshots after the base
    # The base's list fields stored as runs, and the fields changed since other than by appends
    # (their runs no longer describe a prefix): what the next base may reuse.
    chunks: dict[str, list[ChunkRef]] = field(default_factory=dict)
    reshaped: set[str] = field(default_factory=set)
    lifecycle: str = "created"
    run_id: str | None = None
    trace: dict[str, str] | None = None  # the trace context written with run_id (see the module docstring)
    # True when the unfinished step was rebuilt from pending writes: what its DECIDE appended to the
    # log and changed in the state is not in any snapshot yet.
    pending_from_writes: bool = False

    @property
    def budget_used(self) -> dict[str, Any]:
        """What the session used so far (tokens, elapsed seconds), as its head records it."""
        return dict(self.payload.budget_used)

    @property
    def control_position(self) -> int:
        """Control items consumed so far (including by an unfinished step)."""
        position = self.payload.control_position
        return max(position, self.pending.control_position) if self.pending else position

    @property
    def pause_position(self) -> int:
        """The position of the last pause request a run stopped for (0: none)."""
        return self.payload.pause_position


def first_payload(state_full: Mapping[str, Any], log: ExchangeLog, lifecycle: str) -> SnapshotPayload:
    """The payload of a new session's first snapshot: a base holding the whole (encoded) state."""
    return SnapshotPayload(
        format=FORMAT,
        step_id=0,
        lifecycle=lifecycle,
        state_full=dict(state_full),
        log=LogMark(log_id=log.log_id, position=log.position, digest=log.digest, chunks=()),
    )


def fork_payload(source: SessionSnapshot, lifecycle: str) -> SnapshotPayload:
    """The payload of a fork's first snapshot: it adds nothing, so state, log and request view come
    from the chain it shares with ``source``; counters and an unfinished step carry over."""
    inherited = SnapshotPayload.of(source)
    return SnapshotPayload(
        step_id=inherited.step_id,
        budget_used=inherited.budget_used,
        stop_reason=inherited.stop_reason,
        pending=inherited.pending,
        lifecycle=lifecycle,
        fork_of=ForkOrigin(session_id=source.session_id, snapshot_id=source.snapshot_id),
    )


# Restoring reads the store a few times, each read depending on the one before. The reads are
# written once, as plans: generators that yield what to read (a CheckpointStore method's name and
# its arguments) and get back its result, driven by plain calls or by the async twins.
_StoreRead = tuple[Literal["load_chain", "load_chain_with_writes", "get_blobs"], tuple[Any, ...]]
_ReadPlan = Generator[_StoreRead, Any, _T]


def _read(store: CheckpointStore, plan: _ReadPlan[_T]) -> _T:
    """Run ``plan`` with the store's methods (a read's error is raised inside the plan)."""
    try:
        name, args = next(plan)
        while True:
            try:
                result = getattr(store, name)(*args)
            except CheckpointError as exc:
                name, args = plan.throw(exc)
                continue
            name, args = plan.send(result)
    except StopIteration as done:
        value: _T = done.value
        return value


async def _aread(store: CheckpointStore, plan: _ReadPlan[_T]) -> _T:
    """Run ``plan`` with the store's async twins (``aload_chain``, ...)."""
    try:
        name, args = next(plan)
        while True:
            try:
                result = await getattr(store, f"a{name}")(*args)
            except CheckpointError as exc:
                name, args = plan.throw(exc)
                continue
            name, args = plan.send(result)
    except StopIteration as done:
        value: _T = done.value
        return value


def materialize(store: CheckpointStore, snapshot_id: str) -> RestoredSession:
    """Rebuild the state data and the exchange log at ``snapshot_id`` from its verified chain."""
    return _read(store, _materialize(snapshot_id))


def _materialize(snapshot_id: str) -> _ReadPlan[RestoredSession]:
    chain: list[SessionSnapshot] = yield "load_chain", (snapshot_id,)
    return (yield from _rebuild(chain))


def _rebuild(chain: list[SessionSnapshot]) -> _ReadPlan[RestoredSession]:
    """The state data and the exchange log at the end of ``chain`` (verified, oldest first)."""
    base, head = chain[0], chain[-1]
    payloads = [SnapshotPayload.of(snap) for snap in chain]
    first = payloads[0]
    if first.state_full is None:
        raise SnapshotIntegrityError(base.snapshot_id, "the chain's base holds no full state")
    # Copy-on-write: fields are copied only when a delta changes them (the payloads stay intact).
    data: dict[str, Any] = dict(first.state_full)
    copied: set[str] = set()
    chunks = yield from _load_chunks(base, first, data)
    copied.update(chunks)  # lists joined from runs belong to no payload
    reshaped: set[str] = set()
    log_mark = first.log
    log_chunks: list[str] = list(log_mark.chunks or ()) if log_mark is not None else []
    view_id = first.request_view
    run_id, trace = first.run_id, first.trace
    delta_bytes = 0
    for snap, payload in zip(chain[1:], payloads[1:], strict=True):
        delta_bytes += snap.payload_size
        if payload.run_id is not None:
            run_id, trace = payload.run_id, payload.trace
        if payload.is_base:
            raise SnapshotIntegrityError(snap.snapshot_id, "a full state inside a chain after its base")
        ops = payload.state_delta
        try:
            apply_copied(data, ops, copied)
            note_reshaped(reshaped, ops)
        except Exception as exc:
            raise SnapshotIntegrityError(snap.snapshot_id, f"its state delta does not apply: {exc}") from exc
        if payload.log is not None:
            log_mark = payload.log
            if log_mark.chunk:
                log_chunks.append(log_mark.chunk)
        if payload.request_view is not None:
            view_id = payload.request_view
    log = ExchangeLog(log_mark.log_id if log_mark is not None else f"log-{head.session_id}")
    if log_chunks:
        try:
            blobs = yield "get_blobs", (log_chunks,)
        except CheckpointError as exc:
            raise SnapshotIntegrityError(head.snapshot_id, f"its exchange-log blobs are unreadable: {exc}") from exc
        for chunk in log_chunks:
            raw = blobs.get(chunk)
            if raw is None:
                raise SnapshotIntegrityError(head.snapshot_id, f"exchange-log blob {chunk} is missing")
            try:
                log.extend_entries(json.loads(unpack(raw)))
            except Exception as exc:
                raise SnapshotIntegrityError(
                    head.snapshot_id, f"exchange-log blob {chunk} is unreadable: {exc}"
                ) from exc
    position = log_mark.position if log_mark is not None else 0
    digest = log_mark.digest if log_mark is not None else log.digest
    if log.position != position or log.digest != digest:
        raise SnapshotIntegrityError(
            head.snapshot_id,
            f"the exchange log rebuilt to position {log.position} digest {log.digest[:12]}, "
            f"but the snapshot records {position} {digest[:12]}",
        )
    return RestoredSession(
        snapshot=head,
        payload=payloads[-1],
        base_id=base.snapshot_id,
        state_data=data,
        copied=copied,
        log=log,
        log_chunks=log_chunks,
        request_view=view_id,
        pending=None,
        carry_changes=[],
        state_bytes=base.payload_size,
        delta_bytes=delta_bytes,
        deltas=len(chain) - 1,
        chunks={name: list(refs) for name, refs in chunks.items()},
        reshaped=reshaped,
        lifecycle=payloads[-1].effective_lifecycle,
        run_id=run_id,
        trace=dict(trace) if trace is not None else None,
    )


def _load_chunks(
    base: SessionSnapshot, payload: SnapshotPayload, data: dict[str, Any]
) -> _ReadPlan[Mapping[str, tuple[ChunkRef, ...]]]:
    """Join the base's list fields stored as runs into ``data``; their references, by field."""
    refs = payload.state_chunks
    if any(name in data for name in refs):
        raise SnapshotIntegrityError(
            base.snapshot_id, "its state chunk table is malformed: a field is both inline and stored as runs"
        )
    if not refs:
        return refs
    try:
        blobs = yield "get_blobs", ({ref.digest for field_refs in refs.values() for ref in field_refs},)
    except CheckpointError as exc:
        raise SnapshotIntegrityError(base.snapshot_id, f"its state chunks are unreadable: {exc}") from exc
    for name, field_refs in refs.items():
        try:
            data[name] = join_chunks(list(field_refs), blobs)
        except ValueError as exc:
            raise SnapshotIntegrityError(base.snapshot_id, f"field {name!r}: {exc}") from exc
    return refs


def note_reshaped(reshaped: set[str], ops: Sequence[Mapping[str, Any]]) -> None:
    """Add the fields that ``ops`` change other than by appending (see ``state_chunks``)."""
    for op in ops:
        if op["op"] != "extend":
            reshaped.add(op["field"])


def apply_copied(data: dict[str, Any], ops: Sequence[Mapping[str, Any]], copied: set[str]) -> None:
    """``apply_changes`` that first copies a list or dict field it is about to change in place."""
    for op in ops:
        name = op["field"]
        if op["op"] == "set":
            copied.discard(name)  # the new value is shared with the payload until copied again
        elif name not in copied:
            value = data.get(name)
            if isinstance(value, list):
                data[name] = list(value)
            elif isinstance(value, dict):
                data[name] = dict(value)
            copied.add(name)
        apply_changes(data, [op])


def restore(store: CheckpointStore, session_id: str, head_id: str) -> RestoredSession:
    """Rebuild ``session_id`` at ``head_id``, folding in the pending writes of an unfinished step."""
    return _read(store, _restore(session_id, head_id))


async def arestore(store: CheckpointStore, session_id: str, head_id: str) -> RestoredSession:
    """Async twin of :func:`restore` (the same reads, through the store's async methods)."""
    return await _aread(store, _restore(session_id, head_id))


def restore_created(store: CheckpointStore, snapshot: SessionSnapshot) -> RestoredSession:
    """A session at the first snapshot it was created with, while that is still its head and nothing
    was written on it: rebuilt from ``snapshot`` itself, without reading it back."""
    return _read(store, _restored(snapshot.session_id, [snapshot], []))


async def arestore_created(store: CheckpointStore, snapshot: SessionSnapshot) -> RestoredSession:
    """Async twin of :func:`restore_created`."""
    return await _aread(store, _restored(snapshot.session_id, [snapshot], []))


def _restore(session_id: str, head_id: str) -> _ReadPlan[RestoredSession]:
    read: tuple[list[SessionSnapshot], list[StepWrite]] = yield "load_chain_with_writes", (session_id, head_id)
    chain, writes = read
    return (yield from _restored(session_id, chain, writes))


def _restored(session_id: str, chain: list[SessionSnapshot], writes: list[StepWrite]) -> _ReadPlan[RestoredSession]:
    """The session at the end of ``chain`` with the pending ``writes`` of its unfinished step folded in."""
    restored = yield from _rebuild(chain)
    recorded = restored.payload.pending
    # A copy: the calls started and finished since are added to it, never to the payload record.
    pending = replace(recorded, started=set(recorded.started), results=dict(recorded.results)) if recorded else None
    for write in writes:
        if write.kind == "decision" and pending is None:
            # The step crashed after DECIDE: re-apply what DECIDE did, never decide again.
            try:
                pending = PendingStep.from_dict(write.payload)
                restored.log.extend_entries(pending.log_entries)
                apply_copied(restored.state_data, pending.state_changes, restored.copied)
            except Exception as exc:
                raise IntegrityError(
                    "writes",
                    f"decision/{write.key}",
                    f"the unfinished step does not apply: {exc}",
                    session_id=session_id,
                ) from exc
            note_reshaped(restored.reshaped, pending.state_changes)
            restored.carry_changes.extend(pending.state_changes)
            restored.pending_from_writes = True
    if pending is not None:
        for write in writes:
            if write.step_id != pending.step_id:
                continue
            if write.kind == "tool_started":
                pending.started.add(write.key)
            elif write.kind == "tool_result":
                pending.results.setdefault(write.key, dict(write.payload))
    restored.pending = pending
    return restored


# --------------------------------------------------------------------------- the journal


class SessionJournal(RunJournal):
    """Persists every boundary of a run to the checkpoint store (see the module docstring)."""

    durable = True

    def __init__(
        self,
        store: CheckpointStore,
        session_id: str,
        restored: RestoredSession,
        *,
        run_id: str,
        mode: str = "sync",
        batch_steps: int = 16,
        batch_ms: float = 50.0,
        poll_interval: float = 0.005,
        lease: LeaseKeeper | None = None,
        redactor: Redactor | None = None,
        control_seq: int | None = None,
    ) -> None:
        self.store = store
        self.redactor = redactor if redactor is not None else Redactor()
        # The run's hold on the session: its token goes with every write, and a lost lease stops
        # the journal before it writes anything (see qitos.sessions._lease).
        self.lease = lease
        # Control items (pause, steer, approvals) are read from the store at a boundary at most every
        # poll_interval seconds (always at a run's first boundary and before an approval check), so a
        # run of sub-millisecond steps does not pay a query per step; a request lands within that time.
        # A commit that reports the head's control counter stands for a poll (see _committed_now), and
        # so does ``control_seq``, the counter of the head the run was restored from, read under its
        # lease: 0 means there is nothing to read at the first boundary either.
        self.poll_interval = poll_interval
        self._last_poll = _POLL_NOW
        self.session_id = session_id
        self.run_id = run_id
        self.mode = mode
        self.batch_steps = batch_steps
        self.batch_ms = batch_ms
        head = restored.snapshot
        self._head_id = head.snapshot_id
        self._sequence = head.sequence
        self._base_id = restored.base_id
        self._state_bytes = restored.state_bytes
        self._delta_bytes = restored.delta_bytes
        self._deltas = restored.deltas
        self._chunks = dict(restored.chunks)
        self._reshaped = set(restored.reshaped)
        self._run_recorded = False
        # The trace context of the session's latest run before this one, and this run's (set by
        # telemetry before the first commit; written beside run_id).
        self.previous_trace: dict[str, str] | None = restored.trace
        self.previous_run_id: str | None = restored.run_id
        self.trace_context: dict[str, str] | None = None
        # The log position already in snapshots: entries an unfinished step re-applied from its
        # pending writes come after it and go into the next commit.
        self._log_position = restored.log.position
        if restored.pending is not None and restored.pending_from_writes:
            self._log_position -= len(restored.pending.log_entries)
        self._log_chunks = list(restored.log_chunks)
        self._restored_started = frozenset(restored.pending.started) if restored.pending else frozenset()
        # The model call of each step not committed yet, by step, as stored (redacted): the step's
        # summary records it (its decision's pending write ends with the commit that ends the step).
        self._models: dict[int, Any] = {}
        if restored.pending is not None and restored.pending.model is not None:
            self._models[restored.pending.step_id] = restored.pending.model
        self._request_view_id: str | None = restored.request_view
        self._request_view_obj: Any = None
        self._consumed = restored.control_position
        self._pause_handled = restored.pause_position
        self._committed: list[Any] = []  # step records of boundaries made durable, for the trace
        self._fetched = 0
        if control_seq is not None and control_seq <= self._fetched:
            self._last_poll = time.monotonic()
        self._pause_positions: list[int] = []
        self._steering: list[SteeringItem] = []
        self._approvals: dict[str, Approval] = {}
        self._buffer: list[BoundaryCommit] = []
        # Writes that ride with the step's next durable write: a decision made without a model, and
        # the results of finished calls.
        self._unwritten: list[StepWrite] = []
        # A batch's calls record their starts from the threads that run them while finished calls'
        # results arrive in the driving thread: the hand-over of waiting writes is locked.
        self._unwritten_lock = threading.Lock()
        self._started_ids: set[str] = set()  # this step's calls whose start was written
        self._buffer_since = time.monotonic()
        self._failure: CheckpointError | None = None
        self.commits = 0

    # ---- control items

    def control(self, step_id: int, *, fresh: bool = False) -> ControlBatch:
        if self._poll_due(fresh):
            self._take_control(self.store.list_control(self.session_id, after=self._fetched))
        return self._control_batch()

    async def acontrol(self, step_id: int, *, fresh: bool = False) -> ControlBatch:
        if self._poll_due(fresh):
            self._take_control(await self.store.alist_control(self.session_id, after=self._fetched))
        return self._control_batch()

    def _poll_due(self, fresh: bool) -> bool:
        now = time.monotonic()
        if fresh or now - self._last_poll >= self.poll_interval:
            self._last_poll = now
            return True
        return False

    def _control_batch(self) -> ControlBatch:
        steering = tuple(s for s in self._steering if s.position > self._consumed)
        handled = max(self._consumed, self._pause_handled)
        pauses = [p for p in self._pause_positions if p > handled]
        if not steering and not pauses and not self._approvals:
            return ControlBatch(last_position=self._consumed)
        return ControlBatch(
            pause_requested=bool(pauses),
            steering=steering,
            approvals=dict(self._approvals),
            last_position=self._fetched,
            pause_position=max(pauses, default=0),
        )

    def _take_control(self, items: list[ControlItem]) -> None:
        for item in items:
            self._fetched = max(self._fetched, item.position)
            if item.kind in APPROVAL_KINDS:
                call_id = str(item.payload.get("call_id"))
                self._approvals.setdefault(
                    call_id, Approval(call_id, item.kind == "approve", item.payload.get("reason"))
                )
            elif item.position > self._consumed:
                if item.kind == "pause":
                    self._pause_positions.append(item.position)
                elif item.kind == "steer":
                    self._steering.append(SteeringItem(item.position, str(item.payload.get("text", ""))))

    # ---- pending writes inside a step

    def record_decision(self, pending: PendingStep) -> None:
        if not _worth_writing(pending):
            return
        self._flush_inside_step()
        write = self._decision_write(pending, self._token())
        if write is not None:
            self._put([write])

    async def arecord_decision(self, pending: PendingStep) -> None:
        if not _worth_writing(pending):
            return
        await self._aflush_inside_step()
        write = self._decision_write(pending, await self._atoken())
        if write is not None:
            await self._aput([write])

    def _decision_write(self, pending: PendingStep, token: int | None) -> StepWrite | None:
        """The decision's pending write to make now, or None when it waits for the first tool call."""
        payload = pending.to_dict()
        payload["started"], payload["results"] = [], {}
        write = self._step_write(pending.step_id, "decision", "decision", payload, token)
        if pending.model is None:
            # Deciding again without a model costs nothing, so this decision becomes durable in the
            # same transaction as its first tool call's start (still before any tool runs). A step
            # that stops before a tool runs commits its boundary with the decision as pending.
            self._unwritten.append(write)
            return None
        # The commit that ends the step deletes this write; the step's summary keeps the model call
        # (as cleaned here, so it is redacted once).
        self._models[pending.step_id] = write.payload["model"]
        return write  # a model's output is expensive to get again: durable at once

    def record_tool_started(self, step_id: int, action: Action, *, idempotent: bool = False) -> None:
        if idempotent:
            # No start to record (a restore runs an interrupted idempotent call again), but earlier
            # calls' results are made durable before another call runs.
            if self._waiting_results():
                self._put([], token=self._token())
            return
        stored = self._put([self._started_write(step_id, action, self._token())])
        self._check_started(stored, step_id, action)
        self._started_ids.add(action.id)

    async def arecord_tool_started(self, step_id: int, action: Action, *, idempotent: bool = False) -> None:
        if idempotent:
            if self._waiting_results():
                await self._aput([], token=await self._atoken())
            return
        stored = await self._aput([self._started_write(step_id, action, await self._atoken())])
        self._check_started(stored, step_id, action)
        self._started_ids.add(action.id)

    def _waiting_results(self) -> bool:
        """Whether a finished non-idempotent call's result still waits (an idempotent one's need
        not: a restore runs that call again)."""
        return any(w.kind == "tool_result" and w.key in self._started_ids for w in self._unwritten)

    def _started_write(self, step_id: int, action: Action, token: int | None) -> StepWrite:
        payload = {"name": action.name, "args": dict(action.args)}
        return self._step_write(step_id, "tool_started", action.id, payload, token)

    def _check_started(self, stored: list[bool], step_id: int, action: Action) -> None:
        if not stored[-1] and action.id not in self._restored_started:
            # First write wins: this call's start is already recorded but not by an attempt this
            # run restored (which re-runs only idempotent calls), so another runner may be running
            # it. Never start it a second time.
            raise CheckpointError(
                f"session {self.session_id!r}: tool call {action.id!r} of step {step_id} was already started "
                "by another attempt; it is not started again"
            )

    def record_tool_result(self, step_id: int, result: ToolResult) -> None:
        # The result rides with the step's next write: before the next call starts, or, for the
        # step's last call, the boundary (which holds the whole outcome). See "Crash safety" in
        # qitos.engine.session_runtime.
        write = self._step_write(step_id, "tool_result", result.call_id, result.to_dict(), None)
        with self._unwritten_lock:
            self._unwritten.append(write)

    async def arecord_tool_result(self, step_id: int, result: ToolResult) -> None:
        self.record_tool_result(step_id, result)

    def _clean(self, value: Any) -> Any:
        """``value`` as it may be stored: redacted (see the module docstring)."""
        return self.redactor.redact_value(value)

    def _clean_pending(self, pending: PendingStep | None) -> PendingStep | None:
        """An unfinished step as it may be stored: redacted (see the module docstring)."""
        return None if pending is None else PendingStep.from_dict(self._clean(pending.to_dict()))

    def _step_write(
        self, step_id: int, kind: str, key: str, payload: Mapping[str, Any], token: int | None
    ) -> StepWrite:
        return StepWrite(
            session_id=self.session_id,
            base_snapshot_id=self._head_id,
            step_id=step_id,
            kind=kind,
            key=key,
            payload=self._clean(payload),
            lease_token=token,
        )

    def _token(self) -> int | None:
        """The fencing token for the next write (renewing the lease when due), or None without a lease."""
        if self.lease is None:
            return None
        self.lease.check()
        return self.lease.token

    async def _atoken(self) -> int | None:
        """Async twin of :meth:`_token`."""
        if self.lease is None:
            return None
        await self.lease.acheck()
        return self.lease.token

    def _put(self, writes: list[StepWrite], *, token: int | None = None) -> list[bool]:
        """Persist ``writes`` in one transaction, after the step's writes still waiting."""
        return self.store.put_writes(self._with_unwritten(writes, token))

    async def _aput(self, writes: list[StepWrite], *, token: int | None = None) -> list[bool]:
        """Async twin of :meth:`_put`."""
        return await self.store.aput_writes(self._with_unwritten(writes, token))

    def _with_unwritten(self, writes: list[StepWrite], token: int | None) -> list[StepWrite]:
        """``writes`` after the step's writes still waiting (its decision, finished calls' results),
        all under the fencing token of ``writes`` (or ``token`` when there are none)."""
        self._raise_if_failed()
        if self._unwritten:
            with self._unwritten_lock:
                unwritten, self._unwritten = self._unwritten, []
            fence = writes[-1].lease_token if writes else token
            waiting = [w if w.lease_token == fence else replace(w, lease_token=fence) for w in unwritten]
            writes = [*waiting, *writes]
        return writes

    # ---- boundaries

    def commit(self, boundary: BoundaryCommit) -> None:
        ready = self._accept(boundary)
        if ready:
            self._commit_now(ready)

    async def acommit(self, boundary: BoundaryCommit) -> None:
        ready = self._accept(boundary)
        if ready:
            await self._acommit_now(ready)

    def _accept(self, boundary: BoundaryCommit) -> list[BoundaryCommit]:
        """Take a boundary in; the boundaries to commit now (empty while a batch fills)."""
        self._raise_if_failed()
        # The boundary holds the step's outcome, or its decision as pending if no tool ran yet; a
        # step that ran a non-idempotent call commits at once even in batched mode, since its
        # last result is only in this boundary.
        self._unwritten = []
        ran_side_effects = bool(self._started_ids)
        self._started_ids = set()
        self._consumed = max(self._consumed, boundary.control_position)
        self._pause_handled = max(self._pause_handled, boundary.pause_position)
        log = boundary.log
        if log is not None and boundary.log_position is None:
            boundary.log_position, boundary.log_digest = log.position, log.digest
        if self.mode == "sync":
            return [boundary]
        self._buffer.append(boundary)
        elapsed_ms = (time.monotonic() - self._buffer_since) * 1000.0
        if (
            boundary.lifecycle != "running"
            or boundary.pending is not None
            or ran_side_effects
            or len(self._buffer) >= self.batch_steps
            or elapsed_ms >= self.batch_ms
        ):
            return self._take_buffer()
        return []

    def close(self) -> None:
        self._flush()

    async def aclose(self) -> None:
        await self._aflush()

    def drain_committed(self) -> list[Any]:
        committed, self._committed = self._committed, []
        return committed

    def _flush_inside_step(self) -> None:
        """Write buffered boundaries from within a step (before its decision is recorded).

        The step has already changed the live state, so the flush writes deltas only (each
        boundary carries its own changes), never a base made from the state as it is now.
        """
        buffered = self._take_buffer()
        if buffered:
            self._commit_now(buffered, base_allowed=False)

    async def _aflush_inside_step(self) -> None:
        """Async twin of :meth:`_flush_inside_step`."""
        buffered = self._take_buffer()
        if buffered:
            await self._acommit_now(buffered, base_allowed=False)

    @property
    def head_id(self) -> str:
        """The session's latest committed snapshot (as this journal last moved it)."""
        return self._head_id

    @property
    def unflushed(self) -> int:
        """Boundaries buffered in batched mode and not yet durable."""
        return len(self._buffer)

    def _flush(self) -> None:
        buffered = self._take_buffer()
        if buffered:
            self._commit_now(buffered)

    async def _aflush(self) -> None:
        buffered = self._take_buffer()
        if buffered:
            await self._acommit_now(buffered)

    def _take_buffer(self) -> list[BoundaryCommit]:
        buffered, self._buffer = self._buffer, []
        self._buffer_since = time.monotonic()
        return buffered

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _commit_now(self, boundaries: list[BoundaryCommit], *, base_allowed: bool = True) -> None:
        prepared = self._prepare_commit(boundaries, self._token(), base_allowed=base_allowed)
        try:
            receipt = self.store.commit_session_snapshot(prepared.request)
        except CheckpointError as exc:
            self._failure = exc
            raise
        self._committed_now(prepared, receipt.control_seq)

    async def _acommit_now(self, boundaries: list[BoundaryCommit], *, base_allowed: bool = True) -> None:
        prepared = self._prepare_commit(boundaries, await self._atoken(), base_allowed=base_allowed)
        try:
            receipt = await self.store.acommit_session_snapshot(prepared.request)
        except CheckpointError as exc:
            self._failure = exc
            raise
        self._committed_now(prepared, receipt.control_seq)

    def _prepare_commit(
        self, boundaries: list[BoundaryCommit], token: int | None, *, base_allowed: bool = True
    ) -> _PreparedCommit:
        """Build the snapshot commit for ``boundaries`` (no I/O; shared by the sync and async paths)."""
        last = boundaries[-1]
        delta: list[dict[str, Any]] = []
        for boundary in boundaries:
            delta.extend(boundary.state_changes)
        note_reshaped(self._reshaped, delta)
        blobs: dict[str, bytes] = {}
        # Only what changed is written; unchanged log and request-view references are inherited
        # from earlier snapshots of the chain (see materialize).
        # Fields that rarely change are written only when they do: the run id on a run's first
        # snapshot, the lifecycle when it is not "running" (materialize carries them forward).
        used = last.budget_used
        log: ExchangeLog | None = last.log
        position = self._log_position if last.log_position is None else last.log_position
        chunk: str | None = None
        if log is not None and position > self._log_position:
            raw = pack_or_raw(log.entries_json(self._log_position, position).encode("utf-8"))
            chunk = sha256_hex(raw)
            blobs[chunk] = raw
        log_id = log.log_id if log is not None else f"log-{self.session_id}"
        log_digest = last.log_digest if last.log_digest is not None else _EMPTY_LOG_DIGEST
        view_id: str | None = None
        view = last.request_view
        if view is not None and view is not self._request_view_obj:
            raw_view = pack_or_raw(canonical_json(self._clean(view_record(view, log))).encode("utf-8"))
            view_id = sha256_hex(raw_view)
            blobs[view_id] = raw_view
            self._request_view_id, self._request_view_obj = view_id, view
        full = (
            base_allowed
            and self._delta_bytes > _FULL_FACTOR * self._state_bytes
            and (self._delta_bytes >= _MIN_BASE_DELTA_BYTES or self._deltas >= _MAX_CHAIN_DELTAS)
        )
        chunks: dict[str, list[ChunkRef]] = {}
        state_full: dict[str, Any] | None = None
        if full:  # a new base: the whole state, every log blob, the run and the latest request view
            state_full, chunks = self._full_state(last, blobs)
            log_chunks = (*self._log_chunks, chunk) if chunk else tuple(self._log_chunks)
            log_mark: LogMark | None = LogMark(log_id=log_id, position=position, digest=log_digest, chunks=log_chunks)
            view_id, base_id, first_of_run = self._request_view_id, None, True
        else:
            log_mark = (
                None if chunk is None else LogMark(log_id=log_id, position=position, digest=log_digest, chunk=chunk)
            )
            base_id, first_of_run = self._base_id, not self._run_recorded
        payload = SnapshotPayload(
            step_id=last.step_id,
            budget_used={"tokens": used.get("tokens", 0), "elapsed_seconds": used.get("elapsed_seconds", 0.0)},
            control_position=self._consumed,
            pause_position=self._pause_handled,
            lifecycle=None if last.lifecycle == "running" else last.lifecycle,
            stop_reason=last.stop_reason,
            run_id=self.run_id if first_of_run else None,
            trace=self.trace_context if first_of_run else None,
            state_full=state_full,
            state_chunks={name: tuple(refs) for name, refs in chunks.items()},
            state_delta=() if full else self._clean(delta),
            log=log_mark,
            request_view=view_id,
            pending=self._clean_pending(last.pending),
            steps=self._step_summary(boundaries),
            format=FORMAT if full else None,
        )
        snapshot = SessionSnapshot.create(
            session_id=self.session_id,
            parent_id=self._head_id,
            base_id=base_id,
            sequence=self._sequence + 1,
            payload=payload.to_json(),
            trusted=True,
        )
        commit = SessionSnapshotCommit(
            session_id=self.session_id,
            expected_head=self._head_id,
            snapshot=snapshot,
            lifecycle=last.lifecycle,
            blobs=blobs,
            lease_token=token,
        )
        return _PreparedCommit(commit, boundaries, full, chunks, chunk, position)

    def _committed_now(self, prepared: _PreparedCommit, control_seq: int | None) -> None:
        """Move the journal past a commit the store accepted (which saw control counter ``control_seq``)."""
        if control_seq is not None:
            # The commit told us the newest control position: poll at the next check only if it is
            # one this journal has not fetched; otherwise nothing new arrived up to now.
            self._last_poll = _POLL_NOW if control_seq > self._fetched else time.monotonic()
        snapshot, full, chunks, chunk, position = (
            prepared.request.snapshot,
            prepared.full,
            prepared.chunks,
            prepared.chunk,
            prepared.log_position,
        )
        boundaries = prepared.boundaries
        self._head_id = snapshot.snapshot_id
        self._sequence = snapshot.sequence
        self._run_recorded = True
        written = snapshot.payload_size
        if full:
            self._base_id = snapshot.snapshot_id
            self._state_bytes = written
            self._delta_bytes = self._deltas = 0
            self._chunks, self._reshaped = chunks, set()
        else:
            self._delta_bytes += written
            self._deltas += 1
        self._committed.extend(b.record for b in boundaries if b.record is not None)
        if chunk:
            self._log_chunks.append(chunk)
        self._log_position = position
        self.commits += 1

    def _step_summary(self, boundaries: list[BoundaryCommit]) -> tuple[StepSummary, ...]:
        """What the boundaries' steps did, each with its model call (as its decision write stored it)."""
        steps = []
        for boundary in boundaries:
            record = boundary.record
            if record is None:
                continue
            model = self._models.pop(record.step_id, None)
            steps.append(
                StepSummary(
                    step_id=record.step_id,
                    mode=record.decision.mode,
                    calls=tuple(
                        CallSummary(call_id=r.call_id, tool=r.name, ok=r.ok, error_kind=r.error_kind)
                        for r in record.observation.results
                    ),
                    model=model,
                )
            )
        return tuple(steps)

    def _full_state(
        self, last: BoundaryCommit, blobs: dict[str, bytes]
    ) -> tuple[dict[str, Any], dict[str, list[ChunkRef]]]:
        """The base's state: its inline fields and its long list fields cut into runs (added to ``blobs``).

        A list that only grew by appends since the last base keeps that base's closed runs and
        only its new items are encoded: a base costs what is new, not the whole state.
        """
        state = last.state
        inline: dict[str, Any] = {}
        chunks: dict[str, list[ChunkRef]] = {}
        for name, hint in field_hints(type(state)).items():
            value = getattr(state, name)
            path = f"state.{name}"
            kept: list[ChunkRef] = []
            if isinstance(value, list) and name not in self._reshaped:
                kept = reusable_runs(self._chunks.get(name), len(value))
            start = sum(ref.count for ref in kept)
            encoded = self._clean(encode_value(value[start:] if start else value, hint, path))
            cut = chunk_list(encoded, kept) if type(encoded) is list else None
            if cut is None:
                inline[name] = encoded
            else:
                chunks[name], new_blobs = cut
                blobs.update(new_blobs)
        return inline, chunks


@dataclass(frozen=True)
class _PreparedCommit:
    """A snapshot commit built by ``_prepare_commit`` and what the journal needs once it is stored."""

    request: SessionSnapshotCommit
    boundaries: list[BoundaryCommit]
    full: bool
    chunks: dict[str, list[ChunkRef]]
    chunk: str | None
    log_position: int


def _worth_writing(pending: PendingStep) -> bool:
    """False for a decision with no model and no tool call: re-deciding it is free and has no effects."""
    return bool(pending.decision.get("actions")) or pending.model is not None
