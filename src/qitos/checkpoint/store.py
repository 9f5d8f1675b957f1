"""The checkpoint store contract: :class:`CheckpointStore` and the records it reads and writes.

A store persists four kinds of data for durable sessions (SPEC section 3):

- immutable **snapshots** (:class:`SessionSnapshot`), content-addressed: the id is the SHA-256 of
  the canonical JSON of the snapshot's content, so a stored snapshot can always be verified;
- one mutable **head** per session (:class:`SessionHeadRecord`), moved only by
  :meth:`CheckpointStore.commit_session_snapshot` with a compare-and-swap on the previous head;
- **pending writes** inside a step (:class:`StepWrite`: the decision, each tool call's intent and
  result), keyed so that writing the same key twice keeps the first;
- durable **control items** (:class:`ControlItem`: pause, steer, approve, reject) with positions
  assigned by the store, and content-addressed **blobs** for large values.

Sync and async twins: every method ``m`` has an ``a``-prefixed coroutine twin ``am`` on the same
class. On :class:`CheckpointStore` the **async twins are abstract** (a subclass missing one fails
at instantiation) and the sync ones delegate to them through ``asyncio.run``. Stores whose native
I/O is synchronous (SQLite, in-memory) derive from :class:`SyncCheckpointStore` instead, where the
**sync methods are abstract** and the async twins run them in a worker thread.

Errors: :class:`~qitos.core.errors.HeadConflictError` (a stale expected head),
:class:`~qitos.core.errors.SessionNotFoundError`, :class:`~qitos.core.errors.SnapshotIntegrityError`
(stored bytes do not match their digest), plus :class:`SnapshotNotFoundError`,
:class:`DuplicateOperationError` and :class:`BlobIntegrityError` defined here. Payloads must be
JSON-native; anything else raises :class:`~qitos.core.errors.CodecError` naming what was wrong.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import functools
import hashlib
import json
import operator
import os
import re
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from json.encoder import encode_basestring
from types import TracebackType
from typing import Any, Final, ParamSpec, Self, TypeVar

from qitos.core.codec import canonical_json
from qitos.core.errors import (
    CheckpointError,
    CodecError,
    IntegrityError,
    LeaseLostError,
    SessionBusyError,
    SnapshotIntegrityError,
    UsageError,
)

__all__ = [
    "MAX_CHAIN",
    "BlobIntegrityError",
    "CheckpointStore",
    "ControlItem",
    "DuplicateOperationError",
    "PruneReport",
    "SessionCommitReceipt",
    "SessionHeadRecord",
    "SessionLease",
    "SessionPosition",
    "SessionSnapshot",
    "SessionSnapshotCommit",
    "SnapshotNotFoundError",
    "StepWrite",
    "StoredSnapshotRow",
    "SyncCheckpointStore",
    "chain_oldest_first",
    "check_after",
    "check_blobs",
    "check_control",
    "check_fence",
    "check_lease_owner",
    "check_lease_ttl",
    "check_write_base",
    "control_digest",
    "head_digest",
    "json_text",
    "mentioned_digests",
    "metadata_digest",
    "name_set",
    "next_lease",
    "renewed_lease",
    "snapshot_content_text",
    "snapshot_digest",
    "stored_object",
    "stored_text",
    "utc_now",
    "verified_head",
    "verified_position",
    "verified_write",
    "write_digest",
]

_T = TypeVar("_T")
_P = ParamSpec("_P")


# --------------------------------------------------------------------------- errors


class SnapshotNotFoundError(CheckpointError, KeyError):
    """No snapshot with this id is stored (never committed, or pruned)."""

    def __init__(self, snapshot_id: str) -> None:
        super().__init__(f"snapshot {snapshot_id!r} not found")
        self.snapshot_id = snapshot_id

    def __str__(self) -> str:  # KeyError would quote the message
        return f"snapshot {self.snapshot_id!r} not found"

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.snapshot_id,))


class DuplicateOperationError(CheckpointError):
    """A commit carried an ``operation_id`` that already created ``session_id``.

    The runtime catches it to return the existing child instead of creating a second one
    (``fork(operation_id=...)`` twice returns the same child).
    """

    def __init__(self, operation_id: str, session_id: str) -> None:
        super().__init__(f"operation {operation_id!r} already created session {session_id!r}")
        self.operation_id = operation_id
        self.session_id = session_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.operation_id, self.session_id))


class BlobIntegrityError(IntegrityError):
    """A blob's bytes do not hash to the SHA-256 digest it is stored under."""

    def __init__(self, digest: str, reason: str) -> None:
        super().__init__("blobs", digest, reason)
        self.digest = digest

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.digest, self.reason))


# --------------------------------------------------------------------------- helpers for stores


# The formatted date and time of the last second stamped: every commit stamps twice (the snapshot's
# creation, the head's move), and formatting only the microseconds costs a third of a datetime's.
_STAMPED_SECOND: tuple[int, str] = (-1, "")


