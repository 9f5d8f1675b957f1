"""``LiveRenderer``: shows a run in the terminal as it happens (an :class:`EngineHook`).

For each step it prints the decision, the tool calls and their results (truncated), the tokens
used and the context budget of the model request, and keeps a progress bar toward ``max_steps``
with the model's text streaming in as it arrives (``model_delta`` events).

On a terminal the output is styled and live; otherwise (a pipe, a file, CI) it is plain and quiet:
one line per step and one per tool result, no progress bar, no streamed text. The engine emits
events; this class only renders them (nothing renders inside the loop). Text from the run is always
printed as text, never interpreted as rich markup.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from qitos.core._errors import ConfigurationError
from qitos.engine._events import EngineEvent, EngineEventType
from qitos.engine._hooks import EngineHook, HookContext
from qitos.engine._progress import preview

__all__ = ["THEMES", "LiveRenderer", "preview"]

THEMES = ("research", "mono")
"""The renderer's themes: ``research`` (the default: colours) and ``mono`` (bold/dim/italic only)."""
_MONO_ATTRIBUTES = frozenset({"bold", "dim", "italic"})

E = EngineEventType

_STATUS_STYLE = {"completed": "bold green", "stopped": "bold yellow", "failed": "bold red"}


def _call_label(action: Any, limit: int = 48) -> str:
    args = ", ".join(
        f"{k}={preview(v, 32)}" if not isinstance(v, str) else f"{k}={preview(json.dumps(v), 32)}"
        for k, v in dict(action.args).items()
    )
    label = f"{action.name}({args})"
    return label if len(label) <= limit + len(action.name) else label[: limit + len(action.name) - 1] + "…)"


