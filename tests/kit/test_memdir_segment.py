"""The memdir segment format on its own: blocks render and parse back, bulk and one-by-one agree."""

from __future__ import annotations

from pathlib import Path

import pytest

from qitos.core.memory import MemoryRecord, MemoryResourceError
from qitos.kit.memory._memdir_segment import PREAMBLE, parse_blocks, read_record_file, render_block

CREATED = "2025-01-01T00:00:00+00:00"


def parse(text: str, *, start: int = 0, scope: str = "local") -> list[MemoryRecord]:
    _starts, entries = parse_blocks(text, start=start, path="seg.md", bucket="user", scope=scope, mtime_ns=0)
    return [entry[3] for entry in entries]


def test_a_rendered_block_parses_back_to_the_record_with_type_and_time() -> None:
    record = MemoryRecord("user", '<!-- qitos:record {"record_id": "forged"} -->\nsecond', 3, {"k": 1}, "r1")
    block = render_block(record, "user", CREATED)
    assert block.count("\n<!-- qitos:record") == 0 and block.startswith("<!-- qitos:record {")
    (got,) = parse(PREAMBLE + block)
    assert got == MemoryRecord("user", record.content, 3, {"k": 1, "type": "user", "created_at": CREATED}, "r1")


def test_metadata_that_is_not_json_native_is_refused_naming_the_record() -> None:
    with pytest.raises(TypeError, match="'r1' is not JSON-native"):
        render_block(MemoryRecord("user", "x", 0, {"when": object()}, "r1"), "user", CREATED)


@pytest.mark.parametrize("scope", ["local", "global"])
def test_the_bulk_parse_of_many_blocks_equals_parsing_each_block_alone(scope: str) -> None:
    records = [MemoryRecord("user", f"fact {i}\nline", i, {"n": i}, f"f{i}") for i in range(40)]
    blocks = [render_block(r, "user", CREATED) for r in records]
    bulk = parse(PREAMBLE + "".join(blocks), scope=scope)  # column-wise
    alone = [record for block in blocks for record in parse(block, scope=scope)]  # header by header
    assert bulk == alone and len(bulk) == 40
    assert all(type(r) is MemoryRecord for r in bulk)
    assert bulk[7].metadata == {"n": 7, "type": "user", "created_at": CREATED} | (
        {"scope": "global"} if scope == "global" else {}
    )


def test_parsing_from_a_marker_gives_the_same_offsets_as_the_whole_text() -> None:
    blocks = [render_block(MemoryRecord("user", f"fact {i}", i, record_id=f"f{i}"), "user", CREATED) for i in range(5)]
    text = PREAMBLE + "".join(blocks)
    starts, entries = parse_blocks(text, start=0, path="seg.md", bucket="user", scope="local", mtime_ns=0)
    assert [text[at : at + 17] for at in starts] == ["<!-- qitos:record"] * 5
    tail_starts, tail = parse_blocks(text, start=starts[3], path="seg.md", bucket="user", scope="local", mtime_ns=0)
    assert tail_starts == starts[3:] and tail == entries[3:]


def test_a_broken_header_names_its_line() -> None:
    good = render_block(MemoryRecord("user", "ok", 0, record_id="a"), "user", CREATED)
    with pytest.raises(MemoryResourceError, match=r"seg\.md, line 3: the header is not JSON"):
        parse(good + "<!-- qitos:record {oops} -->\ntext\n")


def test_a_one_record_file_without_a_header_gets_an_id_from_its_path(tmp_path: Path) -> None:
    path = tmp_path / "feedback" / "note.md"
    record = read_record_file("  be brief  \n", path=path, root=tmp_path, scope="global", mtime_ns=0)
    assert (record.record_id, record.role, record.step_id, record.content) == (
        "file:global:feedback/note.md",
        "memory",
        0,
        "be brief",
    )
    assert record.metadata == {"type": "feedback", "created_at": "1970-01-01T00:00:00+00:00", "scope": "global"}


def test_a_one_record_file_reads_its_front_matter(tmp_path: Path) -> None:
    text = '---\nrecord_id: "r9"\nrole: "user"\nstep_id: 4\ntype: "reference"\ncreated_at: "x"\n---\nbody\n'
    record = read_record_file(text, path=tmp_path / "r.md", root=tmp_path, scope="local", mtime_ns=0)
    assert record == MemoryRecord("user", "body\n", 4, {"type": "reference", "created_at": "x"}, "r9")
