"""evaluate(..., fleet=Fleet(...)): the samples run on DBOS workers, same results, resume, report."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from eval_agents import RUNS_FILE, Upper, fleet_composition

from pg_server import drop_schema, fresh_schema
from qitos.eval import Dataset, Sample, evaluate, scorers
from qitos.eval._runner import EVAL_METADATA

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "distributed"))
from fleet_procs import ROOT, workers  # noqa: E402

pytest.importorskip("dbos")


@pytest.fixture
def fleet_db(pg_dsn: str) -> Any:
    from qitos.distributed._naming import dbos_schema

    schema = fresh_schema()
    db = f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}schema={schema}"
    yield db
    drop_schema(pg_dsn, schema)
    drop_schema(pg_dsn, dbos_schema(db))


def test_samples_run_on_fleet_workers_with_the_same_results_and_resume(fleet_db: str, tmp_path: Path) -> None:
    from qitos.distributed import Fleet

    runs = tmp_path / "runs.txt"
    data = Dataset([Sample(f"task {i}" if i != 3 else "boom 3", f"TASK {i}", id=f"s{i}") for i in range(12)], name="f")
    env = {
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), str(HERE)]),
        RUNS_FILE: str(runs),
    }
    local = evaluate(Upper, data, scorers=[scorers.exact()], store=str(tmp_path / "local.db"), name="same", epochs=2)
    with workers(fleet_db, tmp_path / "side.log", 1, app="eval_agents:fleet_composition", extra_env=env):
        fleet = Fleet(fleet_composition, db=fleet_db)
        try:
            report = evaluate(Upper, data, scorers=[scorers.exact()], fleet=fleet, name="same", epochs=2, max_samples=5)
            head = fleet.store.get_session_head(report.samples[0].session_id)
            assert head is not None and head.metadata[EVAL_METADATA]["sample_id"] == "s0"
            assert head.metadata["fleet"] == {"queue": "qitos"}
            ran = len(runs.read_text().splitlines())
            again = evaluate(Upper, data, scorers=[scorers.exact()], fleet=fleet, name="same", epochs=2)
            assert len(runs.read_text().splitlines()) == ran  # read back, nothing ran again
            with pytest.raises(Exception, match="sample_timeout is not enforced on the fleet"):
                evaluate(Upper, data, scorers=[scorers.exact()], fleet=fleet, name="t", sample_timeout=5)
            with pytest.raises(Exception, match="keeps its results in the fleet's database"):
                evaluate(Upper, data, scorers=[scorers.exact()], fleet=fleet, store=str(tmp_path / "x.db"))
        finally:
            fleet.close()
    assert report.status == "complete" and again.to_dict() == report.to_dict()
    assert ran == 2 * 12  # one decision per sample and epoch (the broken one raises in its first)
    # A worker's run keeps its stop reason in the session, not the exception's text: the error
    # reads "the run failed (unrecoverable_error)" there.
    strip = ("session_id", "wall_seconds", "error")
    assert [{k: v for k, v in s.__dict__.items() if k not in strip} for s in report.samples] == [
        {k: v for k, v in s.__dict__.items() if k not in strip} for s in local.samples
    ]
    assert [s.error is None for s in report.samples] == [s.error is None for s in local.samples]
    assert report.metrics == local.metrics and report.failed == 2
