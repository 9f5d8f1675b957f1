"""Crash safety of durable sessions: SIGKILL a real process mid-run, restore, and check the contract.

The contract: committed steps are never lost nor applied twice; a restore continues the step in
progress from its pending writes; an interrupted tool call is re-run only if its tool is
idempotent, otherwise reported to the agent as ``interrupted``; steering is taken exactly once.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import session_agents as sa
from qitos.models._scripted import ScriptedModel
from qitos.sessions._payload import SnapshotPayload

TARGET = 20
TOOL_SLEEP = 0.004


def _wait_for(predicate: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


def _decided(progress: Path) -> list[int]:
    if not progress.exists():
        return []
    return [int(line.split()[1]) for line in progress.read_text().splitlines() if line.startswith("decide ")]


def _kill(proc: subprocess.Popen[str]) -> str:
    """SIGKILL a process that must still be running; its stderr."""
    assert proc.poll() is None, f"the process ended before the kill: {proc.communicate()}"
    os.kill(proc.pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL, err
    return err


@dataclass
class Trial:
    """One kill -9 trial: where it ran, where it was killed."""

    seed: int
    root: Path
    session_id: str = ""
    kill_step: int = 0
    returncode: int | None = None
    stderr: str = ""

    @property
    def db(self) -> str:
        return str(self.root / "sessions.db")

    @property
    def side_log(self) -> str:
        return str(self.root / "side.log")

    @property
    def progress(self) -> Path:
        return self.root / "progress.log"

    @property
    def note_bytes(self) -> int:
        """Odd seeds append 4 KiB notes: the state's list is then stored as runs by bases mid-run."""
        return 4096 if self.seed % 2 else 16


def _kill_at_random_point(trial: Trial, *extra: str) -> Trial:
    """Start the run in a subprocess and SIGKILL it at a random point of step ``kill_step``."""
    rng = random.Random(trial.seed)
    trial.kill_step = rng.randrange(TARGET)
    proc = sa.start_cli(
        "run",
        "--db",
        trial.db,
        "--log",
        trial.side_log,
        "--session",
        trial.session_id,
        "--target",
        str(TARGET),
        "--sleep",
        str(TOOL_SLEEP),
        "--progress-log",
        str(trial.progress),
        "--note-bytes",
        str(trial.note_bytes),
        *extra,
    )
    try:
        _wait_for(
            lambda: proc.poll() is not None or trial.kill_step in _decided(trial.progress),
            f"step {trial.kill_step} to start",
        )
        # Somewhere in the step: its decision write, a tool call, or the boundary commit.
        time.sleep(rng.uniform(0.0, 3 * TOOL_SLEEP))
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        _, trial.stderr = proc.communicate(timeout=30)
        trial.returncode = proc.returncode
    return trial


def _new_trial(tmp_path: Path, seed: int, **kwargs: Any) -> Trial:
    trial = Trial(seed=seed, root=tmp_path / f"trial{seed}")
    trial.root.mkdir()
    composition = sa.make_composition(trial.db, trial.side_log, sleep=TOOL_SLEEP, note_bytes=trial.note_bytes, **kwargs)
    trial.session_id = composition.session("Index notes", target=TARGET).session_id.value
    composition.runtime.checkpoint_store.close()
    return trial


