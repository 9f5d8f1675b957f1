"""JSON views of runs and sessions, shared by the viewer's API and the CLI's ``--json`` output.

Everything here reads through the library (the trace reader, a ``CheckpointStore`` and
``Session.inspect``) and returns JSON-native dicts with stable shapes. No SQL, no loop logic, and
no third-party imports: the viewer runs on the standard library alone. Every view passes the
redaction policy (:mod:`qitos.core._redaction`: token shapes and secret fields) on its way out, so a
key that reached a store or trace before it was redacted there is still not shown.

Shapes (every key is always present; missing values are ``null``):

- run summary: ``run_id, dir, status, task, agent, steps, stop_reason, tokens, duration_s,
  started_at, ended_at, final_result, error, model_steps, receipts``
- session summary: ``session_id, lifecycle, sequence, snapshot_id, updated_at, created_at, task,
  agent, parent_session_id, fork_snapshot_id``
- session detail: ``session, inspection, inspection_error, integrity, snapshots,
  snapshot_count, lineage, runs, traced_runs``; ``traced_runs`` are the ``runs`` whose trace is in
  the trace directory given (null when none is), the only ones a page may link to
- step request: ``step_id, status ("ok" | "failed"), request_view, model, messages, attempts``;
  ``messages`` is every message the request sent (null for a trace written before they were
  recorded), ``attempts`` every failed attempt (retries from ``model_retry`` events, and the final
  failure of a failed request): ``attempt, status_code, reason, error, delay_s, final``
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from qitos.checkpoint._records import SessionHeadRecord
from qitos.checkpoint.store import CheckpointStore
from qitos.core._errors import CheckpointError, QitosError, UsageError
from qitos.core._redaction import Redactor
from qitos.distributed._naming import fleet_queue
from qitos.sessions._control import delegation_root
from qitos.sessions._inspection import inspect_session, observed_lifecycle
from qitos.trace._reader import RunTrace, TraceError, list_runs
from qitos.trace._writer import displayed_messages

__all__ = [
    "CLI_OPTIONS",
    "AmbiguousReferenceError",
    "NotFoundError",
    "find_run",
    "how_it_continues",
    "inspection_to_dict",
    "lineage",
    "resume_argv",
    "run_detail",
    "run_events",
    "run_request",
    "run_summary",
    "runs_board",
    "session_detail",
    "session_summary",
    "to_jsonable",
]

_FINAL_PREVIEW = 300
_MAX_SNAPSHOTS = 200
_MAX_LINEAGE = 200


_SHOWN = Redactor()


def _shown(view: Mapping[str, object]) -> dict[str, Any]:
    shown: dict[str, Any] = _SHOWN.redact_value(view)
    return shown


class NotFoundError(QitosError, LookupError):
    """A run, session, record or store that was asked for does not exist."""


class AmbiguousReferenceError(UsageError):
    """A short reference matches several runs; give more of the id."""


def to_jsonable(value: object) -> Any:
    """Dataclasses, mappings, tuples and enums as JSON-native values (other objects as ``repr``)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return [to_jsonable(v) for v in items]
    enum_value = getattr(value, "value", None)
    if isinstance(enum_value, str | int):
        return enum_value
    return repr(value)


# --------------------------------------------------------------------------- runs


def _parse_time(text: object) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def _step_tokens(step: Mapping[str, Any]) -> int:
    usage = ((step.get("model") or {}).get("response") or {}).get("usage") or {}
    return int(usage.get("input_tokens", 0) or 0) + int(usage.get("output_tokens", 0) or 0)


# Per-run step statistics, keyed by the steps file's identity, so the board re-reads only runs that changed.
_STEP_STATS: dict[str, tuple[tuple[int, int], dict[str, int]]] = {}


