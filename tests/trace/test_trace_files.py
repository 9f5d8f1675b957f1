"""Run artifacts: manifest lifecycle, events.jsonl, steps.jsonl, redaction, and the reader API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from qitos import Action, AgentModule, Decision, Engine, tool
from qitos.core._state import apply_changes
from qitos.engine._hooks import EngineHook, HookContext
from qitos.models._openai_compat import OpenAICompatibleModel
from qitos.trace._reader import TraceError, list_runs, open_run


@tool
def note(text: str) -> str:
    """Store a note."""
    return f"noted {text}"


def two_notes(state: Any, observation: Any) -> Decision[Any]:
    if state.current_step == 2:
        return Decision.final("two notes")
    return Decision.act([Action("note", {"text": f"n{state.current_step}"})])


def _all_text(root: Path) -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(root.rglob("*")) if p.is_file())


class ManifestWatcher(EngineHook):
    """Reads the manifest from disk while the run is in progress."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.statuses: list[str] = []

    def on_step_end(self, ctx: HookContext) -> None:
        manifest = self.logdir / ctx.run_id / "manifest.json"
        self.statuses.append(json.loads(manifest.read_text())["status"])


def test_agent_run_writes_the_three_files_under_the_run_id(policy_agent: Any, tmp_path: Path) -> None:
    watcher = ManifestWatcher(tmp_path)
    result = policy_agent(two_notes, tools=[note]).run(
        "take notes", return_state=True, trace_logdir=str(tmp_path), hooks=[watcher]
    )
    run_dir = tmp_path / result.run_id
    assert Path(result.run_dir) == run_dir
    assert sorted(p.name for p in run_dir.iterdir()) == ["events.jsonl", "manifest.json", "steps.jsonl"]
    assert watcher.statuses == ["running", "running", "running"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed" and manifest["run_id"] == result.run_id
    assert manifest["started_at"] and manifest["ended_at"]
    summary = manifest["summary"]
    assert summary["stop_reason"] == "final" and summary["final_result"] == "two notes" and summary["steps"] == 3
    assert "token_usage" in summary
    assert manifest["task"]["objective"] == "take notes"

    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert events[0]["event_type"] == "run_start" and events[-1]["event_type"] == "run_end"
    assert [e["event_type"] for e in events] == [e.event_type.value for e in result.events]
    assert all("ts" in e for e in events)

    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    assert [s["step_id"] for s in steps] == [0, 1, 2]
    first = steps[0]
    assert first["decision"]["mode"] == "act"
    assert first["actions"] == [{"id": first["actions"][0]["id"], "name": "note", "args": {"text": "n0"}}]
    assert first["results"][0]["output"] == "noted n0" and first["results"][0]["ok"] is True
    state: dict[str, Any] = {}
    for step in steps:
        apply_changes(state, step["state_diff"])
    assert state == result.state.to_dict()


def test_trace_prefix_names_the_directory(policy_agent: Any, tmp_path: Path) -> None:
    result = policy_agent(two_notes, tools=[note]).run(
        "t", return_state=True, trace_logdir=str(tmp_path), trace_prefix="notes"
    )
    assert Path(result.run_dir).name == f"notes_{result.run_id}"


def test_agent_run_traces_to_dot_runs_by_default(
    policy_agent: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = policy_agent(two_notes, tools=[note]).run("t", return_state=True)
    assert (tmp_path / "runs" / result.run_id / "manifest.json").is_file()


def test_trace_false_writes_nothing(policy_agent: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = policy_agent(two_notes, tools=[note]).run("t", return_state=True, trace=False)
    assert result.run_dir is None and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("reduce_raises", "status", "reason"),
    [(False, "stopped", "max_steps_reached"), (True, "failed", "unrecoverable_error")],
)
def test_manifest_ends_stopped_or_failed(
    policy_agent: Any, tmp_path: Path, reduce_raises: bool, status: str, reason: str
) -> None:
    def reduce(state: Any, observation: Any, decision: Any) -> Any:
        if reduce_raises:
            raise RuntimeError("broken reduce")
        return state

    agent = policy_agent(lambda s, o: Decision.act([Action("note", {"text": "x"})]), tools=[note], reduce=reduce)
    result = agent.run("t", return_state=True, trace_logdir=str(tmp_path), state_max_steps=2)
    manifest = open_run(result.run_dir).manifest()
    assert manifest["status"] == status and manifest["summary"]["stop_reason"] == reason
    if reduce_raises:
        assert "broken reduce" in manifest["summary"]["error"]


def test_an_init_state_failure_still_closes_the_trace_as_failed(tmp_path: Path) -> None:
    class Broken(AgentModule[Any, Any, Any]):
        def init_state(self, task: str, **kwargs: Any) -> Any:
            raise ValueError("cannot start")

        def reduce(self, state: Any, observation: Any, decision: Any) -> Any:
            return state

    with pytest.raises(ValueError, match="cannot start"):
        Broken().run("t", trace_logdir=str(tmp_path))
    (run,) = list_runs(str(tmp_path))
    assert run.manifest()["status"] == "failed"
    events = run.events()
    assert events[0]["event_type"] == "run_start" and events[-1]["event_type"] == "run_end"
    assert "cannot start" in events[-1]["error"]


# --------------------------------------------------------------------------- redaction


API_KEY = "qk-live-7f3a9c2b1d8e6f40"  # not shaped like any known token: only exact-value redaction catches it
HEADER_SECRET = "hdr-secret-5b7c9d1e3f"


def _echoing_model(**kwargs: Any) -> OpenAICompatibleModel:
    """A real OpenAI-compatible adapter over an in-process transport that echoes the credentials back."""

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen = request.headers.get("authorization", "") + " " + request.headers.get("x-api-key", "")
        if len(body["messages"]) == 1:
            call = {
                "id": "c1",
                "type": "function",
                "function": {"name": "note", "arguments": json.dumps({"text": f"creds {seen}"})},
            }
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish = "tool_calls"
        else:
            message, finish = {"role": "assistant", "content": f"done; I was called with {seen}"}, "stop"
        return httpx.Response(
            200,
            json={
                "id": "x",
                "object": "chat.completion",
                "model": "m",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            },
        )

    return OpenAICompatibleModel("m", base_url="http://model.test/v1", transport=httpx.MockTransport(handler), **kwargs)


def test_an_api_key_given_to_the_model_adapter_never_reaches_the_disk(policy_agent: Any, tmp_path: Path) -> None:
    model = _echoing_model(api_key=API_KEY)
    result = policy_agent(lambda s, o: None, tools=[note], llm=model).run(
        "t", return_state=True, trace_logdir=str(tmp_path)
    )
    assert API_KEY in (result.state.final_result or "")  # the secret really was in the run's data
    text = _all_text(tmp_path)
    assert API_KEY not in text
    assert "[REDACTED]" in text


def test_a_secret_header_given_to_the_model_adapter_never_reaches_the_disk(policy_agent: Any, tmp_path: Path) -> None:
    model = _echoing_model(headers={"X-Api-Key": HEADER_SECRET})
    result = policy_agent(lambda s, o: None, tools=[note], llm=model).run(
        "t", return_state=True, trace_logdir=str(tmp_path)
    )
    assert HEADER_SECRET in (result.state.final_result or "")
    assert HEADER_SECRET not in _all_text(tmp_path)


def test_bearer_and_sk_tokens_in_tool_output_are_redacted(policy_agent: Any, tmp_path: Path) -> None:
    bearer = "Bearer eyJhbGciOiJIUzI1NiJ9.payload.signature"
    sk = "sk-proj-AbCdEf0123456789xyz"

    @tool
    def leak() -> str:
        """Prints the environment (badly)."""
        return f"Authorization: {bearer}\nOPENAI_API_KEY={sk}\n"

    agent = policy_agent(lambda s, o: Decision.final("ok") if s.current_step else Decision.act([Action("leak", {})]))
    agent.tool_registry.register(leak)
    result = agent.run("t", return_state=True, trace_logdir=str(tmp_path))
    assert sk in result.state.log[0]
    text = _all_text(tmp_path)
    assert "eyJhbGciOiJIUzI1NiJ9" not in text and "AbCdEf0123456789xyz" not in text
    assert "OPENAI_API_KEY" in text  # the surrounding text is kept


def test_a_json_api_key_field_inside_a_tool_output_is_redacted(policy_agent: Any, tmp_path: Path) -> None:
    @tool
    def config() -> str:
        """Returns a config file's JSON text."""
        return json.dumps({"model": "m", "api_key": "plain-value-123", "password": "hunter2hunter2"})

    agent = policy_agent(lambda s, o: Decision.final("ok") if s.current_step else Decision.act([Action("config", {})]))
    agent.tool_registry.register(config)
    result = agent.run("t", return_state=True, trace_logdir=str(tmp_path))
    assert "plain-value-123" in result.state.log[0]
    text = _all_text(tmp_path)
    assert "plain-value-123" not in text and "hunter2hunter2" not in text
    assert '\\"model\\": \\"m\\"' in text  # the rest of the output is kept


# --------------------------------------------------------------------------- reader


def test_the_reader_reads_runs_back(policy_agent: Any, tmp_path: Path) -> None:
    agent = policy_agent(two_notes, tools=[note])
    first = agent.run("first", return_state=True, trace_logdir=str(tmp_path))
    second = agent.run("second", return_state=True, trace_logdir=str(tmp_path))
    runs = list_runs(str(tmp_path))
    assert [r.run_id for r in runs] == [second.run_id, first.run_id]  # newest first
    trace = open_run(first.run_dir)
    assert trace.run_id == first.run_id
    step = trace.step(1)
    assert len(trace.steps()) == 3 and step is not None and step["step_id"] == 1 and trace.step(9) is None
    assert trace.events()[-1]["payload"]["stop_reason"] == "final"


def test_the_reader_reports_a_missing_or_broken_run(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="manifest"):
        open_run(str(tmp_path / "nope"))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text("{not json")
    with pytest.raises(TraceError, match="invalid JSON"):
        open_run(str(broken))
    assert list_runs(str(tmp_path / "absent")) == []


def test_the_reader_tolerates_a_torn_last_line_but_not_a_broken_middle_line(tmp_path: Path) -> None:
    run = tmp_path / "r"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"run_id": "r", "status": "running"}))
    (run / "events.jsonl").write_text('{"event_type":"run_start"}\n{"event_type":"ste')
    assert open_run(str(run)).events() == [{"event_type": "run_start"}]
    (run / "steps.jsonl").write_text('{"step_id":0}\n{broken\n{"step_id":2}\n')
    with pytest.raises(TraceError, match=":2"):
        open_run(str(run)).steps()


def test_engine_trace_logdir_writes_without_agent_run(policy_agent: Any, tmp_path: Path) -> None:
    result = Engine(policy_agent(two_notes, tools=[note]), trace_logdir=str(tmp_path)).run("t")
    assert result.run_dir is not None
    assert open_run(result.run_dir).manifest()["status"] == "completed"
