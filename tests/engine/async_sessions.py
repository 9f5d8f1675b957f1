"""Many durable sessions at once in one process through ``Session.arun`` (a subprocess for the tests).

::

    python async_sessions.py create DB SIDE_DIR N TARGET   # prints the session ids as JSON
    python async_sessions.py run DB SIDE_DIR               # restores every session, runs them all at
                                                           # once with Session.arun, prints a summary
    python async_sessions.py run DB SIDE_DIR K             # the same, killed with SIGKILL by itself in the
                                                           # middle of the first group of at least K writes,
                                                           # after its K-th write (see kill_inside_group)

Each session is a ``NotesAgent`` session with its own side-effect log ``SIDE_DIR/<session id>.log``
(so call ids of different sessions never mix), all on one ``SqliteCheckpointStore`` file.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import session_agents as sa
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore

__all__ = ["create", "kill_inside_group", "main", "run_all"]

TOOL_SLEEP = 0.005


def _composition(store: SqliteCheckpointStore, side_dir: str, sid: str) -> Any:
    return sa.make_composition("", str(Path(side_dir) / f"{sid}.log"), store=store, sleep=TOOL_SLEEP)


def create(db: str, side_dir: str, count: int, target: int) -> list[str]:
    """Create ``count`` sessions of ``target`` tool steps each; their ids."""
    store = SqliteCheckpointStore(db)
    ids = []
    for _ in range(count):
        session = sa.make_composition("", str(Path(side_dir) / "new.log"), store=store).session(
            "Index notes", target=target
        )
        ids.append(session.session_id.value)
    store.close()
    return ids


def kill_inside_group(store: SqliteCheckpointStore, pieces: int) -> None:
    """Kill this process (SIGKILL) inside the store's first group transaction of at least ``pieces``
    writes, right after its ``pieces``-th write: a crash in the middle of a group commit.

    The group's statements are watched through the writing connection's SQLite trace callback, which
    sees every statement as SQLite runs it; nothing of the store is replaced.
    """
    seen = 0

    def watch(statement: str) -> None:
        nonlocal seen
        if statement == "BEGIN IMMEDIATE":
            seen = 0
        elif statement == "RELEASE work":
            seen += 1
            if seen == pieces:
                os.kill(os.getpid(), signal.SIGKILL)

    store._writer_cursor().connection.set_trace_callback(watch)


async def run_all(db: str, side_dir: str, kill_at: int | None = None) -> dict[str, Any]:
    """Restore every session in ``db`` and run them all at once; a summary per session."""
    store = SqliteCheckpointStore(db)
    if kill_at is not None:
        kill_inside_group(store, kill_at)
    heads = await store.alist_sessions()
    sessions = [_composition(store, side_dir, head.session_id).restore(head.session_id) for head in heads]
    results = await asyncio.gather(*(session.arun() for session in sessions))
    await store.aclose()
    return {s.session_id.value: sa.summary(r) for s, r in zip(sessions, results, strict=True)}


def main(argv: list[str]) -> int:
    """The command line above."""
    command, db, side_dir, *rest = argv
    if command == "create":
        print(json.dumps(create(db, side_dir, int(rest[0]), int(rest[1]))))
    elif command == "run":
        print(json.dumps(asyncio.run(run_all(db, side_dir, int(rest[0]) if rest else None))))
    else:
        raise SystemExit(f"unknown command {command!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
