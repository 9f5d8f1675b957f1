"""The viewer's eval pages: JSON views of evals, one eval, two compared, and a session's request.

Read through ``qitos.eval`` (the eval tables, :func:`~qitos.eval.compare`) and the session's own
records (``qitos.eval._recording``); nothing here writes: a store without eval tables shows no
evals, it does not get them. Shapes (every key always present):

- evals list: ``{"db", "available", "evals": [{"eval_id", "name", "status", "created_at", "agent",
  "dataset", "model", "epochs", "done", "total", "scorers": {id: {"mean", "ci95", "n"}}}]}``
- one eval: ``{"eval": <EvalReport.to_dict()>, "histograms": {scorer: [{"label", "low", "high",
  "count"}]}, "groups": {metadata field: [values]}, "samples": [sample row + "request_step"]}``
- two evals: ``{"comparison": <Comparison.to_dict()>, "rows": [{"id", "a": [...], "b": [...],
  "flip": {scorer: "pass_to_fail" | "fail_to_pass"}}]}``
- a session's request: ``{"step_id", "status", "request_view", "model", "messages", "attempts",
  "model_steps"}`` (the shape of a run's request inspector, plus the steps that called a model)
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from qitos.checkpoint.store import CheckpointStore
from qitos.core._errors import UsageError
from qitos.core._redaction import Redactor
from qitos.eval import CompareError, compare, open_eval_store
from qitos.eval._recording import recorded_calls, recorded_request
from qitos.eval._report import EvalReport, build_report
from qitos.eval._store import EvalStore
from qitos.viewer._data import NotFoundError

__all__ = ["eval_api", "session_request"]

_SHOWN = Redactor()
_BINS = 10
_EVAL_STORES: weakref.WeakKeyDictionary[CheckpointStore, EvalStore] = weakref.WeakKeyDictionary()


def _eval_store(store: CheckpointStore) -> EvalStore:
    found = _EVAL_STORES.get(store)
    if found is None:
        found = _EVAL_STORES[store] = open_eval_store(store)[1]
    return found


def eval_api(
    store: CheckpointStore | None, parts: Sequence[str], query: Mapping[str, Sequence[str]], *, db: str | None
) -> Any:
    """Answer ``/api/evals[/...]`` (``parts`` after ``evals``); NotFoundError or UsageError otherwise."""
    if store is None:
        if parts:
            raise NotFoundError(f"no session store at {db}" if db else "no session store configured")
        return {"db": db, "available": False, "evals": []}
    evals = _eval_store(store)
    if not parts:
        return {"db": db, "available": True, "evals": evals_board(evals)}
    if len(parts) == 1:
        return eval_detail(evals, parts[0])
    if len(parts) == 3 and parts[1] == "compare":
        allow = (query.get("allow_different_datasets") or ["0"])[0] in ("1", "true", "yes")
        return eval_comparison(evals, parts[0], parts[2], allow_different_datasets=allow)
    raise NotFoundError(f"no API endpoint /api/evals/{'/'.join(parts)}")


def evals_board(evals: EvalStore) -> Any:
    """One row per eval, newest first."""
    if not evals.exists():
        return []
    rows = []
    for record in reversed(evals.list_evals()):
        report = build_report(evals, record)
        pins = record.pins
        rows.append(
            {
                "eval_id": record.eval_id,
                "name": record.name,
                "status": record.status,
                "created_at": record.created_at,
                "agent": pins.get("agent"),
                "dataset": (pins.get("dataset") or {}).get("name"),
                "model": _model_name(pins.get("model")),
                "epochs": report.epochs,
                "done": len(report.samples),
                "total": report.total_samples * report.epochs,
                "scorers": {
                    k: {"mean": v["mean"], "ci95": _pair(v.get("ci95")), "n": v["n"]} for k, v in report.metrics.items()
                },
            }
        )
    return _shown(rows)


def eval_detail(evals: EvalStore, ref: str) -> Any:
    """One eval's page: the report, per-scorer histograms, metadata groups and sample rows."""
    report = build_report(evals, _find(evals, ref))
    data = report.to_dict()
    samples = []
    for sample in data["samples"]:
        divergence = sample.get("divergence") or {}
        step = divergence.get("step")
        samples.append({**sample, "request_step": step if isinstance(step, int) else 0})
    groups: dict[str, set[str]] = defaultdict(set)
    for sample in report.samples:
        for key, value in sample.metadata.items():
            if value is None or isinstance(value, str | int | float | bool):
                groups[key].add(str(value))
    return _shown(
        {
            "eval": {**data, "model": _model_name(report.pins.get("model"))},
            "histograms": {scorer: _histogram(report, scorer) for scorer in report.metrics},
            "groups": {key: sorted(values) for key, values in sorted(groups.items())},
            "samples": samples,
        }
    )


