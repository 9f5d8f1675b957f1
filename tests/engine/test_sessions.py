"""Durable sessions in one process, on real SQLite files.

Fork, retention, durability modes, integrity checks and storage growth. The cross-process and
crash tests are in ``test_session_processes.py`` and ``test_session_crash.py``.
"""

from __future__ import annotations

import os
import sqlite3
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import driven
import session_agents as sa
from qitos.checkpoint._memory_store import InMemoryCheckpointStore

# the zstd module packing compresses with (the standard library's or its backport, whichever is present)
from qitos.checkpoint._packing import unpack, zstd  # type: ignore[attr-defined]
from qitos.checkpoint._records import SnapshotNotFoundError
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.checkpoint.store import CheckpointStore
from qitos.core._agent_module import AgentModule
from qitos.core._decision import Action, Decision
from qitos.core._errors import CheckpointError, ConfigurationError, SessionNotFoundError, SnapshotIntegrityError
from qitos.core._identity import SnapshotIdentity
from qitos.core._state import StateSchema
from qitos.core._tool import ToolRegistry, tool
from qitos.engine._composition import Composition, compose
from qitos.engine._hooks import EngineHook, HookContext
from qitos.models._scripted import ScriptedModel
from qitos.sessions._payload import SnapshotPayload
from qitos.sessions._step_journal import materialize

pytestmark = pytest.mark.usefixtures("driver")  # each test runs through both drivers


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "sessions.db")


@pytest.fixture
def side(tmp_path: Path) -> str:
    return str(tmp_path / "side.log")


def _store(composition: Composition) -> CheckpointStore:
    return composition.runtime.checkpoint_store


def _head(composition: Composition, sid: str) -> str:
    head = _store(composition).get_session_head(sid)
    assert head is not None
    return head.snapshot_id


def _snapshot_at_step(composition: Composition, sid: str, step: int) -> str:
    """The newest snapshot of ``sid``'s head chain committed when ``step`` steps were done."""
    store = _store(composition)
    for snapshot_id in store.list_session_snapshots(sid):
        if SnapshotPayload.of(store.get_snapshot(snapshot_id)).step_id == step:
            return snapshot_id
    raise AssertionError(f"no snapshot at step {step}")


def _files_size(path: str) -> int:
    """The database file and its WAL."""
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


def _stored_bytes(path: str) -> int:
    with sqlite3.connect(path) as con:
        snapshots = con.execute("SELECT COALESCE(SUM(LENGTH(CAST(payload AS BLOB))), 0) FROM snapshots").fetchone()[0]
        blobs = con.execute("SELECT COALESCE(SUM(LENGTH(data)), 0) FROM blobs").fetchone()[0]
    return int(snapshots) + int(blobs)


# --------------------------------------------------------------------------- basics


def test_a_session_runs_and_inspect_reports_its_durable_head(db: str, side: str) -> None:
    composition = sa.make_composition(db, side)
    session = composition.session("Index notes", target=3)

    result = driven.run(session)

    assert result.state.final_result == "3 notes"
    inspection = session.inspect()
    assert inspection.head.snapshot_id == _head(composition, session.session_id.value)
    assert inspection.lifecycle.value == "completed"
    assert inspection.snapshot_integrity == "verified"
    assert inspection.task == "Index notes"
    assert inspection.tool_batch is None
    assert inspection.budget["used"]["steps"] == 4
    assert inspection.budget["durability"] == {"mode": "sync", "unflushed_boundaries": 0}
    assert inspection.work_graph is not None
    assert [s["work_item"] for s in inspection.work_graph["steps"]] == ["step-0", "step-1", "step-2", "step-3"]
    assert set(inspection.capabilities) == {
        "run",
        "pause",
        "steer",
        "fork",
        "inspect",
        "approve",
        "cross_process_restore",
    }


def test_an_in_memory_store_does_not_claim_cross_process_restore(side: str) -> None:
    composition = sa.make_composition(":unused:", side, store=InMemoryCheckpointStore())
    session = composition.session("Index notes", target=1)

    assert "cross_process_restore" not in session.capabilities()
    assert driven.run(session).state.final_result == "1 notes"


def test_restoring_an_unknown_session_names_it(db: str, side: str) -> None:
    composition = sa.make_composition(db, side)

    with pytest.raises(SessionNotFoundError, match="ses-nope"):
        composition.restore("ses-nope")


