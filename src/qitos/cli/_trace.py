"""``qitos trace``: list, show and export run traces, and serve the web viewer.

Runs are looked up in ``--logdir`` (default ``./runs``) by run id, directory name, or a unique
prefix of either.
"""

from __future__ import annotations

import json
import os
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from qitos.checkpoint._targets import describe_target
from qitos.cli._common import DEFAULT_DB, DEFAULT_LOGDIR, cli_command, console, print_json, store_target
from qitos.viewer._data import find_run, run_detail, runs_board

__all__ = ["app"]

app = typer.Typer(help="Run traces: list, show, export, and the web viewer (serve).")

LogdirOption = Annotated[str, typer.Option("--logdir", help="Directory holding the run traces.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]

_STATUS_STYLE = {"completed": "green", "running": "cyan", "stopped": "yellow", "failed": "red", "unreadable": "red"}


def _fmt(value: object, suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}{suffix}"
    return f"{value}{suffix}"


@app.command("list")
@cli_command
def list_traces(logdir: LogdirOption = DEFAULT_LOGDIR, json_out: JsonOption = False) -> None:
    """List runs, newest first: status, steps, stop reason, tokens, duration."""
    rows = runs_board(logdir)
    if json_out:
        print_json({"logdir": os.path.abspath(logdir), "runs": rows})
        return
    out = console()
    if not rows:
        out.print(f"no runs in {logdir}", highlight=False)
        return
    table = Table(title=f"runs in {logdir}", title_justify="left")
    table.add_column("run", no_wrap=True, min_width=max(len(str(row["run_id"])) for row in rows))  # never cut
    for column in ("status", "steps", "stop reason", "tokens", "duration"):
        table.add_column(column, no_wrap=True)
    table.add_column("task", overflow="ellipsis", max_width=60)
    for row in rows:
        table.add_row(
            row["run_id"],
            Text(str(row["status"]), style=_STATUS_STYLE.get(str(row["status"]), "")),
            _fmt(row["steps"]),
            _fmt(row["stop_reason"]),
            _fmt(row["tokens"]),
            _fmt(row["duration_s"], " s"),
            Text(str(row["task"] or ""), no_wrap=True, overflow="ellipsis"),
        )
    out.print(table)


@app.command("show")
@cli_command
def show(
    run: Annotated[str, typer.Argument(help="Run id, directory name or unique prefix.")],
    logdir: LogdirOption = DEFAULT_LOGDIR,
    json_out: JsonOption = False,
) -> None:
    """Show one run: its summary and a table of its steps."""
    detail = run_detail(find_run(logdir, run))
    if json_out:
        print_json(detail)
        return
    out = console()
    summary = detail["run"]
    out.print(
        Text.assemble(
            ("run ", "bold"),
            (summary["run_id"], "bold cyan"),
            "  ",
            (str(summary["status"]), _STATUS_STYLE.get(str(summary["status"]), "")),
            f"  {_fmt(summary['stop_reason'])} · {_fmt(summary['steps'])} step(s) · {_fmt(summary['tokens'])} tokens"
            f" · {_fmt(summary['duration_s'], ' s')}",
        )
    )
    out.print(Text(f"task: {summary['task'] or ''}"))
    table = Table(title_justify="left")
    for column in ("step", "mode", "actions", "results", "context", "receipts", "ms"):
        table.add_column(column, overflow="fold")
    for step in detail["steps"]:
        decision = step.get("decision") or {}
        results = step.get("results") or []
        failed = sum(1 for r in results if not r.get("ok"))
        view = step.get("request_view") or {}
        units = view.get("units") or {}
        table.add_row(
            str(step.get("step_id")),
            str(decision.get("mode", "")),
            Text(", ".join(a.get("name", "") for a in step.get("actions") or []) or "-"),
            f"{len(results) - failed} ok" + (f", {failed} failed" if failed else "") if results else "-",
            f"{units.get('used')}/{units.get('available')}" if units else "-",
            str(len(view.get("receipts") or [])) if view else "-",
            f"{step.get('duration_ms', 0):.0f}",
        )
    out.print(table)
    final = (detail["manifest"].get("summary") or {}).get("final_result")
    if final:
        out.print(Text("answer:", style="bold green"))
        out.print(Text(str(final)))
    if summary.get("error"):
        out.print(Text(f"error: {summary['error']}", style="red"))


@app.command("export")
@cli_command
def export(
    run: Annotated[str, typer.Argument(help="Run id, directory name or unique prefix.")],
    logdir: LogdirOption = DEFAULT_LOGDIR,
    output: Annotated[str | None, typer.Option("--output", "-o", help="Write to this file instead of stdout.")] = None,
) -> None:
    """Export one run (manifest, steps and events) as a single JSON document."""
    trace = find_run(logdir, run)
    detail = run_detail(trace)
    document = {
        "format": "qitos.trace/v1",
        "manifest": detail["manifest"],
        "steps": detail["steps"],
        "events": trace.events(),
    }
    if output is None:
        print_json(document)
        return
    tmp = output + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=2, ensure_ascii=False)
    os.replace(tmp, output)
    console(stderr=True).print(f"exported {summary_id(detail)} to {output}", highlight=False)


def summary_id(detail: dict[str, Any]) -> str:
    """The run id of a run detail."""
    return str(detail["run"]["run_id"])


@app.command("serve")
@cli_command
def serve(
    logdir: LogdirOption = DEFAULT_LOGDIR,
    db: Annotated[
        str,
        typer.Option(
            "--db",
            help="Session store on the board (SQLite file, if it exists, or postgresql:// URL).",
            callback=store_target,
        ),
    ] = DEFAULT_DB,
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port on 127.0.0.1 (0 picks a free one).")] = 8765,
) -> None:
    """Serve the viewer on 127.0.0.1 (runs, steps, request inspector, sessions and forks, and controls
    for sessions: approve, reject, steer, pause, resume, at the printed address with its token)."""
    from qitos.viewer._server import ViewerServer

    server = ViewerServer(logdir, db=db, port=port)
    typer.echo(f"qitos viewer on {server.url}  (traces: {os.path.abspath(logdir)}; sessions: {describe_target(db)})")
    typer.echo(f"open {server.control_url} to approve, steer, pause and resume (this start's token)")
    typer.echo("press Ctrl-C to stop")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        typer.echo("stopped")
    finally:
        server.shutdown()
