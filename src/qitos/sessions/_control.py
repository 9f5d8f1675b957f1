"""Durable control of a session from the store alone: pause, steer, approve, reject.

Each is one appended control item (the store assigns its position); the running loop takes it in
at its next boundary, in any process. Where it concerns a delegated child session in progress it
goes there (see ``pause_session``, ``steer_session``, ``answer_approval``). Nothing here needs
the agent's code, so the ``Session`` facade, ``qitos sessions steer/pause/approve/reject`` and the
viewer share these functions, with async twins built on the same validation. Text is redacted before it is stored
(``qitos.core._redaction``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from qitos.checkpoint._records import ControlItem, SessionHeadRecord, SessionSnapshot, utc_now
from qitos.checkpoint.store import CheckpointStore
from qitos.core._codec import sha256_hex
from qitos.core._errors import ConfigurationError
from qitos.core._redaction import Redactor
from qitos.sessions._children import active_children, pending_of
from qitos.sessions._inspection import SessionInspection, inspect_session
from qitos.sessions._payload import SnapshotPayload

__all__ = [
    "ApprovalReceipt",
    "PauseReceipt",
    "SteeringReceipt",
    "aanswer_approval",
    "acontinuation",
    "acontinuation_position",
    "answer_approval",
    "apause_session",
    "asteer_session",
    "continuation",
    "continuation_position",
    "delegation_root",
    "pause_session",
    "steer_session",
]

# What continues a waiting session: an answer for one awaiting approval, steering for a paused one.
_CONTINUED_BY = {"awaiting_approval": ("approve", "reject"), "paused": ("steer",)}


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


_PLAIN = Redactor()


def pause_session(store: CheckpointStore, session_id: str) -> PauseReceipt:
    """Request a cooperative pause of ``session_id``.

    The request goes to the delegated child sessions in progress too (and theirs), so the child
    doing the work stops at its next boundary and the parent with it; the receipt is ``session_id``'s.
    """
    receipt = _pause_receipt(store.append_control(session_id, "pause", {"requested_at": utc_now()}))
    for _, child_id in active_children(store, session_id, pending_of(store, session_id)):
        pause_session(store, child_id)
    return receipt


async def apause_session(store: CheckpointStore, session_id: str) -> PauseReceipt:
    """Async twin of :func:`pause_session`."""
    receipt = _pause_receipt(await store.aappend_control(session_id, "pause", {"requested_at": utc_now()}))
    for _, child_id in await asyncio.to_thread(_children_now, store, session_id):
        await apause_session(store, child_id)
    return receipt


def _children_now(store: CheckpointStore, session_id: str) -> list[tuple[str, str]]:
    return active_children(store, session_id, pending_of(store, session_id))


def _working_session(store: CheckpointStore, session_id: str) -> str:
    """The session doing the work: the innermost delegated child in progress, else ``session_id``."""
    seen = {session_id}
    while True:
        children = _children_now(store, session_id)
        if not children or children[0][1] in seen:
            return session_id
        session_id = children[0][1]
        seen.add(session_id)


def steer_session(
    store: CheckpointStore, session_id: str, text: str, *, redactor: Redactor = _PLAIN
) -> SteeringReceipt:
    """Durably submit one steering text to ``session_id`` (redacted before it is stored).

    While a delegated call is in progress the text goes to the agent doing the work: the innermost
    active child session, whose next boundary takes it in; the receipt names that session.
    """
    payload = _steering_payload(text, redactor)
    target = _working_session(store, session_id)
    return _steering_receipt(store.append_control(target, "steer", payload), text)


async def asteer_session(
    store: CheckpointStore, session_id: str, text: str, *, redactor: Redactor = _PLAIN
) -> SteeringReceipt:
    """Async twin of :func:`steer_session`."""
    payload = _steering_payload(text, redactor)
    target = await asyncio.to_thread(_working_session, store, session_id)
    return _steering_receipt(await store.aappend_control(target, "steer", payload), text)


def answer_approval(
    store: CheckpointStore,
    session_id: str,
    call_id: str,
    *,
    approved: bool,
    reason: str | None = None,
    redactor: Redactor = _PLAIN,
    inspection: SessionInspection | None = None,
) -> ApprovalReceipt:
    """Approve or reject a call ``session_id`` waits for (else ConfigurationError naming what it waits for)."""
    target = _check_awaiting(inspection or inspect_session(store, session_id), session_id, call_id)
    kind, payload = _answer_payload(call_id, approved, reason, redactor)
    return _approval_receipt(store.append_control(target, kind, payload), call_id, approved, reason)


async def aanswer_approval(
    store: CheckpointStore,
    session_id: str,
    call_id: str,
    *,
    approved: bool,
    reason: str | None = None,
    redactor: Redactor = _PLAIN,
    inspection: SessionInspection,
) -> ApprovalReceipt:
    """Async twin of :func:`answer_approval` (the caller passes the inspection it awaited)."""
    target = _check_awaiting(inspection, session_id, call_id)
    kind, payload = _answer_payload(call_id, approved, reason, redactor)
    return _approval_receipt(await store.aappend_control(target, kind, payload), call_id, approved, reason)


def continuation_position(
    store: CheckpointStore, session_id: str, *, head: SessionHeadRecord | None = None
) -> int | None:
    """The position of the control item that continues ``session_id`` where it waits, or None.

    A session awaiting approval is continued by an answer it has not taken in yet, a paused one by
    steering it has not taken in (as ``Fleet.steer`` continues it); a session that is running,
    has ended, or waits with nothing new is not. Read from the store alone (``head``: the session's
    head, when the caller has just read it).
    """
    head = head if head is not None else store.get_session_head(session_id)
    kinds = _CONTINUED_BY.get(head.lifecycle) if head is not None else None
    if head is None or kinds is None:
        return None
    taken_in = _taken_in(store.get_snapshot(head.snapshot_id))
    items = store.list_control(session_id, after=taken_in, kinds=kinds)
    return items[-1].position if items else None


def continuation(
    store: CheckpointStore, session_id: str, *, head: SessionHeadRecord | None = None
) -> tuple[str, int] | None:
    """``(the session answered, the position)`` of the control item that continues ``session_id``'s
    run where it waits, or None.

    That is ``session_id``'s own :func:`continuation_position`, or, while it waits on delegated child
    sessions in progress (their runs go on in its run), the first of theirs found, children before
    grandchildren: an answer to a waiting child continues its parent's run.
    """
    head = head if head is not None else store.get_session_head(session_id)
    position = continuation_position(store, session_id, head=head)
    if position is not None:
        return session_id, position
    return _child_continuation(store, session_id, head)


async def acontinuation(store: CheckpointStore, session_id: str) -> tuple[str, int] | None:
    """Async twin of :func:`continuation` (the delegated children are looked at in a thread)."""
    head = await store.aget_session_head(session_id)
    position = await acontinuation_position(store, session_id, head=head)
    if position is not None:
        return session_id, position
    return await asyncio.to_thread(_child_continuation, store, session_id, head)


def _child_continuation(
    store: CheckpointStore, session_id: str, head: SessionHeadRecord | None
) -> tuple[str, int] | None:
    """The continuation of a delegated child in progress below ``session_id`` (whose head is
    ``head``) while it waits, or None."""
    if head is None or head.lifecycle not in _CONTINUED_BY:
        return None
    seen, waiting = {session_id}, [session_id]
    while waiting:
        parent = waiting.pop(0)
        for _, child_id in _children_now(store, parent):
            if child_id in seen:
                continue
            seen.add(child_id)
            position = continuation_position(store, child_id)
            if position is not None:
                return child_id, position
            waiting.append(child_id)
    return None


def delegation_root(store: CheckpointStore, session_id: str) -> str:
    """The session a runner runs to continue ``session_id``: the top of its delegation chain.

    A delegated child session is run by its parent's run (``qitos.engine._delegation``), so an answer
    given to a waiting child continues the parent (and the parent's parent, up to the top).
    """
    seen = {session_id}
    current = session_id
    while True:
        head = store.get_session_head(current)
        link: Any = (head.metadata or {}).get("delegated_from") if head is not None else None
        parent = link.get("session_id") if isinstance(link, dict) else None
        if not isinstance(parent, str) or parent in seen:
            return current
        seen.add(parent)
        current = parent


async def acontinuation_position(
    store: CheckpointStore, session_id: str, *, head: SessionHeadRecord | None = None
) -> int | None:
    """Async twin of :func:`continuation_position`."""
    head = head if head is not None else await store.aget_session_head(session_id)
    kinds = _CONTINUED_BY.get(head.lifecycle) if head is not None else None
    if head is None or kinds is None:
        return None
    taken_in = _taken_in(await store.aget_snapshot(head.snapshot_id))
    items = await store.alist_control(session_id, after=taken_in, kinds=kinds)
    return items[-1].position if items else None


# --------------------------------------------------------------------------- shared, I/O-free


def _taken_in(snapshot: SessionSnapshot) -> int:
    """The control position a committed snapshot had taken in (every payload records it)."""
    return SnapshotPayload.of(snapshot).control_position


def _steering_payload(text: str, redactor: Redactor) -> dict[str, Any]:
    if not isinstance(text, str) or not text.strip():
        raise ConfigurationError("steering text must be a non-empty string")
    return {"text": redactor.redact_value(text)}


def _check_awaiting(inspection: SessionInspection, session_id: str, call_id: str) -> str:
    """The session owning the awaited call ``call_id``: ``session_id``, or the delegated child that waits."""
    batch = inspection.tool_batch
    waiting = {c.call_id: c.session_id for c in batch.pending_approval} if batch else {}
    if call_id not in waiting:
        raise ConfigurationError(
            f"session {session_id}: no tool call {call_id!r} is awaiting approval "
            f"(awaiting: {sorted(waiting) or 'none'})"
        )
    return waiting[call_id] or session_id


def _answer_payload(call_id: str, approved: bool, reason: str | None, redactor: Redactor) -> tuple[str, Any]:
    return ("approve" if approved else "reject"), redactor.redact_value({"call_id": call_id, "reason": reason})


def _pause_receipt(item: ControlItem) -> PauseReceipt:
    return PauseReceipt(session_id=item.session_id, position=item.position, requested_at=item.created_at)


def _steering_receipt(item: ControlItem, text: str) -> SteeringReceipt:
    return SteeringReceipt(
        session_id=item.session_id, position=item.position, text_digest=sha256_hex(text), submitted_at=item.created_at
    )


def _approval_receipt(item: ControlItem, call_id: str, approved: bool, reason: str | None) -> ApprovalReceipt:
    return ApprovalReceipt(
        session_id=item.session_id, call_id=call_id, approved=approved, position=item.position, reason=reason
    )