def _step_stats(trace: RunTrace, steps: list[dict[str, Any]] | None) -> dict[str, int]:
    path = os.path.join(trace.run_dir, "steps.jsonl")
    try:
        st = os.stat(path)
        key = (st.st_mtime_ns, st.st_size)
    except OSError:
        key = (0, 0)
    cached = _STEP_STATS.get(path)
    if cached is not None and cached[0] == key and steps is None:
        return cached[1]
    rows = steps if steps is not None else trace.steps()
    stats = {
        "steps": len(rows),
        "tokens": sum(_step_tokens(s) for s in rows),
        "model_steps": sum(1 for s in rows if s.get("model")),
        "receipts": sum(len((s.get("request_view") or {}).get("receipts") or ()) for s in rows),
    }
    _STEP_STATS[path] = (key, stats)
    return stats


def run_summary(trace: RunTrace, *, steps: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One row of the runs board (see the module docstring for the shape)."""
    manifest = trace.manifest()
    summary = manifest.get("summary") or {}
    stats = _step_stats(trace, steps)
    step_count = summary.get("steps", stats["steps"])
    tokens = (summary.get("token_usage") or {}).get("total_tokens", stats["tokens"])
    duration = summary.get("elapsed_seconds")
    started = _parse_time(manifest.get("started_at"))
    if duration is None and started is not None:
        ended = _parse_time(manifest.get("ended_at")) or datetime.now(started.tzinfo)
        duration = max(0.0, (ended - started).total_seconds())
    final = summary.get("final_result")
    if isinstance(final, str) and len(final) > _FINAL_PREVIEW:
        final = final[: _FINAL_PREVIEW - 3] + "..."
    task = manifest.get("task")
    objective = task.get("objective") if isinstance(task, Mapping) else task
    return _shown(
        {
            "run_id": str(manifest.get("run_id") or os.path.basename(trace.run_dir)),
            "dir": os.path.basename(trace.run_dir),
            "status": manifest.get("status"),
            "task": objective,
            "agent": manifest.get("agent"),
            "steps": step_count,
            "stop_reason": summary.get("stop_reason"),
            "tokens": tokens,
            "duration_s": round(float(duration), 3) if duration is not None else None,
            "started_at": manifest.get("started_at"),
            "ended_at": manifest.get("ended_at"),
            "final_result": final,
            "error": summary.get("error"),
            "model_steps": stats["model_steps"],
            "receipts": stats["receipts"],
        }
    )


def runs_board(logdir: str) -> list[dict[str, Any]]:
    """Summaries of every run under ``logdir``, newest first (unreadable runs are reported, not hidden)."""
    rows = []
    for trace in list_runs(logdir):
        try:
            rows.append(run_summary(trace))
        except TraceError as exc:
            rows.append(_broken_run(trace, str(exc)))
    return rows


def _broken_run(trace: RunTrace, error: str) -> dict[str, Any]:
    name = os.path.basename(trace.run_dir)
    keys = ("task", "agent", "steps", "stop_reason", "tokens", "duration_s", "started_at", "ended_at")
    row: dict[str, Any] = {"run_id": name, "dir": name, "status": "unreadable", "error": error}
    row.update({k: None for k in keys})
    row.update(final_result=None, model_steps=None, receipts=None)
    return row


def find_run(logdir: str, ref: str) -> RunTrace:
    """The run whose id or directory name is ``ref``, or the only one starting with it."""
    if not ref:
        raise NotFoundError("no run reference given")
    runs = list_runs(logdir)
    prefixed = []
    for trace in runs:
        name = os.path.basename(trace.run_dir)
        try:
            run_id = trace.run_id
        except TraceError:
            run_id = name
        if ref in (run_id, name):
            return trace
        if run_id.startswith(ref) or name.startswith(ref):
            prefixed.append(trace)
    if len(prefixed) == 1:
        return prefixed[0]
    if len(prefixed) > 1:
        names = ", ".join(os.path.basename(t.run_dir) for t in prefixed[:5])
        raise AmbiguousReferenceError(f"run {ref!r} is ambiguous: it matches {len(prefixed)} runs ({names})")
    where = os.path.abspath(logdir)
    raise NotFoundError(f"no run {ref!r} under {where}" + ("" if runs else " (no runs there)"))


def run_detail(trace: RunTrace) -> dict[str, Any]:
    """A run page: ``{"run": summary, "manifest": ..., "steps": [...]}``."""
    steps = trace.steps()
    return _shown({"run": run_summary(trace, steps=steps), "manifest": trace.manifest(), "steps": steps})


def run_events(trace: RunTrace, *, after: int = 0) -> dict[str, Any]:
    """Events after the first ``after`` ones: ``{"events": [...], "next": n}`` (poll with ``after=next``)."""
    events = trace.events()
    return _shown({"events": events[after:], "next": len(events)})


def run_request(trace: RunTrace, step_id: int) -> dict[str, Any]:
    """The request inspector of one model step: what was sent, what came back, the failed attempts.

    A step whose request failed has no step record; its request is then read from the failed
    ``model_response`` event the model path wrote. NotFoundError when the step sent no model
    request."""
    step = trace.step(step_id)
    events = [e for e in trace.events() if e.get("step_id") == step_id]
    attempts: list[dict[str, Any]] = []
    for event in events:
        if event.get("event_type") == "model_retry":
            payload = event.get("payload") or {}
            attempts.append(
                {
                    "attempt": payload.get("attempt"),
                    "status_code": payload.get("status_code"),
                    "reason": payload.get("reason"),
                    "error": payload.get("error"),
                    "delay_s": payload.get("delay_s"),
                    "final": False,
                }
            )
    failures = [e for e in events if e.get("event_type") == "model_response" and e.get("ok") is False]
    if step is not None and step.get("model"):
        status, model, request_view = "ok", dict(step["model"]), step.get("request_view")
    elif failures:
        payload = dict(failures[-1].get("payload") or {})
        request_view = payload.pop("request_view", None)
        status, model = "failed", payload
        attempts.append(
            {
                "attempt": len(attempts) + 1,
                "status_code": model.get("status_code"),
                "reason": model.get("error_type"),
                "error": failures[-1].get("error"),
                "delay_s": None,
                "final": True,
            }
        )
    else:
        raise NotFoundError(f"step {step_id} of run {trace.run_id} sent no model request")
    refs = model.get("message_refs")
    return _shown(
        {
            "step_id": step_id,
            "status": status,
            "request_view": request_view,
            "model": model,
            "messages": trace.request_messages(refs) if refs is not None else None,
            "attempts": attempts,
        }
    )


# --------------------------------------------------------------------------- sessions


def session_summary(head: SessionHeadRecord, store: CheckpointStore | None = None) -> dict[str, Any]:
    """One row of the sessions board (see the module docstring for the shape). With ``store``,
    ``lifecycle`` is what a reader sees now (``observed_lifecycle``: ``running`` while a runner holds
    the session, ``interrupted`` when its runner died midway); without, the head's."""
    meta = head.metadata or {}
    task = meta.get("task")
    return _shown(
        {
            "session_id": head.session_id,
            "lifecycle": observed_lifecycle(store, head) if store is not None else head.lifecycle,
            "sequence": head.sequence,
            "snapshot_id": head.snapshot_id,
            "updated_at": head.updated_at,
            "created_at": meta.get("created_at"),
            "task": task.get("objective") if isinstance(task, Mapping) else task,
            "agent": meta.get("agent"),
            "parent_session_id": meta.get("parent_session_id"),
            "fork_snapshot_id": meta.get("fork_snapshot_id"),
        }
    )


CLI_OPTIONS = "cli_options"
"""Session metadata: the options ``qitos run`` started the session with that a resume needs again
(``--model``, ``--base-url``, ``--max-input-units``, ``--compact``; never a key)."""

_RESUME_FLAGS = (("model", "--model"), ("base_url", "--base-url"), ("max_input_units", "--max-input-units"))


def resume_argv(store: CheckpointStore, session_id: str, db: str) -> list[str] | None:
    """The ``qitos sessions resume`` command line that continues ``session_id`` as it was started.

    A delegated child is continued by its parent's run, so the command resumes the top of its
    delegation chain. It names the store (``--db``) and the options ``qitos run`` recorded
    (:data:`CLI_OPTIONS`). None when the session's agent cannot be rebuilt from its record (it was
    built with arguments): then ``--agent`` must name a factory, which only the user knows.
    """
    root = delegation_root(store, session_id)
    head = store.get_session_head(root)
    meta = (head.metadata if head is not None else None) or {}
    if "agent_ref" in meta and not meta["agent_ref"]:
        return None
    argv = ["qitos", "sessions", "resume", root, "--db", db]
    options = meta.get(CLI_OPTIONS)
    if isinstance(options, Mapping):
        for key, flag in _RESUME_FLAGS:
            if options.get(key) is not None:
                argv += [flag, str(options[key])]
        if options.get("compact"):
            argv.append("--compact")
    return argv


def how_it_continues(store: CheckpointStore, session_id: str, db: str) -> str:
    """What continues ``session_id`` after an answer or steering, for people: a fleet's workers
    continue their sessions by themselves; otherwise the :func:`resume_argv` command (runnable as
    printed), or, when the record cannot rebuild the agent, the command with ``--agent`` to fill in."""
    root_id = delegation_root(store, session_id)
    root = store.get_session_head(root_id)
    queue = fleet_queue(root.metadata if root is not None else None)
    if queue is not None:
        return f"a fleet worker on queue {queue!r} continues the session"
    argv = resume_argv(store, session_id, db)
    if argv is None:
        command = shlex.join(["qitos", "sessions", "resume", root_id, "--db", db, "--agent", "FACTORY"])
        return f"resume it with {command}, naming a zero-argument factory of its agent (its record cannot rebuild it)"
    return f"run: {shlex.join(argv)}"


def inspection_to_dict(inspection: Any) -> dict[str, Any]:
    """A ``SessionInspection`` as JSON (the last request view as its ``summary()``, and the
    messages it sent, secret context as placeholders)."""
    view = inspection.last_request_view
    batch = inspection.tool_batch
    return _shown(
        {
            "head": to_jsonable(inspection.head),
            "lifecycle": to_jsonable(inspection.lifecycle),
            "capabilities": list(inspection.capabilities),
            "snapshot_integrity": inspection.snapshot_integrity,
            "budget": to_jsonable(inspection.budget),
            "work_graph": to_jsonable(inspection.work_graph),
            "last_request_view": view.summary() if view is not None else None,
            "last_request_messages": displayed_messages(view) if view is not None else None,
            "task": inspection.task,
            "tool_batch": None
            if batch is None
            else {"step_id": batch.step_id, "calls": [to_jsonable(c) for c in batch.calls]},
        }
    )


def _traced_run_ids(logdir: str) -> set[str]:
    ids = set()
    for trace in list_runs(logdir):
        try:
            ids.add(trace.run_id)
        except TraceError:
            continue
    return ids


def _chain_integrity(store: CheckpointStore, snapshot_id: str) -> str:
    try:
        store.load_chain(snapshot_id)
    except CheckpointError as exc:
        return f"corrupt: {exc}"
    return "verified"


def lineage(
    store: CheckpointStore, session_id: str, *, heads: Iterable[SessionHeadRecord] | None = None
) -> dict[str, Any]:
    """The tree of forks and delegated child sessions containing ``session_id``, from its root down.

    Each node: ``session_id, lifecycle, snapshot_id, fork_snapshot_id, relation`` (``fork``,
    ``delegate`` or None for the root), ``call_id`` (the parent's call a delegated child runs),
    ``task, integrity, current, children``; ``integrity`` is ``verified`` or names the failure of the node's head chain.
    """
    records = {h.session_id: h for h in (heads if heads is not None else store.list_sessions())}
    if session_id not in records:
        raise NotFoundError(f"session {session_id!r} not found")
    children: dict[str, list[str]] = {}
    for sid, head in records.items():
        parent = (head.metadata or {}).get("parent_session_id")
        if parent:
            children.setdefault(str(parent), []).append(sid)
    root = session_id
    seen = {root}
    while True:
        parent = (records[root].metadata or {}).get("parent_session_id")
        if not parent or parent not in records or parent in seen:
            break
        root = str(parent)
        seen.add(root)
    budget = [_MAX_LINEAGE]

    def node(sid: str) -> dict[str, Any]:
        budget[0] -= 1
        head = records[sid]
        row = session_summary(head, store)
        kids = sorted(children.get(sid, []), key=lambda c: (records[c].metadata or {}).get("created_at") or "")
        return {
            "session_id": sid,
            "lifecycle": row["lifecycle"],
            "snapshot_id": head.snapshot_id,
            "fork_snapshot_id": row["fork_snapshot_id"],
            "relation": _relation(head),
            "call_id": (_delegated_from(head) or {}).get("call_id"),
            "task": row["task"],
            "integrity": _chain_integrity(store, head.snapshot_id),
            "current": sid == session_id,
            "children": [node(c) for c in kids if budget[0] > 0],
        }

    return _shown(node(root))


def _delegated_from(head: SessionHeadRecord) -> Mapping[str, Any] | None:
    link = (head.metadata or {}).get("delegated_from")
    return link if isinstance(link, Mapping) else None


def _relation(head: SessionHeadRecord) -> str | None:
    """How a session came from its parent: ``fork``, ``delegate`` (a delegated call's child), or None."""
    meta = head.metadata or {}
    if _delegated_from(head) is not None:
        return "delegate"
    if meta.get("fork_snapshot_id"):
        return "fork"
    return None


def session_detail(store: CheckpointStore, session_id: str, *, logdir: str | None = None) -> dict[str, Any]:
    """A session page: summary, its inspection, snapshot ids, the fork lineage and the run ids
    recorded in its snapshots.

    Everything is read from the store (``qitos.sessions._inspection``): no agent is imported and no
    user code runs. When even the inspection cannot be read (a damaged head row) the page still
    shows the store's view and ``inspection_error`` says why.
    """
    heads = store.list_sessions()
    head = next((h for h in heads if h.session_id == session_id), None)
    if head is None:
        raise NotFoundError(f"session {session_id!r} not found")
    inspection: dict[str, Any] | None = None
    error: str | None = None
    try:
        inspection = inspection_to_dict(inspect_session(store, session_id))
    except QitosError as exc:
        error = f"{type(exc).__name__}: {exc}"
    integrity = inspection["snapshot_integrity"] if inspection else _chain_integrity(store, head.snapshot_id)
    snapshot_ids = store.list_session_snapshots(session_id)
    runs: list[str] = []
    work_graph = (inspection or {}).get("work_graph") or {}
    for step in work_graph.get("steps") or ():
        for attempt in step.get("attempts") or ():
            run_id = attempt.get("run_id")
            if run_id and run_id not in runs:
                runs.append(run_id)
    return _shown(
        {
            "session": session_summary(head, store),
            "inspection": inspection,
            "inspection_error": error,
            "integrity": integrity,
            "snapshots": snapshot_ids[:_MAX_SNAPSHOTS],
            "snapshot_count": len(snapshot_ids),
            "lineage": lineage(store, session_id, heads=heads),
            "runs": runs,
            "traced_runs": None if logdir is None else [r for r in runs if r in _traced_run_ids(logdir)],
        }
    )
