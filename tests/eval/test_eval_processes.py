"""Evals across real processes: two runners of one eval at once, and kill -9 at any moment."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from chat_server import ScriptServer
from eval_agents import RUNS_FILE

HERE = Path(__file__).resolve().parent
SRC = Path(__file__).resolve().parents[2] / "src"

RUNNER = """
import json, os, sys
from eval_agents import Asker, Upper
from qitos.eval import Dataset, Sample, evaluate, scorers
from qitos.models import OpenAICompatibleModel

n, kind = int(sys.argv[1]), sys.argv[2]
if kind == "model":
    data = Dataset([Sample(f"w{i} go", f"W{i} GO", id=f"s{i}") for i in range(n)], name="crash")
    model = OpenAICompatibleModel("m", base_url=os.environ["EVAL_BASE_URL"], api_key="sk-test", max_retries=0)
    report = evaluate(Asker, data, scorers=[scorers.exact()], model=model, store=sys.argv[3], name="crashy",
                      max_samples=8)
else:
    data = Dataset([Sample(f"slow {i}", f"SLOW {i}", id=f"s{i}") for i in range(n)], name="two")
    report = evaluate(Upper, data, scorers=[scorers.exact()], store=sys.argv[3], name="shared", max_samples=4)
print(json.dumps(report.to_dict()))
"""


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(HERE)])
    env.update(extra)
    return env


def _start(tmp_path: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        cwd=tmp_path,
        env=_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _report(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return report


def test_two_processes_running_one_eval_run_each_sample_once(tmp_path: Path) -> None:
    runs = tmp_path / "runs.txt"
    db = str(tmp_path / "e.db")
    first = _start(tmp_path, "16", "upper", db, **{RUNS_FILE: str(runs)})
    second = _start(tmp_path, "16", "upper", db, **{RUNS_FILE: str(runs)})
    one, two = _report(first), _report(second)
    lines = runs.read_text().splitlines()
    assert len(lines) == len(set(lines)) == 16 * 4  # every step of every sample decided once in all
    assert one["status"] == two["status"] == "complete"
    assert one["samples"] == two["samples"] and one["metrics"] == two["metrics"]


def test_kill_9_at_random_moments_then_resume_repeats_no_committed_model_call(tmp_path: Path) -> None:
    n = 24
    rng = random.Random(7)
    db = str(tmp_path / "e.db")
    with ScriptServer(delay=0.05) as server:
        env = {"EVAL_BASE_URL": server.url}
        kills = 0
        for _ in range(4):
            proc = _start(tmp_path, str(n), "model", db, **env)
            target = server.calls + rng.randint(3, 14)
            deadline = time.monotonic() + 120
            while server.calls < target and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.005)
            if proc.poll() is not None:
                break
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            kills += 1
        report = _report(_start(tmp_path, str(n), "model", db, **env))
        calls = server.calls
    assert kills >= 2
    assert report["status"] == "complete" and report["metrics"]["exact"]["mean"] == 1.0
    assert [s["answer"] for s in report["samples"]] == [f"W{i} GO" for i in range(n)]
    # An uninterrupted run makes 3 calls a sample; a kill can cost at most the calls in flight then
    # (one per sample in flight, 8 at most), never a call whose reply was committed.
    assert 3 * n <= calls <= 3 * n + 8 * kills
    assert all(s["steps"] == 3 and s["attempts"] == 1 for s in report["samples"])
