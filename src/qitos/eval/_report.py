"""``EvalReport``: an eval's results and statistics, computed from its rows in the store."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from qitos.eval._stats import bootstrap_ci, mean, reduce_epochs, stderr
from qitos.eval._store import EvalRecord, EvalStore, ResultRecord, ScoreRecord, ScorerRecord
from qitos.eval.scorers import Scorer, ScoringError

__all__ = ["EvalReport", "SampleReport", "build_report"]


@dataclass(frozen=True, kw_only=True)
class SampleReport:
    """One sample x epoch: its session, answer, scores, use of tokens and time, error, attempts.

    ``scores`` maps a scorer id to ``{"value", "answer", "explanation", "error"}``; ``divergence``
    is filled by replay evaluations (None otherwise).
    """

    id: str
    epoch: int
    session_id: str
    scores: Mapping[str, Mapping[str, Any]]
    answer: Any
    stop_reason: str | None
    steps: int
    input_tokens: int
    output_tokens: int
    total_tokens: int
    wall_seconds: float
    error: str | None
    attempts: int
    metadata: Mapping[str, Any] = field(default_factory=dict)
    divergence: Mapping[str, Any] | None = None

    @property
    def retried(self) -> bool:
        """Whether it took more than one attempt."""
        return self.attempts > 1


@dataclass(frozen=True, kw_only=True)
class EvalReport:
    """An eval's outcome: status, per-scorer metrics, per-sample results, totals.

    ``metrics[scorer_id]`` has ``mean``, ``stderr``, ``ci95`` (a pair, bootstrap), ``n`` (samples
    scored, after reducing epochs with the scorer's ``reducer``), ``errors`` (scoring errors) and
    ``reducer``. ``groups`` has the same metrics per value of the ``group_by`` metadata field.
    """

    eval_id: str
    name: str
    status: str
    metrics: Mapping[str, Mapping[str, Any]]
    samples: Sequence[SampleReport]
    pins: Mapping[str, Any]
    total_samples: int
    epochs: int
    completed: int
    failed: int
    retried: int
    input_tokens: int
    output_tokens: int
    total_tokens: int
    wall_seconds: float
    group_by: str | None = None
    groups: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (what ``qitos eval show --json`` prints)."""
        data = asdict(self)
        for metrics in [data["metrics"], *data["groups"].values()]:
            for entry in metrics.values():
                if entry.get("ci95") is not None:
                    entry["ci95"] = list(entry["ci95"])
        return data


def build_report(
    store: EvalStore,
    record: EvalRecord,
    *,
    scorers: Mapping[str, Scorer] | None = None,
    group_by: str | None = None,
    status: str | None = None,
) -> EvalReport:
    """The report of ``record`` from its rows; ``scorers`` turn score values into numbers (default:
    the generic rule of :meth:`Scorer.to_number`, with the recorded grades of a model judge)."""
    eval_id = record.eval_id
    samples = store.samples(eval_id)
    metadata = {str(s["id"]): s.get("metadata") or {} for s in samples}
    order = {str(s["id"]): i for i, s in enumerate(samples)}
    results = store.results(eval_id)
    scorer_rows = store.scorers(eval_id)
    by_unit: dict[tuple[str, int], dict[str, ScoreRecord]] = defaultdict(dict)
    for score in store.scores(eval_id):
        by_unit[(score.sample_id, score.epoch)][score.scorer_id] = score
    numbers = _numbers(scorer_rows, scorers or {})
    reports = [
        _sample_report(result, by_unit.get((result.sample_id, result.epoch), {}), metadata.get(result.sample_id, {}))
        for result in sorted(results, key=lambda r: (order.get(r.sample_id, 0), r.epoch))
    ]
    metrics = _metrics(reports, scorer_rows, numbers)
    groups: dict[str, dict[str, dict[str, Any]]] = {}
    if group_by:
        keyed: dict[str, list[SampleReport]] = defaultdict(list)
        for report in reports:
            keyed[str(report.metadata.get(group_by))].append(report)
        groups = {key: _metrics(keyed[key], scorer_rows, numbers) for key in sorted(keyed)}
    pins = record.pins
    epochs = int(pins.get("epochs", 1))
    return EvalReport(
        eval_id=eval_id,
        name=record.name,
        status=status or record.status,
        metrics=metrics,
        samples=reports,
        pins=pins,
        total_samples=len(samples),
        epochs=epochs,
        completed=sum(1 for r in reports if r.error is None),
        failed=sum(1 for r in reports if r.error is not None),
        retried=sum(1 for r in reports if r.retried),
        input_tokens=sum(r.input_tokens for r in reports),
        output_tokens=sum(r.output_tokens for r in reports),
        total_tokens=sum(r.total_tokens for r in reports),
        wall_seconds=round(sum(r.wall_seconds for r in reports), 6),
        group_by=group_by,
        groups=groups,
    )


def _numbers(rows: Sequence[ScorerRecord], given: Mapping[str, Scorer]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for row in rows:
        scorer = given.get(row.scorer_id)
        if scorer is not None:
            out[row.scorer_id] = scorer.to_number
            continue
        grades = row.spec.get("grades") if isinstance(row.spec.get("grades"), Mapping) else None
        out[row.scorer_id] = _generic(grades)
    return out


def _generic(grades: Mapping[str, float] | None) -> Any:
    def to_number(value: object) -> float:
        if isinstance(value, bool):
            return 1.0 if value else 0.0
        if isinstance(value, int | float):
            return float(value)
        table = {k.upper(): float(v) for k, v in grades.items()} if grades else {"C": 1.0, "P": 0.5, "I": 0.0}
        if isinstance(value, str) and value.upper() in table:
            return table[value.upper()]
        raise ScoringError(f"{value!r} has no numeric value")

    return to_number


def _sample_report(
    result: ResultRecord, scores: Mapping[str, ScoreRecord], metadata: Mapping[str, object]
) -> SampleReport:
    return SampleReport(
        id=result.sample_id,
        epoch=result.epoch,
        session_id=result.session_id,
        scores={
            sid: {"value": s.value, "answer": s.answer, "explanation": s.explanation, "error": s.error}
            for sid, s in sorted(scores.items())
        },
        answer=result.answer,
        stop_reason=result.stop_reason,
        steps=result.steps,
        input_tokens=result.input_tokens,
        output_tokens=result.output_tokens,
        total_tokens=result.total_tokens,
        wall_seconds=result.wall_seconds,
        error=result.error,
        attempts=result.attempts,
        metadata=metadata,
        divergence=result.divergence,
    )


def _metrics(
    reports: Sequence[SampleReport], scorers: Sequence[ScorerRecord], numbers: Mapping[str, Any]
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for scorer in scorers:
        to_number = numbers[scorer.scorer_id]
        per_sample: dict[str, tuple[list[Any], list[float]]] = defaultdict(lambda: ([], []))
        errors = 0
        for report in reports:
            entry = report.scores.get(scorer.scorer_id)
            if entry is None:
                continue
            if entry.get("error") is not None:
                errors += 1
                continue
            try:
                number = to_number(entry["value"])
            except ScoringError:
                errors += 1
                continue
            values, nums = per_sample[report.id]
            values.append(entry["value"])
            nums.append(number)
        reduced = [reduce_epochs(values, nums, scorer.reducer)[1] for values, nums in per_sample.values()]
        out[scorer.scorer_id] = {
            "mean": mean(reduced),
            "stderr": stderr(reduced),
            "ci95": bootstrap_ci(reduced),
            "n": len(reduced),
            "errors": errors,
            "reducer": scorer.reducer,
            "version": scorer.version,
        }
    return out
