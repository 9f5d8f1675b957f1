"""The inspection read model: what a session is and what it waits for, from the store alone.

Everything here reads the checkpoint store and nothing else: no agent class is imported, no user
code runs. ``Session.inspect()`` adds what only a live runtime knows (the engine's budget limits, a
batched journal's unflushed boundaries); ``qitos sessions show``, the viewer and the async twins
use the same read model, so a session made by a script that no longer exists can still be shown,
steered, paused and approved.

What a pending call needs is recorded with the step (``PendingStep.approval_calls``). Steps stored
by versions that did not record it are read by the rule those versions followed: a session
awaiting approval stopped before the first call of its step that has neither started nor finished.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from qitos.checkpoint._memory_store import InMemoryCheckpointStore
from qitos.checkpoint._packing import unpack
from qitos.checkpoint._records import SessionHeadRecord, SessionSnapshot
from qitos.checkpoint.store import CheckpointStore
from qitos.core._errors import CheckpointError, IntegrityError, SessionNotFoundError
from qitos.core._task import Task
from qitos.core.request_view import RequestView
from qitos.sessions._children import active_children, delegated_child, pending_of
from qitos.sessions._journal import PendingStep
from qitos.sessions._lease import holder_is_dead
from qitos.sessions._payload import SnapshotPayload
from qitos.sessions._step_journal import APPROVAL_KINDS, RestoredSession, restore
from qitos.sessions._stored_view import view_from_record

__all__ = [
    "SessionHead",
    "SessionInspection",
    "SessionLifecycle",
    "ToolBatchSnapshot",
    "ToolCallStatus",
    "inspect_session",
    "observed_lifecycle",
    "session_capabilities",
    "tool_batch",
    "work_graph",
]


class SessionLifecycle(StrEnum):
    """Where a session stands.

    A head records one of these at each committed boundary, except ``INTERRUPTED``, which only a
    reader derives (:func:`observed_lifecycle`): a run started and its runner is gone (killed,
    crashed) before it committed its end; the next run continues it.
    """

    CREATED = "created"
    RUNNING = "running"
    PAUSED = "paused"
    AWAITING_APPROVAL = "awaiting_approval"
    COMPLETED = "completed"
    STOPPED = "stopped"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


_ENDED = frozenset({SessionLifecycle.COMPLETED, SessionLifecycle.STOPPED, SessionLifecycle.FAILED})


def observed_lifecycle(store: CheckpointStore, head: SessionHeadRecord) -> str:
    """Where ``head``'s session stands now, read from the store alone.

    A head's lifecycle changes only at committed boundaries, so while a step runs it still says
    what the last boundary said (``created`` before the first step commits). A session whose lease
    a live runner holds is ``running``; one whose head says ``running``, or that has pending writes
    on top of its head (a step started and never committed), with no live holder is
    ``interrupted``: its runner died (kill -9, a crash). Ended sessions are what their head says.
    """
    if head.lifecycle in _ENDED:
        return head.lifecycle
    lease = store.get_lease(head.session_id)
    if lease is not None and lease.expires_at > time.time() and not holder_is_dead(lease.owner):
        return SessionLifecycle.RUNNING.value
    if head.lifecycle == SessionLifecycle.RUNNING:
        return SessionLifecycle.INTERRUPTED.value
    try:
        started = bool(store.get_writes(head.session_id, head.snapshot_id))
    except CheckpointError:  # damage: inspection reports it; a listing still shows the head
        return head.lifecycle
    return SessionLifecycle.INTERRUPTED.value if started else head.lifecycle


@dataclass(frozen=True, kw_only=True)
class SessionHead:
    """A session's durable head: its latest snapshot."""

    session_id: str
    snapshot_id: str
    sequence: int
    lifecycle: str
    updated_at: str


@dataclass(frozen=True, kw_only=True)
class ToolCallStatus:
    """One call of an in-flight tool batch."""

    call_id: str
    tool: str
    args: Mapping[str, Any]
    status: str  # awaiting_approval | approved | rejected | started | completed | failed | not_started
    needs_approval: bool = False
    error: str | None = None
    session_id: str | None = None  # a call of a delegated child session: the child's id (approvals go there)


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


def session_capabilities(store: CheckpointStore) -> frozenset[str]:
    """What a session supports with ``store`` (``cross_process_restore`` for a store that outlives the process)."""
    caps = {"run", "pause", "steer", "fork", "inspect", "approve"}
    if not isinstance(store, InMemoryCheckpointStore):
        caps.add("cross_process_restore")
    return frozenset(caps)


