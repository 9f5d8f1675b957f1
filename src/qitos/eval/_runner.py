"""Running an eval: every sample x epoch as a durable session, at most ``max_samples`` at once.

For each sample x epoch (an *unit*) the runner:

1. runs the agent in a session whose id derives from the eval id, the sample id, the epoch and the
   attempt (:func:`session_id_for`), with metadata ``{"eval": {...}}`` naming them. A session that
   exists is continued from its head (``Session.arun``), or, when it already finished, read and not
   run; a session another runner holds (``SessionBusyError``) is waited for, then read;
2. records the attempt (and, when it is the last, the unit's result) in the eval tables;
3. scores the result, each scorer's score or error in the eval tables (a separate, later write: a
   crash while scoring never re-runs the agent, and a resume only scores).

A failed attempt (the agent raised, the sample timed out) is retried in a fresh session up to
``retries`` times. Cancelling the run (Ctrl-C) cancels the samples in flight at their next
boundary; their sessions keep every committed step, so a resume goes on from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from qitos.checkpoint._records import SessionHeadRecord, utc_now
from qitos.checkpoint.store import CheckpointStore
from qitos.core._agent_module import AgentModule
from qitos.core._codec import canonical_json, sha256_hex
from qitos.core._errors import CheckpointError, ConfigurationError, LeaseLostError, SessionBusyError, UsageError
from qitos.distributed._fleet import SETTLED, Fleet
from qitos.engine._agent_ref import MOVED_MODULES
from qitos.engine._composition import Composition, compose
from qitos.engine._engine import Engine
from qitos.engine._events import EngineEventType, EngineResult
from qitos.engine.session_runtime import Session, anew_session, arestore_session
from qitos.eval._dataset import Dataset, Sample
from qitos.eval._replay import ON_DIVERGENCE, ReplayPlan, UnitKey
from qitos.eval._report import EvalReport, build_report
from qitos.eval._result import SampleResult
from qitos.eval._store import (
    AttemptRecord,
    EvalRecord,
    ResultRecord,
    ScoreRecord,
    ScorerRecord,
    open_eval_store,
)
from qitos.eval.scorers import Scorer, ScorerError
from qitos.models._function import ModelSource
from qitos.sessions._inspection import SessionLifecycle
from qitos.sessions._step_journal import arestore

__all__ = [
    "EVAL_METADATA",
    "EvalChangedError",
    "EvalProgress",
    "EvalRun",
    "agent_reference",
    "eval_id_for",
    "session_id_for",
]

EVAL_METADATA = "eval"
"""The session metadata key of an eval's sessions: ``{"eval_id", "name", "sample_id", "epoch", "attempt"}``."""

DEFAULT_STORE = "evals.db"
EVAL_LEASE_TTL = 600.0
"""Seconds a sample's session lease lasts unrenewed (``engine_kwargs={"lease_ttl": ...}`` overrides).

Longer than a composition's default: with hundreds of samples in flight, renewals every 10 s are
hundreds of store writes a second, and an overloaded process could miss one and lose its lease. A
runner that died is still replaced at once on its own host (the lease names a dead process);
only a runner on another host waits for the lease to run out."""
_FLEET_POLL = 0.1  # seconds between looks at the heads of the samples in flight on a fleet
_LEASE_LOSSES = 3  # times a sample's run may lose its lease and go on before it counts as failed
_OPENING = 16
_BUSY_POLL = 0.2  # seconds between looks at a session another runner holds
_STILL_RUNNING = frozenset({SessionLifecycle.CREATED.value, SessionLifecycle.RUNNING.value})


class EvalChangedError(UsageError):
    """Continuing an eval with something it pinned changed; ``changed`` names each difference."""

    def __init__(self, name: str, changed: Sequence[str]) -> None:
        super().__init__(
            f"eval {name!r} was run with a different setup; refusing to mix results. Changed: "
            + "; ".join(changed)
            + ". Use another name= (or --name) for a new eval."
        )
        self.name = name
        self.changed = list(changed)

    def __reduce__(self) -> tuple[Any, ...]:
        return (EvalChangedError, (self.name, self.changed))


@dataclass
class EvalProgress:
    """Live counters of a running eval (the CLI's display reads them; the runner updates them)."""

    total: int = 0
    done: int = 0
    running: int = 0
    failed: int = 0
    retried: int = 0
    skipped: int = 0  # units already recorded when this run started
    tokens: int = 0
    score_sum: float = 0.0
    scored: int = 0
    scorer_id: str | None = None  # the scorer whose running mean is shown
    diverged: int = 0  # replayed samples that left their recording
    started_at: float = field(default_factory=time.monotonic)

    @property
    def score_mean(self) -> float | None:
        """The running mean of ``scorer_id``'s scores (None before the first)."""
        return self.score_sum / self.scored if self.scored else None


