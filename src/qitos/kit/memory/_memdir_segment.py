"""The memdir file formats: the block format of a segment, and the one-record file.

A segment (``<type>/records.md``) opens with a preamble for people (ignored when read); then each
record is a block: a marker line ``<!-- qitos:record {header} -->`` (canonical JSON of
``created_at``, ``metadata``, ``record_id``, ``role``, ``step_id``, ``type``), the text, a newline.
A text line that would start like a marker (``^\\*<!-- qitos:record``) is written with one more
leading backslash and read with one less, so any text round-trips. A marker line whose header is
not a JSON object with a non-empty string ``record_id`` (a broken hand edit) is a
:class:`MemoryResourceError` naming the file and line: nothing is guessed or folded into a
neighbouring record. A header that is an object with a record id but lacks or mistypes another
field gets that field's default (role ``memory``, step 0, the bucket's type, the file time).

A one-record file (a note dropped in by hand, or an ``r-<sha>.md`` file of the earlier
one-file-per-record layout) is an optional front-matter header (``key: JSON`` lines between
``---`` lines), then the text. Without a record id it gets ``file:<scope>:<relative path>``.

Parsing is the cost of reading a segment another process rewrote, so it is done in bulk: one regex
split, one ``json.loads`` of all headers, and, when every header is complete (as ``append`` writes
it), the headers checked and completed column-wise, so that most per-record work runs in C. A segment of 1,000 blocks or
more is parsed with the cyclic garbage collector paused (the records built hold no cycles).
"""

from __future__ import annotations

import gc
import json
import re
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from itertools import accumulate, repeat
from operator import itemgetter
from pathlib import Path
from typing import Any, NoReturn

from qitos.core._codec import canonical_json, sha256_hex
from qitos.core.memory import MemoryRecord, MemoryResourceError

__all__ = [
    "MARKER",
    "MEMORY_TYPES",
    "PREAMBLE",
    "SEGMENT_NAME",
    "RecordEntry",
    "legacy_file_stem",
    "parse_blocks",
    "read_record_file",
    "render_block",
]

MEMORY_TYPES: tuple[str, ...] = ("feedback", "project", "reference", "runtime", "user")
SEGMENT_NAME = "records.md"
MARKER = "<!-- qitos:record"
PREAMBLE = """\
# QitOS memory segment

This file holds memory records, in the order they were written. Each record starts with a marker
line: an HTML comment holding `qitos:record` and a JSON header (record_id, role, type, step_id,
created_at, metadata). The record's text follows, up to the next marker. You may edit a record's
text or header by hand; keep each marker on its own line. A text line that itself starts like a
marker is stored with one extra leading backslash, removed when read. When a record id appears
twice, the later record wins. Text before the first marker, like this, is ignored.

"""

# (step_id, created_at, record_id, record): the retrieval order, and the record itself.
RecordEntry = tuple[int, str, str, MemoryRecord]

_SEP = "\n" + MARKER
_BLOCK = re.compile(r"\n<!-- qitos:record (.*) -->(\r?)\n")  # a whole marker line, its newlines included
_ESCAPE = re.compile(r"^(\\*<!-- qitos:record)", re.MULTILINE)
_UNESCAPE = re.compile(r"^\\(\\*<!-- qitos:record)", re.MULTILINE)
_TYPES = frozenset(MEMORY_TYPES)
_FIELDS = itemgetter("record_id", "role", "step_id", "metadata", "created_at", "type")
_FIELDS_ONE_BY_ONE = ("record_id", "role", "step_id", "metadata", "created_at")
_COLUMNS_FROM = 16  # blocks; fewer (an append's tail) are quicker one by one
_NOGC_BLOCKS = 1000  # blocks from which the cyclic garbage collector is paused during a parse


# ---------------------------------------------------------------------- writing


def render_block(record: MemoryRecord, memory_type: str, created_at: str) -> str:
    """The segment block of a text record: its marker line, its (escaped) text, a newline.

    Raises TypeError naming the record when its metadata is not JSON-native.
    """
    header = {
        "created_at": created_at,
        "metadata": record.metadata,
        "record_id": record.record_id,
        "role": record.role,
        "step_id": record.step_id,
        "type": memory_type,
    }
    try:
        header_json = canonical_json(header)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"MemdirMemory: metadata of {record.record_id!r} is not JSON-native ({exc})") from exc
    content = str(record.content)
    if MARKER in content:
        content = _ESCAPE.sub(r"\\\1", content)
    return f"{MARKER} {header_json} -->\n{content}\n"


# ---------------------------------------------------------------------- reading a segment


