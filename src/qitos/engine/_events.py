"""What a run emits: ``EngineEvent``s, ``StepRecord``s, the ``EngineResult``, and ``EventStream``.

``EventStream`` hands events from the engine's thread to asyncio consumers. Each ``subscribe()``
queue is bounded (``max_queue``, default 10,000). The drop rule: when a consumer's queue is full,
that consumer's oldest *droppable* event (``model_delta``) is discarded first; if none is droppable
the event is still delivered (the queue grows past its bound) so no lifecycle event is ever lost;
``dropped`` counts discards. A slow consumer never blocks the engine or the other consumers.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Generic, NamedTuple, TypeVar

from qitos.core._decision import Decision, Observation
from qitos.core._task import TaskResult

__all__ = [
    "EngineEvent",
    "EngineEventType",
    "EngineResult",
    "EventStream",
    "RuntimeEvent",
    "RuntimePhase",
    "StepRecord",
]

StateT = TypeVar("StateT")
_now = time.time


class EngineEventType(StrEnum):
    """Kinds of engine events.

    ``model_request`` and ``model_response`` bracket each model call of the model path (the
    response event has ``ok=False`` and ``error`` when the call raised).
    """

    STEP_START = "step_start"
    STEP_END = "step_end"
    DECIDE = "decide"
    ACT = "act"
    REDUCE = "reduce"
    CRITIC = "critic"
    CHECK_STOP = "check_stop"
    HANDOFF = "handoff"
    DELEGATE = "delegate"
    FANOUT = "fanout"
    ERROR = "error"
    RUN_START = "run_start"
    RUN_END = "run_end"
    MODEL_DELTA = "model_delta"
    MODEL_RETRY = "model_retry"
    MODEL_REQUEST = "model_request"
    MODEL_RESPONSE = "model_response"
    TOOL_CALL = "tool_call"
    PAUSE = "pause"
    STEER = "steer"
    APPROVAL = "approval"
    COMPACTION = "compaction"
    CHECKPOINT = "checkpoint"


class RuntimePhase(StrEnum):
    """Where in the loop something happened."""

    INIT = "init"
    BOUNDARY = "boundary"
    DECIDE = "decide"
    BRANCH = "branch"
    ACT = "act"
    REDUCE = "reduce"
    CRITIC = "critic"
    CHECK_STOP = "check_stop"
    COMMIT = "commit"
    END = "end"


class _EngineEventFields(NamedTuple):
    event_type: EngineEventType
    step_id: int
    agent_id: str | None
    phase: RuntimePhase | None
    ok: bool
    payload: dict[str, Any]
    error: str | None
    ts_epoch: float


class EngineEvent(_EngineEventFields):
    """One structured event (immutable). ``ts`` is an ISO-8601 UTC string derived from ``ts_epoch``.

    Fields: ``event_type``, ``step_id`` (0), ``agent_id`` (None), ``phase`` (None), ``ok`` (True),
    ``payload`` ({}), ``error`` (None), ``ts_epoch`` (now).
    """

    __slots__ = ()

    def __new__(
        cls,
        event_type: EngineEventType,
        step_id: int = 0,
        agent_id: str | None = None,
        phase: RuntimePhase | None = None,
        ok: bool = True,
        payload: dict[str, Any] | None = None,
        error: str | None = None,
        ts_epoch: float | None = None,
    ) -> EngineEvent:
        return tuple.__new__(
            cls,
            (
                event_type,
                step_id,
                agent_id,
                phase,
                ok,
                {} if payload is None else payload,
                error,
                _now() if ts_epoch is None else ts_epoch,
            ),
        )

    @property
    def ts(self) -> str:
        """The event time as ISO-8601 UTC."""
        return datetime.fromtimestamp(self.ts_epoch, UTC).isoformat()

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form (payload values are expected to be JSON-native)."""
        data: dict[str, Any] = {
            "event_type": self.event_type.value,
            "step_id": self.step_id,
            "ts": self.ts,
            "ok": self.ok,
        }
        if self.agent_id is not None:
            data["agent_id"] = self.agent_id
        if self.phase is not None:
            data["phase"] = self.phase.value
        if self.payload:
            data["payload"] = self.payload
        if self.error is not None:
            data["error"] = self.error
        return data


RuntimeEvent = EngineEvent
"""The older name of the events in ``EngineResult.events``, kept so code written against it runs; they are
EngineEvents."""


