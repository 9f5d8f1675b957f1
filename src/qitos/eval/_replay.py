"""Replay evaluation and the response cache: answering a sample's model requests without a model.

Under ``evaluate(..., replay=EVAL)`` every sample x epoch's session talks to a :class:`SampleModel`
that answers each model request with the reply recorded, for the same sample and epoch, in the
session of the earlier eval (``qitos.eval._recording`` reads it), as long as the request's digest
(``qitos.models._base.request_digest``: messages and tools) is the recorded one. The first request
that differs is a **divergence**: it is recorded in the eval tables (step, model call, both digests
and a short diff of what changed) before anything else happens, then ``on_divergence`` decides:

- ``"stop"``: the request raises :class:`~qitos.models._scripted.ReplayDivergenceError`; the sample
  fails as diverged (and is not retried: a replay diverges the same way every time);
- ``"live"``: this request and every later one go to the live model;
- ``"mark"``: the recorded replies go on answering, in order, and the sample is flagged.

A resumed session continues where it stood: the replies it already got are counted from its own
recording, and a divergence recorded earlier still holds.

With ``cache=True`` every request that would reach the live model is first looked up in the
store's response cache by :func:`cache_key` (the model's description, the request's parameters, its
messages and tools); a hit costs no call, and a miss is cached once the model answered. Replies
that came from the recording or the cache carry ``served_from`` (``"replay"``, ``"cache"``) in the
session's request record.

A model-graded scorer's judge is wrapped the same way (:meth:`ReplayPlan.judge_model`): its
recording is the earlier eval's score of the same sample, epoch and scorer.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from qitos.checkpoint._records import utc_now
from qitos.checkpoint.store import CheckpointStore
from qitos.core._codec import canonical_json, sha256_hex
from qitos.core._errors import ConfigurationError, IntegrityError, UsageError
from qitos.core._redaction import model_credentials
from qitos.eval._recording import RecordedCall, recorded_calls, recorded_request, request_diff, request_parameters
from qitos.eval._store import CachedReply, DivergenceRecord, EvalStore, ScoreRecord
from qitos.eval.scorers import Scorer, _ModelGraded
from qitos.models._base import DeltaCallback, EventListener, ModelAdapter, ModelResponse, request_digest
from qitos.models._doubles import stream_text
from qitos.models._scripted import ReplayDivergenceError
from qitos.sessions._payload import SnapshotPayload

if TYPE_CHECKING:
    from qitos.core.request_view import RequestView

__all__ = ["ON_DIVERGENCE", "ReplayPlan", "ReplaySourceError", "SampleModel", "cache_key"]

ON_DIVERGENCE = ("stop", "live", "mark")
_ACTIONS = {"stop": "stopped", "live": "continued against the live model", "mark": "answered from the recording"}
_MISSING_SHOWN = 5


class ReplaySourceError(UsageError):
    """An eval cannot be replayed from the one named: it does not exist, or lacks samples or epochs."""


def cache_key(model: Mapping[str, object] | None, view: RequestView) -> str:
    """The response cache's key of a request: a digest of the model's description, the request's
    parameters (tool choice, reasoning, protocol) and its messages and tools."""
    return sha256_hex(
        canonical_json({"model": model, "parameters": request_parameters(view), "request": request_digest(view)})
    )


@dataclass(frozen=True)
class UnitKey:
    """The sample x epoch and attempt a model serves (what a divergence is recorded under)."""

    eval_id: str
    sample_id: str
    epoch: int
    attempt: int


class SampleModel(ModelAdapter):
    """The model of one session under replay and/or the response cache (see the module docstring).

    ``live`` answers what neither the recording nor the cache does (None: nothing may reach a
    model); ``recording`` reads the recorded calls (None: no replay); ``replayed`` reads how many
    recorded replies this session already got (a resumed session); ``divergence`` holds one found
    earlier; ``on_diverged`` records a new one.
    """

    def __init__(
        self,
        live: ModelAdapter | None,
        *,
        eval_store: EvalStore,
        recording: Callable[[], Sequence[RecordedCall]] | None = None,
        replayed: Callable[[], int] | None = None,
        divergence: Callable[[], Mapping[str, object] | None] | None = None,
        on_diverged: Callable[[RequestView, int, RecordedCall | None, Sequence[RecordedCall]], dict[str, Any]]
        | None = None,
        on_divergence: str = "stop",
        cache: bool = False,
    ) -> None:
        if on_divergence not in ON_DIVERGENCE:
            raise ConfigurationError(f"on_divergence must be one of {', '.join(ON_DIVERGENCE)}, got {on_divergence!r}")
        self.live = live
        self.model_id = live.model_id if live is not None else "replay"
        self.max_input_units = live.max_input_units if live is not None else None
        self.unit = live.unit if live is not None else "characters"
        self.provider = live.provider if live is not None else "replay"
        self.transport = live.transport if live is not None else "in-process"
        self.eval_store = eval_store
        self.on_divergence = on_divergence
        self.cache = cache and live is not None
        self._recording = recording
        self._replayed = replayed
        self._stored_divergence = divergence
        self._on_diverged = on_diverged
        self._describe = live.describe() if live is not None else None
        self._lock = threading.Lock()
        self._calls: Sequence[RecordedCall] | None = None
        self._next = 0
        self._ready = False
        self.divergence: Mapping[str, Any] | None = None
        """The divergence of this session from its recording (None while it follows it)."""
        self.counts = {"replay": 0, "cache": 0, "live": 0}
        """How the requests of this process were answered."""

    # ---- the adapter

    def complete(self, view: RequestView, *, on_delta: DeltaCallback | None = None) -> ModelResponse:
        """A recorded or cached reply, else the live model's (cached when caching)."""
        answer = self._answer(view)
        if answer is not None:
            stream_text(answer, on_delta)
            return answer
        response = self._require_live().complete(view, on_delta=on_delta)
        self._remember(view, response)
        return response

    async def acomplete(self, view: RequestView, *, on_delta: DeltaCallback | None = None) -> ModelResponse:
        """Async twin of :meth:`complete` (the store is read in a worker thread)."""
        answer = await asyncio.to_thread(self._answer, view)
        if answer is not None:
            stream_text(answer, on_delta)
            return answer
        response = await self._require_live().acomplete(view, on_delta=on_delta)
        if self.cache:
            await asyncio.to_thread(self._remember, view, response)
        else:
            self._remember(view, response)
        return response

    def subscribe(self, listener: EventListener) -> Callable[[], None]:
        """Listen to this adapter's events and the live model's (its retries)."""
        own = super().subscribe(listener)
        inner = self.live.subscribe(listener) if self.live is not None else None

        def unsubscribe() -> None:
            own()
            if inner is not None:
                inner()

        return unsubscribe

    def secrets(self) -> list[str]:
        """The live model's credentials (what a session redacts)."""
        return list(model_credentials(self.live)) if self.live is not None else []

    def describe(self) -> dict[str, Any]:
        """The live model's description (this adapter only routes its requests)."""
        return dict(self._describe) if self._describe is not None else super().describe()

    # ---- routing

    def _prepare(self) -> None:
        if self._ready:
            return
        if self._recording is not None:
            self._calls = list(self._recording())
            self._next = self._replayed() if self._replayed is not None else 0
            self.divergence = self._stored_divergence() if self._stored_divergence is not None else None
        self._ready = True

    def _answer(self, view: RequestView) -> ModelResponse | None:
        """The reply from the recording or the cache, or None: ask the live model."""
        with self._lock:
            self._prepare()
            calls = self._calls
            if calls is not None:
                index = self._next
                recorded = calls[index] if index < len(calls) else None
                if self.divergence is None:
                    digest = request_digest(view)
                    if recorded is not None and recorded.request_digest == digest:
                        return self._served(recorded.response, "replay")
                    if self._on_diverged is None:
                        raise ConfigurationError("a replaying model needs on_diverged")
                    self.divergence = self._on_diverged(view, index, recorded, calls)
                if self.on_divergence == "stop" or (self.on_divergence == "mark" and recorded is None):
                    raise _diverged(self.divergence, index, len(calls))
                if self.on_divergence == "mark" and recorded is not None:
                    return self._served(recorded.response, "replay")
            if self.cache:
                hit = self.eval_store.cached_reply(cache_key(self._describe, view))
                if hit is not None:
                    try:
                        response = ModelResponse.from_dict(hit.response)
                    except (KeyError, TypeError, ValueError) as exc:
                        raise IntegrityError("qitos_eval_cache", hit.cache_key, f"unreadable reply ({exc})") from exc
                    return self._served(response, "cache")
            return None

    def _served(self, response: ModelResponse, source: str) -> ModelResponse:
        self._next += 1
        self.counts[source] += 1
        return replace(response, served_from=source)

    def _require_live(self) -> ModelAdapter:
        if self.live is None:
            raise ConfigurationError(
                "this request has no recorded or cached reply and no live model was given to answer it "
                "(give the eval a model=, or --model)"
            )
        return self.live

    def _remember(self, view: RequestView, response: ModelResponse) -> None:
        with self._lock:
            self._next += 1
            self.counts["live"] += 1
        if self.cache:
            self.eval_store.put_cached_reply(
                CachedReply(
                    cache_key=cache_key(self._describe, view),
                    model=self._describe or {},
                    request_digest=request_digest(view),
                    response=response.to_dict(),
                    created_at=utc_now(),
                )
            )


