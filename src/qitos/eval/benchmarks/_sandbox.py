"""Running a benchmark's generated code: in a separate, limited process, never in this one.

:func:`arun_sandboxed` writes the program into a fresh temporary directory and runs it with this
Python (``-I``: no user site, no ``PYTHON*`` variables) through ``_sandbox_child.py``, which sets
its limits (address space ``memory_mb``, CPU seconds, file size, processes), leaves the network
when the kernel allows (an empty network namespace) and refuses, by an audit hook, network use,
new processes, native code and any write outside the directory. The process runs in a session of
its own; after ``timeout`` wall seconds the whole session is killed. The directory is removed
afterwards. The result says how it ended: ``passed`` (exit 0), ``failed`` (an exception, an
assertion, a refused operation), ``memory`` (MemoryError at the limit), ``timeout`` or ``killed``
(a signal, e.g. the CPU limit's).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SandboxResult", "arun_sandboxed"]

_CHILD = Path(__file__).with_name("_sandbox_child.py")
_OUTPUT = 4000  # characters of the program's output kept


@dataclass(frozen=True, kw_only=True)
class SandboxResult:
    """How one sandboxed program ended: ``status``, its exit code, its (clipped) output and time."""

    status: str  # passed | failed | memory | timeout | killed
    returncode: int | None
    output: str
    seconds: float

    @property
    def passed(self) -> bool:
        """Whether the program ran to the end (exit status 0)."""
        return self.status == "passed"


async def arun_sandboxed(
    program: str, *, timeout: float, memory_mb: int, cpu_seconds: int | None = None
) -> SandboxResult:
    """Run ``program`` (Python source) in a sandboxed child process; see the module docstring."""
    workdir = tempfile.mkdtemp(prefix="qitos-sandbox-")
    started = time.perf_counter()
    try:
        path = os.path.join(workdir, "program.py")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(program)
        cpu = cpu_seconds if cpu_seconds is not None else max(1, int(timeout))
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            str(_CHILD),
            workdir,
            str(int(memory_mb)),
            str(cpu),
            path,
            cwd=workdir,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            output, _ = await asyncio.wait_for(process.communicate(), timeout)
        except TimeoutError:
            _kill_group(process.pid)
            await process.wait()
            return SandboxResult(status="timeout", returncode=None, output="", seconds=time.perf_counter() - started)
        except BaseException:
            _kill_group(process.pid)
            raise
        finally:
            _kill_group(process.pid)  # anything the program left behind in its session
        text = output.decode("utf-8", "replace")
        code = process.returncode
        if code == 0:
            status = "passed"
        elif code is not None and code < 0:
            status = "killed"
        elif "MemoryError" in text:
            status = "memory"
        else:
            status = "failed"
        clipped = text if len(text) <= _OUTPUT else text[-_OUTPUT:]
        return SandboxResult(status=status, returncode=code, output=clipped, seconds=time.perf_counter() - started)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
