"""evaluate() on PostgreSQL: the eval tables in the sessions' schema, resume, damage detection."""

from __future__ import annotations

from typing import Any

import pytest
from eval_agents import RUNS_FILE, Upper

from pg_server import drop_schema, fresh_schema
from qitos.core._errors import IntegrityError
from qitos.eval import Dataset, EvalChangedError, Sample, evaluate, open_eval_store, scorers


@pytest.fixture
def pg_target(pg_dsn: str) -> Any:
    schema = fresh_schema()
    yield f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}schema={schema}", schema
    drop_schema(pg_dsn, schema)


def _data(n: int) -> Dataset:
    return Dataset([Sample(f"task {i}", f"TASK {i}", id=f"s{i}", metadata={"odd": i % 2}) for i in range(n)], name="pg")


def test_an_eval_on_postgres_keeps_results_beside_the_sessions_and_resumes(
    pg_target: Any, pg_dsn: str, tmp_path: Any, monkeypatch: Any
) -> None:
    target, schema = pg_target
    runs = tmp_path / "runs.txt"
    monkeypatch.setenv(RUNS_FILE, str(runs))
    report = evaluate(Upper, _data(6), scorers=[scorers.exact(), scorers.includes()], store=target, name="pg", epochs=2)
    assert report.status == "complete" and len(report.samples) == 12 and report.metrics["exact"]["mean"] == 1.0
    import psycopg

    with psycopg.connect(pg_dsn) as conn:
        tables = {
            row[0]
            for row in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", [schema]
            )
        }
        assert {"qitos_evals", "qitos_eval_results", "qitos_eval_scores", "sessions"} <= tables
        answers = conn.execute(
            f"SELECT data::jsonb ->> 'answer' FROM \"{schema}\".qitos_eval_results ORDER BY sample_id, epoch"
        ).fetchall()
        assert answers[0][0] == "TASK 0"
    again = evaluate(Upper, _data(6), scorers=[scorers.exact(), scorers.includes()], store=target, name="pg", epochs=2)
    assert again.to_dict() == report.to_dict() and len(runs.read_text().splitlines()) == 12
    with pytest.raises(EvalChangedError, match="dataset"):
        evaluate(Upper, _data(5), scorers=[scorers.exact(), scorers.includes()], store=target, name="pg", epochs=2)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f"UPDATE \"{schema}\".qitos_eval_scores SET data = replace(data, 'true', 'false') "
            "WHERE sample_id = 's3' AND epoch = 2 AND scorer_id = 'exact'"
        )
    _, eval_store = open_eval_store(target)
    with pytest.raises(IntegrityError, match=rf"qitos_eval_scores row {report.eval_id}/s3/2/exact"):
        eval_store.scores(report.eval_id)
    eval_store.close()