def _check_recovery(trial: Trial) -> None:
    """Restore the killed session in this process, run it to the end, and check every promise."""
    assert trial.returncode == -signal.SIGKILL, (
        f"trial {trial.seed}: the run was not killed (exit {trial.returncode}): {trial.stderr}"
    )
    composition = sa.make_composition(trial.db, trial.side_log, sleep=TOOL_SLEEP, note_bytes=trial.note_bytes)
    try:
        session = composition.restore(trial.session_id)
        after_kill = session.inspect()
        assert after_kill.snapshot_integrity == "verified", after_kill.snapshot_integrity
        committed = after_kill.budget["used"].get("steps", 0)
        log_at_kill = sa.read_side_log(trial.side_log)

        result = session.run()

        state = result.state
        where = f"trial {trial.seed} (kill aimed at step {trial.kill_step}, {committed} steps committed)"
        # No committed step lost and none applied twice.
        assert state.steps_done == list(range(TARGET)), where
        assert len(state.notes) == TARGET, where
        assert all(len(note) == trial.note_bytes for note in state.notes), where
        assert state.final_result == f"{TARGET} notes", where
        first = result.records[0].step_id if result.records else state.current_step
        assert first == committed, f"{where}: the restored run started at step {first}"
        observed = Counter(o["call"] for o in state.observed)
        assert all(n == 1 for n in observed.values()), f"{where}: a tool result was applied twice: {observed}"
        assert len(observed) == 2 * TARGET, where

        side = sa.read_side_log(trial.side_log)
        begins = Counter(call for event, _, call in side if event == "begin")
        ends = Counter(call for event, _, call in side if event == "end")
        ended_at_kill = {call for event, _, call in log_at_kill if event == "end"}
        by_call = {o["call"]: o for o in state.observed}
        for step in range(TARGET):
            append, index = f"s{step}-append", f"s{step}-index"
            # The non-idempotent tool never ran twice for one call id. It ran once, or its intent was
            # recorded just before the kill (begins == 0) and it is reported as interrupted.
            assert begins[append] <= 1, f"{where}: {append} ran {begins[append]} times"
            if by_call[append]["ok"]:
                assert begins[append] == ends[append] == 1, where
            else:
                assert by_call[append]["error_kind"] == "interrupted", f"{where}: {by_call[append]}"
                assert append not in ended_at_kill or begins[append] == 1, where
            if ends[append] == 0:
                assert by_call[append]["error_kind"] == "interrupted", where
            # The idempotent tool finished every call (re-run when interrupted).
            assert by_call[index]["ok"], f"{where}: {by_call[index]}"
            assert ends[index] >= 1, where
        interrupted = [c for c, o in by_call.items() if o["error_kind"] == "interrupted"]
        assert all(c.endswith("-append") for c in interrupted), where
        assert len(interrupted) <= 1, f"{where}: more than one call was interrupted: {interrupted}"
        assert session.inspect().snapshot_integrity == "verified"
        if trial.note_bytes > 1024:  # the big notes really were stored as runs by some base
            store = composition.runtime.checkpoint_store
            snapshots = [store.get_snapshot(s) for s in store.list_session_snapshots(trial.session_id)]
            assert any(SnapshotPayload.of(s).state_chunks for s in snapshots if s.base_id is None), where
    finally:
        composition.runtime.checkpoint_store.close()


def _run_trials(tmp_path: Path, seeds: list[int], parallel: int) -> list[Trial]:
    trials = [_new_trial(tmp_path, seed) for seed in seeds]
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        done = list(pool.map(_kill_at_random_point, trials))
    for trial in done:
        _check_recovery(trial)
    return done


def test_kill_9_at_random_points_loses_no_step_and_repeats_no_side_effect(tmp_path: Path) -> None:
    trials = _run_trials(tmp_path, seeds=list(range(5)), parallel=5)
    assert len({t.kill_step for t in trials}) > 1


@pytest.mark.slow
def test_kill_9_at_random_points_fifty_trials(tmp_path: Path) -> None:
    trials = _run_trials(tmp_path, seeds=list(range(100, 150)), parallel=5)
    assert len({t.kill_step for t in trials}) >= 10


