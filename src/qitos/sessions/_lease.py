"""``LeaseKeeper``: a run's hold on its session's lease, from the first boundary to the last.

A session has one owner at a time, so a step never runs twice at once. ``Session.run`` takes the store's lease
(:meth:`~qitos.checkpoint.store.CheckpointStore.acquire_lease`) before anything executes, so a second
runner gets :class:`~qitos.core._errors.SessionBusyError` and runs nothing. While the run goes on the
keeper renews the lease: whenever the journal touches the store and a third of the lease has passed,
and from a heartbeat (a daemon thread for the sync driver, a task for the async one) so a long model
or tool call does not let it lapse. A renewal that fails on the store (a dropped connection, a
server restart) is retried with backoff until one succeeds or the store says the lease is gone;
only then does the heartbeat stop. Every commit and pending write carries the lease's fencing token
and the store refuses a stale one; a runner that lost the lease (it stalled past the expiry, or
another runner took over) can therefore never record a step or start a tool, and the keeper raises
:class:`~qitos.core._errors.LeaseLostError` at its next store operation. At the end the lease is
released (retried, too, until it lands or the lease lapses), so the next run need not wait for it to
expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
import uuid

from qitos.checkpoint._records import SessionLease
from qitos.checkpoint.store import CheckpointStore
from qitos.core._errors import CheckpointError, LeaseLostError, SessionBusyError

__all__ = ["DEFAULT_LEASE_TTL", "LeaseKeeper", "holder_is_dead", "runner_id"]

DEFAULT_LEASE_TTL = 30.0
"""Seconds a lease lasts without renewal: how long a dead runner's session waits before another may take it."""

_RETRY_FIRST = 0.05  # seconds before a failed renewal is tried again, doubling up to a sixth of the lease


def runner_id() -> str:
    """An owner id for one run: host, process and a random part (two runs never share one)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def holder_is_dead(owner: str) -> bool:
    """Whether a lease holder named by :func:`runner_id` was a process of this host that is gone.

    Only a definite answer counts: another host, an unparsable id or a live (or foreign, unsignalable)
    pid all mean "maybe alive", and such a lease is only taken over once it expires.
    """
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    """A killed child not yet reaped still answers signal 0; /proc says it is dead (Linux)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rpartition(")")[2].split()[0] == "Z"
    except (OSError, IndexError):
        return False


