"""The ``qitos`` command: the typer app and its console entry point :func:`main`.

::

    qitos --version
    qitos init NAME
    qitos demo [--policy scripted|model] [--model local|scripted] [--workspace DIR] [--json]
    qitos run MODULE:Class "task" [--model openai:NAME --base-url URL | local | scripted:FILE.json]
    qitos sessions list|show|resume|steer|pause|approve|reject|fork|prune|vacuum
    qitos trace list|show|export|serve
    qitos memory list|add|delete
    qitos eval run|list|show|score|resume

Exit codes and error output are described in :mod:`qitos.cli._common`.
"""

from __future__ import annotations

from typing import Annotated

import typer

from qitos import __version__
from qitos.cli import _eval, _memory, _sessions, _trace, _worker
from qitos.cli._common import set_debug
from qitos.cli._init import init
from qitos.cli._running import demo, run

__all__ = ["app", "main"]

app = typer.Typer(
    name="qitos",
    help="qitos: run, watch and debug agents (typed state, one loop, durable sessions, honest context).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"qitos {__version__}")
        raise typer.Exit(0)


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
) -> None:
    """qitos: run, watch and debug agents."""
    set_debug(debug)


app.command("demo")(demo)
app.command("init")(init)
app.command("run")(run)
app.command("worker")(_worker.worker)
_sessions.app.command("submit")(_worker.submit)
app.add_typer(_sessions.app, name="sessions")
app.add_typer(_trace.app, name="trace")
app.add_typer(_memory.app, name="memory")
app.add_typer(_eval.app, name="eval")


def main() -> None:
    """The console entry point (``qitos = "qitos.cli.app:main"``)."""
    app(prog_name="qitos")


if __name__ == "__main__":
    main()
