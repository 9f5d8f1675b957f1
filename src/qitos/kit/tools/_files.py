"""Workspace file tools confined to one root: list, read, write, edit, search.

``workspace_tools(root)`` returns :class:`~qitos.core._tool.ToolSpec` objects ready for a
:class:`~qitos.core._tool.ToolRegistry`:

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

Hard links: a second name for a file cannot be told apart from the first, and the other name may
be outside the workspace (``ln /etc/app.conf ws/app.conf``). So a file with more than one hard link
(``st_nlink > 1``) is refused by ``read_file``, ``write_file`` and ``edit_file`` and skipped (and
counted) by ``search_files``, unless ``allow_hard_links=True`` says every link to the workspace's
files is trusted. Listings show such files (a name reveals nothing of the content).

How a file is opened: the checked real path is opened with ``O_NOFOLLOW`` (a symlink swapped in
for the last component after the check fails to open) and ``O_NONBLOCK`` (a FIFO cannot hang the
tool); what was opened is then ``fstat``-ed: it must be a regular file, have one link (see above),
and be the same file (device and inode) as the path checked afresh after the open, so a directory
swapped for a symlink meanwhile is caught too. ``write_file`` creates a new file with ``O_EXCL`` and
writes an existing one in place through the checked descriptor (it never follows a link to write).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from qitos.core._errors import RunError
from qitos.core._tool import DEFAULT_MAX_OUTPUT_CHARS, ToolRegistry, ToolSpec, tool

__all__ = ["HardLinkError", "WorkspacePathError", "resolve_in_workspace", "workspace_tools"]

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
    allow_hard_links: bool = False,
) -> list[ToolSpec]:
    """File tools confined to ``root`` (which must be an existing directory); ``allow_hard_links``
    lets them use files with several hard links (see the module docstring)."""
    base = Path(root).resolve(strict=False)
    if not base.is_dir():
        raise WorkspacePathError(f"workspace root {str(root)!r} is not an existing directory")
    opener = _Opener(base, allow_hard_links=allow_hard_links)

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
        text = opener.read_text(path)
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
        linked = 0
        for file in files:
            try:
                text = opener.read_text(rel(file), max_bytes=_MAX_SEARCH_FILE_BYTES)
            except HardLinkError:
                linked += 1
                continue
            except (ValueError, OSError):  # too large, not UTF-8, unreadable, or changed meanwhile
                continue
            for lineno, line in enumerate(text.splitlines(), start=1):
                if pattern.search(line):
                    hits.append(f"{rel(file)}:{lineno}: {line.strip()}")
                    if len(hits) >= _MAX_SEARCH_RESULTS:
                        hits.append(f"... (stopped after {_MAX_SEARCH_RESULTS} matches)")
                        return "\n".join(hits)
        if linked:
            hits.append(f"({linked} file(s) with several hard links skipped)")
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
        opener.write_text(path, content)
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
        text = opener.read_text(path)
        count = text.count(old)
        if count == 0:
            raise ValueError(f"the text to replace was not found in {path!r}")
        if count > 1 and not replace_all:
            raise ValueError(
                f"the text to replace occurs {count} times in {path!r}; give a longer, unique snippet "
                "or set replace_all"
            )
        opener.write_text(path, text.replace(old, new) if replace_all else text.replace(old, new, 1))
        return f"replaced {count if replace_all else 1} occurrence(s) in {rel(target)}"

    read_only: list[tuple[Callable[..., Any], bool]] = [(list_files, True), (read_file, True), (search_files, True)]
    writers: list[tuple[Callable[..., Any], bool]] = [(write_file, True), (edit_file, False)]
    return [
        _spec(fn, idempotent=idempotent, max_output_chars=max_output_chars)
        for fn, idempotent in read_only + (writers if writable else [])
    ]


def _spec(fn: Callable[..., object], *, idempotent: bool, max_output_chars: int | None) -> ToolSpec:
    # Registering through a throwaway registry reuses @tool's schema and docstring handling.
    return ToolRegistry().register(tool(idempotent=idempotent, max_output_chars=max_output_chars)(fn))


class HardLinkError(WorkspacePathError):
    """A file has more than one hard link, so its other names may lie outside the workspace."""


_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_O_BINARY = getattr(os, "O_BINARY", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_OPEN_FLAGS = _O_NOFOLLOW | _O_NONBLOCK | _O_BINARY | _O_CLOEXEC


class _Opener:
    """Opens workspace files by the rules of the module docstring."""

    def __init__(self, base: Path, *, allow_hard_links: bool) -> None:
        self.base = base
        self.allow_hard_links = allow_hard_links

    def read_text(self, path: str, *, max_bytes: int | None = None) -> str:
        """The UTF-8 text of workspace file ``path``."""
        target = resolve_in_workspace(self.base, path)
        if not target.is_file():
            raise FileNotFoundError(f"no file {path!r} in the workspace")
        fd = self._open(target, path, os.O_RDONLY)
        with os.fdopen(fd, "rb") as fh:
            if max_bytes is not None and os.fstat(fh.fileno()).st_size > max_bytes:
                raise ValueError(f"{path!r} is larger than {max_bytes} bytes")
            data = fh.read()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path!r} is not a UTF-8 text file") from exc

    def write_text(self, path: str, content: str) -> None:
        """Create workspace file ``path`` or overwrite it in place (never through a link)."""
        data = content.encode("utf-8")
        target = resolve_in_workspace(self.base, path)
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, 0o666)
        except FileExistsError:
            fd = self._open(target, path, os.O_WRONLY)
            os.ftruncate(fd, 0)
        else:
            try:
                self._check_opened(fd, target, path)
            except BaseException:
                os.close(fd)
                raise
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)

    def _open(self, target: Path, path: str, flags: int) -> int:
        try:
            fd = os.open(target, flags | _OPEN_FLAGS)
        except OSError as exc:
            if target.is_symlink():  # the checked path became a symlink after the check
                raise WorkspacePathError(f"{path!r} changed while it was being opened") from exc
            raise
        try:
            self._check_opened(fd, target, path)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _check_opened(self, fd: int, target: Path, path: str) -> None:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            raise WorkspacePathError(f"{path!r} is not a regular file")
        if opened.st_nlink > 1 and not self.allow_hard_links:
            raise HardLinkError(
                f"{path!r} has {opened.st_nlink} hard links; a file with several names may also live outside "
                "the workspace, so it is not used (workspace_tools(allow_hard_links=True) trusts them)"
            )
        # The path checked afresh must still name what was opened (nothing was swapped meanwhile).
        again = resolve_in_workspace(self.base, path)
        try:
            current = os.stat(again, follow_symlinks=False)
        except OSError as exc:
            raise WorkspacePathError(f"{path!r} changed while it was being opened") from exc
        if again != target or (current.st_dev, current.st_ino) != (opened.st_dev, opened.st_ino):
            raise WorkspacePathError(f"{path!r} changed while it was being opened")


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
