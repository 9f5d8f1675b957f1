"""``qitos memory``: list, add and delete records of a memdir memory (``--dir``, default ``.qitos/memory``)."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from qitos.cli._common import (
    DEFAULT_MEMORY_DIR,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    cli_command,
    console,
    fail,
    print_json,
    shown_command,
)
from qitos.core.memory import MemoryRecord
from qitos.kit.memory._memdir_segment import MEMORY_TYPES
from qitos.kit.memory.memdir_memory import MemdirMemory

__all__ = ["app", "record_to_dict"]

app = typer.Typer(help="Memdir memory: list, add, delete records.")

DirOption = Annotated[str, typer.Option("--dir", help="The memory directory.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def record_to_dict(record: MemoryRecord) -> dict[str, Any]:
    """A record's JSON shape: ``record_id, role, type, step_id, created_at, content, metadata``."""
    meta = dict(record.metadata)
    return {
        "record_id": record.record_id,
        "role": record.role,
        "type": meta.get("type"),
        "step_id": record.step_id,
        "created_at": meta.get("created_at"),
        "content": record.content,
        "metadata": meta,
    }


def _dir_option(directory: str) -> str | None:
    return None if directory == DEFAULT_MEMORY_DIR else directory


def _open(directory: str, *, create: bool = False) -> MemdirMemory:
    if not create and not os.path.isdir(directory):
        add = shown_command("qitos", "memory", "add", "TEXT", dir=_dir_option(directory))
        fail(f"no memory at {directory} (create one: {add})", EXIT_NOT_FOUND)
    return MemdirMemory(directory, create=create)


@app.command("list")
@cli_command
def list_records(
    directory: DirOption = DEFAULT_MEMORY_DIR,
    memory_type: Annotated[
        str | None, typer.Option("--type", help=f"Only this type ({', '.join(MEMORY_TYPES)}).")
    ] = None,
    contains: Annotated[str | None, typer.Option(help="Only records containing this text.")] = None,
    limit: Annotated[int, typer.Option(min=0, help="The newest N records (0: all).")] = 50,
    json_out: JsonOption = False,
) -> None:
    """List memory records, oldest first."""
    if memory_type is not None and memory_type not in MEMORY_TYPES:
        fail(f"--type must be one of {', '.join(MEMORY_TYPES)}, got {memory_type!r}", EXIT_USAGE)
    if not os.path.isdir(directory):  # nothing was ever added here: an empty listing, like the others
        if json_out:
            print_json({"dir": os.path.abspath(directory), "records": []})
        else:
            add = shown_command("qitos", "memory", "add", "TEXT", dir=_dir_option(directory))
            console().print(f"no memories in {directory} (create one: {add})", highlight=False)
        return
    memory = _open(directory)
    query: dict[str, Any] = {"max_items": limit or None}
    if memory_type:
        query["type"] = memory_type
    if contains:
        query["contains"] = contains
    rows = [record_to_dict(r) for r in memory.retrieve(query)]
    if json_out:
        print_json({"dir": os.path.abspath(directory), "records": rows})
        return
    out = console()
    if not rows:
        out.print(f"no memories in {directory}", highlight=False)
        return
    table = Table(title=f"memory in {directory}", title_justify="left")
    for column in ("record", "type", "role", "step", "content"):
        table.add_column(column, overflow="fold")
    for row in rows:
        content = str(row["content"])
        table.add_row(
            row["record_id"],
            str(row["type"]),
            row["role"],
            str(row["step_id"]),
            Text(content if len(content) <= 200 else content[:199] + "…"),
        )
    out.print(table)


@app.command("add")
@cli_command
def add(
    text: Annotated[str, typer.Argument(help="The fact to remember.")],
    directory: DirOption = DEFAULT_MEMORY_DIR,
    memory_type: Annotated[str, typer.Option("--type", help=f"One of {', '.join(MEMORY_TYPES)}.")] = "project",
    role: Annotated[str, typer.Option(help="Who said it.")] = "user",
    record_id: Annotated[str | None, typer.Option("--id", help="Record id (replaces a record with this id).")] = None,
    json_out: JsonOption = False,
) -> None:
    """Add a record (the memory directory is created if needed)."""
    if memory_type not in MEMORY_TYPES:
        fail(f"--type must be one of {', '.join(MEMORY_TYPES)}, got {memory_type!r}", EXIT_USAGE)
    if not text.strip():
        fail("the text to remember is empty", EXIT_USAGE)
    memory = _open(directory, create=True)
    kwargs: dict[str, Any] = {"record_id": record_id} if record_id else {}
    record = MemoryRecord(role=role, content=text, step_id=0, metadata={"type": memory_type}, **kwargs)
    memory.append(record)
    stored = next((r for r in memory.retrieve({"record_ids": [record.record_id], "max_items": None})), record)
    if json_out:
        print_json(record_to_dict(stored))
    else:
        console().print(f"added {record.record_id} ({memory_type}) to {directory}", highlight=False)


@app.command("delete")
@cli_command
def delete(
    record_id: Annotated[str, typer.Argument(help="The record id (see qitos memory list).")],
    directory: DirOption = DEFAULT_MEMORY_DIR,
    json_out: JsonOption = False,
) -> None:
    """Delete a record from this memory directory (never from global memory)."""
    memory = _open(directory)
    deleted = memory.delete(record_id)
    if json_out:
        print_json({"record_id": record_id, "deleted": deleted})
    elif deleted:
        console().print(f"deleted {record_id}", highlight=False)
    if not deleted:
        fail(f"no record {record_id!r} in {directory}", EXIT_NOT_FOUND)
