"""Samples and datasets: what an eval runs its agent on.

A :class:`Sample` is one input (text or a :class:`~qitos.core._task.Task`) with an optional target
and metadata; a :class:`Dataset` is an ordered list of samples with unique ids and a content digest
over ids, inputs and targets, in order (what an eval pins). Files load with
:meth:`Dataset.from_jsonl` and :meth:`Dataset.from_csv`: the fields ``id``, ``input`` and
``target``; every other field goes to the sample's metadata. A row without an input, a duplicate
id or a file that cannot be read raises :class:`DatasetError` naming the file and the line.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from qitos.core._codec import canonical_json, sha256_hex
from qitos.core._errors import UsageError
from qitos.core._task import Task

__all__ = ["Dataset", "DatasetError", "Sample"]


class DatasetError(UsageError):
    """A dataset cannot be used: a row without an input, a duplicate id, an unreadable file.

    ``path`` and ``line`` locate the row when it came from a file (``line`` is 1-based; for a CSV
    file it is the physical line the row starts on).
    """

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        where = f"{path}:{line}: " if path is not None and line is not None else f"{path}: " if path else ""
        super().__init__(f"{where}{message}")
        self.path = path
        self.line = line

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_dataset_error, (str(self), self.path, self.line))


def _rebuild_dataset_error(message: str, path: str | None, line: int | None) -> DatasetError:
    error = DatasetError.__new__(DatasetError)
    UsageError.__init__(error, message)
    error.path, error.line = path, line
    return error


@dataclass(frozen=True)
class Sample:
    """One input for the agent, with its target and metadata.

    ``input`` is the task text or a :class:`~qitos.core._task.Task`; ``target`` any JSON value (a
    list means "any of these"); ``id`` unique in its dataset, derived from the content when
    absent (the same in every process); ``metadata`` is free JSON (``--group-by`` reads it).
    """

    input: str | Task
    target: Any = None
    id: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.input, str):
            if not self.input.strip():
                raise DatasetError("a sample's input is empty")
        elif not isinstance(self.input, Task):
            raise DatasetError(f"a sample's input is a str or a Task, got {type(self.input).__name__}")
        try:
            canonical_json(self.target)
            canonical_json(dict(self.metadata))
        except (TypeError, ValueError) as exc:
            raise DatasetError(f"a sample's target and metadata must be JSON values: {exc}") from exc
        if self.id is None:
            object.__setattr__(self, "id", f"s-{sha256_hex(canonical_json(self._content()))[:16]}")
        elif isinstance(self.id, int) and not isinstance(self.id, bool):
            object.__setattr__(self, "id", str(self.id))
        elif not isinstance(self.id, str) or not self.id:
            raise DatasetError(f"a sample's id is a non-empty str, got {self.id!r}")
        object.__setattr__(self, "metadata", dict(self.metadata))

    @property
    def sample_id(self) -> str:
        """The id (always set after construction)."""
        return str(self.id)

    @property
    def task(self) -> Task:
        """The input as a Task (text becomes its objective)."""
        return Task.coerce(self.input)

    def _content(self) -> dict[str, Any]:
        # A Task's generated task_id is not content: the same Task built in two processes must match.
        data = self.input_json()
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if k != "id"}
        return {"input": data, "target": self.target}

    def input_json(self) -> Any:
        """The input as JSON: the text, or the Task's ``to_dict()``."""
        return self.input if isinstance(self.input, str) else self.input.to_dict()

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``id``, ``input`` (text or Task dict), ``target``, ``metadata``."""
        return {"id": self.id, "input": self.input_json(), "target": self.target, "metadata": dict(self.metadata)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sample:
        """The sample :meth:`to_dict` wrote."""
        raw = data.get("input")
        value: str | Task = Task.from_dict(raw) if isinstance(raw, Mapping) else str(raw)
        return cls(value, data.get("target"), id=data.get("id"), metadata=data.get("metadata") or {})


class Dataset(Sequence[Sample]):
    """An ordered list of samples with unique ids; ``digest`` identifies its content."""

    def __init__(self, samples: Iterable[Sample | Mapping[str, object]], name: str | None = None) -> None:
        items: list[Sample] = []
        seen: dict[str, int] = {}
        for position, item in enumerate(samples):
            sample = item if isinstance(item, Sample) else _sample_from_row(item, None, position + 1)
            earlier = seen.setdefault(sample.sample_id, position)
            if earlier != position:
                raise DatasetError(
                    f"duplicate sample id {sample.sample_id!r}: samples #{earlier + 1} and #{position + 1}"
                )
            items.append(sample)
        self._samples = tuple(items)
        self.name = name
        self._digest: str | None = None

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike[str], *, name: str | None = None) -> Dataset:
        """One JSON object a line (blank lines skipped): ``id``, ``input``, ``target``, the rest metadata."""
        text = _read(path)
        where = os.fspath(path)
        rows: list[tuple[int, Mapping[str, Any]]] = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"not a JSON object: {exc.msg}", path=where, line=number) from exc
            if not isinstance(row, dict):
                raise DatasetError(f"not a JSON object: {type(row).__name__}", path=where, line=number)
            rows.append((number, row))
        return cls._from_rows(rows, where, name)

    @classmethod
    def from_csv(cls, path: str | os.PathLike[str], *, name: str | None = None) -> Dataset:
        """A CSV file with a header row: ``id``, ``input``, ``target``, other columns to metadata.

        A ``target`` cell holding a JSON list or object is read as JSON (a list: any of these).
        """
        text = _read(path)
        where = os.fspath(path)
        reader = csv.DictReader(text.splitlines(keepends=True))
        if reader.fieldnames is None or "input" not in reader.fieldnames:
            raise DatasetError(f"the header has no 'input' column (columns: {reader.fieldnames})", path=where, line=1)
        rows: list[tuple[int, Mapping[str, Any]]] = []
        line = reader.line_num + 1
        for row in reader:
            cleaned: dict[str, Any] = {k: v for k, v in row.items() if k is not None}
            target = cleaned.get("target")
            if isinstance(target, str) and target[:1] in "[{":
                with contextlib.suppress(json.JSONDecodeError):
                    cleaned["target"] = json.loads(target)
            if cleaned.get("id") == "":
                cleaned.pop("id")
            rows.append((line, cleaned))
            line = reader.line_num + 1
        return cls._from_rows(rows, where, name)

    @classmethod
    def _from_rows(cls, rows: list[tuple[int, Mapping[str, Any]]], path: str, name: str | None) -> Dataset:
        samples: list[Sample] = []
        lines: dict[str, int] = {}
        for line, row in rows:
            sample = _sample_from_row(row, path, line)
            first = lines.setdefault(sample.sample_id, line)
            if first != line:
                raise DatasetError(
                    f"duplicate sample id {sample.sample_id!r} (first on line {first})", path=path, line=line
                )
            samples.append(sample)
        stem = os.path.splitext(os.path.basename(path))[0]
        return cls(samples, name=name or stem)

    def __len__(self) -> int:
        return len(self._samples)

    def __iter__(self) -> Iterator[Sample]:
        return iter(self._samples)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return Dataset(self._samples[index], name=self.name)
        return self._samples[index]

    def __repr__(self) -> str:
        return f"Dataset({self.name!r}, {len(self)} samples, digest={self.digest[:12]})"

    @property
    def digest(self) -> str:
        """SHA-256 over the ids, inputs and targets, in order (metadata excluded)."""
        if self._digest is None:
            content = [{"id": s.id, **s._content()} for s in self._samples]
            self._digest = sha256_hex(canonical_json(content))
        return self._digest


def _read(path: str | os.PathLike[str]) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"cannot read the dataset: {exc}", path=os.fspath(path)) from exc


def _sample_from_row(row: Mapping[str, Any], path: str | None, line: int) -> Sample:
    raw = row.get("input")
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        if path is None:
            raise DatasetError(f"sample #{line} has no input")
        raise DatasetError("the row has no input", path=path, line=line)
    value: str | Task
    if isinstance(raw, Mapping):
        value = Task.from_dict(raw)
    elif isinstance(raw, str):
        value = raw
    else:
        value = json.dumps(raw) if not isinstance(raw, int | float) else str(raw)
    metadata = {k: v for k, v in row.items() if k not in ("id", "input", "target", "metadata")}
    extra = row.get("metadata")
    if isinstance(extra, Mapping):
        metadata.update(extra)
    try:
        return Sample(value, row.get("target"), id=row.get("id"), metadata=metadata)
    except DatasetError as exc:
        if path is None:
            raise
        raise DatasetError(str(exc), path=path, line=line) from exc