def utc_now() -> str:
    """The current UTC time as ISO 8601 with microseconds and a ``Z`` suffix."""
    global _STAMPED_SECOND
    second, micros = divmod(time.time_ns() // 1000, 1_000_000)
    stamped, prefix = _STAMPED_SECOND
    if second != stamped:
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _STAMPED_SECOND = (second, prefix)  # one tuple: a racing thread sees the old pair or the new
    return f"{prefix}.{micros:06d}Z"


_DECODE = json.JSONDecoder().decode
# How often the default wait_for_control looks for new control items.
_CONTROL_POLL_SECONDS = 0.05

StoredSnapshotRow = tuple[str, Any, Any, Any, Any, Any, bytes | str]
"""A stored snapshot as a store reads it: id, session, parent, base, sequence, created_at, payload JSON."""


def json_text(value: Any, what: str) -> str:
    """The canonical JSON text of a JSON-native mapping, or CodecError naming ``what``.

    JSON-native means it comes back equal after a JSON round trip: tuples, non-string keys,
    sets, NaN or objects are refused rather than silently changed.
    """
    if not isinstance(value, Mapping):
        raise CodecError(what, f"expected a mapping, got {type(value).__qualname__}")
    try:
        text: str = canonical_json(value)
    except (TypeError, ValueError) as exc:
        raise CodecError(what, f"not JSON-native: {exc}") from exc
    if _DECODE(text) != value:
        raise CodecError(
            what,
            "not JSON-native: it would change in a JSON round trip "
            "(tuples, non-string keys or other non-JSON types); encode it first",
        )
    return text


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if type(value) is str:
        return encode_basestring(value)
    if type(value) is int:
        return str(value)
    return canonical_json(value)  # anything else: its own canonical form (never equal to a str's or int's)


def snapshot_content_text(
    *,
    session_id: Any,
    parent_id: Any,
    base_id: Any,
    sequence: Any,
    created_at: Any,
    payload_json: str,
) -> str:
    """The canonical JSON of a snapshot's content, assembled around its payload's canonical JSON.

    Equal to ``canonical_json({session_id, parent_id, base_id, sequence, created_at, payload})``
    without serializing the payload again; its SHA-256 is the snapshot id.
    """
    head, tail = _content_around_payload(session_id, parent_id, base_id, sequence, created_at)
    return head + payload_json + tail


def snapshot_digest(
    *,
    session_id: Any,
    parent_id: Any,
    base_id: Any,
    sequence: Any,
    created_at: Any,
    payload_json: str | bytes,
) -> str:
    """The snapshot id: SHA-256 of :func:`snapshot_content_text`, hashed in three parts so a large
    payload is never copied into one content string (UTF-8 bytes are hashed as they are)."""
    head, tail = _content_around_payload(session_id, parent_id, base_id, sequence, created_at)
    hasher = hashlib.sha256(head.encode("utf-8"))
    hasher.update(payload_json if isinstance(payload_json, bytes) else payload_json.encode("utf-8"))
    hasher.update(tail.encode("utf-8"))
    return hasher.hexdigest()


def _content_around_payload(
    session_id: Any, parent_id: Any, base_id: Any, sequence: Any, created_at: Any
) -> tuple[str, str]:
    """The canonical content JSON before and after the payload (keys in sorted order)."""
    if (
        type(session_id) is str
        and type(created_at) is str
        and type(sequence) is int
        and (parent_id is None or type(parent_id) is str)
        and (base_id is None or type(base_id) is str)
    ):  # the usual case, without per-field calls
        return (
            '{"base_id":' + ("null" if base_id is None else encode_basestring(base_id))
            + ',"created_at":' + encode_basestring(created_at)
            + ',"parent_id":' + ("null" if parent_id is None else encode_basestring(parent_id))
            + ',"payload":',
            ',"sequence":' + str(sequence) + ',"session_id":' + encode_basestring(session_id) + "}",
        )  # fmt: skip
    return (
        f'{{"base_id":{_scalar(base_id)},"created_at":{_scalar(created_at)},"parent_id":{_scalar(parent_id)},"payload":',
        f',"sequence":{_scalar(sequence)},"session_id":{_scalar(session_id)}}}',
    )


def name_set(values: Iterable[str] | None, what: str) -> frozenset[str] | None:
    """An iterable of names as a frozenset; a bare string is refused (it would iterate chars)."""
    if values is None:
        return None
    if isinstance(values, str | bytes):
        raise UsageError(f"{what} must be an iterable of strings, not a single string: use [{values!r}]")
    out = frozenset(values)
    for value in out:
        if not isinstance(value, str):
            raise UsageError(f"{what} must hold strings, got {value!r}")
    return out


def check_after(after: int) -> int:
    """Validate a ``list_control(after=...)`` position (a non-negative int)."""
    if not isinstance(after, int) or isinstance(after, bool) or after < 0:
        raise UsageError(f"after must be a non-negative int position, got {after!r}")
    return after


def _require_str(value: Any, what: str, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value:
        raise UsageError(f"{what} must be a non-empty string, got {value!r}")


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, kw_only=True)
class SessionSnapshot:
    """One immutable committed boundary of a session.

    ``snapshot_id`` is the SHA-256 of the canonical JSON of ``{session_id, parent_id, base_id,
    sequence, created_at, payload}``. ``parent_id`` may name a snapshot of another session (a fork
    shares its parent's prefix). ``base_id`` names the nearest ancestor holding a full
    materialization, or is None when this snapshot is itself full; :meth:`CheckpointStore.load_chain`
    returns the snapshots from the base to this one.

    ``payload`` is read-only: its canonical JSON is fixed when the snapshot is created (or loaded),
    and that text, checked against ``snapshot_id``, is what a store persists. :meth:`verify`
    re-serializes the live payload and fails if it was changed since.
    """

    snapshot_id: str
    session_id: str
    parent_id: str | None
    base_id: str | None
    sequence: int
    created_at: str
    payload: Mapping[str, Any]

    def __hash__(self) -> int:
        return hash(self.snapshot_id)

    @classmethod
    def create(
        cls,
        *,
        session_id: str,
        parent_id: str | None,
        base_id: str | None,
        sequence: int,
        payload: Mapping[str, Any],
        created_at: str | None = None,
        trusted: bool = False,
    ) -> SessionSnapshot:
        """Build a snapshot and compute its id; CodecError if ``payload`` is not JSON-native.

        ``trusted=True`` skips the JSON round-trip check, for payloads built only from data that
        ``qitos.core.codec`` already produced (the session journal's hot path); the payload is
        still encoded canonically and hashed.
        """
        _require_str(session_id, "session_id")
        _require_str(parent_id, "parent_id", optional=True)
        _require_str(base_id, "base_id", optional=True)
        if not isinstance(sequence, int) or isinstance(sequence, bool) or sequence < 0:
            raise UsageError(f"sequence must be a non-negative int, got {sequence!r}")
        stamp = utc_now() if created_at is None else created_at
        _require_str(stamp, "created_at")
        if trusted and isinstance(payload, Mapping):
            try:
                payload_json = canonical_json(payload)
            except (TypeError, ValueError) as exc:
                raise CodecError("snapshot.payload", f"not JSON-native: {exc}") from exc
        else:
            payload_json = json_text(payload, "snapshot.payload")
        snapshot = cls(
            snapshot_id="",
            session_id=session_id,
            parent_id=parent_id,
            base_id=base_id,
            sequence=sequence,
            created_at=stamp,
            payload=payload,
        )
        object.__setattr__(snapshot, "snapshot_id", snapshot._digest(payload_json))
        object.__setattr__(snapshot, "_canonical_payload", payload_json)
        # The id was just computed from this very text: canonical_payload() need not hash it again.
        object.__setattr__(snapshot, "_hashed", True)
        return snapshot

    def _digest(self, payload_json: str) -> str:
        return snapshot_digest(
            session_id=self.session_id,
            parent_id=self.parent_id,
            base_id=self.base_id,
            sequence=self.sequence,
            created_at=self.created_at,
            payload_json=payload_json,
        )

    def canonical_payload(self) -> str:
        """The payload's canonical JSON as fixed at creation or load, checked against the id.

        This is what stores persist. SnapshotIntegrityError names the snapshot if the content
        does not hash to ``snapshot_id``; a snapshot built directly (not by :meth:`create`) has
        its payload serialized here (CodecError if it is not JSON-native).
        """
        payload_json: str | None = self.__dict__.get("_canonical_payload")
        if payload_json is not None and self.__dict__.get("_hashed"):
            return payload_json
        if payload_json is None:
            payload_json = json_text(self.payload, f"snapshot {self.snapshot_id}.payload")
        actual = self._digest(payload_json)
        if actual != self.snapshot_id:
            raise SnapshotIntegrityError(self.snapshot_id, f"content hashes to {actual}, not to its id")
        return payload_json

    @property
    def payload_size(self) -> int:
        """Characters of the payload's canonical JSON (what the store writes, before compression)."""
        text: str | None = self.__dict__.get("_canonical_payload")
        return len(text) if text is not None else len(json_text(self.payload, "snapshot.payload"))

    def verify(self) -> None:
        """Re-serialize the live content; SnapshotIntegrityError if it does not hash to the id."""
        actual = self._digest(json_text(self.payload, f"snapshot {self.snapshot_id}.payload"))
        if actual != self.snapshot_id:
            raise SnapshotIntegrityError(self.snapshot_id, f"content hashes to {actual}, not to its id")

    @classmethod
    def from_stored(
        cls,
        *,
        snapshot_id: str,
        session_id: Any,
        parent_id: Any,
        base_id: Any,
        sequence: Any,
        created_at: Any,
        payload_json: bytes | str,
    ) -> SessionSnapshot:
        """Rebuild a stored snapshot, verifying its digest; SnapshotIntegrityError names it if not."""
        row = (snapshot_id, session_id, parent_id, base_id, sequence, created_at, payload_json)
        return cls.from_stored_rows([row])[0]

    @classmethod
    def from_stored_rows(cls, rows: Iterable[StoredSnapshotRow]) -> list[SessionSnapshot]:
        """Rebuild stored snapshots, in order, verifying every digest before any payload is parsed.

        Each row is ``(snapshot_id, session_id, parent_id, base_id, sequence, created_at,
        payload_json)``. The payloads are parsed together in one JSON call (a chain of many small
        deltas costs one parse, not one per snapshot); SnapshotIntegrityError names the first
        snapshot whose content does not hash to its id or whose payload is not a JSON object.
        """
        snapshots: list[SessionSnapshot] = []
        texts: list[str] = []
        new = object.__new__
        for snapshot_id, session_id, parent_id, base_id, sequence, created_at, payload_json in rows:
            try:
                actual = snapshot_digest(
                    session_id=session_id,
                    parent_id=parent_id,
                    base_id=base_id,
                    sequence=sequence,
                    created_at=created_at,
                    payload_json=payload_json,
                )
                text = payload_json.decode("utf-8") if isinstance(payload_json, bytes) else payload_json
            except (UnicodeDecodeError, TypeError, ValueError, AttributeError) as exc:
                raise SnapshotIntegrityError(snapshot_id, f"stored content is unreadable: {exc}") from exc
            if actual != snapshot_id:
                raise SnapshotIntegrityError(
                    snapshot_id, f"stored content hashes to {actual}; the stored bytes were altered"
                )
            # The fields were just verified against the id: set them without __init__'s per-field
            # frozen-dataclass calls (this is the restore path, thousands of rows).
            snapshot = new(cls)
            snapshot.__dict__.update(
                snapshot_id=snapshot_id,
                session_id=session_id,
                parent_id=parent_id,
                base_id=base_id,
                sequence=sequence,
                created_at=created_at,
                _canonical_payload=text,
            )
            snapshots.append(snapshot)
            texts.append(text)
        try:
            payloads = _DECODE("[" + ",".join(texts) + "]")
        except ValueError:
            payloads = []
        if len(payloads) != len(snapshots):  # not one JSON value each: parse one by one to name the culprit
            payloads = []
            for snapshot, text in zip(snapshots, texts, strict=True):
                try:
                    payloads.append(_DECODE(text))
                except ValueError as exc:
                    raise SnapshotIntegrityError(snapshot.snapshot_id, f"stored payload is not JSON: {exc}") from exc
        for snapshot, payload in zip(snapshots, payloads, strict=True):
            if not isinstance(payload, dict):
                raise SnapshotIntegrityError(snapshot.snapshot_id, "stored payload is not a JSON object")
            snapshot.__dict__["payload"] = payload
        return snapshots


@dataclass(frozen=True, kw_only=True, slots=True)
class SessionHeadRecord:
    """A session's mutable head: its latest snapshot, lifecycle and creation metadata.

    ``metadata`` is given when the session is created (agent id, task, parent session, fork
    snapshot, fork operation id) and replaced only by a commit that passes ``session_metadata``.
    ``control_seq`` is the session's newest control position when the head was read (0: no
    control item yet; None: the store does not say), as :class:`SessionCommitReceipt` reports it.
    """

    session_id: str
    snapshot_id: str
    sequence: int
    lifecycle: str
    updated_at: str
    metadata: Mapping[str, Any]
    control_seq: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class SessionPosition:
    """Where a session's head stands: its snapshot, sequence and lifecycle, without the metadata.

    What a waiter polls (``CheckpointStore.get_session_positions``): a store reads it from the head
    row alone, checked against the row's digest.
    """

    session_id: str
    snapshot_id: str
    sequence: int
    lifecycle: str


@dataclass(frozen=True, kw_only=True, slots=True)
class SessionSnapshotCommit:
    """A request to persist ``snapshot`` and move the session head to it atomically.

    ``expected_head`` None means "create the session" (HeadConflictError if it exists); otherwise
    the head must still be ``expected_head``. ``blobs`` (sha256 hex -> bytes) are stored in the
    same transaction. An ``operation_id`` may be used once per store (DuplicateOperationError
    names the session it already created). ``lease_token`` is the committing runner's fencing
    token (see :class:`SessionLease`): the store checks it in the same transaction.
    """

    session_id: str
    expected_head: str | None
    snapshot: SessionSnapshot
    lifecycle: str
    session_metadata: Mapping[str, Any] | None = None
    blobs: Mapping[str, bytes] = field(default_factory=dict)
    operation_id: str | None = None
    lease_token: int | None = None

    def validate(self) -> str:
        """Check the request; return the snapshot's verified payload JSON."""
        _require_str(self.session_id, "session_id")
        _require_str(self.expected_head, "expected_head", optional=True)
        _require_str(self.lifecycle, "lifecycle")
        _require_str(self.operation_id, "operation_id", optional=True)
        if not isinstance(self.snapshot, SessionSnapshot):
            raise UsageError(f"snapshot must be a SessionSnapshot, got {type(self.snapshot).__qualname__}")
        if self.snapshot.session_id != self.session_id:
            raise UsageError(
                f"snapshot {self.snapshot.snapshot_id} belongs to session {self.snapshot.session_id!r}, "
                f"not to {self.session_id!r}"
            )
        return self.snapshot.canonical_payload()


@dataclass(frozen=True, kw_only=True, slots=True)
class SessionCommitReceipt:
    """What a successful commit did: the new head, the head it replaced, and when.

    ``control_seq`` is the session's last control position as the commit saw it (the position of the
    newest item ``list_control`` would return), so a runner learns of new control items without
    polling; None from a store that does not report it.
    """

    session_id: str
    snapshot_id: str
    previous_head: str | None
    sequence: int
    committed_at: str
    control_seq: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class StepWrite:
    """One durable pending write inside a step (the decision, a tool call's intent or result).

    Keyed by ``(session_id, base_snapshot_id, kind, key)``; the first write of a key is kept.
    ``base_snapshot_id`` is the snapshot the step started from and must belong to the session.
    ``lease_token`` is the writing runner's fencing token, checked like a commit's (not stored).
    """

    session_id: str
    base_snapshot_id: str
    step_id: int
    kind: str
    key: str
    payload: Mapping[str, Any]
    lease_token: int | None = None

    def payload_json(self) -> str:
        """Validate the write; return its payload's canonical JSON."""
        _require_str(self.session_id, "StepWrite.session_id")
        _require_str(self.base_snapshot_id, "StepWrite.base_snapshot_id")
        _require_str(self.kind, "StepWrite.kind")
        if not isinstance(self.key, str):
            raise UsageError(f"StepWrite.key must be a string, got {self.key!r}")
        if not isinstance(self.step_id, int) or isinstance(self.step_id, bool) or self.step_id < 0:
            raise UsageError(f"StepWrite.step_id must be a non-negative int, got {self.step_id!r}")
        return json_text(self.payload, f"write {self.kind}/{self.key}.payload")


@dataclass(frozen=True, kw_only=True, slots=True)
class ControlItem:
    """A durable control item (``pause``, ``steer``, ``approve``, ``reject``).

    ``position`` is assigned by the store and increases monotonically within the session.
    """

    session_id: str
    position: int
    kind: str
    payload: Mapping[str, Any]
    created_at: str


@dataclass(frozen=True, kw_only=True, slots=True)
class SessionLease:
    """A runner's exclusive, expiring claim on a session: one owner at a time.

    ``token`` is the fencing token: it grows by one each time the lease changes hands (or lapses
    and is taken again), and every commit and pending write of the holder carries it, so a runner
    that lost the lease is refused by the store. ``expires_at`` is in seconds since the epoch by
    the store's clock; the holder renews before then (:meth:`CheckpointStore.renew_lease`).
    ``head_snapshot_id`` and ``control_seq`` are the session's head snapshot and newest control
    position when :meth:`CheckpointStore.acquire_lease` granted the lease, so its holder knows
    whether the head it read before still stands (None on a renewed lease, or where a store does not
    say). They describe the grant, not the lease: two leases compare equal without them.
    """

    session_id: str
    owner: str
    token: int
    expires_at: float
    head_snapshot_id: str | None = field(default=None, compare=False)
    control_seq: int | None = field(default=None, compare=False)


@dataclass(frozen=True, kw_only=True, slots=True)
class PruneReport:
    """What :meth:`CheckpointStore.prune` removed and kept."""

    deleted_snapshots: int
    kept_snapshots: int
    deleted_blobs: int = 0


_DIGEST_MENTION = re.compile(rb'"([0-9a-f]{64})"')


def mentioned_digests(payload_json: str | bytes) -> set[str]:
    """Every 64-hex-digit JSON string in a stored payload: the blobs it may reference.

    Stores do not interpret payloads. :meth:`CheckpointStore.prune` deletes a blob only when a
    pruned snapshot mentioned its digest and no kept snapshot or pending write does, so a payload
    may reference blobs anywhere in its structure, and a blob that no snapshot ever mentioned
    (stored by ``put_blobs`` ahead of its commit) is never removed by a prune.
    """
    data = payload_json.encode("utf-8") if isinstance(payload_json, str) else payload_json
    return {match.decode("ascii") for match in _DIGEST_MENTION.findall(data)}


def check_blobs(blobs: Mapping[str, bytes]) -> list[tuple[str, bytes]]:
    """Verify each blob hashes to its key; BlobIntegrityError names the first that does not."""
    if not isinstance(blobs, Mapping):
        raise UsageError(f"blobs must be a mapping of sha256 hex -> bytes, got {type(blobs).__qualname__}")
    out: list[tuple[str, bytes]] = []
    for key, data in blobs.items():
        if not isinstance(data, bytes | bytearray | memoryview):
            raise UsageError(f"blob {key!r} must be bytes, got {type(data).__qualname__}")
        raw = bytes(data)
        actual = hashlib.sha256(raw).hexdigest()
        if actual != key:
            raise BlobIntegrityError(str(key), f"bytes hash to {actual}")
        out.append((actual, raw))
    return out


def check_write_base(write: StepWrite, base_session: str | None) -> None:
    """A pending write's base snapshot must exist and belong to the write's session."""
    if base_session is None:
        raise SnapshotNotFoundError(write.base_snapshot_id)
    if base_session != write.session_id:
        raise CheckpointError(
            f"write {write.kind}/{write.key}: base snapshot {write.base_snapshot_id} belongs to session "
            f"{base_session!r}, not to {write.session_id!r}"
        )


def check_control(session_id: str, kind: str, payload: Mapping[str, Any]) -> str:
    """Validate a control item; return its payload's canonical JSON."""
    _require_str(session_id, "session_id")
    _require_str(kind, "control kind")
    return json_text(payload, f"control {kind}.payload")


def check_lease_ttl(ttl_seconds: float) -> float:
    """A lease duration must be a positive number of seconds."""
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int | float) or not ttl_seconds > 0:
        raise UsageError(f"ttl_seconds must be a positive number of seconds, got {ttl_seconds!r}")
    return float(ttl_seconds)


