"""Comparing two evals of the same samples: paired statistics, flips, what changed in cost.

:func:`compare` pairs the samples two evals share (by sample id), reduces each sample's epochs with
each scorer's reducer, and reports per scorer the paired difference of means (second minus first)
with a paired-bootstrap 95% interval (resampling the pairs, ``qitos.eval._stats.bootstrap_ci`` over
the differences), McNemar's exact test when both evals scored every sample pass/fail, the samples
that flipped (pass to fail, fail to pass) with the sessions of both sides, and per eval the samples
whose outcome differs between its epochs (unstable). Tokens and wall time are compared in total and
per paired sample. Samples only one eval has are listed, never silently dropped; evals of different
datasets (by digest) are refused unless ``allow_different_datasets``, and then only shared samples
are paired.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from qitos.checkpoint.store import CheckpointStore
from qitos.core._errors import UsageError
from qitos.eval._report import EvalReport, SampleReport, build_report
from qitos.eval._stats import bootstrap_ci, mcnemar_exact, mean, reduce_epochs, stderr
from qitos.eval._store import EvalStore, open_eval_store
from qitos.eval.scorers import ScoringError

__all__ = ["CompareError", "Comparison", "compare"]


class CompareError(UsageError):
    """Two evals cannot be compared as asked: one is missing, or their datasets differ."""


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """Eval ``b`` against eval ``a`` (differences are ``b - a``).

    ``a``/``b``: each eval's id, name, dataset (name, digest, samples), epochs, status, tokens and
    wall seconds. ``paired``: the sample ids both have; ``only_a``/``only_b``: the ones only one
    has. ``scorers[id]``: ``n`` (pairs scored on both sides), ``mean_a``, ``mean_b``,
    ``difference``, ``stderr``, ``ci95`` (paired bootstrap), ``binary``, ``mcnemar``
    (``{"a_only", "b_only", "p_value"}`` for binary scores, else None), ``flips``
    (``pass_to_fail`` / ``fail_to_pass``: each ``{"id", "a", "b", "a_sessions", "b_sessions"}``),
    ``unscored`` (shared samples not scored on both sides) and ``unstable`` (per side, the samples
    whose epochs disagree). ``tokens`` / ``wall_seconds``: totals ``a``, ``b``, ``difference`` and
    ``per_sample`` (the mean paired difference, with its ``ci95``).
    """

    a: Mapping[str, Any]
    b: Mapping[str, Any]
    same_dataset: bool
    paired: Sequence[str]
    only_a: Sequence[str]
    only_b: Sequence[str]
    scorers: Mapping[str, Mapping[str, Any]]
    tokens: Mapping[str, Any]
    wall_seconds: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """JSON form (what ``qitos eval compare --json`` prints)."""
        data: dict[str, Any] = _json(asdict(self))
        return data


def compare(
    a: EvalReport | str,
    b: EvalReport | str,
    store: CheckpointStore | str | os.PathLike[str] | None = None,
    *,
    allow_different_datasets: bool = False,
) -> Comparison:
    """Compare eval ``b`` with eval ``a`` (each an :class:`EvalReport`, or an eval id or name read
    from ``store``); see :class:`Comparison`. Raises :class:`CompareError` when an eval is not in
    the store, or the two ran on different datasets and ``allow_different_datasets`` is False."""
    eval_store: EvalStore | None = None
    opened: CheckpointStore | None = None
    grades: dict[str, dict[str, Mapping[str, float]]] = {}
    if isinstance(a, str) or isinstance(b, str):
        if store is None:
            raise CompareError("compare() reads evals named by id or name from a store: pass store=")
        opened, eval_store = open_eval_store(store)
    try:
        first = _report(a, eval_store, grades)
        second = _report(b, eval_store, grades)
    finally:
        if eval_store is not None:
            eval_store.close()
        if opened is not None and opened is not store:  # a store this call opened from a path or DSN
            opened.close()
    return _compare(first, second, grades, allow_different_datasets=allow_different_datasets)


def _report(
    value: EvalReport | str, store: EvalStore | None, grades: dict[str, dict[str, Mapping[str, float]]]
) -> EvalReport:
    if isinstance(value, EvalReport):
        grades[value.eval_id] = _pinned_grades(value.pins)
        return value
    if not isinstance(value, str) or store is None:
        raise CompareError(f"compare() takes EvalReports or eval ids/names, got {value!r}")
    record = store.find_eval(value)
    if record is None:
        raise CompareError(f"no eval {value!r} in the store")
    grades[record.eval_id] = {
        row.scorer_id: row.spec["grades"]
        for row in store.scorers(record.eval_id)
        if isinstance(row.spec.get("grades"), Mapping)
    }
    return build_report(store, record)


def _pinned_grades(pins: Mapping[str, Any]) -> dict[str, Mapping[str, float]]:
    out: dict[str, Mapping[str, float]] = {}
    for scorer in pins.get("scorers") or ():
        spec = scorer.get("spec") if isinstance(scorer, Mapping) else None
        if isinstance(spec, Mapping) and isinstance(spec.get("grades"), Mapping):
            out[str(scorer.get("id"))] = spec["grades"]
    return out


def _compare(
    a: EvalReport,
    b: EvalReport,
    grades: Mapping[str, Mapping[str, Mapping[str, float]]],
    *,
    allow_different_datasets: bool,
) -> Comparison:
    digest_a = (a.pins.get("dataset") or {}).get("digest")
    digest_b = (b.pins.get("dataset") or {}).get("digest")
    same = digest_a == digest_b
    if not same and not allow_different_datasets:
        raise CompareError(
            f"evals {a.name!r} and {b.name!r} ran on different datasets (digest {str(digest_a)[:12]} with "
            f"{_count(a)} samples, digest {str(digest_b)[:12]} with {_count(b)}); compare them anyway with "
            "allow_different_datasets=True (--allow-different-datasets): only the samples both have are paired"
        )
    by_a, by_b = _by_sample(a), _by_sample(b)
    order = [s for s in by_a if s in by_b]
    scorers = {}
    for scorer_id in [s for s in a.metrics if s in b.metrics]:
        scorers[scorer_id] = _scorer(
            scorer_id,
            order,
            by_a,
            by_b,
            (a.metrics[scorer_id].get("reducer") or "mean", b.metrics[scorer_id].get("reducer") or "mean"),
            (grades.get(a.eval_id, {}).get(scorer_id), grades.get(b.eval_id, {}).get(scorer_id)),
        )
    return Comparison(
        a=_side(a),
        b=_side(b),
        same_dataset=same,
        paired=order,
        only_a=[s for s in by_a if s not in by_b],
        only_b=[s for s in by_b if s not in by_a],
        scorers=scorers,
        tokens=_cost(a.total_tokens, b.total_tokens, order, by_a, by_b, lambda s: float(s.total_tokens)),
        wall_seconds=_cost(a.wall_seconds, b.wall_seconds, order, by_a, by_b, lambda s: s.wall_seconds),
    )


def _count(report: EvalReport) -> Any:
    return (report.pins.get("dataset") or {}).get("samples", report.total_samples)


def _side(report: EvalReport) -> dict[str, Any]:
    return {
        "eval_id": report.eval_id,
        "name": report.name,
        "status": report.status,
        "dataset": dict(report.pins.get("dataset") or {}),
        "agent": report.pins.get("agent"),
        "epochs": report.epochs,
        "samples": report.total_samples,
        "done": len(report.samples),
        "input_tokens": report.input_tokens,
        "output_tokens": report.output_tokens,
        "total_tokens": report.total_tokens,
        "wall_seconds": report.wall_seconds,
    }


def _by_sample(report: EvalReport) -> dict[str, list[SampleReport]]:
    out: dict[str, list[SampleReport]] = defaultdict(list)
    for sample in report.samples:
        out[sample.id].append(sample)
    return dict(out)


def _number(value: object, grades: Mapping[str, float] | None) -> float:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        return float(value)
    table = {str(k).upper(): float(v) for k, v in (grades or {"C": 1.0, "P": 0.5, "I": 0.0}).items()}
    if isinstance(value, str) and value.upper() in table:
        return table[value.upper()]
    raise ScoringError(f"{value!r} has no numeric value")


def _reduced(
    runs: Sequence[SampleReport], scorer_id: str, reducer: str, grades: Mapping[str, float] | None
) -> tuple[float, list[float]] | None:
    """The sample's reduced number and its per-epoch numbers (None when no epoch was scored)."""
    values: list[Any] = []
    numbers: list[float] = []
    for run in sorted(runs, key=lambda r: r.epoch):
        entry = run.scores.get(scorer_id)
        if run.error is not None or entry is None or entry.get("error") is not None:
            continue
        try:
            numbers.append(_number(entry.get("value"), grades))
        except ScoringError:
            continue
        values.append(entry.get("value"))
    if not numbers:
        return None
    return reduce_epochs(values, numbers, reducer)[1], numbers


