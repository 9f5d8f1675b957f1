"""A readable Markdown log of memory records, with recall scoped to one instance.

Every ``append`` adds a block to the log file (created with its parent folders on first write);
recall only returns what *this instance* appended: an existing file is not reloaded. The log is
for people to read; use :class:`~qitos.kit.memory.memdir_memory.MemdirMemory` for memory that
outlives a process.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from qitos.core._codec import canonical_json
from qitos.core.memory import MemoryRecord
from qitos.kit.memory.memdir_memory import filter_records

__all__ = ["MarkdownFileMemory"]


class MarkdownFileMemory:
    """Persist memory records in a local markdown log file.

    Recall is instance-scoped and holds at most ``max_in_memory`` records (oldest dropped).
    """

    def __init__(self, path: str = "memory.md", max_in_memory: int = 200) -> None:
        if not isinstance(max_in_memory, int) or isinstance(max_in_memory, bool) or max_in_memory <= 0:
            raise ValueError(f"MarkdownFileMemory: max_in_memory must be a positive int, got {max_in_memory!r}")
        self.path = Path(path).expanduser()
        if self.path.is_dir():
            raise ValueError(f"MarkdownFileMemory: {self.path} is a directory, not a log file")
        self.max_in_memory = max_in_memory
        self._records: list[MemoryRecord] = []

    def append(self, record: MemoryRecord) -> None:
        """Add a readable block to the log and the record to this instance's recall."""
        if not isinstance(record, MemoryRecord):
            raise TypeError(f"MarkdownFileMemory.append: expected a MemoryRecord, got {type(record).__name__}")
        text = record.content if isinstance(record.content, str) else _render(record.content)
        when = datetime.now(UTC).isoformat(timespec="seconds")
        block = (
            f"## {record.role} · step {record.step_id} · {when}\n<!-- record_id: {record.record_id} -->\n\n{text}\n\n"
        )
        self._write(block)
        self._records = [r for r in self._records if r.record_id != record.record_id]
        self._records.append(record)
        self.evict()

    def retrieve(
        self, query: dict[str, Any] | None = None, state: Any = None, observation: Any = None
    ) -> list[MemoryRecord]:
        """Records appended by this instance that match ``query``, oldest first."""
        return filter_records(self._records, query)

    def summarize(self, max_items: int = 30) -> str:
        """The newest records as a Markdown list."""
        records = self._records[-max_items:] if max_items > 0 else []
        return "\n".join(["# MEMORY", "", *(f"- {r.role} (step {r.step_id}): {r.content}" for r in records)])

    def reset(self, run_id: str | None = None) -> None:
        """Forget this instance's recall; the log file is kept."""
        self._records = []

    def evict(self) -> int:
        """Drop the oldest recalled records beyond ``max_in_memory``; returns how many."""
        removed = max(0, len(self._records) - self.max_in_memory)
        if removed:
            self._records = self._records[removed:]
        return removed

    def delete(self, record_id: str) -> bool:
        """Forget a record from recall and note the deletion in the log. Idempotent."""
        before = len(self._records)
        self._records = [r for r in self._records if r.record_id != record_id]
        if len(self._records) == before:
            return False
        self._write(f"<!-- deleted record_id: {record_id} -->\n\n")
        return True

    def _write(self, text: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(text)


def _render(content: object) -> str:
    try:
        return canonical_json(content)
    except (TypeError, ValueError):
        return repr(content)