def check_lease_owner(owner: str, take_over_from: str | None = None) -> None:
    """A lease owner (and the owner a lease is taken over from, if any) must be non-empty strings."""
    _require_str(owner, "lease owner")
    _require_str(take_over_from, "take_over_from", optional=True)


def next_lease(
    current: SessionLease | None,
    session_id: str,
    owner: str,
    ttl_seconds: float,
    now: float,
    take_over_from: str | None = None,
) -> SessionLease:
    """The lease ``owner`` gets when asking for ``session_id`` at ``now`` (store clock).

    Free or lapsed: a new token. Held and live by the same owner: renewed with the same token.
    Held and live by another owner: :class:`SessionBusyError` naming the holder, unless that holder
    is ``take_over_from`` (a runner the caller knows is dead, e.g. a process of this host that no
    longer exists): then it is taken over at once with a new token.
    """
    check_lease_owner(owner, take_over_from)
    if current is not None and current.expires_at > now and current.owner != take_over_from:
        if current.owner != owner:
            raise SessionBusyError(session_id, current.owner, current.expires_at)
        token = current.token
    else:
        token = (current.token if current is not None else 0) + 1
    return SessionLease(session_id=session_id, owner=owner, token=token, expires_at=now + ttl_seconds)


def renewed_lease(current: SessionLease | None, lease: SessionLease, ttl_seconds: float, now: float) -> SessionLease:
    """``lease`` extended to ``now + ttl_seconds``, or :class:`LeaseLostError` if it is not current and live."""
    check_fence(lease.session_id, current, lease.token, now)
    return SessionLease(session_id=lease.session_id, owner=lease.owner, token=lease.token, expires_at=now + ttl_seconds)