def eval_id_for(name: str) -> str:
    """The eval id of the eval named ``name`` (the same in every process)."""
    return f"ev-{sha256_hex(name)[:16]}"


def session_id_for(eval_id: str, sample_id: str, epoch: int, attempt: int = 0) -> str:
    """The id of the session running ``attempt`` of ``sample_id`` in ``epoch`` of eval ``eval_id``."""
    return f"evs-{sha256_hex(canonical_json([eval_id, sample_id, epoch, attempt]))[:24]}"


def agent_reference(agent: object) -> str:
    """``module:qualname`` of an agent class or factory (of the class, for an instance)."""
    target = type(agent) if isinstance(agent, AgentModule) else agent
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None)
    if module is None or qualname is None:
        return repr(target)
    # An eval pins its agent by this name: a qitos agent whose module became private keeps the
    # name earlier evals pinned, so they resume instead of reporting a changed agent.
    return f"{_RECORDED_AS.get(module, module)}:{qualname}"


_RECORDED_AS = {new: old for old, new in MOVED_MODULES.items()}


def _model_description(model: object) -> Any:
    if model is None:
        return None
    describe = getattr(model, "describe", None)
    return describe() if callable(describe) else {"adapter": type(model).__name__}


@dataclass(frozen=True)
class Unit:
    sample: Sample
    epoch: int

    @property
    def key(self) -> tuple[str, int]:
        return (self.sample.sample_id, self.epoch)


