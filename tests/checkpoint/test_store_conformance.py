"""Runs the shipped CheckpointStore conformance suite (``qitos.testing``) against every store of qitos.

``AsyncOnlyStore`` is a real store that implements only the async twins (over an in-memory
store), so the suite also checks the ABC's default sync-over-async delegation. A new backend
adds a factory to ``STORE_FACTORIES`` and passes the suite before it is merged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from pg_server import pg_store
from qitos.checkpoint._memory_store import InMemoryCheckpointStore
from qitos.checkpoint._records import (
    ControlItem,
    PruneReport,
    SessionCommitReceipt,
    SessionHeadRecord,
    SessionLease,
    SessionSnapshot,
    SessionSnapshotCommit,
    StepWrite,
)
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.checkpoint.store import CheckpointStore
from qitos.testing import CheckpointStoreConformance


class AsyncOnlyStore(CheckpointStore):
    """Implements only the abstract async twins; the sync methods come from the ABC defaults."""

    def __init__(self) -> None:
        self._inner = InMemoryCheckpointStore()

    async def aget_session_head(self, session_id: str) -> SessionHeadRecord | None:
        return self._inner.get_session_head(session_id)

    async def acommit_session_snapshot(self, request: SessionSnapshotCommit) -> SessionCommitReceipt:
        return self._inner.commit_session_snapshot(request)

    async def afind_session_by_operation(self, operation_id: str) -> str | None:
        return self._inner.find_session_by_operation(operation_id)

    async def aget_snapshot(self, snapshot_id: str) -> SessionSnapshot:
        return self._inner.get_snapshot(snapshot_id)

    async def aload_chain(self, snapshot_id: str) -> list[SessionSnapshot]:
        return self._inner.load_chain(snapshot_id)

    async def alist_sessions(self, *, lifecycles: Iterable[str] | None = None) -> list[SessionHeadRecord]:
        return self._inner.list_sessions(lifecycles=lifecycles)

    async def alist_session_snapshots(self, session_id: str) -> list[str]:
        return self._inner.list_session_snapshots(session_id)

    async def aput_writes(self, writes: Sequence[StepWrite]) -> list[bool]:
        return self._inner.put_writes(writes)

    async def aget_writes(self, session_id: str, base_snapshot_id: str) -> list[StepWrite]:
        return self._inner.get_writes(session_id, base_snapshot_id)

    async def aappend_control(self, session_id: str, kind: str, payload: Mapping[str, Any]) -> ControlItem:
        return self._inner.append_control(session_id, kind, payload)

    async def alist_control(
        self, session_id: str, *, after: int = 0, kinds: Iterable[str] | None = None
    ) -> list[ControlItem]:
        return self._inner.list_control(session_id, after=after, kinds=kinds)

    async def aacquire_lease(
        self, session_id: str, owner: str, *, ttl_seconds: float, take_over_from: str | None = None
    ) -> SessionLease:
        return self._inner.acquire_lease(session_id, owner, ttl_seconds=ttl_seconds, take_over_from=take_over_from)

    async def arenew_lease(self, lease: SessionLease, *, ttl_seconds: float) -> SessionLease:
        return self._inner.renew_lease(lease, ttl_seconds=ttl_seconds)

    async def arelease_lease(self, lease: SessionLease) -> None:
        self._inner.release_lease(lease)

    async def aget_lease(self, session_id: str) -> SessionLease | None:
        return self._inner.get_lease(session_id)

    async def aput_blobs(self, blobs: Mapping[str, bytes]) -> None:
        self._inner.put_blobs(blobs)

    async def aget_blobs(self, digests: Iterable[str]) -> dict[str, bytes]:
        return self._inner.get_blobs(digests)

    async def aprune(self, *, keep: Iterable[str] = ()) -> PruneReport:
        return self._inner.prune(keep=keep)

    async def avacuum(self) -> None:
        self._inner.vacuum()

    async def aclose(self) -> None:
        self._inner.close()


STORE_FACTORIES: dict[str, Callable[[Path], CheckpointStore]] = {
    "memory": lambda tmp_path: InMemoryCheckpointStore(),
    "sqlite": lambda tmp_path: SqliteCheckpointStore(tmp_path / "sessions.db"),
    "async_only": lambda tmp_path: AsyncOnlyStore(),
}


class TestStoreConformance(CheckpointStoreConformance):
    @pytest.fixture(params=[*sorted(STORE_FACTORIES), "postgres"])
    def store(self, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CheckpointStore]:
        """Each registered store, fresh and empty; PostgreSQL on a schema of its own (see pg_server)."""
        if request.param == "postgres":
            with pg_store(request.getfixturevalue("pg_dsn")) as instance:
                yield instance
            return
        instance = STORE_FACTORIES[request.param](tmp_path)
        yield instance
        instance.close()
