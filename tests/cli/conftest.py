"""Fixtures for the CLI tests: a working directory, a CliRunner, and small agents to run.

The agents are written as a module (``cli_agents.py``) into the test's working directory, so the
CLI imports them by name exactly as a user's ``qitos run mymodule:MyAgent`` would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

AGENTS_SOURCE = '''
"""Agents for the CLI tests."""
from dataclasses import dataclass, field

from qitos import Action, AgentModule, Decision, StateSchema, ToolRegistry, tool


@dataclass
class EchoState(StateSchema):
    said: list[str] = field(default_factory=list)


@tool
def echo(text: str) -> str:
    """Echo a text back.

    Args:
        text: What to echo.
    """
    return text


@tool(needs_approval=True)
def publish(text: str) -> str:
    """Publish a text (a human must approve).

    Args:
        text: What to publish.
    """
    return f"published {text}"


class _Base(AgentModule):
    def __init__(self):
        super().__init__(tool_registry=ToolRegistry([echo, publish]))

    def init_state(self, task, **kwargs):
        return EchoState(task=task, max_steps=6)

    def reduce(self, state, observation, decision):
        for result in observation.results:
            state.said.append(result.as_text())
        return state


class ModelAgent(_Base):
    """Takes the engine's model path."""


class ApprovalAgent(_Base):
    """Publishes once (needs approval), then answers with what happened."""

    def decide(self, state, observation):
        if not state.said:
            return Decision.act([Action("publish", {"text": "hello"}, id="call-publish")])
        return Decision.final("done: " + "; ".join(state.said))


class LoopAgent(_Base):
    """Never finishes."""

    def decide(self, state, observation):
        return Decision.act([Action("echo", {"text": "again"})])


class BrokenAgent(_Base):
    """Its reduce raises."""

    def decide(self, state, observation):
        return Decision.act([Action("echo", {"text": "x"})])

    def reduce(self, state, observation, decision):
        raise RuntimeError("reduce exploded")


class MarkupAgent(_Base):
    """Echoes rich markup and HTML that must be shown literally."""

    def decide(self, state, observation):
        if not state.said:
            return Decision.act([Action("echo", {"text": "[bold red]not markup[/] <script>x()</script>"})])
        return Decision.final("[link=http://evil]click[/link]")


class NotAnAgent:
    pass
'''


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run the command in a fresh directory (defaults like ./runs and ./.qitos land here)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("QITOS_DEBUG", raising=False)
    monkeypatch.delenv("QITOS_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    (tmp_path / "cli_agents.py").write_text(AGENTS_SOURCE, encoding="utf-8")
    return tmp_path


@pytest.fixture
def runner() -> CliRunner:
    """A typer CliRunner (stdout and stderr kept apart)."""
    return CliRunner()


class Cli:
    """Invoke ``qitos`` through its typer app, in process."""

    def __init__(self, runner: CliRunner) -> None:
        self.runner = runner

    def run(self, *args: str, code: int | None = None) -> Result:
        """Run ``qitos ARGS``; check the exit code when ``code`` is given."""
        from qitos.cli.app import app

        result = self.runner.invoke(app, list(args))
        if code is not None:
            assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr, result.exception)
        return result

    def json(self, *args: str, code: int = 0) -> Any:
        """Run ``qitos ARGS`` and parse its JSON stdout."""
        return json.loads(self.run(*args, code=code).stdout)


@pytest.fixture
def cli(runner: CliRunner) -> Cli:
    """The in-process ``qitos`` command."""
    return Cli(runner)
