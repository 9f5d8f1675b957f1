"""``qitos sessions``: list, inspect, resume and control durable sessions in a session store.

Every command takes ``--db``: a SQLite file (default ``./.qitos/sessions.db``) or a ``postgresql://``
URL. Commands that act on a session restore it through ``compose(...).restore(id)``, which needs its
agent: the reference recorded in the session's metadata (``module:qualname``, or a script's path
and the name in it; see :mod:`qitos.cli._agents`) is imported, or ``--agent`` names another one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from qitos.checkpoint._postgres_store import PostgresCheckpointStore
from qitos.checkpoint._targets import describe_target, missing_store
from qitos.checkpoint._targets import open_store as open_target
from qitos.checkpoint.store import CheckpointStore
from qitos.cli._agents import AGENT_FORMS, session_agent
from qitos.cli._common import (
    DEFAULT_DB,
    DEFAULT_LOGDIR,
    EXIT_NOT_FOUND,
    cli_command,
    console,
    fail,
    print_json,
    store_target,
)
from qitos.cli._models import MODEL_FORMS, resolve_model
from qitos.cli._running import compaction_extensions, finish, renderer_hooks, require_model
from qitos.core._redaction import redact_text
from qitos.engine._composition import Composition, compose
from qitos.engine._otlp import otlp_export
from qitos.sessions._control import answer_approval, pause_session, steer_session
from qitos.viewer._data import how_it_continues, session_detail, session_summary, to_jsonable

__all__ = ["app"]

app = typer.Typer(help="Durable sessions in a SQLite store: list, show, resume, steer, pause, approve, fork...")

DbOption = Annotated[
    str,
    typer.Option("--db", help="The session store: a SQLite file or a postgresql:// URL.", callback=store_target),
]
AgentOption = Annotated[
    str | None, typer.Option("--agent", help=f"The agent to restore with: {AGENT_FORMS} (default: the one recorded).")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]


@contextmanager
def open_store(db: str) -> Iterator[CheckpointStore]:
    """The store ``db`` names (a SQLite file or a postgresql:// URL); exits 3, saying why, when there
    is none (a missing file or schema: it is never created)."""
    missing = missing_store(db)
    if missing is not None:
        fail(f"no session store at {redact_text(db)}: {missing}", EXIT_NOT_FOUND)
    store = open_target(db)
    try:
        yield store
    finally:
        store.close()


def composition_for(
    store: CheckpointStore, session_id: str, agent: str | None, *, needs_model: bool = False, **kwargs: Any
) -> Composition:
    """A composition able to restore ``session_id`` (its recorded agent, or ``agent``).

    With ``needs_model=True`` (resuming) an agent that decides through a model but was given none
    stops here with a usage error, before the session is touched.
    """
    head = store.get_session_head(session_id)
    if head is None:
        fail(f"session {session_id!r} not found", EXIT_NOT_FOUND)
    instance = session_agent(session_id, head.metadata or {}, agent)
    if needs_model:
        require_model(instance, kwargs.get("model"), what=f"qitos sessions resume {session_id}")
    return compose(agent=instance, checkpoint_store=store, **kwargs)


def _lifecycle_style(lifecycle: str) -> str:
    return {
        "completed": "green",
        "running": "cyan",
        "failed": "red",
        "stopped": "yellow",
        "paused": "magenta",
        "awaiting_approval": "bold yellow",
    }.get(lifecycle, "")


@app.command("list")
@cli_command
def list_sessions(db: DbOption = DEFAULT_DB, json_out: JsonOption = False) -> None:
    """List the sessions in the store (newest last); a store that does not exist is an error (exit 3)."""
    with open_store(db) as store:
        rows = [session_summary(h, store) for h in store.list_sessions()]
    if json_out:
        print_json({"db": describe_target(db), "sessions": rows})
        return
    out = console()
    if not rows:
        out.print(f"no sessions in {redact_text(db)}", highlight=False)
        return
    table = Table(title=f"sessions in {redact_text(db)}", title_justify="left")

    # Ids are never cut: the id column keeps its full width and the other columns give way (a
    # narrow terminal folds them onto more lines instead of truncating anything you might copy).
    def widest(key: str, header: str) -> int:
        return max(len(header), *(len(str(row[key] or "")) for row in rows))

    table.add_column("session", no_wrap=True, min_width=widest("session_id", "session"))
    table.add_column("lifecycle", no_wrap=True, min_width=widest("lifecycle", "lifecycle"))
    table.add_column("sequence", no_wrap=True, min_width=widest("sequence", "sequence"))
    table.add_column("task", overflow="ellipsis", max_width=48)
    table.add_column("agent", overflow="fold")
    table.add_column("forked from", overflow="fold")
    table.add_column("updated", overflow="fold")
    for row in rows:
        table.add_row(
            row["session_id"],
            Text(row["lifecycle"], style=_lifecycle_style(row["lifecycle"])),
            str(row["sequence"]),
            Text(str(row["task"] or ""), no_wrap=True, overflow="ellipsis"),
            Text(str(row["agent"] or "")),
            row["parent_session_id"] or "",
            row["updated_at"] or "",
        )
    out.print(table)


@app.command("show")
@cli_command
def show(
    session_id: Annotated[str, typer.Argument(help="Session id.")],
    db: DbOption = DEFAULT_DB,
    json_out: JsonOption = False,
) -> None:
    """Inspect a session: lifecycle, integrity, budget, pending tool calls, lineage, snapshots.

    Read from the store alone: the session's agent is not imported (it may be gone)."""
    with open_store(db) as store:
        detail = session_detail(store, session_id)
    if json_out:
        print_json(detail)
        return
    out = console()
    s = detail["session"]
    ins = detail["inspection"]
    out.print(
        Text.assemble(
            ("session ", "bold"),
            (s["session_id"], "bold cyan"),
            "  ",
            (s["lifecycle"], _lifecycle_style(s["lifecycle"])),
        )
    )
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="dim")
    facts.add_column(overflow="fold")
    facts.add_row("task", Text(str(s["task"] or "")))
    facts.add_row("agent", Text(str(s["agent"] or "")))
    facts.add_row("head", f"{s['snapshot_id']} (sequence {s['sequence']})")
    facts.add_row("integrity", Text(detail["integrity"], style="green" if detail["integrity"] == "verified" else "red"))
    facts.add_row("snapshots", str(detail["snapshot_count"]))
    if ins:
        facts.add_row("capabilities", ", ".join(ins["capabilities"]))
        used = (ins["budget"] or {}).get("used") or {}
        limits = (ins["budget"] or {}).get("limits") or {}
        facts.add_row("steps", f"{used.get('steps', 0)} of {limits.get('max_steps')}")
        facts.add_row(
            "tokens", f"{used.get('tokens', 0)}" + (f" of {limits['max_tokens']}" if limits.get("max_tokens") else "")
        )
        view = ins["last_request_view"]
        if view:
            units = view["units"]
            facts.add_row(
                "last request",
                f"{units['used']}/{units['available']} {view['unit']}, {len(view['exchanges']['omitted'])} exchange(s) "
                f"omitted, {len(view['receipts'])} receipt(s)",
            )
    if detail["inspection_error"]:
        facts.add_row("inspection", Text(detail["inspection_error"], style="yellow"))
    out.print(facts)
    batch = (ins or {}).get("tool_batch")
    if batch:
        table = Table(title=f"tool calls of step {batch['step_id']}", title_justify="left")
        for column in ("call", "tool", "status", "args"):
            table.add_column(column, overflow="fold")
        for call in batch["calls"]:
            table.add_row(call["call_id"], call["tool"], call["status"], Text(str(call["args"])))
        out.print(table)
    tree = Tree("lineage")
    _add_lineage(tree, detail["lineage"])
    out.print(tree)