def parse_blocks(
    text: str, *, start: int, path: str, bucket: str, scope: str, mtime_ns: int
) -> tuple[list[int], list[RecordEntry]]:
    """The blocks of segment text from ``start`` (0, or the offset of a marker): their marker
    offsets and entries, in file order.

    ``path`` names the file in errors, ``bucket`` is the segment's type (the default of a header
    without one), ``scope`` is ``local`` or ``global`` (global records get ``metadata["scope"]``),
    and ``mtime_ns`` dates a header without ``created_at``. All headers are decoded by one
    ``json.loads``; only if that fails is each header decoded alone, to name the broken one.
    """
    chunk = "\n" + text[start:] if start else "\n" + text
    markers = chunk.count(_SEP)
    if not markers:
        return [], []
    if markers < _NOGC_BLOCKS:
        return _parse_chunk(chunk, markers, text, start, path, bucket, scope, mtime_ns)
    with _gc_paused():
        return _parse_chunk(chunk, markers, text, start, path, bucket, scope, mtime_ns)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a large segment is parsed (as Mercurial does for
    its parsers): the tens of thousands of dicts and records built, none of them cyclic, would
    otherwise trigger repeated full collections that cost about as much as the parse itself. A
    collector the caller had disabled stays disabled."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _parse_chunk(
    chunk: str, markers: int, text: str, pos: int, path: str, bucket: str, scope: str, mtime_ns: int
) -> tuple[list[int], list[RecordEntry]]:
    starts, headers, bodies = _split_chunk(chunk, markers, text, pos, path)
    try:
        parsed = json.loads("[" + ",".join(headers) + "]")
    except ValueError:
        parsed = None
    if not isinstance(parsed, list) or len(parsed) != len(headers):
        parsed = []
        for header, at in zip(headers, starts, strict=True):
            try:
                parsed.append(json.loads(header))
            except ValueError as exc:
                _bad_marker(text, at, path, f"the header is not JSON ({exc})")
    if text.find("\\" + MARKER, pos) >= 0:
        bodies = [_UNESCAPE.sub(r"\1", body) if "\\" + MARKER in body else body for body in bodies]
    columns = _columns(parsed, bucket) if len(parsed) >= _COLUMNS_FROM else None
    if columns is None:
        return starts, _entries_one_by_one(parsed, bodies, starts, text, path, bucket, scope, mtime_ns)
    record_ids, roles, steps, metadatas, created, types = columns
    # Column-wise, so that the per-record work runs in C: metadata gets its type and created_at
    # (and scope); then the records are built with their constructor and paired with their sort keys.
    _consume(map(dict.setdefault, metadatas, repeat("type"), types))
    _consume(map(dict.__setitem__, metadatas, repeat("created_at"), created))
    if scope == "global":
        _consume(map(dict.__setitem__, metadatas, repeat("scope"), repeat("global")))
    records = list(map(MemoryRecord, roles, bodies, steps, metadatas, record_ids))
    return starts, list(zip(steps, created, record_ids, records, strict=True))


def _split_chunk(chunk: str, markers: int, text: str, pos: int, path: str) -> tuple[list[int], list[str], list[str]]:
    """Marker offsets, header texts and bodies. One regex split when every marker line is whole and
    ends in a newline (as written by ``append``); else line by line, naming a malformed marker."""
    parts = _BLOCK.split(chunk if chunk.endswith("\n") else chunk + "\n")
    if len(parts) == 3 * markers + 1:  # [preamble, header, cr, body, header, cr, body, ...]
        heads, crs, bodies = parts[1::3], parts[2::3], parts[3::3]
        bodies[-1] = bodies[-1][:-1]  # the last block's own newline
        fixed = len(_SEP + " ") + len(" -->\n")
        steps = [fixed + len(h) + len(c) + len(b) for h, c, b in zip(heads, crs, bodies[:-1], strict=False)]
        return list(accumulate(steps, initial=pos + len(parts[0]))), heads, bodies
    pieces = chunk.split(_SEP)
    first = pos + len(pieces.pop(0))
    starts = list(accumulate([len(_SEP) + len(piece) for piece in pieces[:-1]], initial=first))
    split = [piece.partition("\n") for piece in pieces]
    heads, bodies = [part[0].removesuffix("\r") for part in split], [part[2] for part in split]
    if bodies[-1].endswith("\n"):
        bodies[-1] = bodies[-1][:-1]
    for head, at in zip(heads, starts, strict=True):
        if not (head.startswith(" ") and head.endswith(" -->")):
            _bad_marker(text, at, path, "a marker line must read `<!-- qitos:record {JSON header} -->`")
    return starts, [head[1:-4] for head in heads], bodies


