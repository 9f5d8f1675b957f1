"""Durable control of a session from the store alone: pause, steer, approve, reject.

Each is one appended control item (the store assigns its position); the running loop takes it in
at its next boundary, in any process. Nothing here needs the agent's code, so the ``Session``
facade, ``qitos sessions steer/pause/approve/reject`` and the viewer share these functions, with
async twins built on the same validation. Text is redacted before it is stored
(``qitos.core.redaction``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qitos.checkpoint.store import CheckpointStore, ControlItem, utc_now
from qitos.core.codec import sha256_hex
from qitos.core.errors import ConfigurationError
from qitos.core.redaction import Redactor
from qitos.sessions.inspection import SessionInspection, inspect_session

__all__ = [
    "ApprovalReceipt",
    "PauseReceipt",
    "SteeringReceipt",
    "aanswer_approval",
    "answer_approval",
    "apause_session",
    "asteer_session",
    "pause_session",
    "steer_session",
]


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
    """Request a cooperative pause of ``session_id``."""
    return _pause_receipt(store.append_control(session_id, "pause", {"requested_at": utc_now()}))


async def apause_session(store: CheckpointStore, session_id: str) -> PauseReceipt:
    """Async twin of :func:`pause_session`."""
    return _pause_receipt(await store.aappend_control(session_id, "pause", {"requested_at": utc_now()}))


def steer_session(
    store: CheckpointStore, session_id: str, text: str, *, redactor: Redactor = _PLAIN
) -> SteeringReceipt:
    """Durably submit one steering text to ``session_id`` (redacted before it is stored)."""
    payload = _steering_payload(text, redactor)
    return _steering_receipt(store.append_control(session_id, "steer", payload), text)


async def asteer_session(
    store: CheckpointStore, session_id: str, text: str, *, redactor: Redactor = _PLAIN
) -> SteeringReceipt:
    """Async twin of :func:`steer_session`."""
    payload = _steering_payload(text, redactor)
    return _steering_receipt(await store.aappend_control(session_id, "steer", payload), text)


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
    _check_awaiting(inspection or inspect_session(store, session_id), session_id, call_id)
    kind, payload = _answer_payload(call_id, approved, reason, redactor)
    return _approval_receipt(store.append_control(session_id, kind, payload), call_id, approved, reason)


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
    _check_awaiting(inspection, session_id, call_id)
    kind, payload = _answer_payload(call_id, approved, reason, redactor)
    return _approval_receipt(await store.aappend_control(session_id, kind, payload), call_id, approved, reason)


# --------------------------------------------------------------------------- shared, I/O-free


def _steering_payload(text: str, redactor: Redactor) -> dict[str, Any]:
    if not isinstance(text, str) or not text.strip():
        raise ConfigurationError("steering text must be a non-empty string")
    return {"text": redactor.redact_value(text)}


def _check_awaiting(inspection: SessionInspection, session_id: str, call_id: str) -> None:
    batch = inspection.tool_batch
    waiting = {c.call_id for c in batch.pending_approval} if batch else set()
    if call_id not in waiting:
        raise ConfigurationError(
            f"session {session_id}: no tool call {call_id!r} is awaiting approval "
            f"(awaiting: {sorted(waiting) or 'none'})"
        )


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
