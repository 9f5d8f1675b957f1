"""Replay, the response cache and compare on PostgreSQL: the same behaviour as on SQLite."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from replay_agents import Prompted, Reworded

from pg_server import drop_schema, fresh_schema
from qitos.eval import Dataset, Sample, compare, evaluate, open_eval_store, scorers
from qitos.models import FunctionModel


@pytest.fixture
def pg_target(pg_dsn: str) -> Iterator[str]:
    schema = fresh_schema()
    yield f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}schema={schema}"
    drop_schema(pg_dsn, schema)


def _model(calls: list[int]) -> FunctionModel:
    def reply(messages: list[dict[str, Any]]) -> str:
        calls.append(1)
        task = next(m["content"] for m in messages if m["role"] == "user")
        return next(w for w in ("alpha", "beta", "gamma") if w in task).upper()

    return FunctionModel(reply, takes="messages")


def test_replay_cache_and_compare_on_postgres(pg_target: str) -> None:
    data = Dataset([Sample(w, w.upper(), id=w) for w in ("alpha", "beta", "gamma")], name="pg-words")
    calls: list[int] = []
    common: dict[str, Any] = {"scorers": [scorers.exact()], "store": pg_target}
    live = evaluate(Prompted, data, model=_model(calls), name="live", cache=True, **common)
    assert len(calls) == 3 and live.metrics["exact"]["mean"] == 1.0
    marked = evaluate(Reworded, data, name="marked", replay="live", on_divergence="mark", **common)
    assert len(calls) == 3
    assert [s.divergence["step"] for s in marked.samples if s.divergence] == [0, 0, 0]
    cached = evaluate(Prompted, data, model=_model(calls), name="cached", cache=True, **common)
    assert len(calls) == 3 and cached.metrics["exact"]["mean"] == 1.0
    result = compare("live", "marked", store=pg_target)
    assert result.scorers["exact"]["difference"] == 0.0 and result.scorers["exact"]["mcnemar"]["p_value"] == 1.0
    _, eval_store = open_eval_store(pg_target)
    try:
        assert eval_store.exists()
        assert len(eval_store.divergences(marked.eval_id)) == 3
        assert eval_store.clear_cache() == 3
    finally:
        eval_store.close()
