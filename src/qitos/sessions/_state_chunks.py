"""Large list fields of a base snapshot's state, stored as content-addressed chunks (format 2).

A base snapshot (one holding a full state) does not copy a long list field into its payload.
The list is cut into runs of items, each run stored once as a blob (the canonical JSON array of its
items, key = SHA-256 of the stored bytes), and the payload lists the runs in order::

    state: {"full": {<other fields>}, "chunks": {"notes": [[digest, count, nbytes], ...]}}

The next base of a field that only grew by appends since (``extend`` ops) reuses every closed run
and writes runs for the new items only, so a base costs what is new plus one reference per run, not
the size of the state. A field changed any other way is cut again from its start; cutting is
deterministic, so runs equal to stored ones are deduplicated by their digest.

A blob is the JSON text, as a Zstandard frame when that is at least 10% smaller
(``qitos.checkpoint._packing``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from qitos.checkpoint._packing import PackingError, pack_or_raw, unpack
from qitos.core._codec import canonical_json, sha256_hex

__all__ = ["CHUNK_BYTES", "MIN_CHUNKED_BYTES", "ChunkRef", "chunk_list", "join_chunks", "parse_refs", "reusable_runs"]

CHUNK_BYTES = 32 * 1024
"""A run is closed once its items' JSON reaches this many characters."""
MIN_CHUNKED_BYTES = 8 * 1024
"""A list whose JSON is shorter stays inline in the payload."""


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """One stored run of a list field: its blob digest, item count and JSON text size in bytes."""

    digest: str
    count: int
    nbytes: int

    def to_list(self) -> list[Any]:
        """The payload form ``[digest, count, nbytes]``."""
        return [self.digest, self.count, self.nbytes]


def parse_refs(value: Any) -> list[ChunkRef]:
    """A payload's run list for one field; ValueError if it is not ``[[digest, count, nbytes], ...]``."""
    if not isinstance(value, list):
        raise ValueError(f"chunk references must be a list, got {type(value).__name__}")
    refs = []
    for item in value:
        if (
            not isinstance(item, list)
            or len(item) != 3
            or not isinstance(item[0], str)
            or not all(type(n) is int and n >= 0 for n in item[1:])
        ):
            raise ValueError(f"bad chunk reference {item!r}")
        refs.append(ChunkRef(item[0], item[1], item[2]))
    return refs


def reusable_runs(refs: list[ChunkRef] | None, length: int) -> list[ChunkRef]:
    """The runs of the previous base to keep for a list, now ``length`` items long, that only grew
    by appends since: all of them except a last run below half of :data:`CHUNK_BYTES`, which is
    reopened so that runs do not shrink to a few items each."""
    if not refs or sum(ref.count for ref in refs) > length:
        return []
    kept = list(refs)
    if kept[-1].nbytes < CHUNK_BYTES // 2:
        kept.pop()
    return kept


def chunk_list(items: list[Any], kept: list[ChunkRef] | None = None) -> tuple[list[ChunkRef], dict[str, bytes]] | None:
    """Cut encoded ``items`` (the list's items after the ``kept`` runs) into runs; return all the
    refs and the new blobs to store, or None when nothing is kept and the list is short enough to
    stay inline."""
    texts = [canonical_json(item) for item in items]
    if not kept and sum(len(text) + 1 for text in texts) < MIN_CHUNKED_BYTES:
        return None
    refs = list(kept or ())
    blobs: dict[str, bytes] = {}
    run: list[str] = []
    size = 0
    for text in texts:
        run.append(text)
        size += len(text) + 1
        if size >= CHUNK_BYTES:
            refs.append(_store_run(run, blobs))
            run, size = [], 0
    if run:
        refs.append(_store_run(run, blobs))
    return refs, blobs


def _store_run(texts: list[str], blobs: dict[str, bytes]) -> ChunkRef:
    text = ("[" + ",".join(texts) + "]").encode("utf-8")
    raw = pack_or_raw(text, level=3)
    digest = sha256_hex(raw)
    blobs[digest] = raw
    return ChunkRef(digest, len(texts), len(text))


def join_chunks(refs: list[ChunkRef], blobs: Mapping[str, bytes]) -> list[Any]:
    """The list stored as ``refs`` (blobs already verified against their digests); ValueError
    names the first run that is missing, unreadable or not holding its count of items."""
    # Run by run: each run's text is a transient buffer of ~CHUNK_BYTES that the next run reuses,
    # where joining the runs first would touch the whole state's size in new memory twice more.
    items: list[Any] = []
    for ref in refs:
        raw = blobs.get(ref.digest)
        if raw is None:
            raise ValueError(f"state chunk {ref.digest} is missing")
        try:
            run = json.loads(unpack(raw))
        except (PackingError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            raise ValueError(f"state chunk {ref.digest} is unreadable: {exc}") from exc
        if type(run) is not list or len(run) != ref.count:
            raise ValueError(f"state chunk {ref.digest} does not hold the {ref.count} items its reference counts")
        items.extend(run)
    return items