def _diverged(divergence: Mapping[str, Any] | None, index: int, recorded: int) -> ReplayDivergenceError:
    info = dict(divergence or {})
    step = info.get("step")
    parts = ", ".join(sorted(info.get("diff") or {})) or "the request"
    message = (
        f"replay diverged at step {step} (model call #{index + 1}): {parts} changed"
        if index < recorded
        else f"replay diverged at step {step}: model call #{index + 1} but the recording has {recorded}"
    )
    return ReplayDivergenceError(
        message,
        step=step if isinstance(step, int) else None,
        index=index,
        expected=info.get("recorded_digest"),
        actual=info.get("request_digest"),
    )


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class ReplaySource:
    """The eval replayed from: its id and name, and where each sample x epoch's recording is."""

    eval_id: str
    name: str
    sessions: Mapping[tuple[str, int], str]
    judges: Mapping[tuple[str, int, str], Mapping[str, Any]]


class ReplayPlan:
    """How one eval run answers model requests: replay from ``source`` and/or the response cache."""

    def __init__(
        self,
        checkpoint_store: CheckpointStore,
        eval_store: EvalStore,
        *,
        source: ReplaySource | None,
        on_divergence: str,
        cache: bool,
    ) -> None:
        if on_divergence not in ON_DIVERGENCE:
            raise ConfigurationError(f"on_divergence must be one of {', '.join(ON_DIVERGENCE)}, got {on_divergence!r}")
        self.checkpoint_store = checkpoint_store
        self.eval_store = eval_store
        self.source = source
        self.on_divergence = on_divergence
        self.cache = cache

    @classmethod
    def load(
        cls,
        checkpoint_store: CheckpointStore,
        eval_store: EvalStore,
        *,
        replay: str | None,
        samples: Sequence[Any],
        epochs: int,
        on_divergence: str,
        cache: bool,
    ) -> ReplayPlan:
        """The plan for an eval of ``samples`` x ``epochs``; ReplaySourceError when ``replay``
        names no eval of the store, or one without a recorded result for every sample x epoch."""
        source = None if replay is None else load_source(eval_store, replay, samples, epochs)
        return cls(checkpoint_store, eval_store, source=source, on_divergence=on_divergence, cache=cache)

    def sample_model(self, live: ModelAdapter | None, key: UnitKey, session_id: str) -> SampleModel:
        """The model of the session ``session_id`` running ``key``'s attempt."""
        store = self.checkpoint_store
        source_session = None if self.source is None else self.source.sessions[(key.sample_id, key.epoch)]

        def replayed() -> int:
            if store.get_session_head(session_id) is None:
                return 0
            return len(recorded_calls(store, session_id))

        def stored() -> Mapping[str, Any] | None:
            record = self.eval_store.divergence(key.eval_id, key.sample_id, key.epoch, key.attempt)
            return None if record is None else record.divergence

        def on_diverged(
            view: RequestView, index: int, recorded: RecordedCall | None, calls: Sequence[RecordedCall]
        ) -> dict[str, Any]:
            assert source_session is not None
            divergence = self._divergence(view, index, recorded, calls, source_session, session_id)
            self.eval_store.put_divergence(
                DivergenceRecord(
                    eval_id=key.eval_id,
                    sample_id=key.sample_id,
                    epoch=key.epoch,
                    attempt=key.attempt,
                    divergence=divergence,
                )
            )
            return dict(stored() or divergence)  # another runner's record stands

        return SampleModel(
            live,
            eval_store=self.eval_store,
            recording=None if source_session is None else (lambda: recorded_calls(store, source_session)),
            replayed=replayed,
            divergence=stored,
            on_diverged=on_diverged,
            on_divergence=self.on_divergence,
            cache=self.cache,
        )

    def judge_model(self, live: ModelAdapter, sample_id: str, epoch: int, scorer_id: str) -> SampleModel:
        """The judge of a model-graded scorer for one sample x epoch (its recording: the source
        eval's score of it, when there is one with a judge record)."""
        record = None if self.source is None else self.source.judges.get((sample_id, epoch, scorer_id))
        calls: list[RecordedCall] | None = None
        if self.source is not None:
            calls = []
            if record is not None:
                try:
                    calls.append(
                        RecordedCall(
                            step=0,
                            request_digest=str(record["request_digest"]),
                            response=ModelResponse.from_dict(record["response"]),
                        )
                    )
                except (KeyError, TypeError, ValueError) as exc:
                    raise IntegrityError(
                        "qitos_eval_scores",
                        f"{self.source.eval_id}/{sample_id}/{epoch}/{scorer_id}",
                        f"the judge record is unreadable ({exc})",
                    ) from exc

        def on_diverged(
            view: RequestView, index: int, recorded: RecordedCall | None, calls: Sequence[RecordedCall]
        ) -> dict[str, Any]:
            return {
                "step": None,
                "call": index + 1,
                "recorded_digest": None if recorded is None else recorded.request_digest,
                "request_digest": request_digest(view),
                "diff": {"judge": "the judge's request differs from the recorded one" if recorded else "no recording"},
                "action": _ACTIONS[self.on_divergence],
            }

        return SampleModel(
            live,
            eval_store=self.eval_store,
            recording=None if calls is None else (lambda: calls or []),
            on_diverged=on_diverged,
            on_divergence=self.on_divergence,
            cache=self.cache,
        )

    def judges(
        self, scorers: Sequence[Scorer], sample_id: str, epoch: int
    ) -> tuple[list[Scorer], dict[str, SampleModel]]:
        """``scorers`` with each model-graded one asking its judge through this plan, and those judges."""
        out: list[Scorer] = []
        judges: dict[str, SampleModel] = {}
        for scorer in scorers:
            if isinstance(scorer, _ModelGraded):
                judge = judges[scorer.scorer_id] = self.judge_model(scorer.model, sample_id, epoch, scorer.scorer_id)
                scorer = scorer.with_judge(judge)
            out.append(scorer)
        return out, judges

    @staticmethod
    def mark_judged(records: Sequence[ScoreRecord], judges: Mapping[str, SampleModel]) -> list[ScoreRecord]:
        """Scores with the judge's divergence, if it had one, in ``metadata["judge"]["divergence"]``."""
        out = []
        for record in records:
            judge = judges.get(record.scorer_id)
            if judge is not None and judge.divergence is not None:
                entry = dict(record.metadata.get("judge") or {})
                entry["divergence"] = dict(judge.divergence)
                record = replace(record, metadata={**record.metadata, "judge": entry})
            out.append(record)
        return out

    def _divergence(
        self,
        view: RequestView,
        index: int,
        recorded: RecordedCall | None,
        calls: Sequence[RecordedCall],
        source_session: str,
        session_id: str,
    ) -> dict[str, Any]:
        store = self.checkpoint_store
        step = _current_step(store, session_id)
        if recorded is None:
            diff: dict[str, Any] = {
                "calls": f"the recording has {len(calls)} model calls; this run asks for call #{index + 1}"
            }
        else:
            diff = request_diff(recorded_request(store, source_session, recorded.step), view)
        return {
            "step": step if step is not None else (recorded.step if recorded is not None else None),
            "call": index + 1,
            "recorded_step": None if recorded is None else recorded.step,
            "recorded_digest": None if recorded is None else recorded.request_digest,
            "request_digest": request_digest(view),
            "diff": diff,
            "action": _ACTIONS[self.on_divergence],
            "source_session": source_session,
        }


