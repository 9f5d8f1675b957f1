"""MemoryRecord, the Memory protocol and MemoryResourceError."""

from __future__ import annotations

import pickle

import pytest

from qitos.core._errors import QitosError, RunError
from qitos.core.memory import Memory, MemoryRecord, MemoryResourceError, record_revision
from qitos.kit.memory.markdown_file_memory import MarkdownFileMemory
from qitos.kit.memory.memdir_memory import MemdirMemory


def test_seed_record_example_and_defaults() -> None:
    record = MemoryRecord("user", "remembered-value=17", 0)
    assert (record.role, record.content, record.step_id, record.metadata) == ("user", "remembered-value=17", 0, {})
    assert len(record.record_id) == 32


def test_independent_equal_facts_receive_distinct_ids() -> None:
    a, b = MemoryRecord("user", "same", 0), MemoryRecord("user", "same", 0)
    assert a.record_id != b.record_id and a != b


@pytest.mark.parametrize(
    ("args", "field"),
    [(("", "x", 0), "role"), (("user", "x", "0"), "step_id"), (("user", "x", True), "step_id")],
)
def test_invalid_records_name_the_field(args: tuple[object, ...], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        MemoryRecord(*args)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="record_id"):
        MemoryRecord("user", "x", 0, record_id="")
    with pytest.raises(ValueError, match="metadata"):
        MemoryRecord("user", "x", 0, metadata=[1])  # type: ignore[arg-type]


def test_revision_changes_with_content_and_is_stable() -> None:
    a = MemoryRecord("user", "v1", 0, record_id="r")
    assert record_revision(a) == record_revision(MemoryRecord("user", "v1", 0, record_id="r"))
    assert record_revision(a) != record_revision(MemoryRecord("user", "v2", 0, record_id="r"))
    assert len(record_revision(MemoryRecord("user", object(), 0))) == 64  # non-JSON content still digests


def test_memory_resource_error_is_a_run_error_that_pickles() -> None:
    err = MemoryResourceError("root missing", resource="/x")
    assert isinstance(err, RunError) and isinstance(err, QitosError)
    back = pickle.loads(pickle.dumps(err))
    assert (str(back), back.resource) == ("root missing", "/x")


def test_kit_memories_satisfy_the_protocol(tmp_path: object) -> None:
    from pathlib import Path

    root = Path(str(tmp_path))
    assert isinstance(MemdirMemory(str(root / "m"), create=True), Memory)
    assert isinstance(MarkdownFileMemory(str(root / "m.md")), Memory)