def _add_lineage(parent: Tree, node: dict[str, Any]) -> None:
    label = Text.assemble(
        (node["session_id"], "bold cyan" if node["current"] else "cyan"),
        f"  {node['lifecycle']}  head {node['snapshot_id'][:16]}",
        (f"  forked at {node['fork_snapshot_id'][:16]}" if node["fork_snapshot_id"] else ""),
        ("  " + node["integrity"], "green" if node["integrity"] == "verified" else "red"),
    )
    branch = parent.add(label)
    for child in node["children"]:
        _add_lineage(branch, child)


@app.command("resume")
@cli_command
def resume(
    session_id: Annotated[str, typer.Argument(help="Session id.")],
    db: DbOption = DEFAULT_DB,
    agent: AgentOption = None,
    steer: Annotated[str | None, typer.Option(help="Steering text taken in at the first boundary.")] = None,
    model: Annotated[str | None, typer.Option(help=f"Model: {MODEL_FORMS}.")] = None,
    base_url: Annotated[str | None, typer.Option(help="API root for --model openai:NAME.")] = None,
    max_input_units: Annotated[int | None, typer.Option(min=1, help="Declared context capacity.")] = None,
    trace_dir: Annotated[str, typer.Option(help="Where run traces are written.")] = DEFAULT_LOGDIR,
    compact: Annotated[bool, typer.Option(help="Allow closed-window compaction with receipts.")] = False,
    json_out: JsonOption = False,
    otel: Annotated[
        bool, typer.Option("--otel", help="Export OpenTelemetry spans over OTLP/HTTP (set by OTEL_EXPORTER_OTLP_*).")
    ] = False,
) -> None:
    """Run or resume a session from its durable head (after a pause, an approval, a crash)."""
    adapter = resolve_model(model, base_url=base_url, max_input_units=max_input_units)
    hooks, renderer = renderer_hooks(json_out)
    with open_store(db) as store, otlp_export(otel) as provider:
        composition = composition_for(
            store,
            session_id,
            agent,
            needs_model=True,
            model=adapter,
            hooks=hooks,
            trace_logdir=trace_dir,
            otel=provider,
            **compaction_extensions(compact),
        )
        session = composition.restore(session_id)
        result = session.run(steering=steer)
    finish(result, json_out, renderer, adapter=adapter, db=db, trace_dir=trace_dir, session_id=session_id)


