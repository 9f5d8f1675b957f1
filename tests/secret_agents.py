"""An agent and model that leak credentials everywhere a run can write them.

Importable as ``secret_agents`` (``tests`` is on the import path), so the CLI and the viewer can
restore its sessions by the ``module:qualname`` recorded in the store.

``KeyedModel`` is configured with :data:`API_KEY` (a value shaped like no known token, so only the
configured-credential rule can catch it) and one more secret header value. Its first answer calls
``login`` with the key as an argument and says the key in its text; ``login`` fails with an error
that quotes the key; the second answer is final. The task, given by the tests, holds
:data:`TASK_KEY` (an ``sk-…`` key, caught by its shape).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qitos import AgentModule, StateSchema, ToolRegistry, tool
from qitos.checkpoint.packing import unpack
from qitos.models.scripted import FunctionModel

__all__ = ["API_KEY", "HEADER_SECRET", "TASK_KEY", "KeyedModel", "SecretAgent", "SecretState", "stored_texts"]

API_KEY = "qk-live-7f3a9c2b1d8e6f40"
HEADER_SECRET = "hdr-secret-5550123"
TASK_KEY = "sk-proj-TASKKEY1234567890"


@dataclass
class SecretState(StateSchema):
    """What the agent saw."""

    seen: list[str] = field(default_factory=list)


@tool
def login(user: str, key: str) -> str:
    """Log in (always fails, quoting the key it was given).

    Args:
        user: the user.
        key: the key.
    """
    raise PermissionError(f"login refused for {user} with key {key}")


class KeyedModel(FunctionModel):
    """A scripted model with configured credentials (``api_key`` and ``secrets()``)."""

    def __init__(self) -> None:
        super().__init__(self._answer, model_id="keyed")

    @property
    def api_key(self) -> str:
        """The configured key."""
        return API_KEY

    def secrets(self) -> tuple[str, ...]:
        """Every configured secret."""
        return (API_KEY, HEADER_SECRET)

    def _answer(self, view: Any) -> Any:
        if len(self.requests) == 1:
            return {
                "text": f"trying key {API_KEY} with header {HEADER_SECRET}",
                "tool_calls": [{"id": "call-login", "name": "login", "arguments": {"user": "ann", "key": API_KEY}}],
            }
        return f"could not log in with {API_KEY}"


class SecretAgent(AgentModule[SecretState, Any, Any]):
    """Takes the model path; records each tool result's text."""

    def __init__(self) -> None:
        super().__init__(tool_registry=ToolRegistry([login]))

    def init_state(self, task: str, **kwargs: Any) -> SecretState:
        return SecretState(task=task, max_steps=4)

    def reduce(self, state: SecretState, observation: Any, decision: Any) -> SecretState:
        for result in observation.results:
            state.seen.append(result.as_text())
        return state


def stored_texts(db: str | Path) -> str:
    """Every text and (unpacked) blob in every table of a SQLite file, joined: what is on disk."""
    out: list[str] = []
    with sqlite3.connect(str(db)) as conn:
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):
                for value in row:
                    if isinstance(value, bytes):
                        try:
                            value = unpack(value).decode("utf-8", errors="replace")
                        except Exception:
                            value = value.decode("utf-8", errors="replace")
                    out.append(str(value))
    return "\n".join(out)
