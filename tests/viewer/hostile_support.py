"""Data for the hostile-input viewer tests: script payloads and a store holding one session per
payload plus one session whose task and model leak secrets (see ``secret_agents``)."""

from __future__ import annotations

from pathlib import Path

from viewer_support import HostileAgent

from qitos import compose
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from secret_agents import TASK_KEY, KeyedModel, SecretAgent

__all__ = ["PAYLOADS", "build_hostile_store"]

# Each would set window.__pwned if the viewer ever parsed data as HTML or script.
PAYLOADS = [
    "<script>window.__pwned = 1</script>",
    '"><img src=x onerror="window.__pwned = 2">',
    '<svg/onload="window.__pwned = 3">',
    "javascript:window.__pwned = 4",
    "</script><script>window.__pwned = 5</script>",
    "<iframe srcdoc='<script>parent.__pwned = 6</script>'></iframe>",
    "{{constructor.constructor('window.__pwned = 7')()}}",
    '\u2028<a href="javascript:window.__pwned = 8" id="pwn">x</a>',
]


def build_hostile_store(db: Path) -> dict[str, str]:
    """Write the sessions to ``db``; returns their ids (``secret``, ``payload0`` ... ``payload7``)."""
    store = SqliteCheckpointStore(str(db))
    ids: dict[str, str] = {}
    secret = compose(agent=SecretAgent, store=store, model=KeyedModel()).session(f"deploy with {TASK_KEY}")
    secret.run()
    ids["secret"] = secret.session_id.value
    for i, payload in enumerate(PAYLOADS):
        ids[f"payload{i}"] = compose(agent=HostileAgent, store=store).session(payload).session_id.value
    store.close()
    return ids
