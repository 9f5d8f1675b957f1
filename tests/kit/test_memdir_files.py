"""Memdir file operations: walks and reads never follow symlinks, replaces never write through one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qitos.core.memory import MemoryResourceError
from qitos.kit.memory._memdir_files import (
    locked_root,
    publish_index,
    read_text_if_present,
    replace_file,
    walk_markdown_files,
)


def test_the_walk_lists_regular_markdown_files_only(tmp_path: Path) -> None:
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "records.md").write_text("x")
    (tmp_path / "note.md").write_text("y")
    (tmp_path / "MEMORY.md").write_text("index")
    (tmp_path / "user" / "MEMORY.md").write_text("not the index: a note")
    (tmp_path / ".hidden.md").write_text("dotfile")
    (tmp_path / "data.txt").write_text("not markdown")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "secret.md").write_text("s")
    (tmp_path / "linked.md").symlink_to(outside / "secret.md")
    (tmp_path / "linked-folder").symlink_to(outside)
    found = walk_markdown_files(str(tmp_path))
    assert sorted(Path(p).relative_to(tmp_path).as_posix() for p in found) == [
        "note.md",
        "user/MEMORY.md",
        "user/records.md",
    ]
    st = os.stat(tmp_path / "note.md")
    assert found[str(tmp_path / "note.md")] == (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)


def test_a_read_of_a_vanished_or_symlinked_file_is_none_and_bad_bytes_are_an_error(tmp_path: Path) -> None:
    (tmp_path / "real.md").write_text("text")
    (tmp_path / "link.md").symlink_to(tmp_path / "real.md")
    (tmp_path / "bad.md").write_bytes(b"\xff\xfe")
    assert read_text_if_present(str(tmp_path / "real.md")) == "text"
    assert read_text_if_present(str(tmp_path / "link.md")) is None
    assert read_text_if_present(str(tmp_path / "gone.md")) is None
    with pytest.raises(MemoryResourceError, match="not UTF-8") as info:
        read_text_if_present(str(tmp_path / "bad.md"))
    assert info.value.resource == str(tmp_path / "bad.md")


def test_replacing_a_symlinked_file_replaces_the_link_not_its_target(tmp_path: Path) -> None:
    target = tmp_path / "target.md"
    target.write_text("untouched")
    (tmp_path / "records.md").symlink_to(target)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        replace_file(fd, "records.md", b"new", "records.md")
    finally:
        os.close(fd)
    assert target.read_text() == "untouched"
    assert not (tmp_path / "records.md").is_symlink() and (tmp_path / "records.md").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records.md", "target.md"]  # no temporary left


def test_publishing_keeps_the_previous_index_as_the_spare(tmp_path: Path) -> None:
    with locked_root(tmp_path) as root_fd:
        publish_index(root_fd, "# MEMORY\n\n- first\n")
        publish_index(root_fd, "# MEMORY\n\n- second\n")
    assert (tmp_path / "MEMORY.md").read_text() == "# MEMORY\n\n- second\n"
    assert (tmp_path / ".MEMORY.md.spare").read_text() == "# MEMORY\n\n- first\n"
    assert not (tmp_path / ".MEMORY.md.swap").exists()
