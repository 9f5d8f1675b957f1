"""The live terminal renderer, driven by real engine runs."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from qitos import Engine
from qitos.cli._render import LiveRenderer, preview
from qitos.demo._notes_agent import NotesAgent, prepare_workspace, scripted_model_responses
from qitos.engine._model_path import ModelContext
from qitos.kit.context.compaction import ClosedExchangeWindowCompactor
from qitos.models._scripted import ScriptedModel


def _console(*, terminal: bool) -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=terminal, width=120, markup=False, highlight=False), buffer


class _Recording(LiveRenderer):
    """Keeps what the live region showed while the run was going (to check progress and streaming)."""

    def __init__(self, console: Console) -> None:
        super().__init__(console, max_tokens=1000)
        self.frames: list[str] = []

    def on_event(self, event: object) -> None:
        super().on_event(event)
        if self._live is not None:
            capture = Console(file=io.StringIO(), width=120, markup=False)
            capture.print(self._live_view())
            self.frames.append(capture.file.getvalue())  # type: ignore[attr-defined]


def test_live_mode_shows_steps_progress_budget_and_streamed_model_text(tmp_path: Path) -> None:
    root, _ = prepare_workspace(tmp_path / "ws")
    console, buffer = _console(terminal=True)
    renderer = _Recording(console)
    model = ScriptedModel(scripted_model_responses(root), max_input_units=2400)
    engine = Engine(
        NotesAgent(root, policy="model"),
        model=model,
        hooks=[renderer],
        context=ModelContext(compaction_policy=ClosedExchangeWindowCompactor()),
    )
    result = engine.run("Index")
    out = buffer.getvalue()
    assert "\x1b[" in out  # styled on a terminal
    assert "step  0" in out and "list_files" in out
    assert "context " in out and "characters" in out
    assert "context compacted" in out and "cmp-" in out
    assert "completed" in out and "answer:" in out
    frames = renderer.frames
    assert any("step 3/24" in f for f in frames)
    assert any("1,000 left" in f for f in frames)
    assert result.state.stop_reason == "final"
    assert renderer._live is None  # stopped at run_end


def test_live_mode_shows_the_model_text_while_it_streams(tmp_path: Path) -> None:
    root, _ = prepare_workspace(tmp_path / "ws")
    console, buffer = _console(terminal=True)
    renderer = _Recording(console)
    model = ScriptedModel(["I would rather answer now: there are five notes."])
    result = Engine(NotesAgent(root, policy="model"), model=model, hooks=[renderer]).run("Index")
    assert result.state.final_result == "I would rather answer now: there are five notes."
    streamed = [f for f in renderer.frames if "there are five" in f]
    assert streamed, "model_delta text must show in the live region while it arrives"
    assert "answer:" in buffer.getvalue()


def test_plain_mode_is_one_line_per_step_and_result_without_styles(tmp_path: Path) -> None:
    root, _ = prepare_workspace(tmp_path / "ws")
    console, buffer = _console(terminal=False)
    Engine(NotesAgent(root), hooks=[LiveRenderer(console)]).run("Index")
    out = buffer.getvalue()
    assert "\x1b[" not in out
    lines = out.splitlines()
    step_lines = [line for line in lines if line.startswith("step ")]
    assert len(step_lines) == 8
    assert any(line.strip().startswith("ok  read_file: # Context budgets | tags: context, budget") for line in lines)


def test_tool_output_with_markup_is_printed_literally(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "evil.md").write_text("# [bold red]Evil[/bold red]\n\n[link=x]y[/link]\n", encoding="utf-8")
    console, buffer = _console(terminal=True)
    Engine(NotesAgent(tmp_path / "ws"), hooks=[LiveRenderer(console)]).run("Index")
    assert "[bold red]Evil[/bold red]" in buffer.getvalue()


def test_preview_truncates_and_counts_lines() -> None:
    assert preview("a\nb\n\nc", 100) == "a | b | c"
    assert preview("x" * 50, 10) == "x" * 9 + "…"
    assert preview("one\ntwo\nthree", 100, max_lines=2) == "one\ntwo… (3 lines)"
    assert preview({"k": [1, 2]}, 100) == '{"k": [1, 2]}'
