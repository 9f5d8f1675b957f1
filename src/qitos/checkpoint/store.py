"""The checkpoint store contract: :class:`CheckpointStore`, the ABC every store implements.

A store persists four kinds of data for durable sessions:

- immutable **snapshots** (:class:`SessionSnapshot`), content-addressed: the id is the SHA-256 of
  the canonical JSON of the snapshot's content, so a stored snapshot can always be verified;
- one mutable **head** per session (:class:`SessionHeadRecord`), moved only by
  :meth:`CheckpointStore.commit_session_snapshot` with a compare-and-swap on the previous head;
- **pending writes** inside a step (:class:`StepWrite`: the decision, each tool call's intent and
  result), keyed so that writing the same key twice keeps the first. The head keeps a tally of the
  writes on it (how many, and a digest of them), so a write that is lost or whose key was altered
  is an :class:`~qitos.core._errors.IntegrityError` when read, never a call that did not start; the
  commit that moves the head ends that step and deletes its writes (its outcome is in the snapshot);
- durable **control items** (:class:`ControlItem`: pause, steer, approve, reject) with positions
  assigned by the store, and content-addressed **blobs** for large values.

Sync and async twins: every method ``m`` has an ``a``-prefixed coroutine twin ``am`` on the same
class. On :class:`CheckpointStore` the **async twins are abstract** (a subclass missing one fails
at instantiation) and the sync ones delegate to them through ``asyncio.run``. Stores whose native
I/O is synchronous (SQLite, in-memory) derive from :class:`SyncCheckpointStore` instead, where the
**sync methods are abstract** and the async twins run them in a worker thread.

The records and the store's own errors are defined in ``qitos.checkpoint._records`` and named here,
beside the contract that reads and writes them; the I/O-free rules every store applies
(verification, lease arithmetic, fences) are in ``qitos.checkpoint._rules``. Errors:
:class:`~qitos.core._errors.HeadConflictError` (a stale expected head),
:class:`~qitos.core._errors.SessionNotFoundError`, :class:`~qitos.core._errors.SnapshotIntegrityError`
(stored bytes do not match their digest), plus :class:`SnapshotNotFoundError`,
:class:`DuplicateOperationError` and :class:`BlobIntegrityError`. Payloads must be JSON-native;
anything else raises :class:`~qitos.core._errors.CodecError` naming what was wrong.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import functools
import os
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, ParamSpec, Self, TypeVar

from qitos.checkpoint._records import (
    ControlItem,
    PruneReport,
    SessionCommitReceipt,
    SessionHeadRecord,
    SessionLease,
    SessionPosition,
    SessionSnapshot,
    SessionSnapshotCommit,
    StepWrite,
)
from qitos.checkpoint._rules import name_set
from qitos.core._errors import UsageError

__all__ = ["CheckpointStore"]

_T = TypeVar("_T")
_P = ParamSpec("_P")
# How often the default wait_for_control looks for new control items.
_CONTROL_POLL_SECONDS = 0.05


def _positions(heads: Mapping[str, SessionHeadRecord], lifecycles: frozenset[str] | None) -> dict[str, SessionPosition]:
    """The positions of those of ``heads`` in one of ``lifecycles`` (None: all)."""
    return {
        sid: SessionPosition(
            session_id=head.session_id, snapshot_id=head.snapshot_id, sequence=head.sequence, lifecycle=head.lifecycle
        )
        for sid, head in heads.items()
        if lifecycles is None or head.lifecycle in lifecycles
    }


def _run_sync(coro: Coroutine[Any, Any, _T], name: str) -> _T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise UsageError(f"{name}() was called inside a running event loop; await a{name}() instead")


class CheckpointStore(abc.ABC):
    """Abstract base class for checkpoint persistence (after LangGraph's ``BaseCheckpointSaver``).

    Every method has both sync and async variants. Subclasses should override the async
    variants (they are abstract here); the sync ones delegate via ``asyncio.run`` by default.
    Natively synchronous stores derive from :class:`SyncCheckpointStore`. Stores are context
    managers; ``close()`` releases their resources.
    """

    # ---- async twins: abstract

    @abc.abstractmethod
    async def aget_session_head(self, session_id: str) -> SessionHeadRecord | None:
        """Read the current mutable head for one session (None if there is no such session)."""

    @abc.abstractmethod
    async def acommit_session_snapshot(self, request: SessionSnapshotCommit) -> SessionCommitReceipt:
        """Atomically persist an immutable snapshot (and blobs) and advance its head (CAS)."""

    @abc.abstractmethod
    async def afind_session_by_operation(self, operation_id: str) -> str | None:
        """The session a commit with this ``operation_id`` created, or None."""

    @abc.abstractmethod
    async def aget_snapshot(self, snapshot_id: str) -> SessionSnapshot:
        """Read one verified snapshot; SnapshotNotFoundError or SnapshotIntegrityError."""

    @abc.abstractmethod
    async def aload_chain(self, snapshot_id: str) -> list[SessionSnapshot]:
        """The snapshot and its ancestors back to and including its base, oldest first, verified."""

    @abc.abstractmethod
    async def alist_sessions(self, *, lifecycles: Iterable[str] | None = None) -> list[SessionHeadRecord]:
        """Every session head (only those in ``lifecycles``, when given), in creation order."""

    @abc.abstractmethod
    async def alist_session_snapshots(self, session_id: str) -> list[str]:
        """The session's head chain within the session, newest first."""

    @abc.abstractmethod
    async def aput_writes(self, writes: Sequence[StepWrite]) -> list[bool]:
        """Store pending writes in one transaction; per write, whether it was new (first wins)."""

    @abc.abstractmethod
    async def aget_writes(self, session_id: str, base_snapshot_id: str) -> list[StepWrite]:
        """Pending writes of the step that started at ``base_snapshot_id``, in write order."""

    @abc.abstractmethod
    async def aappend_control(self, session_id: str, kind: str, payload: Mapping[str, Any]) -> ControlItem:
        """Durably append one control item; the store assigns its position."""

    @abc.abstractmethod
    async def alist_control(
        self, session_id: str, *, after: int = 0, kinds: Iterable[str] | None = None
    ) -> list[ControlItem]:
        """Control items with position > ``after`` (optionally only ``kinds``), by position."""

    @abc.abstractmethod
    async def aacquire_lease(
        self, session_id: str, owner: str, *, ttl_seconds: float, take_over_from: str | None = None
    ) -> SessionLease:
        """Take (or, for its owner, renew) the session's lease; SessionBusyError if another owner holds it."""

    @abc.abstractmethod
    async def arenew_lease(self, lease: SessionLease, *, ttl_seconds: float) -> SessionLease:
        """Extend a held lease; LeaseLostError if it expired or was taken over."""

    @abc.abstractmethod
    async def arelease_lease(self, lease: SessionLease) -> None:
        """Give the lease up now (a no-op if it is no longer current); its token stays used."""

    @abc.abstractmethod
    async def aget_lease(self, session_id: str) -> SessionLease | None:
        """The session's current lease row (possibly lapsed), or None if it never had one."""

    async def await_control(self, session_id: str, *, after: int = 0, timeout: float = 1.0) -> list[ControlItem]:
        """Wait up to ``timeout`` seconds for control items after ``after``; [] if none arrived.

        This default polls ``alist_control``; a store that can be notified (PostgreSQL's
        LISTEN/NOTIFY) overrides it to wake as soon as an item is appended.
        """
        deadline = time.monotonic() + timeout
        while True:
            items = await self.alist_control(session_id, after=after)
            remaining = deadline - time.monotonic()
            if items or remaining <= 0:
                return items
            await asyncio.sleep(min(_CONTROL_POLL_SECONDS, remaining))

    @abc.abstractmethod
    async def aput_blobs(self, blobs: Mapping[str, bytes]) -> None:
        """Store content-addressed blobs (key = sha256 hex of the bytes, verified)."""

    @abc.abstractmethod
    async def aget_blobs(self, digests: Iterable[str]) -> dict[str, bytes]:
        """The stored blobs among ``digests`` (absent digests are absent from the result)."""

    @abc.abstractmethod
    async def aprune(self, *, keep: Iterable[str] = ()) -> PruneReport:
        """Delete snapshots not reachable from a head or ``keep`` (with their writes), then the
        blobs that only they mentioned (see :func:`mentioned_digests`)."""

    @abc.abstractmethod
    async def avacuum(self) -> None:
        """Reclaim space freed by pruning."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Release the store's resources."""

    # ---- reads made of others here; a store with a cheaper way overrides both twins

    def get_session_heads(self, session_ids: Iterable[str]) -> dict[str, SessionHeadRecord]:
        """The heads of those of ``session_ids`` that exist, by session id."""
        heads = {}
        for session_id in session_ids:
            head = self.get_session_head(session_id)
            if head is not None:
                heads[session_id] = head
        return heads

    async def aget_session_heads(self, session_ids: Iterable[str]) -> dict[str, SessionHeadRecord]:
        """Async twin of :meth:`get_session_heads`."""
        heads = {}
        for session_id in session_ids:
            head = await self.aget_session_head(session_id)
            if head is not None:
                heads[session_id] = head
        return heads

    def load_chain_with_writes(
        self, session_id: str, snapshot_id: str
    ) -> tuple[list[SessionSnapshot], list[StepWrite]]:
        """What restoring ``session_id`` at its head ``snapshot_id`` reads: :meth:`load_chain` of
        the snapshot and the session's pending writes on it (:meth:`get_writes`), perhaps at once."""
        return self.load_chain(snapshot_id), self.get_writes(session_id, snapshot_id)

    async def aload_chain_with_writes(
        self, session_id: str, snapshot_id: str
    ) -> tuple[list[SessionSnapshot], list[StepWrite]]:
        """Async twin of :meth:`load_chain_with_writes`."""
        return await self.aload_chain(snapshot_id), await self.aget_writes(session_id, snapshot_id)

    def get_session_positions(
        self, session_ids: Iterable[str], *, lifecycles: Iterable[str] | None = None
    ) -> dict[str, SessionPosition]:
        """Where the heads of those of ``session_ids`` that exist (and are in one of ``lifecycles``,
        when given) stand, by session id: what :meth:`get_session_heads` says without the metadata
        (a store may read less for it)."""
        wanted = name_set(lifecycles, "lifecycles")
        return _positions(self.get_session_heads(session_ids), wanted)

    async def aget_session_positions(
        self, session_ids: Iterable[str], *, lifecycles: Iterable[str] | None = None
    ) -> dict[str, SessionPosition]:
        """Async twin of :meth:`get_session_positions`."""
        wanted = name_set(lifecycles, "lifecycles")
        return _positions(await self.aget_session_heads(session_ids), wanted)

    # ---- sync twins: delegate via asyncio.run

    def get_session_head(self, session_id: str) -> SessionHeadRecord | None:
        """Read the current mutable head for one session (None if there is no such session)."""
        return _run_sync(self.aget_session_head(session_id), "get_session_head")

    def commit_session_snapshot(self, request: SessionSnapshotCommit) -> SessionCommitReceipt:
        """Atomically persist an immutable snapshot (and blobs) and advance its head (CAS)."""
        return _run_sync(self.acommit_session_snapshot(request), "commit_session_snapshot")

    def find_session_by_operation(self, operation_id: str) -> str | None:
        """The session a commit with this ``operation_id`` created, or None."""
        return _run_sync(self.afind_session_by_operation(operation_id), "find_session_by_operation")

    def get_snapshot(self, snapshot_id: str) -> SessionSnapshot:
        """Read one verified snapshot; SnapshotNotFoundError or SnapshotIntegrityError."""
        return _run_sync(self.aget_snapshot(snapshot_id), "get_snapshot")

    def load_chain(self, snapshot_id: str) -> list[SessionSnapshot]:
        """The snapshot and its ancestors back to and including its base, oldest first, verified."""
        return _run_sync(self.aload_chain(snapshot_id), "load_chain")

    def list_sessions(self, *, lifecycles: Iterable[str] | None = None) -> list[SessionHeadRecord]:
        """Every session head (only those in ``lifecycles``, when given), in creation order."""
        return _run_sync(self.alist_sessions(lifecycles=lifecycles), "list_sessions")

    def list_session_snapshots(self, session_id: str) -> list[str]:
        """The session's head chain within the session, newest first."""
        return _run_sync(self.alist_session_snapshots(session_id), "list_session_snapshots")

    def put_writes(self, writes: Sequence[StepWrite]) -> list[bool]:
        """Store pending writes in one transaction; per write, whether it was new (first wins)."""
        return _run_sync(self.aput_writes(writes), "put_writes")

    def get_writes(self, session_id: str, base_snapshot_id: str) -> list[StepWrite]:
        """Pending writes of the step that started at ``base_snapshot_id``, in write order."""
        return _run_sync(self.aget_writes(session_id, base_snapshot_id), "get_writes")

    def append_control(self, session_id: str, kind: str, payload: Mapping[str, Any]) -> ControlItem:
        """Durably append one control item; the store assigns its position."""
        return _run_sync(self.aappend_control(session_id, kind, payload), "append_control")

    def list_control(self, session_id: str, *, after: int = 0, kinds: Iterable[str] | None = None) -> list[ControlItem]:
        """Control items with position > ``after`` (optionally only ``kinds``), by position."""
        return _run_sync(self.alist_control(session_id, after=after, kinds=kinds), "list_control")

    def acquire_lease(
        self, session_id: str, owner: str, *, ttl_seconds: float, take_over_from: str | None = None
    ) -> SessionLease:
        """Take (or, for its owner, renew) the session's lease; SessionBusyError if another owner holds it.

        ``take_over_from`` names a holder the caller knows is dead: its live lease is taken over.
        """
        return _run_sync(
            self.aacquire_lease(session_id, owner, ttl_seconds=ttl_seconds, take_over_from=take_over_from),
            "acquire_lease",
        )

    def renew_lease(self, lease: SessionLease, *, ttl_seconds: float) -> SessionLease:
        """Extend a held lease; LeaseLostError if it expired or was taken over."""
        return _run_sync(self.arenew_lease(lease, ttl_seconds=ttl_seconds), "renew_lease")

    def release_lease(self, lease: SessionLease) -> None:
        """Give the lease up now (a no-op if it is no longer current); its token stays used."""
        return _run_sync(self.arelease_lease(lease), "release_lease")

    def get_lease(self, session_id: str) -> SessionLease | None:
        """The session's current lease row (possibly lapsed), or None if it never had one."""
        return _run_sync(self.aget_lease(session_id), "get_lease")

    def wait_for_control(self, session_id: str, *, after: int = 0, timeout: float = 1.0) -> list[ControlItem]:
        """Wait up to ``timeout`` seconds for control items after ``after``; [] if none arrived."""
        return _run_sync(self.await_control(session_id, after=after, timeout=timeout), "wait_for_control")

    def put_blobs(self, blobs: Mapping[str, bytes]) -> None:
        """Store content-addressed blobs (key = sha256 hex of the bytes, verified)."""
        return _run_sync(self.aput_blobs(blobs), "put_blobs")

    def get_blobs(self, digests: Iterable[str]) -> dict[str, bytes]:
        """The stored blobs among ``digests`` (absent digests are absent from the result)."""
        return _run_sync(self.aget_blobs(digests), "get_blobs")

    def prune(self, *, keep: Iterable[str] = ()) -> PruneReport:
        """Delete snapshots not reachable from a head or ``keep`` (with their writes), then the
        blobs that only they mentioned (see :func:`mentioned_digests`)."""
        return _run_sync(self.aprune(keep=keep), "prune")

    def vacuum(self) -> None:
        """Reclaim space freed by pruning."""
        return _run_sync(self.avacuum(), "vacuum")

    def close(self) -> None:
        """Release the store's resources."""
        return _run_sync(self.aclose(), "close")

    # ---- context managers

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class SyncCheckpointStore(CheckpointStore):
    """A store whose native I/O is synchronous: the sync methods are abstract here.

    The async twins run the sync method on this store's own single writer thread, so an event loop
    is never blocked by disk I/O and the calls of many concurrent runs reach the store one at a time,
    in the order they were made (no pool of threads contending for one connection's lock). The
    thread starts on the first async call, is replaced in a child process after ``fork()``, and
    exits at ``aclose()`` (or with the interpreter).
    """

    async def _offload(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Run one sync method off the event loop, on the store's writer thread."""
        call = functools.partial(fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._writer(), call)

    def _writer(self) -> concurrent.futures.ThreadPoolExecutor:
        state: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = self.__dict__.get("_qitos_writer")
        pid = os.getpid()
        if state is None or state[0] != pid:
            with _WRITER_LOCK:
                state = self.__dict__.get("_qitos_writer")
                if state is None or state[0] != pid:
                    name = f"qitos-store-{type(self).__name__}"
                    state = (pid, concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name))
                    self.__dict__["_qitos_writer"] = state
        return state[1]

    # ---- sync methods: abstract

    @abc.abstractmethod
    def get_session_head(self, session_id: str) -> SessionHeadRecord | None: ...

    @abc.abstractmethod
    def commit_session_snapshot(self, request: SessionSnapshotCommit) -> SessionCommitReceipt: ...

    @abc.abstractmethod
    def find_session_by_operation(self, operation_id: str) -> str | None: ...

    @abc.abstractmethod
    def get_snapshot(self, snapshot_id: str) -> SessionSnapshot: ...

    @abc.abstractmethod
    def load_chain(self, snapshot_id: str) -> list[SessionSnapshot]: ...

    @abc.abstractmethod
    def list_sessions(self, *, lifecycles: Iterable[str] | None = None) -> list[SessionHeadRecord]: ...

    @abc.abstractmethod
    def list_session_snapshots(self, session_id: str) -> list[str]: ...

    @abc.abstractmethod
    def put_writes(self, writes: Sequence[StepWrite]) -> list[bool]: ...

    @abc.abstractmethod
    def get_writes(self, session_id: str, base_snapshot_id: str) -> list[StepWrite]: ...

    @abc.abstractmethod
    def append_control(self, session_id: str, kind: str, payload: Mapping[str, Any]) -> ControlItem: ...

    @abc.abstractmethod
    def list_control(
        self, session_id: str, *, after: int = 0, kinds: Iterable[str] | None = None
    ) -> list[ControlItem]: ...

    @abc.abstractmethod
    def acquire_lease(
        self, session_id: str, owner: str, *, ttl_seconds: float, take_over_from: str | None = None
    ) -> SessionLease: ...

    @abc.abstractmethod
    def renew_lease(self, lease: SessionLease, *, ttl_seconds: float) -> SessionLease: ...

    @abc.abstractmethod
    def release_lease(self, lease: SessionLease) -> None: ...

    @abc.abstractmethod
    def get_lease(self, session_id: str) -> SessionLease | None: ...

    def wait_for_control(self, session_id: str, *, after: int = 0, timeout: float = 1.0) -> list[ControlItem]:
        """Wait up to ``timeout`` seconds for control items after ``after`` (polling); [] if none arrived."""
        deadline = time.monotonic() + timeout
        while True:
            items = self.list_control(session_id, after=after)
            remaining = deadline - time.monotonic()
            if items or remaining <= 0:
                return items
            time.sleep(min(_CONTROL_POLL_SECONDS, remaining))

    @abc.abstractmethod
    def put_blobs(self, blobs: Mapping[str, bytes]) -> None: ...

    @abc.abstractmethod
    def get_blobs(self, digests: Iterable[str]) -> dict[str, bytes]: ...

    @abc.abstractmethod
    def prune(self, *, keep: Iterable[str] = ()) -> PruneReport: ...

    @abc.abstractmethod
    def vacuum(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    # ---- async twins: run the sync method off the event loop

    async def aget_session_head(self, session_id: str) -> SessionHeadRecord | None:
        return await self._offload(self.get_session_head, session_id)

    async def acommit_session_snapshot(self, request: SessionSnapshotCommit) -> SessionCommitReceipt:
        return await self._offload(self.commit_session_snapshot, request)

    async def afind_session_by_operation(self, operation_id: str) -> str | None:
        return await self._offload(self.find_session_by_operation, operation_id)

    async def aget_snapshot(self, snapshot_id: str) -> SessionSnapshot:
        return await self._offload(self.get_snapshot, snapshot_id)

    async def aload_chain(self, snapshot_id: str) -> list[SessionSnapshot]:
        return await self._offload(self.load_chain, snapshot_id)

    async def alist_sessions(self, *, lifecycles: Iterable[str] | None = None) -> list[SessionHeadRecord]:
        return await self._offload(self.list_sessions, lifecycles=lifecycles)

    async def alist_session_snapshots(self, session_id: str) -> list[str]:
        return await self._offload(self.list_session_snapshots, session_id)

    async def aput_writes(self, writes: Sequence[StepWrite]) -> list[bool]:
        return await self._offload(self.put_writes, writes)

    async def aget_writes(self, session_id: str, base_snapshot_id: str) -> list[StepWrite]:
        return await self._offload(self.get_writes, session_id, base_snapshot_id)

    async def aappend_control(self, session_id: str, kind: str, payload: Mapping[str, Any]) -> ControlItem:
        return await self._offload(self.append_control, session_id, kind, payload)

    async def alist_control(
        self, session_id: str, *, after: int = 0, kinds: Iterable[str] | None = None
    ) -> list[ControlItem]:
        return await self._offload(self.list_control, session_id, after=after, kinds=kinds)

    async def aacquire_lease(
        self, session_id: str, owner: str, *, ttl_seconds: float, take_over_from: str | None = None
    ) -> SessionLease:
        return await self._offload(
            self.acquire_lease, session_id, owner, ttl_seconds=ttl_seconds, take_over_from=take_over_from
        )

    async def arenew_lease(self, lease: SessionLease, *, ttl_seconds: float) -> SessionLease:
        return await self._offload(self.renew_lease, lease, ttl_seconds=ttl_seconds)

    async def arelease_lease(self, lease: SessionLease) -> None:
        await self._offload(self.release_lease, lease)

    async def aget_lease(self, session_id: str) -> SessionLease | None:
        return await self._offload(self.get_lease, session_id)

    async def aput_blobs(self, blobs: Mapping[str, bytes]) -> None:
        await self._offload(self.put_blobs, blobs)

    async def aget_blobs(self, digests: Iterable[str]) -> dict[str, bytes]:
        return await self._offload(self.get_blobs, digests)

    async def aprune(self, *, keep: Iterable[str] = ()) -> PruneReport:
        return await self._offload(self.prune, keep=keep)

    async def avacuum(self) -> None:
        await self._offload(self.vacuum)

    async def aclose(self) -> None:
        await self._offload(self.close)
        state = self.__dict__.pop("_qitos_writer", None)
        if state is not None and state[0] == os.getpid():
            state[1].shutdown(wait=False)


_WRITER_LOCK = threading.Lock()
