"""A fleet worker: DBOS runs sessions from a queue; a supervisor keeps every session moving.

What DBOS (``dbos>=3,<4``, tested with 3.4.0) does here: it stores each enqueued run as a workflow
in its system tables (schema ``{store schema}_dbos`` in the same PostgreSQL), dispatches queued
workflows to workers up to each one's ``concurrency``, and starts one workflow per id only, so a
repeated request for the same continuation is one run. The workflow is ``async``: DBOS runs it on
its event loop (uvloop's under ``qitos worker`` when uvloop is installed: ``--loop``), so a worker's
sessions run through the async driver (``Session.arun``), many at once on one loop. Self-hosted DBOS
recovers a process's pending workflows only when a process with the *same executor id* starts again;
it does not hand a dead executor's workflows to the workers still alive. DBOS keeps a queue's limits
in its system tables, one value for all the queue's workers: how many runs it hands each worker at
most (here ``concurrency + prefetch``) is whatever the worker that registered the queue last asked
for. So a worker started with other ``concurrency``/``prefetch`` changes it for the workers already
running; :attr:`Worker.queue_limit` is what the supervisor last read, and ``qitos worker`` says so
when it is not its own (start the workers of one queue with the same values).

What qitos adds, in a supervisor thread in every worker:

- **A dead worker's runs go elsewhere.** The session lease is the source of truth for who runs a
  session. Every quarter lease (at most 1 s) the supervisor lists the runs DBOS has had *pending*
  (dequeued) for a while whose session nobody holds a live lease on: their worker died, before or
  after it took the lease. Where the session still has work (created, running, or waiting with an
  answer it has not taken in), it enqueues a new run whose workflow id derives from the stuck one,
  so every supervisor asks for the same run and DBOS starts it once, and cancels the stuck one.
  The new run takes the lease over (a stalled old runner is then fenced off by the store) and
  resumes from the last committed boundary; a tool call that was started and not finished is not
  repeated unless it is idempotent (``qitos.sessions._step_journal``).
- **An answer from anywhere continues the session.** It LISTENs on the store's control channel: an
  approval, rejection or steering given by ``qitos sessions approve``, the viewer or any process
  (not only :class:`~qitos.distributed.Fleet`) enqueues the waiting session's continuation, under
  the same workflow id ``Fleet`` would use. While it was not listening (at start, after a lost
  connection) it looks at every waiting session once instead. A run that ends waiting also checks
  for an answer that came while it was finishing, to the session or to a delegated child it waits on.

- **No idle slot between runs.** DBOS hands a worker runs only when its queue thread polls (every
  ``polling_interval``), so a slot freed by a finished run would stay empty until the next poll. A
  worker takes up to ``prefetch`` runs more than its ``concurrency``; they wait in the worker for a
  free slot and start the moment one frees. A run that has waited for a while holds its session's
  lease (renewed, released when it starts), so no supervisor takes it for the run of a dead worker.

One workflow is one run of a session ("run this session until it pauses, awaits approval,
finishes or fails"); qitos commits its own steps, so no DBOS step is recorded per agent step.
Sessions in a store a fleet serves are the fleet's: its workers continue any of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from qitos.checkpoint._postgres_store import PostgresCheckpointStore
from qitos.checkpoint._targets import postgres_dsn
from qitos.core._errors import CheckpointError, ConfigurationError, LeaseLostError, SessionBusyError
from qitos.distributed._naming import (
    APP_NAME,
    DEFAULT_QUEUE,
    WORKFLOW_NAME,
    bind_store,
    continuation_workflow_id,
    dbos_schema,
    redispatch_workflow_id,
)
from qitos.engine._composition import Composition
from qitos.sessions._control import acontinuation, continuation, continuation_position, delegation_root
from qitos.sessions._inspection import SessionLifecycle
from qitos.sessions._lease import LeaseKeeper, holder_is_dead, runner_id

__all__ = ["Worker", "dbos_url", "run_session_workflow"]

_UNSETTLED = (SessionLifecycle.CREATED.value, SessionLifecycle.RUNNING.value)
_WAITING = (SessionLifecycle.PAUSED.value, SessionLifecycle.AWAITING_APPROVAL.value)
_MAX_STUCK_GRACE = 5.0  # seconds a dequeued run may take to hold its lease before it counts as stuck
_RESERVE_AFTER = 0.5  # of that grace: how long a prefetched run waits for a slot before it holds the lease
_RETRY_FOR = 30.0  # seconds a run keeps resuming after store failures (at least two leases)
_RETRY_PAUSE = 0.2  # the first pause between attempts, doubling up to 2 s
_current: Worker | None = None


def dbos_url(db: str) -> str:
    """The SQLAlchemy URL DBOS needs for the database ``db`` names (psycopg 3 driver, no ``schema``)."""
    dsn, _ = postgres_dsn(db)
    scheme, sep, rest = dsn.partition("://")
    if not sep or scheme not in ("postgresql", "postgres"):
        raise ConfigurationError(f"a fleet needs a postgresql:// database, got {db!r}")
    return f"postgresql+psycopg://{rest}"


async def run_session_workflow(session_id: str) -> str:
    """The DBOS workflow body: run ``session_id`` on this process's worker; how the run ended."""
    worker = _current
    if worker is None:
        raise ConfigurationError("no qitos fleet worker is running in this process")
    return await worker.arun_session(session_id)


