"""Memory contracts: ``MemoryRecord``, the ``Memory`` protocol, ``MemoryResourceError``.

Memory is an *input to context*, never a checkpoint store: a memory source is recalled into a
request through a context contributor (``qitos.kit.memory.adapter.MemorySourceAdapter``), and what
it recalled is cited by revision digest as provenance only.

Query mappings understood by the kit memories: ``roles`` (list of roles), ``type`` (memory type),
``contains`` (case-insensitive substring), ``record_ids`` (list) and ``max_items`` (newest N,
default 50).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from uuid import uuid4

from qitos.core._codec import canonical_json, sha256_hex
from qitos.core._errors import RunError

__all__ = ["Memory", "MemoryRecord", "MemoryResourceError"]


class MemoryResourceError(RunError):
    """A bound durable memory resource is missing or unavailable.

    ``resource`` names it (a path for file memories).
    """

    def __init__(self, message: str, *, resource: str = "") -> None:
        super().__init__(message)
        self.resource = resource

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.__class__, str(self), self.resource))


def _rebuild(cls: type[MemoryResourceError], message: str, resource: str) -> MemoryResourceError:
    return cls(message, resource=resource)


@dataclass(frozen=True)
class MemoryRecord:
    """One logical memory fact; independent equal facts receive distinct IDs."""

    role: str
    content: Any
    step_id: int
    metadata: dict[str, Any] = field(default_factory=dict)
    record_id: str = field(default_factory=lambda: uuid4().hex)

    def __post_init__(self) -> None:
        if not isinstance(self.role, str) or not self.role:
            raise ValueError(f"MemoryRecord.role: must be a non-empty string, got {self.role!r}")
        if not isinstance(self.step_id, int) or isinstance(self.step_id, bool):
            raise ValueError(f"MemoryRecord.step_id: must be an int, got {self.step_id!r}")
        if not isinstance(self.record_id, str) or not self.record_id:
            raise ValueError(f"MemoryRecord.record_id: must be a non-empty string, got {self.record_id!r}")
        if not isinstance(self.metadata, dict):
            raise ValueError(f"MemoryRecord.metadata: must be a dict, got {type(self.metadata).__name__}")


def record_revision(record: MemoryRecord) -> str:
    """SHA-256 of a record's identity and content: the provenance revision of a recall.

    Non-JSON content is digested through its ``repr``; the revision then identifies it only
    within one process.
    """
    try:
        payload = canonical_json([record.record_id, record.role, record.step_id, record.content, record.metadata])
    except (TypeError, ValueError):
        payload = repr((record.record_id, record.role, record.step_id, record.content, record.metadata))
    return sha256_hex(payload)


@runtime_checkable
class Memory(Protocol):
    """A memory source. Implementations live in ``qitos.kit.memory``."""

    def append(self, record: MemoryRecord) -> None:
        """Store a record (a record with an existing id replaces it)."""
        ...

    def retrieve(
        self, query: dict[str, Any] | None = None, state: Any = None, observation: Any = None
    ) -> list[MemoryRecord]:
        """Records matching ``query``, oldest first."""
        ...

    def summarize(self, max_items: int = 30) -> str:
        """A short readable rendering of the newest records."""
        ...

    def reset(self, run_id: str | None = None) -> None:
        """Forget per-run caches (never durable data unless the implementation says so)."""
        ...

    def evict(self) -> int:
        """Trim caches to their limits; returns how many entries were dropped."""
        ...

    def delete(self, record_id: str) -> bool:
        """Forget one record; True if something was deleted. Idempotent."""
        ...
