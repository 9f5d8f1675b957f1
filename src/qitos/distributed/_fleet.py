"""``Fleet``: create sessions in the shared store and hand their runs to the workers through DBOS.

The fleet's client side needs no worker in its process: it writes sessions and control items to
the checkpoint store and enqueues runs with a ``DBOSClient`` (DBOS's system tables must exist:
a worker creates them when it first starts). Outcomes are read back from the store alone. See
``qitos.distributed._worker`` for what DBOS does and what qitos adds.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from qitos.checkpoint._records import SessionPosition
from qitos.core._errors import ConfigurationError, SessionNotFoundError
from qitos.core._task import Task
from qitos.distributed._naming import (
    APP_NAME,
    DEFAULT_QUEUE,
    FLEET_METADATA,
    WORKFLOW_NAME,
    bind_store,
    continuation_workflow_id,
    dbos_schema,
    run_workflow_id,
)
from qitos.distributed._worker import Worker, dbos_url
from qitos.engine._composition import Composition
from qitos.engine.session_runtime import Session, new_session
from qitos.sessions._control import (
    ApprovalReceipt,
    PauseReceipt,
    SteeringReceipt,
    answer_approval,
    pause_session,
    steer_session,
)
from qitos.sessions._inspection import SessionLifecycle

__all__ = ["Fleet", "SessionOutcome"]

_SUBMIT_BATCH = 64  # sessions whose first runs submit_many enqueues in one transaction
_FIRST_BATCH = 8  # the first batch: the workers start while the next ones are created (doubling up)
_SUBMIT_THREADS = 8  # sessions submit_many creates at once
_WAIT_WINDOW = 32  # pending heads a wait poll reads
_WAITING = (SessionLifecycle.PAUSED.value, SessionLifecycle.AWAITING_APPROVAL.value)
SETTLED = frozenset(
    {
        SessionLifecycle.PAUSED.value,
        SessionLifecycle.AWAITING_APPROVAL.value,
        SessionLifecycle.COMPLETED.value,
        SessionLifecycle.STOPPED.value,
        SessionLifecycle.FAILED.value,
    }
)


@dataclass(frozen=True, kw_only=True)
class SessionOutcome:
    """Where a session stands, from the store: its lifecycle and head sequence."""

    session_id: str
    lifecycle: str
    sequence: int


class Fleet:
    """Submit sessions to a fleet of workers and control them, from any process.

    ``db`` is a ``postgresql://`` URL naming the checkpoint store (it replaces the composition's)
    and, in schema ``{schema}_dbos``, DBOS's system tables. ``concurrency`` is how many sessions
    :meth:`serve` runs at once in this process.
    """

    def __init__(self, composition: Composition, *, db: str, queue: str = DEFAULT_QUEUE, concurrency: int = 8) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigurationError(f"concurrency must be a positive int, got {concurrency!r}")
        self.db = db
        self.queue = queue
        self.concurrency = concurrency
        self._base = composition
        self.composition = bind_store(composition, db)
        self.store = self.composition.runtime.checkpoint_store
        self._client: Any = None
        self._engine: Any = None  # SQLAlchemy engine on DBOS's database, for batched enqueues
        self._enqueued_at: dict[str, int] = {}

    # ---- client side

    def _dbos(self) -> Any:
        if self._client is None:
            from dbos import DBOSClient

            self._client = DBOSClient(
                system_database_url=dbos_url(self.db),
                dbos_system_schema=dbos_schema(self.db),
                application_name=APP_NAME,
            )
        return self._client

    def _enqueue(
        self, session_id: str, position: int, *, sequence: int | None = None, answered: str | None = None
    ) -> str:
        """Enqueue the run answering ``position`` of ``answered`` (``session_id`` or a delegated child of it).

        ``sequence`` is the head's, when the caller knows it.
        """
        if sequence is None:
            head = self.store.get_session_head(session_id)
            if head is None:
                raise SessionNotFoundError(session_id)
            sequence = head.sequence
        self._enqueued_at[session_id] = sequence
        workflow_id = continuation_workflow_id(session_id, answered or session_id, position)
        self._dbos().enqueue(self._options(workflow_id), session_id)
        return workflow_id

    def _options(self, workflow_id: str) -> Any:
        return {"queue_name": self.queue, "workflow_name": WORKFLOW_NAME, "workflow_id": workflow_id}

    def _enqueue_first_runs(self, session_ids: list[str]) -> None:
        """Enqueue the first runs of new sessions in one transaction of DBOS's database (one commit)."""
        client = self._dbos()
        if self._engine is None:
            import sqlalchemy

            self._engine = sqlalchemy.create_engine(dbos_url(self.db), pool_size=1, pool_pre_ping=True)
        with self._engine.begin() as conn:
            for session_id in session_ids:
                client.enqueue_in_transaction(conn, self._options(run_workflow_id(session_id, 0)), session_id)
        for session_id in session_ids:
            self._enqueued_at[session_id] = 0  # a new session's head is its first snapshot

    def _create(
        self,
        task: str | Task,
        state_kwargs: dict[str, Any],
        session_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Session:
        """A new session of the composition, marked as this fleet's (``fleet_queue`` reads the mark)."""
        mark = {**(metadata or {}), FLEET_METADATA: {"queue": self.queue}}
        return new_session(
            self.composition.engine(),
            task,
            composition=self.composition,
            session_id=session_id,
            metadata=mark,
            **state_kwargs,
        )

    def submit(self, task: str | Task, **state_kwargs: Any) -> str:
        """Create a session for ``task`` and enqueue its first run; the session id."""
        session = self._create(task, state_kwargs)
        self._enqueue(session.session_id.value, 0, sequence=0)  # a new session's head is its first snapshot
        return session.session_id.value

    def submit_many(
        self,
        tasks: Iterable[str | Task],
        *,
        session_ids: Sequence[str] | None = None,
        metadata: Sequence[Mapping[str, Any]] | None = None,
        **state_kwargs: Any,
    ) -> list[str]:
        """:meth:`submit` for each task, in order; their session ids.

        ``session_ids`` gives each session its id (one per task; ``qitos.eval`` derives them from
        the eval, sample and epoch) and ``metadata`` extra session metadata (one mapping per task).

        Batches of sessions are created a few at once and their runs enqueued in one transaction,
        so submitting many is not one commit wait after another. The first batch is small and each
        next one twice as large (up to ``_SUBMIT_BATCH``), so the workers start on the first runs
        while the rest are created. A process that dies between creating a batch and enqueueing
        it leaves sessions ``created`` and unqueued: ``resume`` them.
        """
        pending = list(tasks)
        given_ids = list(session_ids) if session_ids is not None else [None] * len(pending)
        extra = list(metadata) if metadata is not None else [None] * len(pending)
        if len(given_ids) != len(pending) or len(extra) != len(pending):
            raise ConfigurationError("submit_many: session_ids and metadata need one entry per task")
        ids: list[str] = []
        size = _FIRST_BATCH
        with concurrent.futures.ThreadPoolExecutor(_SUBMIT_THREADS, thread_name_prefix="qitos-submit") as pool:
            while len(ids) < len(pending):
                start = len(ids)
                batch = list(zip(pending[start : start + size], given_ids[start:], extra[start:], strict=False))
                created = pool.map(lambda item: self._create(item[0], state_kwargs, item[1], item[2]), batch)
                session_ids = [session.session_id.value for session in created]
                self._enqueue_first_runs(session_ids)
                ids.extend(session_ids)
                size = min(2 * size, _SUBMIT_BATCH)
        return ids

    def approve(self, session_id: str, call_id: str) -> ApprovalReceipt:
        """Approve the call ``session_id`` waits for and enqueue its continuation (once, however often asked).

        Asking again returns the first answer's receipt; answering a call the other way raises
        ``ConfigurationError``.
        """
        return self._answer(session_id, call_id, approved=True, reason=None)

    def reject(self, session_id: str, call_id: str, reason: str | None = None) -> ApprovalReceipt:
        """Reject the call ``session_id`` waits for and enqueue its continuation (once)."""
        return self._answer(session_id, call_id, approved=False, reason=reason)

    def steer(self, session_id: str, text: str) -> SteeringReceipt:
        """Submit steering text; a paused session's continuation is enqueued."""
        receipt = steer_session(self.store, session_id, text)
        self._continue_if_waiting(
            session_id, receipt.position, (SessionLifecycle.PAUSED.value,), answered=receipt.session_id
        )
        return receipt

    def pause(self, session_id: str) -> PauseReceipt:
        """Request a cooperative pause (the running session stops at its next boundary)."""
        return pause_session(self.store, session_id)

    def resume(self, session_id: str) -> str:
        """Enqueue the continuation of a paused session at its latest control position; the workflow id."""
        items = self.store.list_control(session_id)
        return self._enqueue(session_id, items[-1].position if items else 0)

    def _answer(self, session_id: str, call_id: str, *, approved: bool, reason: str | None) -> ApprovalReceipt:
        kind = "approve" if approved else "reject"
        for item in self.store.list_control(session_id, kinds=("approve", "reject")):
            if item.payload.get("call_id") != call_id:
                continue
            if item.kind != kind:
                raise ConfigurationError(f"session {session_id}: call {call_id!r} was already answered {item.kind}")
            # Asked again: the same answer and continuation (DBOS starts one run per id), whether or
            # not the session has taken the answer in yet.
            self._continue_if_waiting(session_id, item.position, _WAITING)
            return ApprovalReceipt(
                session_id=session_id, call_id=call_id, approved=approved, position=item.position, reason=reason
            )
        receipt = answer_approval(self.store, session_id, call_id, approved=approved, reason=reason)
        self._enqueue(session_id, receipt.position, answered=receipt.session_id)  # a delegated child's answer
        return receipt

    def _continue_if_waiting(
        self, session_id: str, position: int, lifecycles: tuple[str, ...], *, answered: str | None = None
    ) -> None:
        head = self.store.get_session_head(session_id)
        if head is not None and head.lifecycle in lifecycles:
            self._enqueue(session_id, position, sequence=head.sequence, answered=answered)

    # ---- outcomes

    def results(self, session_ids: Iterable[str]) -> dict[str, SessionOutcome]:
        """Each session's outcome as the store has it now."""
        ids = list(session_ids)
        heads = self.store.get_session_positions(ids)
        out: dict[str, SessionOutcome] = {}
        for sid in ids:
            head = heads.get(sid)
            if head is None:
                raise SessionNotFoundError(sid)
            out[sid] = SessionOutcome(session_id=sid, lifecycle=head.lifecycle, sequence=head.sequence)
        return out

    def wait(
        self, session_ids: Iterable[str], *, timeout: float = 60.0, poll: float = 0.02
    ) -> dict[str, SessionOutcome]:
        """Wait until every session has settled since this fleet last enqueued it; their outcomes.

        Settled: paused, awaiting approval, completed, stopped or failed, with a head newer than the
        one it had when this fleet enqueued its run. Raises ``TimeoutError`` naming the unsettled.
        """
        ids = list(session_ids)
        deadline = time.monotonic() + timeout
        heads = self.store.get_session_positions(ids)  # once: an unknown session is named at once
        pending = [sid for sid in ids if not self._settled(sid, heads.get(sid))]
        while pending:
            # Then a poll asks for the settled ones among the first _WAIT_WINDOW pending heads, not
            # all of them: runs start in the order they were enqueued, so the sessions settling
            # soonest are there, and a wait on thousands reads a bounded number of heads a poll
            # (the store returns, and checks, only the settled ones). When any of them settled,
            # the next ones are read at once.
            time.sleep(poll)
            while pending:
                window = pending[:_WAIT_WINDOW]
                heads = self.store.get_session_positions(window, lifecycles=SETTLED)
                done = {sid for sid in window if sid in heads and self._settled(sid, heads[sid])}
                if not done:
                    break
                pending = [sid for sid in pending if sid not in done]
            if pending and time.monotonic() > deadline:
                heads = self.store.get_session_positions(pending)
                pending = [sid for sid in pending if not self._settled(sid, heads.get(sid))]
                if pending:
                    raise TimeoutError(f"{len(pending)} sessions did not settle in {timeout}s: {pending[:5]}")
        return self.results(ids)

    def _settled(self, session_id: str, head: SessionPosition | None) -> bool:
        if head is None:
            raise SessionNotFoundError(session_id)
        return head.lifecycle in SETTLED and head.sequence > self._enqueued_at.get(session_id, -1)

    # ---- worker side

    def serve(self, *, supervise: bool = True) -> Worker:
        """Start a worker in this process running ``concurrency`` sessions at once (stop it with ``.stop()``)."""
        worker = Worker(self._base, db=self.db, queue=self.queue, concurrency=self.concurrency, supervise=supervise)
        worker.start()
        return worker

    def close(self) -> None:
        """Close the DBOS client and the store."""
        if self._client is not None:
            self._client.destroy()
            self._client = None
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
        self.store.close()
