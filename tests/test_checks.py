"""The static checks are one script, run alike by CI (``scripts/test.sh``) and by the pre-commit hooks."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ci_and_the_pre_commit_hooks_run_the_same_checks() -> None:
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text(encoding="utf-8"))
    (repo,) = config["repos"]
    assert repo["repo"] == "local"  # nothing fetched: the project's own tools
    entries = {hook["id"]: hook["entry"] for hook in repo["hooks"]}
    assert entries["ruff"] == "bash scripts/check.sh ruff" and entries["mypy"] == "bash scripts/check.sh mypy"
    assert "-m pytest" in entries["pytest"]
    ci = (ROOT / "scripts" / "test.sh").read_text(encoding="utf-8").splitlines()
    assert "bash scripts/check.sh" in ci
    assert not [line for line in ci if line.startswith((".venv/bin/ruff", ".venv/bin/mypy"))]


def test_the_check_script_refuses_a_check_it_does_not_know() -> None:
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "check.sh"), "black"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "usage: bash scripts/check.sh [ruff|mypy]"
