"""Descriptor-level file operations of a memdir root: nothing written outside it, no symlink followed.

Every open uses ``O_NOFOLLOW``, and writes go through directory descriptors, so a symlinked file or
folder is never read or written through: a walk skips it, a read fails with ``ELOOP`` (reported as
gone), a bucket or segment opened for writing is refused. A file is rewritten atomically (a
temporary file beside it, then ``os.replace``). ``MEMORY.md`` is published by overwriting a hidden
spare and renaming it over the index (the old index becomes the next spare): readers see a whole
index, and no non-empty file is released. Writers of one root take turns on an exclusive ``flock``
of the root directory.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat as stat_mod
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from uuid import uuid4

from qitos.core.memory import MemoryResourceError

__all__ = [
    "FILE_FLAGS",
    "INDEX_NAME",
    "FileKey",
    "file_key",
    "locked_root",
    "open_bucket",
    "publish_index",
    "read_bytes",
    "read_text_if_present",
    "regular_file_stat",
    "replace_file",
    "walk_markdown_files",
]

INDEX_NAME = "MEMORY.md"
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_SPARE = ".MEMORY.md.spare"
_SWAP = ".MEMORY.md.swap"

# (mtime_ns, ctime_ns, size, inode): what a file's cached contents are keyed on.
FileKey = tuple[int, int, int, int]


def file_key(st: os.stat_result) -> FileKey:
    """The cache key of a file's stat result."""
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)


# ---------------------------------------------------------------------- reading


def walk_markdown_files(root: str) -> dict[str, FileKey]:
    """``{path: key}`` of the regular ``*.md`` files under root (not the root's MEMORY.md, not
    dotfiles). Symlinks are never followed: a linked file or folder is skipped."""
    out: dict[str, FileKey] = {}
    stack = [root]
    lstat, is_reg = os.stat, stat_mod.S_ISREG
    while stack:
        folder = stack.pop()
        try:
            fd = os.open(folder, _DIRECTORY_FLAGS)
        except OSError:
            continue
        try:
            with os.scandir(fd) as entries:
                names = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries if e.name[0] != "."]
            prefix = folder + os.sep
            for name, is_dir in names:
                if is_dir:
                    stack.append(prefix + name)
                elif name.endswith(".md") and not (name == INDEX_NAME and folder == root):
                    try:
                        st = lstat(name, dir_fd=fd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if is_reg(st.st_mode):
                        out[prefix + name] = (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)
        finally:
            os.close(fd)
    return out


def regular_file_stat(dir_fd: int, folder: str, name: str) -> os.stat_result | None:
    """The stat of ``folder/name`` under ``dir_fd`` when both are what they seem (a real directory
    holding a regular file), else None: a symlink on the way is never read through."""
    try:
        if not stat_mod.S_ISDIR(os.stat(folder, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            return None
        st = os.stat(f"{folder}/{name}", dir_fd=dir_fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st if stat_mod.S_ISREG(st.st_mode) else None


def read_bytes(path: str, *, dir_fd: int | None = None) -> bytes:
    """The whole file, opened without following a symlink (ELOOP if it is one)."""
    fd = os.open(path, os.O_RDONLY | FILE_FLAGS, dir_fd=dir_fd)
    with open(fd, "rb", buffering=0, closefd=True) as handle:
        if not stat_mod.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        return handle.readall()


def read_text_if_present(path: str) -> str | None:
    """The file's UTF-8 text, or None when it was removed or replaced by a symlink since it was
    listed. Any other failure, undecodable bytes included, is a MemoryResourceError naming it."""
    try:
        data = read_bytes(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None
        raise MemoryResourceError(f"memory file {path} cannot be read: {exc}", resource=path) from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MemoryResourceError(f"memory file {path} is not UTF-8 text: {exc}", resource=path) from exc


# ---------------------------------------------------------------------- writing


@contextmanager
def locked_root(root: Path) -> Iterator[int]:
    """The root directory, opened and exclusively flock-ed: writers of one root take turns."""
    try:
        fd = os.open(root, _DIRECTORY_FLAGS)
    except OSError as exc:
        raise MemoryResourceError(f"memory root {root} cannot be opened: {exc}", resource=str(root)) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # releases the lock


def open_bucket(root_fd: int, root: Path, name: str) -> int:
    """The descriptor of the bucket folder ``name`` under the root (created if missing); a
    symlinked bucket is refused."""
    folder = root / name
    try:
        try:
            return os.open(name, _DIRECTORY_FLAGS, dir_fd=root_fd)
        except FileNotFoundError:
            with suppress(FileExistsError):
                os.mkdir(name, dir_fd=root_fd)
            return os.open(name, _DIRECTORY_FLAGS, dir_fd=root_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and folder.is_symlink():
            raise MemoryResourceError(
                f"refusing to write through the symlinked memory folder {folder}", resource=str(folder)
            ) from exc
        raise MemoryResourceError(f"memory folder {folder} cannot be opened: {exc}", resource=str(folder)) from exc


def replace_file(dir_fd: int, name: str, data: bytes, shown: str) -> None:
    """Write ``data`` to a new temporary file beside ``name`` and rename it over ``name``;
    ``shown`` names the file in errors."""
    tmp = f".{name}.{os.getpid()}.{uuid4().hex[:8]}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | FILE_FLAGS, 0o644, dir_fd=dir_fd)
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


def publish_index(root_fd: int, text: str) -> None:
    """Make ``text`` the index: overwrite the spare, rename it over MEMORY.md, keep the old index as
    the next spare (hard-linked aside first), so no non-empty file is ever released."""
    data, flags = text.encode("utf-8"), os.O_WRONLY | os.O_CREAT | FILE_FLAGS
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
            os.link(INDEX_NAME, _SWAP, src_dir_fd=root_fd, dst_dir_fd=root_fd, follow_symlinks=False)
        except FileExistsError:  # left by an interrupted publish
            os.unlink(_SWAP, dir_fd=root_fd)
            os.link(INDEX_NAME, _SWAP, src_dir_fd=root_fd, dst_dir_fd=root_fd, follow_symlinks=False)
        except FileNotFoundError:
            os.replace(_SPARE, INDEX_NAME, src_dir_fd=root_fd, dst_dir_fd=root_fd)  # the first index
            return
        os.replace(_SPARE, INDEX_NAME, src_dir_fd=root_fd, dst_dir_fd=root_fd)
        os.replace(_SWAP, _SPARE, src_dir_fd=root_fd, dst_dir_fd=root_fd)
    except OSError as exc:
        raise MemoryResourceError(f"memory index {INDEX_NAME} cannot be written: {exc}", resource=INDEX_NAME) from exc