def check_fence(session_id: str, current: SessionLease | None, token: int | None, now: float) -> None:
    """Refuse a write by a runner that does not hold the session's live lease.

    ``token`` None (a write by no runner, e.g. creating a session) is refused only while someone
    holds a live lease (:class:`SessionBusyError`); a token must be the current one and unexpired
    (:class:`LeaseLostError` says which it is not).
    """
    if token is None:
        if current is not None and current.expires_at > now:
            raise SessionBusyError(session_id, current.owner, current.expires_at)
        return
    if current is None:
        raise LeaseLostError(session_id, token, "the session has no lease")
    if current.token != token:
        raise LeaseLostError(session_id, token, f"the lease was taken over (current token {current.token})")
    if current.expires_at <= now:
        raise LeaseLostError(session_id, token, "the lease expired before this write")


# Row digests: what a store keeps beside each mutable row, and checks when reading it back. The
# text each covers is built here, once for every store, with fields separated by U+001F.
def _row_digest(*fields: object) -> str:
    return hashlib.sha256("\x1f".join(map(str, fields)).encode("utf-8")).hexdigest()


def head_digest(session_id: str, snapshot_id: str, sequence: int, lifecycle: str, updated_at: str) -> str:
    """The digest of a head row (its session, snapshot, sequence, lifecycle and time)."""
    return _row_digest("head", session_id, snapshot_id, sequence, lifecycle, updated_at)


