"""Memdir memory: append-only Markdown segment files under a root directory, with a MEMORY.md index.

Layout::

    <root>/MEMORY.md           readable index, newest last, at most max_index_entries lines and
                               max_index_chars characters; a line names the segment and the record id
    <root>/<type>/records.md   the type bucket's append-only segment, holding many records
    <root>/**/<other>.md       one record per file: notes dropped in by hand, or r-<sha>.md files of
                               the earlier one-file-per-record layout (front-matter header optional)

``type`` is ``user``, ``feedback``, ``project``, ``reference`` or ``runtime`` (``metadata["type"]``,
else the role, else ``project``). A segment opens with a preamble for people (ignored when read);
then each record is a block: a marker line ``<!-- qitos:record {header} -->`` (canonical JSON of
``created_at``, ``metadata``, ``record_id``, ``role``, ``step_id``, ``type``), the text, a newline.
A text line that would start like a marker (``^\\*<!-- qitos:record``) is written with one more
leading backslash and read with one less, so any text round-trips. Within a segment the last block
of a record id wins. A file without a header gets the id ``file:<scope>:<relative path>``, role
``memory`` and step 0. A marker line whose header is not a JSON object with a non-empty string
``record_id`` (a broken hand edit) makes reads fail with :class:`MemoryResourceError` naming the
file and line: nothing is guessed or folded into a neighbouring record. Fix it, or start the line
with a backslash to make it text.

Writing. Writers of one root take turns on an exclusive ``flock`` of the root directory. Under it an
append checks the local segments afresh (an lstat each; one-record files as of the last full read,
and reads rank those below a segment anyway), writes a new id as one ``write()`` of its block on an
``O_APPEND`` descriptor and publishes the index: about half a millisecond in all here. An id that
exists, and ``delete`` (which reads everything afresh), rewrite the segment atomically (temporary
file, ``os.replace``) without the old block; a record whose type changed leaves its old bucket, and
a one-record file holding the id is unlinked. Names never come from a record id, role or metadata;
writes go through directory descriptors opened with ``O_NOFOLLOW``: nothing is written outside the
root, symlinks are never followed (a symlinked bucket or segment is refused, a symlinked note
skipped). The index is published by overwriting a hidden spare and renaming it over ``MEMORY.md``
(the old index becomes the spare): readers see a whole index, and no non-empty file is released,
which here costs several times the write.

Freshness and cost. Every ``retrieve`` reads the disk: a walk of the root and buckets and one
``lstat`` per file. A file's records are cached under its ``(mtime_ns, ctime_ns, size, inode)``.
A segment whose key changed is read again; if it still starts with the cached text up to the cached
last block, only the tail from there is parsed (another process's append costs one read and compare
of the file plus the new blocks), else the whole file is (one regex split, one ``json.loads`` of
all headers, records built column-wise). Unchanged files reuse the previous ordered list. Records
are de-duplicated by ``record_id``: local over global; within a scope a segment over a one-record
file, the newer ``created_at`` between segments. Like any metadata-keyed cache, a same-size edit
within the file system's timestamp granularity of the previous write goes unseen until the next.
"""

from __future__ import annotations

import errno
import fcntl
import gc
import json
import os
import re
import stat as stat_mod
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from itertools import accumulate, repeat
from operator import itemgetter
from pathlib import Path
from typing import Any, NoReturn
from uuid import uuid4

from qitos.core.codec import canonical_json, sha256_hex
from qitos.core.memory import MemoryRecord, MemoryResourceError

__all__ = ["MEMORY_TYPES", "SEGMENT_NAME", "MemdirMemory", "filter_records"]

MEMORY_TYPES: tuple[str, ...] = ("feedback", "project", "reference", "runtime", "user")
SEGMENT_NAME = "records.md"
_INDEX = "MEMORY.md"
_SPARE = ".MEMORY.md.spare"
_SWAP = ".MEMORY.md.swap"
_MARK = "<!-- qitos:record"
_SEP = "\n" + _MARK
_BLOCK = re.compile(r"\n<!-- qitos:record (.*) -->(\r?)\n")  # a whole marker line, its newlines included
_ESCAPE = re.compile(r"^(\\*<!-- qitos:record)", re.MULTILINE)
_UNESCAPE = re.compile(r"^\\(\\*<!-- qitos:record)", re.MULTILINE)
_PREAMBLE = """\
# QitOS memory segment

This file holds memory records, in the order they were written. Each record starts with a marker
line: an HTML comment holding `qitos:record` and a JSON header (record_id, role, type, step_id,
created_at, metadata). The record's text follows, up to the next marker. You may edit a record's
text or header by hand; keep each marker on its own line. A text line that itself starts like a
marker is stored with one extra leading backslash, removed when read. When a record id appears
twice, the later record wins. Text before the first marker, like this, is ignored.

"""
_INDEX_HEADER = "# MEMORY\n\n"
_QUERY_KEYS = frozenset({"roles", "type", "contains", "record_ids", "max_items"})
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK

