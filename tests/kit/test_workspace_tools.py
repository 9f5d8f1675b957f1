"""Workspace file tools through a real ToolRegistry: they work inside the root and refuse every escape."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qitos.core._tool import ToolRegistry
from qitos.kit.tools._files import WorkspacePathError, workspace_tools


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "notes").mkdir(parents=True)
    (root / "notes" / "a.md").write_text("# A\nalpha line\nshared word\n")
    (root / "notes" / "b.md").write_text("# B\nbeta line\nshared word\n")
    (root / "top.txt").write_text("top\n")
    (tmp_path / "secret.txt").write_text("outside secret\n")
    return root


@pytest.fixture
def registry(workspace: Path) -> ToolRegistry:
    return ToolRegistry(workspace_tools(workspace))


def ok(registry: ToolRegistry, name: str, **args: object) -> str:
    result = registry.call(name, args, call_id="t")
    assert result.ok, result.error
    assert isinstance(result.output, str)
    return result.output


def refused(registry: ToolRegistry, name: str, **args: object) -> str:
    result = registry.call(name, args, call_id="t")
    assert not result.ok and result.error_kind == "tool_error"
    assert result.error is not None and result.error.startswith(("WorkspacePathError", "HardLinkError"))
    return result.error


def test_the_tool_set_and_its_declared_properties(workspace: Path) -> None:
    specs = {s.name: s for s in workspace_tools(workspace)}
    assert sorted(specs) == ["edit_file", "list_files", "read_file", "search_files", "write_file"]
    assert {n for n, s in specs.items() if s.idempotent} == {"list_files", "read_file", "search_files", "write_file"}
    assert specs["read_file"].parameters["required"] == ["path"]
    assert specs["read_file"].description.startswith("Read a UTF-8 text file")
    assert "relative to the workspace root" in specs["read_file"].parameters["properties"]["path"]["description"]
    assert sorted(s.name for s in workspace_tools(workspace, writable=False)) == [
        "list_files",
        "read_file",
        "search_files",
    ]


def test_list_read_search_write_and_edit_inside_the_workspace(registry: ToolRegistry, workspace: Path) -> None:
    assert ok(registry, "list_files") == "notes/\ntop.txt"
    assert ok(registry, "list_files", path="notes", recursive=True) == "notes/a.md\nnotes/b.md"
    assert ok(registry, "read_file", path="notes/a.md") == "# A\nalpha line\nshared word\n"
    assert ok(registry, "read_file", path="notes/a.md", start_line=2, max_lines=1) == "alpha line\n"
    assert ok(registry, "search_files", query="shared") == "notes/a.md:3: shared word\nnotes/b.md:3: shared word"
    assert ok(registry, "search_files", query=r"^\w+ line$", regex=True, path="notes") == (
        "notes/a.md:2: alpha line\nnotes/b.md:2: beta line"
    )
    assert ok(registry, "search_files", query="absent") == "no matches for 'absent'"
    assert ok(registry, "write_file", path="out/index.md", content="- a\n- b\n") == "wrote 8 characters to out/index.md"
    assert (workspace / "out" / "index.md").read_text() == "- a\n- b\n"
    assert (
        ok(registry, "edit_file", path="out/index.md", old="- b", new="- B")
        == "replaced 1 occurrence(s) in out/index.md"
    )
    assert (workspace / "out" / "index.md").read_text() == "- a\n- B\n"


def test_edit_needs_a_unique_snippet_unless_replace_all(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "dup.txt").write_text("x x x")
    result = registry.call("edit_file", {"path": "dup.txt", "old": "x", "new": "y"})
    assert not result.ok and "occurs 3 times" in (result.error or "")
    result = registry.call("edit_file", {"path": "dup.txt", "old": "zzz", "new": "y"})
    assert not result.ok and "not found" in (result.error or "")
    assert ok(registry, "edit_file", path="dup.txt", old="x", new="y", replace_all=True).startswith("replaced 3")
    assert (workspace / "dup.txt").read_text() == "y y y"


def test_missing_binary_and_directory_targets_fail_clearly(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "blob.bin").write_bytes(b"\xff\xfe\x00\x01")
    assert "no file 'nope.md'" in (registry.call("read_file", {"path": "nope.md"}).error or "")
    assert "not a UTF-8 text file" in (registry.call("read_file", {"path": "blob.bin"}).error or "")
    assert "is a directory" in (registry.call("write_file", {"path": "notes", "content": "x"}).error or "")
    assert "not a directory" in (registry.call("list_files", {"path": "top.txt"}).error or "")


@pytest.mark.parametrize(
    "path",
    ["../secret.txt", "notes/../../secret.txt", "..", "notes/..\\..\\secret.txt"],
)
def test_dot_dot_paths_are_refused(registry: ToolRegistry, path: str) -> None:
    assert "'..' is not allowed" in refused(registry, "read_file", path=path)


def test_absolute_paths_are_refused_even_inside_the_workspace(registry: ToolRegistry, workspace: Path) -> None:
    assert "absolute paths are not allowed" in refused(registry, "read_file", path=str(workspace / "top.txt"))
    assert "absolute paths are not allowed" in refused(registry, "write_file", path="/tmp/x", content="x")
    assert "not allowed" in refused(registry, "read_file", path="C:\\Windows\\win.ini")


def test_nul_bytes_and_empty_paths_are_refused(registry: ToolRegistry) -> None:
    assert "NUL" in refused(registry, "read_file", path="top.txt\x00.md")
    assert "non-empty relative path" in refused(registry, "read_file", path="  ")


def test_symlinks_escaping_the_workspace_are_refused_for_every_operation(
    registry: ToolRegistry, workspace: Path, tmp_path: Path
) -> None:
    (workspace / "link.txt").symlink_to(tmp_path / "secret.txt")
    (workspace / "outdir").symlink_to(tmp_path)
    for name, args in [
        ("read_file", {"path": "link.txt"}),
        ("read_file", {"path": "outdir/secret.txt"}),
        ("write_file", {"path": "outdir/new.txt", "content": "x"}),
        ("write_file", {"path": "link.txt", "content": "overwrite"}),
        ("edit_file", {"path": "link.txt", "old": "outside", "new": "pwned"}),
        ("list_files", {"path": "outdir"}),
        ("search_files", {"query": "secret", "path": "outdir"}),
    ]:
        assert "resolves outside the workspace" in refused(registry, name, **args)
    assert (tmp_path / "secret.txt").read_text() == "outside secret\n"
    assert not (tmp_path / "new.txt").exists()
    # Listings and searches of the workspace itself skip the escaping links instead of following them.
    assert "link.txt" not in ok(registry, "list_files", recursive=True)
    assert ok(registry, "search_files", query="outside") == "no matches for 'outside'"


def test_symlinks_that_stay_inside_the_workspace_work(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "alias.md").symlink_to(workspace / "notes" / "a.md")
    assert ok(registry, "read_file", path="alias.md").startswith("# A")
    assert "alias.md" in ok(registry, "list_files")


def test_read_only_tools_cannot_write(workspace: Path) -> None:
    registry = ToolRegistry(workspace_tools(workspace, writable=False))
    result = registry.call("write_file", {"path": "x.txt", "content": "x"})
    assert result.error_kind == "unknown_tool"
    assert not (workspace / "x.txt").exists()


def test_a_missing_root_is_refused_up_front(tmp_path: Path) -> None:
    with pytest.raises(WorkspacePathError, match="not an existing directory"):
        workspace_tools(tmp_path / "missing")


def test_large_files_are_capped_by_the_tool_output_limit(workspace: Path) -> None:
    (workspace / "big.txt").write_text("x" * 5000)
    registry = ToolRegistry(workspace_tools(workspace, max_output_chars=1000))
    result = registry.call("read_file", {"path": "big.txt"})
    assert result.ok and result.truncated and "[truncated 4000 of 5000 characters]" in result.output


def test_paths_are_reported_relative_to_the_root(registry: ToolRegistry, workspace: Path) -> None:
    output = ok(registry, "search_files", query="top")
    assert output == "top.txt:1: top" and os.sep + "ws" not in output


# --------------------------------------------------------------------------- hard links


def test_a_hard_link_to_a_file_outside_is_not_read_searched_or_written(
    registry: ToolRegistry, workspace: Path, tmp_path: Path
) -> None:
    os.link(tmp_path / "secret.txt", workspace / "hard.txt")
    for name, args in [
        ("read_file", {"path": "hard.txt"}),
        ("write_file", {"path": "hard.txt", "content": "overwritten"}),
        ("edit_file", {"path": "hard.txt", "old": "outside", "new": "pwned"}),
    ]:
        assert "2 hard links" in refused(registry, name, **args)
    assert (tmp_path / "secret.txt").read_text() == "outside secret\n"
    found = ok(registry, "search_files", query="outside")
    assert "outside secret" not in found and "1 file(s) with several hard links skipped" in found
    assert "outside secret" not in ok(registry, "search_files", query="outside", path="hard.txt")
    assert "hard.txt" in ok(registry, "list_files")  # a name alone reveals nothing


def test_allow_hard_links_trusts_multiply_linked_files(workspace: Path) -> None:
    os.link(workspace / "top.txt", workspace / "twin.txt")
    registry = ToolRegistry(workspace_tools(workspace, allow_hard_links=True))
    assert ok(registry, "read_file", path="twin.txt") == "top\n"
    ok(registry, "write_file", path="twin.txt", content="both\n")
    assert (workspace / "top.txt").read_text() == "both\n"


def test_writes_create_new_files_and_overwrite_in_place(registry: ToolRegistry, workspace: Path) -> None:
    inode = (workspace / "top.txt").stat().st_ino
    ok(registry, "write_file", path="top.txt", content="short\n")
    assert (workspace / "top.txt").read_text() == "short\n" and (workspace / "top.txt").stat().st_ino == inode
    ok(registry, "write_file", path="deep/new/file.txt", content="new\n")
    assert (workspace / "deep" / "new" / "file.txt").read_text() == "new\n"


def test_a_fifo_is_refused_without_hanging(registry: ToolRegistry, workspace: Path) -> None:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    os.mkfifo(workspace / "pipe")
    assert "no file 'pipe'" in (registry.call("read_file", {"path": "pipe"}).error or "")
    assert not registry.call("write_file", {"path": "pipe", "content": "x"}).ok


def test_a_symlink_swapped_in_while_tools_run_never_leaks_or_changes_the_outside_file(
    registry: ToolRegistry, workspace: Path, tmp_path: Path
) -> None:
    """Regression: another process flips a workspace file to a symlink pointing outside, over and over."""
    import threading

    victim = workspace / "victim.txt"
    victim.write_text("inside\n")
    stop = threading.Event()

    def swap() -> None:
        spare = workspace / "spare.lnk"
        real = workspace / "real.tmp"
        while not stop.is_set():
            spare.unlink(missing_ok=True)
            spare.symlink_to(tmp_path / "secret.txt")
            os.replace(spare, victim)  # victim is now a symlink to the outside
            real.write_text("inside\n")
            os.replace(real, victim)  # and a regular file again

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    try:
        for i in range(400):
            read = registry.call("read_file", {"path": "victim.txt"})
            assert not (read.ok and "outside" in str(read.output))
            registry.call("write_file", {"path": "victim.txt", "content": f"write {i}\n"})
    finally:
        stop.set()
        swapper.join(timeout=5)
    assert (tmp_path / "secret.txt").read_text() == "outside secret\n"
