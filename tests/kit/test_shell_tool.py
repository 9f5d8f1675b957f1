"""The shell tool: approval by default, no shell interpretation, timeout kills the group, output capped."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from qitos.core._errors import ConfigurationError
from qitos.core._tool import ToolRegistry
from qitos.kit.tools._shell import shell_environment, shell_tool

PY = sys.executable


def run(registry: ToolRegistry, command: str) -> str:
    result = registry.call("shell", {"command": command}, call_id="s1")
    assert result.ok, result.error
    assert isinstance(result.output, str)
    return result.output


def test_the_tool_needs_approval_unless_allowed(tmp_path: Path) -> None:
    assert shell_tool(cwd=tmp_path).needs_approval is True
    assert shell_tool(cwd=tmp_path, allow=True).needs_approval is False
    spec = shell_tool(cwd=tmp_path)
    assert spec.name == "shell" and spec.parameters["required"] == ["command"] and not spec.idempotent
    assert "no shell runs it" in spec.description


def test_a_command_runs_in_cwd_and_reports_its_exit_code(tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("hello\n")
    registry = ToolRegistry([shell_tool(cwd=tmp_path, allow=True)])
    assert run(registry, "cat data.txt") == "exit code: 0\nhello\n"
    output = run(registry, f"{PY} -c \"import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)\"")
    assert output.startswith("exit code: 3\n") and "out" in output and "err" in output


def test_shell_syntax_is_passed_literally_not_interpreted(tmp_path: Path) -> None:
    registry = ToolRegistry([shell_tool(cwd=tmp_path, allow=True)])
    output = run(registry, "echo a; touch pwned && echo $HOME `id` | cat > out *")
    assert output == "exit code: 0\na; touch pwned && echo $HOME `id` | cat > out *\n"
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "command",
    [
        "echo hi; touch pwned",
        "echo hi && touch pwned",
        "echo hi || touch pwned",
        "echo $(touch pwned)",
        "echo `touch pwned`",
        "echo hi > pwned",
        "echo hi | tee pwned",
    ],
)
def test_injection_attempts_run_one_program_with_literal_arguments(tmp_path: Path, command: str) -> None:
    """Regression: none of these reaches a shell, so no file is ever created."""
    registry = ToolRegistry([shell_tool(cwd=tmp_path, allow=True)])
    output = run(registry, command)
    assert output.startswith("exit code: 0\n") and not (tmp_path / "pwned").exists()


def test_a_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time; "
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pid_file)!r}, 'w').write(str(child.pid)); time.sleep(60)"
    )
    registry = ToolRegistry([shell_tool(cwd=tmp_path, allow=True, timeout=1.0)])
    started = time.monotonic()
    result = registry.call("shell", {"command": f'{PY} -c "{script}"'})
    assert not result.ok and result.error_kind == "timeout"
    assert "timed out after 1" in (result.error or "")
    assert time.monotonic() - started < 10
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child), "the grandchild survived the timeout"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_output_is_capped_while_reading(tmp_path: Path) -> None:
    registry = ToolRegistry([shell_tool(cwd=tmp_path, allow=True, max_output_chars=100)])
    output = run(registry, f"{PY} -c \"import sys; sys.stdout.write('y' * 5_000_000)\"")
    assert output.startswith("exit code: 0\n" + "y" * 100 + "\n...[output truncated: 5000000 bytes produced")
    assert len(output) < 300


def test_secret_looking_environment_variables_are_not_passed_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-should-not-leak")
    monkeypatch.setenv("LC_QITOS_TEST", "visible")
    registry = ToolRegistry([shell_tool(cwd=tmp_path, allow=True)])
    output = run(registry, "env")
    assert "LC_QITOS_TEST=visible" in output and "sk-should-not-leak" not in output
    explicit = ToolRegistry([shell_tool(cwd=tmp_path, allow=True, env={"ONLY": "this", "PATH": os.environ["PATH"]})])
    assert run(explicit, "env").splitlines()[1:] == ["ONLY=this", f"PATH={os.environ['PATH']}"]


LEAKY = {
    "DATABASE_URL": "postgresql://app:pg-pass-42@db.internal/app",
    "GITHUB_PAT": "github-pat-value-1234",
    "MY_PASSWD": "passwd-value-5678",
    "AUTH_HEADER": "Basic dXNlcjpwYXNz",
    "QITOS_PLAIN_SETTING": "plain-value",
}


def test_the_environment_is_an_allow_list_so_unlisted_credentials_never_reach_a_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in LEAKY.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("LANG", "C.UTF-8")
    output = run(ToolRegistry([shell_tool(cwd=tmp_path, allow=True)]), "env")
    names = {line.split("=", 1)[0] for line in output.splitlines()[1:] if "=" in line}
    assert not names & set(LEAKY), output
    assert f"PATH={os.environ['PATH']}" in output and "LANG=C.UTF-8" in output
    assert names <= {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TERM",
        "COLORTERM",
        "NO_COLOR",
        "TZ",
        "TMPDIR",
        "TEMP",
        "TMP",
    } | {n for n in names if n.startswith("LC_")}


def test_env_allow_passes_exact_names_even_secret_ones_and_patterns_only_harmless_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in LEAKY.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("QITOS_TOKEN", "tok-value-999")
    tool = shell_tool(cwd=tmp_path, allow=True, env_allow=["DATABASE_URL", "QITOS_*"], extra_env={"MODE": "ci"})
    output = run(ToolRegistry([tool]), "env")
    assert f"DATABASE_URL={LEAKY['DATABASE_URL']}" in output  # named exactly: the user asked for it
    assert "QITOS_PLAIN_SETTING=plain-value" in output and "MODE=ci" in output
    assert "tok-value-999" not in output  # matched only by a pattern and looks secret
    assert "github-pat-value" not in output and "passwd-value" not in output and "dXNlcjpwYXNz" not in output


def test_env_allow_must_be_a_list_of_names(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="env_allow"):
        shell_tool(cwd=tmp_path, env_allow="PATH")


def test_shell_environment_picks_from_the_given_parent() -> None:
    parent = {"PATH": "/bin", "LC_ALL": "C", "LC_API_KEY": "x", "GITHUB_PAT": "p", "OTHER": "o"}
    assert shell_environment(parent) == {"PATH": "/bin", "LC_ALL": "C"}
    assert shell_environment(parent, allow=["GITHUB_PAT"]) == {"PATH": "/bin", "LC_ALL": "C", "GITHUB_PAT": "p"}


@pytest.mark.parametrize(
    ("command", "problem"),
    [
        ("", "command is empty"),
        ("echo 'unclosed", "No closing quotation"),
        ("no-such-program-qitos --flag", "command not found: 'no-such-program-qitos'"),
    ],
)
def test_bad_commands_fail_as_tool_errors(tmp_path: Path, command: str, problem: str) -> None:
    result = ToolRegistry([shell_tool(cwd=tmp_path, allow=True)]).call("shell", {"command": command})
    assert not result.ok and result.error_kind == "tool_error" and problem in (result.error or "")


def test_bad_configuration_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="not an existing directory"):
        shell_tool(cwd=tmp_path / "missing")
    with pytest.raises(ConfigurationError, match="timeout"):
        shell_tool(cwd=tmp_path, timeout=0)
