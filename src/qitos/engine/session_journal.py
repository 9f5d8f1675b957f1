"""The store-backed journal of durable sessions, and rebuilding a session from its snapshots.

Snapshot payload (format 1), JSON::

    step_id, lifecycle, stop_reason, run_id       where the session stands
    state:  {"full": {...}} | {"delta": [ops]}    strict-codec state, or the changes since the parent
    state_bytes, delta_bytes                      sizes driving the materialization rule below
    log:    {log_id, position, digest,            the exchange log position and hash-chain digest;
             chunks: [...] (full) | chunk: id}    entries live in content-addressed blobs, stored once
    budget_used, control_position                 counters and consumed control items
    pending                                       a step that paused midway (decision, calls done)
    request_view                                  blob id of the last RequestView sent
    step                                          what this boundary's step did (for the work graph)

A snapshot holds the state *changes* of its step and a reference to a blob with the new exchange
entries. A full state is written again only when the deltas since the last full one outgrow it (a
geometric rule: storage and restore cost stay within a small factor of the state's size). Durability
modes and crash safety are described in ``qitos.engine.session_runtime``.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from qitos.checkpoint.store import CheckpointStore, SessionSnapshot, SessionSnapshotCommit, StepWrite
from qitos.core.codec import canonical_json, sha256_hex
from qitos.core.decision import Action
from qitos.core.errors import CheckpointError, SnapshotIntegrityError
from qitos.core.exchange import ExchangeLog
from qitos.core.state import apply_changes
from qitos.core.tool import ToolResult
from qitos.engine.journal import Approval, BoundaryCommit, ControlBatch, PendingStep, RunJournal, SteeringItem

__all__ = ["FORMAT", "RestoredSession", "SessionJournal", "materialize", "restore"]

FORMAT = 1
_MIN_FULL_BYTES = 4096
APPROVAL_KINDS = ("approve", "reject")

# --------------------------------------------------------------------------- restoring


@dataclass
class RestoredSession:
    """A session rebuilt at one snapshot: its state data, exchange log and any unfinished step."""

    snapshot: SessionSnapshot
    state_data: dict[str, Any]
    log: ExchangeLog
    pending: PendingStep | None
    carry_changes: list[dict[str, Any]]


def materialize(store: CheckpointStore, snapshot_id: str) -> tuple[list[SessionSnapshot], dict[str, Any], ExchangeLog]:
    """Rebuild the state data and the exchange log at ``snapshot_id`` from its verified chain."""
    chain = store.load_chain(snapshot_id)
    base, head = chain[0], chain[-1]
    state_part = base.payload.get("state") or {}
    if "full" not in state_part:
        raise SnapshotIntegrityError(base.snapshot_id, "the chain's base holds no full state")
    data: dict[str, Any] = json.loads(json.dumps(state_part["full"]))
    chunks: list[str] = list((base.payload.get("log") or {}).get("chunks") or [])
    for snap in chain[1:]:
        part = snap.payload.get("state") or {}
        if "full" in part:
            raise SnapshotIntegrityError(snap.snapshot_id, "a full state inside a chain after its base")
        try:
            apply_changes(data, part.get("delta") or [])
        except Exception as exc:
            raise SnapshotIntegrityError(snap.snapshot_id, f"its state delta does not apply: {exc}") from exc
        chunk = (snap.payload.get("log") or {}).get("chunk")
        if chunk:
            chunks.append(chunk)
    log_meta = head.payload.get("log") or {}
    log = ExchangeLog(log_meta.get("log_id") or f"log-{head.session_id}")
    if chunks:
        blobs = store.get_blobs(chunks)
        for chunk in chunks:
            raw = blobs.get(chunk)
            if raw is None:
                raise SnapshotIntegrityError(head.snapshot_id, f"exchange-log blob {chunk} is missing")
            try:
                log.extend_entries(json.loads(zlib.decompress(raw)))
            except Exception as exc:
                raise SnapshotIntegrityError(
                    head.snapshot_id, f"exchange-log blob {chunk} is unreadable: {exc}"
                ) from exc
    if log.position != log_meta.get("position", 0) or log.digest != log_meta.get("digest", log.digest):
        raise SnapshotIntegrityError(
            head.snapshot_id,
            f"the exchange log rebuilt to position {log.position} digest {log.digest[:12]}, "
            f"but the snapshot records {log_meta.get('position')} {str(log_meta.get('digest'))[:12]}",
        )
    return chain, data, log


def restore(store: CheckpointStore, session_id: str, head_id: str) -> RestoredSession:
    """Rebuild ``session_id`` at ``head_id``, folding in the pending writes of an unfinished step."""
    chain, data, log = materialize(store, head_id)
    head = chain[-1]
    pending_data = head.payload.get("pending")
    pending = PendingStep.from_dict(pending_data) if pending_data else None
    carry: list[dict[str, Any]] = []
    writes = store.get_writes(session_id, head_id)
    for write in writes:
        if write.kind == "decision" and pending is None:
            # The step crashed after DECIDE: re-apply what DECIDE did, never decide again.
            pending = PendingStep.from_dict(write.payload)
            log.extend_entries(pending.log_entries)
            apply_changes(data, pending.state_changes)
            carry.extend(pending.state_changes)
    if pending is not None:
        for write in writes:
            if write.step_id != pending.step_id:
                continue
            if write.kind == "tool_started":
                pending.started.add(write.key)
            elif write.kind == "tool_result":
                pending.results.setdefault(write.key, dict(write.payload))
    return RestoredSession(snapshot=head, state_data=data, log=log, pending=pending, carry_changes=carry)


# --------------------------------------------------------------------------- the journal


class SessionJournal(RunJournal):
    """Persists every boundary of a run to the checkpoint store (see the module docstring)."""

    durable = True

    def __init__(
        self,
        store: CheckpointStore,
        session_id: str,
        head: SessionSnapshot,
        *,
        run_id: str,
        mode: str = "sync",
        batch_steps: int = 16,
        batch_ms: float = 50.0,
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.run_id = run_id
        self.mode = mode
        self.batch_steps = batch_steps
        self.batch_ms = batch_ms
        payload = head.payload
        self._head_id = head.snapshot_id
        self._sequence = head.sequence
        self._base_id = head.base_id or head.snapshot_id
        self._state_bytes = int(payload.get("state_bytes", 0))
        self._delta_bytes = int(payload.get("delta_bytes", 0))
        self._log_position = int((payload.get("log") or {}).get("position", 0))
        self._log_chunks_at_base: list[str] | None = None
        self._request_view_id: str | None = payload.get("request_view")
        self._request_view_obj: Any = None
        self._consumed = int(payload.get("control_position", 0))
        self._fetched = 0
        self._pause_positions: list[int] = []
        self._steering: list[SteeringItem] = []
        self._approvals: dict[str, Approval] = {}
        self._buffer: list[BoundaryCommit] = []
        self._buffer_since = time.monotonic()
        self._failure: CheckpointError | None = None
        self.commits = 0

    # ---- control items

    def control(self, step_id: int) -> ControlBatch:
        for item in self.store.list_control(self.session_id, after=self._fetched):
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
        steering = tuple(s for s in self._steering if s.position > self._consumed)
        pause = any(p > self._consumed for p in self._pause_positions)
        if not steering and not pause and not self._approvals:
            return ControlBatch(last_position=self._consumed)
        return ControlBatch(
            pause_requested=pause,
            steering=steering,
            approvals=dict(self._approvals),
            last_position=self._fetched,
        )

    # ---- pending writes inside a step

    def record_decision(self, pending: PendingStep) -> None:
        if not pending.decision.get("actions") and pending.model is None:
            return  # nothing to protect: re-deciding without a model or tools is free and has no effects
        self._flush()
        payload = pending.to_dict()
        payload["started"], payload["results"] = [], {}
        self._write(pending.step_id, "decision", "decision", payload)

    def record_tool_started(self, step_id: int, action: Action) -> None:
        self._write(step_id, "tool_started", action.id, {"name": action.name, "args": dict(action.args)})

    def record_tool_result(self, step_id: int, result: ToolResult) -> None:
        self._write(step_id, "tool_result", result.call_id, result.to_dict())

    def _write(self, step_id: int, kind: str, key: str, payload: Mapping[str, Any]) -> None:
        self._raise_if_failed()
        write = StepWrite(
            session_id=self.session_id,
            base_snapshot_id=self._head_id,
            step_id=step_id,
            kind=kind,
            key=key,
            payload=payload,
        )
        self.store.put_writes([write])

    # ---- boundaries

    def commit(self, boundary: BoundaryCommit) -> None:
        self._raise_if_failed()
        self._consumed = max(self._consumed, boundary.control_position)
        if self.mode == "sync":
            self._commit_now([boundary])
            return
        self._buffer.append(boundary)
        elapsed_ms = (time.monotonic() - self._buffer_since) * 1000.0
        if (
            boundary.lifecycle != "running"
            or boundary.pending is not None
            or len(self._buffer) >= self.batch_steps
            or elapsed_ms >= self.batch_ms
        ):
            self._flush()

    def close(self) -> None:
        self._flush()

    @property
    def unflushed(self) -> int:
        """Boundaries buffered in batched mode and not yet durable."""
        return len(self._buffer)

    def _flush(self) -> None:
        if self._buffer:
            buffered, self._buffer = self._buffer, []
            self._commit_now(buffered)
        self._buffer_since = time.monotonic()

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _commit_now(self, boundaries: list[BoundaryCommit]) -> None:
        last = boundaries[-1]
        delta: list[dict[str, Any]] = []
        for boundary in boundaries:
            delta.extend(boundary.state_changes)
        delta_text = canonical_json(delta)
        blobs: dict[str, bytes] = {}
        payload: dict[str, Any] = {
            "format": FORMAT,
            "run_id": self.run_id,
            "step_id": last.step_id,
            "lifecycle": last.lifecycle,
            "stop_reason": last.stop_reason,
            "budget_used": last.budget_used,
            "control_position": self._consumed,
            "pending": last.pending.to_dict() if last.pending is not None else None,
            "step": _step_summary(boundaries),
        }
        log: ExchangeLog | None = last.log
        chunk: str | None = None
        if log is not None and log.position > self._log_position:
            entries = log.entries(self._log_position)
            raw = zlib.compress(canonical_json(entries).encode("utf-8"), 6)
            chunk = sha256_hex(raw)
            blobs[chunk] = raw
        view = last.request_view
        if view is not None and view is not self._request_view_obj:
            raw_view = zlib.compress(canonical_json(view.to_dict()).encode("utf-8"), 6)
            view_id = sha256_hex(raw_view)
            blobs[view_id] = raw_view
            self._request_view_id, self._request_view_obj = view_id, view
        payload["request_view"] = self._request_view_id
        log_meta = {
            "log_id": log.log_id if log is not None else f"log-{self.session_id}",
            "position": log.position if log is not None else self._log_position,
            "digest": log.digest if log is not None else ExchangeLog(f"log-{self.session_id}").digest,
        }
        full = self._delta_bytes + len(delta_text) > max(self._state_bytes, _MIN_FULL_BYTES)
        if full:
            state_full = last.state.to_dict()
            chunks = self._chunks_through_head()
            if chunk:
                chunks.append(chunk)
            state_bytes = len(canonical_json(state_full)) + 66 * len(chunks)
            payload.update(state={"full": state_full}, state_bytes=state_bytes, delta_bytes=0)
            payload["log"] = {**log_meta, "chunks": chunks}
            base_id = None
        else:
            payload.update(
                state={"delta": delta},
                state_bytes=self._state_bytes,
                delta_bytes=self._delta_bytes + len(delta_text),
            )
            payload["log"] = {**log_meta, "chunk": chunk}
            base_id = self._base_id
        snapshot = SessionSnapshot.create(
            session_id=self.session_id,
            parent_id=self._head_id,
            base_id=base_id,
            sequence=self._sequence + 1,
            payload=payload,
        )
        commit = SessionSnapshotCommit(
            session_id=self.session_id,
            expected_head=self._head_id,
            snapshot=snapshot,
            lifecycle=last.lifecycle,
            blobs=blobs,
        )
        try:
            self.store.commit_session_snapshot(commit)
        except CheckpointError as exc:
            self._failure = exc
            raise
        self._head_id = snapshot.snapshot_id
        self._sequence = snapshot.sequence
        if full:
            self._base_id = snapshot.snapshot_id
            self._state_bytes = payload["state_bytes"]
            self._delta_bytes = 0
            self._log_chunks_at_base = list(payload["log"]["chunks"])
        else:
            self._delta_bytes = payload["delta_bytes"]
            if chunk:
                self._chunks_pending().append(chunk)
        self._log_position = payload["log"]["position"]
        self.commits += 1

    # The chunk list of the current base plus the chunks committed since, kept in memory so a full
    # materialization never has to walk the chain.
    def _chunks_pending(self) -> list[str]:
        if self._log_chunks_at_base is None:
            self._log_chunks_at_base = self._load_chunks()
        return self._log_chunks_at_base

    def _chunks_through_head(self) -> list[str]:
        return list(self._chunks_pending())

    def _load_chunks(self) -> list[str]:
        chain = self.store.load_chain(self._head_id)
        chunks = list((chain[0].payload.get("log") or {}).get("chunks") or [])
        for snap in chain[1:]:
            chunk = (snap.payload.get("log") or {}).get("chunk")
            if chunk:
                chunks.append(chunk)
        return chunks


def _step_summary(boundaries: list[BoundaryCommit]) -> list[dict[str, Any]]:
    steps = []
    for boundary in boundaries:
        record = boundary.record
        if record is None:
            continue
        steps.append(
            {
                "step_id": record.step_id,
                "mode": record.decision.mode,
                "calls": [
                    {"call_id": r.call_id, "tool": r.name, "ok": r.ok, "error_kind": r.error_kind}
                    for r in record.observation.results
                ],
            }
        )
    return steps
