"""Writing an eval as an inspect_ai log, through inspect_ai's own log classes and writer.

``qitos eval export EVAL --format inspect OUT.eval`` (and :func:`export_inspect`) builds an
``inspect_ai.log.EvalLog`` from the eval's rows and sessions and writes it with
``inspect_ai.log.write_eval_log``, so ``inspect view`` and inspect's analysis tools open it. Needs
the ``inspect`` extra (``pip install 'qitos-kernel[inspect]'``); ``import qitos.eval`` never imports it.

What goes where: the eval's name is the task, its id the eval and run id, its pins the log's
metadata (``metadata["qitos"]``); each sample x epoch is an ``EvalSample`` with its input, target,
the conversation its session had (the system prompt, then every exchange-log item), its answer as
the output, each score (value, answer, explanation, metadata), its tokens as model usage, its wall
time, its error, and its session id in the sample's metadata (``qitos_session``). Per scorer the
results carry the mean and the standard error (``reducer`` as the scorer's).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from qitos.checkpoint.store import CheckpointStore
from qitos.core._errors import ConfigurationError, UsageError
from qitos.core._install import install_command
from qitos.eval._recording import session_messages
from qitos.eval._report import EvalReport, SampleReport, build_report
from qitos.eval._store import open_eval_store

__all__ = ["export_inspect"]

_Status = Literal["started", "success", "cancelled", "error"]
_STATUS: dict[str, _Status] = {
    "complete": "success",
    "failed": "error",
    "incomplete": "cancelled",
    "running": "started",
}


def export_inspect(ref: str, path: str | os.PathLike[str], *, store: CheckpointStore | str | os.PathLike[str]) -> Path:
    """Write eval ``ref`` (an id or name in ``store``) as an inspect_ai log at ``path``; the path."""
    try:
        from inspect_ai.log import write_eval_log
    except ImportError as exc:
        hint = install_command("inspect")
        raise ConfigurationError(f"exporting to inspect_ai's log format needs inspect_ai: {hint} ({exc})") from exc
    checkpoints, evals = open_eval_store(store)
    try:
        record = evals.find_eval(ref) if evals.exists() else None
        if record is None:
            raise UsageError(f"no eval {ref!r} in the store")
        report = build_report(evals, record)
        samples = {str(s["id"]): s for s in evals.samples(record.eval_id)}
        log = _log(report, record.created_at, samples, checkpoints)
    finally:
        evals.close()
        if checkpoints is not store:
            checkpoints.close()
    target = Path(path)
    write_eval_log(log, location=str(target), format="eval")
    return target


def _model_name(report: EvalReport) -> str:
    model = report.pins.get("model")
    if isinstance(model, Mapping):
        return f"qitos/{model.get('model_id') or model.get('adapter') or 'model'}"
    return "qitos/agent"  # the agent decided without a model of the eval's


def _log(report: EvalReport, created: str, samples: Mapping[str, Any], store: CheckpointStore) -> Any:
    from inspect_ai.log import (
        EvalConfig,
        EvalDataset,
        EvalLog,
        EvalMetric,
        EvalResults,
        EvalScore,
        EvalSpec,
        EvalStats,
    )
    from inspect_ai.model import ModelUsage

    model = _model_name(report)
    dataset = report.pins.get("dataset") or {}
    usage = ModelUsage(
        input_tokens=report.input_tokens, output_tokens=report.output_tokens, total_tokens=report.total_tokens
    )
    scores = [
        EvalScore(
            name=scorer,
            scorer=scorer,
            reducer=metric.get("reducer"),
            scored_samples=int(metric.get("n") or 0),
            unscored_samples=int(metric.get("errors") or 0),
            metrics={
                name: EvalMetric(name=name, value=float(metric[name]))
                for name in ("mean", "stderr")
                if metric.get(name) is not None
            },
        )
        for scorer, metric in report.metrics.items()
    ]
    spec = EvalSpec(
        eval_id=report.eval_id,
        run_id=report.eval_id,
        created=created,
        task=report.name,
        task_id=report.eval_id,
        dataset=EvalDataset(
            name=dataset.get("name"), samples=report.total_samples, sample_ids=[str(k) for k in samples]
        ),
        model=model,
        config=EvalConfig(epochs=report.epochs),
        metadata={"qitos": {"eval_id": report.eval_id, "pins": _json(report.pins)}},
    )
    return EvalLog(
        status=_STATUS.get(report.status, "started"),
        eval=spec,
        results=EvalResults(
            total_samples=report.total_samples * report.epochs, completed_samples=len(report.samples), scores=scores
        ),
        stats=EvalStats(started_at=created, completed_at=created, model_usage={model: usage}),
        samples=[_sample(s, samples.get(s.id) or {}, model, store) for s in report.samples],
    )


def _sample(sample: SampleReport, stored: Mapping[str, Any], model: str, store: CheckpointStore) -> Any:
    from inspect_ai._util.error import EvalError
    from inspect_ai.log import EvalSample
    from inspect_ai.model import ModelOutput, ModelUsage
    from inspect_ai.scorer import Score

    raw_input = stored.get("input")
    text = raw_input if isinstance(raw_input, str) else str((raw_input or {}).get("objective", ""))
    answer = "" if sample.answer is None else str(sample.answer)
    return EvalSample(
        id=sample.id,
        epoch=sample.epoch,
        input=text,
        target=_target(stored.get("target")),
        messages=[_message(m) for m in session_messages(store, sample.session_id)],
        output=ModelOutput.from_content(model=model, content=answer),
        scores={
            scorer: Score(
                value=entry["value"] if entry.get("error") is None and entry.get("value") is not None else "error",
                answer=entry.get("answer"),
                explanation=entry.get("explanation") if entry.get("error") is None else entry.get("error"),
            )
            for scorer, entry in sample.scores.items()
        },
        metadata={**_json(sample.metadata), "qitos_session": sample.session_id, "stop_reason": sample.stop_reason},
        model_usage={
            model: ModelUsage(
                input_tokens=sample.input_tokens, output_tokens=sample.output_tokens, total_tokens=sample.total_tokens
            )
        },
        total_time=sample.wall_seconds,
        working_time=sample.wall_seconds,
        error=None if sample.error is None else EvalError(message=sample.error, traceback="", traceback_ansi=""),
    )


def _message(message: Mapping[str, Any]) -> Any:
    from inspect_ai.model import ChatMessageAssistant, ChatMessageSystem, ChatMessageTool, ChatMessageUser
    from inspect_ai.tool import ToolCall

    role = message.get("role")
    content = "" if message.get("content") is None else str(message.get("content"))
    if role in ("system", "developer"):
        return ChatMessageSystem(content=content)
    if role == "assistant":
        calls = [
            ToolCall(id=str(c["id"]), function=str(c["name"]), arguments=dict(c.get("arguments") or {}))
            for c in message.get("tool_calls") or ()
        ]
        return ChatMessageAssistant(content=content, tool_calls=calls or None)
    if role == "tool":
        return ChatMessageTool(content=content, tool_call_id=message.get("tool_call_id"))
    return ChatMessageUser(content=content)


def _target(value: object) -> str | list[str]:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str | int | float) and not isinstance(v, bool) for v in value):
        return [str(v) for v in value]
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _json(value: object) -> Any:
    return json.loads(json.dumps(value, default=str))