def _current_step(store: CheckpointStore, session_id: str) -> int | None:
    """The step a running session is deciding: its head's step id (its last commit closed the one before)."""
    head = store.get_session_head(session_id)
    if head is None:
        return None
    return SnapshotPayload.of(store.get_snapshot(head.snapshot_id)).step_id


def load_source(eval_store: EvalStore, ref: str, samples: Sequence[Any], epochs: int) -> ReplaySource:
    """The eval ``ref`` as a replay source for ``samples`` x ``epochs`` (see :meth:`ReplayPlan.load`)."""
    record = eval_store.find_eval(ref)
    if record is None:
        known = ", ".join(r.name for r in eval_store.list_evals()[-5:]) or "none"
        raise ReplaySourceError(
            f"cannot replay from eval {ref!r}: there is no such eval in this store (evals: {known})"
        )
    stored = {str(s.get("id")): s for s in eval_store.samples(record.eval_id)}
    missing = [s.sample_id for s in samples if s.sample_id not in stored]
    if missing:
        raise ReplaySourceError(
            f"cannot replay from eval {record.name!r}: it has no sample {_listed(missing)} "
            f"({len(missing)} of this eval's {len(samples)} samples); replay needs the same samples"
        )
    other = [
        s.sample_id
        for s in samples
        if canonical_json(stored[s.sample_id].get("input")) != canonical_json(s.input_json())
    ]
    if other:
        raise ReplaySourceError(
            f"cannot replay from eval {record.name!r}: sample {_listed(other)} has another input there; "
            "replay needs the same samples"
        )
    results = {(r.sample_id, r.epoch): r.session_id for r in eval_store.results(record.eval_id)}
    units = [(s.sample_id, e) for s in samples for e in range(1, epochs + 1)]
    absent = [f"{sid!r} (epoch {e})" for sid, e in units if (sid, e) not in results]
    if absent:
        raise ReplaySourceError(
            f"cannot replay from eval {record.name!r}: it recorded no result for {_listed(absent, quote=False)} "
            f"({len(absent)} sample x epoch); finish it first (qitos eval resume) or replay fewer epochs"
        )
    judges: dict[tuple[str, int, str], Mapping[str, Any]] = {}
    for score in eval_store.scores(record.eval_id):
        judge = (score.metadata or {}).get("judge")
        if isinstance(judge, Mapping):
            judges[(score.sample_id, score.epoch, score.scorer_id)] = judge
    return ReplaySource(eval_id=record.eval_id, name=record.name, sessions=results, judges=judges)


def _listed(items: Sequence[str], *, quote: bool = True) -> str:
    shown = ", ".join(repr(i) if quote else i for i in items[:_MISSING_SHOWN])
    return shown + (f" and {len(items) - _MISSING_SHOWN} more" if len(items) > _MISSING_SHOWN else "")
