"""A floor worker for ``fleet_floor.py``: DBOS runs do-nothing (or 20-statement) async workflows from a queue.

    python bench/fleet_floor_worker.py DSN KIND CONCURRENCY

``DSN`` is a ``postgresql://`` URL of the floor's database (DBOS's system tables go in schema
``floor_dbos`` there, the floor's own tables are in ``public``); ``KIND`` is ``empty`` (the
workflow returns at once) or ``steps`` (ten steps, each an intent ``INSERT`` and a
compare-and-swap of the session's head with a snapshot ``INSERT``: 2 autocommit prepared
statements on an ``AsyncConnectionPool``, no lock of the worker's own). DBOS is configured as
``qitos.distributed.Worker`` configures it by default (executor threads, queue polling 0.05 s,
notification polling 0.05 s, DBOS's worker concurrency ``2 * CONCURRENCY``: as many runs prefetched
as run), and like it runs ``CONCURRENCY`` workflows at once: the others wait for a free slot. Its
garbage collector and event loop are set up as ``qitos worker`` sets its own
(``qitos.cli._worker.tune_collector``; uvloop when it is installed, as ``--loop auto``).
Prints one line of JSON ``{"ready": true}`` once DBOS is up and the queue registered; runs until
SIGTERM. Imports nothing of qitos.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import os
import signal
import sys
import threading
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from dbos import DBOS
from psycopg_pool import AsyncConnectionPool

__all__ = [
    "APP_NAME",
    "DBOS_SCHEMA",
    "EMPTY_WORKFLOW",
    "QUEUE",
    "STEPS",
    "STEPS_WORKFLOW",
    "dbos_url",
    "empty_session",
    "step_session",
]

APP_NAME = "qitos-floor"
DBOS_SCHEMA = "floor_dbos"
QUEUE = "floor"
EMPTY_WORKFLOW = "floor_empty"
STEPS_WORKFLOW = "floor_steps"
STEPS = 10
INTENT = "INSERT INTO floor_intents (session, step, data) VALUES (%(session)s, %(step)s, %(data)s)"
STEP = (
    "WITH moved AS (UPDATE floor_heads SET head = %(new)s WHERE session = %(session)s AND head = %(old)s RETURNING 1) "
    "INSERT INTO floor_snapshots (digest, session, data) SELECT %(new)s, %(session)s, %(data)s FROM moved"
)
_INTENT_BYTES = 100
_SNAPSHOT_BYTES = 300

_dsn = ""
_concurrency = 8
_pool: asyncio.Future[AsyncConnectionPool[Any]] | None = None
_slots: asyncio.Semaphore | None = None  # made on DBOS's loop by the first workflow


def dbos_url(dsn: str) -> str:
    """The SQLAlchemy URL DBOS needs for ``dsn`` (psycopg 3 driver), as ``qitos.distributed`` builds it."""
    parts = urlsplit(dsn)
    return urlunsplit(("postgresql+psycopg", *parts[1:]))


async def _open_pool() -> AsyncConnectionPool[Any]:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        _dsn,
        min_size=_concurrency,
        max_size=_concurrency,
        kwargs={"autocommit": True, "prepare_threshold": 0},  # every statement prepared from its first use
        open=False,
    )
    await pool.open(wait=True)
    return pool


async def _the_pool() -> AsyncConnectionPool[Any]:
    """The process's pool, opened by the first workflow on DBOS's loop (the others wait for it)."""
    global _pool
    if _pool is None:
        _pool = asyncio.ensure_future(_open_pool())
    return await _pool


def _the_slots() -> asyncio.Semaphore:
    global _slots
    if _slots is None:
        _slots = asyncio.Semaphore(_concurrency)
    return _slots


async def empty_session(session_id: str) -> str:
    """The dispatch floor's workflow: nothing, in a slot."""
    async with _the_slots():
        return session_id


async def step_session(session_id: str) -> str:
    """The durable-step floor's workflow: ten steps of an intent row and a head CAS + snapshot row, in a slot."""
    async with _the_slots():
        return await _steps(session_id)


async def _steps(session_id: str) -> str:
    pool = await _the_pool()
    old = ""
    for step in range(STEPS):
        intent = f'{{"session":"{session_id}","step":{step},"tool":"record"}}'.encode().ljust(_INTENT_BYTES, b" ")
        snapshot = f'{{"session":"{session_id}","step":{step + 1},"state":{{}}}}'.encode().ljust(_SNAPSHOT_BYTES, b" ")
        new = hashlib.sha256(snapshot).hexdigest()
        async with pool.connection() as conn:
            await conn.execute(INTENT, {"session": session_id, "step": step, "data": intent})
            moved = await conn.execute(STEP, {"session": session_id, "old": old, "new": new, "data": snapshot})
            if moved.rowcount != 1:
                raise RuntimeError(f"floor session {session_id}: the head moved under step {step}")
        old = new
    return session_id


def main() -> None:
    """Run the floor worker until SIGTERM."""
    global _dsn, _concurrency
    _dsn, kind, _concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3])
    workflows = {EMPTY_WORKFLOW: empty_session, STEPS_WORKFLOW: step_session}
    name = {"empty": EMPTY_WORKFLOW, "steps": STEPS_WORKFLOW}[kind]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    config: Any = {
        "name": APP_NAME,
        "system_database_url": dbos_url(_dsn),
        "dbos_system_schema": DBOS_SCHEMA,
        "executor_id": f"floor-{os.getpid()}",
        "application_version": "qitos-floor-1",
        "max_executor_threads": 2 * _concurrency + 4,
        "notification_listener_polling_interval_sec": 0.05,
        "log_level": "WARNING",
    }
    try:  # as qitos worker --loop auto: DBOS's loop, made when it launches, is uvloop's when installed
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    DBOS(config=config)
    DBOS.workflow(name=name)(workflows[name])
    DBOS.launch()
    DBOS.register_queue(QUEUE, worker_concurrency=2 * _concurrency, polling_interval_sec=0.05)
    gc.collect()  # as qitos.cli._worker.tune_collector: start-up frozen, young objects every 10,000 allocations
    gc.freeze()
    gc.set_threshold(10_000, *gc.get_threshold()[1:])
    print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        DBOS.destroy(destroy_registry=False)


if __name__ == "__main__":
    main()
