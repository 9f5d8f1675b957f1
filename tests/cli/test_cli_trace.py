"""``qitos trace list|show|export|serve``."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

RUN_SUMMARY_KEYS = {
    "run_id",
    "dir",
    "status",
    "task",
    "agent",
    "steps",
    "stop_reason",
    "tokens",
    "duration_s",
    "started_at",
    "ended_at",
    "final_result",
    "error",
    "model_steps",
    "receipts",
}


def _demo(cli: Any, *extra: str) -> dict[str, Any]:
    options = extra or ("--policy", "scripted")  # the demo's default is the local model; keep these runs scripted
    return dict(cli.json("demo", "--json", "--workspace", "ws", *options))


def test_list_on_an_empty_logdir_says_so(cli: Any, workdir: Path) -> None:
    assert cli.json("trace", "list", "--json") == {"logdir": str(workdir / "runs"), "runs": []}
    assert "no runs in ./runs" in cli.run("trace", "list", code=0).stdout


def test_list_shows_runs_newest_first_with_a_stable_shape(cli: Any, workdir: Path) -> None:
    first = _demo(cli)
    second = _demo(cli, "--policy", "model", "--model", "scripted")
    data = cli.json("trace", "list", "--json")
    assert [r["run_id"] for r in data["runs"]] == [second["run_id"], first["run_id"]]
    row = data["runs"][0]
    assert set(row) == RUN_SUMMARY_KEYS
    assert (row["status"], row["stop_reason"], row["steps"], row["agent"]) == ("completed", "final", 8, "NotesAgent")
    assert row["model_steps"] == 6 and row["receipts"] >= 1
    assert row["duration_s"] is not None and row["duration_s"] >= 0
    human = cli.run("trace", "list", code=0).stdout
    assert first["run_id"] in human and second["run_id"] in human and "completed" in human


def test_show_by_id_or_unique_prefix(cli: Any, workdir: Path) -> None:
    run = _demo(cli, "--policy", "model", "--model", "scripted")
    detail = cli.json("trace", "show", run["run_id"], "--json")
    assert set(detail) == {"run", "manifest", "steps"}
    assert detail["run"]["run_id"] == run["run_id"]
    assert len(detail["steps"]) == 8
    assert [bool(s.get("request_view")) for s in detail["steps"]] == [True] * 6 + [False] * 2
    assert detail["steps"][5]["request_view"]["receipts"]
    prefix = run["run_id"][: len("run_") + 6]
    assert cli.json("trace", "show", prefix, "--json")["run"]["run_id"] == run["run_id"]
    human = cli.run("trace", "show", run["run_id"], code=0).stdout
    assert "read_file" in human and "answer:" in human and "receipts" in human


def test_show_unknown_run_exits_3_and_an_ambiguous_prefix_exits_2(cli: Any, workdir: Path) -> None:
    _demo(cli)
    _demo(cli)
    missing = cli.run("trace", "show", "run_nope", code=3)
    assert "no run 'run_nope'" in missing.stderr
    ambiguous = cli.run("trace", "show", "run_", code=2)
    assert "ambiguous" in ambiguous.stderr and "2 runs" in ambiguous.stderr


def test_export_writes_manifest_steps_and_events(cli: Any, workdir: Path) -> None:
    run = _demo(cli)
    doc = cli.json("trace", "export", run["run_id"])
    assert doc["format"] == "qitos.trace/v1"
    assert doc["manifest"]["run_id"] == run["run_id"]
    assert len(doc["steps"]) == run["steps"]
    kinds = [e["event_type"] for e in doc["events"]]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end"
    result = cli.run("trace", "export", run["run_id"], "-o", "out.json", code=0)
    assert json.loads((workdir / "out.json").read_text(encoding="utf-8")) == doc
    assert "exported" in result.stderr and result.stdout == ""


def test_export_unknown_run_exits_3(cli: Any, workdir: Path) -> None:
    assert cli.run("trace", "export", "nope", code=3).stderr.startswith("error: no run")


def test_an_unreadable_run_is_listed_as_such_not_hidden(cli: Any, workdir: Path) -> None:
    run = _demo(cli)
    Path(run["run_dir"], "manifest.json").write_text("{broken", encoding="utf-8")
    rows = cli.json("trace", "list", "--json")["runs"]
    assert [r["status"] for r in rows] == ["unreadable"]
    assert "invalid JSON" in rows[0]["error"]


@pytest.mark.slow
def test_serve_binds_loopback_prints_its_url_and_answers_the_api(workdir: Path, cli: Any) -> None:
    _demo(cli)
    script = Path(sys.executable).with_name("qitos")
    proc = subprocess.Popen(
        [str(script), "trace", "serve", "--port", "0"],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("QITOS_")},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, line
        with urllib.request.urlopen(match.group(0) + "api/runs", timeout=10) as response:
            data = json.load(response)
        assert len(data["runs"]) == 1
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)
    assert proc.returncode == 0


def test_serve_on_a_port_in_use_is_a_usage_error(cli: Any, workdir: Path) -> None:
    from qitos.viewer._server import ViewerServer

    with ViewerServer(str(workdir / "runs"), port=0) as busy:
        result = cli.run("trace", "serve", "--port", str(busy.port), code=2)
    assert "cannot listen on 127.0.0.1" in result.stderr