def eval_comparison(evals: EvalStore, first: str, second: str, *, allow_different_datasets: bool) -> Any:
    """Two evals compared: the statistics and the samples side by side."""
    a = build_report(evals, _find(evals, first))
    b = build_report(evals, _find(evals, second))
    try:
        result = compare(a, b, allow_different_datasets=allow_different_datasets)
    except CompareError as exc:
        raise UsageError(str(exc)) from exc
    flips: dict[str, dict[str, str]] = defaultdict(dict)
    for scorer, entry in result.scorers.items():
        for kind in ("pass_to_fail", "fail_to_pass"):
            for flip in entry["flips"][kind]:
                flips[flip["id"]][scorer] = kind
    by_a, by_b = _rows(a), _rows(b)
    ids = [*result.paired, *result.only_a, *result.only_b]
    rows = [{"id": i, "a": by_a.get(i, []), "b": by_b.get(i, []), "flip": flips.get(i, {})} for i in ids]
    return _shown({"comparison": result.to_dict(), "rows": rows})


def session_request(store: CheckpointStore, session_id: str, step: int) -> Any:
    """The request inspector of a session's model step: what was sent and what came back."""
    if store.get_session_head(session_id) is None:
        raise NotFoundError(f"no session {session_id!r} in the store")
    calls = recorded_calls(store, session_id)
    call = next((c for c in calls if c.step == step), None)
    steps = [c.step for c in calls]
    if call is None:
        where = f"its model steps: {', '.join(map(str, steps))}" if steps else "it made no model request"
        raise NotFoundError(f"step {step} of session {session_id} sent no model request ({where})")
    view = recorded_request(store, session_id, step)
    return _shown(
        {
            "step_id": step,
            "status": "ok",
            "request_view": view.summary(compact=True) if view is not None else None,
            "model": {
                "request_id": call.request_id,
                "request_digest": call.request_digest,
                "response": call.response.to_dict(),
            },
            "messages": view.messages() if view is not None else None,
            "attempts": [],
            "model_steps": steps,
        }
    )


def _find(evals: EvalStore, ref: str) -> Any:
    record = evals.find_eval(ref) if evals.exists() else None
    if record is None:
        raise NotFoundError(f"no eval {ref!r} in the store")
    return record


def _rows(report: EvalReport) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for sample in report.samples:
        out[sample.id].append(
            {
                "epoch": sample.epoch,
                "session_id": sample.session_id,
                "answer": sample.answer,
                "error": sample.error,
                "scores": {k: {"value": v.get("value"), "error": v.get("error")} for k, v in sample.scores.items()},
                "divergence": sample.divergence,
            }
        )
    return out


def _histogram(report: EvalReport, scorer: str) -> list[dict[str, Any]]:
    numbers = []
    for sample in report.samples:
        entry = sample.scores.get(scorer)
        if entry is None or entry.get("error") is not None:
            continue
        number = _number(entry.get("value"))
        if number is not None:
            numbers.append(number)
    if not numbers:
        return []
    if set(numbers) <= {0.0, 1.0}:
        return [
            {"label": "fail", "low": 0.0, "high": 0.0, "count": numbers.count(0.0)},
            {"label": "pass", "low": 1.0, "high": 1.0, "count": numbers.count(1.0)},
        ]
    low, high = min(numbers), max(numbers)
    width = (high - low) / _BINS or 1.0
    counts = [0] * _BINS
    for number in numbers:
        counts[min(_BINS - 1, int((number - low) / width))] += 1
    return [
        {
            "label": f"{low + i * width:.3g} to {low + (i + 1) * width:.3g}",
            "low": low + i * width,
            "high": low + (i + 1) * width,
            "count": c,
        }
        for i, c in enumerate(counts)
    ]


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        return float(value)
    return {"C": 1.0, "P": 0.5, "I": 0.0}.get(str(value).upper()) if isinstance(value, str) else None


def _model_name(model: Any) -> str | None:
    if isinstance(model, Mapping):
        return str(model.get("model_id") or model.get("adapter") or "") or None
    return None


def _pair(value: Any) -> list[Any] | None:
    return list(value) if value is not None else None


def _shown(value: Any) -> Any:
    shown: Any = _SHOWN.redact_value(value)
    return shown
