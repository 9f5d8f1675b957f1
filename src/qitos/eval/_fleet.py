"""Running an eval's samples on the fleet: sessions submitted to DBOS workers, outcomes read back.

The runner creates each sample x epoch's session in the fleet's database (the same derived id and
metadata as a local run, plus the fleet's mark) and enqueues its first run with
:meth:`qitos.distributed.Fleet.submit_many`; workers run it. This process polls the heads of the
sessions it submitted, at most ``max_samples`` in flight, and when one settles records its attempt
from the stored session and scores it, exactly as a local run would. An eval resumed on the fleet
reads finished sessions, and re-enqueues the unfinished ones under their first run's workflow id
(DBOS starts one run per id; a worker that died is replaced by the workers' supervisor).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping
from typing import Any

from qitos.distributed._fleet import SETTLED, Fleet
from qitos.eval._runner import EVAL_METADATA, EvalRun, Unit, session_id_for
from qitos.eval._store import AttemptRecord

__all__ = ["run_on_fleet"]

_POLL = 0.1  # seconds between looks at the heads of the sessions in flight


async def run_on_fleet(
    run: EvalRun, pending: deque[Unit], attempts: Mapping[tuple[str, int], list[AttemptRecord]]
) -> None:
    """Run ``pending`` on ``run.fleet``'s workers until each has its result (or the eval stops)."""
    fleet: Fleet = run.fleet
    store = run.checkpoint_store
    in_flight: dict[str, tuple[Unit, int, list[AttemptRecord]]] = {}
    retry: deque[tuple[Unit, list[AttemptRecord]]] = deque()
    progress = run.progress
    while (pending or retry or in_flight) and run._stop is None:
        new: list[tuple[str, Unit, int]] = []
        while (retry or pending) and len(in_flight) < run.max_samples:
            unit, prior = retry.popleft() if retry else (pending[0], list(attempts.get(pending.popleft().key, ())))
            attempt_no = len(prior)
            sid = session_id_for(run.eval_id, unit.sample.sample_id, unit.epoch, attempt_no)
            in_flight[sid] = (unit, attempt_no, prior)
            head = await store.aget_session_head(sid)
            if head is None:
                new.append((sid, unit, attempt_no))
            elif not await run.finished(sid, head):
                await asyncio.to_thread(fleet.resume, sid)  # the same workflow id: started once
        if new:
            await asyncio.to_thread(
                fleet.submit_many,
                [unit.sample.task for _, unit, _ in new],
                session_ids=[sid for sid, _, _ in new],
                metadata=[_metadata(run, unit, attempt_no) for _, unit, attempt_no in new],
            )
        progress.running = len(in_flight)
        settled = await asyncio.to_thread(store.get_session_positions, list(in_flight), lifecycles=SETTLED)
        for sid in [s for s in in_flight if s in settled]:
            head = await store.aget_session_head(sid)
            if head is None or not await run.finished(sid, head):
                continue
            unit, attempt_no, prior = in_flight.pop(sid)
            outcome = await run.from_head(unit, attempt_no, sid, head, None)
            result = await run.record(prior, outcome)
            if result is None:
                retry.append((unit, prior))
                continue
            progress.running = len(in_flight)
            await run.finish(unit, result)
        if not settled:
            await asyncio.sleep(_POLL)
    progress.running = 0


def _metadata(run: EvalRun, unit: Unit, attempt_no: int) -> dict[str, Any]:
    return {
        EVAL_METADATA: {
            "eval_id": run.eval_id,
            "name": run.name,
            "sample_id": unit.sample.sample_id,
            "epoch": unit.epoch,
            "attempt": attempt_no,
        }
    }
