"""The shell tool: approval by default, no shell interpretation, timeout kills the group, output capped."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from qitos.core.errors import ConfigurationError
from qitos.core.tool import ToolRegistry
from qitos.kit.tools.shell import shell_tool

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
    monkeypatch.setenv("QITOS_PLAIN_SETTING", "visible")
    registry = ToolRegistry([shell_tool(cwd=tmp_path, allow=True)])
    output = run(registry, "env")
    assert "QITOS_PLAIN_SETTING=visible" in output and "sk-should-not-leak" not in output
    explicit = ToolRegistry([shell_tool(cwd=tmp_path, allow=True, env={"ONLY": "this", "PATH": os.environ["PATH"]})])
    assert run(explicit, "env").splitlines()[1:] == ["ONLY=this", f"PATH={os.environ['PATH']}"]


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
