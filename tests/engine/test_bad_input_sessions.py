"""Bad input through a durable session on a real SQLite file: text with lone surrogates,
cyclic or too deeply nested state, and outsized tool outputs end in clear results or CodecErrors,
never a bare UnicodeEncodeError or RecursionError."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from qitos import Action, AgentModule, Decision, StateSchema, ToolRegistry, compose, tool
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.core._errors import CodecError


@dataclass
class BadState(StateSchema):
    data: Any = None
    seen: list[dict[str, Any]] = field(default_factory=list)


@tool
def surrogate_output() -> str:
    """Returns text with a lone surrogate."""
    return "half \ud800 a character"


@tool
def big_list() -> list[str]:
    """Returns a long list of distinct rows (about 2 MB as JSON, hard to compress)."""
    return [hashlib.sha256(str(i).encode()).hexdigest() for i in range(30_000)]


@tool
def echo(text: str) -> str:
    """Echo the text.

    Args:
        text: what to echo.
    """
    return text


class BadInputAgent(AgentModule[BadState, Any, Action]):
    """One tool step chosen by ``mode``, then a final answer; ``mode`` may also poison the state."""

    def __init__(self, mode: str) -> None:
        super().__init__(tool_registry=ToolRegistry([surrogate_output, big_list, echo]))
        self.mode = mode

    def init_state(self, task: str, **kwargs: Any) -> BadState:
        state = BadState(task=task, max_steps=4)
        if self.mode == "cyclic":
            loop: dict[str, Any] = {"name": "loop"}
            loop["self"] = loop
            state.data = loop
        return state

    def decide(self, state: BadState, observation: Any) -> Decision[Action]:
        if state.current_step > 0:
            return Decision.final("done")
        if self.mode == "output":
            return Decision.act([Action("surrogate_output", {}, id="c1")])
        if self.mode == "arguments":
            return Decision.act([Action("echo", {"text": "bad \udfff text"}, id="c1")])
        if self.mode == "big":
            return Decision.act([Action("big_list", {}, id="c1")])
        return Decision.act([Action("echo", {"text": "fine"}, id="c1")])

    def reduce(self, state: BadState, observation: Any, decision: Decision[Action]) -> BadState:
        for result in observation.results:
            state.seen.append({"ok": result.ok, "kind": result.error_kind, "truncated": result.truncated})
        return state


def _composition(tmp_path: Path, mode: str) -> Any:
    return compose(agent=lambda: BadInputAgent(mode), store=SqliteCheckpointStore(str(tmp_path / "s.db")))


@pytest.mark.parametrize(("mode", "kind"), [("output", "tool_error"), ("arguments", "invalid_arguments")])
def test_a_lone_surrogate_in_tool_output_or_arguments_is_an_error_observation(
    tmp_path: Path, mode: str, kind: str
) -> None:
    composition = _composition(tmp_path, mode)
    session = composition.session("a task")
    result = session.run()
    assert result.state.final_result == "done"
    assert result.state.seen == [{"ok": False, "kind": kind, "truncated": False}]
    restored = _composition(tmp_path, mode).restore(session.session_id.value)
    assert restored.inspect().snapshot_integrity == "verified"


def test_a_task_with_a_lone_surrogate_is_refused_before_anything_is_stored(tmp_path: Path) -> None:
    composition = _composition(tmp_path, "plain")
    with pytest.raises(CodecError, match="lone surrogate") as caught:
        composition.session("summarise \ud800")
    assert caught.value.path == "Task.objective"
    assert composition.runtime.checkpoint_store.list_sessions() == []


def test_cyclic_state_is_a_codec_error_naming_the_field(tmp_path: Path) -> None:
    composition = _composition(tmp_path, "cyclic")
    with pytest.raises(CodecError, match="cyclic") as caught:
        composition.session("a task").run()
    assert caught.value.path == "state.data['self']"


class PoisonAgent(AgentModule[BadState, Any, Action]):
    """Puts a value the codec cannot encode into its state while deciding."""

    def init_state(self, task: str, **kwargs: Any) -> BadState:
        return BadState(task=task, max_steps=3)

    def decide(self, state: BadState, observation: Any) -> Decision[Action]:
        state.seen.append({"handle": object()})
        return Decision.final("done")

    def reduce(self, state: BadState, observation: Any, decision: Decision[Action]) -> BadState:
        return state


@pytest.mark.parametrize("durable", [True, False])
def test_a_run_whose_state_cannot_be_saved_finishes_its_trace_as_failed(tmp_path: Path, durable: bool) -> None:
    import json

    from qitos import Engine
    from qitos.trace import list_runs

    logdir = str(tmp_path / "runs")
    with pytest.raises(CodecError, match=r"state\.seen\[0\]"):
        if durable:
            compose(
                agent=PoisonAgent, store=SqliteCheckpointStore(str(tmp_path / "s.db")), trace_logdir=logdir
            ).session("a task").run()
        else:
            Engine(PoisonAgent(), trace_logdir=logdir).run("a task")
    (trace,) = list_runs(logdir)
    manifest = trace.manifest()
    assert manifest["status"] == "failed" and manifest["ended_at"]
    assert "CodecError" in manifest["summary"]["error"]
    events = [json.loads(line) for line in (Path(trace.run_dir) / "events.jsonl").read_text().splitlines()]
    assert events[-1]["event_type"] == "run_end" and events[-1]["payload"]["status"] == "failed"


def test_a_huge_list_output_is_capped_before_it_reaches_the_store(tmp_path: Path) -> None:
    session = _composition(tmp_path, "big").session("a task")
    result = session.run()
    assert result.state.seen == [{"ok": True, "kind": None, "truncated": True}]
    db = tmp_path / "s.db"
    total = sum(p.stat().st_size for p in tmp_path.iterdir() if p.name.startswith(db.name))
    assert total < 500_000  # the whole list is 2 MB of JSON (1 MB compressed); capped, the store stays small


def test_a_model_reply_with_a_lone_surrogate_is_stored_traced_and_restored(tmp_path: Path) -> None:
    from qitos.models._scripted import ScriptedModel
    from qitos.trace import list_runs
    from secret_agents import SecretAgent

    db = str(tmp_path / "s.db")
    composition = compose(
        agent=SecretAgent,
        store=SqliteCheckpointStore(db),
        model=ScriptedModel(["half \ud800 a character"]),
        trace_logdir=str(tmp_path / "runs"),
    )
    session = composition.session("answer")
    result = session.run()
    assert result.state.final_result == "half \ud800 a character"
    (run,) = list_runs(str(tmp_path / "runs"))
    assert any(step.get("decision", {}).get("final_answer") == "half \ud800 a character" for step in run.steps())
    restored = compose(agent=SecretAgent, store=SqliteCheckpointStore(db)).restore(session.session_id.value)
    assert restored.inspect().snapshot_integrity == "verified"


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_session_id_or_snapshot_id_with_a_lone_surrogate_is_a_codec_error_naming_the_argument(
    tmp_path: Path, request: pytest.FixtureRequest, backend: str
) -> None:
    import asyncio

    if backend == "sqlite":
        store: Any = SqliteCheckpointStore(str(tmp_path / "s.db"))
    else:
        from pg_server import drop_schema, fresh_schema
        from qitos.checkpoint._postgres_store import PostgresCheckpointStore

        dsn, schema = request.getfixturevalue("pg_dsn"), fresh_schema()
        store = PostgresCheckpointStore(dsn, schema=schema)
        request.addfinalizer(lambda: drop_schema(dsn, schema))
    request.addfinalizer(store.close)
    composition = compose(agent=lambda: BadInputAgent("plain"), store=store)
    session = composition.session("a task")
    bad = "ses_\udcff"
    attempts: list[tuple[str, Any]] = [
        ("session_id", lambda: composition.restore(bad)),
        ("session_id", lambda: asyncio.run(composition.arestore(bad))),
        ("session_id", lambda: composition.fork(bad)),
        ("snapshot", lambda: session.fork("snap_\ud800")),
        ("operation_id", lambda: session.fork(operation_id="op-\udfff")),
    ]
    for argument, attempt in attempts:
        with pytest.raises(CodecError, match="lone surrogate") as caught:
            attempt()
        assert caught.value.path == argument
    assert [head.session_id for head in store.list_sessions()] == [session.session_id.value]  # nothing created
