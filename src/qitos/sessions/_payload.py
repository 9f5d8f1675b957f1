"""The session snapshot payload: one typed record, :class:`SnapshotPayload`, and its strict codec.

Every snapshot a durable session commits holds one payload, stored by the checkpoint store as the
canonical JSON of :meth:`SnapshotPayload.to_json` (the store never reads it). The journal
(``qitos.sessions._step_journal``) builds it; restore, inspection and control read its fields::

    step_id, control_position, budget_used    where the session stands; always written
    lifecycle                                 when not "running" (a delta carries the last one forward)
    stop_reason, pause_position               when there is one
    run_id, trace                             on a run's first snapshot and on every base
    state: {"full": {...}, "chunks": {...}}   a base: the whole (encoded) state, long lists as runs
         | {"delta": [ops]}                   a delta: the state's changes since its parent
    log                                       a base: every exchange-log blob (``chunks``); a delta:
                                              the blob of its new entries (``chunk``), when there are
    request_view                              the blob of the last RequestView (a delta: a new one)
    pending                                   a step that stopped midway (decision, calls so far)
    step                                      what the boundary's steps did (the work graph) and the
                                              model call each made (a replay answers with it)
    fork_of                                   a fork's first snapshot: where it was forked from
    format                                    a base: the format its chain is written in

Versioned: a base records its :data:`FORMAT`, and the deltas after it are read by that format.
Format 1 (no ``chunks``) and format 2 are read; a payload with a key this version does not know,
a field of the wrong type, or a base of an unknown format is refused with a
:class:`~qitos.core._errors.CodecError` naming the field (:meth:`SnapshotPayload.of` reports it as
the snapshot's :class:`~qitos.core._errors.SnapshotIntegrityError`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from qitos.checkpoint._records import SessionSnapshot
from qitos.core._codec import canonical_json
from qitos.core._errors import CodecError, SnapshotIntegrityError
from qitos.sessions._journal import PendingStep
from qitos.sessions._state_chunks import ChunkRef, parse_refs

__all__ = [
    "FORMAT",
    "READABLE_FORMATS",
    "CallSummary",
    "ForkOrigin",
    "LogMark",
    "SnapshotPayload",
    "StepSummary",
]

FORMAT: Final = 2
"""The snapshot format this version writes (on every base)."""
READABLE_FORMATS: Final = frozenset({1, 2})
"""The formats this version reads: 1 (state without runs) and 2 (long lists stored as runs)."""

_DECODE = json.JSONDecoder().decode


@dataclass(frozen=True, kw_only=True, slots=True)
class LogMark:
    """Where the session's exchange log stands at a snapshot, and where its entries are stored.

    A base lists every entry blob from the log's start (``chunks``); a delta names the blob of the
    entries it added (``chunk``), or none when it added none. ``digest`` is the log's hash chain.
    """

    log_id: str
    position: int
    digest: str
    chunks: tuple[str, ...] | None = None
    chunk: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class CallSummary:
    """One tool call of a committed step, as the work graph shows it."""

    call_id: str
    tool: str
    ok: bool
    error_kind: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class StepSummary:
    """What one committed step did: its decision's mode, its tool calls and, when a model decided,
    the model call (``request_id``, ``request_digest`` and the ``response``: what a replay answers
    the same request with)."""

    step_id: int
    mode: str
    calls: tuple[CallSummary, ...] = ()
    model: Mapping[str, Any] | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class ForkOrigin:
    """The snapshot a forked session's first snapshot was forked from."""

    session_id: str
    snapshot_id: str


