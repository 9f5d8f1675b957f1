"""What every ``qitos`` command shares: exit codes, one-line errors, JSON output, consoles.

Exit codes:

====  ==========================================================================
0     success (a run that completed, or paused / awaits approval as asked)
1     a run failed or stopped abnormally, or an unexpected error
2     usage error: bad option or argument, wrong configuration
3     not found: no such run, session, snapshot, record or store
====  ==========================================================================

Errors are printed once, as one line on stderr (``error: ...``); with ``--json`` they are JSON on
stdout instead (``{"error": message, "exit_code": code}``, plus ``hint`` when there is one), so a
``--json`` caller always reads JSON. ``qitos --debug`` (or ``QITOS_DEBUG=1``) adds the traceback
(on stderr).
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn, ParamSpec, TypeVar

import typer
from rich.console import Console

from qitos.checkpoint._records import SnapshotNotFoundError
from qitos.checkpoint._targets import check_target
from qitos.core._errors import QitosError, SessionNotFoundError, UsageError
from qitos.core._redaction import redact_text
from qitos.viewer._data import NotFoundError

__all__ = [
    "DEFAULT_DB",
    "DEFAULT_LOGDIR",
    "DEFAULT_MEMORY_DIR",
    "EXIT_FAILED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_USAGE",
    "CliError",
    "cli_command",
    "console",
    "debug_enabled",
    "exit_code_for",
    "fail",
    "print_json",
    "set_debug",
    "shown_command",
    "store_target",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3

DEFAULT_DB = os.path.join(".qitos", "sessions.db")
DEFAULT_LOGDIR = "./runs"
DEFAULT_MEMORY_DIR = os.path.join(".qitos", "memory")

P = ParamSpec("P")
R = TypeVar("R")


class CliError(Exception):
    """An error the CLI reports as one line with a chosen exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.hint = hint


def store_target(ctx: typer.Context, param: typer.CallbackParam, value: str | None) -> str | None:
    """Option callback for a store option (``--db``, ``--session-db``): a malformed URL is a usage
    error naming the option (and, like every store shown, without its password)."""
    if value:
        try:
            check_target(value)
        except UsageError as exc:
            raise typer.BadParameter(str(exc), ctx=ctx, param_hint=f"'{param.opts[0]}'") from None
    return value


def fail(message: str, code: int = EXIT_FAILED, *, hint: str | None = None) -> NoReturn:
    """Stop the command with ``message`` (and a ``hint`` line) on stderr and exit ``code``."""
    raise CliError(message, code, hint=hint)


def exit_code_for(exc: BaseException) -> int:
    """The exit code an exception maps to (see the module docstring)."""
    if isinstance(exc, CliError):
        return exc.code
    if isinstance(exc, NotFoundError | SessionNotFoundError | SnapshotNotFoundError):
        return EXIT_NOT_FOUND
    if isinstance(exc, UsageError):
        return EXIT_USAGE
    return EXIT_FAILED


def _message(exc: BaseException) -> str:
    text = str(exc) if isinstance(exc, CliError | QitosError) else f"{type(exc).__name__}: {exc}"
    return redact_text(" ".join(text.split())) or type(exc).__name__


_DEBUG = {"on": False}


def set_debug(enabled: bool) -> None:
    """Record ``qitos --debug`` for this invocation."""
    _DEBUG["on"] = enabled


def debug_enabled() -> bool:
    """Whether ``--debug`` was given to ``qitos`` (or ``QITOS_DEBUG`` is set)."""
    if os.environ.get("QITOS_DEBUG", "").strip() not in ("", "0", "false", "no"):
        return True
    return _DEBUG["on"]


def cli_command(fn: Callable[P, R]) -> Callable[P, R]:
    """Wrap a command: exceptions become one line on stderr and a meaningful exit code."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise
        except BrokenPipeError:
            _silence_stdout()  # the reader of our output is gone: stop quietly
            raise typer.Exit(EXIT_FAILED) from None
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            raise typer.Exit(130) from None
        except Exception as exc:
            if debug_enabled():
                traceback.print_exc(file=sys.stderr)
            code = exit_code_for(exc)
            hint = exc.hint if isinstance(exc, CliError) else None
            if kwargs.get("json_out"):
                data: dict[str, Any] = {"error": _message(exc), "exit_code": code}
                if hint:
                    data["hint"] = hint
                print_json(data)
            else:
                typer.echo(f"error: {_message(exc)}", err=True)
                if hint:
                    typer.echo(f"hint: {hint}", err=True)
            raise typer.Exit(code) from None

    return wrapper


def shown_command(*words: str, **options: str | None) -> str:
    """A command line to print as a hint, quoted so that it runs as printed.

    ``options`` become ``--name value`` flags (underscores as dashes), left out when None. A secret
    in a value (a store URL's password) is redacted: a hint never shows one, so that one command
    needs the secret typed in again."""
    argv = list(words)
    for name, value in options.items():
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", redact_text(value)]
    return shlex.join(argv)


def print_json(value: object) -> None:
    """Write ``value`` as indented JSON on stdout (stable key order as built)."""
    typer.echo(json.dumps(value, indent=2, ensure_ascii=False, default=repr))


def console(*, stderr: bool = False) -> Console:
    """A rich console on the current stdout (or stderr): colours and live output only on a TTY.

    Markup is off: text from runs is printed as text (styles come from ``rich.text.Text``). Off a
    terminal, long lines are not wrapped (pipes and files get whole lines).
    """
    stream = sys.stderr if stderr else sys.stdout
    terminal = stream.isatty()
    width = None if terminal else _pipe_width()
    return _Console(file=stream, highlight=False, markup=False, soft_wrap=not terminal, width=width)


class _Console(Console):
    """A console that goes quiet when its reader goes away (``qitos demo | head``).

    rich's default raises SystemExit from inside whatever is printing, which would end a run midway;
    here the output is dropped and the run finishes (and its trace is completed).
    """

    def on_broken_pipe(self) -> None:
        self.quiet = True
        _silence_stdout()


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _pipe_width() -> int:
    try:
        return max(40, int(os.environ.get("COLUMNS", "")))
    except ValueError:
        return 160
