"""The checkpoint store's records and errors: what a store reads, writes and raises.

Every record is a frozen, keyword-only dataclass. A :class:`SessionSnapshot` is content-addressed:
its id is the SHA-256 of the canonical JSON of its content (:func:`snapshot_digest`), so a stored
snapshot can always be verified. The contract that reads and writes them is
``qitos.checkpoint.store``; the rules every store applies to them (verification, leases, fences)
are in ``qitos.checkpoint._rules``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from json.encoder import encode_basestring
from typing import Any

from qitos.core._codec import canonical_json
from qitos.core._errors import CheckpointError, CodecError, IntegrityError, SnapshotIntegrityError, UsageError

__all__ = [
    "BlobIntegrityError",
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
    "json_text",
    "require_str",
    "snapshot_content_text",
    "snapshot_digest",
    "utc_now",
]

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


def require_str(value: Any, what: str, *, optional: bool = False) -> None:
    """A non-empty string (or None when ``optional``), else UsageError naming ``what``."""
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
        ``qitos.core._codec`` already produced (the session journal's hot path); the payload is
        still encoded canonically and hashed.
        """
        require_str(session_id, "session_id")
        require_str(parent_id, "parent_id", optional=True)
        require_str(base_id, "base_id", optional=True)
        if not isinstance(sequence, int) or isinstance(sequence, bool) or sequence < 0:
            raise UsageError(f"sequence must be a non-negative int, got {sequence!r}")
        stamp = utc_now() if created_at is None else created_at
        require_str(stamp, "created_at")
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
        require_str(self.session_id, "session_id")
        require_str(self.expected_head, "expected_head", optional=True)
        require_str(self.lifecycle, "lifecycle")
        require_str(self.operation_id, "operation_id", optional=True)
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

    Keyed by ``(session_id, base_snapshot_id, kind, key)``; the first write of a key is kept. The
    writes on a session's head are tallied by the head and deleted by the commit that moves it.
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
        require_str(self.session_id, "StepWrite.session_id")
        require_str(self.base_snapshot_id, "StepWrite.base_snapshot_id")
        require_str(self.kind, "StepWrite.kind")
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
