"""``qitos memory list|add|delete`` over a memdir directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from qitos.kit.memory.memdir_memory import MemdirMemory

RECORD_KEYS = {"record_id", "role", "type", "step_id", "created_at", "content", "metadata"}


def test_add_creates_the_memory_and_list_shows_the_record(cli: Any, workdir: Path) -> None:
    added = cli.json("memory", "add", "Prefers short answers", "--type", "user", "--json")
    assert set(added) == RECORD_KEYS
    assert (added["content"], added["type"], added["role"]) == ("Prefers short answers", "user", "user")
    assert (workdir / ".qitos" / "memory" / "MEMORY.md").is_file()
    listed = cli.json("memory", "list", "--json")
    assert listed["dir"] == str(workdir / ".qitos" / "memory")
    assert [r["record_id"] for r in listed["records"]] == [added["record_id"]]
    human = cli.run("memory", "list", code=0).stdout
    assert "Prefers short answers" in human and added["record_id"] in human


def test_records_written_by_the_library_are_listed(cli: Any, workdir: Path) -> None:
    from qitos.core.memory import MemoryRecord

    memory = MemdirMemory(str(workdir / "mem"), create=True)
    memory.append(MemoryRecord(role="assistant", content="The build uses hatch", step_id=3, record_id="r-1"))
    rows = cli.json("memory", "list", "--dir", "mem", "--json")["records"]
    assert [(r["record_id"], r["step_id"], r["type"]) for r in rows] == [("r-1", 3, "project")]


def test_add_with_the_same_id_replaces_and_filters_narrow_the_list(cli: Any, workdir: Path) -> None:
    cli.run("memory", "add", "first", "--id", "fact-1", code=0)
    cli.run("memory", "add", "second", "--id", "fact-1", code=0)
    cli.run("memory", "add", "a reference", "--type", "reference", code=0)
    rows = cli.json("memory", "list", "--json")["records"]
    assert sorted(r["content"] for r in rows) == ["a reference", "second"]
    only = cli.json("memory", "list", "--type", "reference", "--json")["records"]
    assert [r["content"] for r in only] == ["a reference"]
    found = cli.json("memory", "list", "--contains", "SECOND", "--json")["records"]
    assert [r["record_id"] for r in found] == ["fact-1"]


def test_delete_removes_the_record_and_deleting_it_again_exits_3(cli: Any, workdir: Path) -> None:
    cli.run("memory", "add", "forget me", "--id", "gone", code=0)
    assert cli.json("memory", "delete", "gone", "--json") == {"record_id": "gone", "deleted": True}
    assert cli.json("memory", "list", "--json")["records"] == []
    again = cli.run("memory", "delete", "gone", code=3)
    assert "no record 'gone'" in again.stderr


def test_list_without_a_memory_dir_is_an_empty_listing_and_creates_nothing(cli: Any, workdir: Path) -> None:
    assert "no memories in nowhere" in cli.run("memory", "list", "--dir", "nowhere", code=0).stdout
    assert cli.json("memory", "list", "--dir", "nowhere", "--json")["records"] == []
    assert "no memory at nowhere" in cli.run("memory", "delete", "x", "--dir", "nowhere", code=3).stderr
    assert not (workdir / "nowhere").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["add", "x", "--type", "secret"], "--type must be one of"),
        (["add", "   "], "empty"),
        (["list", "--type", "nope"], "--type must be one of"),
    ],
)
def test_memory_usage_errors_exit_2(cli: Any, workdir: Path, args: list[str], message: str) -> None:
    cli.run("memory", "add", "seed", code=0)
    assert message in cli.run("memory", *args, code=2).stderr
