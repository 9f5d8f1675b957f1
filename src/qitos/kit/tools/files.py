"""Workspace file tools confined to one root: list, read, write, edit, search.

``workspace_tools(root)`` returns :class:`~qitos.core.tool.ToolSpec` objects ready for a
:class:`~qitos.core.tool.ToolRegistry`:

========================  =========================================  ==========
tool                      does                                       idempotent
========================  =========================================  ==========
``list_files``            entries of a directory (optionally deep)   yes
``read_file``             text of a file, optionally a line range    yes
``search_files``          lines containing a text (or regex)         yes
``write_file``            create or overwrite a file                 yes
``edit_file``             replace one exact snippet in a file        no
========================  =========================================  ==========

(``writable=False`` leaves out the last two.) Every path argument is relative to the root. A path
is refused, with :class:`WorkspacePathError`, when it is absolute, contains a ``..`` component or a
NUL byte, or resolves (following symlinks) outside the root. Listings and searches do not descend
into symlinked directories, and skip symlinked files that point outside the root.

Checks happen when a tool is called; a symlink swapped in by another process between the check and
the open is not defended against (the workspace is assumed not to be shared with an adversary).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from qitos.core.errors import RunError
from qitos.core.tool import DEFAULT_MAX_OUTPUT_CHARS, ToolRegistry, ToolSpec, tool

__all__ = ["WorkspacePathError", "resolve_in_workspace", "workspace_tools"]

_MAX_LIST_ENTRIES = 1_000
_MAX_SEARCH_RESULTS = 200
_MAX_SEARCH_FILE_BYTES = 2_000_000


class WorkspacePathError(RunError, PermissionError):
    """A path argument is not allowed: it leaves the workspace or is malformed."""


def resolve_in_workspace(root: Path, path: str) -> Path:
    """The real path of ``path`` inside ``root`` (already resolved), or WorkspacePathError."""
    if not isinstance(path, str) or not path.strip():
        raise WorkspacePathError(f"path must be a non-empty relative path, got {path!r}")
    if "\x00" in path:
        raise WorkspacePathError("path contains a NUL byte")
    if os.path.isabs(path) or PurePosixPath(path).is_absolute() or PureWindowsPath(path).is_absolute():
        raise WorkspacePathError(f"absolute paths are not allowed: {path!r} (use a path relative to the workspace)")
    if PureWindowsPath(path).drive:
        raise WorkspacePathError(f"drive paths are not allowed: {path!r}")
    parts = re.split(r"[\\/]+", path)
    if ".." in parts:
        raise WorkspacePathError(f"'..' is not allowed in paths: {path!r}")
    resolved = (root / path).resolve(strict=False)
    if resolved != root and not resolved.is_relative_to(root):
        raise WorkspacePathError(f"{path!r} resolves outside the workspace (through a symlink)")
    return resolved


def workspace_tools(
    root: str | os.PathLike[str],
    *,
    writable: bool = True,
    max_output_chars: int | None = DEFAULT_MAX_OUTPUT_CHARS,
) -> list[ToolSpec]:
    """File tools confined to ``root`` (which must be an existing directory)."""
    base = Path(root).resolve(strict=False)
    if not base.is_dir():
        raise WorkspacePathError(f"workspace root {str(root)!r} is not an existing directory")

    def rel(p: Path) -> str:
        return p.relative_to(base).as_posix() or "."

    def list_files(path: str = ".", recursive: bool = False) -> str:
        """List the files and directories under a workspace directory (directories end with /).

        Args:
            path: Directory relative to the workspace root.
            recursive: Also list everything below it.
        """
        target = resolve_in_workspace(base, path)
        if not target.is_dir():
            raise NotADirectoryError(f"{path!r} is not a directory")
        lines: list[str] = []
        for entry in _walk(target, base, recursive):
            lines.append(rel(entry) + ("/" if entry.is_dir() and not entry.is_symlink() else ""))
            if len(lines) >= _MAX_LIST_ENTRIES:
                lines.append(f"... (stopped after {_MAX_LIST_ENTRIES} entries)")
                break
        return "\n".join(lines) if lines else "(empty directory)"

    def read_file(path: str, start_line: int = 1, max_lines: int | None = None) -> str:
        """Read a UTF-8 text file in the workspace.

        Args:
            path: File relative to the workspace root.
            start_line: First line to return (1-based).
            max_lines: Return at most this many lines.
        """
        if start_line < 1:
            raise ValueError(f"start_line must be >= 1, got {start_line}")
        if max_lines is not None and max_lines < 1:
            raise ValueError(f"max_lines must be >= 1, got {max_lines}")
        target = resolve_in_workspace(base, path)
        text = _read_text(target, path)
        if start_line == 1 and max_lines is None:
            return text
        lines = text.splitlines(keepends=True)
        end = None if max_lines is None else start_line - 1 + max_lines
        return "".join(lines[start_line - 1 : end])

    def search_files(query: str, path: str = ".", regex: bool = False) -> str:
        """Find lines containing a text in the workspace's files; returns path:line: text.

        Args:
            query: Text to look for (case-sensitive), or a regular expression if regex is true.
            path: Directory (or file) relative to the workspace root to search in.
            regex: Treat query as a Python regular expression.
        """
        if not query:
            raise ValueError("query must not be empty")
        pattern = re.compile(query if regex else re.escape(query))
        target = resolve_in_workspace(base, path)
        files = [target] if target.is_file() else [p for p in _walk(target, base, True) if p.is_file()]
        hits: list[str] = []
        for file in files:
            if file.stat().st_size > _MAX_SEARCH_FILE_BYTES:
                continue
            try:
                text = file.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            for lineno, line in enumerate(text.splitlines(), start=1):
                if pattern.search(line):
                    hits.append(f"{rel(file)}:{lineno}: {line.strip()}")
                    if len(hits) >= _MAX_SEARCH_RESULTS:
                        hits.append(f"... (stopped after {_MAX_SEARCH_RESULTS} matches)")
                        return "\n".join(hits)
        return "\n".join(hits) if hits else f"no matches for {query!r}"

    def write_file(path: str, content: str) -> str:
        """Create or overwrite a UTF-8 text file in the workspace (parent directories are created).

        Args:
            path: File relative to the workspace root.
            content: The complete new content of the file.
        """
        target = resolve_in_workspace(base, path)
        if target == base or target.is_dir():
            raise IsADirectoryError(f"{path!r} is a directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        # Re-check after creating parents: a parent may have been a symlink created meanwhile.
        resolve_in_workspace(base, path)
        target.write_text(content, encoding="utf-8")
        return f"wrote {len(content)} characters to {rel(target)}"

    def edit_file(path: str, old: str, new: str, replace_all: bool = False) -> str:
        """Replace an exact snippet of a workspace file. The snippet must occur exactly once
        unless replace_all is true.

        Args:
            path: File relative to the workspace root.
            old: The exact text to replace (including whitespace).
            new: The replacement text.
            replace_all: Replace every occurrence instead of requiring exactly one.
        """
        if not old:
            raise ValueError("old must not be empty")
        target = resolve_in_workspace(base, path)
        text = _read_text(target, path)
        count = text.count(old)
        if count == 0:
            raise ValueError(f"the text to replace was not found in {path!r}")
        if count > 1 and not replace_all:
            raise ValueError(
                f"the text to replace occurs {count} times in {path!r}; give a longer, unique snippet "
                "or set replace_all"
            )
        target.write_text(text.replace(old, new) if replace_all else text.replace(old, new, 1), encoding="utf-8")
        return f"replaced {count if replace_all else 1} occurrence(s) in {rel(target)}"

    read_only: list[tuple[Callable[..., Any], bool]] = [(list_files, True), (read_file, True), (search_files, True)]
    writers: list[tuple[Callable[..., Any], bool]] = [(write_file, True), (edit_file, False)]
    return [
        _spec(fn, idempotent=idempotent, max_output_chars=max_output_chars)
        for fn, idempotent in read_only + (writers if writable else [])
    ]


def _spec(fn: Callable[..., Any], *, idempotent: bool, max_output_chars: int | None) -> ToolSpec:
    # Registering through a throwaway registry reuses @tool's schema and docstring handling.
    return ToolRegistry().register(tool(idempotent=idempotent, max_output_chars=max_output_chars)(fn))


def _read_text(target: Path, path: str) -> str:
    if not target.is_file():
        raise FileNotFoundError(f"no file {path!r} in the workspace")
    try:
        return target.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path!r} is not a UTF-8 text file") from exc


def _walk(directory: Path, base: Path, recursive: bool) -> Iterator[Path]:
    """Entries under ``directory`` in sorted order, never following symlinked directories and
    skipping symlinks that point outside ``base``."""
    try:
        entries = sorted(directory.iterdir(), key=lambda p: p.name)
    except OSError:
        return
    for entry in entries:
        if entry.is_symlink():
            real = entry.resolve(strict=False)
            if real != base and not real.is_relative_to(base):
                continue
            yield entry
            continue
        yield entry
        if recursive and entry.is_dir():
            yield from _walk(entry, base, recursive)