_Key = tuple[int, int, int, int]
# (step_id, created_at, record_id, record): the retrieval order, and the record itself.
_Entry = tuple[int, str, str, MemoryRecord]


def filter_records(records: Iterable[MemoryRecord], query: Mapping[str, Any] | None) -> list[MemoryRecord]:
    """Apply a memory query (see :mod:`qitos.core.memory`) to records already in order."""
    query = dict(query or {})
    unknown = set(query) - _QUERY_KEYS
    if unknown:
        raise ValueError(f"memory query: unknown key(s) {sorted(unknown)}; known: {sorted(_QUERY_KEYS)}")
    roles = query.get("roles")
    if roles is not None and (isinstance(roles, str) or not isinstance(roles, Iterable)):
        raise ValueError("memory query: 'roles' must be a list of role names")
    role_set = None if roles is None else {str(r) for r in roles}
    wanted_type = query.get("type")
    contains = str(query.get("contains") or "").lower()
    ids = query.get("record_ids")
    id_set = None if ids is None else {str(i) for i in ids}
    max_items = query.get("max_items", 50)
    if max_items is not None and (not isinstance(max_items, int) or isinstance(max_items, bool) or max_items < 0):
        raise ValueError(f"memory query: 'max_items' must be an int >= 0 or None, got {max_items!r}")
    if role_set is None and wanted_type is None and not contains and id_set is None:
        out = list(records)
    else:
        out = [
            r
            for r in records
            if (role_set is None or r.role in role_set)
            and (wanted_type is None or r.metadata.get("type") == wanted_type)
            and (not contains or contains in str(r.content).lower())
            and (id_set is None or r.record_id in id_set)
        ]
    if max_items:
        out = out[-max_items:]
    return out


@dataclass(slots=True, eq=False)
class _File:
    """What one file held when last read: its key, its text (segments) and its records."""

    path: str
    key: _Key
    scope: str
    bucket: str | None  # the type bucket of a segment; None for a one-record file
    parts: list[str]  # the segment's text, joined lazily (own appends add parts)
    length: int  # characters in the segment's text
    starts: list[int]  # character offset of each block's marker
    entries: list[_Entry]  # one per block, in file order
    by_id: dict[str, _Entry]  # the last block of each record id

    def text(self) -> str:
        if len(self.parts) != 1:
            self.parts[:] = ["".join(self.parts)]
        return self.parts[0]


