"""What a session recorded of its model calls, and how a new request differs from a recorded one.

Every model call a durable session makes is recorded before anything else happens with its reply:
the step's ``decision`` pending write (``qitos.sessions._step_journal``) holds ``model`` =
``{"request_id", "request_digest", "response"}``, keyed by the snapshot the step started from, and
the snapshot that closes the step keeps it in the step's summary (``qitos.sessions._payload``) and
names the request view that was sent (a blob, see ``qitos.sessions._stored_view``).
:func:`recorded_calls` reads the calls, in order; every row is checked against its digest by the
store, so a damaged row raises
:class:`~qitos.core._errors.IntegrityError` naming it, never a wrong reply. :func:`recorded_request`
reads the second, only to explain a divergence: :func:`request_diff` says in a few words what
changed between the recorded request and the new one (system prompt, a message, the tools, the
parameters).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from qitos.checkpoint._packing import unpack
from qitos.checkpoint.store import CheckpointStore
from qitos.core._errors import IntegrityError
from qitos.core.request_view import RequestView
from qitos.models._base import ModelResponse
from qitos.sessions._payload import SnapshotPayload
from qitos.sessions._step_journal import restore
from qitos.sessions._stored_view import view_from_record

__all__ = [
    "RecordedCall",
    "recorded_calls",
    "recorded_request",
    "request_diff",
    "request_parameters",
    "session_messages",
]

_EXCERPT = 160


@dataclass(frozen=True, kw_only=True)
class RecordedCall:
    """One recorded model call: its step, the digest of what was asked, and the reply."""

    step: int
    request_digest: str
    response: ModelResponse
    request_id: str | None = None


def recorded_calls(store: CheckpointStore, session_id: str) -> list[RecordedCall]:
    """The model calls ``session_id`` recorded, in the order they were made.

    A committed step's call is in its summary in the snapshot that committed it; a step still under
    way (or paused midway) has it in its decision's pending write, or in the head's unfinished step;
    sessions written before the summaries held it keep it in their decision writes.
    """
    by_step: dict[int, tuple[Any, str, str]] = {}  # step: (model entry, table, row)
    for snapshot_id in reversed(store.list_session_snapshots(session_id)):
        payload = SnapshotPayload.of(store.get_snapshot(snapshot_id))
        for step in payload.steps:
            if step.model is not None:
                by_step.setdefault(step.step_id, (step.model, "snapshots", f"{snapshot_id} step {step.step_id}"))
        if payload.pending is not None and payload.pending.model is not None:
            where = f"{snapshot_id} unfinished step {payload.pending.step_id}"
            by_step.setdefault(payload.pending.step_id, (payload.pending.model, "snapshots", where))
        for write in store.get_writes(session_id, snapshot_id):
            if write.kind == "decision" and write.payload.get("model") is not None:
                where = f"{write.kind}/{write.key} of snapshot {snapshot_id}"
                by_step.setdefault(write.step_id, (write.payload["model"], "writes", where))
    return [_recorded_call(session_id, step, *found) for step, found in sorted(by_step.items())]


def _recorded_call(session_id: str, step: int, entry: Any, table: str, where: str) -> RecordedCall:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("response"), Mapping):
        raise IntegrityError(table, where, "the model entry has no response", session_id=session_id)
    digest = entry.get("request_digest")
    if not isinstance(digest, str):
        raise IntegrityError(table, where, "the model entry has no request digest", session_id=session_id)
    try:
        response = ModelResponse.from_dict(entry["response"])
    except (KeyError, TypeError, ValueError) as exc:
        raise IntegrityError(table, where, f"unreadable model response ({exc})", session_id=session_id) from exc
    request_id = entry.get("request_id")
    return RecordedCall(
        step=step,
        request_digest=digest,
        response=response,
        request_id=request_id if isinstance(request_id, str) else None,
    )


def recorded_request(store: CheckpointStore, session_id: str, step: int) -> RequestView | None:
    """The request view ``session_id`` sent at ``step`` (None when the session no longer holds it)."""
    head = store.get_session_head(session_id)
    if head is None:
        return None
    view_id: str | None = None
    found = False
    for snapshot_id in reversed(store.list_session_snapshots(session_id)):
        payload = SnapshotPayload.of(store.get_snapshot(snapshot_id))
        if payload.request_view:
            view_id = payload.request_view
        if any(s.step_id == step for s in payload.steps):
            found = True
            break
    if not found or view_id is None:
        return None
    raw = store.get_blobs([view_id]).get(view_id)
    if raw is None:
        return None
    log = restore(store, session_id, head.snapshot_id).log
    try:
        return view_from_record(json.loads(unpack(raw)), log)
    except (ValueError, KeyError, TypeError):
        return None


def session_messages(store: CheckpointStore, session_id: str) -> list[dict[str, Any]]:
    """The conversation a session had with its model: the instructions of its last request (the
    system prompt), then every item of its exchange log (inputs, replies, tool results), in order."""
    head = store.get_session_head(session_id)
    if head is None:
        return []
    restored = restore(store, session_id, head.snapshot_id)
    messages: list[dict[str, Any]] = []
    if restored.request_view:
        raw = store.get_blobs([restored.request_view]).get(restored.request_view)
        if raw is not None:
            record = json.loads(unpack(raw))
            messages.extend(dict(m) for m in record.get("instructions") or () if isinstance(m, Mapping))
    for exchange in restored.log.exchanges:
        messages.extend(item.to_dict() for item in exchange.items)
    return messages


def request_parameters(view: RequestView) -> dict[str, Any]:
    """What a request asks besides its messages and tools: tool choice, reasoning, protocol."""
    return {
        "tool_choice": view.tool_choice(),
        "reasoning": view.reasoning_policy.to_dict(),
        "protocol": view.protocol_id,
    }


def request_diff(recorded: RequestView | None, now: RequestView) -> dict[str, Any]:
    """A short description of what changed from ``recorded`` to ``now``: per part that changed
    (``system``, ``message``, ``tools``, ``parameters``), where and an excerpt of both sides."""
    if recorded is None:
        return {"recorded_request": "not available (only its digest was compared)"}
    diff: dict[str, Any] = {}
    old_system, new_system = _system(recorded), _system(now)
    if old_system != new_system:
        diff["system"] = _text_change(old_system, new_system)
    old_messages, new_messages = _conversation(recorded), _conversation(now)
    for index in range(max(len(old_messages), len(new_messages))):
        old = old_messages[index] if index < len(old_messages) else None
        new = new_messages[index] if index < len(new_messages) else None
        if old != new:
            diff["message"] = {
                "index": index,
                "role": (new or old or {}).get("role"),
                **_text_change(_message_text(old), _message_text(new)),
            }
            break
    tools = _tools_change(recorded.tools(), now.tools())
    if tools:
        diff["tools"] = tools
    old_params, new_params = request_parameters(recorded), request_parameters(now)
    changed = {
        k: {"recorded": old_params[k], "now": new_params[k]} for k in old_params if old_params[k] != new_params[k]
    }
    if changed:
        diff["parameters"] = changed
    return diff


def _system(view: RequestView) -> str:
    return "\n".join(str(m.get("content") or "") for m in view.messages() if m.get("role") == "system")


def _conversation(view: RequestView) -> list[dict[str, Any]]:
    return [m for m in view.messages() if m.get("role") != "system"]


def _message_text(message: Mapping[str, object] | None) -> str:
    if message is None:
        return ""
    text = message.get("content")
    calls = message.get("tool_calls")
    if calls:
        rendered = json.dumps(calls, sort_keys=True, ensure_ascii=False)
        return f"{text or ''}{' ' if text else ''}{rendered}"
    return "" if text is None else str(text)


def _text_change(old: str, new: str) -> dict[str, Any]:
    """The first line where ``old`` and ``new`` differ (1-based), with an excerpt of each."""
    old_lines, new_lines = old.splitlines() or [""], new.splitlines() or [""]
    line = next(
        (i for i, (a, b) in enumerate(zip(old_lines, new_lines, strict=False)) if a != b),
        min(len(old_lines), len(new_lines)),
    )
    return {
        "line": line + 1,
        "recorded": _excerpt(old_lines[line] if line < len(old_lines) else ""),
        "now": _excerpt(new_lines[line] if line < len(new_lines) else ""),
    }


def _tools_change(old: Sequence[Mapping[str, object]], new: Sequence[Mapping[str, object]]) -> dict[str, Any]:
    before = {str(t.get("name")): t for t in old}
    after = {str(t.get("name")): t for t in new}
    out: dict[str, Any] = {}
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(n for n in set(before) & set(after) if before[n] != after[n])
    if added:
        out["added"] = added
    if removed:
        out["removed"] = removed
    if changed:
        out["changed"] = changed
    return out


def _excerpt(text: str) -> str:
    return text if len(text) <= _EXCERPT else text[: _EXCERPT - 1] + "…"
