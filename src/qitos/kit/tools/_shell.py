"""A shell-command tool that needs approval unless explicitly allowed.

``shell_tool(cwd=...)`` returns one :class:`~qitos.core._tool.ToolSpec` named ``shell`` taking a
``command`` string. By default ``needs_approval=True``: the engine pauses the session with
``awaiting_approval`` and runs the command only after a human approves that call;
``allow=True`` runs commands without asking.

No shell is involved: the command is split into words the way a POSIX shell would (``shlex``),
and the program is started directly with ``subprocess`` (never ``shell=True``). So quotes group
words, but pipes, redirections, ``&&``, globs, ``$VAR`` and backticks are passed to the program
as literal text, and one program runs per call. (Run ``sh -c '...'`` explicitly if you really want
a shell; the approval step then shows exactly that.)

The process runs in ``cwd`` in its own process group (session). Standard output and error are
merged; at most ``max_output_chars`` characters are kept (the rest is counted and dropped while
reading, so a chatty command cannot fill memory). After ``timeout`` seconds the whole process
group is killed (SIGKILL) and the call fails with a timeout. A command that exits non-zero is not
a tool failure: its output starts with ``exit code: N``.

The environment is an allow-list, never the parent's whole environment: by default only
``PATH``, ``HOME``, ``USER``, ``LOGNAME``, ``SHELL``, ``LANG``, ``LANGUAGE``, ``LC_*``, ``TERM``,
``COLORTERM``, ``NO_COLOR``, ``TZ``, ``TMPDIR``, ``TEMP`` and ``TMP`` are passed on from the parent.
``env_allow`` adds names: an exact name (``"DATABASE_URL"``) is passed even when it looks secret,
since the user listed it; a pattern (``"MYAPP_*"``, shell-style) passes the names it matches except
those that look secret (containing KEY, TOKEN, SECRET, PASSWORD, PASSWD, CREDENTIAL, AUTH, a ``PAT``
word, or ending in ``_URL``/``_DSN``). ``extra_env`` sets fixed values on top. ``env`` replaces the
inherited part entirely (``extra_env`` still applies). So ``DATABASE_URL``, ``GITHUB_PAT``,
``MY_PASSWD`` or ``AUTH_HEADER`` reach a command only when named. This is not a sandbox: an approved
command can do anything the user running qitos can.
"""

from __future__ import annotations

import contextlib
import fnmatch
import io
import os
import re
import shlex
import signal
import subprocess
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import cast

from qitos.core._errors import ConfigurationError
from qitos.core._tool import ToolSpec

__all__ = ["DEFAULT_ENV_ALLOW", "shell_environment", "shell_tool"]

DEFAULT_ENV_ALLOW: tuple[str, ...] = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TERM",
    "COLORTERM",
    "NO_COLOR",
    "TZ",
    "TMPDIR",
    "TEMP",
    "TMP",
)
"""Names (and shell-style patterns) the shell tool inherits from the parent environment by default."""

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|(?:^|_)PAT(?:_|$)|_(?:URL|DSN)$")
_PATTERN_CHARS = frozenset("*?[")
_READ_CHUNK = 65_536


def shell_tool(
    *,
    cwd: str | os.PathLike[str],
    allow: bool = False,
    timeout: float = 30.0,
    max_output_chars: int = 20_000,
    env: Mapping[str, str] | None = None,
    env_allow: Iterable[str] = (),
    extra_env: Mapping[str, str] | None = None,
    name: str = "shell",
) -> ToolSpec:
    """The ``shell`` tool; see the module docstring for exactly how commands are run."""
    workdir = Path(cwd).resolve()
    if not workdir.is_dir():
        raise ConfigurationError(f"shell_tool cwd {str(cwd)!r} is not an existing directory")
    if timeout <= 0:
        raise ConfigurationError(f"shell_tool timeout must be > 0 seconds, got {timeout}")
    if max_output_chars < 1:
        raise ConfigurationError(f"shell_tool max_output_chars must be >= 1, got {max_output_chars}")
    if isinstance(env_allow, str):
        raise ConfigurationError("shell_tool env_allow must be a list of names, not one string")
    base_env = dict(env) if env is not None else shell_environment(os.environ, allow=env_allow)
    child_env = {**base_env, **(extra_env or {})}

    def run(command: str) -> str:
        argv = shlex.split(command)
        if not argv:
            raise ValueError("command is empty")
        return _run(argv, cwd=workdir, env=child_env, timeout=timeout, max_chars=max_output_chars)

    return ToolSpec(
        name=name,
        description=(
            f"Run one program in {workdir} and return its exit code and output. The command is split into "
            "words like a shell would, but no shell runs it: pipes, redirections, &&, globs and $VARIABLES "
            f"are not interpreted. Killed after {timeout:g} s."
        ),
        parameters={
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The program and its arguments."}},
            "required": ["command"],
            "additionalProperties": False,
        },
        func=run,
        # Both _run and the registry stop waiting at `timeout` (whichever notices first reports
        # "timed out after <timeout> s"); _run always kills the process group.
        timeout=timeout,
        idempotent=False,
        needs_approval=not allow,
        # _run caps the output itself and says so; the registry must not cut it again.
        max_output_chars=None,
    )


def shell_environment(parent: Mapping[str, str], *, allow: Iterable[str] = ()) -> dict[str, str]:
    """The part of ``parent`` a command inherits: :data:`DEFAULT_ENV_ALLOW` plus ``allow``.

    Exact names in ``allow`` pass as listed; a pattern (default or given) passes a matching name
    unless the name looks secret (see the module docstring).
    """
    names: set[str] = set()
    patterns: list[str] = []
    for item in (*DEFAULT_ENV_ALLOW, *allow):
        if _PATTERN_CHARS.isdisjoint(item):
            names.add(item)
        else:
            patterns.append(item)
    out: dict[str, str] = {}
    for key, value in parent.items():
        listed = key in names
        if listed or (not _SECRET_NAME.search(key.upper()) and any(fnmatch.fnmatchcase(key, p) for p in patterns)):
            out[key] = value
    return out


def _run(argv: list[str], *, cwd: Path, env: Mapping[str, str], timeout: float, max_chars: int) -> str:
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"command not found: {argv[0]!r}") from exc
    kept: list[bytes] = []
    counts = {"kept": 0, "total": 0}
    stdout = cast(io.BufferedReader, proc.stdout)  # stdout=PIPE in binary mode: a BufferedReader

    def drain() -> None:
        # Keep up to ~4 bytes per allowed character (UTF-8), count and drop the rest.
        limit = max_chars * 4
        while chunk := stdout.read1(_READ_CHUNK):
            counts["total"] += len(chunk)
            room = limit - counts["kept"]
            if room > 0:
                kept.append(chunk[:room])
                counts["kept"] += min(room, len(chunk))

    reader = threading.Thread(target=drain, name="qitos-shell-reader", daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        reader.join(timeout=2.0)
        raise TimeoutError(f"command timed out after {timeout:g} s; its process group was killed") from None
    reader.join(timeout=2.0)
    if reader.is_alive():
        # The program exited but left children holding the pipe open: stop them too.
        _kill_group(proc)
        reader.join(timeout=2.0)
    stdout.close()
    text = b"".join(kept).decode("utf-8", errors="replace")
    note = ""
    if len(text) > max_chars or counts["total"] > counts["kept"]:
        text = text[:max_chars]
        note = f"\n...[output truncated: {counts['total']} bytes produced, first {max_chars} characters shown]"
    return f"exit code: {code}\n{text}{note}"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
