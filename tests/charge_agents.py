"""A paying agent for the exactly-once tests at the edges: queued calls, cancellation, crashes.

Importable as ``charge_agents`` (the tests put ``tests`` on ``PYTHONPATH``), so a session created
in one process is restored in another (the snapshot names ``charge_agents:ChargeState``).

A ``ChargeAgent`` session's task is a name (``A``, ``B``...). Its first step charges that name
``calls`` times in one decision (call ids ``<task>-0``, ``<task>-1``...), through ``charge``: a sync
tool that is **not idempotent** (a second run would charge twice) and is ``concurrency_safe`` (the
calls of one decision may run together, ``max_parallel_tools`` at a time). The second step answers.
``async_tool=True`` uses ``acharge``, the same tool as an ``async def``.

Every call writes ``begin <call> <pid>`` before its work and ``end <call> <pid>`` after it to the
ledger file, so a call that ran twice, or never, is visible afterwards. ``hold=<call id>`` makes that
call hang after its ``begin`` line (the first time it runs), having written ``<ledger>.held-<call>``
(``hold`` may name several calls, comma-separated): a test waits for it, then kills the process.
``decide`` writes ``decide <task>`` to the ledger; ``after_begin(call)``, if given, runs after a call's
``begin`` line.

``python -m charge_agents create|run ...`` (see :func:`main`) creates sessions or runs them all at
once with ``Session.arun`` in one process; each prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qitos.checkpoint._targets import open_store
from qitos.checkpoint.store import CheckpointStore
from qitos.core._agent_module import AgentModule
from qitos.core._decision import Action, Decision, Observation
from qitos.core._state import StateSchema
from qitos.core._tool import ToolRegistry, tool
from qitos.engine._composition import Composition, compose

__all__ = ["ChargeAgent", "ChargeState", "charge_composition", "ledger", "main", "observed"]


@dataclass
class ChargeState(StateSchema):
    """What the agent saw: one record per tool result."""

    calls: int = 1
    observed: list[dict[str, Any]] = field(default_factory=list)


def _write(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def ledger(path: str | Path) -> list[str]:
    """The ledger's lines without the pid: ``begin A-0``, ``end A-0``, ``decide A``..."""
    file = Path(path)
    if not file.exists():
        return []
    return [" ".join(line.split(" ")[:2]) for line in file.read_text(encoding="utf-8").splitlines()]


class ChargeTools:
    """The charging tools (see the module docstring)."""

    def __init__(
        self,
        ledger_path: str,
        *,
        hold: str | None = None,
        sleep: float = 0.0,
        after_begin: Callable[[str], None] | None = None,
    ) -> None:
        self.ledger = ledger_path
        self.hold = set(hold.split(",")) if hold else set()
        self.sleep = sleep
        self.after_begin = after_begin

    def _work(self, call: str) -> None:
        _write(self.ledger, f"begin {call} {os.getpid()}")
        if self.after_begin is not None:
            self.after_begin(call)
        marker = f"{self.ledger}.held-{call}"
        if call in self.hold and not os.path.exists(marker):
            Path(marker).write_text(str(os.getpid()), encoding="utf-8")
            time.sleep(600)  # the test kills the process here

    @tool(concurrency_safe=True)
    def charge(self, call: str, amount: int) -> str:
        """Charge an amount (not idempotent: a second run charges twice).

        Args:
            call: the call id (for the ledger).
            amount: how much.
        """
        self._work(call)
        if self.sleep:
            time.sleep(self.sleep)
        _write(self.ledger, f"end {call} {os.getpid()}")
        return f"charged {amount} for {call}"

    @tool(concurrency_safe=True)
    async def acharge(self, call: str, amount: int) -> str:
        """``charge`` as an ``async def`` tool.

        Args:
            call: the call id (for the ledger).
            amount: how much.
        """
        _write(self.ledger, f"begin {call} {os.getpid()}")
        if self.sleep:
            await asyncio.sleep(self.sleep)
        _write(self.ledger, f"end {call} {os.getpid()}")
        return f"charged {amount} for {call}"


