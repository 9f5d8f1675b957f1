"""``qitos sessions ...`` against a real SQLite store, through the CLI only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SUMMARY_KEYS = {
    "session_id",
    "lifecycle",
    "sequence",
    "snapshot_id",
    "updated_at",
    "created_at",
    "task",
    "agent",
    "parent_session_id",
    "fork_snapshot_id",
}
DETAIL_KEYS = {
    "session",
    "inspection",
    "inspection_error",
    "integrity",
    "snapshots",
    "snapshot_count",
    "lineage",
    "runs",
    "traced_runs",
}
INSPECTION_KEYS = {
    "head",
    "lifecycle",
    "capabilities",
    "snapshot_integrity",
    "budget",
    "work_graph",
    "last_request_view",
    "last_request_messages",
    "task",
    "tool_batch",
}


def _session(cli: Any, agent: str = "cli_agents:ApprovalAgent", task: str = "publish hello", code: int = 0) -> str:
    data = cli.json("run", agent, task, "--session-db", "s.db", "--json", code=code)
    return str(data["session_id"])


def test_list_of_a_store_that_does_not_exist_is_an_error(cli: Any, workdir: Path) -> None:
    _session(cli)  # s.db exists; a typo of it does not
    result = cli.run("sessions", "list", "--db", "typo.db", code=3)
    assert result.stdout == "" and "no session store at typo.db" in result.stderr
    data = cli.json("sessions", "list", "--db", "typo.db", "--json", code=3)
    assert data["exit_code"] == 3 and "typo.db" in data["error"]
    cli.run("sessions", "list", code=3)  # the default store, before anything made it
    assert not (workdir / "typo.db").exists() and not (workdir / ".qitos").exists()  # listing never creates one


def test_list_shows_each_session_with_a_stable_shape(cli: Any, workdir: Path) -> None:
    sid = _session(cli)
    data = cli.json("sessions", "list", "--db", "s.db", "--json")
    assert len(data["sessions"]) == 1
    row = data["sessions"][0]
    assert set(row) == SUMMARY_KEYS
    assert (row["session_id"], row["lifecycle"], row["task"]) == (sid, "awaiting_approval", "publish hello")
    human = cli.run("sessions", "list", "--db", "s.db", code=0).stdout
    assert sid in human and "awaiting_approval" in human


def test_approval_flow_show_approve_resume(cli: Any, workdir: Path) -> None:
    sid = _session(cli)
    detail = cli.json("sessions", "show", sid, "--db", "s.db", "--json")
    assert set(detail) == DETAIL_KEYS
    assert set(detail["inspection"]) == INSPECTION_KEYS
    assert detail["integrity"] == "verified"
    calls = detail["inspection"]["tool_batch"]["calls"]
    assert [(c["call_id"], c["tool"], c["status"]) for c in calls] == [("call-publish", "publish", "awaiting_approval")]
    human = cli.run("sessions", "show", sid, "--db", "s.db", code=0).stdout
    assert "call-publish" in human and "awaiting_approval" in human and "verified" in human

    receipt = cli.json("sessions", "approve", sid, "call-publish", "--db", "s.db", "--json")
    assert (receipt["call_id"], receipt["approved"]) == ("call-publish", True)
    done = cli.json("sessions", "resume", sid, "--db", "s.db", "--json")
    assert (done["status"], done["session_id"]) == ("completed", sid)
    assert done["final_result"] == "done: published hello"


def test_reject_reports_the_reason_to_the_agent(cli: Any, workdir: Path) -> None:
    sid = _session(cli)
    cli.run("sessions", "reject", sid, "call-publish", "--reason", "not today", "--db", "s.db", code=0)
    done = cli.json("sessions", "resume", sid, "--db", "s.db", "--json")
    assert "rejected" in done["final_result"] and "not today" in done["final_result"]


def test_approving_a_call_that_is_not_waiting_is_a_usage_error(cli: Any, workdir: Path) -> None:
    sid = _session(cli)
    result = cli.run("sessions", "approve", sid, "call-nope", "--db", "s.db", code=2)
    assert "call-nope" in result.stderr and "awaiting" in result.stderr


def test_an_answer_in_text_says_how_the_session_goes_on(cli: Any, workdir: Path) -> None:
    sid = _session(cli)
    out = cli.run("sessions", "approve", sid, "call-publish", "--db", "s.db", code=0).stdout
    assert out.strip() == f"approved call-publish; run: qitos sessions resume {sid} --db s.db"  # not a fleet's session


def test_steer_then_resume_takes_the_instruction_in(cli: Any, workdir: Path) -> None:
    sid = _session(cli)
    cli.run("sessions", "approve", sid, "call-publish", "--db", "s.db", code=0)
    cli.json("sessions", "resume", sid, "--db", "s.db", "--json")
    receipt = cli.json("sessions", "steer", sid, "also say bye", "--db", "s.db", "--json")
    assert receipt["session_id"] == sid and receipt["position"] >= 1
    out = cli.run("sessions", "resume", sid, "--db", "s.db", code=0).stdout
    assert "steering taken in: also say bye" in out


def test_pause_request_stops_the_next_run_at_its_first_boundary(cli: Any, workdir: Path) -> None:
    sid = _session(cli, "cli_agents:LoopAgent", "loop", code=1)  # stops at its step limit: exit 1
    cli.run("sessions", "pause", sid, "--db", "s.db", code=0)
    paused = cli.json("sessions", "resume", sid, "--db", "s.db", "--json")
    assert paused["stop_reason"] == "paused"


def test_fork_creates_a_child_once_per_operation_and_show_draws_the_lineage(cli: Any, workdir: Path) -> None:
    sid = _session(cli)
    head = cli.json("sessions", "show", sid, "--db", "s.db", "--json")["session"]["snapshot_id"]
    first = cli.json("sessions", "fork", sid, "--operation-id", "op-1", "--db", "s.db", "--json")
    again = cli.json("sessions", "fork", sid, "--operation-id", "op-1", "--db", "s.db", "--json")
    assert first == again
    assert (first["parent_session_id"], first["parent_snapshot_id"]) == (sid, head)
    child = first["child_session_id"]
    detail = cli.json("sessions", "show", child, "--db", "s.db", "--json")
    lineage = detail["lineage"]
    assert lineage["session_id"] == sid and not lineage["current"]
    assert [(c["session_id"], c["current"], c["fork_snapshot_id"]) for c in lineage["children"]] == [
        (child, True, head)
    ]
    assert all(n["integrity"] == "verified" for n in (lineage, lineage["children"][0]))
    human = cli.run("sessions", "show", child, "--db", "s.db", code=0).stdout
    assert "lineage" in human and sid in human and child in human
    rows = cli.json("sessions", "list", "--db", "s.db", "--json")["sessions"]
    assert {r["session_id"]: r["parent_session_id"] for r in rows} == {sid: None, child: sid}


def test_fork_from_an_unknown_snapshot_is_not_found(cli: Any, workdir: Path) -> None:
    sid = _session(cli)
    result = cli.run("sessions", "fork", sid, "--snapshot", "f" * 64, "--db", "s.db", code=3)
    assert "f" * 64 in result.stderr


def test_prune_and_vacuum_report_what_they_did(cli: Any, workdir: Path) -> None:
    _session(cli)
    report = cli.json("sessions", "prune", "--db", "s.db", "--json")
    assert set(report) == {"deleted_snapshots", "kept_snapshots", "deleted_blobs"} and report["kept_snapshots"] >= 1
    assert "blob(s)" in cli.run("sessions", "prune", "--db", "s.db", code=0).stdout
    vac = cli.json("sessions", "vacuum", "--db", "s.db", "--json")
    assert set(vac) == {"db", "bytes_before", "bytes_after"} and vac["bytes_after"] > 0
    assert "vacuumed" in cli.run("sessions", "vacuum", "--db", "s.db", code=0).stdout


SCRIPT = """
from dataclasses import dataclass, field
import sys

