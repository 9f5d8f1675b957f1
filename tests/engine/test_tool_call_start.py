"""A non-idempotent call counts as started when it begins, not when it is queued.

Sync tools of async runs wait for a thread of a bounded executor, and the calls of one decision
beyond ``max_parallel_tools`` wait for a slot. A call that waits has not begun: a crash (kill -9)
or a cancellation while it waits must leave it to run on resume, never report it ``interrupted``.
A call that has begun and finishes while its run is being cancelled keeps its result. Each case
runs on SQLite and on PostgreSQL, the crashes in real processes.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import charge_agents as ca
import session_agents as sa
from pg_server import drop_schema, fresh_schema


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store URL: a SQLite file, or a fresh schema of the test PostgreSQL server."""
    if request.param == "sqlite":
        yield str(tmp_path / "sessions.db")
        return
    dsn = request.getfixturevalue("pg_dsn")
    schema = fresh_schema()
    separator = "&" if "?" in dsn else "?"
    try:
        yield f"{dsn}{separator}schema={schema}"
    finally:
        drop_schema(dsn, schema)


def _create(db: str, ledger: Path, *tasks: str, calls: int = 1) -> list[str]:
    composition = ca.charge_composition(db, str(ledger))
    try:
        return [composition.session(task, calls=calls).session_id.value for task in tasks]
    finally:
        composition.runtime.checkpoint_store.close()


def _wait_for(condition: Any, what: str, proc: Any = None, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the runner ended before {what}: {proc.communicate()}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _kill(proc: Any) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)


def _held(ledger: Path, call: str) -> bool:
    return Path(f"{ledger}.held-{call}").exists()


def _begun(ledger: Path) -> Counter[str]:
    return Counter(line.split(" ")[1] for line in ca.ledger(ledger) if line.startswith("begin "))


def _resume(db: str, ledger: Path, ids: list[str], *extra: str) -> dict[str, dict[str, str]]:
    out = sa.finish_cli(
        sa.start_module("charge_agents", "run", "--db", db, "--ledger", str(ledger), "--ids", ",".join(ids), *extra)
    )
    out.pop("_stderr")
    for summary in out.values():
        assert summary["stop_reason"] == "final", summary
    return {sid: ca.observed(summary) for sid, summary in out.items()}


def test_a_crash_while_a_sync_call_waits_for_an_executor_thread_leaves_it_to_run_on_resume(
    db: str, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    a, b = _create(db, ledger, "A", "B")
    runner = sa.start_module(
        "charge_agents",
        "run",
        "--db",
        db,
        "--ledger",
        str(ledger),
        "--ids",
        f"{a},{b}",
        "--workers",
        "1",
        "--hold",
        "A-0",
    )
    _wait_for(
        lambda: _held(ledger, "A-0") and "decide B" in ca.ledger(ledger), "A's call to hold the only thread", runner
    )
    time.sleep(0.5)  # B's call is queued behind A's (and, queued, must not count as started)
    _kill(runner)
    assert _begun(ledger) == Counter({"A-0": 1})

    seen = _resume(db, ledger, [a, b], "--workers", "1")
    assert seen[b] == {"B-0": "ok"}  # it never began, so it ran now
    assert seen[a] == {"A-0": "interrupted"}  # it began and was cut off: not run again
    assert _begun(ledger) == Counter({"A-0": 1, "B-0": 1})


@pytest.mark.parametrize("driver", ["async", "sync"])
def test_a_crash_while_calls_of_a_decision_wait_for_a_slot_leaves_them_to_run_on_resume(
    db: str, tmp_path: Path, driver: str
) -> None:
    ledger = tmp_path / "ledger"
    (c,) = _create(db, ledger, "C", calls=4)
    mode = ["--sync"] if driver == "sync" else []
    runner = sa.start_module(
        "charge_agents",
        "run",
        "--db",
        db,
        "--ledger",
        str(ledger),
        "--ids",
        c,
        "--parallel",
        "2",
        "--hold",
        "C-0,C-1",
        *mode,
    )
    _wait_for(lambda: _held(ledger, "C-0") and _held(ledger, "C-1"), "two calls to fill both slots", runner)
    time.sleep(0.5)  # C-2 and C-3 wait for a slot
    _kill(runner)
    assert _begun(ledger) == Counter({"C-0": 1, "C-1": 1})

    seen = _resume(db, ledger, [c], "--parallel", "2", *mode)
    assert seen[c] == {"C-0": "interrupted", "C-1": "interrupted", "C-2": "ok", "C-3": "ok"}
    assert _begun(ledger) == Counter({"C-0": 1, "C-1": 1, "C-2": 1, "C-3": 1})


def _cancel_when(tasks: list[asyncio.Task[Any]], ready: Any) -> Any:
    async def cancel() -> list[Any]:
        while not ready():
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)
        for task in tasks:
            task.cancel()
        return await asyncio.gather(*tasks, return_exceptions=True)

    return cancel()