@dataclass(frozen=True, kw_only=True, slots=True)
class SnapshotPayload:
    """The typed payload of one session snapshot (see the module docstring for the stored form).

    A base holds the whole state (``state_full`` and its list fields stored as runs,
    ``state_chunks``) and its ``format``; any other snapshot holds ``state_delta``, the changes
    since its parent. Fields left at their default are not written.
    """

    step_id: int
    control_position: int = 0
    budget_used: Mapping[str, int | float] = field(default_factory=dict)
    lifecycle: str | None = None
    stop_reason: str | None = None
    pause_position: int = 0
    run_id: str | None = None
    trace: Mapping[str, str] | None = None
    state_full: Mapping[str, Any] | None = None
    state_chunks: Mapping[str, tuple[ChunkRef, ...]] = field(default_factory=dict)
    state_delta: Sequence[Mapping[str, Any]] = ()
    log: LogMark | None = None
    request_view: str | None = None
    pending: PendingStep | None = None
    steps: tuple[StepSummary, ...] = ()
    fork_of: ForkOrigin | None = None
    format: int | None = None

    @property
    def is_base(self) -> bool:
        """Whether this payload holds a full state (the start of a chain)."""
        return self.state_full is not None

    @property
    def effective_lifecycle(self) -> str:
        """The lifecycle at this snapshot (a payload that does not record one is ``running``)."""
        return self.lifecycle or "running"

    # ---- encoding

    def to_json(self) -> dict[str, Any]:
        """The JSON-native form the store persists (canonically encoded); the inverse of :meth:`from_json`."""
        out: dict[str, Any] = {
            "step_id": self.step_id,
            "control_position": self.control_position,
            "budget_used": dict(self.budget_used),
        }
        if self.state_full is not None:
            state: dict[str, Any] = {"full": self.state_full}
            if self.state_chunks:
                state["chunks"] = {name: [ref.to_list() for ref in refs] for name, refs in self.state_chunks.items()}
            out["state"] = state
            out["format"] = self.format if self.format is not None else FORMAT
        else:
            out["state"] = {"delta": list(self.state_delta)}
            if self.format is not None:
                out["format"] = self.format
        if self.lifecycle is not None:
            out["lifecycle"] = self.lifecycle
        if self.stop_reason is not None:
            out["stop_reason"] = self.stop_reason
        if self.pause_position:
            out["pause_position"] = self.pause_position
        if self.run_id is not None:
            out["run_id"] = self.run_id
        if self.trace is not None:
            out["trace"] = dict(self.trace)
        if self.log is not None:
            log = self.log
            mark: dict[str, Any] = {"log_id": log.log_id, "position": log.position, "digest": log.digest}
            if log.chunks is not None:
                mark["chunks"] = list(log.chunks)
            if log.chunk is not None:
                mark["chunk"] = log.chunk
            out["log"] = mark
        if self.request_view is not None:
            out["request_view"] = self.request_view
        if self.pending is not None:
            out["pending"] = self.pending.to_dict()
        if self.steps:
            out["step"] = [_step_json(step) for step in self.steps]
        if self.fork_of is not None:
            out["fork_of"] = {"session_id": self.fork_of.session_id, "snapshot_id": self.fork_of.snapshot_id}
        return out

    def to_bytes(self) -> bytes:
        """The canonical JSON bytes of :meth:`to_json`."""
        return canonical_json(self.to_json()).encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes | str) -> SnapshotPayload:
        """Decode stored payload bytes strictly; CodecError names what is wrong."""
        try:
            value = _DECODE(data.decode("utf-8") if isinstance(data, bytes) else data)
        except ValueError as exc:  # UnicodeDecodeError is a ValueError
            raise CodecError("payload", f"not JSON: {exc}") from exc
        return cls.from_json(value)

    @classmethod
    def from_json(cls, data: Any) -> SnapshotPayload:
        """The record of a decoded payload, checked field by field; CodecError names the first
        field that is unknown, missing or of the wrong type."""
        p = _Reader(_object(data, "payload"), "payload")
        p.refuse_unknown(_PAYLOAD_KEYS)
        state = p.mapping("state")
        if state is None:
            raise CodecError("payload.state", "missing")
        s = _Reader(state, "payload.state")
        s.refuse_unknown(_STATE_KEYS)
        full = s.mapping("full")
        fmt = p.optional_number("format")
        if full is not None:
            if "delta" in state:
                raise CodecError("payload.state", "holds both a full state and a delta")
            if fmt not in READABLE_FORMATS:
                raise CodecError(
                    "payload.format",
                    f"format {fmt!r} is not one this qitos reads ({sorted(READABLE_FORMATS)}); a newer qitos wrote it",
                )
            chunks = _chunk_table(s.mapping("chunks") or {})
            delta: Sequence[Mapping[str, Any]] = ()
        else:
            if "chunks" in state:
                raise CodecError("payload.state.chunks", "a delta holds no runs")
            delta = _ops(state.get("delta"))
            chunks = {}
        return cls(
            step_id=p.number("step_id"),
            control_position=p.optional_number("control_position") or 0,
            budget_used=_budget(p.mapping("budget_used") or {}),
            lifecycle=p.text("lifecycle"),
            stop_reason=p.text("stop_reason"),
            pause_position=p.optional_number("pause_position") or 0,
            run_id=p.text("run_id"),
            trace=_strings(p.mapping("trace"), "payload.trace"),
            state_full=full,
            state_chunks=chunks,
            state_delta=delta,
            log=_log_mark(p.mapping("log")),
            request_view=p.text("request_view"),
            pending=_pending(p.mapping("pending")),
            steps=_steps(p.items("step")),
            fork_of=_fork_origin(p.mapping("fork_of")),
            format=fmt,
        )

    @classmethod
    def of(cls, snapshot: SessionSnapshot) -> SnapshotPayload:
        """The payload record of a session snapshot; SnapshotIntegrityError names the snapshot
        when its (verified) payload is not a session payload this version reads."""
        try:
            return cls.from_json(snapshot.payload)
        except CodecError as exc:
            raise SnapshotIntegrityError(
                snapshot.snapshot_id, f"its payload is not a session payload: {exc}", session_id=snapshot.session_id
            ) from exc