def test_an_interrupted_non_idempotent_call_is_reported_to_the_agent_and_not_repeated(tmp_path: Path) -> None:
    # Deterministic crash inside the non-idempotent call of step 3, after it began.
    db, side, marker = str(tmp_path / "s.db"), str(tmp_path / "side.log"), str(tmp_path / "hang")
    composition = sa.make_composition(db, side)
    sid = composition.session("Index notes", target=6).session_id.value
    proc = sa.start_cli("run", "--db", db, "--log", side, "--session", sid, "--hang-at", "3", "--hang-marker", marker)
    _wait_for(lambda: os.path.exists(marker) or proc.poll() is not None, "the hang marker")
    _kill(proc)

    session = composition.restore(sid)
    batch = session.inspect().tool_batch
    assert batch is not None and batch.step_id == 3
    statuses = {c.call_id: c.status for c in batch.calls}
    assert statuses == {"s3-append": "started", "s3-index": "not_started"}

    result = session.run()

    by_call = {o["call"]: o for o in result.state.observed}
    assert by_call["s3-append"]["error_kind"] == "interrupted"
    assert by_call["s3-index"]["ok"] is True
    assert result.state.steps_done == list(range(6))
    begins = Counter(call for event, _, call in sa.read_side_log(side) if event == "begin")
    assert begins["s3-append"] == 1
    graph = session.inspect().work_graph
    assert graph is not None
    step3 = next(s for s in graph["steps"] if s["work_item"] == "step-3")
    outcomes = {c["work_item"]: c["outcome"] for c in step3["tool_calls"]}
    assert outcomes == {"s3-append": "interrupted", "s3-index": "ok"}
    assert len(step3["attempts"]) >= 1


def test_a_session_killed_in_its_first_tool_call_reads_running_then_interrupted(tmp_path: Path) -> None:
    """The head still says ``created`` (no boundary was committed), but a reader sees the run."""
    from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
    from qitos.viewer._data import session_detail, session_summary

    db, side, marker = str(tmp_path / "s.db"), str(tmp_path / "side.log"), str(tmp_path / "hang")
    composition = sa.make_composition(db, side)
    sid = composition.session("Index notes", target=2).session_id.value
    proc = sa.start_cli("run", "--db", db, "--log", side, "--session", sid, "--hang-at", "0", "--hang-marker", marker)
    _wait_for(lambda: os.path.exists(marker) or proc.poll() is not None, "the hang marker")
    reader = SqliteCheckpointStore(db)  # another process's view: the store alone
    try:
        head = reader.get_session_head(sid)
        assert head is not None and head.lifecycle == "created"
        assert composition.restore(sid).inspect().lifecycle == "running"
        assert session_summary(head, reader)["lifecycle"] == "running"
        _kill(proc)
        assert composition.restore(sid).inspect().lifecycle == "interrupted"
        assert session_summary(head, reader)["lifecycle"] == "interrupted"
        assert session_detail(reader, sid)["lineage"]["lifecycle"] == "interrupted"
    finally:
        reader.close()
    result = composition.restore(sid).run()
    assert result.state.steps_done == [0, 1]
    assert composition.restore(sid).inspect().lifecycle == "completed"


def test_an_idempotent_call_interrupted_mid_run_is_run_again(tmp_path: Path) -> None:
    # The kill lands while the idempotent call of the step runs: it is re-run, exactly to its end.
    db, side = str(tmp_path / "s.db"), str(tmp_path / "side.log")
    composition = sa.make_composition(db, side)
    sid = composition.session("Index notes", target=4).session_id.value
    proc = sa.start_cli("run", "--db", db, "--log", side, "--session", sid, "--target", "4", "--sleep", "0.5")

    def index_running() -> bool:
        return proc.poll() is not None or ("begin", "index_note", "s1-index") in sa.read_side_log(side)

    _wait_for(index_running, "s1-index to begin")
    _kill(proc)
    assert ("end", "index_note", "s1-index") not in sa.read_side_log(side)

    result = sa.make_composition(db, side).restore(sid).run()  # tools without the sleep

    side_log = sa.read_side_log(side)
    assert side_log.count(("begin", "index_note", "s1-index")) == 2
    assert side_log.count(("end", "index_note", "s1-index")) == 1
    assert side_log.count(("begin", "append_note", "s1-append")) == 1
    by_call = {o["call"]: o for o in result.state.observed}
    assert by_call["s1-append"]["ok"] is True  # finished before the kill: its recorded result is reused
    assert by_call["s1-index"]["ok"] is True
    assert result.state.steps_done == list(range(4))


