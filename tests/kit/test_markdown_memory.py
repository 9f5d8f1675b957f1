"""MarkdownFileMemory: a readable log, recall scoped to the instance."""

from __future__ import annotations

from pathlib import Path

import pytest

from qitos.core.memory import MemoryRecord
from qitos.kit.memory.markdown_file_memory import MarkdownFileMemory


def test_seed_example_existing_logs_are_not_reloaded(tmp_path: Path) -> None:
    path = tmp_path / "run-memory.md"
    first = MarkdownFileMemory(str(path))
    first.append(MemoryRecord("user", "remembered-value=17", 0, record_id="r1"))
    assert [r.content for r in first.retrieve()] == ["remembered-value=17"]
    second = MarkdownFileMemory(str(path))
    assert second.retrieve() == []  # recall is instance-scoped
    text = path.read_text(encoding="utf-8")
    assert "remembered-value=17" in text and "record_id: r1" in text and text.startswith("## user · step 0")


def test_appends_accumulate_in_the_log(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "memory.md"
    memory = MarkdownFileMemory(str(path))
    memory.append(MemoryRecord("user", "a", 0))
    memory.append(MemoryRecord("assistant", {"structured": [1, 2]}, 1))
    text = path.read_text(encoding="utf-8")
    assert text.index("a\n") < text.index('{"structured":[1,2]}')
    assert [r.content for r in memory.retrieve()] == ["a", {"structured": [1, 2]}]


def test_the_same_record_is_recalled_once(tmp_path: Path) -> None:
    memory = MarkdownFileMemory(str(tmp_path / "m.md"))
    record = MemoryRecord("user", "x", 0)
    memory.append(record)
    memory.append(record)
    assert memory.retrieve() == [record]


def test_recall_is_bounded_by_max_in_memory(tmp_path: Path) -> None:
    memory = MarkdownFileMemory(str(tmp_path / "m.md"), max_in_memory=3)
    for i in range(5):
        memory.append(MemoryRecord("user", f"f{i}", i))
    assert [r.content for r in memory.retrieve({"max_items": None})] == ["f2", "f3", "f4"]
    assert memory.evict() == 0
    assert (tmp_path / "m.md").read_text(encoding="utf-8").count("## user") == 5  # the log keeps everything


def test_delete_is_idempotent_and_noted_in_the_log(tmp_path: Path) -> None:
    memory = MarkdownFileMemory(str(tmp_path / "m.md"))
    memory.append(MemoryRecord("user", "x", 0, record_id="gone"))
    assert memory.delete("gone") is True
    assert memory.delete("gone") is False
    assert memory.retrieve() == []
    assert "deleted record_id: gone" in (tmp_path / "m.md").read_text(encoding="utf-8")


def test_reset_clears_recall_but_keeps_the_file(tmp_path: Path) -> None:
    memory = MarkdownFileMemory(str(tmp_path / "m.md"))
    memory.append(MemoryRecord("user", "x", 0))
    memory.reset()
    assert memory.retrieve() == [] and (tmp_path / "m.md").stat().st_size > 0
    assert memory.summarize() == "# MEMORY\n"


def test_queries_and_summary(tmp_path: Path) -> None:
    memory = MarkdownFileMemory(str(tmp_path / "m.md"))
    memory.append(MemoryRecord("user", "likes tea", 0))
    memory.append(MemoryRecord("feedback", "too long", 1))
    assert [r.content for r in memory.retrieve({"roles": ["feedback"]})] == ["too long"]
    assert "- user (step 0): likes tea" in memory.summarize()
    with pytest.raises(ValueError, match="unknown key"):
        memory.retrieve({"bogus": 1})


def test_bad_arguments_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_in_memory"):
        MarkdownFileMemory(str(tmp_path / "m.md"), max_in_memory=0)
    with pytest.raises(ValueError, match="is a directory"):
        MarkdownFileMemory(str(tmp_path))
    with pytest.raises(TypeError, match="MemoryRecord"):
        MarkdownFileMemory(str(tmp_path / "m.md")).append("text")  # type: ignore[arg-type]