@dataclass(slots=True)
class StepRecord:
    """What happened in one committed step."""

    step_id: int
    decision: Decision[Any]
    observation: Observation
    state_diff: list[dict[str, Any]]
    started_at: float
    duration_ms: float = 0.0
    model: Mapping[str, Any] | None = None
    request_view: Mapping[str, Any] | None = None
    critics: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form, as written to ``steps.jsonl``.

        Each value appears once: the tool results under ``results``, and ``observation`` holds
        only what else the agent observed (``feedback``, ``env``).
        """
        observation = self.observation.to_dict()
        observation.pop("results", None)
        data: dict[str, Any] = {
            "step_id": self.step_id,
            "started_at": datetime.fromtimestamp(self.started_at, UTC).isoformat(),
            "duration_ms": round(self.duration_ms, 3),
            "decision": self.decision.to_dict(),
            "actions": [a.to_dict() for a in self.decision.actions],
            "results": [r.to_dict() for r in self.observation.results],
            "observation": observation,
            "state_diff": self.state_diff,
        }
        if self.model is not None:
            data["model"] = dict(self.model)
        if self.request_view is not None:
            data["request_view"] = dict(self.request_view)
        if self.critics:
            data["critics"] = self.critics
        if self.stop_reason is not None:
            data["stop_reason"] = self.stop_reason
        return data


@dataclass
class EngineResult(Generic[StateT]):
    """The outcome of a run: final state, step records, all events, step count, task result."""

    state: StateT
    records: list[StepRecord]
    events: list[EngineEvent]
    step_count: int
    task_result: TaskResult | None = None
    run_id: str | None = None
    run_dir: str | None = None


_DROPPABLE = frozenset({EngineEventType.MODEL_DELTA})
_CLOSED = object()


class _UnboundQueue(asyncio.Queue[Any]):
    """The queue of a subscription made outside a running event loop.

    It learns its consumer's loop when first awaited; until then there is no waiter to wake, so
    an event is put straight in (from any thread, under the subscriber's lock), and afterwards it
    is delivered on that loop like any other subscription's.
    """

    def __init__(self, lock: threading.Lock) -> None:
        super().__init__()
        self.lock = lock
        self.consumer: asyncio.AbstractEventLoop | None = None

    async def get(self) -> Any:
        with self.lock:
            if self.consumer is None:
                self.consumer = asyncio.get_running_loop()
        return await super().get()


class _Subscriber:
    def __init__(self, loop: asyncio.AbstractEventLoop | None, max_queue: int) -> None:
        self.loop = loop
        self.unbound = _UnboundQueue(threading.Lock()) if loop is None else None
        self.queue: asyncio.Queue[Any] = self.unbound if self.unbound is not None else asyncio.Queue()
        self.max_queue = max_queue
        self.dropped = 0

    def send(self, item: object) -> None:
        """Deliver ``item`` from any thread: on the consumer's loop once there is one."""
        consumer = self.loop
        if self.unbound is not None:
            with self.unbound.lock:
                consumer = self.unbound.consumer
                if consumer is None:
                    self.deliver(item)
                    return
        if consumer is not None:
            _call_on_loop(consumer, self.deliver, item)

    def deliver(self, item: object) -> None:
        # Runs on the consumer's loop thread.
        queue = self.queue
        if item is not _CLOSED and queue.qsize() >= self.max_queue:
            self._drop_one_delta()
        queue.put_nowait(item)

    def _drop_one_delta(self) -> None:
        items: deque[Any] = deque()
        dropped = False
        while not self.queue.empty():
            item = self.queue.get_nowait()
            if not dropped and isinstance(item, EngineEvent) and item.event_type in _DROPPABLE:
                dropped = True
                self.dropped += 1
                continue
            items.append(item)
        for item in items:
            self.queue.put_nowait(item)


class EventStream:
    """An async-compatible event queue with thread-safe ``emit`` and fan-out ``subscribe``."""

    def __init__(self, *, max_queue: int = 10_000) -> None:
        self._lock = threading.Lock()
        self._subscribers: list[_Subscriber] = []
        self._closed = False
        self._max_queue = max_queue
        self._history: list[EngineEvent] = []

    def subscribe(self) -> asyncio.Queue[Any]:
        """A new queue receiving every event emitted from now on; ``None`` marks the end.

        Called from a running event loop, the queue delivers on that loop. Called outside one (plain
        synchronous code), events wait in the queue (``get_nowait`` reads them) until the queue is
        first awaited, and from then on are delivered on the loop that awaited it.
        """
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        sub = _Subscriber(loop, self._max_queue)
        with self._lock:
            if self._closed:
                for event in self._history:
                    sub.queue.put_nowait(event)
                sub.queue.put_nowait(None)
            else:
                self._subscribers.append(sub)
        return sub.queue

    @property
    def dropped(self) -> int:
        """How many droppable events were discarded across all subscribers."""
        return sum(s.dropped for s in self._subscribers)

    def emit(self, event: EngineEvent) -> None:
        """Send ``event`` to every subscriber. Safe from any thread; never blocks."""
        with self._lock:
            if self._closed:
                return
            self._history.append(event)
            subscribers = list(self._subscribers)
        for sub in subscribers:
            sub.send(event)

    emit_sync = emit

    def close(self) -> None:
        """Signal the end of the stream to every subscriber."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            subscribers = list(self._subscribers)
        for sub in subscribers:
            sub.send(None)

    async def __aiter__(self) -> AsyncIterator[EngineEvent]:
        queue = self.subscribe()
        while True:
            item = await queue.get()
            if item is None:
                return
            yield item


def _call_on_loop(loop: asyncio.AbstractEventLoop, fn: Any, arg: Any) -> None:
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        fn(arg)
    elif not loop.is_closed():
        loop.call_soon_threadsafe(fn, arg)