class EvalRun:
    """One run of an eval (a first run or a resume): resolved arguments, then :meth:`arun`."""

    def __init__(
        self,
        agent: Any,
        dataset: Dataset | Iterable[Sample],
        *,
        scorers: Scorer | Sequence[Scorer],
        model: ModelSource | None = None,
        store: CheckpointStore | str | Any = DEFAULT_STORE,
        name: str | None = None,
        epochs: int = 1,
        max_samples: int = 64,
        limit: int | None = None,
        sample_timeout: float | None = None,
        retries: int = 0,
        fail_on_error: int | float | None = None,
        fleet: Any = None,
        engine_kwargs: Mapping[str, Any] | None = None,
        progress: EvalProgress | None = None,
        spec: Mapping[str, Any] | None = None,
        group_by: str | None = None,
        replay: str | None = None,
        on_divergence: str = "stop",
        cache: bool = False,
    ) -> None:
        self.dataset = dataset if isinstance(dataset, Dataset) else Dataset(dataset)
        self.scorers = _check_scorers(scorers)
        _check_int("epochs", epochs, 1)
        _check_int("max_samples", max_samples, 1)
        _check_int("retries", retries, 0)
        if limit is not None:
            _check_int("limit", limit, 1)
        if sample_timeout is not None and (
            isinstance(sample_timeout, bool) or not isinstance(sample_timeout, int | float) or sample_timeout <= 0
        ):
            raise ConfigurationError(
                f"sample_timeout must be a positive number of seconds or None, got {sample_timeout!r}"
            )
        if fail_on_error is not None:
            if isinstance(fail_on_error, bool) or not isinstance(fail_on_error, int | float):
                raise ConfigurationError(
                    f"fail_on_error must be an int >= 1, a float in (0, 1) or None, got {fail_on_error!r}"
                )
            if isinstance(fail_on_error, int) and fail_on_error < 1:
                raise ConfigurationError(
                    f"fail_on_error as an int is a count of failed samples >= 1, got {fail_on_error}"
                )
            if isinstance(fail_on_error, float) and not 0 < fail_on_error < 1:
                raise ConfigurationError(f"fail_on_error as a float is a share in (0, 1), got {fail_on_error}")
        self.samples = list(self.dataset)[:limit] if limit is not None else list(self.dataset)
        if not self.samples:
            raise ConfigurationError("the dataset has no samples")
        for sample in self.samples:  # a target a scorer cannot read fails now, before anything runs
            for scorer in self.scorers:
                scorer.check_target(sample)
        self.agent = agent
        self.agent_ref = agent_reference(agent)
        self.model = model
        self.epochs = epochs
        self.max_samples = max_samples
        self.limit = limit
        self.sample_timeout = float(sample_timeout) if sample_timeout is not None else None
        self.retries = retries
        self.fail_on_error = fail_on_error
        self.fleet = fleet
        self.engine_kwargs = dict(engine_kwargs or {})
        self.progress = progress or EvalProgress()
        self.spec = dict(spec) if spec is not None else None
        self.group_by = group_by
        if replay is not None and (not isinstance(replay, str) or not replay):
            raise ConfigurationError(f"replay= names an earlier eval (its id or name), got {replay!r}")
        if on_divergence not in ON_DIVERGENCE:
            raise ConfigurationError(f"on_divergence must be one of {', '.join(ON_DIVERGENCE)}, got {on_divergence!r}")
        if fleet is not None and (replay is not None or cache):
            raise ConfigurationError(
                "replay= and cache= answer model requests in this process; the fleet's workers use their own model"
            )
        self.replay = replay
        self.on_divergence = on_divergence
        self.cache = bool(cache)
        self._plan: ReplayPlan | None = None
        dataset_name = self.dataset.name or "dataset"
        self.name = name or (
            f"{self.agent_ref.rpartition(':')[2]}-{dataset_name}-"
            f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(2)}"
        )
        self.eval_id = eval_id_for(self.name)
        self.pins = {
            "dataset": {
                "name": self.dataset.name,
                "digest": Dataset(self.samples).digest,
                "samples": len(self.samples),
            },
            "agent": self.agent_ref,
            "model": _model_description(model),
            "scorers": [
                {"id": s.scorer_id, "version": s.version, "reducer": s.reducer, "spec": s.spec} for s in self.scorers
            ],
            "epochs": epochs,
            "limit": limit,
            "sample_timeout": self.sample_timeout,
            "retries": retries,
        }
        describe = getattr(agent, "describe", None) if isinstance(agent, AgentModule) else None
        if callable(describe):  # an instance that says what makes it itself (qitos.Agent: its instructions...)
            self.pins["agent_config"] = describe()
        try:
            canonical_json(self.pins)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"the eval's setup must be JSON to be pinned: {exc}") from exc
        if fleet is not None:
            store = _fleet_store(fleet, store)
            if self.sample_timeout is not None:
                raise ConfigurationError(
                    "sample_timeout is not enforced on the fleet (a worker's run cannot be cut short from here); give "
                    "the fleet's composition a time budget: compose(..., budget=RuntimeBudget(max_runtime_seconds=N))"
                )
            if self.engine_kwargs:
                raise ConfigurationError("engine_kwargs go to the fleet's composition, not to evaluate(fleet=...)")
        self._owns_store = not isinstance(store, CheckpointStore)  # opened here from its name: closed here
        self.checkpoint_store, self.eval_store = open_eval_store(store)
        self._composition: Composition | None = None
        self._stop: str | None = None
        self._failed = 0
        self._total_units = len(self.samples) * epochs
        self._tasks: set[asyncio.Task[Any]] = set()
        # Samples opening their session at once: with all of them opening together, every store
        # write of every opening queues before the first model request; a few at a time, the first
        # samples reach their model while the others open.
        self._opening = asyncio.Semaphore(_OPENING)

    # ------------------------------------------------------------------ the run

    async def arun(self) -> EvalReport:
        """Run (or continue) the eval; its report. Cancelled: the eval stays ``incomplete``.

        The eval store is closed at the end, and the checkpoint store too when it was opened here
        from its name (a store object passed in stays open for its owner)."""
        try:
            return await self._arun()
        finally:
            self.eval_store.close()
            if self._owns_store:
                self.checkpoint_store.close()

    async def _arun(self) -> EvalReport:
        store = self.eval_store
        if self.replay is not None or self.cache:
            self._plan = await self._call(
                ReplayPlan.load,
                self.checkpoint_store,
                store,
                replay=self.replay,
                samples=self.samples,
                epochs=self.epochs,
                on_divergence=self.on_divergence,
                cache=self.cache,
            )
            source = self._plan.source
            if source is not None:  # replaying another eval's replies is part of the experiment
                self.pins["replay"] = {"eval_id": source.eval_id, "on_divergence": self.on_divergence}
        record = EvalRecord(eval_id=self.eval_id, name=self.name, created_at=utc_now(), pins=self.pins, spec=self.spec)
        stored = await self._call(store.create_eval, record, [s.to_dict() for s in self.samples])
        changed = pin_changes(stored.pins, self.pins)
        if changed:
            raise EvalChangedError(self.name, changed)
        await self._call(store.set_status, self.eval_id, "running")
        await self._call(
            store.put_scorers,
            [
                ScorerRecord(
                    eval_id=self.eval_id, scorer_id=s.scorer_id, version=s.version, reducer=s.reducer, spec=s.spec
                )
                for s in self.scorers
            ],
        )
        results = {(r.sample_id, r.epoch): r for r in await self._call(store.results, self.eval_id)}
        attempts: dict[tuple[str, int], list[AttemptRecord]] = {}
        for attempt in await self._call(store.attempts, self.eval_id):
            attempts.setdefault((attempt.sample_id, attempt.epoch), []).append(attempt)
        scored: dict[tuple[str, int], set[str]] = {}
        for score in await self._call(store.scores, self.eval_id):
            scored.setdefault((score.sample_id, score.epoch), set()).add(score.scorer_id)
        units = [Unit(sample, epoch) for sample in self.samples for epoch in range(1, self.epochs + 1)]
        progress = self.progress
        progress.total = len(units)
        progress.scorer_id = self.scorers[0].scorer_id
        self._failed = sum(1 for r in results.values() if r.error is not None)
        pending: deque[Unit] = deque()
        unscored: list[tuple[Unit, ResultRecord]] = []
        for unit in units:
            result = results.get(unit.key)
            if result is None:
                pending.append(unit)
                continue
            progress.done += 1
            progress.skipped += 1
            progress.failed += result.error is not None
            progress.retried += result.attempts > 1
            progress.tokens += result.total_tokens
            missing = [s for s in self.scorers if s.scorer_id not in scored.get(unit.key, set())]
            if missing and result.error is None:
                unscored.append((unit, result))
        status = "complete"
        try:
            for unit, result in unscored:  # a crash while scoring: score now, never run the agent again
                await self._score(
                    unit, result, [s for s in self.scorers if s.scorer_id not in scored.get(unit.key, set())]
                )
            if pending and self._stop is None and not self._tripped():
                if self.fleet is not None:
                    await self._run_on_fleet(pending, attempts)
                else:
                    await self._run_local(pending, attempts)
            if self._stop == "failed" or self._tripped():
                status = "failed"
            elif self._stop is not None:
                status = "incomplete"
        except BaseException:
            status = "incomplete"
            await asyncio.shield(self._call(store.set_status, self.eval_id, status))
            raise
        final = await self._call(store.find_eval, self.eval_id)
        done = len(await self._call(store.results, self.eval_id))
        if status == "complete" and done < len(units):
            status = "incomplete"
        await self._call(store.set_status, self.eval_id, status)
        report: EvalReport = await self._call(
            build_report,
            store,
            final or record,
            scorers={s.scorer_id: s for s in self.scorers},
            group_by=self.group_by,
            status=status,
        )
        return report

    async def _run_local(self, pending: deque[Unit], attempts: Mapping[tuple[str, int], list[AttemptRecord]]) -> None:
        self._size_model_connections()

        async def worker() -> None:
            while pending and self._stop is None:
                unit = pending.popleft()
                await self.run_unit(unit, list(attempts.get(unit.key, ())))

        workers = [asyncio.ensure_future(worker()) for _ in range(min(self.max_samples, len(pending)))]
        self._tasks.update(workers)
        try:
            outcomes = await asyncio.gather(*workers, return_exceptions=True)
        except BaseException:  # this run was cancelled (Ctrl-C): its samples stop at a boundary
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            raise
        finally:
            self._tasks.difference_update(workers)
        for outcome in outcomes:  # a worker cancelled by stop() ends quietly; anything else is a bug to show
            if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError):
                raise outcome

    def stop(self, reason: str = "interrupted") -> None:
        """Stop taking new samples and cancel those in flight (each at its next boundary)."""
        self._stop = self._stop or reason
        for task in list(self._tasks):
            task.cancel()

    def _tripped(self) -> bool:
        limit = self.fail_on_error
        if limit is None or not self._failed:
            return False
        if isinstance(limit, int):
            return self._failed >= limit
        return self._failed / self._total_units >= limit

    def _size_model_connections(self) -> None:
        fit = getattr(self.model, "fit_connections", None)
        if callable(fit):
            fit(self.max_samples)

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    # ------------------------------------------------------------------ one unit

    def composition(self) -> Composition:
        """The composition every sample's session is made from (built once)."""
        if self._composition is None:
            options = {"lease_ttl": EVAL_LEASE_TTL, **self.engine_kwargs}
            self._composition = compose(agent=self.agent, store=self.checkpoint_store, model=self.model, **options)
        return self._composition

    async def run_unit(self, unit: Unit, prior: list[AttemptRecord]) -> None:
        """Run one sample x epoch to its result (retrying failed attempts), then score it."""
        progress = self.progress
        progress.running += 1
        try:
            attempt_no = len(prior)
            while True:
                sid = session_id_for(self.eval_id, unit.sample.sample_id, unit.epoch, attempt_no)
                result = await self.record(prior, await self.attempt(unit, attempt_no, sid))
                if result is not None:
                    break
                attempt_no += 1
        finally:
            progress.running -= 1
        await self.finish(unit, result)

    async def record(self, prior: list[AttemptRecord], outcome: AttemptRecord) -> ResultRecord | None:
        """Record an attempt; when it is the last (it worked, or no retry is left), the result too.

        ``prior`` (the unit's earlier attempts) gains a failed attempt that will be retried."""
        if self._plan is not None and self._plan.source is not None:
            found = await self._call(
                self.eval_store.divergence, outcome.eval_id, outcome.sample_id, outcome.epoch, outcome.attempt
            )
            if found is not None:
                outcome = replace(outcome, divergence=found.divergence)
        # a replay that stopped at its divergence would diverge the same way again: no retry
        stopped = outcome.divergence is not None and self.on_divergence == "stop"
        last = outcome.error is None or outcome.attempt >= self.retries or stopped
        result = _totals([*prior, outcome]) if last else None
        await self._call(self.eval_store.put_outcome, outcome, result)
        if not last:
            prior.append(outcome)
        return result

    async def finish(self, unit: Unit, result: ResultRecord) -> None:
        """Count a recorded result, stop the eval when too many failed, else score it."""
        progress = self.progress
        progress.done += 1
        progress.tokens += result.total_tokens
        progress.retried += result.attempts > 1
        progress.diverged += result.divergence is not None
        if result.error is not None:
            progress.failed += 1
            self._failed += 1
            if self._tripped():
                self.stop("failed")
            return
        await self._score(unit, result, self.scorers)

    async def attempt(self, unit: Unit, attempt_no: int, sid: str) -> AttemptRecord:
        """One attempt in session ``sid``: run it, continue it, or read it when it already finished."""
        store = self.checkpoint_store
        lost = 0
        while True:
            try:
                async with self._opening:
                    head = await store.aget_session_head(sid)
                    if head is not None and await self.finished(sid, head):
                        return await self.from_head(unit, attempt_no, sid, head, None)
                    session = await self._session(unit, attempt_no, sid, head)
                return await self._run(unit, attempt_no, session, fresh=head is None)
            except SessionBusyError:
                await asyncio.sleep(_BUSY_POLL)  # another runner has it: read it once it is done
            except LeaseLostError as exc:
                # This process stalled past the lease (an overloaded machine): its committed steps
                # stand and nothing uncommitted was written, so the session goes on from its head.
                lost += 1
                if lost > _LEASE_LOSSES:
                    return self._attempt_record(unit, attempt_no, sid, error=f"{type(exc).__name__}: {exc}", wall=0.0)

    async def finished(self, sid: str, head: SessionHeadRecord) -> bool:
        """Whether a session is done (a run cancelled midway is not: it goes on from its head)."""
        if head.lifecycle in _STILL_RUNNING:
            return False
        if head.lifecycle != SessionLifecycle.STOPPED.value:
            return True
        restored = await arestore(self.checkpoint_store, sid, head.snapshot_id)
        return restored.state_data.get("stop_reason") != "cancelled_immediate"  # cancelled: go on from its head

    async def _run_on_fleet(
        self, pending: deque[Unit], attempts: Mapping[tuple[str, int], list[AttemptRecord]]
    ) -> None:
        """Run ``pending`` on ``fleet``'s workers until each has its result (or the eval stops).

        Each sample x epoch's session is created in the fleet's database (the same derived id and
        metadata as a local run, plus the fleet's mark) and its first run enqueued with
        :meth:`qitos.distributed.Fleet.submit_many`; workers run it. This process polls the heads of
        the sessions it submitted, at most ``max_samples`` in flight, and when one settles records
        its attempt from the stored session and scores it, exactly as a local run would. A resumed
        eval reads finished sessions and re-enqueues the unfinished ones under their first run's
        workflow id (DBOS starts one run per id; a dead worker is replaced by the supervisor).
        """
        fleet: Fleet = self.fleet
        store = self.checkpoint_store
        in_flight: dict[str, tuple[Unit, int, list[AttemptRecord]]] = {}
        retry: deque[tuple[Unit, list[AttemptRecord]]] = deque()
        progress = self.progress
        while (pending or retry or in_flight) and self._stop is None:
            new: list[tuple[str, Unit, int]] = []
            while (retry or pending) and len(in_flight) < self.max_samples:
                unit, prior = retry.popleft() if retry else (pending[0], list(attempts.get(pending.popleft().key, ())))
                attempt_no = len(prior)
                sid = session_id_for(self.eval_id, unit.sample.sample_id, unit.epoch, attempt_no)
                in_flight[sid] = (unit, attempt_no, prior)
                head = await store.aget_session_head(sid)
                if head is None:
                    new.append((sid, unit, attempt_no))
                elif not await self.finished(sid, head):
                    await asyncio.to_thread(fleet.resume, sid)  # the same workflow id: started once
            if new:
                await asyncio.to_thread(
                    fleet.submit_many,
                    [unit.sample.task for _, unit, _ in new],
                    session_ids=[sid for sid, _, _ in new],
                    metadata=[self._session_metadata(unit, attempt_no) for _, unit, attempt_no in new],
                )
            progress.running = len(in_flight)
            settled = await asyncio.to_thread(store.get_session_positions, list(in_flight), lifecycles=SETTLED)
            for sid in [s for s in in_flight if s in settled]:
                head = await store.aget_session_head(sid)
                if head is None or not await self.finished(sid, head):
                    continue
                unit, attempt_no, prior = in_flight.pop(sid)
                outcome = await self.from_head(unit, attempt_no, sid, head, None)
                result = await self.record(prior, outcome)
                if result is None:
                    retry.append((unit, prior))
                    continue
                progress.running = len(in_flight)
                await self.finish(unit, result)
            if not settled:
                await asyncio.sleep(_FLEET_POLL)
        progress.running = 0

    def _session_metadata(self, unit: Unit, attempt_no: int) -> dict[str, Any]:
        """The metadata of the session running ``attempt_no`` of ``unit`` (under ``EVAL_METADATA``)."""
        return {
            EVAL_METADATA: {
                "eval_id": self.eval_id,
                "name": self.name,
                "sample_id": unit.sample.sample_id,
                "epoch": unit.epoch,
                "attempt": attempt_no,
            }
        }

    def _engine(self, unit: Unit, attempt_no: int, sid: str) -> Engine[Any, Any, Any]:
        """A fresh engine for one session; under replay or the cache its model answers through the plan."""
        engine = self.composition().engine()
        if self._plan is not None:
            key = UnitKey(self.eval_id, unit.sample.sample_id, unit.epoch, attempt_no)
            engine.model = self._plan.sample_model(engine.model, key, sid)
        return engine

    async def _session(self, unit: Unit, attempt_no: int, sid: str, head: SessionHeadRecord | None) -> Session:
        composition = self.composition()
        if head is not None:
            return await arestore_session(self._engine(unit, attempt_no, sid), sid, composition=composition)
        try:
            return await anew_session(
                self._engine(unit, attempt_no, sid),
                unit.sample.task,
                composition=composition,
                session_id=sid,
                metadata=self._session_metadata(unit, attempt_no),
            )
        except CheckpointError:
            if await self.checkpoint_store.aget_session_head(sid) is None:
                raise
            # another runner created it first
            return await arestore_session(self._engine(unit, attempt_no, sid), sid, composition=composition)

    async def _run(self, unit: Unit, attempt_no: int, session: Session, *, fresh: bool) -> AttemptRecord:
        started = time.perf_counter()
        sid = session.session_id.value
        try:
            if self.sample_timeout is None:
                result = await session.arun()
            else:
                result = await asyncio.wait_for(session.arun(), self.sample_timeout)
        except (SessionBusyError, LeaseLostError):
            raise
        except TimeoutError:
            head = await self.checkpoint_store.aget_session_head(sid)
            error = f"timed out after {self.sample_timeout:g} s (sample_timeout)"
            if head is None:
                return self._attempt_record(unit, attempt_no, sid, error=error, wall=time.perf_counter() - started)
            return await self.from_head(unit, attempt_no, sid, head, error)
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:  # the engine turns agent errors into a failed result; this is anything else
            return self._attempt_record(
                unit, attempt_no, sid, error=f"{type(exc).__name__}: {exc}", wall=time.perf_counter() - started
            )
        return self._from_result(
            unit,
            attempt_no,
            sid,
            result,
            fresh=fresh,
            wall=time.perf_counter() - started,
            tool_calls=None if fresh else await self._logged_calls(sid),
        )

    def _from_result(
        self,
        unit: Unit,
        attempt_no: int,
        sid: str,
        result: EngineResult[Any],
        *,
        fresh: bool,
        wall: float,
        tool_calls: list[dict[str, Any]] | None,
    ) -> AttemptRecord:
        state = result.state
        task_result = result.task_result
        input_tokens = output_tokens = 0
        for event in result.events:
            if event.event_type == EngineEventType.MODEL_RESPONSE and event.ok:
                usage = event.payload.get("usage") or {}
                input_tokens += int(usage.get("input_tokens") or 0)
                output_tokens += int(usage.get("output_tokens") or 0)
        total = int((task_result.token_usage.get("total_tokens") if task_result else 0) or 0)
        error = None
        if task_result is not None and task_result.status == "failed":
            error = task_result.error or f"the run failed ({task_result.stop_reason})"
        elif str(state.stop_reason or "") in ("paused", "awaiting_approval"):
            error = f"the session stopped {state.stop_reason}: an eval does not answer pauses or approvals"
        if tool_calls is None or not tool_calls:
            tool_calls = [
                {"name": action.name, "arguments": dict(action.args)}
                for record in result.records
                for action in (record.decision.actions or ())
            ] or (tool_calls or [])
        return self._attempt_record(
            unit,
            attempt_no,
            sid,
            error=error,
            answer=state.final_result,
            stop_reason=_text(state.stop_reason),
            steps=int(state.current_step),
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            total_tokens=max(total, input_tokens + output_tokens),
            wall=task_result.elapsed_seconds if task_result is not None and task_result.elapsed_seconds else wall,
            tool_calls=tool_calls,
        )

    async def from_head(
        self, unit: Unit, attempt_no: int, sid: str, head: SessionHeadRecord, error: str | None
    ) -> AttemptRecord:
        """The attempt a stored session records (its final state, tokens, time and tool calls)."""
        restored = await arestore(self.checkpoint_store, sid, head.snapshot_id)
        data = restored.state_data
        used = restored.budget_used
        if error is None and head.lifecycle == SessionLifecycle.FAILED.value:
            error = f"the run failed ({data.get('stop_reason')})"
        elif error is None and head.lifecycle in (
            SessionLifecycle.PAUSED.value,
            SessionLifecycle.AWAITING_APPROVAL.value,
        ):
            error = f"the session stopped {head.lifecycle}: an eval does not answer pauses or approvals"
        return self._attempt_record(
            unit,
            attempt_no,
            sid,
            error=error,
            answer=data.get("final_result"),
            stop_reason=_text(data.get("stop_reason")),
            steps=int(data.get("current_step") or 0),
            total_tokens=int(used.get("tokens") or 0),
            wall=float(used.get("elapsed_seconds") or 0.0),
            tool_calls=_calls_in(restored.log),
        )

    async def _logged_calls(self, sid: str) -> list[dict[str, Any]]:
        head = await self.checkpoint_store.aget_session_head(sid)
        if head is None:
            return []
        return _calls_in((await arestore(self.checkpoint_store, sid, head.snapshot_id)).log)

    def _attempt_record(
        self, unit: Unit, attempt_no: int, sid: str, *, error: str | None, wall: float, **fields: Any
    ) -> AttemptRecord:
        return AttemptRecord(
            eval_id=self.eval_id,
            sample_id=unit.sample.sample_id,
            epoch=unit.epoch,
            attempt=attempt_no,
            session_id=sid,
            error=error,
            wall_seconds=round(float(wall), 6),
            **fields,
        )

    # ------------------------------------------------------------------ scoring

    async def _score(self, unit: Unit, result: ResultRecord, scorers: Sequence[Scorer]) -> None:
        if self._plan is not None:  # judges answer through the plan too
            judged, judges = self._plan.judges(scorers, unit.sample.sample_id, unit.epoch)
            records = self._plan.mark_judged(await score_result(self.eval_id, unit.sample, result, judged), judges)
        else:
            records = await score_result(self.eval_id, unit.sample, result, scorers)
        await self._call(self.eval_store.put_scores, records)
        progress = self.progress
        for record in records:
            if record.scorer_id == progress.scorer_id and record.error is None:
                scorer = next(s for s in scorers if s.scorer_id == record.scorer_id)
                # a value the scorer cannot turn into a number is a scoring error at report time
                with contextlib.suppress(Exception):
                    progress.score_sum += scorer.to_number(record.value)
                    progress.scored += 1


