"""Delegated child sessions, found from the store alone.

A delegated call (``qitos.engine._delegation``) runs a child session whose id is derived from the
parent session and the call id (:func:`child_session_id`), and whose metadata names the parent
(``delegated_from``). So inspection, control and the viewer find a session's children without its
agent's code: a call of the pending step that started, has no result, and has a derived child
that names this session as its parent, is an *active* delegated call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from qitos.checkpoint._records import SessionHeadRecord
from qitos.checkpoint.store import CheckpointStore
from qitos.core._codec import sha256_hex
from qitos.sessions._journal import PendingStep
from qitos.sessions._step_journal import restore

__all__ = ["active_children", "child_session_id", "delegated_child", "pending_of"]


def child_session_id(parent_session_id: str, call_id: str) -> str:
    """The session id of the child a delegated call runs: derived from the parent session and the
    call id, so a restore of the parent finds the same child (and never starts a second one)."""
    return f"ses_{sha256_hex(f'delegate:{parent_session_id}:{call_id}')[:24]}"


def delegated_child(store: CheckpointStore, session_id: str, call_id: str) -> SessionHeadRecord | None:
    """The head of the child session delegated by ``call_id`` of ``session_id``, or None."""
    head = store.get_session_head(child_session_id(session_id, call_id))
    if head is None:
        return None
    link: Any = (head.metadata or {}).get("delegated_from")
    if not isinstance(link, Mapping) or link.get("session_id") != session_id or link.get("call_id") != call_id:
        return None
    return head


def active_children(store: CheckpointStore, session_id: str, pending: PendingStep | None) -> list[tuple[str, str]]:
    """``(call_id, child session id)`` of the pending step's delegated calls still in progress."""
    if pending is None:
        return []
    out = []
    for action in pending.decision.get("actions") or []:
        call_id = str(action["id"])
        if call_id not in pending.started or call_id in pending.results:
            continue
        head = delegated_child(store, session_id, call_id)
        if head is not None:
            out.append((call_id, head.session_id))
    return out


def pending_of(store: CheckpointStore, session_id: str) -> PendingStep | None:
    """The unfinished step at ``session_id``'s head (None when there is none or no head)."""
    head = store.get_session_head(session_id)
    if head is None:
        return None
    return restore(store, session_id, head.snapshot_id).pending
