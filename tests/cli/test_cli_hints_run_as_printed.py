"""Every command the CLI prints as a hint runs as printed: each test takes the commands out of the
output and runs them with bash in the same directory (a store and traces in a directory with a
space in its name, so a missing ``--db`` or a missing quote fails)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from user_shell import sh

DB = "my data/notes.db"
TRACES = "my traces"

# The model agent asks for approval, then answers (a scripted model read from a file).
SCRIPT = [
    {"tool_calls": [{"name": "publish", "arguments": {"text": "hi"}}]},
    "all published",
]


def printed_commands(text: str) -> list[str]:
    """The qitos command lines in ``text``: ``(qitos ...)``, ``(create one: qitos ...)`` and ``run: qitos ...``."""
    return re.findall(r"(?:\(|: )(qitos [^()\n]*?)(?:\)|$)", text, re.M)


@pytest.fixture
def project(workdir: Path) -> Path:
    """The CLI tests' directory (with ``cli_agents.py``), a model script and a directory for the store."""
    (workdir / "script.json").write_text(json.dumps(SCRIPT), encoding="utf-8")
    (workdir / "my data").mkdir()
    return workdir


def _session_of(out: str) -> str:
    match = re.search(r"^session: (\S+)", out, re.M)
    assert match, out
    return match.group(1)


def test_run_approve_and_resume_hints_keep_db_and_logdir(project: Path) -> None:
    out = sh(f"qitos run cli_agents:ApprovalAgent go --session-db '{DB}' --trace-dir '{TRACES}'", project).stdout
    session_id = _session_of(out)
    run_id = json.loads(sh(f"qitos trace list --logdir '{TRACES}' --json", project).stdout)["runs"][0]["run_id"]
    shown = printed_commands(out)
    assert shown == [f"qitos sessions show {session_id} --db '{DB}'", f"qitos trace show {run_id} --logdir '{TRACES}'"]
    for command in shown:
        sh(command, project)
    approved = sh(f"qitos sessions approve {session_id} call-publish --db '{DB}'", project).stdout
    (resume,) = printed_commands(approved)
    assert resume == f"qitos sessions resume {session_id} --db '{DB}'"
    finished = sh(resume, project).stdout
    for command in printed_commands(finished):
        sh(command, project)


def test_the_resume_hint_of_a_model_session_names_its_model(project: Path) -> None:
    out = sh(f"qitos run cli_agents:ModelAgent go --model scripted:script.json --session-db '{DB}' --json", project)
    session_id = json.loads(out.stdout)["session_id"]
    steered = sh(f"qitos sessions steer {session_id} 'be brief' --db '{DB}'", project).stdout
    (resume,) = printed_commands(steered)
    assert resume == f"qitos sessions resume {session_id} --db '{DB}' --model scripted:script.json"
    shown = json.loads(sh(f"qitos sessions show {session_id} --db '{DB}' --json", project).stdout)
    (call,) = shown["inspection"]["tool_batch"]["calls"]
    sh(f"qitos sessions approve {session_id} {call['call_id']} --db '{DB}'", project)
    assert json.loads(sh(resume + " --json", project).stdout)["final_result"] == "all published"


def test_reject_and_steer_hints_run_as_printed(project: Path) -> None:
    out = sh(f"qitos run cli_agents:ApprovalAgent go --session-db '{DB}' --json", project).stdout
    session_id = json.loads(out)["session_id"]
    rejected = sh(f"qitos sessions reject {session_id} call-publish --reason no --db '{DB}'", project).stdout
    steered = sh(f"qitos sessions steer {session_id} 'thanks' --db '{DB}'", project).stdout
    commands = printed_commands(rejected) + printed_commands(steered)
    assert len(commands) == 2
    finished = json.loads(sh(commands[0] + " --json", project).stdout)
    assert finished["status"] == "completed" and "rejected" in str(finished["final_result"])


def test_demo_hints_run_as_printed(project: Path) -> None:
    out = sh(f"qitos demo --policy scripted --db '{DB}' --trace-dir '{TRACES}'", project).stdout
    commands = printed_commands(out)
    assert len(commands) == 2 and all(f"'{DB}'" in c or f"'{TRACES}'" in c for c in commands)
    for command in commands:
        sh(command, project)


def test_memory_hints_keep_the_directory(project: Path) -> None:
    out = sh("qitos memory list --dir 'my notes'", project).stdout
    (command,) = printed_commands(out)
    assert command == "qitos memory add TEXT --dir 'my notes'"
    sh(command, project)
    assert "TEXT" in sh("qitos memory list --dir 'my notes'", project).stdout


def test_a_session_whose_agent_cannot_be_rebuilt_says_agent_instead_of_a_command(project: Path) -> None:
    (project / "inline.py").write_text(
        "from cli_agents import ApprovalAgent\n"
        "from qitos import Engine\n"
        "from qitos.checkpoint import SqliteCheckpointStore\n"
        "class Configured(ApprovalAgent):\n"
        "    def __init__(self, name):\n"
        "        super().__init__()\n"
        "        self.name = name\n"
        "if __name__ == '__main__':\n"
        "    s = Engine(Configured('x'), checkpoint_store=SqliteCheckpointStore('inline.db')).session('go')\n"
        "    s.run()\n"
        "    print(s.session_id.value)\n",
        encoding="utf-8",
    )
    session_id = sh("python inline.py", project).stdout.strip()
    out = sh(f"qitos sessions approve {session_id} call-publish --db inline.db", project).stdout
    assert printed_commands(out) == []
    assert f"qitos sessions resume {session_id} --db inline.db --agent FACTORY" in out
