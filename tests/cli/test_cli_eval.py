"""``qitos eval`` end to end in real subprocesses: run, list, show, score, resume, progress, Ctrl-C."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import qitos

EVAL_TESTS = Path(__file__).resolve().parents[1] / "eval"


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(qitos.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([src, str(EVAL_TESTS), *filter(None, [env.get("PYTHONPATH")])])
    env.update(extra)
    return env


def qitos_eval(cwd: Path, *args: str, check: int | None = 0, **env: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "qitos.cli.app", "eval", *args],
        cwd=cwd,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check is not None:
        assert done.returncode == check, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def _dataset(cwd: Path, rows: list[dict[str, Any]], name: str = "qa.jsonl") -> Path:
    path = cwd / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [
    {"id": "a", "input": "alpha", "target": "ALPHA", "level": "easy"},
    {"id": "b", "input": "beta", "target": "nope", "level": "hard"},
    {"id": "c", "input": "gamma", "target": "GAMMA", "level": "hard"},
]


def test_run_list_show_score_resume_as_json(tmp_path: Path) -> None:
    _dataset(tmp_path, ROWS)
    runs = tmp_path / "runs.txt"
    out = qitos_eval(
        tmp_path,
        "run",
        "qa.jsonl",
        "--agent",
        "eval_agents:Upper",
        "--scorer",
        "exact",
        "--scorer",
        "includes",
        "--epochs",
        "2",
        "--name",
        "first",
        "--json",
        QITOS_TEST_EVAL_RUNS=str(runs),
    )
    report = json.loads(out.stdout)  # only the report on stdout
    assert report["name"] == "first" and report["status"] == "complete" and len(report["samples"]) == 6
    assert report["metrics"]["exact"]["mean"] == 2 / 3 and report["metrics"]["includes"]["n"] == 3
    assert len(runs.read_text().splitlines()) == 6 and (tmp_path / "evals.db").exists()
    listed = json.loads(qitos_eval(tmp_path, "list", "--json").stdout)
    assert [(e["name"], e["status"], e["done"], e["total"]) for e in listed] == [("first", "complete", 6, 6)]
    shown = json.loads(qitos_eval(tmp_path, "show", "first", "--group-by", "level", "--json").stdout)
    assert shown["groups"]["hard"]["exact"]["mean"] == 0.5 and shown["groups"]["easy"]["exact"]["mean"] == 1.0
    by_id = json.loads(qitos_eval(tmp_path, "show", report["eval_id"], "--json").stdout)
    assert by_id["samples"] == report["samples"]
    scored = json.loads(qitos_eval(tmp_path, "score", "first", "--scorer", "pattern:^(AL)", "--json").stdout)
    assert scored["metrics"]["pattern"]["n"] == 3 and scored["metrics"]["pattern"]["mean"] == 0.0
    resumed = json.loads(qitos_eval(tmp_path, "resume", "first", "--json", QITOS_TEST_EVAL_RUNS=str(runs)).stdout)
    assert resumed["status"] == "complete" and len(runs.read_text().splitlines()) == 6  # nothing ran again
    assert set(resumed["metrics"]) == {"exact", "includes", "pattern"}


def test_errors_are_one_line_with_exit_codes(tmp_path: Path) -> None:
    _dataset(tmp_path, ROWS)
    missing = qitos_eval(tmp_path, "show", "nope", check=3)
    assert "error: no store at evals.db" in missing.stderr
    qitos_eval(tmp_path, "run", "qa.jsonl", "--agent", "eval_agents:Upper", "--name", "x", "--json")
    unknown = qitos_eval(tmp_path, "show", "nope", "--json", check=3)
    assert json.loads(unknown.stdout)["error"].startswith("no eval 'nope'")
    bad_rows = _dataset(tmp_path, [{"id": "a", "input": "x"}, {"id": "a", "input": "y"}], "dup.jsonl")
    dup = qitos_eval(tmp_path, "run", str(bad_rows), "--agent", "eval_agents:Upper", check=2)
    assert "dup.jsonl:2: duplicate sample id 'a' (first on line 1)" in dup.stderr
    numeric = qitos_eval(tmp_path, "run", "qa.jsonl", "--agent", "eval_agents:Upper", "--scorer", "numeric", check=2)
    assert "scorer 'numeric': sample 'a' has target 'ALPHA'" in numeric.stderr
    assert "unknown scorer 'fuzzy'" in qitos_eval(tmp_path, "score", "x", "--scorer", "fuzzy", check=2).stderr
    changed = _dataset(tmp_path, ROWS[:2])
    refused = qitos_eval(tmp_path, "run", str(changed), "--agent", "eval_agents:Upper", "--name", "x", check=2)
    assert "eval 'x' was run with a different setup" in refused.stderr and "dataset (digest" in refused.stderr
    assert (
        "cannot read the dataset"
        in qitos_eval(tmp_path, "run", "gone.jsonl", "--agent", "eval_agents:Upper", check=2).stderr
    )
    python_eval = tmp_path / "made.py"
    python_eval.write_text(
        "from eval_agents import Upper\nfrom qitos.eval import Dataset, Sample, evaluate, scorers\n"
        "evaluate(Upper, Dataset([Sample('a', 'A')]), scorers=[scorers.exact()], name='py')\n"
    )
    subprocess.run([sys.executable, str(python_eval)], cwd=tmp_path, env=_env(), check=True, timeout=60)
    assert "was started from Python" in qitos_eval(tmp_path, "resume", "py", check=2).stderr


def _read_pty(fd: int, until: float) -> bytes:
    chunks = b""
    while time.monotonic() < until:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:
                break
            if not data:
                break
            chunks += data
    return chunks


def test_a_terminal_sees_live_progress_then_the_score_table(tmp_path: Path) -> None:
    _dataset(tmp_path, [{"id": str(i), "input": f"slow {i}", "target": f"SLOW {i}"} for i in range(12)])
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "qitos.cli.app",
            "eval",
            "run",
            "qa.jsonl",
            "--agent",
            "eval_agents:Upper",
            "--max-samples",
            "2",
            "--name",
            "live",
        ],
        cwd=tmp_path,
        env=_env(COLUMNS="160", TERM="xterm"),
        stdin=follower,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    output = _read_pty(leader, time.monotonic() + 60).decode(errors="replace")
    assert proc.wait(timeout=30) == 0
    os.close(leader)
    assert "running" in output and "ETA" in output and "tokens" in output and "elapsed" in output
    assert ("/12 done" in output and "12/12 done" in output) or "12/12 samples" in output
    assert "scorer" in output and "1.000" in output and "complete: 12/12 samples" in output


def test_ctrl_c_leaves_the_eval_incomplete_and_resume_finishes_it(tmp_path: Path) -> None:
    _dataset(tmp_path, [{"id": str(i), "input": f"slow {i}", "target": f"SLOW {i}"} for i in range(30)])
    runs = tmp_path / "runs.txt"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "qitos.cli.app",
            "eval",
            "run",
            "qa.jsonl",
            "--agent",
            "eval_agents:Upper",
            "--max-samples",
            "4",
            "--name",
            "stopped",
            "--json",
        ],
        cwd=tmp_path,
        env=_env(QITOS_TEST_EVAL_RUNS=str(runs)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not runs.exists() or len(runs.read_text().splitlines()) < 12):
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert json.loads(stdout)["error"].startswith("interrupted: eval 'stopped' is incomplete")
    listed = json.loads(qitos_eval(tmp_path, "list", "--json").stdout)
    assert listed[0]["status"] == "incomplete" and listed[0]["done"] < 30
    before = len(runs.read_text().splitlines())
    report = json.loads(qitos_eval(tmp_path, "resume", "stopped", "--json", QITOS_TEST_EVAL_RUNS=str(runs)).stdout)
    assert report["status"] == "complete" and report["metrics"]["exact"]["mean"] == 1.0
    # every slow sample decides 4 times; the interrupted ones went on from their last step
    assert len(runs.read_text().splitlines()) == 30 * 4 and before < 30 * 4
    steps = [line for line in runs.read_text().splitlines()]
    assert len(set(steps)) == len(steps)  # no step of any sample was decided twice
