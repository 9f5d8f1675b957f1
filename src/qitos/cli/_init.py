"""``qitos init NAME``: write a small project to start from, which runs and passes as written.

The project (the files of ``qitos/cli/project_template``, ``.tmpl`` dropped): an agent
(``agent.py``), its tool (``tools.py``), tests (``test_agent.py``) and a dataset to evaluate the
agent on (``dataset.jsonl``, run by ``qitos eval run`` and by a test through ``qitos.eval``), with
a README. The command prints the commands to try next; each
runs as printed.
"""

from __future__ import annotations

import shlex
from importlib import resources
from pathlib import Path
from typing import Annotated

import typer

from qitos.cli._common import EXIT_USAGE, cli_command, console, fail, print_json

__all__ = ["init"]

_SUFFIX = ".tmpl"


@cli_command
def init(
    name: Annotated[str, typer.Argument(help="The project's directory (created; it must not hold files yet).")],
    json_out: Annotated[bool, typer.Option("--json", help="Print what was written as JSON.")] = False,
) -> None:
    """Write a small project: an agent, a tool, tests and a dataset to evaluate it on."""
    target = Path(name)
    project = target.resolve().name
    if not project or project in (".", ".."):
        fail(f"a project needs a directory name, got {name!r}", EXIT_USAGE)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        fail(f"{name} exists and is not an empty directory; choose a new name", EXIT_USAGE)
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for entry in sorted(resources.files("qitos.cli").joinpath("project_template").iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(_SUFFIX):
            continue
        text = entry.read_text(encoding="utf-8")
        if entry.name == "README.md" + _SUFFIX:
            text = text.replace("{name}", project)
        out = target / entry.name[: -len(_SUFFIX)]
        out.write_text(text, encoding="utf-8")
        written.append(out.name)
    commands = [
        f"cd {shlex.quote(name)}",
        'python agent.py "12 * 7"',
        'qitos run agent:CalculatorAgent "12 * 7"',
        "qitos eval run dataset.jsonl --agent agent:CalculatorAgent --name baseline",
        "python -m pytest -q",
    ]
    if json_out:
        print_json({"project": str(target.resolve()), "files": written, "next": commands})
        return
    out_console = console()
    out_console.print(f"created {name}/: {', '.join(written)}", highlight=False)
    out_console.print("next:", highlight=False)
    for command in commands:
        out_console.print(f"  {command}", highlight=False, soft_wrap=True)