def test_a_model_step_killed_mid_tool_resumes_without_a_second_model_call(tmp_path: Path) -> None:
    # The model chose step 2's calls, then the process died inside the first of them.
    db, side, marker = str(tmp_path / "s.db"), str(tmp_path / "side.log"), str(tmp_path / "hang")
    script = sa.model_script(5)
    composition = sa.make_composition(db, side, agent="model", model=ScriptedModel(script))
    sid = composition.session("Index notes", target=5).session_id.value
    proc = sa.start_cli(
        "run", "--db", db, "--log", side, "--session", sid, "--target", "5", "--hang-at", "2", "--hang-marker",
        marker, "--agent", "model",
    )  # fmt: skip
    _wait_for(lambda: os.path.exists(marker) or proc.poll() is not None, "the hang marker")
    _kill(proc)

    model = ScriptedModel(script[3:])  # responses 0-2 were used by the killed process
    restored = sa.make_composition(db, side, agent="model", model=model)
    result = restored.restore(sid).run()

    assert result.state.stop_reason == "final", result.task_result
    assert result.state.steps_done == list(range(5))
    assert len(model.requests) == 3  # steps 3, 4 and the final answer: step 2 was not decided again
    by_call = {o["call"]: o for o in result.state.observed}
    assert by_call["s2-append"]["error_kind"] == "interrupted"
    assert by_call["s2-index"]["ok"] is True
    # The interrupted step's results reached the exchange log: the next request carries them.
    tool_messages = [m for m in model.requests[0].messages() if m.get("role") == "tool"]
    assert any("interrupted" in str(m.get("content")) for m in tool_messages), tool_messages


def test_a_model_step_killed_inside_an_idempotent_call_runs_that_call_again(tmp_path: Path) -> None:
    # The model chose step 2's calls; the non-idempotent one finished, then the process died inside
    # the idempotent one. Restored, that call runs again (only a started non-idempotent call is
    # reported interrupted) and the finished one's recorded result is reused.
    db, side, marker = str(tmp_path / "s.db"), str(tmp_path / "side.log"), str(tmp_path / "hang")
    script = sa.model_script(5)
    composition = sa.make_composition(db, side, agent="model", model=ScriptedModel(script))
    sid = composition.session("Index notes", target=5).session_id.value
    proc = sa.start_cli(
        "run", "--db", db, "--log", side, "--session", sid, "--target", "5", "--hang-at", "2", "--hang-marker",
        marker, "--hang-tool", "index_note", "--agent", "model",
    )  # fmt: skip
    _wait_for(lambda: os.path.exists(marker) or proc.poll() is not None, "the hang marker")
    _kill(proc)
    assert ("end", "index_note", "s2-index") not in sa.read_side_log(side)

    model = ScriptedModel(script[3:])  # responses 0-2 were used by the killed process
    result = sa.make_composition(db, side, agent="model", model=model).restore(sid).run()

    assert result.state.stop_reason == "final", result.task_result
    assert result.state.steps_done == list(range(5))
    assert len(model.requests) == 3  # step 2 was not decided again
    by_call = {o["call"]: o for o in result.state.observed}
    assert by_call["s2-index"] == {"call": "s2-index", "tool": "index_note", "ok": True, "error_kind": None}
    assert by_call["s2-append"]["ok"] is True
    side_log = sa.read_side_log(side)
    assert side_log.count(("begin", "index_note", "s2-index")) == 2
    assert side_log.count(("end", "index_note", "s2-index")) == 1
    assert side_log.count(("begin", "append_note", "s2-append")) == 1
    tool_messages = [m for m in model.requests[0].messages() if m.get("role") == "tool"]
    assert [m["content"] for m in tool_messages if m["tool_call_id"].startswith("s2-")] == [
        "noted 16 chars at step 2",
        "indexed through step 2",
    ]


# --------------------------------------------------------------------------- steering across a crash


def _hang_and_kill(db: str, side: str, sid: str, marker: str, hang_at: int, *extra: str) -> None:
    proc = sa.start_cli(
        "run", "--db", db, "--log", side, "--session", sid, "--target", "5", "--hang-at", str(hang_at),
        "--hang-marker", marker, *extra,
    )  # fmt: skip
    _wait_for(lambda: os.path.exists(marker) or proc.poll() is not None, "the hang marker")
    assert proc.poll() is None, proc.communicate()
    _kill(proc)