def inspect_session(
    store: CheckpointStore,
    session_id: str,
    *,
    limits: Mapping[str, Any] | None = None,
    durability: Mapping[str, Any] | None = None,
) -> SessionInspection:
    """Read ``session_id``'s durable head and everything a restore would trust, verified.

    Damage in any verified row (snapshots, blobs, pending writes, control items) is reported in
    ``snapshot_integrity`` rather than raised; a damaged head or metadata row raises IntegrityError
    (there is nothing to report it on). ``limits`` overrides budget limits the store cannot know
    (an engine's ``RuntimeBudget``); ``durability`` is a live journal's mode and lag.
    """
    record = _require_head(store, session_id)
    task = Task.from_dict(record.metadata.get("task") or {"objective": ""})
    restored: RestoredSession | None = None
    try:
        restored = restore(store, session_id, record.snapshot_id)
        store.list_control(session_id)  # control items are verified too (digests, none missing)
        integrity = "verified"
    except IntegrityError as exc:
        integrity = f"corrupt: {exc}"
        restored = None
    used: dict[str, Any] = restored.budget_used if restored else {}
    used["steps"] = restored.payload.step_id if restored else 0
    used["control_position"] = restored.control_position if restored else 0
    budget: dict[str, Any] = {"used": used}
    if restored is not None:
        budget["limits"] = {
            "max_steps": restored.state_data.get("max_steps"),
            "max_runtime_seconds": task.budget.max_runtime_seconds,
            "max_tokens": task.budget.max_tokens,
            **{k: v for k, v in (limits or {}).items() if v is not None},
        }
    budget["durability"] = dict(durability or {"mode": "sync", "unflushed_boundaries": 0})
    _lifecycle(record)  # a stored lifecycle this version does not know is damage
    lifecycle = SessionLifecycle(observed_lifecycle(store, record))
    return SessionInspection(
        head=SessionHead(
            session_id=session_id,
            snapshot_id=record.snapshot_id,
            sequence=record.sequence,
            lifecycle=record.lifecycle,
            updated_at=record.updated_at,
        ),
        lifecycle=lifecycle,
        capabilities=tuple(sorted(session_capabilities(store))),
        snapshot_integrity=integrity,
        budget=budget,
        work_graph=work_graph(store, session_id) if restored else None,
        last_request_view=_request_view(store, restored) if restored else None,
        task=task.objective,
        tool_batch=tool_batch(store, session_id, restored.pending, record.lifecycle) if restored else None,
    )


def tool_batch(
    store: CheckpointStore, session_id: str, pending: PendingStep | None, lifecycle: str
) -> ToolBatchSnapshot | None:
    """The unfinished step's calls and where each stands, or None when no step is unfinished.

    The calls of delegated child sessions still in progress follow (recursively), each with its
    child's ``session_id``: a child's approval wait is visible, and answerable, through the parent.
    """
    if pending is None:
        return None
    approvals = {str(i.payload.get("call_id")): i for i in store.list_control(session_id, kinds=APPROVAL_KINDS)}
    actions: Iterable[Mapping[str, Any]] = pending.decision.get("actions") or []
    needing = set(pending.approval_calls) or _legacy_awaited(pending, actions, lifecycle)
    calls = []
    for action in actions:
        call_id = action["id"]
        needs = call_id in needing
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
    for _, child_id in active_children(store, session_id, pending):
        child_head = store.get_session_head(child_id)
        child_batch = tool_batch(
            store, child_id, pending_of(store, child_id), child_head.lifecycle if child_head else ""
        )
        for call in child_batch.calls if child_batch is not None else ():
            calls.append(replace(call, session_id=call.session_id or child_id))
    return ToolBatchSnapshot(step_id=pending.step_id, calls=tuple(calls))