def test_empty_steering_text_is_refused_and_nothing_is_recorded(db: str, side: str) -> None:
    composition = sa.make_composition(db, side)
    session = composition.session("Index notes", target=1)

    with pytest.raises(ConfigurationError, match="steering"):
        session.steer("  ")
    assert _store(composition).list_control(session.session_id.value) == []


def test_steering_in_process_reaches_the_agent_once(db: str, side: str) -> None:
    composition = sa.make_composition(db, side)
    session = composition.session("Index notes", target=3)

    result = driven.run(session, steering="keep it short")

    assert result.state.steering_seen == ["keep it short"]
    assert driven.run(composition.restore(session.session_id.value)).state.steering_seen == ["keep it short"]


def test_a_pause_requested_while_idle_stops_the_next_run_once(db: str, side: str) -> None:
    composition = sa.make_composition(db, side)
    session = composition.session("Index notes", target=3)
    receipt = session.pause()

    first = driven.run(session)
    second = driven.run(composition.restore(session.session_id.value))

    assert receipt.status == "requested"
    assert first.state.stop_reason == "paused" and first.step_count == 0
    assert second.state.stop_reason == "final"
    assert second.state.steps_done == [0, 1, 2]


@pytest.mark.parametrize("agent", ["notes", "model"])
def test_the_seed_pause_first_tool_policy_pauses_before_the_call_and_a_fresh_engine_resumes(
    db: str, side: str, agent: str
) -> None:
    script = sa.model_script(3)
    paused_by = sa.make_composition(db, side, agent=agent, model=ScriptedModel(script), lifecycle=sa.PauseFirstTool())
    session = paused_by.session("Index notes", target=3)

    first = driven.run(session)

    assert first.state.stop_reason == "paused"
    assert sa.read_side_log(side) == []  # the tool never started
    batch = session.inspect().tool_batch
    assert batch is not None and batch.step_id == 0
    assert [(c.call_id, c.status) for c in batch.calls] == [("s0-append", "not_started"), ("s0-index", "not_started")]

    # A fresh composition (as another process would build) finishes the step without deciding it again.
    model = ScriptedModel(script[1:])
    fresh = sa.make_composition(db, side, agent=agent, model=model)
    result = driven.run(fresh.restore(session.session_id.value))

    assert result.state.stop_reason == "final", result.task_result
    assert result.state.steps_done == [0, 1, 2]
    if agent == "model":
        assert len(model.requests) == 3
    assert Counter(call for event, _, call in sa.read_side_log(side) if event == "begin") == Counter(
        f"s{s}-{t}" for s in range(3) for t in ("append", "index")
    )


# --------------------------------------------------------------------------- fork


def _paused_parent(db: str, side: str, *, steps: int, target: int = 10, **kwargs: Any) -> tuple[Composition, Any]:
    pausing = sa.make_composition(db, side, lifecycle=sa.PauseAtStep(steps), **kwargs)
    session = pausing.session("Index notes", target=target)
    assert driven.run(session).state.stop_reason == "paused"
    plain = sa.make_composition(db, side, **kwargs)
    return plain, plain.restore(session.session_id.value)


def test_fork_with_the_same_operation_id_returns_the_same_child(db: str, side: str) -> None:
    composition, parent = _paused_parent(db, side, steps=3)
    sid = parent.session_id.value
    head = _head(composition, sid)

    first = parent.fork(operation_id="op-1")
    again = parent.fork(operation_id="op-1")
    via_composition = composition.fork(sid, operation_id="op-1")
    other = parent.fork(operation_id="op-2")
    anonymous = [parent.fork(), parent.fork()]

    assert first.session_id.value == again.session_id.value == via_composition.session_id.value
    assert first.session_id.value != sid
    assert other.session_id.value != first.session_id.value
    assert anonymous[0].session_id.value != anonymous[1].session_id.value
    receipt = first.fork_receipt
    assert receipt is not None
    assert (receipt.parent_session_id, receipt.parent_snapshot_id) == (sid, head)
    assert receipt.operation_id == "op-1"
    assert _head(composition, sid) == head  # forking never moves the parent's head
    assert len(_store(composition).list_sessions()) == 1 + 2 + 2


