"""MemdirMemory: restore-by-default, fresh disk reads, no duplicates, safe paths, index limits."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from qitos.core.memory import MemoryRecord, MemoryResourceError
from qitos.kit.memory.memdir_memory import MemdirMemory


def files_under(path: Path) -> set[str]:
    return {p.relative_to(path).as_posix() for p in path.rglob("*")}


def record_file(memory: MemdirMemory, record_id: str) -> Path:
    (path,) = [p for p in memory.memory_dir.rglob("r-*.md") if f'record_id: "{record_id}"' in p.read_text()]
    return path


def test_seed_example_restores_in_a_new_instance(tmp_path: Path) -> None:
    root = str(tmp_path / "project-memory")
    memory = MemdirMemory(root, create=True)
    memory.append(MemoryRecord("user", "remembered-value=17", 0, record_id="fact-1"))
    later = MemdirMemory(root)  # restore is the default
    (record,) = later.retrieve()
    assert (record.record_id, record.role, record.content, record.step_id) == (
        "fact-1",
        "user",
        "remembered-value=17",
        0,
    )
    assert record.metadata["type"] == "user"


def test_a_missing_root_raises_unless_create_is_given(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(MemoryResourceError, match="create=True") as info:
        MemdirMemory(str(missing))
    assert info.value.resource == str(missing)
    assert not missing.exists()  # restore never creates
    MemdirMemory(str(missing), create=True)
    assert (missing / "MEMORY.md").is_file()
    assert {p.name for p in missing.iterdir() if p.is_dir()} == {"feedback", "project", "reference", "runtime", "user"}


def test_a_root_removed_after_binding_is_reported(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    for p in sorted((tmp_path / "m").rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    (tmp_path / "m").rmdir()
    with pytest.raises(MemoryResourceError, match="missing"):
        memory.append(MemoryRecord("user", "x", 0))
    with pytest.raises(MemoryResourceError):
        memory.retrieve()


def test_appending_the_same_record_twice_keeps_one(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    record = MemoryRecord("user", "v1", 1, record_id="r")
    memory.append(record)
    memory.append(record)
    memory.append(MemoryRecord("user", "v2", 2, record_id="r", metadata={"type": "reference"}))
    (only,) = memory.retrieve()
    assert only.content == "v2" and only.metadata["type"] == "reference"
    assert len(list(memory.memory_dir.rglob("r-*.md"))) == 1  # moved bucket, no stale copy


def test_equal_facts_with_distinct_ids_are_both_kept(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    memory.append(MemoryRecord("user", "same", 0))
    memory.append(MemoryRecord("user", "same", 0))
    assert len(memory.retrieve()) == 2


def test_retrieval_sees_external_edits_additions_and_removals(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    memory.append(MemoryRecord("user", "old-value", 0, record_id="a"))
    memory.append(MemoryRecord("project", "to-remove", 1, record_id="b"))
    assert [r.content for r in memory.retrieve()] == ["old-value", "to-remove"]
    path_a = record_file(memory, "a")
    path_a.write_text(path_a.read_text().replace("old-value", "new-value"))
    record_file(memory, "b").unlink()
    (memory.memory_dir / "reference" / "handwritten.md").write_text("Deploys happen on Fridays.\n")
    got = memory.retrieve()
    assert [r.content for r in got] == ["new-value", "Deploys happen on Fridays."]
    assert got[1].record_id == "file:local:reference/handwritten.md" and got[1].role == "memory"
    assert "new-value" in memory.summarize()  # never a stale index snippet


def test_an_in_place_edit_of_the_same_size_is_seen(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    memory.append(MemoryRecord("user", "value=1", 0, record_id="a"))
    assert memory.retrieve()[0].content == "value=1"
    path = record_file(memory, "a")
    stat = path.stat()
    with open(path, "r+", encoding="utf-8") as handle:  # same size, mtime forced back
        text = handle.read()
        handle.seek(0)
        handle.write(text.replace("value=1", "value=2"))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert memory.retrieve()[0].content == "value=2"  # ctime still moved


def test_another_process_appending_and_editing_is_seen(tmp_path: Path) -> None:
    root = tmp_path / "shared"
    memory = MemdirMemory(str(root), create=True)
    memory.append(MemoryRecord("user", "from-parent", 0, record_id="parent"))
    assert [r.record_id for r in memory.retrieve()] == ["parent"]
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from qitos.core.memory import MemoryRecord
        from qitos.kit.memory.memdir_memory import MemdirMemory
        memory = MemdirMemory({str(root)!r})
        memory.append(MemoryRecord("feedback", "from-child", 5, record_id="child"))
        for path in Path({str(root)!r}).rglob("r-*.md"):
            text = path.read_text()
            if '"parent"' in text:
                path.write_text(text.replace("from-parent", "edited-by-child"))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    got = memory.retrieve()
    assert [(r.record_id, r.content) for r in got] == [("parent", "edited-by-child"), ("child", "from-child")]
    assert len({r.record_id for r in got}) == len(got)


def test_delete_is_local_and_idempotent(tmp_path: Path) -> None:
    glob = MemdirMemory(str(tmp_path / "global"), create=True)
    glob.append(MemoryRecord("user", "global-fact", 0, record_id="shared-id"))
    glob.append(MemoryRecord("user", "only-global", 0, record_id="g"))
    memory = MemdirMemory(str(tmp_path / "local"), global_memory_dir=str(tmp_path / "global"), create=True)
    memory.append(MemoryRecord("user", "local-fact", 1, record_id="shared-id"))
    by_id = {r.record_id: r for r in memory.retrieve()}
    assert by_id["shared-id"].content == "local-fact"  # local wins over global
    assert by_id["g"].metadata["scope"] == "global"
    assert memory.delete("shared-id") is True
    assert memory.delete("shared-id") is False
    assert memory.delete("never-existed") is False
    assert memory.delete("g") is False  # global memory is never deleted from here
    assert {r.content for r in memory.retrieve()} == {"global-fact", "only-global"}
    assert len(glob.retrieve()) == 2
    assert "local-fact" not in (memory.memory_dir / "MEMORY.md").read_text()


def test_a_missing_global_root_is_reported(tmp_path: Path) -> None:
    with pytest.raises(MemoryResourceError, match="global-missing"):
        MemdirMemory(str(tmp_path / "m"), global_memory_dir=str(tmp_path / "global-missing"), create=True)


@pytest.mark.parametrize(
    "record_id",
    ["../x", "../../../../tmp/evil", "/etc/passwd", "..\\..\\win", "a/b/c", "", "\x00nul", "MEMORY"],
)
def test_record_ids_can_never_name_a_path_outside_the_root(tmp_path: Path, record_id: str) -> None:
    root = tmp_path / "root" / "m"
    memory = MemdirMemory(str(root), create=True)
    before = files_under(tmp_path)
    if not record_id:
        with pytest.raises(ValueError, match="record_id"):
            MemoryRecord("user", "x", 0, record_id=record_id)
        return
    memory.append(MemoryRecord("../../role", "payload", 0, record_id=record_id, metadata={"type": "../../../escape"}))
    new = files_under(tmp_path) - before
    assert new and all(n.startswith("root/m/") for n in new)
    assert all(Path(tmp_path, n).resolve().is_relative_to(root) for n in new)
    (got,) = memory.retrieve({"record_ids": [record_id]})
    assert (got.content, got.role) == ("payload", "../../role")


def test_a_symlinked_bucket_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    (memory.memory_dir / "user").rmdir()
    (memory.memory_dir / "user").symlink_to(outside, target_is_directory=True)
    with pytest.raises(MemoryResourceError, match="symlink"):
        memory.append(MemoryRecord("user", "x", 0))
    assert list(outside.iterdir()) == []


def test_symlinked_files_are_never_read_or_written_through(tmp_path: Path) -> None:
    secret = tmp_path / "secret.md"
    secret.write_text("outside secret")
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    (memory.memory_dir / "project" / "link.md").symlink_to(secret)
    assert memory.retrieve() == []
    # A symlink planted at a record's own path is replaced, not written through.
    record = MemoryRecord("project", "inside", 0, record_id="planted")
    memory.append(record)
    target = record_file(memory, "planted")
    target.unlink()
    target.symlink_to(secret)
    memory.append(record)
    assert secret.read_text() == "outside secret"
    assert not target.is_symlink() and "inside" in target.read_text()


def test_index_respects_entry_and_character_limits(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True, max_index_entries=3)
    for i in range(10):
        memory.append(MemoryRecord("user", f"fact number {i}", i))
    lines = [line for line in (memory.memory_dir / "MEMORY.md").read_text().splitlines() if line.startswith("- ")]
    assert len(lines) == 3 and "fact number 9" in lines[-1]
    small = MemdirMemory(str(tmp_path / "s"), create=True, max_index_chars=200)
    for i in range(10):
        small.append(MemoryRecord("user", "long content " * 20, i))
    assert len((small.memory_dir / "MEMORY.md").read_text()) <= 200
    assert len(small.summarize()) <= 200
    assert len(small.retrieve({"max_items": None})) == 10  # the index limits never drop records


def test_query_filters(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    memory.append(MemoryRecord("user", "likes Tea", 0))
    memory.append(MemoryRecord("feedback", "too verbose", 1))
    memory.append(MemoryRecord("assistant", "noted tea", 2, metadata={"type": "runtime"}))
    assert [r.content for r in memory.retrieve({"roles": ["feedback"]})] == ["too verbose"]
    assert [r.content for r in memory.retrieve({"contains": "TEA"})] == ["likes Tea", "noted tea"]
    assert [r.content for r in memory.retrieve({"type": "runtime"})] == ["noted tea"]
    assert [r.content for r in memory.retrieve({"max_items": 1})] == ["noted tea"]
    with pytest.raises(ValueError, match="unknown key"):
        memory.retrieve({"where": "x"})
    with pytest.raises(ValueError, match="max_items"):
        memory.retrieve({"max_items": -1})


def test_reset_and_evict_touch_only_the_append_cache(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True, max_index_entries=2)
    for i in range(5):
        memory.append(MemoryRecord("user", f"f{i}", i))
    assert memory.evict() == 3
    memory.reset()
    assert len(memory.retrieve()) == 5


def test_only_text_and_json_metadata_are_persisted(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    with pytest.raises(TypeError, match="text records only"):
        memory.append(MemoryRecord("user", {"not": "text"}, 0))
    with pytest.raises(TypeError, match="metadata"):
        memory.append(MemoryRecord("user", "x", 0, metadata={"when": object()}))
    assert memory.retrieve() == []


def test_content_that_looks_like_a_header_round_trips(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    tricky = "---\nrecord_id: fake\n---\nline two\n\n"
    memory.append(MemoryRecord("user", tricky, 3, record_id="real", metadata={"k": [1, "two"]}))
    (got,) = MemdirMemory(str(tmp_path / "m")).retrieve()
    assert (got.record_id, got.content, got.step_id, got.metadata["k"]) == ("real", tricky, 3, [1, "two"])


@pytest.mark.parametrize("kwargs", [{"max_index_entries": 0}, {"max_index_chars": -1}])
def test_index_limits_must_be_positive(tmp_path: Path, kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        MemdirMemory(str(tmp_path / "m"), create=True, **kwargs)  # type: ignore[arg-type]