def metadata_digest(session_id: str, metadata_json: str) -> str:
    """The digest of a session's metadata row (written once, at creation)."""
    return _row_digest("metadata", session_id, metadata_json)


def write_digest(write: StepWrite, payload_json: str) -> str:
    """The digest of a pending-write row: its whole key, step and payload."""
    return _row_digest(
        "write", write.session_id, write.base_snapshot_id, write.step_id, write.kind, write.key, payload_json
    )


def control_digest(session_id: str, position: int, kind: str, payload_json: str, created_at: str) -> str:
    """The digest of a control-item row."""
    return _row_digest("control", session_id, position, kind, payload_json, created_at)


def stored_text(raw: bytes | str, table: str, row: str, session_id: str) -> str:
    """A stored text column (read as bytes) decoded; a damaged one raises IntegrityError naming it."""
    if isinstance(raw, str):
        return raw
    try:
        return bytes(raw).decode("utf-8")
    except (UnicodeDecodeError, TypeError) as exc:
        raise IntegrityError(table, row, f"stored text is not valid UTF-8: {exc}", session_id=session_id) from exc


def stored_object(text: str, table: str, row: str, session_id: str) -> dict[str, Any]:
    """A stored JSON object; unreadable JSON or another value raises IntegrityError naming the row."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise IntegrityError(table, row, f"stored JSON is unreadable: {exc}", session_id=session_id) from exc
    if not isinstance(value, dict):
        raise IntegrityError(table, row, "stored JSON is not an object", session_id=session_id)
    return value


def verified_head(
    session_id: str,
    snapshot_id: str,
    sequence: int,
    lifecycle: str,
    updated_at: str,
    digest: str,
    metadata_raw: bytes | str | None,
    meta_digest: str | None,
    control_seq: int | None = None,
) -> SessionHeadRecord:
    """A head row joined with its session's metadata row, both checked against their digests."""
    verified_position(session_id, snapshot_id, sequence, lifecycle, updated_at, digest)
    if metadata_raw is None:
        raise IntegrityError("sessions", session_id, "the session's metadata row is missing", session_id=session_id)
    metadata_json = stored_text(metadata_raw, "sessions", session_id, session_id)
    if meta_digest != metadata_digest(session_id, metadata_json):
        raise IntegrityError("sessions", session_id, "content does not match its digest", session_id=session_id)
    return SessionHeadRecord(
        session_id=session_id,
        snapshot_id=snapshot_id,
        sequence=sequence,
        lifecycle=lifecycle,
        updated_at=updated_at,
        metadata=stored_object(metadata_json, "sessions", session_id, session_id),
        control_seq=None if control_seq is None else int(control_seq),
    )


def verified_write(
    session_id: str, base_snapshot_id: str, step_id: int, kind: str, key: str, payload_raw: bytes | str, digest: str
) -> StepWrite:
    """A writes row, checked against its digest, as the :class:`StepWrite` it stores."""
    where = f"{kind}/{key}"
    payload_json = stored_text(payload_raw, "writes", where, session_id)
    write = StepWrite(
        session_id=session_id, base_snapshot_id=base_snapshot_id, step_id=int(step_id), kind=kind, key=key, payload={}
    )
    if digest != write_digest(write, payload_json):
        raise IntegrityError("writes", where, "content does not match its digest", session_id=session_id)
    return replace(write, payload=stored_object(payload_json, "writes", where, session_id))


MAX_CHAIN: Final = 10_000_000
"""How many snapshots a SQL store's recursive chain query follows at most (a cycle in corrupted rows)."""
_DEPTH: Final = operator.itemgetter(9)  # the depth column of a chain row


def chain_oldest_first(snapshot_id: str, rows: list[Any]) -> list[Any]:
    """A SQL store's chain rows of ``snapshot_id`` (a snapshot's columns, then its chain's base id
    and the row's depth), sorted oldest first; SnapshotIntegrityError unless they reach the base
    (no rows: returned as they are).

    They are sorted here, not in SQL: sorting rows with payloads there costs more.
    """
    if not rows:
        return rows
    rows.sort(key=_DEPTH, reverse=True)
    oldest = rows[0]
    stop, depth = oldest[8], oldest[9]
    if stop is not None and oldest[0] != stop:
        if depth >= MAX_CHAIN:
            reason = f"its chain to base {stop} exceeds {MAX_CHAIN} snapshots (a parent cycle?)"
        elif oldest[2] is None:
            reason = f"its base {stop} is not among its ancestors (reached the root)"
        else:
            reason = f"ancestor {oldest[2]} is missing from the store"
        raise SnapshotIntegrityError(snapshot_id, reason)
    return rows


def verified_position(
    session_id: str, snapshot_id: str, sequence: int, lifecycle: str, updated_at: str, digest: str
) -> SessionPosition:
    """A head row, checked against its digest, as a :class:`SessionPosition`."""
    if digest != head_digest(session_id, snapshot_id, sequence, lifecycle, updated_at):
        raise IntegrityError("heads", session_id, "content does not match its digest", session_id=session_id)
    return SessionPosition(session_id=session_id, snapshot_id=snapshot_id, sequence=sequence, lifecycle=lifecycle)