def test_steering_submitted_before_a_crash_reaches_the_agent_once(tmp_path: Path) -> None:
    # Steered while step 2 runs (the boundary that takes it has not come yet), then killed.
    db, side, marker = str(tmp_path / "s.db"), str(tmp_path / "side.log"), str(tmp_path / "hang")
    composition = sa.make_composition(db, side)
    session = composition.session("Index notes", target=5)
    sid = session.session_id.value
    proc = sa.start_cli(
        "run", "--db", db, "--log", side, "--session", sid, "--target", "5", "--hang-at", "2", "--hang-marker", marker
    )
    _wait_for(lambda: os.path.exists(marker) or proc.poll() is not None, "the hang marker")
    session.steer("focus on the index")
    _kill(proc)

    result = composition.restore(sid).run()

    assert result.state.steering_seen == ["focus on the index"]
    assert result.state.steps_done == list(range(5))


def test_steering_taken_at_a_boundary_before_a_crash_is_not_taken_again(tmp_path: Path) -> None:
    # The boundary of step 2 took the steering and its decision was written; then the process died.
    db, side, marker = str(tmp_path / "s.db"), str(tmp_path / "side.log"), str(tmp_path / "hang")
    composition = sa.make_composition(db, side)
    sid = composition.session("Index notes", target=5).session_id.value
    composition.restore(sid).steer("focus on the index")
    _hang_and_kill(db, side, sid, marker, 0)

    result = composition.restore(sid).run()

    assert result.state.steering_seen == ["focus on the index"]
    assert result.state.steps_done == list(range(5))


def _user_texts(view: Any) -> list[str]:
    return [m.get("content") for m in view.messages() if m.get("role") == "user"]


def test_steering_is_one_user_item_of_the_exchange_log_across_a_crash_on_the_model_path(tmp_path: Path) -> None:
    db, side, marker = str(tmp_path / "s.db"), str(tmp_path / "side.log"), str(tmp_path / "hang")
    script = sa.model_script(5)
    composition = sa.make_composition(db, side, agent="model", model=ScriptedModel(script))
    sid = composition.session("Index notes", target=5).session_id.value
    composition.restore(sid).steer("focus on the index")
    # The boundary of step 0 takes the steering into the model's first request; step 0 then hangs.
    _hang_and_kill(db, side, sid, marker, 0, "--agent", "model")

    model = ScriptedModel(script[1:])  # the first response was used by the killed process
    restored = sa.make_composition(db, side, agent="model", model=model)
    result = restored.restore(sid).run()

    assert result.state.steps_done == list(range(5))
    assert result.state.final_result == "done"
    view = restored.restore(sid).inspect().last_request_view
    assert view is not None
    texts = _user_texts(view)
    assert texts.count("focus on the index") == 1, texts
    for request in model.requests:
        assert _user_texts(request).count("focus on the index") == 1


def test_steering_submitted_mid_step_is_one_user_item_on_the_model_path(tmp_path: Path) -> None:
    db, side, marker = str(tmp_path / "s.db"), str(tmp_path / "side.log"), str(tmp_path / "hang")
    script = sa.model_script(5)
    composition = sa.make_composition(db, side, agent="model", model=ScriptedModel(script))
    session = composition.session("Index notes", target=5)
    sid = session.session_id.value
    proc = sa.start_cli(
        "run", "--db", db, "--log", side, "--session", sid, "--target", "5", "--hang-at", "2", "--hang-marker",
        marker, "--agent", "model",
    )  # fmt: skip
    _wait_for(lambda: os.path.exists(marker) or proc.poll() is not None, "the hang marker")
    session.steer("focus on the index")
    _kill(proc)

    model = ScriptedModel(script[3:])
    restored = sa.make_composition(db, side, agent="model", model=model)
    result = restored.restore(sid).run()

    assert result.state.steps_done == list(range(5))
    view = restored.restore(sid).inspect().last_request_view
    assert view is not None
    assert _user_texts(view).count("focus on the index") == 1


# --------------------------------------------------------------------------- batched durability