async def score_result(
    eval_id: str, sample: Sample, result: ResultRecord, scorers: Sequence[Scorer]
) -> list[ScoreRecord]:
    """Each scorer's ScoreRecord for one result: the score, or the error the scorer raised."""
    view = SampleResult(
        sample_id=result.sample_id,
        epoch=result.epoch,
        session_id=result.session_id,
        answer=result.answer,
        stop_reason=result.stop_reason,
        steps=result.steps,
        tool_calls=tuple(result.tool_calls),
        error=result.error,
    )
    records = []
    for scorer in scorers:
        key = ScoreRecord(
            eval_id=eval_id,
            sample_id=result.sample_id,
            epoch=result.epoch,
            scorer_id=scorer.scorer_id,
            scorer_version=scorer.version,
            value=None,
        )
        try:
            score = await scorer.ascore(sample, view)
            canonical_json(dict(score.metadata))  # stored as JSON: anything else is this scorer's error
            record = replace(
                key,
                value=score.value,
                answer=score.answer,
                explanation=score.explanation,
                metadata=dict(score.metadata),
            )
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:
            record = replace(key, error=f"{type(exc).__name__}: {exc}")
        records.append(record)
    return records


def pin_changes(stored: Mapping[str, Any], current: Mapping[str, Any], prefix: str = "") -> list[str]:
    """What differs between an eval's pins and a new run's, one phrase each (``model.base_url (a -> b)``)."""
    changed = []
    for key in sorted(set(stored) | set(current)):
        before, after = stored.get(key), current.get(key)
        if canonical_json(before) == canonical_json(after):
            continue
        where = f"{prefix}{key}"
        if key == "dataset" and not prefix and isinstance(before, Mapping) and isinstance(after, Mapping):
            changed.append(
                f"dataset (digest {str(before.get('digest'))[:12]} with {before.get('samples')} samples -> "
                f"{str(after.get('digest'))[:12]} with {after.get('samples')} samples)"
            )
        elif key == "scorers" and not prefix:
            names_before, names_after = _scorer_names(before), _scorer_names(after)
            if names_before != names_after:
                changed.append(f"scorers ({names_before} -> {names_after})")
            else:  # the same scorers with other parameters: name each
                for old, new in zip(list(before or ()), list(after or ()), strict=True):
                    changed.extend(pin_changes(old, new, f"scorers[{new.get('id')}]."))
        elif isinstance(before, Mapping) and isinstance(after, Mapping):
            changed.extend(pin_changes(before, after, f"{where}."))
        else:
            changed.append(f"{where} ({_short(before)} -> {_short(after)})")
    return changed


