"""``qitos --version`` and ``qitos demo``, in process and through the real console script."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import qitos
from qitos.demo._notes_agent import bundled_note_paths
from qitos.trace import open_run

DEMO_KEYS = {
    "run_id",
    "session_id",
    "status",
    "stop_reason",
    "steps",
    "session_steps",
    "final_result",
    "tokens",
    "run_dir",
    "error",
    "workspace",
    "policy",
    "model",
}


def test_version_flag_prints_the_package_version(cli: Any) -> None:
    result = cli.run("--version", code=0)
    assert result.stdout.strip() == f"qitos {qitos.__version__}"


def test_no_arguments_shows_help_as_a_usage_error(cli: Any) -> None:
    result = cli.run(code=2)
    assert "demo" in result.stdout + result.stderr


def test_demo_prints_each_step_and_the_final_index(cli: Any, workdir: Path) -> None:
    result = cli.run("demo", "--policy", "scripted", "--workspace", "ws", code=0)
    out = result.stdout
    assert "policy scripted" in out
    assert "list_files" in out and "read_file" in out and "write_file" in out
    for step in range(len(bundled_note_paths()) + 3):
        assert f"step {step:>2} " in out
    assert "completed · final" in out
    assert "answer:" in out and "# Notes index (5 notes)" in out
    assert "\x1b[" not in out  # not a terminal: plain text
    assert (workdir / "ws" / "INDEX.md").is_file()
    assert any((workdir / "runs").iterdir())


def test_demo_json_has_a_stable_shape_and_writes_a_trace(cli: Any, workdir: Path) -> None:
    data = cli.json("demo", "--policy", "scripted", "--json", "--workspace", "ws")
    assert set(data) == DEMO_KEYS
    assert (data["status"], data["stop_reason"], data["policy"], data["model"]) == (
        "completed",
        "final",
        "scripted",
        None,
    )
    assert data["steps"] == len(bundled_note_paths()) + 3
    assert data["final_result"].startswith("# Notes index")
    trace = open_run(data["run_dir"])
    assert trace.manifest()["status"] == "completed"
    assert len(trace.steps()) == data["steps"]


def test_demo_model_policy_with_the_scripted_model_shows_compaction(cli: Any, workdir: Path) -> None:
    data = cli.json("demo", "--policy", "model", "--model", "scripted", "--json", "--workspace", "ws")
    assert (data["status"], data["policy"], data["model"]) == ("completed", "model", "scripted")
    steps = open_run(data["run_dir"]).steps()
    assert [("request_view" in s, "model" in s) for s in steps] == [(True, True)] * 6 + [(False, False)] * 2
    receipts = [r for s in steps[:6] for r in s["request_view"]["receipts"]]
    assert receipts and receipts[0]["policy_id"].startswith("qitos.context.closed_exchange_window")


def test_demo_model_flag_alone_selects_the_model_policy(cli: Any, workdir: Path) -> None:
    data = cli.json("demo", "--model", "scripted", "--json", "--workspace", "ws")
    assert data["policy"] == "model"


def test_demo_indexes_the_notes_of_an_existing_workspace(cli: Any, workdir: Path) -> None:
    mine = workdir / "mine"
    mine.mkdir()
    (mine / "plans.md").write_text("# Plans\n\nShip the viewer.\n", encoding="utf-8")
    data = cli.json("demo", "--policy", "scripted", "--json", "--workspace", str(mine))
    assert "- plans.md: Plans - Ship the viewer." in data["final_result"]
    assert sorted(p.name for p in mine.iterdir()) == ["INDEX.md", "plans.md"]


def test_demo_max_steps_too_small_stops_abnormally_with_exit_1(cli: Any, workdir: Path) -> None:
    data = cli.json("demo", "--policy", "scripted", "--json", "--workspace", "ws", "--max-steps", "2", code=1)
    assert (data["status"], data["stop_reason"], data["steps"]) == ("stopped", "max_steps_reached", 2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "scripted", "--model", "scripted"], "--model applies to --policy model"),
        (["--policy", "magic"], "--policy must be scripted or model"),
        (["--model", "openai:gpt"], "takes local or scripted"),
    ],
)
def test_demo_bad_options_are_one_line_usage_errors(cli: Any, workdir: Path, args: list[str], message: str) -> None:
    result = cli.run("demo", *args, code=2)
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_demo_workspace_that_is_a_file_is_a_usage_error(cli: Any, workdir: Path) -> None:
    (workdir / "afile").write_text("x", encoding="utf-8")
    result = cli.run("demo", "--workspace", "afile", code=2)
    assert "is not a directory" in result.stderr


@pytest.mark.skipif(
    importlib.util.find_spec("cyllama") is not None, reason="the local model's runtime is installed here"
)
def test_demo_local_model_missing_is_a_clear_usage_error(cli: Any, workdir: Path) -> None:
    result = cli.run("demo", "--model", "local", "--workspace", "ws", code=2)
    assert "local model is not available" in result.stderr


def test_debug_flag_adds_the_traceback(cli: Any, workdir: Path) -> None:
    (workdir / "afile").write_text("x", encoding="utf-8")
    result = cli.run("--debug", "demo", "--workspace", "afile", code=2)
    assert "Traceback" in result.stderr
    assert result.stderr.rstrip().splitlines()[-1].startswith("error: ")


def _console_script() -> str:
    script = Path(sys.executable).with_name("qitos")
    assert script.is_file(), f"the qitos console script is not installed next to {sys.executable}"
    return str(script)


@pytest.mark.slow
def test_console_script_version_and_demo_run_in_a_real_process(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QITOS_")}
    version = subprocess.run([_console_script(), "--version"], capture_output=True, text=True, timeout=60, env=env)
    assert version.returncode == 0 and version.stdout.strip() == f"qitos {qitos.__version__}"
    demo = subprocess.run(
        [_console_script(), "demo", "--policy", "scripted", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    assert demo.returncode == 0, demo.stderr
    data = json.loads(demo.stdout)
    assert data["status"] == "completed"
    assert (tmp_path / data["run_dir"]).is_dir()
    assert Path(data["workspace"], "INDEX.md").is_file()


def test_importing_qitos_and_the_viewer_does_not_import_typer_or_rich() -> None:
    code = (
        "import sys, qitos, qitos.demo, qitos.viewer._server, qitos.viewer._data\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('typer', 'rich', 'click'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.slow
def test_a_reader_that_goes_away_does_not_cut_the_run_short(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QITOS_")}
    proc = subprocess.Popen(
        [_console_script(), "demo", "--policy", "scripted"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # like `qitos demo | head -1`
    stderr = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert "Traceback" not in stderr and "Exception ignored" not in stderr
    [run_dir] = list((tmp_path / "runs").iterdir())
    assert open_run(str(run_dir)).manifest()["status"] == "completed"


def _local_model_loadable() -> bool:
    if importlib.util.find_spec("cyllama") is None:
        return False
    try:
        from qitos.models._local import default_model_path

        default_model_path()
    except (ImportError, OSError):
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not _local_model_loadable(), reason="the embedded local model (qitos[local]) is not installed")
def test_demo_with_the_embedded_local_model_reads_every_note_offline(cli: Any, workdir: Path) -> None:
    data = cli.json("demo", "--model", "local", "--json", "--workspace", "ws")
    assert (data["status"], data["policy"], data["model"]) == ("completed", "model", "local")
    steps = open_run(data["run_dir"]).steps()
    model_steps = [s for s in steps if s.get("model")]
    assert model_steps[0]["actions"][0]["name"] == "list_files"
    assert sorted(a["args"]["path"] for s in model_steps for a in s["actions"] if a["name"] == "read_file") == (
        bundled_note_paths()
    )
    assert all(s["model"]["response"]["model"].startswith("local:") for s in model_steps)
    assert data["tokens"] > 0
    assert data["final_result"].startswith("# Notes index (5 notes)")
