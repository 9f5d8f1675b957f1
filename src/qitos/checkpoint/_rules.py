"""The rules every checkpoint store shares, free of I/O: validation, verification, leases, fences.

A store does the I/O; these functions decide. They check what a caller hands in (names, blobs,
control items, lease durations), compute the digest kept beside each mutable row and verify a row
read back against it (an :class:`~qitos.core._errors.IntegrityError` names the table, the row and
the session), grant and renew leases by the store's clock, and refuse a write whose fencing token
is not the session's live lease. Every store applies the same rules, so they agree to the byte.
"""

from __future__ import annotations

import hashlib
import json
import operator
import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any, Final

from qitos.checkpoint._records import (
    BlobIntegrityError,
    SessionHeadRecord,
    SessionLease,
    SessionPosition,
    SnapshotNotFoundError,
    StepWrite,
    json_text,
    require_str,
)
from qitos.core._errors import (
    CheckpointError,
    IntegrityError,
    LeaseLostError,
    SessionBusyError,
    SnapshotIntegrityError,
    UsageError,
)

__all__ = [
    "MAX_CHAIN",
    "NO_WRITES_DIGEST",
    "chain_oldest_first",
    "check_after",
    "check_blobs",
    "check_control",
    "check_fence",
    "check_lease_owner",
    "check_lease_ttl",
    "check_write_base",
    "control_digest",
    "fold_write_digests",
    "head_digest",
    "mentioned_digests",
    "metadata_digest",
    "name_set",
    "next_lease",
    "renewed_lease",
    "stored_object",
    "stored_text",
    "verified_head",
    "verified_position",
    "verified_step_writes",
    "verified_write",
    "write_digest",
]


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
    require_str(session_id, "session_id")
    require_str(kind, "control kind")
    return json_text(payload, f"control {kind}.payload")


def check_lease_ttl(ttl_seconds: float) -> float:
    """A lease duration must be a positive number of seconds."""
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int | float) or not ttl_seconds > 0:
        raise UsageError(f"ttl_seconds must be a positive number of seconds, got {ttl_seconds!r}")
    return float(ttl_seconds)


def check_lease_owner(owner: str, take_over_from: str | None = None) -> None:
    """A lease owner (and the owner a lease is taken over from, if any) must be non-empty strings."""
    require_str(owner, "lease owner")
    require_str(take_over_from, "take_over_from", optional=True)


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


# The head's tally of its unfinished step's pending writes: how many there are and the XOR of their
# row digests. Every store keeps it in the head row, moved in the same transaction as the writes and
# reset by the commit that ends the step, so a pending write whose row was lost, or whose key
# columns (the session, the base snapshot) were altered so that it no longer reads as the step's, is
# detected rather than taken for a call that never started. XOR folds a batch in any order, so a
# store can fold it in SQL.
NO_WRITES_DIGEST: Final = 0


def fold_write_digests(fold: int, digests: Iterable[str]) -> int:
    """``fold`` with the row digests ``digests`` (64 hex digits each) folded in by XOR."""
    for digest in digests:
        fold ^= int(digest, 16)
    return fold


def verified_step_writes(
    session_id: str, base_snapshot_id: str, count: int, fold: int, writes: list[StepWrite], digests: list[str]
) -> list[StepWrite]:
    """The verified pending writes on the head ``base_snapshot_id``, checked against the head's tally
    (``count`` writes whose row digests fold to ``fold``); IntegrityError names what does not match."""
    if len(writes) != count or fold_write_digests(NO_WRITES_DIGEST, digests) != fold:
        found = len(writes)
        if found < count:
            reason = f"the head records {count} pending write(s) of its unfinished step, {found} are stored: "
            reason += "a row is missing or its session or base snapshot was altered"
        elif found > count:
            reason = f"{found} pending write(s) are stored on the head, which records {count}: "
            reason += "rows were added outside the store, or the head row is damaged"
        else:
            reason = f"the {count} stored pending write(s) are not the ones the head records (their digests differ)"
        raise IntegrityError("writes", f"step on {base_snapshot_id}", reason, session_id=session_id)
    return writes


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
