"""Commands run the way a user runs them: ``bash -c LINE`` in a directory, as a real process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def shell_env() -> dict[str, str]:
    """The environment a user's shell has: this checkout's ``qitos`` on PATH and its sources first."""
    import qitos

    env = dict(os.environ)
    src = str(Path(qitos.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    for name in ("QITOS_DEBUG", "QITOS_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        env.pop(name, None)
    env["COLUMNS"] = "200"
    return env


def sh(command: str, cwd: Path, *, code: int | None = 0, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run one command line with bash in ``cwd``, as a user types it (a real process)."""
    done = subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=shell_env(), capture_output=True, text=True, timeout=timeout
    )
    if code is not None:
        assert done.returncode == code, f"{command!r} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done