# --------------------------------------------------------------------------- the contract


def _positions(heads: Mapping[str, SessionHeadRecord], lifecycles: frozenset[str] | None) -> dict[str, SessionPosition]:
    """The positions of those of ``heads`` in one of ``lifecycles`` (None: all)."""
    return {
        sid: SessionPosition(
            session_id=head.session_id, snapshot_id=head.snapshot_id, sequence=head.sequence, lifecycle=head.lifecycle
        )
        for sid, head in heads.items()
        if lifecycles is None or head.lifecycle in lifecycles
    }


def _run_sync(coro: Coroutine[Any, Any, _T], name: str) -> _T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise UsageError(f"{name}() was called inside a running event loop; await a{name}() instead")


class CheckpointStore(abc.ABC):
    """Abstract base class for checkpoint persistence (after LangGraph's ``BaseCheckpointSaver``).

    Every method has both sync and async variants. Subclasses should override the async
    variants (they are abstract here); the sync ones delegate via ``asyncio.run`` by default.
    Natively synchronous stores derive from :class:`SyncCheckpointStore`. Stores are context
    managers; ``close()`` releases their resources.
    """

    # ---- async twins: abstract

    @abc.abstractmethod
    async def aget_session_head(self, session_id: str) -> SessionHeadRecord | None:
        """Read the current mutable head for one session (None if there is no such session)."""

    @abc.abstractmethod
    async def acommit_session_snapshot(self, request: SessionSnapshotCommit) -> SessionCommitReceipt:
        """Atomically persist an immutable snapshot (and blobs) and advance its head (CAS)."""

    @abc.abstractmethod
    async def afind_session_by_operation(self, operation_id: str) -> str | None:
        """The session a commit with this ``operation_id`` created, or None."""

    @abc.abstractmethod
    async def aget_snapshot(self, snapshot_id: str) -> SessionSnapshot:
        """Read one verified snapshot; SnapshotNotFoundError or SnapshotIntegrityError."""

    @abc.abstractmethod
    async def aload_chain(self, snapshot_id: str) -> list[SessionSnapshot]:
        """The snapshot and its ancestors back to and including its base, oldest first, verified."""

    @abc.abstractmethod
    async def alist_sessions(self, *, lifecycles: Iterable[str] | None = None) -> list[SessionHeadRecord]:
        """Every session head (only those in ``lifecycles``, when given), in creation order."""

    @abc.abstractmethod
    async def alist_session_snapshots(self, session_id: str) -> list[str]:
        """The session's head chain within the session, newest first."""

    @abc.abstractmethod
    async def aput_writes(self, writes: Sequence[StepWrite]) -> list[bool]:
        """Store pending writes in one transaction; per write, whether it was new (first wins)."""

    @abc.abstractmethod
    async def aget_writes(self, session_id: str, base_snapshot_id: str) -> list[StepWrite]:
        """Pending writes of the step that started at ``base_snapshot_id``, in write order."""

    @abc.abstractmethod
    async def aappend_control(self, session_id: str, kind: str, payload: Mapping[str, Any]) -> ControlItem:
        """Durably append one control item; the store assigns its position."""

    @abc.abstractmethod
    async def alist_control(
        self, session_id: str, *, after: int = 0, kinds: Iterable[str] | None = None
    ) -> list[ControlItem]:
        """Control items with position > ``after`` (optionally only ``kinds``), by position."""

    @abc.abstractmethod
    async def aacquire_lease(
        self, session_id: str, owner: str, *, ttl_seconds: float, take_over_from: str | None = None
    ) -> SessionLease:
        """Take (or, for its owner, renew) the session's lease; SessionBusyError if another owner holds it."""

    @abc.abstractmethod
    async def arenew_lease(self, lease: SessionLease, *, ttl_seconds: float) -> SessionLease:
        """Extend a held lease; LeaseLostError if it expired or was taken over."""

    @abc.abstractmethod
    async def arelease_lease(self, lease: SessionLease) -> None:
        """Give the lease up now (a no-op if it is no longer current); its token stays used."""

    @abc.abstractmethod
    async def aget_lease(self, session_id: str) -> SessionLease | None:
        """The session's current lease row (possibly lapsed), or None if it never had one."""

    async def await_control(self, session_id: str, *, after: int = 0, timeout: float = 1.0) -> list[ControlItem]:
        """Wait up to ``timeout`` seconds for control items after ``after``; [] if none arrived.

        This default polls ``alist_control``; a store that can be notified (PostgreSQL's
        LISTEN/NOTIFY) overrides it to wake as soon as an item is appended.
        """
        deadline = time.monotonic() + timeout
        while True:
            items = await self.alist_control(session_id, after=after)
            remaining = deadline - time.monotonic()
            if items or remaining <= 0:
                return items
            await asyncio.sleep(min(_CONTROL_POLL_SECONDS, remaining))

    @abc.abstractmethod
    async def aput_blobs(self, blobs: Mapping[str, bytes]) -> None:
        """Store content-addressed blobs (key = sha256 hex of the bytes, verified)."""

    @abc.abstractmethod
    async def aget_blobs(self, digests: Iterable[str]) -> dict[str, bytes]:
        """The stored blobs among ``digests`` (absent digests are absent from the result)."""

    @abc.abstractmethod
    async def aprune(self, *, keep: Iterable[str] = ()) -> PruneReport:
        """Delete snapshots not reachable from a head or ``keep`` (with their writes), then the
        blobs that only they mentioned (see :func:`mentioned_digests`)."""

    @abc.abstractmethod
    async def avacuum(self) -> None:
        """Reclaim space freed by pruning."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Release the store's resources."""

    # ---- reads made of others here; a store with a cheaper way overrides both twins

    def get_session_heads(self, session_ids: Iterable[str]) -> dict[str, SessionHeadRecord]:
        """The heads of those of ``session_ids`` that exist, by session id."""
        heads = {}
        for session_id in session_ids:
            head = self.get_session_head(session_id)
            if head is not None:
                heads[session_id] = head
        return heads

    async def aget_session_heads(self, session_ids: Iterable[str]) -> dict[str, SessionHeadRecord]:
        """Async twin of :meth:`get_session_heads`."""
        heads = {}
        for session_id in session_ids:
            head = await self.aget_session_head(session_id)
            if head is not None:
                heads[session_id] = head
        return heads

    def load_chain_with_writes(
        self, session_id: str, snapshot_id: str
    ) -> tuple[list[SessionSnapshot], list[StepWrite]]:
        """What restoring ``session_id`` at its head ``snapshot_id`` reads: :meth:`load_chain` of
        the snapshot and the session's pending writes on it (:meth:`get_writes`), perhaps at once."""
        return self.load_chain(snapshot_id), self.get_writes(session_id, snapshot_id)

    async def aload_chain_with_writes(
        self, session_id: str, snapshot_id: str
    ) -> tuple[list[SessionSnapshot], list[StepWrite]]:
        """Async twin of :meth:`load_chain_with_writes`."""
        return await self.aload_chain(snapshot_id), await self.aget_writes(session_id, snapshot_id)

    def get_session_positions(
        self, session_ids: Iterable[str], *, lifecycles: Iterable[str] | None = None
    ) -> dict[str, SessionPosition]:
        """Where the heads of those of ``session_ids`` that exist (and are in one of ``lifecycles``,
        when given) stand, by session id: what :meth:`get_session_heads` says without the metadata
        (a store may read less for it)."""
        wanted = name_set(lifecycles, "lifecycles")
        return _positions(self.get_session_heads(session_ids), wanted)

    async def aget_session_positions(
        self, session_ids: Iterable[str], *, lifecycles: Iterable[str] | None = None
    ) -> dict[str, SessionPosition]:
        """Async twin of :meth:`get_session_positions`."""
        wanted = name_set(lifecycles, "lifecycles")
        return _positions(await self.aget_session_heads(session_ids), wanted)

    # ---- sync twins: delegate via asyncio.run

    def get_session_head(self, session_id: str) -> SessionHeadRecord | None:
        """Read the current mutable head for one session (None if there is no such session)."""
        return _run_sync(self.aget_session_head(session_id), "get_session_head")

    def commit_session_snapshot(self, request: SessionSnapshotCommit) -> SessionCommitReceipt:
        """Atomically persist an immutable snapshot (and blobs) and advance its head (CAS)."""
        return _run_sync(self.acommit_session_snapshot(request), "commit_session_snapshot")

    def find_session_by_operation(self, operation_id: str) -> str | None:
        """The session a commit with this ``operation_id`` created, or None."""
        return _run_sync(self.afind_session_by_operation(operation_id), "find_session_by_operation")

    def get_snapshot(self, snapshot_id: str) -> SessionSnapshot:
        """Read one verified snapshot; SnapshotNotFoundError or SnapshotIntegrityError."""
        return _run_sync(self.aget_snapshot(snapshot_id), "get_snapshot")

    def load_chain(self, snapshot_id: str) -> list[SessionSnapshot]:
        """The snapshot and its ancestors back to and including its base, oldest first, verified."""
        return _run_sync(self.aload_chain(snapshot_id), "load_chain")

    def list_sessions(self, *, lifecycles: Iterable[str] | None = None) -> list[SessionHeadRecord]:
        """Every session head (only those in ``lifecycles``, when given), in creation order."""
        return _run_sync(self.alist_sessions(lifecycles=lifecycles), "list_sessions")

    def list_session_snapshots(self, session_id: str) -> list[str]:
        """The session's head chain within the session, newest first."""
        return _run_sync(self.alist_session_snapshots(session_id), "list_session_snapshots")

    def put_writes(self, writes: Sequence[StepWrite]) -> list[bool]:
        """Store pending writes in one transaction; per write, whether it was new (first wins)."""
        return _run_sync(self.aput_writes(writes), "put_writes")

    def get_writes(self, session_id: str, base_snapshot_id: str) -> list[StepWrite]:
        """Pending writes of the step that started at ``base_snapshot_id``, in write order."""
        return _run_sync(self.aget_writes(session_id, base_snapshot_id), "get_writes")

    def append_control(self, session_id: str, kind: str, payload: Mapping[str, Any]) -> ControlItem:
        """Durably append one control item; the store assigns its position."""
        return _run_sync(self.aappend_control(session_id, kind, payload), "append_control")

    def list_control(self, session_id: str, *, after: int = 0, kinds: Iterable[str] | None = None) -> list[ControlItem]:
        """Control items with position > ``after`` (optionally only ``kinds``), by position."""
        return _run_sync(self.alist_control(session_id, after=after, kinds=kinds), "list_control")

    def acquire_lease(
        self, session_id: str, owner: str, *, ttl_seconds: float, take_over_from: str | None = None
    ) -> SessionLease:
        """Take (or, for its owner, renew) the session's lease; SessionBusyError if another owner holds it.

        ``take_over_from`` names a holder the caller knows is dead: its live lease is taken over.
        """
        return _run_sync(
            self.aacquire_lease(session_id, owner, ttl_seconds=ttl_seconds, take_over_from=take_over_from),
            "acquire_lease",
        )

    def renew_lease(self, lease: SessionLease, *, ttl_seconds: float) -> SessionLease:
        """Extend a held lease; LeaseLostError if it expired or was taken over."""
        return _run_sync(self.arenew_lease(lease, ttl_seconds=ttl_seconds), "renew_lease")

    def release_lease(self, lease: SessionLease) -> None:
        """Give the lease up now (a no-op if it is no longer current); its token stays used."""
        return _run_sync(self.arelease_lease(lease), "release_lease")

    def get_lease(self, session_id: str) -> SessionLease | None:
        """The session's current lease row (possibly lapsed), or None if it never had one."""
        return _run_sync(self.aget_lease(session_id), "get_lease")

    def wait_for_control(self, session_id: str, *, after: int = 0, timeout: float = 1.0) -> list[ControlItem]:
        """Wait up to ``timeout`` seconds for control items after ``after``; [] if none arrived."""
        return _run_sync(self.await_control(session_id, after=after, timeout=timeout), "wait_for_control")

    def put_blobs(self, blobs: Mapping[str, bytes]) -> None:
        """Store content-addressed blobs (key = sha256 hex of the bytes, verified)."""
        return _run_sync(self.aput_blobs(blobs), "put_blobs")

    def get_blobs(self, digests: Iterable[str]) -> dict[str, bytes]:
        """The stored blobs among ``digests`` (absent digests are absent from the result)."""
        return _run_sync(self.aget_blobs(digests), "get_blobs")

    def prune(self, *, keep: Iterable[str] = ()) -> PruneReport:
        """Delete snapshots not reachable from a head or ``keep`` (with their writes), then the
        blobs that only they mentioned (see :func:`mentioned_digests`)."""
        return _run_sync(self.aprune(keep=keep), "prune")

    def vacuum(self) -> None:
        """Reclaim space freed by pruning."""
        return _run_sync(self.avacuum(), "vacuum")

    def close(self) -> None:
        """Release the store's resources."""
        return _run_sync(self.aclose(), "close")

    # ---- context managers

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class SyncCheckpointStore(CheckpointStore):
    """A store whose native I/O is synchronous: the sync methods are abstract here.

    The async twins run the sync method on this store's own single writer thread, so an event loop
    is never blocked by disk I/O and the calls of many concurrent runs reach the store one at a time,
    in the order they were made (no pool of threads contending for one connection's lock). The
    thread starts on the first async call, is replaced in a child process after ``fork()``, and
    exits at ``aclose()`` (or with the interpreter).
    """

    async def _offload(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Run one sync method off the event loop, on the store's writer thread."""
        call = functools.partial(fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._writer(), call)

    def _writer(self) -> concurrent.futures.ThreadPoolExecutor:
        state: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = self.__dict__.get("_qitos_writer")
        pid = os.getpid()
        if state is None or state[0] != pid:
            with _WRITER_LOCK:
                state = self.__dict__.get("_qitos_writer")
                if state is None or state[0] != pid:
                    name = f"qitos-store-{type(self).__name__}"
                    state = (pid, concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name))
                    self.__dict__["_qitos_writer"] = state
        return state[1]

    # ---- sync methods: abstract

    @abc.abstractmethod
    def get_session_head(self, session_id: str) -> SessionHeadRecord | None: ...

    @abc.abstractmethod
    def commit_session_snapshot(self, request: SessionSnapshotCommit) -> SessionCommitReceipt: ...

    @abc.abstractmethod
    def find_session_by_operation(self, operation_id: str) -> str | None: ...

    @abc.abstractmethod
    def get_snapshot(self, snapshot_id: str) -> SessionSnapshot: ...

    @abc.abstractmethod
    def load_chain(self, snapshot_id: str) -> list[SessionSnapshot]: ...

    @abc.abstractmethod
    def list_sessions(self, *, lifecycles: Iterable[str] | None = None) -> list[SessionHeadRecord]: ...

    @abc.abstractmethod
    def list_session_snapshots(self, session_id: str) -> list[str]: ...

    @abc.abstractmethod
    def put_writes(self, writes: Sequence[StepWrite]) -> list[bool]: ...

    @abc.abstractmethod
    def get_writes(self, session_id: str, base_snapshot_id: str) -> list[StepWrite]: ...

    @abc.abstractmethod
    def append_control(self, session_id: str, kind: str, payload: Mapping[str, Any]) -> ControlItem: ...

    @abc.abstractmethod
    def list_control(
        self, session_id: str, *, after: int = 0, kinds: Iterable[str] | None = None
    ) -> list[ControlItem]: ...

    @abc.abstractmethod
    def acquire_lease(
        self, session_id: str, owner: str, *, ttl_seconds: float, take_over_from: str | None = None
    ) -> SessionLease: ...

    @abc.abstractmethod
    def renew_lease(self, lease: SessionLease, *, ttl_seconds: float) -> SessionLease: ...

    @abc.abstractmethod
    def release_lease(self, lease: SessionLease) -> None: ...

    @abc.abstractmethod
    def get_lease(self, session_id: str) -> SessionLease | None: ...

    def wait_for_control(self, session_id: str, *, after: int = 0, timeout: float = 1.0) -> list[ControlItem]:
        """Wait up to ``timeout`` seconds for control items after ``after`` (polling); [] if none arrived."""
        deadline = time.monotonic() + timeout
        while True:
            items = self.list_control(session_id, after=after)
            remaining = deadline - time.monotonic()
            if items or remaining <= 0:
                return items
            time.sleep(min(_CONTROL_POLL_SECONDS, remaining))

    @abc.abstractmethod
    def put_blobs(self, blobs: Mapping[str, bytes]) -> None: ...

    @abc.abstractmethod
    def get_blobs(self, digests: Iterable[str]) -> dict[str, bytes]: ...

    @abc.abstractmethod
    def prune(self, *, keep: Iterable[str] = ()) -> PruneReport: ...

    @abc.abstractmethod
    def vacuum(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    # ---- async twins: run the sync method off the event loop

    async def aget_session_head(self, session_id: str) -> SessionHeadRecord | None:
        return await self._offload(self.get_session_head, session_id)

    async def acommit_session_snapshot(self, request: SessionSnapshotCommit) -> SessionCommitReceipt:
        return await self._offload(self.commit_session_snapshot, request)

    async def afind_session_by_operation(self, operation_id: str) -> str | None:
        return await self._offload(self.find_session_by_operation, operation_id)

    async def aget_snapshot(self, snapshot_id: str) -> SessionSnapshot:
        return await self._offload(self.get_snapshot, snapshot_id)

    async def aload_chain(self, snapshot_id: str) -> list[SessionSnapshot]:
        return await self._offload(self.load_chain, snapshot_id)

    async def alist_sessions(self, *, lifecycles: Iterable[str] | None = None) -> list[SessionHeadRecord]:
        return await self._offload(self.list_sessions, lifecycles=lifecycles)

    async def alist_session_snapshots(self, session_id: str) -> list[str]:
        return await self._offload(self.list_session_snapshots, session_id)

    async def aput_writes(self, writes: Sequence[StepWrite]) -> list[bool]:
        return await self._offload(self.put_writes, writes)

    async def aget_writes(self, session_id: str, base_snapshot_id: str) -> list[StepWrite]:
        return await self._offload(self.get_writes, session_id, base_snapshot_id)

    async def aappend_control(self, session_id: str, kind: str, payload: Mapping[str, Any]) -> ControlItem:
        return await self._offload(self.append_control, session_id, kind, payload)

    async def alist_control(
        self, session_id: str, *, after: int = 0, kinds: Iterable[str] | None = None
    ) -> list[ControlItem]:
        return await self._offload(self.list_control, session_id, after=after, kinds=kinds)

    async def aacquire_lease(
        self, session_id: str, owner: str, *, ttl_seconds: float, take_over_from: str | None = None
    ) -> SessionLease:
        return await self._offload(
            self.acquire_lease, session_id, owner, ttl_seconds=ttl_seconds, take_over_from=take_over_from
        )

    async def arenew_lease(self, lease: SessionLease, *, ttl_seconds: float) -> SessionLease:
        return await self._offload(self.renew_lease, lease, ttl_seconds=ttl_seconds)

    async def arelease_lease(self, lease: SessionLease) -> None:
        await self._offload(self.release_lease, lease)

    async def aget_lease(self, session_id: str) -> SessionLease | None:
        return await self._offload(self.get_lease, session_id)

    async def aput_blobs(self, blobs: Mapping[str, bytes]) -> None:
        await self._offload(self.put_blobs, blobs)

    async def aget_blobs(self, digests: Iterable[str]) -> dict[str, bytes]:
        return await self._offload(self.get_blobs, digests)

    async def aprune(self, *, keep: Iterable[str] = ()) -> PruneReport:
        return await self._offload(self.prune, keep=keep)

    async def avacuum(self) -> None:
        await self._offload(self.vacuum)

    async def aclose(self) -> None:
        await self._offload(self.close)
        state = self.__dict__.pop("_qitos_writer", None)
        if state is not None and state[0] == os.getpid():
            state[1].shutdown(wait=False)


_WRITER_LOCK = threading.Lock()
