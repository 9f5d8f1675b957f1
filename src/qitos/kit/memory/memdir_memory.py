"""Memdir memory: append-only Markdown segment files under a root directory, with a MEMORY.md index.

Layout::

    <root>/MEMORY.md           readable index, newest last, at most max_index_entries lines and
                               max_index_chars characters; a line names the segment and the record id
    <root>/<type>/records.md   the type bucket's append-only segment, holding many records
    <root>/**/<other>.md       one record per file: notes dropped in by hand, or r-<sha>.md files of
                               the earlier one-file-per-record layout (front-matter header optional)

``type`` is ``user``, ``feedback``, ``project``, ``reference`` or ``runtime`` (``metadata["type"]``,
else the role, else ``project``). The block format of a segment and the one-record file are
described in :mod:`qitos.kit.memory._memdir_segment`: within a segment the last block of a record id
wins, any text round-trips, and a broken marker line makes reads fail with
:class:`MemoryResourceError` naming the file and line.

Writing. Writers of one root take turns on an exclusive ``flock`` of the root directory. Under it an
append checks the local segments afresh (an lstat each; one-record files as of the last full read,
and reads rank those below a segment anyway), writes a new id as one ``write()`` of its block on an
``O_APPEND`` descriptor and publishes the index: about half a millisecond in all here. An id that
exists, and ``delete`` (which reads everything afresh), rewrite the segment atomically (temporary
file, ``os.replace``) without the old block; a record whose type changed leaves its old bucket, and
a one-record file holding the id is unlinked. Names never come from a record id, role or metadata;
writes go through directory descriptors opened with ``O_NOFOLLOW`` (see
:mod:`qitos.kit.memory._memdir_files`): nothing is written outside the root, symlinks are never
followed (a symlinked bucket or segment is refused, a symlinked note skipped). The index is
published through a spare file, so readers see a whole index.

Freshness and cost. Every ``retrieve`` reads the disk: a walk of the root and buckets and one
``lstat`` per file. Changed files are read again, a grown segment only from its last block on
(see :mod:`qitos.kit.memory._memdir_cache`, which also ranks records that share an id: local over
global, a segment over a one-record file, the newer between segments). When nothing changed, the
previous ordered list is returned as it is.
"""

from __future__ import annotations

import errno
import json
import os
import stat as stat_mod
from collections.abc import Iterable, Mapping
from contextlib import suppress
from datetime import UTC, datetime
from itertools import repeat
from pathlib import Path
from typing import Any

from qitos.core.memory import MemoryRecord, MemoryResourceError
from qitos.kit.memory._memdir_cache import CachedFile, load_file, merge_files, segment_file
from qitos.kit.memory._memdir_files import (
    FILE_FLAGS,
    INDEX_NAME,
    FileKey,
    file_key,
    locked_root,
    open_bucket,
    publish_index,
    read_bytes,
    regular_file_stat,
    replace_file,
    walk_markdown_files,
)
from qitos.kit.memory._memdir_segment import (
    MEMORY_TYPES,
    PREAMBLE,
    SEGMENT_NAME,
    RecordEntry,
    legacy_file_stem,
    parse_blocks,
    render_block,
)

__all__ = ["MemdirMemory"]

