"""The demo agent: a real multi-step agent over workspace file tools, in both policies."""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from qitos import Engine
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.core._decision import Action, Decision, Observation
from qitos.core._errors import ConfigurationError
from qitos.core._tool import ToolResult
from qitos.demo import NotesAgent, NotesState
from qitos.demo._notes_agent import (
    INDEX_FILE,
    bundled_note_paths,
    parse_note,
    prepare_workspace,
    render_index,
    scripted_model_responses,
)
from qitos.engine._composition import compose
from qitos.engine._model_path import ModelContext
from qitos.kit.context.compaction import ClosedExchangeWindowCompactor
from qitos.models._scripted import ScriptedModel


def _bundle_digest() -> str:
    root = resources.files("qitos.demo").joinpath("workspace")
    h = hashlib.sha256()
    for rel in bundled_note_paths():
        node = root
        for part in rel.split("/"):
            node = node.joinpath(part)
        h.update(rel.encode() + b"\0" + node.read_bytes())
    return h.hexdigest()


def test_bundled_workspace_holds_a_few_markdown_notes_including_a_nested_one() -> None:
    paths = bundled_note_paths()
    assert len(paths) >= 4
    assert all(p.endswith(".md") for p in paths)
    assert any("/" in p for p in paths)


def test_prepare_workspace_copies_the_bundle_into_an_empty_dir_and_never_touches_package_data(tmp_path: Path) -> None:
    before = _bundle_digest()
    root, copied = prepare_workspace(tmp_path / "ws")
    assert copied
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*.md")) == bundled_note_paths()
    (root / "engine-loop.md").write_text("changed", encoding="utf-8")
    assert _bundle_digest() == before


def test_prepare_workspace_uses_a_non_empty_dir_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "mine.md").write_text("# Mine\n\nMy own note.\n", encoding="utf-8")
    root, copied = prepare_workspace(tmp_path)
    assert not copied
    assert [p.name for p in root.iterdir()] == ["mine.md"]


def test_prepare_workspace_refuses_a_file_path(tmp_path: Path) -> None:
    target = tmp_path / "file.txt"
    target.write_text("x", encoding="utf-8")
    with pytest.raises(ConfigurationError, match="not a directory"):
        prepare_workspace(target)


def test_scripted_policy_lists_reads_each_note_writes_the_index_and_answers(tmp_path: Path) -> None:
    root, _ = prepare_workspace(tmp_path / "ws")
    result = Engine(NotesAgent(root)).run("Index the notes")
    notes = bundled_note_paths()
    assert result.state.stop_reason == "final"
    assert result.step_count == len(notes) + 3  # list, one read per note, write, answer
    reads = [
        r.decision.actions[0].args["path"]
        for r in result.records
        if r.decision.actions[:1] and r.decision.actions[0].name == "read_file"
    ]
    assert reads == notes
    index = (root / INDEX_FILE).read_text(encoding="utf-8")
    assert result.state.final_result == index.rstrip("\n")
    assert f"({len(notes)} notes)" in index
    assert "- projects/garden.md: Garden planner" in index


def test_model_policy_runs_the_engine_model_path_with_the_same_reduce(tmp_path: Path) -> None:
    root, _ = prepare_workspace(tmp_path / "ws")
    model = ScriptedModel(scripted_model_responses(root), max_input_units=2400)
    engine = Engine(
        NotesAgent(root, policy="model"),
        model=model,
        context=ModelContext(compaction_policy=ClosedExchangeWindowCompactor()),
    )
    result = engine.run("Index the notes")
    notes = bundled_note_paths()
    assert result.state.stop_reason == "final"
    assert len(model.requests) == 1 + len(notes)  # list, then one read per note: the model's turns
    assert [r.model is not None for r in result.records] == [True] * (1 + len(notes)) + [False, False]
    assert [n.path for n in result.state.notes] == sorted(notes, reverse=True)  # the model's order
    assert result.state.index_written
    assert result.state.final_result == render_index(result.state.notes).rstrip("\n")
    receipts = [rc for r in result.records for rc in (r.request_view or {}).get("receipts", [])]
    assert receipts, "a small declared capacity must force compaction with a receipt"


