"""``qitos sessions show``/``list`` and CLI error lines never print a secret."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qitos import compose
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.core._redaction import REDACTED
from secret_agents import API_KEY, TASK_KEY, KeyedModel, SecretAgent


def _session(db: Path) -> str:
    store = SqliteCheckpointStore(str(db))
    session = compose(agent=SecretAgent, store=store, model=KeyedModel()).session(f"deploy with {TASK_KEY}")
    session.run()
    store.close()
    return session.session_id.value


def test_sessions_show_and_list_never_print_the_key(cli: Any, workdir: Path) -> None:
    sid = _session(workdir / "s.db")
    for args in (
        ("sessions", "show", sid, "--db", "s.db"),
        ("sessions", "show", sid, "--db", "s.db", "--json"),
        ("sessions", "list", "--db", "s.db"),
        ("sessions", "list", "--db", "s.db", "--json"),
    ):
        out = cli.run(*args, code=0).stdout
        assert TASK_KEY not in out and API_KEY not in out, args
        assert REDACTED in out, args
    detail = cli.json("sessions", "show", sid, "--db", "s.db", "--json")
    assert detail["session"]["task"] == f"deploy with {REDACTED}"


def test_an_error_line_does_not_repeat_a_token(cli: Any, workdir: Path) -> None:
    _session(workdir / "s.db")
    result = cli.run("sessions", "show", TASK_KEY, "--db", "s.db", code=3)
    assert f"session '{REDACTED}' not found" in result.stderr and TASK_KEY not in result.stderr


LEAK_AGENT = '''
from qitos import AgentModule, Decision, StateSchema


class EchoTaskAgent(AgentModule):
    """Answers with its task."""

    def init_state(self, task, **kwargs):
        return StateSchema(task=task, max_steps=2)

    def decide(self, state, observation):
        return Decision.final(f"the task was: {state.task}")

    def reduce(self, state, observation, decision):
        return state
'''


def test_qitos_run_output_never_prints_a_token(cli: Any, workdir: Path) -> None:
    (workdir / "leak_agents.py").write_text(LEAK_AGENT, encoding="utf-8")
    data = cli.json("run", "leak_agents:EchoTaskAgent", f"use {TASK_KEY}", "--json")
    assert data["final_result"] == f"the task was: use {REDACTED}"
    human = cli.run("run", "leak_agents:EchoTaskAgent", f"use {TASK_KEY}", code=0)
    assert TASK_KEY not in human.stdout and TASK_KEY not in human.stderr
