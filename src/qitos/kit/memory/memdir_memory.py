"""Memdir memory: one Markdown file per record under a root directory, with a MEMORY.md index.

Layout::

    <root>/MEMORY.md                       readable index, newest last, bounded by
                                           max_index_entries lines and max_index_chars characters
    <root>/<type>/r-<sha256(record_id)>.md one record: a front-matter header, then the text

``type`` is ``user``, ``feedback``, ``project``, ``reference`` or ``runtime`` (from
``metadata["type"]``, else from the role, else ``project``). File names are derived from a hash of
the record id, so no record id, role or metadata value can name a path: nothing is ever written
outside the root. Symbolic links are never followed, neither for reading nor for writing, and a
bucket directory that is a symlink is refused.

Retrieval reads the disk fresh on every call: files edited, added or removed by another process
or by hand are seen. Parsed records are cached per file and reused only while the file's
``(mtime_ns, ctime_ns, size, inode)`` is unchanged, so a retrieve is one directory scan plus one
``lstat`` per file. Records are de-duplicated by ``record_id`` (local over global).

Any ``*.md`` file in the tree is a record; one without a header gets a stable id from its relative
path (``file:<scope>:<path>``), role ``memory`` and step 0.
"""

from __future__ import annotations

import json
import os
import stat as stat_mod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from qitos.core.codec import canonical_json, sha256_hex
from qitos.core.memory import MemoryRecord, MemoryResourceError

__all__ = ["MEMORY_TYPES", "MemdirMemory", "filter_records"]

MEMORY_TYPES: tuple[str, ...] = ("feedback", "project", "reference", "runtime", "user")
_INDEX = "MEMORY.md"
_HEADER_KEYS = ("record_id", "role", "type", "step_id", "created_at", "metadata")
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


@dataclass(slots=True)
class _Cached:
    key: tuple[int, int, int, int]
    record: MemoryRecord | None
    sort_key: tuple[int, str, str]
    scope: str


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
        self._recent: list[MemoryRecord] = []
        self._cache: dict[str, _Cached] = {}
        self._keys: dict[str, tuple[int, int, int, int]] = {}
        self._ordered: list[MemoryRecord] | None = None
        if create:
            self._ensure_layout()
        self._require_roots()

    # ------------------------------------------------------------------ Memory protocol

    def append(self, record: MemoryRecord) -> None:
        """Write (or replace) the record's file and index line."""
        self._require_roots()
        if not isinstance(record, MemoryRecord):
            raise TypeError(f"MemdirMemory.append: expected a MemoryRecord, got {type(record).__name__}")
        if not isinstance(record.content, str):
            raise TypeError(
                f"MemdirMemory persists text records only; record {record.record_id!r} has "
                f"{type(record.content).__name__} content"
            )
        try:
            metadata_json = canonical_json(record.metadata)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"MemdirMemory: metadata of {record.record_id!r} is not JSON-native ({exc})") from exc
        memory_type = _memory_type(record)
        folder = self._bucket(memory_type)
        stem = _stem(record.record_id)
        path = folder / f"{stem}.md"
        header = {
            "record_id": record.record_id,
            "role": record.role,
            "type": memory_type,
            "step_id": record.step_id,
            "created_at": datetime.now(UTC).isoformat(),
        }
        lines = ["---", *(f"{k}: {json.dumps(v, ensure_ascii=False)}" for k, v in header.items())]
        lines += [f"metadata: {metadata_json}", "---", record.content]
        _atomic_write(path, "\n".join(lines))
        for other in MEMORY_TYPES:  # a record whose type changed moves bucket: no duplicate
            if other != memory_type:
                stale = self.memory_dir / other / f"{stem}.md"
                if stale.is_file() and not stale.is_symlink():
                    stale.unlink()
        self._recent = [r for r in self._recent if r.record_id != record.record_id]
        self._recent.append(record)
        self._update_index(add=(path, record, memory_type), remove={stem})

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
        self._recent = []

    def evict(self) -> int:
        """Trim the append-time cache to ``max_index_entries``; returns how many were dropped."""
        removed = max(0, len(self._recent) - self.max_index_entries)
        if removed:
            self._recent = self._recent[removed:]
        return removed

    def delete(self, record_id: str) -> bool:
        """Forget one logical record in this namespace, never global memory.

        Idempotent for an absent identity. This is local-file deletion, not
        secure erasure or a concurrent multi-file transaction. Callers serialize
        writes to one Memdir namespace; use a transactional backend otherwise.
        """
        self._require_roots()
        removed_stems: set[str] = set()
        self._scan()
        for path_text, cached in list(self._cache.items()):
            path = Path(path_text)
            if cached.record is None or cached.record.record_id != record_id:
                continue
            if not path.is_relative_to(self.memory_dir):
                continue  # global memory is never deleted from here
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            removed_stems.add(path.stem)
            del self._cache[path_text]
            self._ordered = None
        self._recent = [r for r in self._recent if r.record_id != record_id]
        if removed_stems:
            self._update_index(add=None, remove=removed_stems)
        return bool(removed_stems)

    # ------------------------------------------------------------------ files

    def _require_roots(self) -> None:
        for root in (self.memory_dir, self.global_memory_dir):
            if root is not None and not root.is_dir():
                raise MemoryResourceError(
                    f"memory root {root} is missing; pass create=True to initialize a new memory", resource=str(root)
                )

    def _ensure_layout(self) -> None:
        self.memory_dir.mkdir(parents=True, exist_ok=True)
        for memory_type in MEMORY_TYPES:
            self._bucket(memory_type)
        index = self.memory_dir / _INDEX
        if not index.exists():
            _atomic_write(index, "# MEMORY\n")

    def _bucket(self, memory_type: str) -> Path:
        folder = self.memory_dir / memory_type
        if folder.is_symlink():
            raise MemoryResourceError(
                f"refusing to write through the symlinked memory folder {folder}", resource=str(folder)
            )
        folder.mkdir(exist_ok=True)
        if folder.resolve().parent != self.memory_dir:
            raise MemoryResourceError(f"memory folder {folder} resolves outside the root", resource=str(folder))
        return folder

    def _scan(self) -> list[MemoryRecord]:
        """Every current record, oldest first: one directory scan and one ``lstat`` per file;
        only new or changed files are parsed, and the ordering is reused when nothing changed."""
        roots = [("local", self.memory_dir)]
        if self.global_memory_dir is not None:
            roots.append(("global", self.global_memory_dir))
        current: dict[str, tuple[int, int, int, int]] = {}
        scopes: dict[str, tuple[str, Path]] = {}
        for scope, root in roots:
            found = _walk(str(root))
            current.update(found)
            if scope == "global":
                scopes.update(dict.fromkeys(found, (scope, root)))
        if current == self._keys and self._ordered is not None:
            return self._ordered  # nothing was added, removed or touched since the last scan
        cache = self._cache
        for path_text, key in current.items():
            cached = cache.get(path_text)
            if cached is None or cached.key != key:
                scope, root = scopes.get(path_text, ("local", self.memory_dir))
                record = _read_record(Path(path_text), root, scope, key[0])
                sort_key = (
                    (record.step_id, str(record.metadata.get("created_at", "")), record.record_id)
                    if record
                    else (0, "", "")
                )
                cache[path_text] = _Cached(key=key, record=record, sort_key=sort_key, scope=scope)
        for gone in cache.keys() - current.keys():
            del cache[gone]
        self._keys = current
        self._ordered = self._order()
        return self._ordered

    def _order(self) -> list[MemoryRecord]:
        # record_id -> (sort key, record, path, scope); local files win over global ones.
        found: dict[str, tuple[tuple[int, str, str], MemoryRecord, str, str]] = {}
        for path_text, cached in self._cache.items():
            record = cached.record
            if record is None:
                continue
            previous = found.get(record.record_id)
            if (
                previous is None
                or (previous[3] == "global" and cached.scope == "local")
                or (previous[3] == cached.scope and _prefer(path_text, previous[2], record.record_id))
            ):
                found[record.record_id] = (cached.sort_key, record, path_text, cached.scope)
        return [entry[1] for entry in sorted(found.values(), key=lambda entry: entry[0])]

    def _update_index(self, *, add: tuple[Path, MemoryRecord, str] | None, remove: set[str]) -> None:
        index = self.memory_dir / _INDEX
        try:
            readable = index.is_file() and not index.is_symlink()
            existing = index.read_text(encoding="utf-8").splitlines() if readable else []
        except OSError:
            existing = []
        entries = [line for line in existing if line.startswith("- ") and _line_stem(line) not in remove]
        if add is not None:
            path, record, memory_type = add
            snippet = " ".join(str(record.content).split())[:150]
            rel = path.relative_to(self.memory_dir).as_posix()
            entries.append(f"- [{memory_type}] {record.role} step={record.step_id}: {snippet} ({rel})")
        entries = entries[-self.max_index_entries :]
        header = "# MEMORY\n\n"
        while entries and len(header) + sum(len(e) + 1 for e in entries) > self.max_index_chars:
            entries.pop(0)
        _atomic_write(index, header + "".join(e + "\n" for e in entries))


