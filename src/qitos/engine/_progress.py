"""``ProgressPrinter``: a run's progress as plain text lines, rendered from its events.

``agent.run(task, progress=True)`` and ``session.run(progress=True)`` print with one: a header when
the run starts, one line per committed step (its decision, the tool calls with ok or the error kind,
the tokens and the time it took), a line for each retry, pause, steering item, approval wait,
handoff, delegation and error as it happens, and the outcome with the answer at the end::

    run run_3f2a…  What is 2 + 3?
    step  0 act    add ok · 152 tokens · 12 ms
    step  1 final  · 171 tokens · 9 ms
    completed · final · 2 step(s) · 323 tokens
    answer: The sum is 5.

It only reads the events the engine emits (nothing renders inside the loop); it writes to
``sys.stderr`` unless given another text stream, so a program's own output on stdout stays clean.
Unlike the CLI's live renderer it needs no terminal and no extra package, and it does not ask the
model to stream (``wants_model_deltas`` is False).
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from qitos.core._errors import ConfigurationError
from qitos.engine._events import EngineEvent, EngineEventType
from qitos.engine._hooks import EngineHook

__all__ = ["ProgressPrinter", "preview", "progress_printer"]

E = EngineEventType


def preview(value: object, limit: int, *, max_lines: int = 1) -> str:
    """A short preview of ``value`` within ``limit`` characters.

    With ``max_lines=1`` the (non-blank) lines are joined with `` | `` into one line; otherwise at
    most ``max_lines`` lines are kept. A cut is marked with ``…`` and the number of lines left out.
    """
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=repr)
    lines = [line.rstrip() for line in text.strip().splitlines() if line.strip()] or [""]
    if max_lines == 1:
        out, shown = " | ".join(line.strip() for line in lines), len(lines)
    else:
        shown = min(len(lines), max_lines)
        out = "\n".join(lines[:shown])
    cut = shown < len(lines)
    if len(out) > limit:
        out, cut = out[: max(0, limit - 1)].rstrip(), True
    if cut:
        out += "…" + (f" ({len(lines)} lines)" if len(lines) > 1 else "")
    return out


class ProgressPrinter(EngineHook):
    """Prints a run's progress from its events (see the module docstring).

    Use it as an engine hook (``Engine(agent, hooks=[ProgressPrinter()])``) or as the ``on_event``
    callback of one run (``engine.run(task, on_event=ProgressPrinter())``).

    Args:
        stream: where to write (default ``sys.stderr``, looked up when each line is written).
    """

    wants_model_deltas = False

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self.tokens = 0
        self._step_started = 0.0
        self._step_tokens = 0
        self._mode = ""
        self._calls: list[str] = []

    def __call__(self, event: Any) -> None:
        self.on_event(event)

    def _line(self, text: str) -> None:
        stream = self.stream if self.stream is not None else sys.stderr
        stream.write(text + "\n")
        stream.flush()

    def on_event(self, event: Any) -> None:
        """Print what ``event`` says, if anything."""
        if not isinstance(event, EngineEvent):
            return
        kind = event.event_type
        payload = event.payload
        if kind is E.RUN_START:
            self.tokens = 0
            resumed = " (resumed)" if payload.get("resumed") else ""
            self._line(f"run {payload.get('run_id', '')}{resumed}  {preview(payload.get('task') or '', 100)}")
        elif kind is E.STEP_START:
            self._step_started, self._step_tokens, self._mode, self._calls = event.ts_epoch, 0, "", []
        elif kind is E.DECIDE:
            self._mode = str(payload.get("mode", ""))
        elif kind is E.MODEL_RESPONSE:
            usage = payload.get("usage") or {}
            self._step_tokens += int(usage.get("input_tokens", 0) or 0) + int(usage.get("output_tokens", 0) or 0)
        elif kind is E.ACT:
            calls = payload.get("calls")
            if isinstance(calls, list):
                self._calls = [
                    f"{c.get('tool')} {'ok' if c.get('ok') else c.get('error_kind') or 'failed'}" for c in calls
                ]
        elif kind is E.STEP_END:
            self.tokens += self._step_tokens
            facts = [", ".join(self._calls)] if self._calls else []
            if self._step_tokens:
                facts.append(f"{self._step_tokens:,} tokens")
            facts.append(f"{max(0.0, event.ts_epoch - self._step_started) * 1000:.0f} ms")
            self._line(f"step {event.step_id:>2} {self._mode:<6} " + " · ".join(facts))
        elif kind is E.RUN_END:
            self._end(event)
        else:
            self._note(event)

    def _note(self, event: EngineEvent) -> None:
        kind = event.event_type
        payload = event.payload
        if kind is E.MODEL_RETRY:
            self._line(
                f"  model retry {payload.get('attempt')}/{payload.get('max_retries')}: {payload.get('reason', '')} "
                f"(waiting {payload.get('delay_s', '?')} s)"
            )
            if payload.get("hint"):
                self._line(f"  hint: {payload['hint']}")
        elif kind is E.ERROR:
            self._line(f"  error: {preview(event.error or '', 400, max_lines=3)}")
        elif kind is E.PAUSE:
            self._line(f"  paused ({payload.get('by') or payload.get('before_call') or 'requested'})")
        elif kind is E.STEER:
            self._line(f"  steering taken in: {preview(payload.get('text', ''), 120)}")
        elif kind is E.APPROVAL and payload.get("status") == "pending":
            self._line(f"  awaiting approval: {payload.get('tool')} call {payload.get('call_id')}")
        elif kind is E.HANDOFF:
            self._line(f"  handoff: {payload.get('from')} -> {payload.get('to')}")
        elif kind is E.DELEGATE:
            self._line(f"  delegate {payload.get('tool')}: {payload.get('status')} ({payload.get('child_session_id')})")
        elif kind is E.COMPACTION:
            ids = payload.get("input_exchange_ids") or []
            self._line(f"  context compacted: {len(ids)} exchange(s) omitted by {payload.get('policy_id')}")

    def _end(self, event: EngineEvent) -> None:
        payload = event.payload
        steps = int(payload.get("steps", 0) or 0)
        self._line(
            f"{payload.get('status') or 'ended'} · {payload.get('stop_reason')} · {steps} step(s) · "
            f"{self.tokens:,} tokens"
        )
        if event.error:
            self._line(f"error: {preview(event.error, 400, max_lines=3)}")
        final = payload.get("final_result")
        if final:
            self._line(f"answer: {preview(final, 2000, max_lines=20)}")


def progress_printer(progress: bool | TextIO) -> ProgressPrinter | None:
    """The printer for a ``progress=`` argument: None for False, stderr for True, else that stream."""
    if progress is False or progress is None:
        return None
    if progress is True:
        return ProgressPrinter()
    if callable(getattr(progress, "write", None)):
        return ProgressPrinter(progress)
    raise ConfigurationError(f"progress= takes True, False or a text stream, got {type(progress).__name__}")