class ChargeAgent(AgentModule[ChargeState, Observation, Action]):
    """Charge the task's name ``calls`` times in one decision, then answer."""

    def __init__(
        self,
        ledger_path: str,
        *,
        hold: str | None = None,
        sleep: float = 0.0,
        async_tool: bool = False,
        after_begin: Callable[[str], None] | None = None,
    ):
        registry = ToolRegistry()
        registry.include(ChargeTools(ledger_path, hold=hold, sleep=sleep, after_begin=after_begin))
        super().__init__(tool_registry=registry)
        self.ledger = ledger_path
        self.tool_name = "acharge" if async_tool else "charge"

    def init_state(self, task: str, **kwargs: Any) -> ChargeState:
        return ChargeState(task=task, calls=int(kwargs.get("calls", 1)), max_steps=5)

    def decide(self, state: ChargeState, observation: Observation) -> Decision[Action] | None:
        if state.observed:
            return Decision.final(f"{len(state.observed)} results")
        _write(self.ledger, f"decide {state.task} {os.getpid()}")
        calls = [f"{state.task}-{i}" for i in range(state.calls)]
        return Decision.act([Action(self.tool_name, {"call": call, "amount": 100}, call) for call in calls])

    def reduce(self, state: ChargeState, observation: Observation, decision: Decision[Action]) -> ChargeState:
        for result in observation.results:
            state.observed.append({"call": result.call_id, "ok": result.ok, "error_kind": result.error_kind})
        return state


def observed(summary: dict[str, Any]) -> dict[str, str]:
    """Per call id of a run's summary: ``ok`` or its error kind."""
    return {o["call"]: "ok" if o["ok"] else str(o["error_kind"]) for o in summary["observed"]}


def charge_composition(
    db: str | CheckpointStore,
    ledger_path: str,
    *,
    workers: int | None = None,
    parallel: int = 1,
    hold: str | None = None,
    sleep: float = 0.0,
    async_tool: bool = False,
    lease_ttl: float = 30.0,
    after_begin: Callable[[str], None] | None = None,
) -> Composition:
    """A composition of ``ChargeAgent`` over the store ``db`` (or the one it names: a SQLite file or a DSN)."""
    return compose(
        agent=lambda: ChargeAgent(ledger_path, hold=hold, sleep=sleep, async_tool=async_tool, after_begin=after_begin),
        store=open_store(db) if isinstance(db, str) else db,
        tool_workers=workers,
        max_parallel_tools=parallel,
        lease_ttl=lease_ttl,
    )


def _summary(result: Any) -> dict[str, Any]:
    state = result.state
    return {"stop_reason": state.stop_reason, "observed": list(state.observed)}


async def _run_all(composition: Composition, ids: list[str], first_holds: str | None = None) -> dict[str, Any]:
    sessions = [await composition.arestore(sid) for sid in ids]
    runs = [asyncio.ensure_future(sessions[0].arun())]
    if first_holds:  # the others start once the first session's held call has begun
        while not os.path.exists(first_holds):
            await asyncio.sleep(0.005)
    runs.extend(asyncio.ensure_future(session.arun()) for session in sessions[1:])
    results = await asyncio.gather(*runs)
    return {sid: _summary(result) for sid, result in zip(ids, results, strict=True)}


def main(argv: list[str]) -> int:
    """``create --db DB --ledger L --task A [--calls N]`` prints ``{"session_id": ...}``;
    ``run --db DB --ledger L --ids ID,ID [--workers N] [--parallel N] [--hold CALL] [--sleep S]
    [--async-tool] [--sync]`` runs those sessions at once with ``Session.arun`` (one after another
    with ``Session.run`` given ``--sync``) and prints their summaries. With ``--hold``, the sessions
    after the first start once the first held call has begun."""
    parser = argparse.ArgumentParser(prog="charge_agents")
    parser.add_argument("command", choices=("create", "run"))
    parser.add_argument("--db", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--task", default="A")
    parser.add_argument("--calls", type=int, default=1)
    parser.add_argument("--ids", default="")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--hold", default=None)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--async-tool", action="store_true")
    parser.add_argument("--sync", action="store_true", help="run the sessions one after another with Session.run")
    args = parser.parse_args(argv)
    composition = charge_composition(
        args.db,
        args.ledger,
        workers=args.workers,
        parallel=args.parallel,
        hold=args.hold,
        sleep=args.sleep,
        async_tool=args.async_tool,
    )
    if args.command == "create":
        session = composition.session(args.task, calls=args.calls)
        print(json.dumps({"session_id": session.session_id.value}))
    elif args.sync:
        ids = args.ids.split(",")
        print(json.dumps({sid: _summary(composition.restore(sid).run()) for sid in ids}))
    else:
        first_holds = f"{args.ledger}.held-{args.hold.split(',')[0]}" if args.hold else None
        print(json.dumps(asyncio.run(_run_all(composition, args.ids.split(","), first_holds))))
    composition.runtime.checkpoint_store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
