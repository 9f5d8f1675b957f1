"""Worker processes and polling helpers for the fleet tests (importable as ``fleet_procs``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["side_counts", "start_worker", "stop_workers", "until", "workers"]

ROOT = Path(__file__).resolve().parents[2]
_MAIN = "from qitos.cli.app import main; main()"


def _env(side_log: Path, lease_ttl: float, step_sleep: float) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])
    env["QITOS_FLEET_SIDE_LOG"] = str(side_log)
    env["QITOS_FLEET_LEASE_TTL"] = str(lease_ttl)
    env["QITOS_FLEET_STEP_SLEEP"] = str(step_sleep)
    return env


def start_worker(
    db: str,
    side_log: Path,
    *,
    concurrency: int = 8,
    lease_ttl: float = 30.0,
    step_sleep: float = 0.0,
    extra_args: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
    app: str = "fleet_app:composition",
) -> subprocess.Popen[str]:
    """``qitos worker --app fleet_app:composition`` in a new process, returned once it is ready.

    Its stderr goes to a ``worker-*.err`` file beside ``side_log`` (never an unread pipe).
    """
    err_path = side_log.with_name(f"worker-{uuid.uuid4().hex[:8]}.err")
    err = err_path.open("w", encoding="utf-8")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _MAIN,
            "worker",
            "--app",
            app,
            "--db",
            db,
            "--concurrency",
            str(concurrency),
            "--json",
            *extra_args,
        ],
        env={**_env(side_log, lease_ttl, step_sleep), **(extra_env or {})},
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
    )
    err.close()  # the child has its own descriptor
    assert proc.stdout is not None
    line = proc.stdout.readline()
    try:
        ready = json.loads(line).get("ready") if line else False
    except ValueError:
        ready = False
    if not ready:
        proc.kill()
        proc.wait(timeout=10)
        raise RuntimeError(f"worker did not start ({line!r}): {err_path.read_text(encoding='utf-8')[-2000:]}")
    return proc


def stop_workers(procs: list[subprocess.Popen[str]]) -> None:
    """Terminate the workers still running and wait for them (killing any that will not stop)."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def workers(db: str, side_log: Path, count: int, **options: Any) -> Iterator[list[subprocess.Popen[str]]]:
    """``count`` worker processes (started one after the other), terminated at the end."""
    procs: list[subprocess.Popen[str]] = []
    try:
        for _ in range(count):
            procs.append(start_worker(db, side_log, **options))
        yield procs
    finally:
        stop_workers(procs)


def until(check: Callable[[], Any], *, timeout: float, what: str, poll: float = 0.02) -> Any:
    """Poll ``check`` until it returns something truthy (which is returned); else fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)


def side_counts(side_log: Path) -> Counter[tuple[str, str, str]]:
    """How often each ``(event, task, step)`` line occurs in the tools' side-effect log."""
    if not side_log.exists():
        return Counter()
    lines = side_log.read_text(encoding="utf-8").splitlines()
    return Counter(tuple(line.split(" ")) for line in lines)  # type: ignore[misc]