def test_model_mode_offers_only_the_next_tool_with_paths_narrowed_to_what_exists(tmp_path: Path) -> None:
    root, _ = prepare_workspace(tmp_path / "ws")
    notes = bundled_note_paths()
    script: list[Any] = [
        {"tool_calls": [{"name": "list_files", "arguments": {"path": ".", "recursive": True}}]},
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "invented.md"}}]},
        *({"tool_calls": [{"name": "read_file", "arguments": {"path": p}}]} for p in notes),
    ]
    model = ScriptedModel(script)
    result = Engine(NotesAgent(root, policy="model"), model=model).run("Index")
    first, second, third = (view.tools() for view in model.requests[:3])
    assert [t["name"] for t in first] == ["list_files"]
    assert first[0]["parameters"]["properties"]["path"]["enum"] == ["."]
    assert [t["name"] for t in second] == ["read_file"]
    assert second[0]["parameters"]["properties"]["path"]["enum"] == notes
    assert set(second[0]["parameters"]["properties"]) == {"path"}
    invented = result.records[1].observation.results[0]
    assert (invented.ok, invented.error_kind) == (False, "invalid_arguments")
    assert third[0]["parameters"]["properties"]["path"]["enum"] == notes
    assert model.requests[-1].tools()[0]["parameters"]["properties"]["path"]["enum"] == notes[-1:]
    assert result.state.stop_reason == "final"
    assert sorted(n.path for n in result.state.notes) == notes


def test_model_policy_without_a_model_fails_clearly(tmp_path: Path) -> None:
    root, _ = prepare_workspace(tmp_path / "ws")
    with pytest.raises(ConfigurationError, match="no model is configured"):
        Engine(NotesAgent(root, policy="model")).run("Index")


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="policy must be"):
        NotesAgent(policy="magic")  # type: ignore[arg-type]


def test_a_failed_read_is_recorded_and_the_agent_moves_on(tmp_path: Path) -> None:
    root, _ = prepare_workspace(tmp_path / "ws")
    agent = NotesAgent(root)
    state = agent.init_state("Index")
    state.listed = True
    state.files.extend(["gone.md", "sessions.md"])
    decision = agent.decide(state, Observation())
    assert decision is not None and decision.actions[0].args == {"path": "gone.md"}
    failure = ToolResult(
        call_id=decision.actions[0].id, name="read_file", ok=False, error="no file", error_kind="tool_error"
    )
    agent.reduce(state, Observation(results=(failure,)), decision)
    assert "gone.md" in state.failed
    nxt = agent.decide(state, Observation())
    assert nxt is not None and nxt.actions[0].args == {"path": "sessions.md"}


def test_no_workspace_configured_makes_a_temporary_copy_when_the_run_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QITOS_DEMO_WORKSPACE", raising=False)
    agent = NotesAgent()
    assert agent.workspace is None  # constructing has no side effect
    state = agent.init_state("Index")
    assert Path(state.workspace).is_dir()
    assert sorted(p.relative_to(state.workspace).as_posix() for p in Path(state.workspace).rglob("*.md")) == (
        bundled_note_paths()
    )


def test_a_session_restored_by_a_fresh_agent_works_on_the_recorded_workspace(tmp_path: Path) -> None:
    root, _ = prepare_workspace(tmp_path / "ws")
    store = SqliteCheckpointStore(tmp_path / "s.db")
    session = compose(agent=lambda: NotesAgent(root), store=store).session("Index")
    session.pause()
    first = session.run()
    assert first.state.stop_reason == "paused"
    # Another "process": a zero-argument agent that knows nothing about the workspace.
    other = compose(agent=NotesAgent, store=SqliteCheckpointStore(tmp_path / "s.db"))
    result = other.restore(session.session_id.value).run()
    assert result.state.stop_reason == "final"
    assert result.state.workspace == str(root)
    assert (root / INDEX_FILE).is_file()


def test_state_round_trips_through_the_strict_codec(tmp_path: Path) -> None:
    root, _ = prepare_workspace(tmp_path / "ws")
    result = Engine(NotesAgent(root)).run("Index")
    data = result.state.to_dict()
    again = NotesState.from_dict(data)
    assert again.notes == result.state.notes
    assert again.notes[0].tags == result.state.notes[0].tags


def test_parse_note_takes_title_first_sentence_and_tags() -> None:
    note = parse_note("a/b-c.md", "# Title here\n\ntags: x, y\n\nFirst sentence. Second one.\nMore.\n")
    assert (note.title, note.summary, note.tags, note.lines) == ("Title here", "First sentence.", ("x", "y"), 6)
    untitled = parse_note("plain-note.md", "just text")
    assert untitled.title == "plain note"


def test_render_index_is_sorted_and_counts_notes() -> None:
    notes = [parse_note("b.md", "# B\nbee"), parse_note("a.md", "# A\nay")]
    text = render_index(notes)
    assert text.splitlines()[0] == "# Notes index (2 notes)"
    assert text.index("a.md") < text.index("b.md")


def test_decide_is_deterministic(tmp_path: Path) -> None:
    root, _ = prepare_workspace(tmp_path / "ws")
    agent = NotesAgent(root)
    state = agent.init_state("Index")
    first = agent.decide(state, Observation())
    second = agent.decide(state, Observation())
    assert isinstance(first, Decision) and isinstance(second, Decision)
    assert [a.to_dict() | {"id": ""} for a in first.actions] == [a.to_dict() | {"id": ""} for a in second.actions]
    assert first.actions[0] == Action("list_files", {"path": ".", "recursive": True}, id=first.actions[0].id)