def _columns(parsed: list[Any], bucket: str) -> tuple[tuple[Any, ...], ...] | None:
    """The header fields as columns when every header is complete and well typed (what ``append``
    writes), else None: the caller then checks and defaults each header alone."""
    try:
        record_ids, roles, steps, metadatas, created, types = zip(*map(_FIELDS, parsed), strict=True)
    except (KeyError, TypeError, ValueError):
        return None
    for column, kind in ((record_ids, str), (roles, str), (steps, int), (metadatas, dict), (created, str)):
        if set(map(type, column)) != {kind}:
            return None
    if not (all(record_ids) and all(roles)):
        return None
    if set(map(type, types)) != {str} or not _TYPES.issuperset(types):
        types = tuple(t if t in MEMORY_TYPES else bucket for t in types)  # (a tuple: t may be unhashable)
    return record_ids, roles, steps, metadatas, created, types


def _entries_one_by_one(
    parsed: Sequence[object],
    bodies: list[str],
    starts: list[int],
    text: str,
    path: str,
    bucket: str,
    scope: str,
    mtime_ns: int,
) -> list[RecordEntry]:
    """Entries from headers that a hand edit may have left incomplete: a missing or odd field gets
    its default (role ``memory``, step 0, the bucket's type, the file time); a header that is not an
    object or has no record id is an error naming its line."""
    fallback_created = ""
    entries: list[RecordEntry] = []
    for header, body, at in zip(parsed, bodies, starts, strict=True):
        if type(header) is not dict:
            _bad_marker(text, at, path, "the header is not a JSON object")
        record_id, role, step, metadata, created = (header.get(k) for k in _FIELDS_ONE_BY_ONE)
        if type(record_id) is not str or not record_id:
            _bad_marker(text, at, path, "the header has no record_id string")
        if type(role) is not str or not role:
            role = "memory"
        if type(step) is not int:
            step = 0
        if type(metadata) is not dict:
            metadata = {}
        if type(created) is not str:
            created = fallback_created = fallback_created or _iso(mtime_ns)
        memory_type = header.get("type")
        metadata.setdefault("type", memory_type if memory_type in MEMORY_TYPES else bucket)
        metadata["created_at"] = created
        if scope == "global":
            metadata["scope"] = "global"
        record = MemoryRecord(role, body, step, metadata, record_id)
        entries.append((step, created, record_id, record))
    return entries


def _consume(iterator: Iterator[object]) -> None:
    """Run an iterator to its end, keeping nothing."""
    deque(iterator, maxlen=0)


def _bad_marker(text: str, at: int, path: str, why: str) -> NoReturn:
    line = text.count("\n", 0, at) + 1
    raise MemoryResourceError(
        f"memory segment {path}, line {line}: {why}; fix the line, or start it with a backslash to make it text",
        resource=path,
    )


# ---------------------------------------------------------------------- one-record files


def read_record_file(text: str, *, path: Path, root: Path, scope: str, mtime_ns: int) -> MemoryRecord:
    """The record of a one-record file: an optional front-matter header (``key: JSON`` lines
    between ``---``), then text. Missing fields get defaults: the type from the parent folder (else
    ``project``), the file time, role ``memory``, step 0, the id ``file:<scope>:<path under root>``."""
    header: dict[str, Any] = {}
    body = text
    if text.startswith("---\n"):
        end = text.find("\n---\n", 3)
        if end < 0 and text.endswith("\n---"):
            end = len(text) - 4
        if end >= 0:
            for raw in text[4:end].splitlines():
                key, sep, value = raw.partition(":")
                if not sep:
                    continue
                key, value = key.strip(), value.strip()
                try:
                    header[key] = json.loads(value)
                except json.JSONDecodeError:
                    header[key] = value
            body = text[end + 5 :]
    metadata = header.get("metadata") if isinstance(header.get("metadata"), dict) else {}
    metadata = dict(metadata or {})
    memory_type = header.get("type")
    if not isinstance(memory_type, str) or memory_type not in MEMORY_TYPES:
        parent = path.parent.name
        memory_type = parent if parent in MEMORY_TYPES else "project"
    metadata.setdefault("type", memory_type)
    created = header.get("created_at")
    metadata["created_at"] = created if isinstance(created, str) else _iso(mtime_ns)
    if scope == "global":
        metadata["scope"] = "global"
    record_id = header.get("record_id")
    if not isinstance(record_id, str) or not record_id:
        record_id = f"file:{scope}:{path.relative_to(root).as_posix()}"
        body = body.strip()
    step = header.get("step_id")
    role = header.get("role")
    return MemoryRecord(
        role=role if isinstance(role, str) and role else "memory",
        content=body,
        step_id=step if isinstance(step, int) and not isinstance(step, bool) else 0,
        metadata=metadata,
        record_id=record_id,
    )


def legacy_file_stem(record_id: str) -> str:
    """The file stem the earlier one-file-per-record layout used for a record id."""
    return "r-" + sha256_hex(record_id)[:40]


def _iso(mtime_ns: int) -> str:
    return datetime.fromtimestamp(mtime_ns / 1e9, UTC).isoformat()
