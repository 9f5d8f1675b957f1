"""What each memdir file held when last read, and how the files' records merge into one view.

A file's records are cached under its ``(mtime_ns, ctime_ns, size, inode)`` key. A segment whose
key changed is read again; if it still starts with the cached text up to the cached last block,
only the tail from there is parsed (another process's append costs one read and compare of the
file plus the new blocks), else the whole file is. Like any metadata-keyed cache, a same-size edit
within the file system's timestamp granularity of the previous write goes unseen until the next.

Records are de-duplicated by ``record_id``: local over global; within a scope a segment over a
one-record file, the newer ``created_at`` between segments, the file named after the id (the
earlier layout) between one-record files, then the smaller path.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from qitos.kit.memory._memdir_files import FileKey, read_text_if_present
from qitos.kit.memory._memdir_segment import MARKER, RecordEntry, legacy_file_stem, parse_blocks, read_record_file

__all__ = ["CachedFile", "load_file", "merge_files", "segment_file"]


@dataclass(slots=True, eq=False)
class CachedFile:
    """What one file held when last read: its key, its text (segments) and its records."""

    path: str
    key: FileKey
    scope: str  # "local" or "global"
    bucket: str | None  # the type bucket of a segment; None for a one-record file
    parts: list[str]  # the segment's text, joined lazily (own appends add parts)
    length: int  # characters in the segment's text
    starts: list[int]  # character offset of each block's marker
    entries: list[RecordEntry]  # one per block, in file order
    by_id: dict[str, RecordEntry]  # the last block of each record id

    def text(self) -> str:
        """The segment's whole text (empty for a one-record file)."""
        if len(self.parts) != 1:
            self.parts[:] = ["".join(self.parts)]
        return self.parts[0]

    def extend(self, lead: str, block: str, entry: RecordEntry, key: FileKey) -> None:
        """Follow our own append of ``lead + block`` (``block`` holding ``entry``) to the segment."""
        self.starts.append(self.length + len(lead))
        self.parts.append(lead + block)
        self.length += len(lead) + len(block)
        self.entries.append(entry)
        self.by_id[entry[2]] = entry
        self.key = key


def segment_file(
    path: str, key: FileKey, *, scope: str, bucket: str, text: str, starts: list[int], entries: list[RecordEntry]
) -> CachedFile:
    """The cache of a segment whose text, marker offsets and entries are known."""
    return CachedFile(path, key, scope, bucket, [text], len(text), starts, entries, {e[2]: e for e in entries})


def load_file(
    path: str, key: FileKey, *, scope: str, bucket: str | None, root: Path, previous: CachedFile | None
) -> CachedFile | None:
    """Read the file at ``path`` (listed with ``key``) under ``root``: a segment of type ``bucket``,
    or a one-record file when ``bucket`` is None. A grown segment that ``previous`` still describes
    up to its last block is parsed from there on. None when the file is gone or became a symlink."""
    text = read_text_if_present(path)
    if text is None:
        return None
    if bucket is None:
        record = read_record_file(text, path=Path(path), root=root, scope=scope, mtime_ns=key[0])
        entry: RecordEntry = (record.step_id, record.metadata["created_at"], record.record_id, record)
        return CachedFile(path, key, scope, None, [], 0, [], [entry], {record.record_id: entry})
    if previous is not None and previous.bucket is not None and previous.starts:
        last = previous.starts[-1]
        if text.startswith(MARKER, last) and text.startswith(previous.text()[:last]):
            starts, entries = parse_blocks(text, start=last, path=path, bucket=bucket, scope=scope, mtime_ns=key[0])
            starts[:0] = previous.starts[:-1]
            entries[:0] = previous.entries[:-1]
            return segment_file(path, key, scope=scope, bucket=bucket, text=text, starts=starts, entries=entries)
    starts, entries = parse_blocks(text, start=0, path=path, bucket=bucket, scope=scope, mtime_ns=key[0])
    return segment_file(path, key, scope=scope, bucket=bucket, text=text, starts=starts, entries=entries)


def merge_files(cached: Iterable[CachedFile]) -> dict[str, RecordEntry]:
    """One entry per record id over all files, the winner where several files hold an id."""
    files = sorted((f for f in cached if f.by_id), key=lambda f: f.path)
    merged: dict[str, RecordEntry] = {}
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
                best: tuple[CachedFile, RecordEntry] | None = None
                for f in files:
                    entry = f.by_id.get(record_id)
                    if entry is not None and (best is None or _beats(f, entry, *best)):
                        best = (f, entry)
                assert best is not None
                merged[record_id] = best[1]
    return merged


def _beats(f: CachedFile, entry: RecordEntry, best_file: CachedFile, best: RecordEntry) -> bool:
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
        canonical = f"{legacy_file_stem(entry[2])}.md"
        a, b = os.path.basename(f.path) == canonical, os.path.basename(best_file.path) == canonical
        if a != b:
            return a
    return f.path < best_file.path