BATCH_STEPS = 5
BATCHED = ["--durability", "batched", "--batch-steps", str(BATCH_STEPS), "--batch-ms", "60000", "--tools-every", "7"]


def _batched_trial(root: Path, seed: int) -> tuple[str, int, str]:
    """A batched session of 30 steps (tools every 7th step), killed at a random step; (session, step, stderr)."""
    db, side, progress = str(root / "s.db"), str(root / "side.log"), root / "progress.log"
    composition = sa.make_composition(db, side, durability="batched", batch_steps=BATCH_STEPS, batch_ms=60_000)
    sid = composition.session("Index notes", target=30).session_id.value
    composition.runtime.checkpoint_store.close()
    kill_step = random.Random(seed).randrange(3, 28)
    proc = sa.start_cli(
        "run", "--db", db, "--log", side, "--session", sid, "--target", "30", *BATCHED, "--decide-sleep", "0.003",
        "--sleep", "0.002", "--progress-log", str(progress),
    )  # fmt: skip
    _wait_for(lambda: proc.poll() is not None or kill_step in _decided(progress), "the kill step")
    time.sleep(random.Random(seed).uniform(0.0, 0.004))
    return sid, kill_step, _kill(proc)


def test_a_crash_in_batched_mode_loses_at_most_the_batch_and_never_repeats_a_side_effect(tmp_path: Path) -> None:
    seeds = [1, 2, 3]
    roots = [tmp_path / f"b{seed}" for seed in seeds]
    for root in roots:
        root.mkdir()
    with ThreadPoolExecutor(max_workers=len(seeds)) as pool:
        trials = list(pool.map(_batched_trial, roots, seeds))

    for root, (sid, kill_step, err) in zip(roots, trials, strict=True):
        db, side, progress = str(root / "s.db"), str(root / "side.log"), root / "progress.log"
        composition = sa.make_composition(
            db, side, durability="batched", batch_steps=BATCH_STEPS, batch_ms=60_000, tools_every=7
        )
        session = composition.restore(sid)
        inspection = session.inspect()
        assert inspection.snapshot_integrity == "verified"
        committed = inspection.budget["used"].get("steps", 0)
        reached = max(_decided(progress))
        # Documented: up to batch_steps - 1 buffered tool-free boundaries, plus the step in progress.
        assert reached + 1 - committed <= BATCH_STEPS, (kill_step, reached, committed, err)

        result = session.run()

        assert result.state.steps_done == list(range(30))
        side_log = sa.read_side_log(side)
        begins = Counter(call for event, tool, call in side_log if event == "begin" and tool == "append_note")
        assert begins and all(n == 1 for n in begins.values()), begins
        by_call = {o["call"]: o for o in result.state.observed}
        assert sorted(by_call) == sorted(f"s{s}-{t}" for s in range(0, 30, 7) for t in ("append", "index"))
        composition.runtime.checkpoint_store.close()


@pytest.mark.parametrize("hang_at", [1, 3])
def test_a_batched_model_session_killed_mid_step_restores_and_finishes(tmp_path: Path, hang_at: int) -> None:
    # The model's decision flushes the buffered boundaries; the kill lands in the step's first tool.
    db, side, marker = str(tmp_path / "s.db"), str(tmp_path / "side.log"), str(tmp_path / "hang")
    script = sa.model_script(5)
    batched = ["--durability", "batched", "--batch-steps", "4", "--batch-ms", "60000"]
    composition = sa.make_composition(db, side, agent="model", durability="batched", batch_steps=4, batch_ms=60_000)
    sid = composition.session("Index notes", target=5).session_id.value
    _hang_and_kill(db, side, sid, marker, hang_at, "--agent", "model", *batched)

    model = ScriptedModel(script[hang_at + 1 :])  # the killed process used responses 0..hang_at
    restored = sa.make_composition(
        db, side, agent="model", model=model, durability="batched", batch_steps=4, batch_ms=60_000
    )
    session = restored.restore(sid)
    assert session.inspect().snapshot_integrity == "verified"
    result = session.run()

    assert result.state.final_result == "done"
    assert result.state.steps_done == list(range(5))
    assert len(model.requests) == 5 - hang_at  # the killed step was not decided again
    begins = Counter(call for event, tool, call in sa.read_side_log(side) if event == "begin" and tool == "append_note")
    assert all(n == 1 for n in begins.values()), begins
    interrupted = [o["call"] for o in result.state.observed if o["error_kind"] == "interrupted"]
    assert interrupted == [f"s{hang_at}-append"]
    again = restored.restore(sid)
    assert again.inspect().snapshot_integrity == "verified"


