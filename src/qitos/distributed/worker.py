"""A fleet worker: DBOS runs sessions from a queue; a supervisor re-dispatches a dead runner's.

What DBOS (``dbos>=3,<4``, tested with 3.4.0) does here: it stores each enqueued run as a workflow
in its system tables (schema ``{store schema}_dbos`` in the same PostgreSQL), dispatches queued
workflows to workers up to each one's ``concurrency``, and starts one workflow per id only, so a
repeated request for the same continuation is one run. Self-hosted DBOS recovers a process's
pending workflows only when a process with the *same executor id* starts again; it does not hand
a dead executor's workflows to the workers still alive.

What qitos adds: the session lease is the source of truth for who runs a session. Every worker
runs a supervisor thread that, every quarter lease (at most 1 s), looks for sessions still ``created`` or
``running`` whose lease has expired (their runner died or stalled), and enqueues a new run with a
workflow id carrying the expired lease's fencing token, so all supervisors ask for the same run and
DBOS starts it once. The new run takes the lease over (a stalled old runner is then fenced off by
the store) and resumes from the last committed boundary; a tool call that was started and not
finished is not repeated unless it is idempotent (``qitos.sessions.step_journal``).

One workflow is one ``Session.run`` ("run this session until it pauses, awaits approval, finishes
or fails"); qitos commits its own steps, so no DBOS step is recorded per agent step.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from qitos.checkpoint.targets import postgres_dsn
from qitos.core.errors import ConfigurationError, LeaseLostError, SessionBusyError
from qitos.distributed.naming import (
    APP_NAME,
    DEFAULT_QUEUE,
    WORKFLOW_NAME,
    bind_store,
    dbos_schema,
    redispatch_workflow_id,
)
from qitos.engine.composition import Composition
from qitos.sessions.inspection import SessionLifecycle
from qitos.sessions.lease import runner_id

__all__ = ["Worker", "dbos_url", "run_session_workflow"]

_UNSETTLED = (SessionLifecycle.CREATED.value, SessionLifecycle.RUNNING.value)
_current: Worker | None = None


def dbos_url(db: str) -> str:
    """The SQLAlchemy URL DBOS needs for the database ``db`` names (psycopg 3 driver, no ``schema``)."""
    dsn, _ = postgres_dsn(db)
    scheme, sep, rest = dsn.partition("://")
    if not sep or scheme not in ("postgresql", "postgres"):
        raise ConfigurationError(f"a fleet needs a postgresql:// database, got {db!r}")
    return f"postgresql+psycopg://{rest}"


def run_session_workflow(session_id: str) -> str:
    """The DBOS workflow body: run ``session_id`` on this process's worker; its lifecycle after."""
    worker = _current
    if worker is None:
        raise ConfigurationError("no qitos fleet worker is running in this process")
    return worker.run_session(session_id)


class Worker:
    """One worker process's DBOS runtime: the queue, the session workflow and the supervisor."""

    def __init__(
        self,
        composition: Composition,
        *,
        db: str,
        queue: str = DEFAULT_QUEUE,
        concurrency: int = 8,
        polling_interval: float = 0.05,
        supervise: bool = True,
    ) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigurationError(f"concurrency must be a positive int, got {concurrency!r}")
        self.composition = bind_store(composition, db)
        self.db = db
        self.queue_name = queue
        self.concurrency = concurrency
        self.polling_interval = polling_interval
        self.supervise = supervise
        self.executor_id = runner_id()
        self.redispatched = 0
        self._stop = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._dbos: Any = None
        self._queue: Any = None

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
            "max_executor_threads": self.concurrency + 4,
            "notification_listener_polling_interval_sec": 0.05,
            "log_level": "WARNING",
        }
        self._dbos = DBOS(config=config)
        DBOS.workflow(name=WORKFLOW_NAME)(run_session_workflow)
        DBOS.launch()
        self._queue = DBOS.register_queue(
            self.queue_name, worker_concurrency=self.concurrency, polling_interval_sec=self.polling_interval
        )
        if self.supervise:
            self._supervisor = threading.Thread(target=self._supervise, name="qitos-fleet-supervisor", daemon=True)
            self._supervisor.start()

    def stop(self) -> None:
        """Stop the supervisor and DBOS (running sessions are left to their leases)."""
        global _current
        from dbos import DBOS

        self._stop.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=5)
        DBOS.destroy(destroy_registry=False)
        _current = None

    def run_session(self, session_id: str) -> str:
        """Run ``session_id`` until it pauses, awaits approval, finishes or fails; its lifecycle then."""
        store = self.composition.runtime.checkpoint_store
        try:
            self.composition.restore(session_id).run()
        except SessionBusyError:
            return "busy"  # another runner holds the lease; its run (or a re-dispatch) carries on
        except LeaseLostError:
            return "lease_lost"  # taken over after this runner stalled past its lease
        head = store.get_session_head(session_id)
        return head.lifecycle if head is not None else "missing"

    def supervise_once(self) -> int:
        """Enqueue a new run for every unsettled session whose lease expired; how many were enqueued."""
        from dbos import SetWorkflowID

        store = self.composition.runtime.checkpoint_store
        now = time.time()
        count = 0
        for head in store.list_sessions():
            if head.lifecycle not in _UNSETTLED:
                continue
            lease = store.get_lease(head.session_id)
            # No lease: never started (or still queued). expires_at 0: released by a run that ended
            # on its own (a dead process releases nothing), so re-running it would only repeat that.
            if lease is None or lease.expires_at <= 0 or lease.expires_at > now:
                continue
            items = store.list_control(head.session_id)
            position = items[-1].position if items else 0
            with SetWorkflowID(redispatch_workflow_id(head.session_id, position, lease.token)):
                self._queue.enqueue(run_session_workflow, head.session_id)
            count += 1
        self.redispatched += count
        return count

    def _supervise(self) -> None:
        interval = min(1.0, max(0.2, self.composition.runtime.lease_ttl / 4))
        while not self._stop.wait(interval):
            try:
                self.supervise_once()
            except Exception:  # a lost connection must not end the supervisor
                continue