_INDEX_HEADER = "# MEMORY\n\n"
_QUERY_KEYS = frozenset({"roles", "type", "contains", "record_ids", "max_items"})


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
        self._roots: dict[str, Path] = {"local": self.memory_dir}  # by scope
        if self.global_memory_dir is not None:
            self._roots["global"] = self.global_memory_dir
        self._segments = {str(root / t / SEGMENT_NAME): t for root in self._roots.values() for t in MEMORY_TYPES}
        self._local_segments = {t: str(self.memory_dir / t / SEGMENT_NAME) for t in MEMORY_TYPES}
        self._scanned = False  # whether a full scan has run (before it, writes scan fully)
        self._cache: dict[str, CachedFile] = {}
        self._keys: dict[str, FileKey] = {}  # the keys the cache was last brought in line with
        self._merged: dict[str, RecordEntry] | None = None
        self._ordered: list[MemoryRecord] | None = None
        self._last: RecordEntry | None = None
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
        block = render_block(record, memory_type, datetime.now(UTC).isoformat())
        record_id = record.record_id
        target = self._local_segments[memory_type]
        with locked_root(self.memory_dir) as root_fd:
            self._refresh_for_write(root_fd)  # a fresh view under the lock: which local files hold this id now
            holders = [f for f in self._cache.values() if f.scope == "local" and record_id in f.by_id]
            bucket_fd = open_bucket(root_fd, self.memory_dir, memory_type)
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
        with locked_root(self.memory_dir) as root_fd:
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
        for root in self._roots.values():
            if not root.is_dir():
                raise MemoryResourceError(
                    f"memory root {root} is missing; pass create=True to initialize a new memory", resource=str(root)
                )

    def _scan(self) -> list[MemoryRecord]:
        """Every current record, oldest first: one walk and one ``lstat`` per file; changed files are
        read again (a grown segment only from its last block on), and the order is reused when
        nothing changed."""
        current: dict[str, FileKey] = {}
        scopes: dict[str, str] = {}
        for scope, root in self._roots.items():
            found = walk_markdown_files(str(root))
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
            st = regular_file_stat(root_fd, memory_type, SEGMENT_NAME)  # a symlinked bucket is never read through
            cached = self._cache.get(path)
            if st is None:
                if cached is not None:
                    del self._cache[path]
                    self._keys.pop(path, None)
                    self._merged = self._ordered = None
                continue
            key = file_key(st)
            if cached is None or cached.key != key:
                loaded = self._load(path, key, "local", cached)
                if loaded is None:
                    self._cache.pop(path, None)
                    self._keys.pop(path, None)
                else:
                    self._cache[path] = loaded
                    self._keys[path] = key
                self._merged = self._ordered = None

    def _load(self, path: str, key: FileKey, scope: str, cached: CachedFile | None) -> CachedFile | None:
        bucket = self._segments.get(path)
        return load_file(path, key, scope=scope, bucket=bucket, root=self._roots[scope], previous=cached)

    def _merge(self) -> list[MemoryRecord]:
        merged = merge_files(self._cache.values())
        ordered = sorted(merged.values())
        self._merged = merged
        self._ordered = [entry[3] for entry in ordered]
        self._last = ordered[-1] if ordered else None
        return self._ordered

    def _note_append(self, entry: RecordEntry) -> None:
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
        with locked_root(self.memory_dir) as root_fd:
            for memory_type in MEMORY_TYPES:
                os.close(open_bucket(root_fd, self.memory_dir, memory_type))
            try:
                os.stat(INDEX_NAME, dir_fd=root_fd, follow_symlinks=False)
            except FileNotFoundError:
                publish_index(root_fd, "# MEMORY\n")

    def _append_block(self, bucket_fd: int, path: str, bucket: str, block: str) -> None:
        """One ``write()`` of the block on an O_APPEND descriptor; our cache follows when nobody else
        wrote in between."""
        try:
            fd = os.open(SEGMENT_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT | FILE_FLAGS, 0o644, dir_fd=bucket_fd)
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
            in_sync = cached is not None and cached.bucket is not None and cached.key == file_key(before)
            if before.st_size == 0:
                lead = PREAMBLE
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
        _starts, entries = parse_blocks(
            block, start=0, path=path, bucket=bucket, scope="local", mtime_ns=after.st_mtime_ns
        )
        entry = entries[0]
        key = file_key(after)
        if in_sync:
            assert cached is not None
            cached.extend(lead, block, entry, key)
            self._keys[path] = key
            self._note_append(entry)
        elif before.st_size == 0:  # a new (or emptied) segment
            text = lead + block
            self._cache[path] = segment_file(
                path, key, scope="local", bucket=bucket, text=text, starts=[len(lead)], entries=[entry]
            )
            self._keys[path] = key
            if cached is None:
                self._note_append(entry)
            else:
                self._merged = self._ordered = None

    def _rewrite(self, bucket_fd: int, segment: CachedFile, *, drop: str, add: str | None) -> None:
        """Replace the segment atomically without the blocks of ``drop`` (plus ``add`` at the end)."""
        assert segment.bucket is not None
        text = segment.text()
        starts, entries = segment.starts, segment.entries
        parts = [text[: starts[0]]] if starts else [text]
        length = len(parts[0])
        kept_starts: list[int] = []
        kept: list[RecordEntry] = []
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
            _, added = parse_blocks(
                add, start=0, path=segment.path, bucket=segment.bucket, scope=segment.scope, mtime_ns=0
            )
            kept_starts.append(length)
            kept.extend(added)
            parts.append(add)
        new_text = "".join(parts)
        replace_file(bucket_fd, SEGMENT_NAME, new_text.encode("utf-8"), segment.path)
        key = file_key(os.stat(SEGMENT_NAME, dir_fd=bucket_fd, follow_symlinks=False))
        self._cache[segment.path] = segment_file(
            segment.path,
            key,
            scope=segment.scope,
            bucket=segment.bucket,
            text=new_text,
            starts=kept_starts,
            entries=kept,
        )
        self._keys[segment.path] = key
        self._merged = self._ordered = None

    def _remove(self, root_fd: int, held: CachedFile, record_id: str) -> None:
        if held.bucket is not None:
            bucket_fd = open_bucket(root_fd, self.memory_dir, held.bucket)
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
            existing = read_bytes(INDEX_NAME, dir_fd=root_fd).decode("utf-8", errors="replace")
        except OSError:
            existing = ""
        body = existing[len(_INDEX_HEADER) :] if existing.startswith(_INDEX_HEADER) else ""
        entries = body[:-1].split("\n") if body.endswith("\n") else []
        if not all(map(str.startswith, entries, repeat("- "))):  # not as we write it: keep only the entries
            entries = [line for line in existing.split("\n") if line.startswith("- ")]
        # The line of the id in this layout's index, or of its file in the earlier layout's.
        needles = (f", id {json.dumps(remove, ensure_ascii=False)})", f"/{legacy_file_stem(remove)}.md)")
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
        publish_index(root_fd, _INDEX_HEADER + "\n".join(kept) + "\n" if kept else _INDEX_HEADER)


def _memory_type(record: MemoryRecord) -> str:
    """The type bucket of a record: its ``metadata["type"]``, else its role, else ``project``."""
    declared = str(record.metadata.get("type") or "").strip().lower()
    if declared in MEMORY_TYPES:
        return declared
    role = record.role.strip().lower()
    return role if role in ("feedback", "user", "reference") else "project"