def _scorer_names(value: object) -> str:
    if not isinstance(value, list):
        return repr(value)
    return ", ".join(f"{s.get('id')}@{s.get('version')}/{s.get('reducer')}" for s in value if isinstance(s, Mapping))


def _short(value: object) -> str:
    text = canonical_json(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _totals(attempts: Sequence[AttemptRecord]) -> ResultRecord:
    last = attempts[-1]
    return ResultRecord(
        eval_id=last.eval_id,
        sample_id=last.sample_id,
        epoch=last.epoch,
        session_id=last.session_id,
        error=last.error,
        answer=last.answer,
        stop_reason=last.stop_reason,
        steps=last.steps,
        input_tokens=sum(a.input_tokens for a in attempts),
        output_tokens=sum(a.output_tokens for a in attempts),
        total_tokens=sum(a.total_tokens for a in attempts),
        wall_seconds=round(sum(a.wall_seconds for a in attempts), 6),
        attempts=len(attempts),
        tool_calls=list(last.tool_calls),
        divergence=last.divergence,
    )


def _calls_in(log: Any) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    for exchange in log.exchanges:
        output = exchange.output
        if output is not None:
            calls.extend({"name": c.name, "arguments": dict(c.arguments)} for c in output.tool_calls)
    return calls


def _text(value: object) -> str | None:
    if value is None:
        return None
    return str(getattr(value, "value", value))


def _fleet_store(fleet: Any, store: Any) -> Any:
    """The store of an eval on the fleet: the fleet's database (``store`` may name it, or be left out)."""
    db = getattr(fleet, "db", None)
    if not isinstance(db, str):
        raise ConfigurationError(f"fleet= takes a qitos.distributed.Fleet, got {type(fleet).__name__}")
    if store not in (DEFAULT_STORE, db):
        raise ConfigurationError(
            "an eval on the fleet keeps its results in the fleet's database: leave store= out or pass fleet.db"
        )
    return fleet.store


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name} must be an int >= {minimum}, got {value!r}")


def _check_scorers(scorers: Scorer | Sequence[Scorer]) -> list[Scorer]:
    items = [scorers] if isinstance(scorers, Scorer) else list(scorers)
    if not items:
        raise ScorerError("scorers= needs at least one scorer")
    seen: set[str] = set()
    for scorer in items:
        if not isinstance(scorer, Scorer):
            raise ScorerError(f"scorers are made by qitos.eval.scorers (exact(), code(fn)...), got {scorer!r}")
        if scorer.scorer_id in seen:
            raise ScorerError(f"two scorers have the id {scorer.scorer_id!r}: give one a name=")
        seen.add(scorer.scorer_id)
    return items