def _batched_soak_trial(root: Path, seed: int) -> tuple[str, str, str]:
    """A batched session (the model agent on odd seeds, the scripted one on even) killed at a random
    point; (session, agent, stderr)."""
    db, side, progress = str(root / "s.db"), str(root / "side.log"), root / "progress.log"
    agent = "model" if seed % 2 else "notes"
    composition = sa.make_composition(db, side, agent=agent, durability="batched", batch_steps=4, batch_ms=60_000)
    sid = composition.session("Index notes", target=12).session_id.value
    composition.runtime.checkpoint_store.close()
    rng = random.Random(seed)
    kill_step = rng.randrange(1, 11)
    proc = sa.start_cli(
        "run", "--db", db, "--log", side, "--session", sid, "--target", "12", "--agent", agent,
        "--durability", "batched", "--batch-steps", "4", "--batch-ms", "60000", "--tools-every", "3",
        "--sleep", "0.004", "--progress-log", str(progress),
    )  # fmt: skip

    def reached() -> bool:
        if agent == "model":  # the model path has no decide hook: count the steps' first tool calls
            begun = sum(1 for e, tool, _ in sa.read_side_log(side) if e == "begin" and tool == "append_note")
            return begun > kill_step
        return kill_step in _decided(progress)

    _wait_for(lambda: proc.poll() is not None or reached(), "the kill step")
    time.sleep(rng.uniform(0.0, 0.012))
    return sid, agent, _kill(proc)


def _check_batched_soak(root: Path, sid: str, agent: str) -> None:
    db, side = str(root / "s.db"), str(root / "side.log")
    probe = sa.make_composition(db, side, agent=agent, tools_every=3)
    inspection = probe.restore(sid).inspect()
    assert inspection.snapshot_integrity == "verified", (root, inspection.snapshot_integrity)
    model = None
    if agent == "model":
        decided = inspection.budget["used"].get("steps", 0) + (1 if inspection.tool_batch else 0)
        model = ScriptedModel(sa.model_script(12)[decided:])
    composition = sa.make_composition(
        db, side, agent=agent, model=model, durability="batched", batch_steps=4, batch_ms=60_000, tools_every=3
    )
    result = composition.restore(sid).run()
    where = f"{root.name} ({agent})"
    assert result.state.steps_done == list(range(12)), where
    begins = Counter(call for event, tool, call in sa.read_side_log(side) if event == "begin" and tool == "append_note")
    assert all(n == 1 for n in begins.values()), (where, begins)
    applied = Counter(o["call"] for o in result.state.observed)
    assert all(n == 1 for n in applied.values()), (where, applied)
    assert composition.restore(sid).inspect().snapshot_integrity == "verified", where
    composition.runtime.checkpoint_store.close()


def _batched_soak(tmp_path: Path, seeds: list[int]) -> None:
    roots = [tmp_path / f"soak{seed}" for seed in seeds]
    for root in roots:
        root.mkdir()
    with ThreadPoolExecutor(max_workers=5) as pool:
        trials = list(pool.map(_batched_soak_trial, roots, seeds))
    for root, (sid, agent, _) in zip(roots, trials, strict=True):
        _check_batched_soak(root, sid, agent)


def test_batched_kill_9_soak_every_session_restorable_nothing_doubled(tmp_path: Path) -> None:
    _batched_soak(tmp_path, seeds=list(range(5)))


@pytest.mark.slow
def test_batched_kill_9_soak_fifty_trials(tmp_path: Path) -> None:
    _batched_soak(tmp_path, seeds=list(range(100, 150)))