class Worker:
    """One worker process's DBOS runtime: the queue, the session workflow and the supervisor.

    ``concurrency`` sessions run at once; DBOS may hand the worker ``prefetch`` more runs (default:
    as many as ``concurrency``), which wait here for a free slot. ``polling_interval`` is how often,
    in seconds, the worker asks DBOS for runs.
    """

    def __init__(
        self,
        composition: Composition,
        *,
        db: str,
        queue: str = DEFAULT_QUEUE,
        concurrency: int = 8,
        prefetch: int | None = None,
        polling_interval: float = 0.05,
        supervise: bool = True,
    ) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigurationError(f"concurrency must be a positive int, got {concurrency!r}")
        if prefetch is None:
            prefetch = concurrency
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ConfigurationError(f"prefetch must be an int >= 0, got {prefetch!r}")
        self.composition = bind_store(composition, db)
        store = self.composition.runtime.checkpoint_store
        if not isinstance(store, PostgresCheckpointStore):  # bind_store opened db: always PostgreSQL here
            raise ConfigurationError(f"a fleet worker needs a PostgreSQL store, got {type(store).__name__}")
        self.store = store
        self.db = db
        self.queue_name = queue
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.polling_interval = polling_interval
        self.supervise = supervise
        self.executor_id = runner_id()
        self.redispatched = 0
        self.continued = 0
        self.queue_limit: int | None = None  # runs DBOS hands this worker at most: read at start, then each pass
        self.changed_queue_limit = False  # whether registering the queue changed the limit another worker set
        self.replaced_limit: int | None = None  # that limit, when it did (None: no limit)
        self._stop = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._dbos: Any = None
        self._queue: Any = None
        self._slots = asyncio.Semaphore(concurrency)  # bound to DBOS's event loop at its first use

    def start(self) -> None:
        """Launch DBOS (creating its system tables if needed), the queue and the supervisor."""
        global _current
        from dbos import DBOS

        if _current is not None:
            raise ConfigurationError("one fleet worker per process (DBOS is a process singleton)")
        _current = self
        config: Any = {
            "name": APP_NAME,
            "system_database_url": dbos_url(self.db),
            "dbos_system_schema": dbos_schema(self.db),
            "executor_id": self.executor_id,
            "application_version": "qitos-fleet-1",
            "max_executor_threads": self.concurrency + self.prefetch + 4,
            "notification_listener_polling_interval_sec": 0.05,
            "log_level": "WARNING",
        }
        self._dbos = DBOS(config=config)
        DBOS.workflow(name=WORKFLOW_NAME)(run_session_workflow)
        DBOS.launch()
        registered = DBOS.retrieve_queue(self.queue_name)  # None: this worker registers a new queue
        if registered is not None and registered.worker_concurrency != self.intake:  # read before it changes
            self.changed_queue_limit, self.replaced_limit = True, registered.worker_concurrency
        self._queue = DBOS.register_queue(
            self.queue_name,
            worker_concurrency=self.intake,
            polling_interval_sec=self.polling_interval,
        )
        self.read_queue_limit()
        if self.supervise:
            self._supervisor = threading.Thread(target=self._supervise, name="qitos-fleet-supervisor", daemon=True)
            self._supervisor.start()

    @property
    def intake(self) -> int:
        """How many runs this worker asks DBOS for at most: ``concurrency + prefetch``."""
        return self.concurrency + self.prefetch

    def read_queue_limit(self) -> int | None:
        """How many runs DBOS hands this worker at most now (the queue's ``worker_concurrency``), read
        again from DBOS's tables into :attr:`queue_limit`; None means no limit.

        It is one value for every worker of the queue (the module docstring says why): below
        :attr:`intake`, this worker runs fewer sessions at once than ``concurrency`` asks.
        """
        self.queue_limit = self._queue.worker_concurrency
        return self.queue_limit

    def stop(self) -> None:
        """Stop the supervisor and DBOS (running sessions are left to their leases)."""
        global _current
        from dbos import DBOS

        self._stop.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=5)
        DBOS.destroy(destroy_registry=False)
        _current = None

    # ---- running sessions

    async def arun_session(self, session_id: str) -> str:
        """Run ``session_id`` until it pauses, awaits approval, finishes or fails; how it ended.

        A run that ends waiting runs again at once if an answer (or steering) it did not take in
        came while it was finishing, to the session or to a delegated child it waits on
        (``continuation``): that answer's own run found the lease still held. A run that
        failed on the store itself (a lost connection, the server restarting: a plain
        ``CheckpointError``), or lost its lease with nobody taking the session over (it stalled
        past the lease), is resumed from its last committed boundary, with pauses, for up to
        ``max(30 s, 2 leases)``; then the workflow fails and ``Fleet.resume`` starts it again. A
        run whose session another runner took over ends ``lease_lost``: that runner carries on.
        The run first waits for one of the worker's ``concurrency`` slots.
        """
        async with self._slot(session_id):
            return await self._run_session(session_id)

    @contextlib.asynccontextmanager
    async def _slot(self, session_id: str) -> AsyncIterator[None]:
        """Hold one of the run slots; while waiting for one, hold ``session_id``'s lease after a while.

        A prefetched run that waits longer than a supervisor's grace without a lease would look
        like the run of a dead worker; so after half of it, the run takes the session's lease (kept
        renewed) and releases it when it gets its slot, just before the run takes it again. If
        another runner holds the lease, the run goes on waiting (and finds it busy, or free, later).
        """
        slots = self._slots
        if slots.locked():
            reserve_after = _RESERVE_AFTER * min(self.composition.runtime.lease_ttl, _MAX_STUCK_GRACE)
            acquiring = asyncio.ensure_future(slots.acquire())
            reservation: LeaseKeeper | None = None
            try:
                while not acquiring.done():
                    await asyncio.wait({acquiring}, timeout=reserve_after)
                    if not acquiring.done() and reservation is None:
                        reservation = await self._reserve(session_id)
            except BaseException:
                acquiring.cancel()  # no effect if it has just acquired: then the slot goes back
                if acquiring.done() and not acquiring.cancelled() and acquiring.exception() is None:
                    slots.release()
                raise
            finally:
                if reservation is not None:
                    await reservation.arelease()
        else:
            await slots.acquire()
        try:
            yield
        finally:
            slots.release()

    async def _reserve(self, session_id: str) -> LeaseKeeper | None:
        """``session_id``'s lease, renewed from now on; None if another runner holds it or the store
        failed (the waiting run tries again later; its run deals with the store as any run does)."""
        keeper = LeaseKeeper(self.store, session_id, ttl_seconds=self.composition.runtime.lease_ttl)
        try:
            await keeper.aacquire()
        except CheckpointError:  # SessionBusyError among them
            return None
        keeper.start_async_heartbeat()
        return keeper

    async def _run_session(self, session_id: str) -> str:
        store = self.store
        retry_until: float | None = None  # set by the first store failure
        pause = _RETRY_PAUSE
        while True:
            try:
                result = await (await self.composition.arestore(session_id)).arun()
            except LeaseLostError:
                with contextlib.suppress(CheckpointError):  # unreadable now: the next attempt finds out
                    if await self._held_elsewhere(session_id):
                        return "lease_lost"  # taken over after this runner stalled past its lease: it carries on
                # The lease lapsed and nobody took the session: DBOS would record this run as a success
                # and nothing would continue the session, so it goes on here, as after a store failure.
                if retry_until is None:
                    retry_until = time.monotonic() + max(_RETRY_FOR, 2 * self.composition.runtime.lease_ttl)
                elif time.monotonic() > retry_until:
                    raise
            except SessionBusyError:
                if retry_until is None or time.monotonic() > retry_until:
                    return "busy"  # another runner holds the lease; it (or a re-dispatch) carries on
                # The failed run's own lease may be left (its release failed too): wait it out.
            except CheckpointError as exc:
                if type(exc) is not CheckpointError:
                    raise  # damage, a conflict or a missing session is not cured by waiting
                if retry_until is None:
                    retry_until = time.monotonic() + max(_RETRY_FOR, 2 * self.composition.runtime.lease_ttl)
                elif time.monotonic() > retry_until:
                    raise
            else:
                retry_until, pause = None, _RETRY_PAUSE
                ended = str(result.state.stop_reason or "")
                if ended not in _WAITING or await acontinuation(store, session_id) is None:
                    return ended
                continue
            await asyncio.sleep(pause)
            pause = min(2 * pause, 2.0)

    async def _held_elsewhere(self, session_id: str) -> bool:
        """Whether a live runner holds ``session_id``'s lease (this run's own was lost)."""
        lease = await self.store.aget_lease(session_id)
        return lease is not None and lease.expires_at > time.time() and not holder_is_dead(lease.owner)

    # ---- the supervisor

    def supervise_once(self) -> int:
        """Re-dispatch the runs of dead workers whose sessions still have work; how many."""
        from dbos import DBOS, SetWorkflowID

        ttl = self.composition.runtime.lease_ttl
        grace = min(ttl, _MAX_STUCK_GRACE)
        cutoff = datetime.datetime.fromtimestamp(time.time() - grace, tz=datetime.UTC).isoformat()
        stuck = DBOS.list_workflows(
            status="PENDING",
            name=WORKFLOW_NAME,
            queue_name=self.queue_name,
            dequeued_before=cutoff,
            load_output=False,
        )
        count = 0
        for status in stuck:
            inputs: Any = status.input or {}
            args: Any = inputs.get("args") or ()
            if len(args) != 1 or not isinstance(args[0], str):
                continue
            session_id = args[0]
            if not self._needs_a_run(session_id):
                continue
            with SetWorkflowID(redispatch_workflow_id(status.workflow_id)):
                self._queue.enqueue(run_session_workflow, session_id)
            DBOS.cancel_workflow(status.workflow_id)  # its worker is gone; the new run replaces it
            count += 1
        self.redispatched += count
        return count

    def _needs_a_run(self, session_id: str) -> bool:
        """Whether nobody holds ``session_id``'s lease and the session still has work to do."""
        store = self.store
        lease = store.get_lease(session_id)
        if lease is not None and lease.expires_at > time.time() and not holder_is_dead(lease.owner):
            return False  # a live runner has it
        head = store.get_session_head(session_id)
        if head is None:
            return False
        if head.lifecycle in _UNSETTLED:
            return True
        return continuation(store, session_id, head=head) is not None

    def continue_answered(self, session_ids: list[str]) -> int:
        """Enqueue the continuation of each waiting session that has an answer it did not take in."""
        from dbos import SetWorkflowID

        count = 0
        for session_id in session_ids:
            position = continuation_position(self.store, session_id)
            if position is None:
                continue
            root = delegation_root(self.store, session_id)  # a delegated child goes on in its parent's run
            with SetWorkflowID(continuation_workflow_id(root, session_id, position)):  # Fleet's id too
                self._queue.enqueue(run_session_workflow, root)
            count += 1
        self.continued += count
        return count

    def continue_all_answered(self) -> int:
        """:meth:`continue_answered` for every waiting session of the store (after not listening)."""
        waiting = [head.session_id for head in self.store.list_sessions(lifecycles=_WAITING)]
        return self.continue_answered(waiting)

    def _supervise(self) -> None:
        interval = min(1.0, max(0.2, self.composition.runtime.lease_ttl / 4))
        announcements = self.store.control_announcements()
        next_check = time.monotonic() + interval
        try:
            while not self._stop.is_set():
                try:
                    announced = announcements.wait(timeout=max(0.0, min(interval, next_check - time.monotonic())))
                    if announced is None:
                        self.continue_all_answered()  # not listening until now: look at every waiting one
                    elif announced:
                        self.continue_answered(sorted(announced))
                    if time.monotonic() >= next_check:
                        next_check = time.monotonic() + interval
                        self.read_queue_limit()
                        self.supervise_once()
                except Exception:  # a lost connection must not end the supervisor; the next pass retries
                    self._stop.wait(interval)
        finally:
            announcements.close()