def work_graph(store: CheckpointStore, session_id: str, limit: int = 500, depth: int = 4) -> dict[str, Any]:
    """The session's work items (steps and their tool calls) with every attempt and outcome.

    A delegated call carries its child session's id and graph (``child_session_id``, ``child``
    with the child's ``lifecycle``, down to ``depth`` levels): the tree of work reads from the root.
    """
    steps: dict[int, dict[str, Any]] = {}
    run_id: str | None = None
    for snap in _newest_snapshots(store, session_id, limit):
        snapshot_id = snap.snapshot_id
        payload = SnapshotPayload.of(snap)
        run_id = payload.run_id or run_id  # written on a run's first snapshot only
        for step in payload.steps:
            item = steps.setdefault(step.step_id, _step_item(step.step_id))
            item["attempts"].append({"run_id": run_id, "snapshot_id": snapshot_id, "outcome": "committed"})
            item["mode"] = step.mode
            item["tool_calls"] = [
                {"work_item": c.call_id, "tool": c.tool, "outcome": "ok" if c.ok else (c.error_kind or "error")}
                for c in step.calls
            ]
        pending = payload.pending
        if pending is not None:
            item = steps.setdefault(pending.step_id, _step_item(pending.step_id))
            item["attempts"].append({"run_id": run_id, "snapshot_id": snapshot_id, "outcome": payload.lifecycle})
            if not item["tool_calls"]:
                item["tool_calls"] = [
                    {"work_item": a["id"], "tool": a["name"], "outcome": "pending"}
                    for a in pending.decision.get("actions") or []
                ]
    children = _delegated_children(store, session_id) if any(i["tool_calls"] for i in steps.values()) else {}
    for item in steps.values():
        for call in item["tool_calls"]:
            child = children.get(str(call["work_item"]))
            if child is None:
                continue
            call["child_session_id"] = child.session_id
            if depth > 0:
                call["child"] = {
                    **work_graph(store, child.session_id, limit, depth - 1),
                    "lifecycle": child.lifecycle,
                }
    return {"session_id": session_id, "steps": [steps[k] for k in sorted(steps)]}


def _delegated_children(store: CheckpointStore, session_id: str) -> dict[str, SessionHeadRecord]:
    """The sessions delegated by ``session_id``'s calls, by call id (one listing, not a read per call)."""
    out: dict[str, SessionHeadRecord] = {}
    for head in store.list_sessions():
        link = (head.metadata or {}).get("delegated_from")
        if isinstance(link, Mapping) and link.get("session_id") == session_id:
            call_id = str(link.get("call_id"))
            if delegated_child(store, session_id, call_id) is not None:  # the id it derives, as a restore finds it
                out[call_id] = head
    return out


def _newest_snapshots(store: CheckpointStore, session_id: str, limit: int) -> list[SessionSnapshot]:
    """The session's newest ``limit`` snapshots (within the session), oldest first.

    Read a chain segment at a time (``load_chain``: a snapshot back to its base, one query) rather
    than a snapshot at a time: on a networked store that is a few round trips, not hundreds. A
    damaged segment ends the walk; what was read before it is kept.
    """
    head = store.get_session_head(session_id)
    newest_first: list[SessionSnapshot] = []
    current = head.snapshot_id if head is not None else None
    while current is not None and len(newest_first) < limit:
        try:
            chain = store.load_chain(current)
        except CheckpointError:
            break
        for snap in reversed(chain):
            if snap.session_id != session_id or len(newest_first) >= limit:
                return newest_first[::-1]
            newest_first.append(snap)
        current = chain[0].parent_id
    return newest_first[::-1]


def _step_item(step_id: int) -> dict[str, Any]:
    return {"work_item": f"step-{step_id}", "kind": "step", "attempts": [], "tool_calls": []}


def _legacy_awaited(pending: PendingStep, actions: Iterable[Mapping[str, Any]], lifecycle: str) -> set[str]:
    """For a step stored without ``approval_calls``: the call an approval wait stopped before."""
    if lifecycle != SessionLifecycle.AWAITING_APPROVAL:
        return set()
    for action in actions:
        if action["id"] not in pending.results and action["id"] not in pending.started:
            return {action["id"]}
    return set()


def _lifecycle(record: SessionHeadRecord) -> SessionLifecycle:
    try:
        return SessionLifecycle(record.lifecycle)
    except ValueError as exc:  # a verified head with a lifecycle this version does not know
        raise IntegrityError(
            "heads", record.session_id, f"unknown lifecycle {record.lifecycle!r}", session_id=record.session_id
        ) from exc


def _request_view(store: CheckpointStore, restored: RestoredSession) -> RequestView | None:
    view_id = restored.request_view
    if not view_id:
        return None
    raw = store.get_blobs([view_id]).get(view_id)
    return None if raw is None else view_from_record(json.loads(unpack(raw)), restored.log)


def _require_head(store: CheckpointStore, session_id: str) -> SessionHeadRecord:
    head = store.get_session_head(session_id)
    if head is None:
        raise SessionNotFoundError(session_id)
    return head