def _scorer(
    scorer_id: str,
    order: Sequence[str],
    by_a: Mapping[str, Sequence[SampleReport]],
    by_b: Mapping[str, Sequence[SampleReport]],
    reducers: tuple[str, str],
    grades: tuple[Mapping[str, float] | None, Mapping[str, float] | None],
) -> dict[str, Any]:
    pairs: list[tuple[str, float, float]] = []
    unscored: list[str] = []
    unstable: dict[str, list[str]] = {"a": [], "b": []}
    for side, by, reducer, graded in (("a", by_a, reducers[0], grades[0]), ("b", by_b, reducers[1], grades[1])):
        for sample_id, runs in by.items():
            reduced = _reduced(runs, scorer_id, reducer, graded)
            if reduced is not None and len(set(reduced[1])) > 1:
                unstable[side].append(sample_id)
    for sample_id in order:
        left = _reduced(by_a[sample_id], scorer_id, reducers[0], grades[0])
        right = _reduced(by_b[sample_id], scorer_id, reducers[1], grades[1])
        if left is None or right is None:
            unscored.append(sample_id)
            continue
        pairs.append((sample_id, left[0], right[0]))
    differences = [y - x for _, x, y in pairs]
    binary = bool(pairs) and all(v in (0.0, 1.0) for _, x, y in pairs for v in (x, y))
    flips: dict[str, list[dict[str, Any]]] = {"pass_to_fail": [], "fail_to_pass": []}
    mcnemar = None
    if binary:
        for sample_id, x, y in pairs:
            if x != y:
                flips["pass_to_fail" if x > y else "fail_to_pass"].append(
                    {
                        "id": sample_id,
                        "a": x,
                        "b": y,
                        "a_sessions": [r.session_id for r in by_a[sample_id]],
                        "b_sessions": [r.session_id for r in by_b[sample_id]],
                    }
                )
        a_only, b_only = len(flips["pass_to_fail"]), len(flips["fail_to_pass"])
        mcnemar = {"a_only": a_only, "b_only": b_only, "p_value": mcnemar_exact(a_only, b_only)}
    return {
        "n": len(pairs),
        "mean_a": mean([x for _, x, _ in pairs]),
        "mean_b": mean([y for _, _, y in pairs]),
        "difference": mean(differences),
        "stderr": stderr(differences),
        "ci95": bootstrap_ci(differences),
        "binary": binary,
        "mcnemar": mcnemar,
        "flips": flips,
        "unscored": unscored,
        "unstable": unstable,
        "reducers": {"a": reducers[0], "b": reducers[1]},
    }


def _cost(
    total_a: float,
    total_b: float,
    order: Sequence[str],
    by_a: Mapping[str, Sequence[SampleReport]],
    by_b: Mapping[str, Sequence[SampleReport]],
    measure: Any,
) -> dict[str, Any]:
    differences = [
        sum(measure(r) for r in by_b[sample_id]) - sum(measure(r) for r in by_a[sample_id]) for sample_id in order
    ]
    return {
        "a": total_a,
        "b": total_b,
        "difference": total_b - total_a,
        "per_sample": mean(differences),
        "per_sample_ci95": bootstrap_ci(differences),
    }


def _json(value: object) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    return value
