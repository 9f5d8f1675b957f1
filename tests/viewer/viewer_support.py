"""What the viewer tests display: agents (importable as ``viewer_support``), runs and sessions.

:func:`build_viewer_data` writes, under one directory:

- a scripted demo run, a model run whose requests carry compaction receipts, a run whose tool output
  and answer contain HTML and script, and a run still in progress (its manifest says ``running``);
- sessions: a completed one with a fork, a model-driven one (with a last request view), and one
  whose agent cannot be imported.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qitos import Action, AgentModule, Decision, Engine, StateSchema, ToolRegistry, tool
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.demo._notes_agent import NotesAgent, prepare_workspace, scripted_model_responses
from qitos.engine._composition import compose
from qitos.engine._model_path import ModelContext
from qitos.kit.context.compaction import ClosedExchangeWindowCompactor
from qitos.models._scripted import ScriptedModel
from qitos.trace import TraceWriter
from qitos.viewer._server import ViewerServer

CHROMIUM = "/usr/bin/chromium"
"""Debian's Chromium, which the browser tests drive headless through Playwright."""
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"><b>bold?</b>'


@dataclass
class HostileState(StateSchema):
    outputs: list[str] = field(default_factory=list)


@tool
def fetch_page(url: str) -> str:
    """Return a page that contains markup (the viewer must show it as text).

    Args:
        url: The page address.
    """
    return f"page {url}: {HOSTILE}"


class HostileAgent(AgentModule[HostileState, Any, Any]):
    """One tool call whose output and the final answer contain HTML and script."""

    def __init__(self) -> None:
        super().__init__(tool_registry=ToolRegistry([fetch_page]))

    def init_state(self, task: str, **kwargs: Any) -> HostileState:
        return HostileState(task=task, max_steps=4)

    def decide(self, state: HostileState, observation: Any) -> Decision[Any]:
        if not state.outputs:
            return Decision.act([Action("fetch_page", {"url": "http://example.test/<script>"})], rationale=HOSTILE)
        return Decision.final(f"done {HOSTILE}")

    def reduce(self, state: HostileState, observation: Any, decision: Decision[Any]) -> HostileState:
        for result in observation.results:
            state.outputs.append(result.as_text())
        return state


@dataclass
class ViewerData:
    """Where the data is and the ids of what was made."""

    logdir: Path
    db: Path
    scripted_run: str
    compacted_run: str
    hostile_run: str
    live_writer: TraceWriter
    live_run: str
    parent_session: str
    child_session: str
    model_session: str
    orphan_session: str


def _local_agent_session(store: SqliteCheckpointStore) -> str:
    class LocalOnlyAgent(HostileAgent):
        """Defined in a function: no other process can import it."""

    return str(compose(agent=LocalOnlyAgent, store=store).session("orphan").session_id.value)


def build_viewer_data(base: Path) -> ViewerData:
    """Write the runs and sessions described in the module docstring under ``base``."""
    logdir = base / "runs"
    root, _ = prepare_workspace(base / "ws")
    scripted = Engine(NotesAgent(root), trace_logdir=str(logdir)).run("Index the notes")
    model = ScriptedModel(scripted_model_responses(root), max_input_units=2400)
    compacted = Engine(
        NotesAgent(root, policy="model"),
        model=model,
        trace_logdir=str(logdir),
        context=ModelContext(compaction_policy=ClosedExchangeWindowCompactor()),
    ).run("Index the notes through the model")
    hostile = Engine(HostileAgent(), trace_logdir=str(logdir)).run("Fetch <script>alert(1)</script>")
    writer = TraceWriter(str(logdir))
    writer.start("run_live0000000000000000", {"task": {"objective": "still going"}, "agent": "LiveAgent"})
    writer.step(
        {
            "step_id": 0,
            "duration_ms": 1.0,
            "decision": {"mode": "wait"},
            "actions": [],
            "results": [],
            "observation": {"results": []},
            "state_diff": [],
        }
    )

    db = base / "sessions.db"
    store = SqliteCheckpointStore(db)
    parent = compose(agent=HostileAgent, store=store).session("fetch a page")
    parent.run()
    child = parent.fork()
    model_session = compose(
        agent=lambda: NotesAgent(root, policy="model"),
        store=store,
        model=ScriptedModel(scripted_model_responses(root), max_input_units=2400),
        extensions={"closed_window": ClosedExchangeWindowCompactor},
        compaction={"provider": "closed_window"},
        trace_logdir=str(logdir),
    ).session("Index through a session")
    model_session.run()
    orphan = _local_agent_session(store)
    store.close()
    return ViewerData(
        logdir=logdir,
        db=db,
        scripted_run=str(scripted.run_id),
        compacted_run=str(compacted.run_id),
        hostile_run=str(hostile.run_id),
        live_writer=writer,
        live_run="run_live0000000000000000",
        parent_session=parent.session_id.value,
        child_session=child.session_id.value,
        model_session=model_session.session_id.value,
        orphan_session=orphan,
    )


def get(srv: ViewerServer, path: str, *, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    """GET ``path`` from the viewer: (status, headers, parsed JSON or text)."""
    request = urllib.request.Request(srv.url.rstrip("/") + path, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, head, raw = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        status, head, raw = exc.code, dict(exc.headers), exc.read()
    text = raw.decode("utf-8")
    body = json.loads(text) if head.get("Content-Type", "").startswith("application/json") else text
    return status, head, body
