"""MemorySourceAdapter: recall a borrowed Memory into request context on every request."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from qitos.core._codec import canonical_json
from qitos.core.context import ContextContribution, ContextContributionError
from qitos.core.memory import Memory, MemoryRecord, record_revision

__all__ = ["MemorySourceAdapter"]

_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")


class MemorySourceAdapter:
    """Recall a factory-bound namespace as user-level context data.

    Namespace is a logical label, not a directory selector or an authorization.
    The factory must bind the correct Memory resource. No global memory is read
    by this adapter. Every request recalls fresh data, including after restore;
    revision is provenance, never a permanent suppression cache.

    Each recalled record becomes one ``user``-placed contribution with id
    ``memory:<namespace>:<record_id>`` and ``revision`` = the SHA-256 of the record's identity and
    content (:func:`~qitos.core.memory.record_revision`). ``required=True`` makes every recalled
    record required; an empty recall contributes nothing.
    """

    def __init__(
        self,
        memory: Memory,
        *,
        namespace: str,
        query: Mapping[str, object] | None = None,
        required: bool = False,
        priority: int = 0,
    ) -> None:
        if not callable(getattr(memory, "retrieve", None)):
            raise TypeError(f"MemorySourceAdapter: {type(memory).__name__} has no retrieve() method")
        if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
            raise ValueError(
                f"MemorySourceAdapter: namespace must be a logical label ([A-Za-z0-9][A-Za-z0-9_.:-]*, "
                f"at most 128 characters), got {namespace!r}"
            )
        if not isinstance(required, bool):
            raise ValueError(f"MemorySourceAdapter: required must be a bool, got {required!r}")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"MemorySourceAdapter: priority must be an int, got {priority!r}")
        self.memory = memory
        self.namespace = namespace
        self.query = dict(query) if query is not None else None
        self.required = required
        self.priority = priority
        self.contributor_id = f"memory:{namespace}"

    def contribute(self, request: Any) -> Sequence[ContextContribution]:
        """Recall fresh records (a new retrieve on every call) as contributions."""
        records = self.memory.retrieve(dict(self.query) if self.query is not None else None)
        if not isinstance(records, list | tuple):
            raise ContextContributionError(
                f"{self.contributor_id}: retrieve() must return a list of MemoryRecord, got {type(records).__name__}"
            )
        out: dict[str, ContextContribution] = {}
        for i, record in enumerate(records):
            if not isinstance(record, MemoryRecord):
                raise ContextContributionError(
                    f"{self.contributor_id}: retrieve() returned {type(record).__name__} at [{i}], not a MemoryRecord"
                )
            contribution = ContextContribution(
                contribution_id=f"{self.contributor_id}:{record.record_id}",
                source=self.contributor_id,
                content=record.content if isinstance(record.content, str) else _jsonable(record),
                priority=self.priority,
                requested_placement="user",
                persistence_horizon="request",
                required=self.required,
                revision=record_revision(record),
            )
            out[contribution.contribution_id] = contribution  # a repeated record id counts once
        return tuple(out.values())

    def reset(self, run_id: str | None = None) -> None:
        """No owned state; never reset the borrowed memory."""

    def close(self) -> None:
        """No owned resources; never close the borrowed memory."""


def _jsonable(record: MemoryRecord) -> Any:
    try:
        canonical_json(record.content)
    except (TypeError, ValueError):
        return repr(record.content)
    return record.content
