"""The CLI continues sessions started from a script or with a Team: each session records a
reference another process can load (the script's path, the factory that built it), and every
case it cannot load says ``--agent``. All of it through real processes: ``python script.py``
makes the session, ``qitos ...`` (as typed in a shell) continues it from another directory."""

from __future__ import annotations

import json
from pathlib import Path

from qitos.checkpoint import SqliteCheckpointStore
from user_shell import sh

APPROVAL_SCRIPT = '''
from dataclasses import dataclass, field

from qitos import Action, AgentModule, Decision, StateSchema, compose, tool
from qitos.checkpoint import SqliteCheckpointStore


@tool(needs_approval=True)
def publish(text: str) -> str:
    """Publish a text.

    Args:
        text: what.
    """
    return f"published {text}"


@dataclass
class NoteState(StateSchema):
    said: list[str] = field(default_factory=list)


class NoteAgent(AgentModule[NoteState, object, Action]):
    tools = (publish,)

    def init_state(self, task, **kwargs):
        return NoteState(task=task, max_steps=4)

    def decide(self, state, observation):
        if not state.said:
            return Decision.act([Action("publish", {"text": "hello"}, id="call-1")])
        return Decision.final("done: " + state.said[0])

    def reduce(self, state, observation, decision):
        state.said.extend(r.as_text() for r in observation.results)
        return state


if __name__ == "__main__":
    session = compose(agent=NoteAgent, checkpoint_store=SqliteCheckpointStore("notes.db")).session("note")
    print(session.run().state.stop_reason, session.session_id.value)
'''

TEAM_MODULE = """
from dataclasses import dataclass

from qitos import AgentModule, Decision, Engine, compose
from qitos.checkpoint import SqliteCheckpointStore
from qitos.engine import Team, TeamState


class Greeter(AgentModule[TeamState, object, object]):
    def init_state(self, task, **kwargs):
        return TeamState(task=task, max_steps=3)

    def decide(self, state, observation):
        return Decision.final("hello from the team")

    def reduce(self, state, observation, decision):
        return state


def make_team():
    return Team({"greeter": Greeter()}, first="greeter")


def start(how):
    store = SqliteCheckpointStore("team.db")
    if how == "engine":
        session = Engine(make_team(), checkpoint_store=store).session("greet")
    else:
        session = compose(agent=make_team, checkpoint_store=store).session("greet")
    print(session.session_id.value)
"""


def _session_metadata(db: Path, session_id: str) -> dict[str, object]:
    store = SqliteCheckpointStore(db)
    try:
        head = store.get_session_head(session_id)
        assert head is not None
        return dict(head.metadata)
    finally:
        store.close()


def _session_count(db: Path) -> int:
    store = SqliteCheckpointStore(db)
    try:
        return len(store.list_sessions())
    finally:
        store.close()


def test_a_session_started_by_a_script_records_the_scripts_path_and_the_cli_continues_it(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "approval_agent.py").write_text(APPROVAL_SCRIPT, encoding="utf-8")
    started = sh("python approval_agent.py", project).stdout.split()
    assert started[0] == "awaiting_approval"
    session_id = started[1]
    db = project / "notes.db"
    assert _session_metadata(db, session_id)["agent_ref"] == f"{project / 'approval_agent.py'}:NoteAgent"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()  # another directory: the module name approval_agent would not import here
    sh(f"qitos sessions approve {session_id} call-1 --db {db}", elsewhere)
    resumed = json.loads(sh(f"qitos sessions resume {session_id} --db {db} --json", elsewhere).stdout)
    assert resumed["final_result"] == "done: published hello"
    child = json.loads(sh(f"qitos sessions fork {session_id} --db {db} --json", elsewhere).stdout)
    assert child["parent_session_id"] == session_id


def test_a_script_that_runs_code_when_imported_is_refused_with_what_to_do(tmp_path: Path) -> None:
    unguarded = APPROVAL_SCRIPT.replace('if __name__ == "__main__":\n    ', "").replace("\n    print(", "\nprint(")
    (tmp_path / "loose.py").write_text(unguarded, encoding="utf-8")
    session_id = sh("python loose.py", tmp_path).stdout.split()[1]
    sessions_before = _session_count(tmp_path / "notes.db")
    failed = sh(f"qitos sessions resume {session_id} --db notes.db", tmp_path, code=2)
    assert "runs code when imported" in failed.stderr and 'if __name__ == "__main__"' in failed.stderr
    assert "--agent" in failed.stderr
    assert _session_count(tmp_path / "notes.db") == sessions_before  # the script was not run again


def test_a_team_built_by_a_named_factory_resumes_and_one_built_inline_asks_for_agent(tmp_path: Path) -> None:
    (tmp_path / "teams.py").write_text(TEAM_MODULE, encoding="utf-8")
    by_factory = sh("python -c 'import teams; teams.start(\"compose\")'", tmp_path).stdout.strip()
    inline = sh("python -c 'import teams; teams.start(\"engine\")'", tmp_path).stdout.strip()
    assert _session_metadata(tmp_path / "team.db", by_factory)["agent_ref"] == "teams:make_team"
    assert _session_metadata(tmp_path / "team.db", inline)["agent_ref"] is None

    resumed = json.loads(sh(f"qitos sessions resume {by_factory} --db team.db --json", tmp_path).stdout)
    assert resumed["final_result"] == "hello from the team"

    failed = sh(f"qitos sessions resume {inline} --db team.db", tmp_path, code=2)
    assert "qitos.engine._handoff:Team" in failed.stderr and "--agent" in failed.stderr
    assert "TypeError" not in failed.stderr
    resumed = json.loads(
        sh(f"qitos sessions resume {inline} --db team.db --agent teams:make_team --json", tmp_path).stdout
    )
    assert resumed["final_result"] == "hello from the team"


def test_a_recorded_script_that_moved_says_agent(tmp_path: Path) -> None:
    (tmp_path / "approval_agent.py").write_text(APPROVAL_SCRIPT, encoding="utf-8")
    session_id = sh("python approval_agent.py", tmp_path).stdout.split()[1]
    (tmp_path / "approval_agent.py").rename(tmp_path / "moved.py")
    failed = sh(f"qitos sessions resume {session_id} --db notes.db", tmp_path, code=2)
    assert "approval_agent.py:NoteAgent" in failed.stderr and "--agent" in failed.stderr
    fixed = sh(f"qitos sessions resume {session_id} --db notes.db --agent moved.py:NoteAgent --json", tmp_path)
    assert json.loads(fixed.stdout)["stop_reason"] == "awaiting_approval"


def test_qitos_run_of_a_script_records_its_path(tmp_path: Path) -> None:
    (tmp_path / "approval_agent.py").write_text(APPROVAL_SCRIPT, encoding="utf-8")
    out = json.loads(sh("qitos run approval_agent.py:NoteAgent note --session-db s.db --json", tmp_path).stdout)
    assert out["stop_reason"] == "awaiting_approval"
    meta = _session_metadata(tmp_path / "s.db", out["session_id"])
    assert meta["agent_ref"] == f"{tmp_path / 'approval_agent.py'}:NoteAgent"