def test_a_forked_child_and_its_parent_run_in_isolation(db: str, side: str) -> None:
    composition, parent = _paused_parent(db, side, steps=4)
    sid = parent.session_id.value
    parent_head = _head(composition, sid)
    child = parent.fork(operation_id="iso")
    child_head = _head(composition, child.session_id.value)

    child_result = driven.run(child)

    assert child_result.state.steps_done == list(range(10))
    assert child_result.records[0].step_id == 4  # the child continues where the parent stood
    assert _head(composition, sid) == parent_head

    parent_result = driven.run(parent, steering="parent only")

    assert parent_result.state.steering_seen == ["parent only"]
    assert _head(composition, child.session_id.value) != child_head  # moved by the child's own run only
    child_again = composition.restore(child.session_id.value)
    assert child_again.inspect().head.snapshot_id == _head(composition, child.session_id.value)
    assert driven.run(child_again).state.steering_seen == []  # the parent's steering never reached the child
    assert child_again.inspect().snapshot_integrity == "verified"
    assert parent.inspect().snapshot_integrity == "verified"


def test_fork_of_an_older_snapshot_starts_from_that_snapshot(db: str, side: str) -> None:
    composition, parent = _paused_parent(db, side, steps=6)
    sid = parent.session_id.value
    older = _snapshot_at_step(composition, sid, 2)

    by_id = parent.fork(older)
    by_identity = parent.fork(SnapshotIdentity(older))
    by_snapshot = parent.fork(_store(composition).get_snapshot(older))

    for child in (by_id, by_identity, by_snapshot):
        assert child.fork_receipt is not None and child.fork_receipt.parent_snapshot_id == older
        assert child.inspect().budget["used"]["steps"] == 2
    result = driven.run(by_id)
    assert result.records[0].step_id == 2
    assert result.state.steps_done == list(range(10))
    assert parent.inspect().budget["used"]["steps"] == 6


def test_a_fork_of_a_session_awaiting_approval_is_answered_on_its_own(db: str, side: str) -> None:
    composition = sa.make_composition(db, side, approval_at=1)
    parent = composition.session("Index notes", target=3)
    assert driven.run(parent).state.stop_reason == "awaiting_approval"

    child = parent.fork(operation_id="approve-in-child")
    child.approve("s1-publish")
    result = driven.run(child)

    assert result.state.stop_reason == "final"
    assert sa.read_side_log(side).count(("begin", "publish", "s1-publish")) == 1
    assert sa.read_side_log(side).count(("begin", "append_note", "s1-append")) == 1  # recorded, not re-run
    batch = parent.inspect().tool_batch
    assert parent.inspect().lifecycle.value == "awaiting_approval"
    assert batch is not None and [c.call_id for c in batch.pending_approval] == ["s1-publish"]


def test_fork_of_an_unknown_snapshot_names_it(db: str, side: str) -> None:
    _, parent = _paused_parent(db, side, steps=1)

    with pytest.raises(SnapshotNotFoundError, match="0" * 64):
        parent.fork("0" * 64)


def test_a_fork_shares_its_parents_storage(db: str, side: str) -> None:
    _, parent = _paused_parent(db, side, steps=20, target=25, note_bytes=2048)
    before = _stored_bytes(db)
    assert before > 40 * 1024

    child = parent.fork(operation_id="cheap")

    added = _stored_bytes(db) - before
    assert added < 2048, f"the fork copied {added} bytes of a {before}-byte history"
    assert child.inspect().snapshot_integrity == "verified"


# --------------------------------------------------------------------------- retention


