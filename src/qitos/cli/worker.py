"""``qitos worker`` (run sessions from the fleet's queue) and ``qitos sessions submit`` (enqueue one).

Both name the agent with ``--app pkg.module:composition`` and the PostgreSQL database with
``--db postgresql://...`` (the checkpoint store, and DBOS's system tables beside it); see
``qitos.distributed``.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from typing import Annotated

import typer

from qitos.cli.common import cli_command, console, print_json
from qitos.distributed.fleet import Fleet
from qitos.distributed.naming import DEFAULT_QUEUE, load_composition, with_engine_options
from qitos.distributed.worker import Worker
from qitos.engine.otlp import otlp_export

__all__ = ["submit", "worker"]

AppOption = Annotated[str, typer.Option("--app", help="The composition to run: pkg.module:attribute.")]
FleetDbOption = Annotated[str, typer.Option("--db", help="The fleet's PostgreSQL database: a postgresql:// URL.")]
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
) -> None:
    """Run sessions from the fleet's queue until interrupted (SIGINT or SIGTERM)."""
    with otlp_export(otel) as provider:
        composition = load_composition(app)
        if provider is not None:
            composition = with_engine_options(composition, otel=provider)
        _serve(Worker(composition, db=db, queue=queue, concurrency=concurrency, prefetch=prefetch), queue, json_out)


def _serve(runner: Worker, queue: str, json_out: bool) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    runner.start()
    if json_out:
        ready = {
            "ready": True,
            "executor_id": runner.executor_id,
            "queue": queue,
            "concurrency": runner.concurrency,
            "prefetch": runner.prefetch,
        }
        print(json.dumps(ready), flush=True)  # one line, flushed: a supervisor reads it from a pipe
    else:
        console().print(
            f"worker {runner.executor_id} ready on queue {queue!r}"
            f" (concurrency {runner.concurrency}, prefetch {runner.prefetch})"
        )
        sys.stdout.flush()
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        runner.stop()


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
