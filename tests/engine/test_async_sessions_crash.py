"""Many sessions at once on one SQLite file through ``Session.arun``; the process is killed with
kill -9 mid-run, then every session is restored and finished: nothing lost, nothing doubled.
The default version runs 20 sessions; the slow one 200.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import session_agents as sa

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "async_sessions.py"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), str(HERE), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _script(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), *args], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _begun(side_dir: Path) -> int:
    return sum(1 for log in side_dir.glob("ses*.log") for event, _, _ in sa.read_side_log(log) if event == "begin")


def _created(tmp_path: Path, count: int, target: int) -> tuple[str, Path, list[str]]:
    db, side_dir = str(tmp_path / "sessions.db"), tmp_path / "side"
    side_dir.mkdir()
    creator = _script("create", db, str(side_dir), str(count), str(target))
    out, err = creator.communicate(timeout=120)
    assert creator.returncode == 0, err
    ids = json.loads(out)
    assert len(ids) == count
    return db, side_dir, ids


def _kill_mid_run_then_finish(tmp_path: Path, count: int, target: int) -> None:
    db, side_dir, ids = _created(tmp_path, count, target)
    total_calls = count * target * 2
    runner = _script("run", db, str(side_dir))
    deadline = time.monotonic() + 120
    while _begun(side_dir) < total_calls // 3:  # kill once about a third of the calls have started
        assert runner.poll() is None, runner.communicate()
        assert time.monotonic() < deadline, "the runs did not progress"
        time.sleep(0.01)
    runner.send_signal(signal.SIGKILL)
    runner.wait(30)
    assert _begun(side_dir) < total_calls  # killed mid-run
    _finish_and_check(db, side_dir, ids, target)


def _finish_and_check(db: str, side_dir: Path, ids: list[str], target: int) -> None:
    """Restore and finish every session, then check each one's state and side-effect ledger."""
    finisher = _script("run", db, str(side_dir))
    out, err = finisher.communicate(timeout=300)
    assert finisher.returncode == 0, err
    summaries = json.loads(out)
    assert sorted(summaries) == sorted(ids)
    for sid, summary in summaries.items():
        assert summary["stop_reason"] == "final", (sid, summary)
        state = summary["state"]
        assert state["steps_done"] == list(range(target)), (sid, state["steps_done"])  # nothing lost
        log = sa.read_side_log(side_dir / f"{sid}.log")
        begins = Counter(call for event, tool, call in log if event == "begin" and tool == "append_note")
        ends = Counter(call for event, tool, call in log if event == "end" and tool == "append_note")
        interrupted = {o["call"] for o in state["observed"] if o["error_kind"] == "interrupted"}
        assert {o["tool"] for o in state["observed"] if o["error_kind"] == "interrupted"} <= {"append_note"}
        for step in range(target):
            call = f"s{step}-append"
            # The non-idempotent call never ran twice; if the kill cut it off (or came between its
            # recorded start and its first line), the agent was told it was interrupted.
            assert begins[call] <= 1, (sid, call, log)
            if ends[call] == 0:
                assert call in interrupted, (sid, call, state["observed"])


def test_a_kill_inside_a_group_commit_of_hundreds_of_sessions_loses_and_doubles_nothing(tmp_path: Path) -> None:
    """300 sessions in flight; the process kills itself in the middle of a group transaction holding
    at least 150 of their writes (commits and tool starts), after the 150th. Nothing of that group
    was acknowledged, so no session went on past it: every session restores, finishes once, and no
    non-idempotent call ran twice."""
    count, target = 300, 3
    db, side_dir, ids = _created(tmp_path, count, target)
    runner = _script("run", db, str(side_dir), "150")
    _, err = runner.communicate(timeout=300)
    assert runner.returncode == -signal.SIGKILL, err  # it died inside a group
    assert _begun(side_dir) < count * target * 2
    _finish_and_check(db, side_dir, ids, target)


def test_twenty_concurrent_async_sessions_survive_kill_9_and_finish_once(tmp_path: Path) -> None:
    _kill_mid_run_then_finish(tmp_path, count=20, target=6)


@pytest.mark.slow
def test_two_hundred_concurrent_async_sessions_survive_kill_9_and_finish_once(tmp_path: Path) -> None:
    _kill_mid_run_then_finish(tmp_path, count=200, target=5)