def test_prune_and_vacuum_keep_every_reachable_snapshot_restorable_and_drop_the_rest(
    db: str, side: str, tmp_path: Path
) -> None:
    composition, parent = _paused_parent(db, side, steps=8, target=12, note_bytes=512)
    sid = parent.session_id.value
    at_head = parent.fork(operation_id="at-head")
    older = _snapshot_at_step(composition, sid, 3)
    from_older = parent.fork(older, operation_id="older")
    driven.run(at_head)
    # A session waiting for approval with a step in progress: its pending writes must survive too.
    approval = sa.make_composition(db, str(tmp_path / "approval.log"), approval_at=0)
    waiting = approval.session("Publish", target=2)
    assert driven.run(waiting).state.stop_reason == "awaiting_approval"
    # A session whose head row is gone (there is no public delete): its snapshots are unreachable.
    doomed = composition.session("Doomed", target=4)
    driven.run(doomed)
    store = _store(composition)
    doomed_chain = store.list_session_snapshots(doomed.session_id.value)
    named = doomed_chain[1]  # kept by name, with the ancestors it needs
    with sqlite3.connect(db) as con:
        con.execute("DELETE FROM heads WHERE session_id = ?", (doomed.session_id.value,))
    size_before = _files_size(db)

    report = store.prune(keep=[named])
    store.vacuum()

    assert report.deleted_snapshots == 1  # the doomed head, the only snapshot newer than `named`
    with pytest.raises(SnapshotNotFoundError):
        store.get_snapshot(doomed_chain[0])
    assert store.load_chain(named)[-1].snapshot_id == named
    assert _files_size(db) < size_before
    for session in (parent, at_head, from_older):
        again = composition.restore(session.session_id.value)
        assert again.inspect().snapshot_integrity == "verified"
        assert driven.run(again).state.steps_done == list(range(12))
    assert composition.restore(sid).fork(older).inspect().snapshot_integrity == "verified"
    waiting.approve("s0-publish")
    done = driven.run(approval.restore(waiting.session_id.value))
    assert done.state.steps_done == [0, 1]
    begins = Counter(c for e, _, c in sa.read_side_log(tmp_path / "approval.log") if e == "begin")
    assert begins["s0-append"] == begins["s0-index"] == begins["s0-publish"] == 1


def test_prune_reclaims_the_runs_of_a_dropped_session_and_keeps_those_a_kept_fork_shares(db: str, side: str) -> None:
    kept = sa.make_composition(db, side, tools_every=0, note_bytes=1024)
    parent = kept.session("Grow", target=80)
    driven.run(parent)
    child = parent.fork(_snapshot_at_step(kept, parent.session_id.value, 60), operation_id="kept-fork")
    driven.run(child)
    dropped = sa.make_composition(db, side, tools_every=0, note_bytes=1000).session("Other notes", target=80)
    driven.run(dropped)
    store = _store(kept)
    dropped_runs = {
        ref.digest
        for sid in store.list_session_snapshots(dropped.session_id.value)
        for refs in SnapshotPayload.of(store.get_snapshot(sid)).state_chunks.values()
        for ref in refs
    }
    assert dropped_runs
    with sqlite3.connect(db) as con:
        con.execute("DELETE FROM heads WHERE session_id = ?", (dropped.session_id.value,))
    size_before = _files_size(db)

    report = store.prune()
    store.vacuum()

    assert report.deleted_blobs >= len(dropped_runs)
    assert store.get_blobs(dropped_runs) == {}
    assert _files_size(db) < size_before
    for session, notes in ((parent, 80), (child, 80)):
        again = kept.restore(session.session_id.value)
        assert again.inspect().snapshot_integrity == "verified"
        head = store.get_session_head(session.session_id.value)
        assert head is not None
        assert materialize(store, head.snapshot_id).state_data["notes"] == [sa._note(i, 1024) for i in range(notes)]


# --------------------------------------------------------------------------- durability modes


class _Lag(EngineHook):
    """Records the durability lag that ``inspect()`` reports after each step and at tool decisions."""

    def __init__(self) -> None:
        self.session: Any = None
        self.after_step: list[dict[str, Any]] = []
        self.at_tool_decisions: list[int] = []

    def on_step_end(self, ctx: HookContext) -> None:
        self.after_step.append(dict(self.session.inspect().budget["durability"]))

    def on_after_decide(self, ctx: HookContext) -> None:
        if ctx.decision.mode == "act":
            self.at_tool_decisions.append(self.session.inspect().budget["durability"]["unflushed_boundaries"])


def _commits(composition: Composition, sid: str) -> int:
    return len(_store(composition).list_session_snapshots(sid)) - 1  # minus the creation snapshot