class LeaseKeeper:
    """Takes, renews and releases one session's lease for one run (see the module docstring)."""

    def __init__(
        self,
        store: CheckpointStore,
        session_id: str,
        *,
        owner: str | None = None,
        ttl_seconds: float = DEFAULT_LEASE_TTL,
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.owner = owner or runner_id()
        self.ttl_seconds = ttl_seconds
        self._lease: SessionLease | None = None
        self._renewed_at = 0.0
        self._lost: CheckpointError | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def token(self) -> int:
        """The fencing token every write of this run carries."""
        if self._lease is None:
            raise CheckpointError(f"session {self.session_id!r}: the run holds no lease")
        return self._lease.token

    @property
    def lease(self) -> SessionLease | None:
        """The lease as last taken or renewed."""
        return self._lease

    # ---- sync

    def acquire(self) -> SessionLease:
        """Take the lease (SessionBusyError naming the holder if another runner has it).

        A holder that was a process of this host and no longer exists (it crashed) is taken over at
        once rather than after its lease expires.
        """
        try:
            lease = self.store.acquire_lease(self.session_id, self.owner, ttl_seconds=self.ttl_seconds)
        except SessionBusyError as busy:
            if not holder_is_dead(busy.owner):
                raise
            lease = self.store.acquire_lease(
                self.session_id, self.owner, ttl_seconds=self.ttl_seconds, take_over_from=busy.owner
            )
        self._took(lease)
        return lease

    def check(self) -> None:
        """Before a store write: raise if the lease was lost; renew it if a third of it has passed."""
        if self._lost is not None:
            raise self._lost
        if time.monotonic() - self._renewed_at >= self.ttl_seconds / 3:
            with contextlib.suppress(CheckpointError):  # a hiccup: the store's fence still decides
                self.renew()
            if self._lost is not None:
                raise self._lost

    def renew(self) -> None:
        """Extend the lease now; LeaseLostError (remembered for every later check) if it is gone."""
        with self._lock:
            lease = self._require()
            try:
                renewed = self.store.renew_lease(lease, ttl_seconds=self.ttl_seconds)
            except LeaseLostError as exc:
                self._lost = exc
                raise
            self._took(renewed)

    def start_heartbeat(self) -> None:
        """Renew from a daemon thread every third of the lease until :meth:`release`."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._beat, name=f"qitos-lease-{self.session_id}", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop the heartbeat and give the lease up (idempotent; a lost lease is left as it is).

        A release that fails on the store is retried with backoff until it lands or the lease has
        lapsed by itself: a lease left behind would turn the session's next run away as busy.
        """
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        lease, self._lease = self._lease, None
        if lease is None or self._lost is not None:
            return
        lapsed_at, wait = self._renewed_at + self.ttl_seconds, self.ttl_seconds / 3
        while True:
            try:
                self.store.release_lease(lease)
                return
            except CheckpointError:  # the run's outcome is already decided: only the lease is left
                wait = self._retry_after(wait)
                if time.monotonic() + wait >= lapsed_at:
                    return
                time.sleep(wait)

    def _beat(self) -> None:
        wait = self.ttl_seconds / 3
        while not self._stop.wait(wait):
            try:
                self.renew()
            except LeaseLostError:
                return  # remembered by renew: every later check raises it
            except CheckpointError:
                wait = self._retry_after(wait)  # a store hiccup: the lease may well still be ours
            else:
                wait = self.ttl_seconds / 3

    # ---- async

    async def aacquire(self) -> SessionLease:
        """Async twin of :meth:`acquire`."""
        try:
            lease = await self.store.aacquire_lease(self.session_id, self.owner, ttl_seconds=self.ttl_seconds)
        except SessionBusyError as busy:
            if not holder_is_dead(busy.owner):
                raise
            lease = await self.store.aacquire_lease(
                self.session_id, self.owner, ttl_seconds=self.ttl_seconds, take_over_from=busy.owner
            )
        self._took(lease)
        return lease

    async def acheck(self) -> None:
        """Async twin of :meth:`check`."""
        if self._lost is not None:
            raise self._lost
        if time.monotonic() - self._renewed_at >= self.ttl_seconds / 3:
            with contextlib.suppress(CheckpointError):  # a hiccup: the store's fence still decides
                await self.arenew()
            if self._lost is not None:
                raise self._lost

    async def arenew(self) -> None:
        """Async twin of :meth:`renew`."""
        lease = self._require()
        try:
            renewed = await self.store.arenew_lease(lease, ttl_seconds=self.ttl_seconds)
        except LeaseLostError as exc:
            self._lost = exc
            raise
        self._took(renewed)

    def start_async_heartbeat(self) -> None:
        """Renew from a task on the running event loop every third of the lease until :meth:`arelease`."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._abeat())

    async def arelease(self) -> None:
        """Async twin of :meth:`release`."""
        self._stop.set()  # a renewal the cancel interrupts may come back as a store error: no retry then
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        lease, self._lease = self._lease, None
        if lease is None or self._lost is not None:
            return
        lapsed_at, wait = self._renewed_at + self.ttl_seconds, self.ttl_seconds / 3
        while True:
            try:
                await self.store.arelease_lease(lease)
                return
            except CheckpointError:
                wait = self._retry_after(wait)
                if time.monotonic() + wait >= lapsed_at:
                    return
                await asyncio.sleep(wait)

    async def _abeat(self) -> None:
        wait = self.ttl_seconds / 3
        this = asyncio.current_task()
        while not self._stop.is_set():
            await asyncio.sleep(wait)
            try:
                await self.arenew()
            except LeaseLostError:
                return
            except CheckpointError:
                if this is not None and this.cancelling():
                    return  # cancelled mid-renewal (the store may report that as its own error)
                wait = self._retry_after(wait)
            else:
                wait = self.ttl_seconds / 3

    def _retry_after(self, last_wait: float) -> float:
        """How long to wait before retrying a renewal (or release) that failed on the store: the
        first retry soon, then twice as long each time, at most a sixth of the lease (so several
        tries fit before it would expire). Renewals are retried until one succeeds or the store
        answers that the lease is gone (expired or taken over): only the store knows when it
        actually expired."""
        if last_wait >= self.ttl_seconds / 3:  # the first failure since the last renewal
            return min(_RETRY_FIRST, self.ttl_seconds / 6)
        return min(2 * last_wait, self.ttl_seconds / 6)

    # ---- internals

    def _require(self) -> SessionLease:
        if self._lease is None:
            raise CheckpointError(f"session {self.session_id!r}: the run holds no lease")
        return self._lease

    def _took(self, lease: SessionLease) -> None:
        self._lease = lease
        self._renewed_at = time.monotonic()
