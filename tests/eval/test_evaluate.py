"""evaluate(): samples as durable sessions, results and scores in the store, resume, errors."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from chat_server import ScriptServer
from eval_agents import RUNS_FILE, Asker, Upper

from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.core._errors import IntegrityError
from qitos.eval import (
    Dataset,
    EvalChangedError,
    Sample,
    Score,
    ScorerError,
    aevaluate,
    evaluate,
    open_eval_store,
    scorers,
)
from qitos.eval._runner import EVAL_METADATA, session_id_for
from qitos.models import OpenAICompatibleModel, ScriptedModel


def _data(*tasks: str, name: str = "words") -> Dataset:
    return Dataset([Sample(t, t.upper(), id=f"s{i}") for i, t in enumerate(tasks)], name=name)


def _runs(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_first_eval_scores_every_sample_and_keeps_sessions_in_the_store(tmp_path: Path) -> None:
    db = tmp_path / "evals.db"
    report = evaluate(Upper, _data("alpha", "beta", "gamma"), scorers=[scorers.exact()], store=str(db), name="first")
    assert report.status == "complete" and report.name == "first"
    assert report.metrics["exact"]["mean"] == 1.0 and report.metrics["exact"]["n"] == 3
    assert [(s.id, s.epoch, s.answer, s.steps) for s in report.samples] == [
        ("s0", 1, "ALPHA", 1),
        ("s1", 1, "BETA", 1),
        ("s2", 1, "GAMMA", 1),
    ]
    store = SqliteCheckpointStore(str(db))
    for sample in report.samples:
        assert sample.session_id == session_id_for(report.eval_id, sample.id, 1)
        head = store.get_session_head(sample.session_id)
        assert head is not None and head.lifecycle == "completed"
        assert head.metadata[EVAL_METADATA] == {
            "eval_id": report.eval_id,
            "name": "first",
            "sample_id": sample.id,
            "epoch": 1,
            "attempt": 0,
        }
    data = report.to_dict()
    assert json.loads(json.dumps(data)) == data and data["metrics"]["exact"]["ci95"] == [1.0, 1.0]


def test_running_the_same_eval_again_reads_finished_samples_and_runs_none(tmp_path: Path, monkeypatch: Any) -> None:
    runs = tmp_path / "runs.txt"
    monkeypatch.setenv(RUNS_FILE, str(runs))
    db = str(tmp_path / "evals.db")
    data = _data("one", "two")
    first = evaluate(Upper, data, scorers=[scorers.exact()], store=db, name="again")
    assert len(_runs(runs)) == 2
    second = evaluate(Upper, data, scorers=[scorers.exact()], store=db, name="again")
    assert len(_runs(runs)) == 2  # nothing ran again
    assert second.to_dict() == first.to_dict()


def test_resuming_with_anything_pinned_changed_is_refused_naming_it(tmp_path: Path) -> None:
    db = str(tmp_path / "evals.db")
    data = _data("one", "two")
    evaluate(Upper, data, scorers=[scorers.exact()], store=db, name="pinned")
    with pytest.raises(EvalChangedError, match=r"dataset \(digest .* with 2 samples -> .* with 3 samples\)"):
        evaluate(Upper, _data("one", "two", "three"), scorers=[scorers.exact()], store=db, name="pinned")
    with pytest.raises(EvalChangedError, match=r"scorers \(exact@1/mean -> includes@1/mean\)"):
        evaluate(Upper, data, scorers=[scorers.includes()], store=db, name="pinned")
    with pytest.raises(EvalChangedError, match=r"epochs \(1 -> 2\)"):
        evaluate(Upper, data, scorers=[scorers.exact()], store=db, name="pinned", epochs=2)
    with pytest.raises(EvalChangedError, match=r"agent \(.*Upper.* -> .*Asker"):
        evaluate(Asker, data, scorers=[scorers.exact()], store=db, name="pinned", model=ScriptedModel(["x"]))
    with pytest.raises(EvalChangedError, match=r"limit \(null -> 1\)"):
        evaluate(Upper, data, scorers=[scorers.exact()], store=db, name="pinned", limit=1)
    report = evaluate(Upper, data, scorers=[scorers.exact()], store=db, name="pinned")  # nothing was lost
    assert report.status == "complete" and len(report.samples) == 2


def test_an_agent_that_raises_fails_its_sample_only_and_is_never_scored_zero(tmp_path: Path) -> None:
    report = evaluate(
        Upper, _data("ok", "boom now", "fine"), scorers=[scorers.exact()], store=str(tmp_path / "e.db"), name="raise"
    )
    assert report.status == "complete" and report.failed == 1 and report.completed == 2
    broken = next(s for s in report.samples if s.id == "s1")
    assert "the agent broke on 'boom now'" in (broken.error or "") and broken.scores == {}
    assert report.metrics["exact"]["n"] == 2 and report.metrics["exact"]["mean"] == 1.0


def test_fail_on_error_as_a_count_and_as_a_share(tmp_path: Path) -> None:
    tasks = ["boom a", "boom b", "boom c", "boom d", "ok e", "ok f"]
    counted = evaluate(
        Upper,
        _data(*tasks),
        scorers=[scorers.exact()],
        store=str(tmp_path / "a.db"),
        name="n",
        max_samples=1,
        fail_on_error=2,
    )
    assert counted.status == "failed" and counted.failed == 2 and len(counted.samples) == 2
    shared = evaluate(
        Upper,
        _data(*tasks),
        scorers=[scorers.exact()],
        store=str(tmp_path / "b.db"),
        name="f",
        max_samples=1,
        fail_on_error=0.5,
    )
    assert shared.status == "failed" and shared.failed == 3  # 3 of 6 samples is the half
    tolerant = evaluate(
        Upper, _data(*tasks), scorers=[scorers.exact()], store=str(tmp_path / "c.db"), name="t", fail_on_error=0.9
    )
    assert tolerant.status == "complete" and tolerant.failed == 4
    for bad in (0, -1, 1.0, 0.0, True, "2"):
        with pytest.raises(Exception, match="fail_on_error"):
            evaluate(Upper, _data("x"), scorers=[scorers.exact()], store=str(tmp_path / "d.db"), fail_on_error=bad)  # type: ignore[arg-type]


def test_a_sample_past_its_timeout_fails_and_the_others_finish(tmp_path: Path) -> None:
    report = evaluate(
        Upper,
        _data("hang on", "quick"),
        scorers=[scorers.exact()],
        store=str(tmp_path / "e.db"),
        name="slow",
        sample_timeout=0.5,
    )
    hung = next(s for s in report.samples if s.id == "s0")
    assert "timed out after 0.5 s" in (hung.error or "")
    assert next(s for s in report.samples if s.id == "s1").scores["exact"]["value"] is True


def test_retries_run_a_failed_sample_again_in_a_new_session_and_keep_each_attempt(tmp_path: Path) -> None:
    db = str(tmp_path / "e.db")
    report = evaluate(Upper, _data("boom x", "ok"), scorers=[scorers.exact()], store=db, name="retry", retries=2)
    broken = next(s for s in report.samples if s.id == "s0")
    assert broken.attempts == 3 and broken.retried and report.retried == 1
    _, eval_store = open_eval_store(db)
    attempts = [a for a in eval_store.attempts(report.eval_id) if a.sample_id == "s0"]
    assert [a.attempt for a in attempts] == [0, 1, 2]
    assert len({a.session_id for a in attempts}) == 3 and all("broke" in (a.error or "") for a in attempts)
    assert broken.session_id == attempts[-1].session_id


def test_epochs_reduce_per_scorer_mean_max_min_mode(tmp_path: Path) -> None:
    flips: dict[str, int] = {}

    def alternate(sample: Sample, result: Any) -> bool:
        flips[sample.id or ""] = flips.get(sample.id or "", 0) + 1
        return flips[sample.id or ""] % 3 != 0  # True, True, False per sample

    chosen = [
        scorers.code(alternate, name="mean"),
        scorers.code(alternate, name="max", reducer="max"),
        scorers.code(alternate, name="min", reducer="min"),
        scorers.code(alternate, name="mode", reducer="mode"),
    ]
    report = evaluate(
        Upper, _data("a", "b"), scorers=chosen, store=str(tmp_path / "e.db"), name="ep", epochs=3, max_samples=1
    )
    assert len(report.samples) == 6 and report.epochs == 3
    # each code scorer sees its own calls: per sample True, True, False over the three epochs
    metrics = report.metrics
    assert metrics["mean"]["mean"] == pytest.approx(2 / 3) and metrics["mean"]["n"] == 2
    assert metrics["max"]["mean"] == 1.0 and metrics["min"]["mean"] == 0.0 and metrics["mode"]["mean"] == 1.0


def test_a_scorer_that_raises_records_a_scoring_error_not_a_zero(tmp_path: Path) -> None:
    def picky(sample: Sample, result: Any) -> bool:
        if sample.id == "s1":
            raise ValueError("cannot judge this one")
        return True

    report = evaluate(
        Upper,
        _data("a", "b", "c"),
        scorers=[scorers.code(picky, name="picky")],
        store=str(tmp_path / "e.db"),
        name="raise",
    )
    entry = next(s for s in report.samples if s.id == "s1").scores["picky"]
    assert entry["value"] is None and entry["error"] == "ValueError: cannot judge this one"
    assert report.metrics["picky"] == {**report.metrics["picky"], "mean": 1.0, "n": 2, "errors": 1}


def test_a_target_a_scorer_cannot_read_fails_before_anything_runs(tmp_path: Path, monkeypatch: Any) -> None:
    runs = tmp_path / "runs.txt"
    monkeypatch.setenv(RUNS_FILE, str(runs))
    data = Dataset([Sample("a", "1", id="ok"), Sample("b", "lots", id="bad")])
    with pytest.raises(ScorerError, match=r"scorer 'numeric': sample 'bad' has target 'lots'; it needs a number"):
        evaluate(Upper, data, scorers=[scorers.numeric()], store=str(tmp_path / "e.db"))
    with pytest.raises(ScorerError, match=r"sample 'ok' has target '1'; it needs a choice letter"):
        evaluate(Upper, data, scorers=[scorers.choice()], store=str(tmp_path / "e.db"))
    with pytest.raises(ScorerError, match="it needs a string or number"):
        evaluate(Upper, Dataset([Sample("a")]), scorers=[scorers.exact()], store=str(tmp_path / "e.db"))
    assert _runs(runs) == [] and not (tmp_path / "e.db").exists()


_CRASH_AT: list[int] = []


def _crashing(sample: Sample, result: Any) -> bool:
    _CRASH_AT.append(1)
    if len(_CRASH_AT) == 2:
        raise KeyboardInterrupt  # the process stops in the middle of scoring
    return True


def test_a_crash_while_scoring_is_finished_by_scoring_only(tmp_path: Path, monkeypatch: Any) -> None:
    runs = tmp_path / "runs.txt"
    monkeypatch.setenv(RUNS_FILE, str(runs))
    db = str(tmp_path / "e.db")
    _CRASH_AT.clear()
    with pytest.raises(KeyboardInterrupt):
        evaluate(
            Upper,
            _data("a", "b", "c"),
            scorers=[scorers.code(_crashing, name="c")],
            store=db,
            name="crash",
            max_samples=1,
        )
    ran = len(_runs(runs))
    _, eval_store = open_eval_store(db)
    record = eval_store.find_eval("crash")
    assert record is not None and record.status == "incomplete"
    assert len(eval_store.results(record.eval_id)) == 2 and len(eval_store.scores(record.eval_id)) == 1
    report = evaluate(Upper, _data("a", "b", "c"), scorers=[scorers.code(_crashing, name="c")], store=db, name="crash")
    assert report.status == "complete" and report.metrics["c"]["n"] == 3
    assert len(_runs(runs)) == ran + 1  # only the sample that never ran; the scored-late one was not re-run
    with pytest.raises(EvalChangedError, match=r"scorers\[c\]\.spec\.fn \(.*_crashing.* -> .*<lambda>"):
        evaluate(
            Upper, _data("a", "b", "c"), scorers=[scorers.code(lambda s, r: True, name="c")], store=db, name="crash"
        )


def test_damaged_result_rows_raise_integrity_errors_naming_the_row(tmp_path: Path) -> None:
    db = tmp_path / "e.db"
    report = evaluate(Upper, _data("a", "b"), scorers=[scorers.exact()], store=str(db), name="damage")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE qitos_eval_results SET data = replace(data, '\"A\"', '\"Z\"') WHERE sample_id = 's0'")
    with pytest.raises(IntegrityError, match=rf"qitos_eval_results row {report.eval_id}/s0/1: content does not match"):
        evaluate(Upper, _data("a", "b"), scorers=[scorers.exact()], store=str(db), name="damage")


def test_model_path_tokens_tool_calls_and_connections(tmp_path: Path) -> None:
    expected = [
        {"name": "lookup", "arguments": {"word": ["w0", "w1", "w2", "w3"]}},
        {"name": "add", "arguments": {"a": 2, "b": 3}},
    ]
    data = Dataset([Sample(f"w{i} please", f"W{i} PLEASE", id=f"s{i}") for i in range(4)], name="calls")
    with ScriptServer(delay=0.2) as server:
        model = OpenAICompatibleModel("m", base_url=server.url, api_key="sk-test")
        report = evaluate(
            Asker,
            data,
            scorers=[scorers.exact(), scorers.tool_calls(expected)],
            model=model,
            store=str(tmp_path / "e.db"),
            name="model",
        )
        assert server.calls == 12 and server.max_open == 4
    assert report.metrics["exact"]["mean"] == 1.0 and report.metrics["tool_calls"]["mean"] == 1.0
    assert report.input_tokens == 4 * 30 and report.output_tokens == 4 * 15 and report.total_tokens == 4 * 45
    assert all(s.input_tokens == 30 and s.steps == 3 for s in report.samples)


def test_group_by_a_metadata_field(tmp_path: Path) -> None:
    data = Dataset(
        [
            Sample("a", "A", id="1", metadata={"level": "easy"}),
            Sample("b", "X", id="2", metadata={"level": "hard"}),
            Sample("c", "C", id="3", metadata={"level": "hard"}),
        ]
    )
    from qitos.eval._runner import EvalRun

    run = EvalRun(Upper, data, scorers=[scorers.exact()], store=str(tmp_path / "e.db"), name="g", group_by="level")
    report = asyncio.run(run.arun())
    assert report.groups["easy"]["exact"]["mean"] == 1.0 and report.groups["easy"]["exact"]["n"] == 1
    assert report.groups["hard"]["exact"]["mean"] == 0.5 and report.groups["hard"]["exact"]["n"] == 2


def test_a_thousand_samples_with_a_scripted_model(tmp_path: Path) -> None:
    def reply(view: Any) -> str:
        return str(view.messages()[-1]["content"].split()[-1])

    from qitos.models import FunctionModel

    data = Dataset([Sample(f"say {i}", str(i), id=str(i)) for i in range(1000)], name="thousand")

    async def main() -> Any:
        return await aevaluate(
            Asker,
            data,
            scorers=[scorers.exact(), scorers.numeric()],
            model=FunctionModel(reply),
            store=str(tmp_path / "e.db"),
            name="k",
            max_samples=200,
        )

    report = asyncio.run(main())
    assert report.status == "complete" and len(report.samples) == 1000
    assert report.metrics["exact"]["mean"] == 1.0 and report.metrics["numeric"]["n"] == 1000


def test_bad_arguments_are_refused_clearly(tmp_path: Path) -> None:
    db = str(tmp_path / "e.db")
    for kwargs, words in (
        ({"epochs": 0}, "epochs must be an int >= 1"),
        ({"max_samples": 0}, "max_samples must be an int >= 1"),
        ({"retries": -1}, "retries must be an int >= 0"),
        ({"limit": 0}, "limit must be an int >= 1"),
        ({"sample_timeout": 0}, "sample_timeout must be a positive number"),
        ({"scorers": []}, "needs at least one scorer"),
        ({"scorers": [scorers.exact(), scorers.exact()]}, "two scorers have the id 'exact'"),
        ({"scorers": ["exact"]}, "scorers are made by qitos.eval.scorers"),
    ):
        arguments: dict[str, Any] = {"scorers": [scorers.exact()], "store": db, **kwargs}
        with pytest.raises(Exception, match=words):
            evaluate(Upper, _data("a"), **arguments)


def test_scores_may_be_numbers_strings_and_scores(tmp_path: Path) -> None:
    report = evaluate(
        Upper,
        _data("a", "b"),
        scorers=[
            scorers.code(lambda s, r: 0.25, name="num"),
            scorers.code(lambda s, r: Score("C", explanation="fine"), name="grade"),
        ],
        store=str(tmp_path / "e.db"),
        name="kinds",
    )
    assert report.metrics["num"]["mean"] == 0.25 and report.metrics["grade"]["mean"] == 1.0


def test_a_sample_whose_run_lost_its_lease_goes_on_from_its_head(tmp_path: Path, monkeypatch: Any) -> None:
    from eval_agents import STALL_FILE, Staller

    marker = tmp_path / "stalled"
    monkeypatch.setenv(STALL_FILE, str(marker))
    report = evaluate(
        Staller,
        _data("stall here"),
        scorers=[scorers.exact()],
        store=str(tmp_path / "e.db"),
        name="lease",
        engine_kwargs={"lease_ttl": 0.5},
    )
    assert marker.exists()  # the run stalled 1.5 s with a 0.5 s lease: its next write was refused
    sample = report.samples[0]
    assert sample.error is None and sample.answer == "STALL HERE" and sample.steps == 3 and sample.attempts == 1
