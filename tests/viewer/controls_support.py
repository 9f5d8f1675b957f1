"""Sessions for the viewer's control tests, made the way a user makes them: a script run with
``python`` (so the session records the script's path, and the viewer's resume can rebuild the
agent in its subprocess), waiting for a human to approve a call."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.viewer._server import TOKEN_HEADER, ViewerServer

SCRIPT = '''
import sys
from dataclasses import dataclass, field

from qitos import Action, AgentModule, Decision, StateSchema, ToolRegistry, compose, tool
from qitos.checkpoint import SqliteCheckpointStore
from qitos.engine import delegate


@tool(needs_approval=True)
def publish(text: str) -> str:
    """Publish a text (a human approves it first).

    Args:
        text: what to publish.
    """
    return f"published {text}"


@dataclass
class Notes(StateSchema):
    said: list[str] = field(default_factory=list)


class Publisher(AgentModule[Notes, object, Action]):
    tools = (publish,)

    def init_state(self, task, **kwargs):
        return Notes(task=task, max_steps=4)

    def decide(self, state, observation):
        if not state.said:
            return Decision.act([Action("publish", {"text": "hello"}, id="call-publish")])
        return Decision.final("done: " + "; ".join(state.said))

    def reduce(self, state, observation, decision):
        state.said.extend(r.as_text() for r in observation.results)
        return state


class Lead(AgentModule[Notes, object, Action]):
    def __init__(self):
        super().__init__(tool_registry=ToolRegistry([delegate("publisher", Publisher, max_steps=4)]))

    def init_state(self, task, **kwargs):
        return Notes(task=task, max_steps=4)

    def decide(self, state, observation):
        if not state.said:
            return Decision.act([Action("publisher", {"task": state.task}, id="call-delegate")])
        return Decision.final("lead: " + state.said[0])

    def reduce(self, state, observation, decision):
        state.said.extend(r.as_text() for r in observation.results)
        return state


if __name__ == "__main__":
    db, which = sys.argv[1], sys.argv[2]
    session = compose(agent=Lead if which == "lead" else Publisher, checkpoint_store=SqliteCheckpointStore(db)).session(
        "publish hello"
    )
    session.run()
    print(session.session_id.value)
'''


def make_session(base: Path, which: str = "publisher") -> str:
    """A session awaiting approval of ``call-publish`` (``lead``: in its delegated child), in ``base/sessions.db``."""
    script = base / "publishing.py"
    if not script.exists():
        script.write_text(SCRIPT, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script), str(base / "sessions.db"), which],
        cwd=base,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.strip()


def lifecycle(db: Path, session_id: str) -> str:
    store = SqliteCheckpointStore(db)
    try:
        head = store.get_session_head(session_id)
        assert head is not None
        return head.lifecycle
    finally:
        store.close()


def control_items(db: Path, session_id: str) -> list[str]:
    store = SqliteCheckpointStore(db)
    try:
        return [item.kind for item in store.list_control(session_id)]
    finally:
        store.close()


def post(
    srv: ViewerServer,
    path: str,
    body: Any = None,
    *,
    token: str | None = "",
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> tuple[int, Any]:
    """POST to the viewer as its own page does (the server's token unless ``token`` says otherwise)."""
    sent = {"Content-Type": "application/json"}
    if token is not None:
        sent[TOKEN_HEADER] = token or srv.token
    sent.update(headers or {})
    data = raw if raw is not None else json.dumps(body or {}).encode()
    request = urllib.request.Request(srv.url.rstrip("/") + path, data=data, headers=sent, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
