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

from qitos import Action, AgentModule, Decision, StateSchema, ToolRegistry, tool
from qitos.checkpoint._packing import unpack
from qitos.models._scripted import FunctionModel

__all__ = [
    "API_KEY",
    "HEADER_SECRET",
    "TASK_KEY",
    "URL_PASSWORDS",
    "URL_TASK",
    "KeyedModel",
    "SecretAgent",
    "SecretState",
    "UrlAgent",
    "pg_stored_texts",
    "stored_texts",
]

API_KEY = "qk-live-7f3a9c2b1d8e6f40"
HEADER_SECRET = "hdr-secret-5550123"
TASK_KEY = "sk-proj-TASKKEY1234567890"
# Passwords in connection URLs of other shapes than user:password@host, one per query key.
URL_PASSWORDS = {
    "password": "S3cretPw0rd-r11",
    "passwd": "Pa55wd-value-2",
    "pwd": "PwdValue-33",
    "secret": "SecretValue-44",
    "token": "TokenValue-55",
    "api_key": "ApiKeyValue-66",
    "apikey": "ApiKey2Value-77",
    "access_token": "AccessTok-88",
}
REDIS_PASSWORD = "R3disPw-991"
URL_TASK = " ".join(
    [
        f"postgresql://app@/appdb?host=/tmp&password={URL_PASSWORDS['password']}&schema=qitos",
        f"redis://:{REDIS_PASSWORD}@cache:6379/0",
        "https://api.example/v1?"
        + "&".join(f"{key}={value}" for key, value in URL_PASSWORDS.items() if key != "password"),
    ]
)


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


@tool
def fetch(url: str) -> str:
    """Fetch a URL (answers with it; an https one fails, quoting it).

    Args:
        url: the URL.
    """
    if url.startswith("https"):
        raise ConnectionError(f"cannot reach {url}")
    return f"fetched {url}"


class UrlAgent(AgentModule[SecretState, Any, Any]):
    """Fetches each URL of its task (one call each, no model), then answers quoting them."""

    def __init__(self) -> None:
        super().__init__(tool_registry=ToolRegistry([fetch]))

    def init_state(self, task: str, **kwargs: Any) -> SecretState:
        return SecretState(task=task, max_steps=4)

    def decide(self, state: SecretState, observation: Any) -> Any:
        if state.seen:
            return Decision.final(f"used {state.task}")
        urls = state.task.split()
        return Decision.act([Action("fetch", {"url": url}, f"call-{i}") for i, url in enumerate(urls)])

    def reduce(self, state: SecretState, observation: Any, decision: Any) -> SecretState:
        for result in observation.results:
            state.seen.append(result.as_text())
        return state


def pg_stored_texts(dsn: str, schema: str) -> str:
    """Every value (blobs unpacked) in every table of a PostgreSQL schema, as text, joined."""
    import psycopg

    out: list[str] = []
    with psycopg.connect(dsn) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchall()
        for (table,) in tables:
            for row in conn.execute(f'SELECT * FROM "{schema}"."{table}"'):
                for value in row:
                    if isinstance(value, bytes | memoryview):
                        data = bytes(value)
                        try:
                            value = unpack(data).decode("utf-8", errors="replace")
                        except Exception:
                            value = data.decode("utf-8", errors="replace")
                    out.append(str(value))
    return "\n".join(out)


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
