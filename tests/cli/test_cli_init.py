"""``qitos init NAME`` writes a project that runs and passes as written: every command it prints
and every command of the project's README, run with bash in a fresh directory."""

from __future__ import annotations

import json
import re
from pathlib import Path

from user_shell import sh

FILES = ["README.md", "agent.py", "dataset.jsonl", "test_agent.py", "tools.py"]


def test_the_printed_commands_run_and_the_projects_tests_pass(tmp_path: Path) -> None:
    out = sh("qitos init 'my agent'", tmp_path).stdout
    assert out.startswith("created my agent/: " + ", ".join(FILES))
    commands = [line.strip() for line in out.split("next:", 1)[1].splitlines() if line.strip()]
    assert commands[0] == "cd 'my agent'" and len(commands) == 5
    done = sh(" && ".join(commands), tmp_path, timeout=300)
    assert "84" in done.stdout and "exact" in done.stdout  # the answer, then the eval's score table
    assert re.search(r"\b10 passed\b", done.stdout), done.stdout  # tool, agent, six samples, the eval, a session


def test_the_projects_readme_commands_run_as_written(tmp_path: Path) -> None:
    sh("qitos init calc", tmp_path)
    project = tmp_path / "calc"
    readme = (project / "README.md").read_text(encoding="utf-8")
    assert readme.startswith("# calc\n")
    (block,) = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    for line in block.splitlines():
        command = line.split("  #", 1)[0].strip()
        sh(command, project, timeout=300)
    samples = [json.loads(line) for line in (project / "dataset.jsonl").read_text().splitlines()]
    assert {"id", "input", "target"} <= set(samples[0]) and len({s["id"] for s in samples}) == len(samples)


def test_init_never_writes_over_files(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "agent.py").write_text("mine", encoding="utf-8")
    failed = sh("qitos init taken", tmp_path, code=2)
    assert "taken exists and is not an empty directory" in failed.stderr
    assert (tmp_path / "taken" / "agent.py").read_text(encoding="utf-8") == "mine"
    (tmp_path / "empty").mkdir()
    made = json.loads(sh("qitos init empty --json", tmp_path).stdout)
    assert made["files"] == FILES and made["project"] == str(tmp_path / "empty")
