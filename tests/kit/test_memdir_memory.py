"""MemdirMemory: restore-by-default, segment files, fresh disk reads, no duplicates, safe paths, index limits."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from qitos.core._codec import sha256_hex
from qitos.core.memory import MemoryRecord, MemoryResourceError
from qitos.kit.memory._memdir_segment import SEGMENT_NAME
from qitos.kit.memory.memdir_memory import MemdirMemory

MARK = "<!-- qitos:record "


def files_under(path: Path) -> set[str]:
    return {p.relative_to(path).as_posix() for p in path.rglob("*")}


def segment(memory: MemdirMemory, memory_type: str) -> Path:
    return memory.memory_dir / memory_type / SEGMENT_NAME


def block_ids(path: Path) -> list[str]:
    """The record ids of a segment's marker lines, in file order."""
    lines = path.read_text().split("\n") if path.exists() else []
    return [json.loads(line[len(MARK) : -4])["record_id"] for line in lines if line.startswith(MARK)]


def index_entries(memory: MemdirMemory) -> list[str]:
    return [line for line in (memory.memory_dir / "MEMORY.md").read_text().splitlines() if line.startswith("- ")]


def run_python(script: str) -> None:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


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


def test_records_live_in_one_readable_segment_per_type(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    memory.append(MemoryRecord("user", "likes tea", 0, record_id="u1"))
    memory.append(MemoryRecord("user", "two\nlines", 1, record_id="u2"))
    memory.append(MemoryRecord("assistant", "build uses hatch", 2, record_id="p1"))
    text = segment(memory, "user").read_text()
    preamble, _, rest = text.partition(MARK)
    assert "QitOS memory segment" in preamble and "ignored" in preamble
    assert block_ids(segment(memory, "user")) == ["u1", "u2"]
    assert block_ids(segment(memory, "project")) == ["p1"]
    header = json.loads(rest.split("\n", 1)[0][:-4])
    assert sorted(header) == ["created_at", "metadata", "record_id", "role", "step_id", "type"]
    assert "\nlikes tea\n" in text and "\ntwo\nlines\n" in text
    assert not list(memory.memory_dir.rglob("r-*.md"))
    assert index_entries(memory)[-1].endswith('(project/records.md, id "p1")')


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
    assert block_ids(segment(memory, "user")) == ["r"]
    memory.append(MemoryRecord("user", "v2", 2, record_id="r", metadata={"type": "reference"}))
    (only,) = memory.retrieve()
    assert only.content == "v2" and only.metadata["type"] == "reference"
    assert block_ids(segment(memory, "user")) == []  # moved bucket, no stale copy
    assert block_ids(segment(memory, "reference")) == ["r"]
    (line,) = index_entries(memory)
    assert line.endswith('(reference/records.md, id "r")')
    (again,) = MemdirMemory(str(tmp_path / "m")).retrieve()
    assert again.content == "v2"


def test_new_ids_append_in_place_and_a_replacement_rewrites_without_the_old_block(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    memory.append(MemoryRecord("user", "a1", 0, record_id="a"))
    path = segment(memory, "user")
    inode = path.stat().st_ino
    memory.append(MemoryRecord("user", "b1", 1, record_id="b"))
    memory.append(MemoryRecord("user", "c1", 2, record_id="c"))
    assert path.stat().st_ino == inode  # plain appends
    memory.append(MemoryRecord("user", "b2", 1, record_id="b"))
    assert path.stat().st_ino != inode  # atomic rewrite (temporary file + rename)
    assert block_ids(path) == ["a", "c", "b"]
    assert "b1" not in path.read_text()
    assert [(r.record_id, r.content) for r in memory.retrieve()] == [("a", "a1"), ("b", "b2"), ("c", "c1")]
    assert [(r.record_id, r.content) for r in MemdirMemory(str(tmp_path / "m")).retrieve()] == [
        ("a", "a1"),
        ("b", "b2"),
        ("c", "c1"),
    ]
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_equal_facts_with_distinct_ids_are_both_kept(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    memory.append(MemoryRecord("user", "same", 0))
    memory.append(MemoryRecord("user", "same", 0))
    assert len(memory.retrieve()) == 2


def test_retrieval_sees_external_edits_additions_and_removals(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    memory.append(MemoryRecord("user", "old-value", 0, record_id="a"))
    memory.append(MemoryRecord("project", "to-remove", 1, record_id="b"))
    memory.append(MemoryRecord("project", "stays", 2, record_id="c"))
    assert [r.content for r in memory.retrieve()] == ["old-value", "to-remove", "stays"]
    user = segment(memory, "user")
    user.write_text(user.read_text().replace("old-value", "new-value, edited by hand"))
    project = segment(memory, "project")
    text = project.read_text()
    start = text.index(MARK + '{"created_at"')  # the first block ("b")
    end = text.index(MARK, start + 1)
    project.write_text(text[:start] + text[end:])
    (memory.memory_dir / "reference" / "handwritten.md").write_text("Deploys happen on Fridays.\n")
    got = memory.retrieve()
    assert [r.content for r in got] == ["new-value, edited by hand", "Deploys happen on Fridays.", "stays"]
    assert got[1].record_id == "file:local:reference/handwritten.md" and got[1].role == "memory"
    assert "new-value" in memory.summarize()  # never a stale index snippet


@pytest.mark.parametrize("which", ["first", "last"])
def test_an_in_place_edit_of_the_same_size_is_seen(tmp_path: Path, which: str) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    memory.append(MemoryRecord("user", "first=1", 0, record_id="a"))
    memory.append(MemoryRecord("user", "last=1", 1, record_id="b"))
    assert [r.content for r in memory.retrieve()] == ["first=1", "last=1"]
    path = segment(memory, "user")
    stat = path.stat()
    with open(path, "r+", encoding="utf-8") as handle:  # same size, mtime forced back
        text = handle.read()
        handle.seek(0)
        handle.write(text.replace(f"{which}=1", f"{which}=2"))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    expected = {"first": ["first=2", "last=1"], "last": ["first=1", "last=2"]}[which]
    assert [r.content for r in memory.retrieve()] == expected  # ctime still moved


def test_another_process_appending_and_editing_is_seen(tmp_path: Path) -> None:
    root = tmp_path / "shared"
    memory = MemdirMemory(str(root), create=True)
    memory.append(MemoryRecord("user", "from-parent", 0, record_id="parent"))
    assert [r.record_id for r in memory.retrieve()] == ["parent"]
    run_python(
        f"""
        from qitos.core.memory import MemoryRecord
        from qitos.kit.memory.memdir_memory import MemdirMemory
        memory = MemdirMemory({str(root)!r})
        memory.append(MemoryRecord("user", "appended-by-child", 5, record_id="child-user"))
        memory.append(MemoryRecord("feedback", "from-child", 6, record_id="child"))
        """
    )
    got = memory.retrieve()
    assert [(r.record_id, r.content) for r in got] == [
        ("parent", "from-parent"),
        ("child-user", "appended-by-child"),
        ("child", "from-child"),
    ]
    run_python(
        f"""
        from pathlib import Path
        path = Path({str(root / "user" / SEGMENT_NAME)!r})
        path.write_text(path.read_text().replace("from-parent", "edited-by-child"))
        """
    )
    got = memory.retrieve()
    assert [(r.record_id, r.content) for r in got][:2] == [
        ("parent", "edited-by-child"),
        ("child-user", "appended-by-child"),
    ]
    assert len({r.record_id for r in got}) == len(got) == 3


def test_an_external_append_parses_only_the_new_tail(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    for i in range(40):
        memory.append(MemoryRecord("user", f"fact {i}", i, record_id=f"f{i}"))
    reader = MemdirMemory(str(tmp_path / "m"))
    before = reader.retrieve({"max_items": None})
    memory.append(MemoryRecord("user", "fact 40", 40, record_id="f40"))
    after = reader.retrieve({"max_items": None})
    assert [r.record_id for r in after] == [f"f{i}" for i in range(41)]
    assert all(a is b for a, b in zip(before[:-1], after[:39], strict=True))  # not parsed again
    assert after[39] == before[39] and after[39] is not before[39]  # the old last block was re-read
    path = segment(memory, "user")
    path.write_text(path.read_text().replace("\nfact 0\n", "\nfact zero\n"))  # an edit before the tail
    edited = reader.retrieve({"max_items": None})
    assert edited[0].content == "fact zero" and edited[1] is not after[1]  # the whole file was parsed again
    assert [r.content for r in edited[1:]] == [r.content for r in after[1:]]


def test_nothing_changed_returns_the_same_records(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    memory.append(MemoryRecord("user", "x", 0, record_id="x"))
    first = memory.retrieve()
    assert all(a is b for a, b in zip(first, memory.retrieve(), strict=True))


def test_two_processes_writing_at_once_lose_nothing(tmp_path: Path) -> None:
    root = tmp_path / "m"
    MemdirMemory(str(root), create=True)
    go = tmp_path / "go"
    script = """
        import sys, time
        from pathlib import Path
        from qitos.core.memory import MemoryRecord
        from qitos.kit.memory.memdir_memory import MemdirMemory
        name, root, go = sys.argv[1], sys.argv[2], Path(sys.argv[3])
        memory = MemdirMemory(root)
        memory.retrieve()
        (go.parent / f"ready-{name}").touch()
        while not go.exists():
            time.sleep(0.001)
        for i in range(150):
            memory.append(MemoryRecord("user", f"{name} {i}", i, record_id=f"{name}-{i}"))
            if name == "b":  # a replacement rewrites the segment while the other process appends to it
                memory.append(MemoryRecord("user", f"shared {i}", i, record_id="shared"))
        """
    children = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(script), name, str(root), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready-{name}").exists() for name in ("a", "b")) and time.monotonic() < deadline:
        time.sleep(0.005)
    go.touch()  # both start writing at once
    for child in children:
        _, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
    expected = {f"{name}-{i}" for name in ("a", "b") for i in range(150)} | {"shared"}
    ids = block_ids(root / "user" / SEGMENT_NAME)
    assert sorted(ids) == sorted(expected)  # every block once, none lost, none doubled
    got = MemdirMemory(str(root)).retrieve({"max_items": None})
    assert {r.record_id for r in got} == expected
    assert next(r.content for r in got if r.record_id == "shared") == "shared 149"


def test_hand_dropped_and_earlier_layout_files_are_still_records(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    legacy = memory.memory_dir / "user" / f"r-{sha256_hex('legacy')[:40]}.md"
    legacy.write_text(
        '---\nrecord_id: "legacy"\nrole: "user"\ntype: "user"\nstep_id: 3\n'
        'created_at: "2025-01-01T00:00:00+00:00"\nmetadata: {"k": 1}\n---\nold layout text'
    )
    old_line = f"- [user] user step=3: old layout text (user/{legacy.name})"
    (memory.memory_dir / "MEMORY.md").write_text(f"# MEMORY\n\n{old_line}\n")
    note = memory.memory_dir / "reference" / "notes" / "deploy.md"
    note.parent.mkdir()
    note.write_text("\n  Deploys happen on Fridays.  \n")
    got = {r.record_id: r for r in memory.retrieve()}
    assert got["legacy"].content == "old layout text" and got["legacy"].metadata["k"] == 1
    assert got["legacy"].step_id == 3
    assert got["file:local:reference/notes/deploy.md"].content == "Deploys happen on Fridays."
    memory.append(MemoryRecord("user", "new text", 4, record_id="legacy"))  # moves into the segment
    assert not legacy.exists()
    assert block_ids(segment(memory, "user")) == ["legacy"]
    assert [line for line in index_entries(memory) if "legacy" in line or "r-" in line] == [
        '- [user] user step=4: new text (user/records.md, id "legacy")'
    ]
    assert memory.delete("file:local:reference/notes/deploy.md") is True
    assert not note.exists()
    assert [(r.record_id, r.content) for r in MemdirMemory(str(tmp_path / "m")).retrieve()] == [("legacy", "new text")]


@pytest.mark.parametrize(
    "content",
    [
        '<!-- qitos:record {"record_id": "fake", "role": "user"} -->',
        'intro\n<!-- qitos:record {"record_id": "fake"} -->\nafter',
        "\\<!-- qitos:record one backslash\n\\\\<!-- qitos:record two backslashes",
        "<!-- qitos:record\n<!-- qitos:recordless",
        " <!-- qitos:record indented, not a marker",
        "",
        "\n\ntrailing newlines\n\n",
        "windows\r\nline\r\nendings\r\n",
        "no newline at the end",
    ],
)
def test_marker_like_and_edge_content_round_trips(tmp_path: Path, content: str) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    memory.append(MemoryRecord("user", "before", 0, record_id="before"))
    memory.append(MemoryRecord("user", content, 1, record_id="tricky"))
    memory.append(MemoryRecord("user", "after", 2, record_id="after"))
    assert block_ids(segment(memory, "user")) == ["before", "tricky", "after"]  # no marker was forged
    for reader in (memory, MemdirMemory(str(tmp_path / "m"))):
        assert [(r.record_id, r.content) for r in reader.retrieve()] == [
            ("before", "before"),
            ("tricky", content),
            ("after", "after"),
        ]


def test_a_text_line_that_looks_like_a_marker_is_stored_with_one_more_backslash(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    memory.append(MemoryRecord("user", '<!-- qitos:record {"record_id": "x"} -->\n\\<!-- qitos:record y', 0))
    lines = segment(memory, "user").read_text().split("\n")
    assert '\\<!-- qitos:record {"record_id": "x"} -->' in lines
    assert "\\\\<!-- qitos:record y" in lines


@pytest.mark.parametrize(
    ("marker", "why"),
    [
        ('<!-- qitos:record {"record_id": "b", -->', "not JSON"),
        ('<!-- qitos:record ["b"] -->', "not a JSON object"),
        ('<!-- qitos:record {"role": "user"} -->', "no record_id"),
        ('<!-- qitos:record {"record_id": ""} -->', "no record_id"),
        ('<!-- qitos:record {"record_id": "b"}', "must read"),
        ("<!-- qitos:record notes for later -->", "not JSON"),
    ],
)
def test_a_broken_marker_is_an_error_naming_file_and_line(tmp_path: Path, marker: str, why: str) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    for i in range(20):  # enough blocks for the column-wise parse
        memory.append(MemoryRecord("user", f"fact {i}", i, record_id=f"f{i}"))
    path = segment(memory, "user")
    text = path.read_text()
    broken = text + marker + "\nsecond line of a hand-written record\n"
    path.write_text(broken)
    line = broken[: broken.index(marker)].count("\n") + 1
    for reader in (memory, MemdirMemory(str(tmp_path / "m"))):
        with pytest.raises(MemoryResourceError, match=f"line {line}: .*{why}") as info:
            reader.retrieve()
        assert info.value.resource == str(path) and str(path) in str(info.value)
    with pytest.raises(MemoryResourceError, match=f"line {line}"):
        MemdirMemory(str(tmp_path / "m")).append(MemoryRecord("user", "new", 99, record_id="new"))
    assert path.read_text() == broken  # nothing guessed, nothing written
    path.write_text(text + "\\" + marker + "\nsecond line of a hand-written record\n")  # escaped: now text
    got = memory.retrieve({"max_items": None})
    assert len(got) == 20
    assert got[-1].content == f"fact 19\n{marker}\nsecond line of a hand-written record"


@pytest.mark.parametrize("records_before", [0, 20])  # one by one, and column-wise
@pytest.mark.parametrize("odd", ['"step_id": "x"', '"step_id": true, "type": ["user"]', '"role": "", "metadata": 3'])
def test_hand_written_headers_get_defaults(tmp_path: Path, records_before: int, odd: str) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    for i in range(records_before):
        memory.append(MemoryRecord("user", f"fact {i}", i, record_id=f"f{i}"))
    path = segment(memory, "user")
    with path.open("a", encoding="utf-8") as handle:
        handle.write(f'<!-- qitos:record {{"record_id": "mine", {odd}}} -->\nby hand\n')
    for reader in (memory, MemdirMemory(str(tmp_path / "m"))):
        mine = reader.retrieve({"record_ids": ["mine"]})[0]
        assert (mine.role, mine.step_id, mine.content, mine.metadata["type"]) == ("memory", 0, "by hand", "user")
        assert isinstance(mine.metadata["created_at"], str)


@pytest.mark.parametrize("odd_type", ['["user"]', '"secret"', "null"])
def test_a_complete_header_with_an_odd_type_falls_back_to_the_bucket(tmp_path: Path, odd_type: str) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    for i in range(20):
        memory.append(MemoryRecord("assistant", f"fact {i}", i, record_id=f"f{i}", metadata={"type": "reference"}))
    path = segment(memory, "reference")
    fields = '"created_at": "2030-01-01", "metadata": {}, "record_id": "odd", "role": "x", "step_id": 99'
    header = f'{{{fields}, "type": {odd_type}}}'
    with path.open("a", encoding="utf-8") as handle:
        handle.write(f"<!-- qitos:record {header} -->\nodd type\n")
    got = MemdirMemory(str(tmp_path / "m")).retrieve({"max_items": None})
    assert len(got) == 21 and got[-1].record_id == "odd"
    assert (got[-1].metadata["type"], got[-1].step_id, got[-1].role) == ("reference", 99, "x")
    assert {r.metadata["type"] for r in got} == {"reference"}


def test_a_large_segment_is_parsed_with_the_collector_left_as_it_was(tmp_path: Path) -> None:
    root = tmp_path / "m"
    MemdirMemory(str(root), create=True)
    blocks = [
        f'<!-- qitos:record {{"created_at":"2025-01-01T00:00:00+00:00","metadata":{{}},"record_id":"r{i}",'
        f'"role":"user","step_id":{i},"type":"user"}} -->\nfact {i}\n'
        for i in range(1500)
    ]
    (root / "user" / SEGMENT_NAME).write_text("written by a script\n" + "".join(blocks))
    assert gc.isenabled()
    got = MemdirMemory(str(root)).retrieve({"max_items": None})
    assert gc.isenabled()
    assert len(got) == 1500 and got[-1].content == "fact 1499"
    gc.disable()
    try:
        MemdirMemory(str(root)).retrieve()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_an_append_after_a_hand_edit_that_dropped_the_final_newline(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    memory.append(MemoryRecord("user", "first", 0, record_id="a"))
    path = segment(memory, "user")
    path.write_text(path.read_text().rstrip("\n") + " (edited)")
    for writer in (memory, MemdirMemory(str(tmp_path / "m"))):
        writer.append(MemoryRecord("user", f"next {id(writer)}", 1))
    got = MemdirMemory(str(tmp_path / "m")).retrieve()
    assert got[0].content == "first (edited)"
    assert len(got) == 3 and len(block_ids(path)) == 3


def test_a_hand_written_segment_with_crlf_and_bare_markers_reads_and_rewrites(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    path = segment(memory, "project")
    path.write_text(
        "notes kept by hand\r\n"
        '<!-- qitos:record {"record_id": "a", "step_id": 1} -->\r\nline one\r\nline two\n'
        '<!-- qitos:record {"record_id": "b", "step_id": 2} -->\n'  # no text, no blank line
        '<!-- qitos:record {"record_id": "c", "step_id": 3} -->\nlast, no final newline',
        newline="",
    )
    expected = [("a", "line one\r\nline two"), ("b", ""), ("c", "last, no final newline")]
    assert [(r.record_id, r.content) for r in memory.retrieve()] == expected
    assert memory.delete("b") is True
    memory.append(MemoryRecord("project", "appended", 4, record_id="d"))
    memory.append(MemoryRecord("project", "replaced", 1, record_id="a"))
    expected = [("a", "replaced"), ("c", "last, no final newline"), ("d", "appended")]
    for reader in (memory, MemdirMemory(str(tmp_path / "m"))):
        assert [(r.record_id, r.content) for r in reader.retrieve()] == expected
    assert path.read_bytes().startswith(b"notes kept by hand\r\n")


def test_duplicate_ids_in_one_segment_the_last_block_wins(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    memory.append(MemoryRecord("user", "one", 0, record_id="dup"))
    memory.append(MemoryRecord("user", "other", 1, record_id="other"))
    path = segment(memory, "user")
    text = path.read_text()
    first = text[text.index(MARK) : text.index(MARK + '{"created_at"', text.index(MARK) + 1)]
    path.write_text(text + first.replace("\none\n", "\ncopied later\n"))
    got = memory.retrieve()
    assert [(r.record_id, r.content) for r in got] == [("dup", "copied later"), ("other", "other")]
    assert memory.delete("dup") is True
    assert block_ids(path) == ["other"]


def test_delete_is_local_and_idempotent(tmp_path: Path) -> None:
    glob = MemdirMemory(str(tmp_path / "global"), create=True)
    glob.append(MemoryRecord("user", "global-fact", 0, record_id="shared-id"))
    glob.append(MemoryRecord("user", "only-global", 0, record_id="g"))
    memory = MemdirMemory(str(tmp_path / "local"), global_memory_dir=str(tmp_path / "global"), create=True)
    memory.append(MemoryRecord("user", "local-fact", 1, record_id="shared-id"))
    memory.append(MemoryRecord("user", "local-other", 2, record_id="kept"))
    by_id = {r.record_id: r for r in memory.retrieve()}
    assert by_id["shared-id"].content == "local-fact"  # local wins over global
    assert by_id["g"].metadata["scope"] == "global" and "scope" not in by_id["kept"].metadata
    path = segment(memory, "user")
    inode = path.stat().st_ino
    assert memory.delete("shared-id") is True
    assert path.stat().st_ino != inode and block_ids(path) == ["kept"]  # rewritten without the block
    assert memory.delete("shared-id") is False
    assert memory.delete("never-existed") is False
    assert memory.delete("g") is False  # global memory is never deleted from here
    assert {r.content for r in memory.retrieve()} == {"global-fact", "only-global", "local-other"}
    assert len(glob.retrieve()) == 2
    assert block_ids(segment(glob, "user")) == ["shared-id", "g"]
    index = (memory.memory_dir / "MEMORY.md").read_text()
    assert "local-fact" not in index and "local-other" in index


def test_global_memory_is_read_fresh_from_its_segments(tmp_path: Path) -> None:
    glob = MemdirMemory(str(tmp_path / "global"), create=True)
    memory = MemdirMemory(str(tmp_path / "local"), global_memory_dir=str(tmp_path / "global"), create=True)
    assert memory.retrieve() == []
    glob.append(MemoryRecord("feedback", "be brief", 0, record_id="g1"))
    (got,) = memory.retrieve()
    assert (got.record_id, got.metadata["scope"], got.metadata["type"]) == ("g1", "global", "feedback")
    memory.append(MemoryRecord("feedback", "be very brief", 1, record_id="g1"))  # a local override
    (got,) = memory.retrieve()
    assert got.content == "be very brief" and "scope" not in got.metadata
    assert block_ids(segment(glob, "feedback")) == ["g1"]  # the global segment is never written


def test_a_missing_global_root_is_reported(tmp_path: Path) -> None:
    with pytest.raises(MemoryResourceError, match="global-missing"):
        MemdirMemory(str(tmp_path / "m"), global_memory_dir=str(tmp_path / "global-missing"), create=True)


@pytest.mark.parametrize(
    "record_id",
    ["../x", "../../../../tmp/evil", "/etc/passwd", "..\\..\\win", "a/b/c", "", "\x00nul", "MEMORY", "a\nb\u2028c"],
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
    (got,) = MemdirMemory(str(root)).retrieve({"record_ids": [record_id]})
    assert (got.content, got.role) == ("payload", "../../role")
    assert memory.delete(record_id) is True and index_entries(memory) == []


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
    # A segment replaced by a symlink is neither read nor appended through.
    memory.append(MemoryRecord("project", "inside", 0, record_id="planted"))
    path = segment(memory, "project")
    outside_segment = tmp_path / "outside-segment.md"
    outside_segment.write_text(path.read_text().replace("inside", "read through a link"))
    path.unlink()
    path.symlink_to(outside_segment)
    before = outside_segment.read_text()
    assert memory.retrieve() == [] and MemdirMemory(str(tmp_path / "m")).retrieve() == []
    with pytest.raises(MemoryResourceError, match="symlink"):
        memory.append(MemoryRecord("project", "more", 1))
    assert outside_segment.read_text() == before and path.is_symlink()
    # A symlinked index is replaced, not written through.
    index = memory.memory_dir / "MEMORY.md"
    index.unlink()
    index.symlink_to(secret)
    memory.append(MemoryRecord("user", "fine", 2))
    assert secret.read_text() == "outside secret"
    assert not index.is_symlink() and "fine" in index.read_text()
    memory.append(MemoryRecord("user", "still fine", 3))
    assert secret.read_text() == "outside secret" and "still fine" in index.read_text()


def test_a_note_dropped_in_after_the_last_read_is_still_deleted(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    memory.append(MemoryRecord("user", "in the segment", 0, record_id="x"))
    late = memory.memory_dir / "user" / "late.md"
    late.write_text('---\nrecord_id: "x"\n---\nin a note')
    assert memory.delete("x") is True
    assert not late.exists() and memory.retrieve() == []


def test_the_index_survives_leftovers_of_an_interrupted_publish(tmp_path: Path) -> None:
    outside = tmp_path / "outside.md"
    outside.write_text("outside")
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    memory.append(MemoryRecord("user", "one", 0))
    (memory.memory_dir / ".MEMORY.md.swap").write_text("stale")
    spare = memory.memory_dir / ".MEMORY.md.spare"
    spare.unlink(missing_ok=True)
    os.link(outside, spare)  # a spare that is another file's name too is never written into
    memory.append(MemoryRecord("user", "two", 1))
    spare.unlink()
    spare.symlink_to(outside)  # nor is a symlinked spare followed
    memory.append(MemoryRecord("user", "three", 2))
    assert outside.read_text() == "outside"
    assert [line.split(": ", 1)[1].split(" (")[0] for line in index_entries(memory)] == ["one", "two", "three"]


def test_a_segment_that_is_not_utf8_is_reported(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    memory.append(MemoryRecord("user", "fine", 0))
    path = segment(memory, "user")
    path.write_bytes(path.read_bytes() + b"\xff\xfe broken\n")
    with pytest.raises(MemoryResourceError, match="UTF-8") as info:
        MemdirMemory(str(tmp_path / "m")).retrieve()
    assert info.value.resource == str(path)


def test_index_respects_entry_and_character_limits(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True, max_index_entries=3)
    for i in range(10):
        memory.append(MemoryRecord("user", f"fact number {i}", i))
    lines = index_entries(memory)
    assert len(lines) == 3 and "fact number 9" in lines[-1]
    small = MemdirMemory(str(tmp_path / "s"), create=True, max_index_chars=200)
    for i in range(10):
        small.append(MemoryRecord("user", "long content " * 20, i))
    assert len((small.memory_dir / "MEMORY.md").read_text()) <= 200
    assert len(small.summarize()) <= 200
    assert len(small.retrieve({"max_items": None})) == 10  # the index limits never drop records


def test_the_index_names_segment_and_id_once_per_record(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    memory.append(MemoryRecord("user", "first\nversion", 0, record_id='odd "id" (1)'))
    memory.append(MemoryRecord("feedback", "be brief", 1, record_id="fb"))
    memory.append(MemoryRecord("user", "second version", 2, record_id='odd "id" (1)'))
    assert index_entries(memory) == [
        '- [feedback] feedback step=1: be brief (feedback/records.md, id "fb")',
        '- [user] user step=2: second version (user/records.md, id "odd \\"id\\" (1)")',
    ]
    hand = memory.memory_dir / "MEMORY.md"
    hand.write_text(hand.read_text() + "a note someone added\n")
    memory.delete("fb")
    assert index_entries(memory) == ['- [user] user step=2: second version (user/records.md, id "odd \\"id\\" (1)")']


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
    assert memory.evict() == 0
    memory.reset()
    assert len(memory.retrieve()) == 5


def test_only_text_and_json_metadata_are_persisted(tmp_path: Path) -> None:
    memory = MemdirMemory(str(tmp_path / "m"), create=True)
    with pytest.raises(TypeError, match="text records only"):
        memory.append(MemoryRecord("user", {"not": "text"}, 0))
    with pytest.raises(TypeError, match="metadata"):
        memory.append(MemoryRecord("user", "x", 0, metadata={"when": object()}))
    with pytest.raises(TypeError, match="metadata"):
        memory.append(MemoryRecord("user", "x", 0, metadata={"nan": float("nan")}))
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