_PAYLOAD_KEYS: Final = frozenset(
    {
        "step_id",
        "control_position",
        "budget_used",
        "lifecycle",
        "stop_reason",
        "pause_position",
        "run_id",
        "trace",
        "state",
        "log",
        "request_view",
        "pending",
        "step",
        "fork_of",
        "format",
    }
)
_STATE_KEYS: Final = frozenset({"full", "chunks", "delta"})
_LOG_KEYS: Final = frozenset({"log_id", "position", "digest", "chunks", "chunk"})
_STEP_KEYS: Final = frozenset({"step_id", "mode", "calls", "model"})
_CALL_KEYS: Final = frozenset({"call_id", "tool", "ok", "error_kind"})
_FORK_KEYS: Final = frozenset({"session_id", "snapshot_id"})


class _Reader:
    """Typed reads of one JSON object's fields; a value of the wrong type raises CodecError naming it.

    A field holding ``null`` reads as absent (earlier versions wrote nulls for empty fields).
    """

    __slots__ = ("data", "path")

    def __init__(self, data: Mapping[str, Any], path: str) -> None:
        self.data = data
        self.path = path

    def refuse_unknown(self, known: frozenset[str]) -> None:
        unknown = self.data.keys() - known
        if unknown:
            raise CodecError(self.path, f"unknown field(s) {sorted(unknown)} (written by a newer qitos?)")

    def number(self, key: str) -> int:
        value = self.data.get(key)
        if type(value) is not int:
            raise CodecError(f"{self.path}.{key}", f"expected an int, got {_kind(value)}")
        return value

    def optional_number(self, key: str) -> int | None:
        return None if self.data.get(key) is None else self.number(key)

    def text(self, key: str) -> str | None:
        value = self.data.get(key)
        if value is None or type(value) is str:
            return value
        raise CodecError(f"{self.path}.{key}", f"expected a string, got {_kind(value)}")

    def mapping(self, key: str) -> dict[str, Any] | None:
        value = self.data.get(key)
        return None if value is None else _object(value, f"{self.path}.{key}")

    def items(self, key: str) -> list[Any]:
        value = self.data.get(key)
        if value is None:
            return []
        if type(value) is not list:
            raise CodecError(f"{self.path}.{key}", f"expected a list, got {_kind(value)}")
        return value


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _object(value: Any, path: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise CodecError(path, f"expected an object, got {_kind(value)}")
    return value


def _budget(data: dict[str, Any]) -> dict[str, int | float]:
    for key, value in data.items():
        if type(value) not in (int, float):
            raise CodecError(f"payload.budget_used.{key}", f"expected a number, got {_kind(value)}")
    return data


def _strings(data: dict[str, Any] | None, path: str) -> dict[str, str] | None:
    if data is None:
        return None
    for key, value in data.items():
        if type(value) is not str:
            raise CodecError(f"{path}.{key}", f"expected a string, got {_kind(value)}")
    return data


def _ops(value: Any) -> list[Mapping[str, Any]]:
    if value is None:
        raise CodecError("payload.state", "holds neither a full state nor a delta")
    if type(value) is not list:
        raise CodecError("payload.state.delta", f"expected a list, got {_kind(value)}")
    for index, op in enumerate(value):
        if type(op) is not dict or type(op.get("op")) is not str or type(op.get("field")) is not str:
            raise CodecError(f"payload.state.delta[{index}]", "expected a change {op, field, ...}")
    return value


def _chunk_table(data: dict[str, Any]) -> dict[str, tuple[ChunkRef, ...]]:
    table = {}
    for name, refs in data.items():
        try:
            table[name] = tuple(parse_refs(refs))
        except ValueError as exc:
            raise CodecError(f"payload.state.chunks.{name}", str(exc)) from exc
    return table


def _log_mark(data: dict[str, Any] | None) -> LogMark | None:
    if data is None:
        return None
    r = _Reader(data, "payload.log")
    r.refuse_unknown(_LOG_KEYS)
    chunks = data.get("chunks")
    if chunks is not None and (type(chunks) is not list or any(type(c) is not str for c in chunks)):
        raise CodecError("payload.log.chunks", "expected a list of blob ids")
    log_id, digest = r.text("log_id"), r.text("digest")
    if log_id is None or digest is None:
        raise CodecError("payload.log", "needs a log_id and a digest")
    return LogMark(
        log_id=log_id,
        position=r.number("position"),
        digest=digest,
        chunks=None if chunks is None else tuple(chunks),
        chunk=r.text("chunk"),
    )


def _pending(data: dict[str, Any] | None) -> PendingStep | None:
    if data is None:
        return None
    try:
        return PendingStep.from_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise CodecError("payload.pending", f"not an unfinished step: {exc!r}") from exc


def _steps(items: list[Any]) -> tuple[StepSummary, ...]:
    steps = []
    for index, item in enumerate(items):
        path = f"payload.step[{index}]"
        r = _Reader(_object(item, path), path)
        r.refuse_unknown(_STEP_KEYS)
        calls = []
        for number, call in enumerate(r.items("calls")):
            where = f"{path}.calls[{number}]"
            c = _Reader(_object(call, where), where)
            c.refuse_unknown(_CALL_KEYS)
            ok = call.get("ok")
            call_id, tool = c.text("call_id"), c.text("tool")
            if type(ok) is not bool or call_id is None or tool is None:
                raise CodecError(where, "needs a call_id, a tool and ok")
            calls.append(CallSummary(call_id=call_id, tool=tool, ok=ok, error_kind=c.text("error_kind")))
        mode = r.text("mode")
        if mode is None:
            raise CodecError(f"{path}.mode", "missing")
        steps.append(StepSummary(step_id=r.number("step_id"), mode=mode, calls=tuple(calls), model=r.mapping("model")))
    return tuple(steps)


def _step_json(step: StepSummary) -> dict[str, Any]:
    out: dict[str, Any] = {"step_id": step.step_id, "mode": step.mode}
    if step.calls:
        out["calls"] = [
            {"call_id": c.call_id, "tool": c.tool, "ok": c.ok, "error_kind": c.error_kind} for c in step.calls
        ]
    if step.model is not None:
        out["model"] = dict(step.model)
    return out


def _fork_origin(data: dict[str, Any] | None) -> ForkOrigin | None:
    if data is None:
        return None
    r = _Reader(data, "payload.fork_of")
    r.refuse_unknown(_FORK_KEYS)
    session_id, snapshot_id = r.text("session_id"), r.text("snapshot_id")
    if session_id is None or snapshot_id is None:
        raise CodecError("payload.fork_of", "needs a session_id and a snapshot_id")
    return ForkOrigin(session_id=session_id, snapshot_id=snapshot_id)