class LiveRenderer(EngineHook):
    """Render a run on ``console``.

    Args:
        console: where to print (its ``is_terminal`` decides live vs plain unless ``live`` is given).
        live: force live (styled, progress bar, streaming) or plain output.
        max_result_chars: how much of each tool result to show.
        max_tokens: the token budget, to show what is left (None: not shown).
        theme: one of :data:`THEMES` (``AgentModule.run(render=..., theme=...)`` sets it).
    """

    def __init__(
        self,
        console: Console,
        *,
        live: bool | None = None,
        max_result_chars: int = 240,
        max_tokens: int | None = None,
        theme: str = "research",
    ) -> None:
        self.theme = theme
        self.console = console
        self.live = console.is_terminal if live is None else live
        self.max_result_chars = max_result_chars
        self.max_tokens = max_tokens
        self.max_steps = 0
        self.steps_done = 0
        self.first_step = 0
        self.tokens = 0
        self.status = ""
        self.streamed = ""
        self.final_status: str | None = None
        self._live: Live | None = None
        self._errors_shown: set[str] = set()

    @property
    def theme(self) -> str:
        """The theme in use; setting an unknown one raises ConfigurationError."""
        return self._theme

    @theme.setter
    def theme(self, value: str) -> None:
        if value not in THEMES:
            raise ConfigurationError(f"unknown theme {value!r}; the renderer has {', '.join(THEMES)}")
        self._theme = value

    # ---- printing

    def _print(self, renderable: RenderableType) -> None:
        if self._live is not None:
            self._live.refresh()  # the region printed under this line shows the current progress
            self._live.console.print(renderable, highlight=False)
        else:
            self.console.print(renderable, soft_wrap=not self.live, highlight=False)

    def _style(self, style: str) -> str:
        if not self.live:
            return ""
        if self._theme == "mono":
            return " ".join(word for word in style.split() if word in _MONO_ATTRIBUTES)
        return style

    def _live_view(self) -> RenderableType:
        parts: list[RenderableType] = []
        if self.streamed:
            tail = "\n".join(self.streamed.splitlines()[-6:])
            parts.append(Text(tail[-600:], style=self._style("italic dim cyan")))
        total = max(self.max_steps, 1)
        row = Table.grid(padding=(0, 1))
        row.add_row(
            ProgressBar(total=total, completed=min(self.steps_done, total), width=30),
            Text(f"step {self.steps_done}/{self.max_steps}", style="bold"),
            Text(self._token_text(), style="dim"),
            Text(self.status, style=self._style("cyan")),
        )
        parts.append(row)
        return Group(*parts)

    def _token_text(self) -> str:
        if self.max_tokens:
            return f"{self.tokens:,} tokens ({max(0, self.max_tokens - self.tokens):,} left)"
        return f"{self.tokens:,} tokens"

    # ---- hooks

    def on_run_start(self, ctx: HookContext) -> None:
        """Remember the step limit; start the live display."""
        self.max_steps = int(getattr(ctx.state, "max_steps", 0) or 0)
        self.steps_done = int(getattr(ctx.state, "current_step", 0) or 0)
        self.first_step = self.steps_done  # a resumed session run starts past 0
        self.tokens = 0
        if self.live and self._live is None:
            self._live = Live(
                console=self.console,
                get_renderable=self._live_view,
                refresh_per_second=8,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()

    def on_event(self, event: Any) -> None:
        """Render one engine event."""
        if not isinstance(event, EngineEvent):
            return
        kind = event.event_type
        payload = event.payload
        if kind is E.RUN_START:
            resumed = " (resumed)" if payload.get("resumed") else ""
            header = Text.assemble(
                ("run ", self._style("bold")),
                (str(payload.get("run_id", "")), self._style("bold cyan")),
                resumed,
                "  ",
                (preview(payload.get("task") or "", 100), self._style("italic")),
            )
            self._print(header)
        elif kind is E.STEP_START:
            self.status = f"step {event.step_id}: deciding"
            self.streamed = ""
        elif kind is E.MODEL_DELTA and self.live:
            self.streamed += str(payload.get("text", ""))
        elif kind is E.DECIDE:
            self.status = f"step {event.step_id}: {payload.get('mode', '')}"
        elif kind is E.TOOL_CALL:
            self.status = f"step {event.step_id}: {payload.get('tool', '')} done"
        elif kind is E.COMPACTION:
            ids = payload.get("input_exchange_ids") or []
            self._print(
                Text(
                    f"  context compacted: {len(ids)} exchange(s) omitted by {payload.get('policy_id')} "
                    f"(receipt {payload.get('receipt_id')})",
                    style=self._style("yellow"),
                )
            )
        elif kind is E.MODEL_RETRY:
            self._print(
                Text(
                    f"  model retry {payload.get('attempt')}/{payload.get('max_retries')}: "
                    f"{payload.get('reason', '')} (waiting {payload.get('delay_s', '?')} s)",
                    style=self._style("yellow"),
                )
            )
            if payload.get("hint"):
                self._print(Text(f"  hint: {payload['hint']}", style=self._style("yellow")))
        elif kind is E.ERROR:
            self._errors_shown.add(event.error or "")
            self._print(Text(f"  error: {preview(event.error or '', 400, max_lines=3)}", style=self._style("red")))
        elif kind is E.PAUSE:
            self._print(Text(f"  paused ({payload.get('by') or payload.get('before_call') or 'requested'})"))
        elif kind is E.STEER:
            self._print(
                Text(f"  steering taken in: {preview(payload.get('text', ''), 120)}", style=self._style("magenta"))
            )
        elif kind is E.APPROVAL:
            if payload.get("status") == "pending":
                self._print(
                    Text(
                        f"  awaiting approval: {payload.get('tool')} call {payload.get('call_id')} "
                        f"{preview(payload.get('args') or {}, 120)}",
                        style=self._style("bold yellow"),
                    )
                )
            else:
                self._print(Text(f"  call {payload.get('call_id')} {payload.get('status')}"))
        elif kind is E.RUN_END:
            self._end(event)

    def on_step_end(self, ctx: HookContext) -> None:
        """Print the committed step: decision, calls, results, tokens and context budget."""
        record = ctx.record
        if record is None:
            return
        self.steps_done = ctx.step_id + 1
        decision = record.decision
        tokens = 0
        if record.model:
            usage = (record.model.get("response") or {}).get("usage") or {}
            tokens = int(usage.get("input_tokens", 0) or 0) + int(usage.get("output_tokens", 0) or 0)
            self.tokens += tokens
        what = "; ".join(_call_label(a) for a in decision.actions)
        if decision.mode == "final":
            what = "final answer"
        elif decision.mode == "wait":
            what = preview(decision.rationale or "wait", 100)
        line = Text.assemble(
            (f"step {record.step_id:>2} ", self._style("bold")),
            (f"{decision.mode:<5} ", self._style("magenta")),
            (what, self._style("")),
            (f"  {record.duration_ms:.0f} ms", self._style("dim")),
        )
        self._print(line)
        if self.live and decision.rationale and decision.mode != "wait":
            self._print(Text(f"        {preview(decision.rationale, 160)}", style="dim italic"))
        for result in record.observation.results:
            mark = "ok " if result.ok else "ERR"
            body = result.output if result.ok else f"{result.error_kind}: {result.error}"
            text = preview(body if body is not None else "", self.max_result_chars, max_lines=3 if self.live else 1)
            self._print(
                Text.assemble(
                    ("        ", ""),
                    (mark, self._style("green" if result.ok else "bold red")),
                    (f" {result.name}: ", self._style("bold")),
                    (text.replace("\n", "\n" + " " * 12), self._style("dim" if result.ok else "red")),
                )
            )
        if record.observation.feedback:
            self._print(
                Text(f"        feedback: {preview(record.observation.feedback, 200)}", style=self._style("yellow"))
            )
        facts = []
        if tokens:
            facts.append(f"{tokens:,} tokens (total {self._token_text()})")
        view = record.request_view
        if view:
            units = view.get("units") or {}
            facts.append(f"context {units.get('used', 0):,}/{units.get('available', 0):,} {view.get('unit', '')}")
            receipts = view.get("receipts") or []
            if receipts:
                facts.append(f"{len(receipts)} compaction receipt(s)")
        if self.max_steps:
            facts.append(f"{max(0, self.max_steps - self.steps_done)} step(s) left")
        if facts and (self.live or tokens or view):
            self._print(Text("        " + " · ".join(facts), style=self._style("dim")))
        self.streamed = ""

    def _end(self, event: EngineEvent) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        payload = event.payload
        status = str(payload.get("status") or "")
        self.final_status = status
        # The run's own steps and tokens (a resumed session run also names the session's step count).
        total = int(payload.get("steps", self.steps_done) or 0)
        own = f"{max(0, total - self.first_step)} step(s)"
        if self.first_step:
            own += f" (step {total} of the session)"
        summary = Text.assemble(
            (f"{status or 'ended'}", self._style(_STATUS_STYLE.get(status, "bold"))),
            f" · {payload.get('stop_reason')} · {own} · {self._token_text()}",
        )
        self._print(summary)
        if event.error and event.error not in self._errors_shown:  # each error is printed once
            self._print(Text(f"error: {event.error}", style=self._style("red")))
        final = payload.get("final_result")
        if final:
            self._print(Text("answer:", style=self._style("bold green")))
            self._print(Text(str(final)))

    def close(self) -> None:
        """Stop the live display if a run ended without ``run_end`` (never leaves the terminal dirty)."""
        if self._live is not None:
            self._live.stop()
            self._live = None
