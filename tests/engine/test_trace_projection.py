"""The trace is a projection of what was committed: ``steps.jsonl`` never runs ahead of
the store, and one step's line holds each tool result once. Real SQLite; both drivers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import driven
import session_agents as sa
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.engine._composition import compose
from qitos.engine._hooks import EngineHook, HookContext
from qitos.sessions._payload import SnapshotPayload
from qitos.trace._writer import TraceWriter

pytestmark = pytest.mark.usefixtures("driver")  # each test runs through both drivers


def _trace_lines(writer: TraceWriter) -> list[dict[str, Any]]:
    assert writer.run_dir is not None
    path = Path(writer.run_dir, "steps.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_in_batched_mode_the_trace_shows_only_steps_the_store_holds(tmp_path: Path) -> None:
    store = SqliteCheckpointStore(str(tmp_path / "sessions.db"))
    writer = TraceWriter(str(tmp_path / "runs"))
    seen: list[tuple[int, int, int]] = []  # (steps done, steps in the store, steps in the trace)
    sid: list[str] = []

    class Compare(EngineHook):
        def on_step_end(self, ctx: HookContext) -> None:
            head = store.get_session_head(sid[0])
            assert head is not None
            committed = SnapshotPayload.of(store.get_snapshot(head.snapshot_id)).step_id
            seen.append((ctx.step_id + 1, committed, len(_trace_lines(writer))))

    composition = compose(
        agent=lambda: sa.NotesAgent(str(tmp_path / "side.log"), tools_every=0),
        store=store,
        durability="batched",
        batch_steps=4,
        batch_ms=60_000,
        hooks=[Compare()],
        trace_writer=writer,
    )
    session = composition.session("Index notes", target=10)
    sid.append(session.session_id.value)
    result = driven.run(session)

    assert result.state.stop_reason == "final"
    assert all(traced <= committed for _, committed, traced in seen), seen
    assert any(committed < done for done, committed, _ in seen)  # the batch really buffered steps
    lines = _trace_lines(writer)
    assert [line["step_id"] for line in lines] == list(range(result.step_count))


def test_a_step_line_holds_each_tool_result_once(tmp_path: Path) -> None:
    writer = TraceWriter(str(tmp_path / "runs"))
    composition = compose(
        agent=lambda: sa.NotesAgent(str(tmp_path / "side.log")),
        store=SqliteCheckpointStore(str(tmp_path / "sessions.db")),
        trace_writer=writer,
    )
    driven.run(composition.session("Index notes", target=2))

    line = _trace_lines(writer)[0]
    assert line["results"] and "results" not in line["observation"]
    for result in line["results"]:
        text = json.dumps(result["output"])
        assert json.dumps(line["results"]).count(text) == 1
        assert json.dumps(line["observation"]).count(text) == 0