class MemdirMemory:
    """Persist text records with stable identity and fresh disk retrieval.

    Restore is the default and fails if a bound root is missing. Pass
    ``create=True`` only to explicitly initialize a namespace. ``reset`` and
    ``evict`` affect the append-time cache only; ``delete`` removes a local fact.
    Arbitrary Python/JSON content and metadata are not a durable round-trip API.
    """

    def __init__(
        self,
        memory_dir: str = ".qitos/memory",
        *,
        global_memory_dir: str | None = None,
        create: bool = False,
        max_index_entries: int = 200,
        max_index_chars: int = 25000,
    ) -> None:
        for name, value in (("max_index_entries", max_index_entries), ("max_index_chars", max_index_chars)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"MemdirMemory: {name} must be a positive int, got {value!r}")
        self.memory_dir = Path(memory_dir).expanduser().resolve()
        self.global_memory_dir = None if global_memory_dir is None else Path(global_memory_dir).expanduser().resolve()
        self.max_index_entries = max_index_entries
        self.max_index_chars = max_index_chars
        self._recent: dict[str, MemoryRecord] = {}  # the append-time cache, oldest first
        self._roots: list[tuple[str, Path]] = [("local", self.memory_dir)]
        if self.global_memory_dir is not None:
            self._roots.append(("global", self.global_memory_dir))
        self._segments = {str(root / t / SEGMENT_NAME): t for _, root in self._roots for t in MEMORY_TYPES}
        self._local_segments = {t: str(self.memory_dir / t / SEGMENT_NAME) for t in MEMORY_TYPES}
        self._scanned = False  # whether a full scan has run (before it, writes scan fully)
        self._cache: dict[str, _File] = {}
        self._keys: dict[str, _Key] = {}
        self._merged: dict[str, _Entry] | None = None
        self._ordered: list[MemoryRecord] | None = None
        self._last: _Entry | None = None
        if create:
            self._ensure_layout()
        self._require_roots()

    # ------------------------------------------------------------------ Memory protocol

    def append(self, record: MemoryRecord) -> None:
        """Append the record to its type's segment (replacing a record with its id) and index it."""
        self._require_roots()
        if not isinstance(record, MemoryRecord):
            raise TypeError(f"MemdirMemory.append: expected a MemoryRecord, got {type(record).__name__}")
        if not isinstance(record.content, str):
            raise TypeError(
                f"MemdirMemory persists text records only; record {record.record_id!r} has "
                f"{type(record.content).__name__} content"
            )
        memory_type = _memory_type(record)
        header = {
            "created_at": datetime.now(UTC).isoformat(),
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
        content = record.content
        if _MARK in content:
            content = _ESCAPE.sub(r"\\\1", content)
        block = f"{_MARK} {header_json} -->\n{content}\n"
        record_id = record.record_id
        target = self._local_segments[memory_type]
        with self._locked() as root_fd:
            self._refresh_for_write(root_fd)  # a fresh view under the lock: which local files hold this id now
            holders = [f for f in self._cache.values() if f.scope == "local" and record_id in f.by_id]
            bucket_fd = self._open_bucket(root_fd, memory_type)
            try:
                segment = self._cache.get(target)
                if segment is not None and record_id in segment.by_id:
                    self._rewrite(bucket_fd, segment, drop=record_id, add=block)
                else:
                    self._append_block(bucket_fd, target, memory_type, block)
            finally:
                os.close(bucket_fd)
            for held in holders:  # the id's old home in another bucket or an old per-record file
                if held.path != target:
                    self._remove(root_fd, held, record_id)
            self._update_index(root_fd, add=(memory_type, record), remove=record_id)
        self._recent.pop(record_id, None)
        self._recent[record_id] = record

    def retrieve(
        self, query: dict[str, Any] | None = None, state: Any = None, observation: Any = None
    ) -> list[MemoryRecord]:
        """Records matching ``query`` (see :func:`filter_records`), oldest first, read fresh."""
        self._require_roots()
        return filter_records(self._scan(), query)

    def summarize(self, max_items: int = 30) -> str:
        """Render current records, never stale index snippets after external edits."""
        records = self.retrieve({"max_items": max_items})
        lines = ["# MEMORY", ""]
        lines += [f"- [{r.metadata.get('type', 'project')}] {r.role} (step {r.step_id}): {r.content}" for r in records]
        text = "\n".join(lines)
        return text if len(text) <= self.max_index_chars else text[: self.max_index_chars]

    def reset(self, run_id: str | None = None) -> None:
        """Clear the append-time cache; files on disk are untouched."""
        self._recent.clear()

    def evict(self) -> int:
        """Trim the append-time cache to ``max_index_entries``; returns how many were dropped."""
        removed = max(0, len(self._recent) - self.max_index_entries)
        for record_id in list(self._recent)[:removed]:
            del self._recent[record_id]
        return removed

    def delete(self, record_id: str) -> bool:
        """Forget one logical record in this namespace, never global memory.

        Idempotent for an absent identity. This is local-file deletion, not
        secure erasure or a concurrent multi-file transaction. Callers serialize
        writes to one Memdir namespace; use a transactional backend otherwise.
        """
        self._require_roots()
        with self._locked() as root_fd:
            self._scan()  # a full scan: every local file that holds the id goes
            holders = [f for f in self._cache.values() if f.scope == "local" and record_id in f.by_id]
            for held in holders:
                self._remove(root_fd, held, record_id)
            if holders:
                self._update_index(root_fd, add=None, remove=record_id)
        self._recent.pop(record_id, None)
        return bool(holders)

    # ------------------------------------------------------------------ reading

    def _require_roots(self) -> None:
        for _, root in self._roots:
            if not root.is_dir():
                raise MemoryResourceError(
                    f"memory root {root} is missing; pass create=True to initialize a new memory", resource=str(root)
                )

    def _scan(self) -> list[MemoryRecord]:
        """Every current record, oldest first: one walk and one ``lstat`` per file; changed files are
        read again (a grown segment only from its last block on), and the order is reused when
        nothing changed."""
        current: dict[str, _Key] = {}
        scopes: dict[str, str] = {}
        for scope, root in self._roots:
            found = _walk(str(root))
            current.update(found)
            if scope == "global":
                scopes.update(dict.fromkeys(found, scope))
        if current == self._keys and self._ordered is not None:
            return self._ordered
        cache = self._cache
        changed = False
        for path, key in current.items():
            cached = cache.get(path)
            if cached is None or cached.key != key:
                changed = True
                loaded = self._load(path, key, scopes.get(path, "local"), cached)
                if loaded is None:
                    cache.pop(path, None)
                else:
                    cache[path] = loaded
        for gone in cache.keys() - current.keys():
            changed = True
            del cache[gone]
        self._keys = current
        self._scanned = True
        if not changed and self._ordered is not None and self._merged is not None:
            return self._ordered
        return self._merge()

    def _refresh_for_write(self, root_fd: int) -> None:
        """Before a write, under the lock: a full scan the first time, then only the local segments
        (an lstat of each bucket and segment). A one-record file dropped in since the last full
        scan is not looked for: should it hold the id being written, reads prefer the segment."""
        if not self._scanned:
            self._scan()
            return
        for memory_type, path in self._local_segments.items():
            try:
                if not stat_mod.S_ISDIR(os.stat(memory_type, dir_fd=root_fd, follow_symlinks=False).st_mode):
                    raise FileNotFoundError(path)  # a symlinked bucket is never read through
                st = os.stat(f"{memory_type}/{SEGMENT_NAME}", dir_fd=root_fd, follow_symlinks=False)
            except (FileNotFoundError, NotADirectoryError):
                st = None
            cached = self._cache.get(path)
            if st is None or not stat_mod.S_ISREG(st.st_mode):
                if cached is not None:
                    del self._cache[path]
                    self._keys.pop(path, None)
                    self._merged = self._ordered = None
                continue
            key = _key(st)
            if cached is None or cached.key != key:
                loaded = self._load(path, key, "local", cached)
                if loaded is None:
                    self._cache.pop(path, None)
                    self._keys.pop(path, None)
                else:
                    self._cache[path] = loaded
                    self._keys[path] = key
                self._merged = self._ordered = None

    def _load(self, path: str, key: _Key, scope: str, cached: _File | None) -> _File | None:
        try:
            data = _read_bytes(path)
        except (FileNotFoundError, NotADirectoryError):
            return None  # removed since the walk
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return None  # replaced by a symlink since the walk: never followed
            raise MemoryResourceError(f"memory file {path} cannot be read: {exc}", resource=path) from exc
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MemoryResourceError(f"memory file {path} is not UTF-8 text: {exc}", resource=path) from exc
        bucket = self._segments.get(path)
        if bucket is None:
            root = self.global_memory_dir if scope == "global" else self.memory_dir
            assert root is not None
            record = _read_record(text, Path(path), root, scope, key[0])
            entry: _Entry = (record.step_id, record.metadata["created_at"], record.record_id, record)
            return _File(path, key, scope, None, [], 0, [], [entry], {record.record_id: entry})
        if cached is not None and cached.bucket is not None and cached.starts:
            last = cached.starts[-1]
            if text.startswith(_MARK, last) and text.startswith(cached.text()[:last]):
                starts, entries = _parse_blocks(text, last, path, bucket, scope, key[0])
                starts[:0] = cached.starts[:-1]
                entries[:0] = cached.entries[:-1]
                return _File(path, key, scope, bucket, [text], len(text), starts, entries, {e[2]: e for e in entries})
        starts, entries = _parse_blocks(text, 0, path, bucket, scope, key[0])
        return _File(path, key, scope, bucket, [text], len(text), starts, entries, {e[2]: e for e in entries})

    def _merge(self) -> list[MemoryRecord]:
        files = sorted((f for f in self._cache.values() if f.by_id), key=lambda f: f.path)
        merged: dict[str, _Entry] = {}
        total = 0
        for f in files:
            merged.update(f.by_id)
            total += len(f.by_id)
        if len(merged) != total:  # one id in several files: pick by scope, kind, age, path
            counts: Counter[str] = Counter()
            for f in files:
                counts.update(f.by_id.keys())
            for record_id, count in counts.items():
                if count > 1:
                    best: tuple[_File, _Entry] | None = None
                    for f in files:
                        entry = f.by_id.get(record_id)
                        if entry is not None and (best is None or _beats(f, entry, *best)):
                            best = (f, entry)
                    assert best is not None
                    merged[record_id] = best[1]
        ordered = sorted(merged.values())
        self._merged = merged
        self._ordered = [entry[3] for entry in ordered]
        self._last = ordered[-1] if ordered else None
        return self._ordered

    def _note_append(self, entry: _Entry) -> None:
        """Extend the ordered view after our own append of a new id, or drop it for a rebuild."""
        merged, ordered, last = self._merged, self._ordered, self._last
        if merged is not None and ordered is not None and entry[2] not in merged and (last is None or entry > last):
            merged[entry[2]] = entry
            ordered.append(entry[3])
            self._last = entry
        else:
            self._merged = self._ordered = None

    # ------------------------------------------------------------------ writing

    def _ensure_layout(self) -> None:
        self.memory_dir.mkdir(parents=True, exist_ok=True)
        with self._locked() as root_fd:
            for memory_type in MEMORY_TYPES:
                os.close(self._open_bucket(root_fd, memory_type))
            try:
                os.stat(_INDEX, dir_fd=root_fd, follow_symlinks=False)
            except FileNotFoundError:
                _publish(root_fd, "# MEMORY\n")

    @contextmanager
    def _locked(self) -> Iterator[int]:
        """The root directory, opened and exclusively flock-ed: writers of one root take turns."""
        try:
            fd = os.open(self.memory_dir, _DIR_FLAGS)
        except OSError as exc:
            raise MemoryResourceError(
                f"memory root {self.memory_dir} cannot be opened: {exc}", resource=str(self.memory_dir)
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # releases the lock

    def _open_bucket(self, root_fd: int, memory_type: str) -> int:
        """The bucket directory's descriptor (created if missing); a symlinked bucket is refused."""
        folder = self.memory_dir / memory_type
        try:
            try:
                return os.open(memory_type, _DIR_FLAGS, dir_fd=root_fd)
            except FileNotFoundError:
                with suppress(FileExistsError):
                    os.mkdir(memory_type, dir_fd=root_fd)
                return os.open(memory_type, _DIR_FLAGS, dir_fd=root_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and folder.is_symlink():
                raise MemoryResourceError(
                    f"refusing to write through the symlinked memory folder {folder}", resource=str(folder)
                ) from exc
            raise MemoryResourceError(f"memory folder {folder} cannot be opened: {exc}", resource=str(folder)) from exc

    def _append_block(self, bucket_fd: int, path: str, bucket: str, block: str) -> None:
        """One ``write()`` of the block on an O_APPEND descriptor; our cache follows when nobody else
        wrote in between."""
        try:
            fd = os.open(SEGMENT_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _FILE_FLAGS, 0o644, dir_fd=bucket_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise MemoryResourceError(
                    f"refusing to write through the symlinked memory segment {path}", resource=path
                ) from exc
            raise MemoryResourceError(f"memory segment {path} cannot be opened: {exc}", resource=path) from exc
        try:
            before = os.fstat(fd)
            if not stat_mod.S_ISREG(before.st_mode):
                raise MemoryResourceError(f"memory segment {path} is not a regular file", resource=path)
            cached = self._cache.get(path)
            in_sync = cached is not None and cached.bucket is not None and cached.key == _key(before)
            if before.st_size == 0:
                lead = _PREAMBLE
            elif in_sync:
                assert cached is not None
                lead = "" if not cached.parts or cached.parts[-1].endswith("\n") else "\n"
            else:
                lead = "" if os.pread(fd, 1, before.st_size - 1) == b"\n" else "\n"
            payload = (lead + block).encode("utf-8")
            try:
                written = os.write(fd, payload)
            except OSError as exc:
                raise MemoryResourceError(f"memory segment {path} cannot be written: {exc}", resource=path) from exc
            if written != len(payload):
                os.ftruncate(fd, before.st_size)  # no torn block; we hold the writers' lock
                raise MemoryResourceError(
                    f"memory segment {path}: short write ({written} of {len(payload)} bytes)", resource=path
                )
            after = os.fstat(fd)
        finally:
            os.close(fd)
        if after.st_size != before.st_size + len(payload):
            return  # someone else wrote too: the next scan reads the file again
        _starts, entries = _parse_blocks(block, 0, path, bucket, "local", after.st_mtime_ns)
        entry = entries[0]
        if in_sync:
            assert cached is not None
            cached.starts.append(cached.length + len(lead))
            cached.parts.append(lead + block)
            cached.length += len(lead) + len(block)
            cached.entries.append(entry)
            cached.by_id[entry[2]] = entry
            cached.key = self._keys[path] = _key(after)
            self._note_append(entry)
        elif before.st_size == 0:  # a new (or emptied) segment
            text = lead + block
            self._cache[path] = _File(
                path, _key(after), "local", bucket, [text], len(text), [len(lead)], [entry], {entry[2]: entry}
            )
            self._keys[path] = _key(after)
            if cached is None:
                self._note_append(entry)
            else:
                self._merged = self._ordered = None

    def _rewrite(self, bucket_fd: int, segment: _File, *, drop: str, add: str | None) -> None:
        """Replace the segment atomically without the blocks of ``drop`` (plus ``add`` at the end)."""
        text = segment.text()
        starts, entries = segment.starts, segment.entries
        parts = [text[: starts[0]]] if starts else [text]
        length = len(parts[0])
        kept_starts: list[int] = []
        kept: list[_Entry] = []
        for i, entry in enumerate(entries):
            end = starts[i + 1] if i + 1 < len(starts) else len(text)
            if entry[2] == drop:
                continue
            chunk = text[starts[i] : end]
            kept_starts.append(length)
            kept.append(entry)
            parts.append(chunk)
            length += len(chunk)
        if add is not None:
            if length and not parts[-1].endswith("\n"):
                parts.append("\n")
                length += 1
            assert segment.bucket is not None
            _, added = _parse_blocks(add, 0, segment.path, segment.bucket, segment.scope, 0)
            kept_starts.append(length)
            kept.extend(added)
            parts.append(add)
            length += len(add)
        new_text = "".join(parts)
        _replace_file(bucket_fd, SEGMENT_NAME, new_text.encode("utf-8"), segment.path)
        key = _key(os.stat(SEGMENT_NAME, dir_fd=bucket_fd, follow_symlinks=False))
        by_id = {e[2]: e for e in kept}
        self._cache[segment.path] = _File(
            segment.path, key, segment.scope, segment.bucket, [new_text], length, kept_starts, kept, by_id
        )
        self._keys[segment.path] = key
        self._merged = self._ordered = None

    def _remove(self, root_fd: int, held: _File, record_id: str) -> None:
        if held.bucket is not None:
            bucket_fd = self._open_bucket(root_fd, held.bucket)
            try:
                self._rewrite(bucket_fd, held, drop=record_id, add=None)
            finally:
                os.close(bucket_fd)
            return
        if not Path(held.path).is_relative_to(self.memory_dir):
            return  # global memory is never deleted from here
        with suppress(FileNotFoundError):
            os.unlink(held.path)
        self._cache.pop(held.path, None)
        self._keys.pop(held.path, None)
        self._merged = self._ordered = None

    def _update_index(self, root_fd: int, *, add: tuple[str, MemoryRecord] | None, remove: str) -> None:
        try:
            existing = _read_bytes(_INDEX, dir_fd=root_fd).decode("utf-8", errors="replace")
        except OSError:
            existing = ""
        body = existing[len(_INDEX_HEADER) :] if existing.startswith(_INDEX_HEADER) else ""
        entries = body[:-1].split("\n") if body.endswith("\n") else []
        if not all(map(str.startswith, entries, repeat("- "))):  # not as we write it: keep only the entries
            entries = [line for line in existing.split("\n") if line.startswith("- ")]
        needles = (f", id {json.dumps(remove, ensure_ascii=False)})", f"/{_stem(remove)}.md)")  # new, old layout
        if any(needle in existing for needle in needles):
            entries = [line for line in entries if not line.endswith(needles)]
        if add is not None:
            memory_type, record = add
            snippet = " ".join(str(record.content).split())[:150]
            role = " ".join(record.role.split())
            where = f"{memory_type}/{SEGMENT_NAME}, id {json.dumps(record.record_id, ensure_ascii=False)}"
            entries.append(f"- [{memory_type}] {role} step={record.step_id}: {snippet} ({where})")
        entries = entries[-self.max_index_entries :]
        size, drop = len(_INDEX_HEADER) + sum(map(len, entries)) + len(entries), 0
        while drop < len(entries) and size > self.max_index_chars:
            size -= len(entries[drop]) + 1
            drop += 1
        kept = entries[drop:]
        _publish(root_fd, _INDEX_HEADER + "\n".join(kept) + "\n" if kept else _INDEX_HEADER)


# ---------------------------------------------------------------------- parsing


def _parse_blocks(
    text: str, pos: int, path: str, bucket: str, scope: str, mtime_ns: int
) -> tuple[list[int], list[_Entry]]:
    """The blocks of segment text from ``pos`` (0, or the offset of a marker): their marker offsets
    and entries. All headers are decoded by one ``json.loads``; only if that fails is each header
    decoded alone, to name the broken one."""
    chunk = "\n" + text[pos:] if pos else "\n" + text
    markers = chunk.count(_SEP)
    if not markers:
        return [], []
    if markers < _NOGC_BLOCKS:
        return _parse_chunk(chunk, markers, text, pos, path, bucket, scope, mtime_ns)
    with _gc_paused():
        return _parse_chunk(chunk, markers, text, pos, path, bucket, scope, mtime_ns)


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


def _parse_chunk(
    chunk: str, markers: int, text: str, pos: int, path: str, bucket: str, scope: str, mtime_ns: int
) -> tuple[list[int], list[_Entry]]:
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
    if text.find("\\" + _MARK, pos) >= 0:
        bodies = [_UNESCAPE.sub(r"\1", body) if "\\" + _MARK in body else body for body in bodies]
    columns = _columns(parsed, bucket) if len(parsed) >= _COLUMNS_FROM else None
    if columns is None:
        return starts, _entries_one_by_one(parsed, bodies, starts, text, path, bucket, scope, mtime_ns)
    record_ids, roles, steps, metadatas, created, types = columns
    # Column-wise, so that the per-record work runs in C: metadata gets its type and created_at
    # (and scope), then the records are built and paired with their sort keys.
    _consume(map(dict.setdefault, metadatas, repeat("type"), types))
    _consume(map(dict.__setitem__, metadatas, repeat("created_at"), created))
    if scope == "global":
        _consume(map(dict.__setitem__, metadatas, repeat("scope"), repeat("global")))
    records = _records(roles, bodies, steps, metadatas, record_ids)
    return starts, list(zip(steps, created, record_ids, records, strict=True))


_COLUMNS_FROM = 16  # blocks; fewer (an append's tail) are quicker one by one
_FIELDS = itemgetter("record_id", "role", "step_id", "metadata", "created_at", "type")
_TYPES = frozenset(MEMORY_TYPES)


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
    parsed: list[Any],
    bodies: list[str],
    starts: list[int],
    text: str,
    path: str,
    bucket: str,
    scope: str,
    mtime_ns: int,
) -> list[_Entry]:
    """Entries from headers that a hand edit may have left incomplete: a missing or odd field gets
    its default (role ``memory``, step 0, the bucket's type, the file time); a header that is not an
    object or has no record id is an error naming its line."""
    fallback_created = ""
    entries: list[_Entry] = []
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
        (record,) = _records((role,), (body,), (step,), (metadata,), (record_id,))
        entries.append((step, created, record_id, record))
    return entries


_FIELDS_ONE_BY_ONE = ("record_id", "role", "step_id", "metadata", "created_at")
_RECORD_FIELDS = ("role", "content", "step_id", "metadata", "record_id")


def _records(
    roles: Sequence[str],
    contents: Sequence[str],
    steps: Sequence[int],
    metadatas: Sequence[dict[str, Any]],
    record_ids: Sequence[str],
) -> list[MemoryRecord]:
    """MemoryRecords from fields already checked as ``MemoryRecord.__post_init__`` checks them
    (non-empty role and record id, int step, dict metadata). While MemoryRecord is a plain frozen
    dataclass with exactly these fields, each instance gets its ``__dict__`` directly, without the
    dataclass ``__init__`` (which costs a cold read of 10k records about as much as parsing their
    headers); otherwise the constructor is called."""
    if not _TRUSTED_RECORDS:
        return list(map(MemoryRecord, roles, contents, steps, metadatas, record_ids))
    states = [
        {"role": role, "content": content, "step_id": step, "metadata": metadata, "record_id": record_id}
        for role, content, step, metadata, record_id in zip(roles, contents, steps, metadatas, record_ids, strict=True)
    ]
    records = list(map(_new_object, repeat(MemoryRecord, len(states))))
    _consume(map(_set_attribute, records, repeat("__dict__"), states))
    return records


def _consume(iterator: Iterator[Any]) -> None:
    """Run an iterator to its end, keeping nothing."""
    deque(iterator, maxlen=0)


_new_object = object.__new__
_set_attribute = object.__setattr__
_TRUSTED_RECORDS = not hasattr(MemoryRecord, "__slots__") and tuple(f.name for f in fields(MemoryRecord)) == (
    _RECORD_FIELDS
)


_NOGC_BLOCKS = 1000


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a large segment is parsed (as Mercurial does for
    its parsers): the tens of thousands of dicts and records built, none of them cyclic, would
    otherwise trigger repeated full collections that cost about as much as the parse itself."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _bad_marker(text: str, at: int, path: str, why: str) -> NoReturn:
    line = text.count("\n", 0, at) + 1
    raise MemoryResourceError(
        f"memory segment {path}, line {line}: {why}; fix the line, or start it with a backslash to make it text",
        resource=path,
    )


def _read_record(text: str, path: Path, root: Path, scope: str, mtime_ns: int) -> MemoryRecord:
    """A one-record file: an optional front-matter header (``key: JSON`` lines between ``---``), then text."""
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


def _beats(f: _File, entry: _Entry, best_file: _File, best: _Entry) -> bool:
    """Whether ``entry`` (from ``f``) wins over ``best`` for one record id: local over global, a
    segment over a one-record file, then the newer segment record or the file named after the id
    (the earlier layout), then the smaller path."""
    if f.scope != best_file.scope:
        return f.scope == "local"
    if (f.bucket is None) != (best_file.bucket is None):
        return f.bucket is not None
    if f.bucket is not None and entry[1] != best[1]:
        return entry[1] > best[1]
    if f.bucket is None:
        canonical = f"{_stem(entry[2])}.md"
        a, b = os.path.basename(f.path) == canonical, os.path.basename(best_file.path) == canonical
        if a != b:
            return a
    return f.path < best_file.path


def _stem(record_id: str) -> str:
    """The file stem the one-file-per-record layout used for a record id."""
    return "r-" + sha256_hex(record_id)[:40]


def _memory_type(record: MemoryRecord) -> str:
    declared = str(record.metadata.get("type") or "").strip().lower()
    if declared in MEMORY_TYPES:
        return declared
    role = record.role.strip().lower()
    return role if role in ("feedback", "user", "reference") else "project"


def _iso(mtime_ns: int) -> str:
    return datetime.fromtimestamp(mtime_ns / 1e9, UTC).isoformat()


# ---------------------------------------------------------------------- files


def _key(st: os.stat_result) -> _Key:
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)


def _walk(root: str) -> dict[str, _Key]:
    """``{path: (mtime_ns, ctime_ns, size, inode)}`` of the regular ``*.md`` files under root (not
    MEMORY.md, not dotfiles). Symlinks are never followed: a linked file or folder is skipped."""
    out: dict[str, _Key] = {}
    stack = [root]
    lstat, is_reg = os.stat, stat_mod.S_ISREG
    while stack:
        folder = stack.pop()
        try:
            fd = os.open(folder, _DIR_FLAGS)
        except OSError:
            continue
        try:
            with os.scandir(fd) as entries:
                names = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries if e.name[0] != "."]
            prefix = folder + os.sep
            for name, is_dir in names:
                if is_dir:
                    stack.append(prefix + name)
                elif name.endswith(".md") and not (name == _INDEX and folder == root):
                    try:
                        st = lstat(name, dir_fd=fd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if is_reg(st.st_mode):
                        out[prefix + name] = (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)
        finally:
            os.close(fd)
    return out


def _read_bytes(path: str, *, dir_fd: int | None = None) -> bytes:
    """The whole file, opened without following a symlink (ELOOP if it is one)."""
    fd = os.open(path, os.O_RDONLY | _FILE_FLAGS, dir_fd=dir_fd)
    with open(fd, "rb", buffering=0, closefd=True) as handle:
        if not stat_mod.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        return handle.readall()


def _replace_file(dir_fd: int, name: str, data: bytes, shown: str) -> None:
    """Write ``data`` to a new temporary file beside ``name`` and rename it over ``name``."""
    tmp = f".{name}.{os.getpid()}.{uuid4().hex[:8]}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FILE_FLAGS, 0o644, dir_fd=dir_fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # replaces a symlink, never writes through it
    except OSError as exc:
        with suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise MemoryResourceError(f"memory file {shown} cannot be rewritten: {exc}", resource=shown) from exc


def _publish(root_fd: int, text: str) -> None:
    """Make ``text`` the index: overwrite the spare, rename it over MEMORY.md, keep the old index as
    the next spare (hard-linked aside first), so no non-empty file is ever released."""
    data, flags = text.encode("utf-8"), os.O_WRONLY | os.O_CREAT | _FILE_FLAGS
    try:
        try:
            fd = os.open(_SPARE, flags, 0o644, dir_fd=root_fd)
            st = os.fstat(fd)
            if not stat_mod.S_ISREG(st.st_mode) or st.st_nlink != 1:  # only a private regular file is reused
                os.close(fd)
                raise IsADirectoryError(_SPARE)
        except OSError:
            with suppress(FileNotFoundError):
                os.unlink(_SPARE, dir_fd=root_fd)
            fd = os.open(_SPARE, flags | os.O_EXCL, 0o644, dir_fd=root_fd)
        try:
            done = 0
            while done < len(data):
                done += os.pwrite(fd, data[done:], done)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)
        try:
            os.link(_INDEX, _SWAP, src_dir_fd=root_fd, dst_dir_fd=root_fd, follow_symlinks=False)
        except FileExistsError:  # left by an interrupted publish
            os.unlink(_SWAP, dir_fd=root_fd)
            os.link(_INDEX, _SWAP, src_dir_fd=root_fd, dst_dir_fd=root_fd, follow_symlinks=False)
        except FileNotFoundError:
            os.replace(_SPARE, _INDEX, src_dir_fd=root_fd, dst_dir_fd=root_fd)  # the first index
            return
        os.replace(_SPARE, _INDEX, src_dir_fd=root_fd, dst_dir_fd=root_fd)
        os.replace(_SWAP, _SPARE, src_dir_fd=root_fd, dst_dir_fd=root_fd)
    except OSError as exc:
        raise MemoryResourceError(f"memory index {_INDEX} cannot be written: {exc}", resource=_INDEX) from exc