def _receipt(receipt: object, json_out: bool, message: str) -> None:
    if json_out:
        print_json(to_jsonable(receipt))
    else:
        console().print(message, highlight=False)


@app.command("steer")
@cli_command
def steer(
    session_id: Annotated[str, typer.Argument(help="Session id.")],
    text: Annotated[str, typer.Argument(help="The steering instruction.")],
    db: DbOption = DEFAULT_DB,
    json_out: JsonOption = False,
) -> None:
    """Queue a steering instruction; the session takes it in at its next boundary (exactly once).

    A paused session goes on when resumed, or by itself when a fleet's workers run it.
    """
    with open_store(db) as store:
        receipt = steer_session(store, session_id, text)
        then = how_it_continues(store, session_id, db)
    _receipt(receipt, json_out, f"steering queued at position {receipt.position}; {then}")


@app.command("pause")
@cli_command
def pause(
    session_id: Annotated[str, typer.Argument(help="Session id.")],
    db: DbOption = DEFAULT_DB,
    json_out: JsonOption = False,
) -> None:
    """Request a cooperative pause; a running session stops at its next boundary."""
    with open_store(db) as store:
        receipt = pause_session(store, session_id)
    _receipt(receipt, json_out, f"pause requested at position {receipt.position}")


@app.command("approve")
@cli_command
def approve(
    session_id: Annotated[str, typer.Argument(help="Session id.")],
    call_id: Annotated[str, typer.Argument(help="The tool call awaiting approval (see sessions show).")],
    db: DbOption = DEFAULT_DB,
    json_out: JsonOption = False,
) -> None:
    """Approve a tool call awaiting approval; the next resume runs it (a fleet's workers resume by themselves)."""
    with open_store(db) as store:
        receipt = answer_approval(store, session_id, call_id, approved=True)
        then = how_it_continues(store, session_id, db)
    _receipt(receipt, json_out, f"approved {call_id}; {then}")


