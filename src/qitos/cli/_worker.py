"""``qitos worker`` (run sessions from the fleet's queue) and ``qitos sessions submit`` (enqueue one).

Both name the agent with ``--app pkg.module:composition`` and the PostgreSQL database with
``--db postgresql://...`` (the checkpoint store, and DBOS's system tables beside it); see
``qitos.distributed``.
"""

from __future__ import annotations

import asyncio
import gc
import json
import signal
import sys
import threading
from typing import Annotated

import typer

from qitos.cli._common import cli_command, console, print_json, store_target
from qitos.core._errors import ConfigurationError
from qitos.core._install import install_command
from qitos.distributed._fleet import Fleet
from qitos.distributed._naming import DEFAULT_QUEUE, load_composition, with_engine_options
from qitos.distributed._worker import Worker
from qitos.engine._otlp import otlp_export

__all__ = ["EVENT_LOOPS", "submit", "tune_collector", "use_event_loop", "worker"]

EVENT_LOOPS = ("auto", "uvloop", "asyncio")

_YOUNG_COLLECTION_EVERY = 10_000  # allocations between collections of the youngest generation (default 700)

AppOption = Annotated[str, typer.Option("--app", help="The composition to run: pkg.module:attribute.")]
FleetDbOption = Annotated[
    str, typer.Option("--db", help="The fleet's PostgreSQL database: a postgresql:// URL.", callback=store_target)
]
QueueOption = Annotated[str, typer.Option("--queue", help="The DBOS queue the fleet's runs go through.")]


@cli_command
def worker(
    app: AppOption,
    db: FleetDbOption,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Sessions run at once.")] = 8,
    prefetch: Annotated[
        int | None,
        typer.Option("--prefetch", min=0, help="Runs taken from the queue beyond --concurrency, waiting for a slot."),
    ] = None,
    queue: QueueOption = DEFAULT_QUEUE,
    json_out: Annotated[bool, typer.Option("--json", help="Print the ready line as one line of JSON.")] = False,
    otel: Annotated[
        bool, typer.Option("--otel", help="Export OpenTelemetry spans of every run (OTLP/HTTP, OTEL_EXPORTER_OTLP_*).")
    ] = False,
    loop: Annotated[
        str, typer.Option("--loop", help="The sessions' event loop: auto (uvloop when installed), uvloop or asyncio.")
    ] = "auto",
) -> None:
    """Run sessions from the fleet's queue until interrupted (SIGINT or SIGTERM)."""
    loop_in_use = use_event_loop(loop)  # before DBOS starts the thread whose loop runs the sessions
    with otlp_export(otel) as provider:
        composition = load_composition(app)
        if provider is not None:
            composition = with_engine_options(composition, otel=provider)
        runner = Worker(composition, db=db, queue=queue, concurrency=concurrency, prefetch=prefetch)
        _serve(runner, queue, json_out, loop_in_use)


def _serve(runner: Worker, queue: str, json_out: bool, loop: str) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    runner.start()
    tune_collector()
    if json_out:
        ready = {
            "ready": True,
            "executor_id": runner.executor_id,
            "queue": queue,
            "concurrency": runner.concurrency,
            "prefetch": runner.prefetch,
            "loop": loop,
        }
        print(json.dumps(ready), flush=True)  # one line, flushed: a supervisor reads it from a pipe
    else:
        console().print(
            f"worker {runner.executor_id} ready on queue {queue!r}"
            f" (concurrency {runner.concurrency}, prefetch {runner.prefetch}, {loop} event loop)"
        )
        sys.stdout.flush()
    if runner.queue_limit != runner.intake:
        _say_queue_limit(runner, queue)
    elif runner.changed_queue_limit:
        _say(
            f"queue {queue!r} handed each of its workers at most {_runs(runner.replaced_limit)}, as a worker"
            f" started before with other --concurrency or --prefetch asked; now it hands every one of them"
            f" {_runs(runner.queue_limit)}, as this worker asks"
        )
    said = runner.queue_limit
    try:
        while not stop.wait(0.5):
            if runner.queue_limit != said:
                said = runner.queue_limit
                _say_queue_limit(runner, queue)
    except KeyboardInterrupt:
        pass
    finally:
        runner.stop()


def _say_queue_limit(runner: Worker, queue: str) -> None:
    """Say on stderr that the queue's per-worker limit changed (DBOS keeps one for all its workers)."""
    limit = runner.queue_limit
    if limit == runner.intake:
        _say(f"queue {queue!r} hands each of its workers at most {_runs(limit)} again, as this worker asked")
        return
    running = runner.concurrency if limit is None else min(limit, runner.concurrency)
    _say(
        f"queue {queue!r} now hands each of its workers at most {_runs(limit)}, as a worker started with"
        f" other --concurrency or --prefetch asked; this worker asked for {runner.intake} (--concurrency"
        f" {runner.concurrency} + --prefetch {runner.prefetch}) and now runs at most {running} at once."
        " The workers of one queue share this limit: start them with the same values"
    )


def _runs(limit: int | None) -> str:
    return "any number of runs" if limit is None else f"{limit} runs"


def _say(notice: str) -> None:
    print(f"qitos worker: {notice}.", file=sys.stderr, flush=True)


def use_event_loop(kind: str) -> str:
    """Make event loops created from now on ``kind``'s (one of :data:`EVENT_LOOPS`); the one in use.

    DBOS runs a worker's sessions on an event loop of its own, made when it starts. ``auto`` is
    uvloop when it is installed (``qitos-kernel[fleet]`` installs it where it builds: not on Windows),
    else asyncio's. uvloop's loop does the same work in C: measured on the fleet agent in one
    process, 4.40-4.50 ms of CPU per ten-step session against 4.68-4.90 ms on asyncio's loop.
    """
    if kind not in EVENT_LOOPS:
        raise ConfigurationError(f"--loop must be one of {', '.join(EVENT_LOOPS)}; got {kind!r}")
    if kind == "asyncio":
        return kind
    try:
        import uvloop
    except ImportError:
        if kind == "uvloop":
            raise ConfigurationError(f"--loop uvloop needs uvloop: {install_command('fleet')}") from None
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


def tune_collector() -> None:
    """Set the cyclic garbage collector up for a long-lived worker process that allocates fast.

    What start-up built (DBOS, SQLAlchemy, the app) lives as long as the process, so it is frozen
    out of the collector, and the youngest generation is collected every 10,000 allocations, not
    700. Measured in the fleet benchmark's workers: the collector took about 0.15 s of a worker's
    CPU per 300 sessions (a full collection walked some 115,000 start-up objects), and 0.01 s after.
    """
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(_YOUNG_COLLECTION_EVERY, middle, oldest)


@cli_command
def submit(
    task: Annotated[str, typer.Argument(help="The task of the new session.")],
    app: AppOption,
    db: FleetDbOption,
    queue: QueueOption = DEFAULT_QUEUE,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Create a session for TASK in the store and enqueue its run on the fleet."""
    fleet = Fleet(load_composition(app), db=db, queue=queue)
    try:
        session_id = fleet.submit(task)
    finally:
        fleet.close()
    if json_out:
        print_json({"session_id": session_id, "queue": queue})
    else:
        console().print(session_id)