def test_batched_mode_group_commits_and_inspect_shows_the_lag(db: str, side: str) -> None:
    target, batch = 20, 4
    sync = sa.make_composition(db, side, tools_every=0)
    sync_session = sync.session("Index notes", target=target)
    sync_result = driven.run(sync_session)
    lag = _Lag()
    batched = sa.make_composition(
        db, side, tools_every=0, durability="batched", batch_steps=batch, batch_ms=60_000, hooks=[lag]
    )
    session = batched.session("Index notes", target=target)
    lag.session = session

    result = driven.run(session)

    assert result.state.to_dict() == sync_result.state.to_dict()
    sync_commits = _commits(sync, sync_session.session_id.value)
    batched_commits = _commits(batched, session.session_id.value)
    assert sync_commits == target + 1  # every step and the final one, which records the run's end too
    assert batched_commits <= -(-(target + 1) // batch) + 2, batched_commits
    unflushed = [d["unflushed_boundaries"] for d in lag.after_step]
    assert {d["mode"] for d in lag.after_step} == {"batched"}
    assert max(unflushed) == batch - 1
    assert unflushed[: 2 * batch] == [1, 2, 3, 0, 1, 2, 3, 0]
    assert session.inspect().budget["durability"]["unflushed_boundaries"] == 0
    restored = batched.restore(session.session_id.value).inspect()
    assert restored.snapshot_integrity == "verified"
    assert restored.budget["used"]["steps"] == target + 1


class _NoteAtTheEnd(EngineHook):
    """Changes the state after the step that ends the run (on_step_end runs after its commit)."""

    def on_step_end(self, ctx: HookContext) -> None:
        if ctx.state.stop_reason is not None:
            ctx.state.notes.append("after the last step")


def test_the_step_that_ends_a_run_is_its_last_commit(db: str, side: str) -> None:
    composition = sa.make_composition(db, side, tools_every=0)
    session = composition.session("Index notes", target=3)
    driven.run(session)
    store = _store(composition)
    snapshots = store.list_session_snapshots(session.session_id.value)
    assert len(snapshots) == 3 + 2  # creation, three steps, the final one: no end-of-run copy of it
    last = SnapshotPayload.of(store.get_snapshot(snapshots[0]))
    assert (last.lifecycle, last.stop_reason, last.steps[0].mode) == ("completed", "final", "final")
    inspection = composition.restore(session.session_id.value).inspect()
    assert inspection.lifecycle == "completed" and inspection.snapshot_integrity == "verified"


def test_what_changes_after_the_last_step_gets_an_end_of_run_commit(db: str, side: str) -> None:
    composition = sa.make_composition(db, side, tools_every=0, hooks=[_NoteAtTheEnd()])
    session = composition.session("Index notes", target=3)
    result = driven.run(session)
    assert result.state.notes[-1] == "after the last step"
    snapshots = _store(composition).list_session_snapshots(session.session_id.value)
    assert len(snapshots) == 3 + 3  # the end of the run records the hook's change
    restored = materialize(_store(composition), snapshots[0])
    assert restored.state_data["notes"][-1] == "after the last step"


def test_batched_mode_flushes_before_any_step_that_calls_tools(db: str, side: str) -> None:
    lag = _Lag()
    composition = sa.make_composition(
        db, side, tools_every=3, durability="batched", batch_steps=50, batch_ms=60_000, hooks=[lag]
    )
    session = composition.session("Index notes", target=10)
    lag.session = session

    result = driven.run(session)

    assert result.state.steps_done == list(range(10))
    assert lag.at_tool_decisions == [0, 0, 0, 0]  # steps 0, 3, 6, 9: nothing buffered when tools run


def test_batched_mode_also_commits_when_the_time_limit_passes(db: str, side: str) -> None:
    composition = sa.make_composition(
        db, side, tools_every=0, decide_sleep=0.004, durability="batched", batch_steps=1000, batch_ms=10
    )
    session = composition.session("Index notes", target=30)

    driven.run(session)

    commits = _commits(composition, session.session_id.value)
    assert 3 <= commits < 30


# --------------------------------------------------------------------------- pending writes


class _DurableWrites:
    """Reads the pending-write kinds stored against a session's current head."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self.session: Any = None

    def kinds(self) -> list[str]:
        sid = self.session.session_id.value
        head = self.store.get_session_head(sid)
        assert head is not None
        return [write.kind for write in self.store.get_writes(sid, head.snapshot_id)]


class _BeforeAct(EngineHook):
    """Records the durable pending writes when a step's tools are about to run."""

    def __init__(self, writes: _DurableWrites) -> None:
        self.writes = writes
        self.seen: list[list[str]] = []

    def on_before_act(self, ctx: HookContext) -> None:
        if ctx.decision is not None and ctx.decision.mode == "act":
            self.seen.append(self.writes.kinds())


@dataclass
class _ProbeState(StateSchema):
    calls: int = 0


def test_a_scripted_decision_becomes_durable_in_the_transaction_that_starts_its_first_tool(db: str) -> None:
    writes = _DurableWrites(SqliteCheckpointStore(db))
    in_tool: list[list[str]] = []

    @tool
    def probe() -> str:
        """Records which pending writes are durable while the tool runs."""
        in_tool.append(writes.kinds())
        return "ok"

    class ProbeAgent(AgentModule[_ProbeState, Any, Any]):
        def __init__(self) -> None:
            super().__init__(tool_registry=ToolRegistry([probe]))

        def init_state(self, task: str, **kwargs: Any) -> _ProbeState:
            return _ProbeState(task=task, max_steps=5)

        def decide(self, state: _ProbeState, observation: Any) -> Decision[Any]:
            return Decision.final("done") if state.calls == 2 else Decision.act([Action("probe", {})])

        def reduce(self, state: _ProbeState, observation: Any, decision: Decision[Any]) -> _ProbeState:
            state.calls += decision.mode == "act"
            return state

    before_act = _BeforeAct(writes)
    session = compose(agent=ProbeAgent, store=writes.store, hooks=[before_act]).session("probe twice")
    writes.session = session

    assert driven.run(session).state.final_result == "done"

    # Deciding again costs nothing without a model: no transaction of its own, and still durable
    # (with the call's start) before the tool runs.
    assert before_act.seen == [[], []]
    assert in_tool == [["decision", "tool_started"], ["decision", "tool_started"]]


def test_a_models_decision_is_durable_before_anything_else_runs(db: str, side: str) -> None:
    writes = _DurableWrites(SqliteCheckpointStore(db))
    before_act = _BeforeAct(writes)
    composition = sa.make_composition(
        db, side, agent="model", model=ScriptedModel(sa.model_script(2)), store=writes.store, hooks=[before_act]
    )
    session = composition.session("Index notes", target=2)
    writes.session = session

    assert driven.run(session).state.stop_reason == "final"

    assert before_act.seen == [["decision"], ["decision"]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"durability": "eventually"}, "durability must be 'sync' or 'batched'"),
        ({"durability": "batched", "batch_steps": 0}, "batch_steps"),
        ({"durability": "batched", "batch_ms": 0}, "batch_ms"),
    ],
)
def test_a_bad_durability_setting_is_refused_naming_it(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        compose(agent=lambda: sa.NotesAgent(os.devnull), store=InMemoryCheckpointStore(), **kwargs)


# --------------------------------------------------------------------------- integrity


def _rewrite_payload(db: str, snapshot_id: str, change: Any) -> None:
    """Change the stored payload of one snapshot row directly (schema: sqlite_store migrations)."""
    with sqlite3.connect(db) as con:
        encoding, payload = con.execute(
            "SELECT encoding, CAST(payload AS BLOB) FROM snapshots WHERE snapshot_id = ?", (snapshot_id,)
        ).fetchone()
        stored: str | bytes
        if encoding == "zstd":
            stored = zstd.compress(change(unpack(payload)))
        else:
            new = change(payload)
            try:
                stored = new.decode("utf-8")
            except UnicodeDecodeError:
                stored = new  # not even text
        con.execute("UPDATE snapshots SET payload = ? WHERE snapshot_id = ?", (stored, snapshot_id))


def _completed(db: str, side: str, target: int = 6) -> tuple[Composition, Any]:
    composition = sa.make_composition(db, side)
    session = composition.session("Index notes", target=target)
    driven.run(session)
    return composition, session


@pytest.mark.parametrize("which", ["head", "middle", "base"])
def test_a_corrupted_snapshot_is_detected_on_run_and_fork_and_reported_by_inspect(
    db: str, side: str, which: str
) -> None:
    composition, session = _completed(db, side)
    sid = session.session_id.value
    chain = _store(composition).list_session_snapshots(sid)
    victim = {"head": chain[0], "middle": chain[len(chain) // 2], "base": chain[-1]}[which]
    _rewrite_payload(db, victim, lambda raw: raw.replace(b'"step_id":', b'"step_id": ', 1))

    inspection = composition.restore(sid).inspect()

    assert inspection.snapshot_integrity != "verified"
    assert victim in inspection.snapshot_integrity
    with pytest.raises(SnapshotIntegrityError) as on_run:
        driven.run(composition.restore(sid), steering="go on")
    assert on_run.value.snapshot_id == victim and victim in str(on_run.value)
    with pytest.raises(SnapshotIntegrityError) as on_fork:
        session.fork(operation_id="from-corrupt")
    assert on_fork.value.snapshot_id == victim
    assert _store(composition).find_session_by_operation("from-corrupt") is None


def test_payload_bytes_that_are_not_text_are_detected_naming_the_snapshot(db: str, side: str) -> None:
    composition, session = _completed(db, side)
    sid = session.session_id.value
    victim = _head(composition, sid)
    _rewrite_payload(db, victim, lambda raw: b"\xff\xfe" + raw[2:])

    assert victim in composition.restore(sid).inspect().snapshot_integrity
    with pytest.raises(SnapshotIntegrityError, match=victim):
        driven.run(composition.restore(sid))


def test_a_corrupted_exchange_log_blob_is_reported_by_inspect_not_raised(db: str, side: str) -> None:
    composition = sa.make_composition(db, side, agent="model", model=ScriptedModel(sa.model_script(3)))
    session = composition.session("Index notes", target=3)
    driven.run(session)
    store = _store(composition)
    chunks = [
        p.log.chunk
        for s in store.load_chain(_head(composition, session.session_id.value))
        if (p := SnapshotPayload.of(s)).log is not None and p.log.chunk is not None
    ]
    with sqlite3.connect(db) as con:
        con.execute("UPDATE blobs SET data = ? WHERE digest = ?", (zlib.compress(b"[]"), chunks[0]))

    with pytest.raises(CheckpointError, match=chunks[0]):
        driven.run(composition.restore(session.session_id.value))
    with pytest.raises(CheckpointError, match=chunks[0]):
        session.fork()
    integrity = session.inspect().snapshot_integrity
    assert integrity != "verified" and chunks[0] in integrity


@pytest.mark.parametrize("damage", ["altered", "missing"])
def test_a_damaged_state_run_is_reported_naming_the_base_that_references_it(db: str, side: str, damage: str) -> None:
    composition = sa.make_composition(db, side, tools_every=0, note_bytes=1024)
    session = composition.session("Grow", target=60)
    driven.run(session)
    chain = _store(composition).load_chain(_head(composition, session.session_id.value))
    base = chain[0]
    runs = SnapshotPayload.of(base).state_chunks["notes"]
    victim = runs[0].digest
    with sqlite3.connect(db) as con:
        if damage == "altered":
            con.execute("UPDATE blobs SET data = ? WHERE digest = ?", (b'["forged"]', victim))
        else:
            con.execute("DELETE FROM blobs WHERE digest = ?", (victim,))

    with pytest.raises(SnapshotIntegrityError) as on_run:
        driven.run(composition.restore(session.session_id.value))
    assert on_run.value.snapshot_id == base.snapshot_id and victim in str(on_run.value)
    with pytest.raises(SnapshotIntegrityError, match=victim):
        session.fork()
    integrity = session.inspect().snapshot_integrity
    assert base.snapshot_id in integrity and victim in integrity


@dataclass
class RollingState(StateSchema):
    """A state with one growing list that is sometimes trimmed at the front."""

    notes: list[str] = field(default_factory=list)


class RollingAgent(AgentModule[RollingState, Any, Any]):
    """Appends a 1 KiB note per step and, every 40 steps, drops the ten oldest; final at step 150."""

    def init_state(self, task: str, **kwargs: Any) -> RollingState:
        return RollingState(task=task, max_steps=200)

    def decide(self, state: RollingState, observation: Any) -> Decision[Any]:
        step = state.current_step
        if step >= 150:
            return Decision.final("done")
        state.notes.append(sa._note(step, 1024))
        if step % 40 == 39:
            del state.notes[:10]
        return Decision.wait()

    def reduce(self, state: RollingState, observation: Any, decision: Decision[Any]) -> RollingState:
        return state


def _rolling_notes(steps: int) -> list[str]:
    notes: list[str] = []
    for step in range(steps):
        notes.append(sa._note(step, 1024))
        if step % 40 == 39:
            del notes[:10]
    return notes


def test_a_list_changed_other_than_by_appends_is_cut_again_and_restores_exactly(db: str) -> None:
    composition = compose(agent=RollingAgent, store=SqliteCheckpointStore(db))
    session = composition.session("Roll")
    result = driven.run(session)

    store = _store(composition)
    history = store.list_session_snapshots(session.session_id.value)
    bases = [p for sid in history if (p := SnapshotPayload.of(store.get_snapshot(sid))).state_chunks]
    assert len(bases) >= 3
    assert result.state.notes == _rolling_notes(150)
    for snapshot_id in history:
        restored = materialize(store, snapshot_id)
        step = restored.payload.step_id
        assert restored.state_data["notes"] == _rolling_notes(min(step, 150)), f"at step {step}"


# --------------------------------------------------------------------------- storage growth


def test_a_thousand_steps_appending_a_kib_each_keep_the_database_small(db: str, side: str) -> None:
    composition = sa.make_composition(db, side, tools_every=0, note_bytes=1024)
    session = composition.session("Grow", target=1000)

    result = driven.run(session)

    assert len(result.state.notes) == 1000
    store = _store(composition)
    store.close()
    with sqlite3.connect(db) as con:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = os.path.getsize(db)
    assert size <= 2_500_000, f"{size / 1e6:.2f} MB after 1000 steps of 1 KiB (target: 2.5 MB)"
    again = sa.make_composition(db, side, tools_every=0, note_bytes=1024).restore(session.session_id.value)
    assert again.inspect().snapshot_integrity == "verified"


def test_a_lost_lease_ends_the_losing_run_with_run_end_and_a_failed_trace(tmp_path: Path) -> None:
    from qitos import AgentModule, Decision, StateSchema, compose
    from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
    from qitos.core._errors import LeaseLostError
    from qitos.trace import list_runs

    race: list[Any] = []

    class Racer(AgentModule):  # type: ignore[type-arg]
        def init_state(self, task: str, **kwargs: Any) -> StateSchema:
            return StateSchema(task=task, max_steps=3)

        def decide(self, state: Any, observation: Any) -> Any:
            if state.current_step == 1 and race:
                race.pop()()  # another runner takes the session over while this step runs
            return Decision.wait()

        def reduce(self, state: Any, observation: Any, decision: Any) -> Any:
            return state

    logdir = tmp_path / "runs"
    store = SqliteCheckpointStore(str(tmp_path / "s.db"))
    composition = compose(agent=Racer, store=store, trace_logdir=str(logdir))
    session = composition.session("race")
    sid = session.session_id.value

    def take_over() -> None:
        holder = store.get_lease(sid)
        assert holder is not None
        store.acquire_lease(sid, "thief", ttl_seconds=30, take_over_from=holder.owner)

    race.append(take_over)
    with pytest.raises(LeaseLostError, match="taken over"):
        driven.run(session)

    head = store.get_session_head(sid)
    assert head is not None and head.sequence == 1  # step 0 only: nothing after the lease was lost
    (run,) = list_runs(str(logdir))
    assert run.manifest()["status"] == "failed"
    events = [e["event_type"] for e in run.events()]
    assert events[0] == "run_start" and events[-1] == "run_end" and events.count("run_end") == 1
    assert "LeaseLostError" in (run.manifest()["summary"]["error"] or "")


def test_engine_restore_continues_a_session_beside_engine_session(tmp_path: Path) -> None:
    from qitos.engine._engine import Engine

    db, side = str(tmp_path / "s.db"), str(tmp_path / "side.log")
    first = Engine(sa.NotesAgent(side, approval_at=1), checkpoint_store=SqliteCheckpointStore(db))
    session = first.session("Index notes", target=3)
    assert session.run().state.stop_reason == "awaiting_approval"
    (call,) = [c for c in session.inspect().tool_batch.calls if c.status == "awaiting_approval"]  # type: ignore[union-attr]
    session.approve(call.call_id)

    again = Engine(sa.NotesAgent(side, approval_at=1), checkpoint_store=SqliteCheckpointStore(db))
    restored = again.restore(session.session_id.value)
    assert restored.session_id == session.session_id
    result = restored.run()
    assert result.state.stop_reason == "final" and result.state.steps_done == [0, 1, 2]
    with pytest.raises(SessionNotFoundError):
        again.restore("ses_does_not_exist")
    with pytest.raises(ConfigurationError, match="checkpoint_store"):
        Engine(sa.NotesAgent(side)).restore(session.session_id.value)