@app.command("reject")
@cli_command
def reject(
    session_id: Annotated[str, typer.Argument(help="Session id.")],
    call_id: Annotated[str, typer.Argument(help="The tool call awaiting approval.")],
    reason: Annotated[str | None, typer.Option(help="Why (the agent sees it).")] = None,
    db: DbOption = DEFAULT_DB,
    json_out: JsonOption = False,
) -> None:
    """Reject a tool call awaiting approval; the next resume (a fleet's workers: by themselves) tells the agent."""
    with open_store(db) as store:
        receipt = answer_approval(store, session_id, call_id, approved=False, reason=reason)
        then = how_it_continues(store, session_id, db)
    _receipt(receipt, json_out, f"rejected {call_id}; {then}")


@app.command("fork")
@cli_command
def fork(
    session_id: Annotated[str, typer.Argument(help="Session id.")],
    snapshot: Annotated[str | None, typer.Option(help="Snapshot id to fork from (default: the head).")] = None,
    operation_id: Annotated[
        str | None, typer.Option(help="Idempotency key: the same key returns the same child.")
    ] = None,
    db: DbOption = DEFAULT_DB,
    agent: AgentOption = None,
    json_out: JsonOption = False,
) -> None:
    """Fork a session from a verified snapshot into a new child session (the parent never moves)."""
    with open_store(db) as store:
        child = composition_for(store, session_id, agent).restore(session_id).fork(snapshot, operation_id=operation_id)
        receipt = child.fork_receipt
    data = {
        "child_session_id": child.session_id.value,
        "parent_session_id": receipt.parent_session_id if receipt else session_id,
        "parent_snapshot_id": receipt.parent_snapshot_id if receipt else snapshot,
        "operation_id": operation_id,
    }
    if json_out:
        print_json(data)
    else:
        console().print(
            f"forked {session_id} at {data['parent_snapshot_id']} -> {data['child_session_id']}", highlight=False
        )


@app.command("prune")
@cli_command
def prune(
    keep: Annotated[list[str] | None, typer.Option(help="Also keep this snapshot's chain (repeatable).")] = None,
    db: DbOption = DEFAULT_DB,
    json_out: JsonOption = False,
) -> None:
    """Delete snapshots no session head (nor --keep) reaches, and the blobs only they referenced."""
    with open_store(db) as store:
        report = store.prune(keep=keep or ())
    if json_out:
        print_json(to_jsonable(report))
    else:
        console().print(
            f"deleted {report.deleted_snapshots} snapshot(s) and {report.deleted_blobs} blob(s); "
            f"{report.kept_snapshots} snapshot(s) kept",
            highlight=False,
        )


@app.command("vacuum")
@cli_command
def vacuum(db: DbOption = DEFAULT_DB, json_out: JsonOption = False) -> None:
    """Reclaim the space freed by pruning."""
    with open_store(db) as store:
        before = _db_bytes(db, store)
        store.vacuum()
        after = _db_bytes(db, store)
    if json_out:
        print_json({"db": describe_target(db), "bytes_before": before, "bytes_after": after})
    else:
        console().print(f"vacuumed {redact_text(db)}: {before:,} -> {after:,} bytes", highlight=False)


def _db_bytes(db: str, store: CheckpointStore) -> int:
    if isinstance(store, PostgresCheckpointStore):  # the tables' sizes on the server
        return sum(entry.bytes for entry in store.table_sizes())
    return sum(os.path.getsize(p) for p in (db, db + "-wal") if os.path.exists(p))