def _line_stem(line: str) -> str:
    if line.endswith(".md)"):
        return line[line.rfind("/") + 1 : -4]
    return ""


def _prefer(candidate: str, current: str, record_id: str) -> bool:
    """Between two files of one scope holding one record id: the canonical (hash-named) file wins,
    else the smaller path (deterministic whatever the directory order)."""
    canonical = f"{_stem(record_id)}.md"
    a, b = os.path.basename(candidate) == canonical, os.path.basename(current) == canonical
    return (a and not b) or (a == b and candidate < current)


def _stem(record_id: str) -> str:
    return "r-" + sha256_hex(record_id)[:40]


def _memory_type(record: MemoryRecord) -> str:
    declared = str(record.metadata.get("type") or "").strip().lower()
    if declared in MEMORY_TYPES:
        return declared
    role = record.role.strip().lower()
    return role if role in ("feedback", "user", "reference") else "project"


def _walk(root: str) -> dict[str, tuple[int, int, int, int]]:
    """``{path: (mtime_ns, ctime_ns, size, inode)}`` of the regular ``*.md`` files under root (not
    MEMORY.md, not dotfiles). Symlinks are never followed: a linked file or folder is skipped."""
    out: dict[str, tuple[int, int, int, int]] = {}
    stack = [root]
    lstat, is_reg = os.stat, stat_mod.S_ISREG
    while stack:
        folder = stack.pop()
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
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


def _read_record(path: Path, root: Path, scope: str, mtime_ns: int) -> MemoryRecord | None:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise MemoryResourceError(f"memory record {path} cannot be read: {exc}", resource=str(path)) from exc
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


def _iso(mtime_ns: int) -> str:
    return datetime.fromtimestamp(mtime_ns / 1e9, UTC).isoformat()


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)  # replaces a symlink at ``path`` itself; never writes through it
