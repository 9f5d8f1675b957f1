"""``InMemoryCheckpointStore``: the checkpoint store contract held in this process only.

It keeps exactly what the SQLite store keeps (canonical JSON text, never the caller's objects), so
both behave the same under the conformance suite: reads return fresh, verified records and a
caller mutating a payload after a commit cannot change what was stored. Nothing survives the
process; use :class:`~qitos.checkpoint._sqlite_store.SqliteCheckpointStore` for that.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ParamSpec, TypeVar

from qitos.checkpoint._records import (
    ControlItem,
    DuplicateOperationError,
    PruneReport,
    SessionCommitReceipt,
    SessionHeadRecord,
    SessionLease,
    SessionSnapshot,
    SessionSnapshotCommit,
    SnapshotNotFoundError,
    StepWrite,
    json_text,
    utc_now,
)
from qitos.checkpoint._rules import (
    check_after,
    check_blobs,
    check_control,
    check_fence,
    check_lease_ttl,
    check_write_base,
    mentioned_digests,
    name_set,
    next_lease,
    renewed_lease,
)
from qitos.checkpoint.store import SyncCheckpointStore
from qitos.core._errors import (
    CheckpointError,
    HeadConflictError,
    SessionNotFoundError,
    SnapshotIntegrityError,
)

__all__ = ["InMemoryCheckpointStore"]

_T = TypeVar("_T")
_P = ParamSpec("_P")


@dataclass(frozen=True, slots=True)
class _Row:
    session_id: str
    parent_id: str | None
    base_id: str | None
    sequence: int
    created_at: str
    payload_json: str


@dataclass(frozen=True, slots=True)
class _Head:
    snapshot_id: str
    sequence: int
    lifecycle: str
    updated_at: str
    metadata_json: str


class InMemoryCheckpointStore(SyncCheckpointStore):
    """A process-local :class:`~qitos.checkpoint.store.CheckpointStore` (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._closed = False
        self._snapshots: dict[str, _Row] = {}
        self._heads: dict[str, _Head] = {}
        self._operations: dict[str, str] = {}
        self._writes: dict[tuple[str, str], dict[tuple[str, str], tuple[int, str]]] = {}
        self._control: dict[str, list[tuple[str, str, str]]] = {}  # (kind, payload, created_at)
        self._blobs: dict[str, bytes] = {}
        self._leases: dict[str, SessionLease] = {}

    async def _offload(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """In-memory work never blocks on I/O: run it inline instead of in a thread."""
        return fn(*args, **kwargs)

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError("the in-memory checkpoint store is closed")

    # ---- sessions and snapshots

    def get_session_head(self, session_id: str) -> SessionHeadRecord | None:
        """Read the current mutable head for one session (None if there is no such session)."""
        with self._lock:
            self._check_open()
            head = self._heads.get(session_id)
            return None if head is None else _head_record(session_id, head, len(self._control.get(session_id, ())))

    def commit_session_snapshot(self, request: SessionSnapshotCommit) -> SessionCommitReceipt:
        """Atomically persist an immutable snapshot (and blobs) and advance its head (CAS)."""
        payload_json = request.validate()
        metadata = request.session_metadata
        metadata_json = None if metadata is None else json_text(metadata, "session_metadata")
        blobs = check_blobs(request.blobs)
        snapshot = request.snapshot
        with self._lock:
            self._check_open()
            head = self._heads.get(request.session_id)
            if request.expected_head is None:
                if head is not None:
                    raise HeadConflictError(request.session_id, None, head.snapshot_id)
            elif head is None:
                raise SessionNotFoundError(request.session_id)
            elif head.snapshot_id != request.expected_head:
                raise HeadConflictError(request.session_id, request.expected_head, head.snapshot_id)
            if head is not None:
                check_fence(request.session_id, self._leases.get(request.session_id), request.lease_token, time.time())
            if request.operation_id is not None and request.operation_id in self._operations:
                raise DuplicateOperationError(request.operation_id, self._operations[request.operation_id])
            if snapshot.parent_id is not None and snapshot.parent_id not in self._snapshots:
                raise SnapshotNotFoundError(snapshot.parent_id)
            now = utc_now()
            self._snapshots.setdefault(
                snapshot.snapshot_id,
                _Row(
                    snapshot.session_id,
                    snapshot.parent_id,
                    snapshot.base_id,
                    snapshot.sequence,
                    snapshot.created_at,
                    payload_json,
                ),
            )
            if metadata_json is None:
                metadata_json = "{}" if head is None else head.metadata_json
            self._heads[request.session_id] = _Head(
                snapshot.snapshot_id, snapshot.sequence, request.lifecycle, now, metadata_json
            )
            for digest, data in blobs:
                self._blobs.setdefault(digest, data)
            if request.operation_id is not None:
                self._operations[request.operation_id] = request.session_id
            if request.expected_head is not None:  # the step this commit ends: its outcome is in the snapshot
                self._writes.pop((request.session_id, request.expected_head), None)
            return SessionCommitReceipt(
                session_id=request.session_id,
                snapshot_id=snapshot.snapshot_id,
                previous_head=request.expected_head,
                sequence=snapshot.sequence,
                committed_at=now,
                control_seq=len(self._control.get(request.session_id, ())),
            )

    def find_session_by_operation(self, operation_id: str) -> str | None:
        """The session a commit with this ``operation_id`` created, or None."""
        with self._lock:
            self._check_open()
            return self._operations.get(operation_id)

    def get_snapshot(self, snapshot_id: str) -> SessionSnapshot:
        """Read one verified snapshot; SnapshotNotFoundError or SnapshotIntegrityError."""
        with self._lock:
            self._check_open()
            row = self._snapshots.get(snapshot_id)
            if row is None:
                raise SnapshotNotFoundError(snapshot_id)
            return _snapshot(snapshot_id, row)

    def load_chain(self, snapshot_id: str) -> list[SessionSnapshot]:
        """The snapshot and its ancestors back to and including its base, oldest first, verified."""
        with self._lock:
            self._check_open()
            row = self._snapshots.get(snapshot_id)
            if row is None:
                raise SnapshotNotFoundError(snapshot_id)
            chain = [_snapshot(snapshot_id, row)]
            stop = row.base_id
            current = chain[0]
            while stop is not None and current.snapshot_id != stop:
                parent_id = current.parent_id
                if parent_id is None:
                    raise SnapshotIntegrityError(
                        snapshot_id, f"its base {stop} is not among its ancestors (reached the root)"
                    )
                parent = self._snapshots.get(parent_id)
                if parent is None:
                    raise SnapshotIntegrityError(snapshot_id, f"ancestor {parent_id} is missing from the store")
                current = _snapshot(parent_id, parent)
                chain.append(current)
            chain.reverse()
            return chain

    def list_sessions(self, *, lifecycles: Iterable[str] | None = None) -> list[SessionHeadRecord]:
        """Every session head (only those in ``lifecycles``, when given), in creation order."""
        wanted = name_set(lifecycles, "lifecycles")
        with self._lock:
            self._check_open()
            return [
                _head_record(session_id, head, len(self._control.get(session_id, ())))
                for session_id, head in self._heads.items()
                if wanted is None or head.lifecycle in wanted
            ]

    def list_session_snapshots(self, session_id: str) -> list[str]:
        """The session's head chain within the session, newest first."""
        with self._lock:
            self._check_open()
            head = self._heads.get(session_id)
            if head is None:
                raise SessionNotFoundError(session_id)
            out: list[str] = []
            current: str | None = head.snapshot_id
            while current is not None:
                row = self._snapshots.get(current)
                if row is None or row.session_id != session_id:
                    break
                out.append(current)
                current = row.parent_id
            return out

    # ---- pending writes

    def put_writes(self, writes: Sequence[StepWrite]) -> list[bool]:
        """Store pending writes in one transaction; per write, whether it was new (first wins)."""
        encoded = [(write, write.payload_json()) for write in writes]
        with self._lock:
            self._check_open()
            now = time.time()
            for write, _ in encoded:
                base = self._snapshots.get(write.base_snapshot_id)
                check_write_base(write, None if base is None else base.session_id)
                check_fence(write.session_id, self._leases.get(write.session_id), write.lease_token, now)
            stored: list[bool] = []
            for write, payload_json in encoded:
                bucket = self._writes.setdefault((write.session_id, write.base_snapshot_id), {})
                key = (write.kind, write.key)
                is_new = key not in bucket
                if is_new:
                    bucket[key] = (write.step_id, payload_json)
                stored.append(is_new)
            return stored

    def get_writes(self, session_id: str, base_snapshot_id: str) -> list[StepWrite]:
        """Pending writes of the step that started at ``base_snapshot_id``, in write order."""
        with self._lock:
            self._check_open()
            bucket = self._writes.get((session_id, base_snapshot_id), {})
            return [
                StepWrite(
                    session_id=session_id,
                    base_snapshot_id=base_snapshot_id,
                    step_id=step_id,
                    kind=kind,
                    key=key,
                    payload=json.loads(payload_json),
                )
                for (kind, key), (step_id, payload_json) in bucket.items()
            ]

    # ---- control items

    def append_control(self, session_id: str, kind: str, payload: Mapping[str, Any]) -> ControlItem:
        """Durably append one control item; the store assigns its position."""
        payload_json = check_control(session_id, kind, payload)
        with self._lock:
            self._check_open()
            if session_id not in self._heads:
                raise SessionNotFoundError(session_id)
            items = self._control.setdefault(session_id, [])
            items.append((kind, payload_json, utc_now()))
            return _control_item(session_id, len(items), items[-1])

    def list_control(self, session_id: str, *, after: int = 0, kinds: Iterable[str] | None = None) -> list[ControlItem]:
        """Control items with position > ``after`` (optionally only ``kinds``), by position."""
        wanted = name_set(kinds, "kinds")
        with self._lock:
            self._check_open()
            if session_id not in self._heads:
                raise SessionNotFoundError(session_id)
            start = check_after(after)
            return [
                _control_item(session_id, position, item)
                for position, item in enumerate(self._control.get(session_id, [])[start:], start + 1)
                if wanted is None or item[0] in wanted
            ]

    # ---- leases

    def acquire_lease(
        self, session_id: str, owner: str, *, ttl_seconds: float, take_over_from: str | None = None
    ) -> SessionLease:
        """Take (or, for its owner, renew) the session's lease; SessionBusyError if another owner holds it."""
        ttl = check_lease_ttl(ttl_seconds)
        with self._lock:
            self._check_open()
            if session_id not in self._heads:
                raise SessionNotFoundError(session_id)
            lease = next_lease(self._leases.get(session_id), session_id, owner, ttl, time.time(), take_over_from)
            self._leases[session_id] = lease
            return replace(
                lease,
                head_snapshot_id=self._heads[session_id].snapshot_id,
                control_seq=len(self._control.get(session_id, ())),
            )

    def renew_lease(self, lease: SessionLease, *, ttl_seconds: float) -> SessionLease:
        """Extend a held lease; LeaseLostError if it expired or was taken over."""
        ttl = check_lease_ttl(ttl_seconds)
        with self._lock:
            self._check_open()
            renewed = renewed_lease(self._leases.get(lease.session_id), lease, ttl, time.time())
            self._leases[lease.session_id] = renewed
            return renewed

    def release_lease(self, lease: SessionLease) -> None:
        """Give the lease up now (a no-op if it is no longer current); its token stays used."""
        with self._lock:
            self._check_open()
            current = self._leases.get(lease.session_id)
            if current is not None and current.token == lease.token and current.owner == lease.owner:
                self._leases[lease.session_id] = SessionLease(
                    session_id=lease.session_id, owner=lease.owner, token=lease.token, expires_at=0.0
                )

    def get_lease(self, session_id: str) -> SessionLease | None:
        """The session's current lease row (possibly lapsed), or None if it never had one."""
        with self._lock:
            self._check_open()
            return self._leases.get(session_id)

    # ---- blobs

    def put_blobs(self, blobs: Mapping[str, bytes]) -> None:
        """Store content-addressed blobs (key = sha256 hex of the bytes, verified)."""
        checked = check_blobs(blobs)
        with self._lock:
            self._check_open()
            for digest, data in checked:
                self._blobs.setdefault(digest, data)

    def get_blobs(self, digests: Iterable[str]) -> dict[str, bytes]:
        """The stored blobs among ``digests`` (absent digests are absent from the result)."""
        wanted = name_set(digests, "digests") or frozenset()
        with self._lock:
            self._check_open()
            return {digest: self._blobs[digest] for digest in wanted if digest in self._blobs}

    # ---- retention

    def prune(self, *, keep: Iterable[str] = ()) -> PruneReport:
        """Delete snapshots not reachable from a head or ``keep`` (with their writes), then the
        blobs that only they mentioned (see ``mentioned_digests``)."""
        named = name_set(keep, "keep") or frozenset()
        with self._lock:
            self._check_open()
            for snapshot_id in sorted(named):
                if snapshot_id not in self._snapshots:
                    raise SnapshotNotFoundError(snapshot_id)
            reachable: set[str] = set()
            for start in [head.snapshot_id for head in self._heads.values()] + sorted(named):
                current: str | None = start
                while current is not None and current not in reachable and current in self._snapshots:
                    reachable.add(current)
                    current = self._snapshots[current].parent_id
            doomed = [snapshot_id for snapshot_id in self._snapshots if snapshot_id not in reachable]
            candidates: set[str] = set()
            for snapshot_id in doomed:
                candidates |= mentioned_digests(self._snapshots.pop(snapshot_id).payload_json)
            for bucket_key in [key for key in self._writes if key[1] not in self._snapshots]:
                for _, payload_json in self._writes.pop(bucket_key).values():
                    candidates |= mentioned_digests(payload_json)
            unreferenced = candidates & self._blobs.keys()
            if unreferenced:
                for row in self._snapshots.values():
                    unreferenced -= mentioned_digests(row.payload_json)
                for bucket in self._writes.values():
                    for _, payload_json in bucket.values():
                        unreferenced -= mentioned_digests(payload_json)
                for digest in unreferenced:
                    del self._blobs[digest]
            return PruneReport(
                deleted_snapshots=len(doomed), kept_snapshots=len(self._snapshots), deleted_blobs=len(unreferenced)
            )

    def vacuum(self) -> None:
        """Nothing to reclaim in memory; checks only that the store is open."""
        with self._lock:
            self._check_open()

    def close(self) -> None:
        """Drop everything; later calls raise CheckpointError."""
        with self._lock:
            self._closed = True
            self._snapshots.clear()
            self._heads.clear()
            self._operations.clear()
            self._writes.clear()
            self._control.clear()
            self._blobs.clear()
            self._leases.clear()


def _snapshot(snapshot_id: str, row: _Row) -> SessionSnapshot:
    return SessionSnapshot.from_stored(
        snapshot_id=snapshot_id,
        session_id=row.session_id,
        parent_id=row.parent_id,
        base_id=row.base_id,
        sequence=row.sequence,
        created_at=row.created_at,
        payload_json=row.payload_json,
    )


def _head_record(session_id: str, head: _Head, control_seq: int) -> SessionHeadRecord:
    return SessionHeadRecord(
        session_id=session_id,
        snapshot_id=head.snapshot_id,
        sequence=head.sequence,
        lifecycle=head.lifecycle,
        updated_at=head.updated_at,
        metadata=json.loads(head.metadata_json),
        control_seq=control_seq,
    )


def _control_item(session_id: str, position: int, item: tuple[str, str, str]) -> ControlItem:
    kind, payload_json, created_at = item
    return ControlItem(
        session_id=session_id,
        position=position,
        kind=kind,
        payload=json.loads(payload_json),
        created_at=created_at,
    )
