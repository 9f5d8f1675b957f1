"""Every command and group has help text, and ``--help`` works for each."""

from __future__ import annotations

from typing import Any

import pytest
import typer

from qitos.cli.app import app

EXPECTED = {
    ("demo",),
    ("init",),
    ("run",),
    ("worker",),
    ("sessions",),
    ("trace",),
    ("memory",),
    ("eval",),
    *(
        ("sessions", c)
        for c in ("list", "show", "resume", "steer", "pause", "approve", "reject", "fork", "prune", "vacuum", "submit")
    ),
    *(("trace", c) for c in ("list", "show", "export", "serve")),
    *(("memory", c) for c in ("list", "add", "delete")),
    *(("eval", c) for c in ("run", "list", "show", "score", "resume", "cache", "compare", "export")),
    ("eval", "cache", "clear"),
}


def _commands() -> list[tuple[tuple[str, ...], Any]]:
    root = typer.main.get_command(app)
    found: list[tuple[tuple[str, ...], Any]] = []

    def walk(command: Any, path: tuple[str, ...]) -> None:
        for name, sub in getattr(command, "commands", {}).items():
            found.append(((*path, name), sub))
            walk(sub, (*path, name))

    walk(root, ())
    return found


def test_the_command_tree_is_exactly_the_documented_one() -> None:
    assert {path for path, _ in _commands()} == EXPECTED


@pytest.mark.parametrize("path", sorted(EXPECTED))
def test_every_command_has_help(cli: Any, path: tuple[str, ...]) -> None:
    command = dict(_commands())[path]
    assert (command.help or "").strip(), f"qitos {' '.join(path)} has no help text"
    result = cli.run(*path, "--help", code=0)
    assert "Usage" in result.stdout


def test_listing_commands_all_offer_json(cli: Any) -> None:
    listings = (("sessions", "list"), ("sessions", "show"), ("trace", "list"), ("trace", "show"), ("memory", "list"))
    for path in (*listings, *(("eval", c) for c in ("run", "list", "show", "score", "resume"))):
        assert "--json" in cli.run(*path, "--help", code=0).stdout
