"""Datasets: loading files, ids, digests, and every kind of bad row named by file and line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from qitos import Task
from qitos.eval import Dataset, DatasetError, Sample


def test_jsonl_loads_ids_inputs_targets_and_metadata(tmp_path: Path) -> None:
    path = tmp_path / "qa.jsonl"
    path.write_text(
        '{"id": "a", "input": "2+2?", "target": "4", "level": "easy"}\n\n'
        '{"id": 7, "input": "capital of France?", "target": ["Paris", "paris"]}\n'
    )
    data = Dataset.from_jsonl(path)
    assert data.name == "qa" and len(data) == 2
    first, second = list(data)
    assert (first.id, first.input, first.target, dict(first.metadata)) == ("a", "2+2?", "4", {"level": "easy"})
    assert second.id == "7" and second.target == ["Paris", "paris"]


def test_csv_loads_with_json_list_targets(tmp_path: Path) -> None:
    path = tmp_path / "qa.csv"
    path.write_text('id,input,target,topic\nq1,"a, b",x,letters\nq2,two,"[""2"", ""two""]",numbers\n')
    data = Dataset.from_csv(path, name="mine")
    assert data.name == "mine"
    assert [s.id for s in data] == ["q1", "q2"]
    assert data[0].input == "a, b" and data[0].metadata == {"topic": "letters"}
    assert data[1].target == ["2", "two"]


def test_a_row_without_input_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"input": "ok"}\n{"id": "b", "target": 1}\n')
    with pytest.raises(DatasetError, match=r"bad\.jsonl:2: the row has no input") as info:
        Dataset.from_jsonl(path)
    assert info.value.line == 2 and info.value.path == str(path)
    csv_path = tmp_path / "bad.csv"
    csv_path.write_text("id,input\na,fine\nb,\n")
    with pytest.raises(DatasetError, match=r"bad\.csv:3: the row has no input"):
        Dataset.from_csv(csv_path)


def test_duplicate_ids_name_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "dup.jsonl"
    path.write_text('{"id": "x", "input": "a"}\n{"id": "y", "input": "b"}\n{"id": "x", "input": "c"}\n')
    with pytest.raises(DatasetError, match=r"dup\.jsonl:3: duplicate sample id 'x' \(first on line 1\)"):
        Dataset.from_jsonl(path)
    with pytest.raises(DatasetError, match="duplicate sample id 'x': samples #1 and #2"):
        Dataset([Sample("a", id="x"), Sample("b", id="x")])
    with pytest.raises(DatasetError, match="duplicate sample id"):  # same content, same derived id
        Dataset([Sample("same", "t"), Sample("same", "t")])


def test_unreadable_files_and_bad_lines_are_named(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"missing\.jsonl: cannot read the dataset"):
        Dataset.from_jsonl(tmp_path / "missing.jsonl")
    binary = tmp_path / "blob.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(DatasetError, match="cannot read the dataset"):
        Dataset.from_jsonl(binary)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"input": "fine"}\n{"input": \n')
    with pytest.raises(DatasetError, match=r"broken\.jsonl:2: not a JSON object"):
        Dataset.from_jsonl(broken)
    no_column = tmp_path / "cols.csv"
    no_column.write_text("question,answer\nq,a\n")
    with pytest.raises(DatasetError, match="no 'input' column"):
        Dataset.from_csv(no_column)


def test_derived_ids_and_digest_are_the_same_in_another_process(tmp_path: Path) -> None:
    data = Dataset([Sample("what is 2+2?", "4"), Sample(Task(objective="t", inputs={"k": 1}), ["a", "b"])])
    code = (
        "from qitos import Task\nfrom qitos.eval import Dataset, Sample\n"
        "d = Dataset([Sample('what is 2+2?', '4'), Sample(Task(objective='t', inputs={'k': 1}), ['a', 'b'])])\n"
        "print(d.digest, *[s.id for s in d])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [data.digest, *[s.id for s in data]]


def test_digest_covers_ids_inputs_targets_in_order_but_not_metadata() -> None:
    base = Dataset([Sample("a", "1", id="x"), Sample("b", "2", id="y")])
    assert Dataset([Sample("a", "1", id="x", metadata={"m": 1}), Sample("b", "2", id="y")]).digest == base.digest
    for other in (
        [Sample("b", "2", id="y"), Sample("a", "1", id="x")],
        [Sample("a", "1", id="x"), Sample("b", "3", id="y")],
        [Sample("a", "1", id="z"), Sample("b", "2", id="y")],
        [Sample("a!", "1", id="x"), Sample("b", "2", id="y")],
    ):
        assert Dataset(other).digest != base.digest


def test_samples_round_trip_and_reject_non_json() -> None:
    sample = Sample(Task(objective="do it", inputs={"n": 3}), {"k": [1, 2]}, id="t1", metadata={"g": "x"})
    assert Sample.from_dict(json.loads(json.dumps(sample.to_dict()))) == sample
    with pytest.raises(DatasetError, match="JSON"):
        Sample("x", target=object())
    with pytest.raises(DatasetError, match="input is empty"):
        Sample("  ")