from qitos import Action, AgentModule, Decision, StateSchema, ToolRegistry, compose, tool
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore


@tool(needs_approval=True)
def publish(text: str) -> str:
    \"\"\"Publish a text (a human approves).

    Args:
        text: what to publish.
    \"\"\"
    return "published " + text


@dataclass
class ScriptState(StateSchema):
    done: list[str] = field(default_factory=list)


class ScriptAgent(AgentModule):
    def init_state(self, task, **kwargs):
        return ScriptState(task=task, max_steps=4)

    def decide(self, state, observation):
        if state.done:
            return Decision.final("ok")
        return Decision.act([Action("publish", {"text": "hi"}, "call-1")])

    def reduce(self, state, observation, decision):
        state.done.extend(r.as_text() for r in observation.results)
        return state


composition = compose(lambda: ScriptAgent(tool_registry=ToolRegistry([publish])), SqliteCheckpointStore("s.db"))
session = composition.session("publish from a script")
print(session.run().state.stop_reason, session.session_id.value)
"""


def test_a_session_made_by_a_script_is_shown_steered_and_approved_with_the_script_gone(cli: Any, workdir: Path) -> None:
    script = workdir / "make_session.py"
    script.write_text(SCRIPT, encoding="utf-8")
    made = subprocess.run([sys.executable, str(script)], cwd=workdir, capture_output=True, text=True, check=True)
    stop, sid = made.stdout.split()
    assert stop == "awaiting_approval"
    script.unlink()  # the agent class lived in that script's __main__: nothing can import it now

    detail = cli.json("sessions", "show", sid, "--db", "s.db", "--json")
    assert detail["inspection_error"] is None and detail["integrity"] == "verified"
    inspection = detail["inspection"]
    assert inspection["task"] == "publish from a script"
    assert inspection["lifecycle"] == "awaiting_approval"
    (call,) = inspection["tool_batch"]["calls"]
    assert (call["call_id"], call["status"], call["needs_approval"]) == ("call-1", "awaiting_approval", True)
    assert "publish from a script" in cli.run("sessions", "show", sid, "--db", "s.db", code=0).stdout
    assert cli.json("sessions", "steer", sid, "go on", "--db", "s.db", "--json")["position"] == 1
    assert cli.json("sessions", "pause", sid, "--db", "s.db", "--json")["position"] == 2
    assert cli.json("sessions", "approve", sid, "call-1", "--db", "s.db", "--json")["approved"] is True
    refused = cli.run("sessions", "approve", sid, "call-2", "--db", "s.db", code=2)
    assert "awaiting" in refused.stdout + refused.stderr
    again = cli.json("sessions", "show", sid, "--db", "s.db", "--json")
    assert again["inspection"]["tool_batch"]["calls"][0]["status"] == "approved"


@pytest.mark.parametrize(
    "args",
    [
        ["show", "ses_missing"],
        ["resume", "ses_missing"],
        ["steer", "ses_missing", "x"],
        ["pause", "ses_missing"],
        ["approve", "ses_missing", "c"],
        ["reject", "ses_missing", "c"],
        ["fork", "ses_missing"],
    ],
)
def test_an_unknown_session_exits_3(cli: Any, workdir: Path, args: list[str]) -> None:
    _session(cli)
    result = cli.run("sessions", *args, "--db", "s.db", code=3)
    assert "ses_missing" in result.stderr and "not found" in result.stderr


@pytest.mark.parametrize("args", [["show", "x"], ["prune"], ["vacuum"], ["pause", "x"]])
def test_a_missing_store_exits_3_and_is_not_created(cli: Any, workdir: Path, args: list[str]) -> None:
    result = cli.run("sessions", *args, "--db", "nowhere.db", code=3)
    assert "no session store at nowhere.db" in result.stderr
    assert not (workdir / "nowhere.db").exists()


def test_resume_with_an_agent_that_cannot_be_imported_is_a_usage_error(cli: Any, workdir: Path) -> None:
    sid = _session(cli)
    result = cli.run("sessions", "resume", sid, "--db", "s.db", "--agent", "cli_agents:Nope", code=2)
    assert "has no 'Nope'" in result.stderr


def test_steering_with_empty_text_is_a_usage_error(cli: Any, workdir: Path) -> None:
    sid = _session(cli)
    assert "non-empty" in cli.run("sessions", "steer", sid, "  ", "--db", "s.db", code=2).stderr


def test_resume_of_a_model_agent_without_a_model_is_a_cli_message_and_the_session_stays_paused(
    cli: Any, workdir: Path
) -> None:
    import json

    script = [{"tool_calls": [{"id": "call-publish", "name": "publish", "arguments": {"text": "hi"}}]}, "published"]
    (workdir / "script.json").write_text(json.dumps(script), encoding="utf-8")
    data = cli.json(
        "run", "cli_agents:ModelAgent", "publish", "--model", "scripted:script.json", "--session-db", "s.db", "--json"
    )
    sid = data["session_id"]
    assert data["stop_reason"] == "awaiting_approval"
    result = cli.run("sessions", "resume", sid, "--db", "s.db", code=2)
    assert "ModelAgent decides through a model" in result.stderr and "--model" in result.stderr
    assert "llm=" not in result.stderr and "compose(" not in result.stderr  # a CLI message, not a Python one
    listed = cli.json("sessions", "list", "--db", "s.db", "--json")
    assert listed["sessions"][0]["lifecycle"] == "awaiting_approval"  # not marked failed


def test_the_sessions_table_never_cuts_an_id_at_120_columns(
    cli: Any, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = _session(cli, task="a long task " * 8)
    monkeypatch.setenv("COLUMNS", "120")
    out = cli.run("sessions", "list", "--db", "s.db", code=0).stdout
    assert sid in out
    assert max(len(line) for line in out.splitlines()) <= 120
    runs = cli.run("trace", "list", code=0).stdout
    run_ids = [r["run_id"] for r in cli.json("trace", "list", "--json")["runs"]]
    assert run_ids and all(run_id in runs for run_id in run_ids)


def test_a_resumed_runs_json_counts_its_own_steps(cli: Any, workdir: Path) -> None:
    import json

    first = [
        {"tool_calls": [{"id": "call-echo", "name": "echo", "arguments": {"text": "one"}}]},
        {"tool_calls": [{"id": "call-publish", "name": "publish", "arguments": {"text": "two"}}]},
    ]
    (workdir / "first.json").write_text(json.dumps(first), encoding="utf-8")
    (workdir / "then.json").write_text(json.dumps(["done"]), encoding="utf-8")
    args = ["--session-db", "s.db", "--json"]
    data = cli.json("run", "cli_agents:ModelAgent", "t", "--model", "scripted:first.json", *args)
    assert (data["stop_reason"], data["steps"], data["session_steps"]) == ("awaiting_approval", 1, 1)
    sid = data["session_id"]
    cli.run("sessions", "approve", sid, "call-publish", "--db", "s.db", code=0)
    done = cli.json("sessions", "resume", sid, "--db", "s.db", "--model", "scripted:then.json", "--json")
    assert (done["final_result"], done["steps"], done["session_steps"]) == ("done", 2, 3)