def test_cancelling_arun_keeps_a_call_that_finishes_meanwhile_and_leaves_a_queued_call_to_run(
    db: str, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    a, b = _create(db, ledger, "A", "B")
    composition = ca.charge_composition(db, str(ledger), workers=1, sleep=0.5)

    async def main() -> list[Any]:
        first, second = [await composition.arestore(sid) for sid in (a, b)]
        tasks = [asyncio.create_task(first.arun())]
        while "begin A-0" not in ca.ledger(ledger):  # A's call holds the only thread
            await asyncio.sleep(0.005)
        tasks.append(asyncio.create_task(second.arun()))
        return list(await _cancel_when(tasks, lambda: "decide B" in ca.ledger(ledger)))

    outcomes = asyncio.run(main())
    composition.runtime.checkpoint_store.close()
    assert all(isinstance(o, asyncio.CancelledError) for o in outcomes), outcomes
    assert ca.ledger(ledger).count("end A-0") == 1  # the running call finished; B's never began
    assert _begun(ledger) == Counter({"A-0": 1})

    seen = _resume(db, ledger, [a, b], "--workers", "1")
    assert seen[a] == {"A-0": "ok"}  # its result was kept: it is not interrupted, nor run again
    assert seen[b] == {"B-0": "ok"}
    assert _begun(ledger) == Counter({"A-0": 1, "B-0": 1})


def test_cancelling_arun_mid_batch_keeps_the_finished_calls_and_runs_the_waiting_ones_on_resume(
    db: str, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    (c,) = _create(db, ledger, "C", calls=4)
    composition = ca.charge_composition(db, str(ledger), parallel=2, sleep=0.5)

    async def main() -> list[Any]:
        session = await composition.arestore(c)
        tasks = [asyncio.create_task(session.arun())]
        return list(await _cancel_when(tasks, lambda: _begun(ledger) == Counter({"C-0": 1, "C-1": 1})))

    outcomes = asyncio.run(main())
    composition.runtime.checkpoint_store.close()
    assert all(isinstance(o, asyncio.CancelledError) for o in outcomes), outcomes
    assert _begun(ledger) == Counter({"C-0": 1, "C-1": 1})
    assert "end C-0" in ca.ledger(ledger) and "end C-1" in ca.ledger(ledger)

    seen = _resume(db, ledger, [c], "--parallel", "2")
    assert seen[c] == {"C-0": "ok", "C-1": "ok", "C-2": "ok", "C-3": "ok"}
    assert _begun(ledger) == Counter({"C-0": 1, "C-1": 1, "C-2": 1, "C-3": 1})


def test_cancelling_arun_during_an_async_tool_reports_it_interrupted_and_runs_nothing_twice(
    db: str, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    (a,) = _create(db, ledger, "A")
    composition = ca.charge_composition(db, str(ledger), sleep=5.0, async_tool=True)

    async def main() -> list[Any]:
        session = await composition.arestore(a)
        tasks = [asyncio.create_task(session.arun())]
        return list(await _cancel_when(tasks, lambda: "begin A-0" in ca.ledger(ledger)))

    outcomes = asyncio.run(main())
    composition.runtime.checkpoint_store.close()
    assert all(isinstance(o, asyncio.CancelledError) for o in outcomes), outcomes
    assert "end A-0" not in ca.ledger(ledger)  # an awaited tool is cancelled with its run

    seen = _resume(db, ledger, [a], "--async-tool")
    assert seen[a] == {"A-0": "interrupted"}  # it began: not run again
    assert _begun(ledger) == Counter({"A-0": 1})
