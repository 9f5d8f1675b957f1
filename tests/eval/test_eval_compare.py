"""compare(): paired statistics of two evals, checked by hand and against scipy.stats."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from eval_agents import Upper
from scipy import stats

from qitos.eval import CompareError, Dataset, Sample, compare, evaluate, scorers
from qitos.eval._result import SampleResult
from qitos.eval._stats import mcnemar_exact, pass_at_k

WORDS = [f"w{i}" for i in range(10)]
A_PASSES = {0, 1, 2, 3, 4, 5}
B_PASSES = {2, 3, 4, 5, 6, 7, 8, 9}


def _data(words: list[str] = WORDS, *, name: str = "ten") -> Dataset:
    return Dataset([Sample(w, w.upper(), id=w) for w in words], name=name)


def _passing(passes: set[int]) -> Any:
    def ok(sample: Sample, result: SampleResult) -> bool:
        return int(sample.sample_id[1:]) in passes

    return scorers.code(ok, name="ok")


def _pair(db: Path) -> tuple[Any, Any]:
    a = evaluate(Upper, _data(), scorers=[_passing(A_PASSES)], store=str(db), name="a")
    b = evaluate(Upper, _data(), scorers=[_passing(B_PASSES)], store=str(db), name="b")
    return a, b


def test_mcnemar_and_pass_at_k_by_hand_and_against_scipy() -> None:
    # n = 6 discordant pairs, 2 of one kind: 2 * (C(6,0) + C(6,1) + C(6,2)) / 2^6 = 2 * 22 / 64
    assert mcnemar_exact(2, 4) == pytest.approx(0.6875)
    assert mcnemar_exact(4, 2) == mcnemar_exact(2, 4)
    assert mcnemar_exact(0, 0) == 1.0 and mcnemar_exact(3, 3) == 1.0
    for a_only, b_only in [(2, 4), (0, 7), (1, 9), (12, 3), (20, 21), (0, 1)]:
        expected = stats.binomtest(min(a_only, b_only), a_only + b_only, 0.5).pvalue
        assert mcnemar_exact(a_only, b_only) == pytest.approx(expected, rel=1e-12)
    # pass@k = 1 - C(n-c, k) / C(n, k): n = 5, c = 2, k = 2 -> 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # pass@1 is the share that passed
    assert pass_at_k(5, 4, 2) == 1.0 and pass_at_k(3, 0, 3) == 0.0
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


def test_paired_difference_mcnemar_and_flips_match_the_hand_computed_values(tmp_path: Path) -> None:
    a, b = _pair(tmp_path / "evals.db")
    result = compare(a, b)
    ok = result.scorers["ok"]
    assert result.same_dataset and list(result.paired) == WORDS and not result.only_a and not result.only_b
    assert ok["n"] == 10 and ok["mean_a"] == pytest.approx(0.6) and ok["mean_b"] == pytest.approx(0.8)
    assert ok["difference"] == pytest.approx(0.2)
    differences = [(i in B_PASSES) - (i in A_PASSES) for i in range(10)]
    # by hand: differences -1 -1 0 0 0 0 1 1 1 1; variance 5.6 / 9; stderr sqrt(5.6 / 90)
    assert ok["stderr"] == pytest.approx((5.6 / 90) ** 0.5)
    assert ok["stderr"] == pytest.approx(stats.sem(differences))
    assert ok["binary"] and ok["mcnemar"] == {"a_only": 2, "b_only": 4, "p_value": pytest.approx(0.6875)}
    assert ok["mcnemar"]["p_value"] == pytest.approx(stats.binomtest(2, 6, 0.5).pvalue)
    low, high = ok["ci95"]
    boot = stats.bootstrap(
        (differences,), lambda d, axis: d.mean(axis=axis), method="percentile", n_resamples=5000, random_state=1
    ).confidence_interval
    assert low < 0.2 < high
    assert low == pytest.approx(boot.low, abs=0.11) and high == pytest.approx(boot.high, abs=0.11)
    assert [f["id"] for f in ok["flips"]["pass_to_fail"]] == ["w0", "w1"]
    assert [f["id"] for f in ok["flips"]["fail_to_pass"]] == ["w6", "w7", "w8", "w9"]
    sessions_a = {s.id: s.session_id for s in a.samples}
    sessions_b = {s.id: s.session_id for s in b.samples}
    flip = ok["flips"]["pass_to_fail"][0]
    assert flip["a_sessions"] == [sessions_a["w0"]] and flip["b_sessions"] == [sessions_b["w0"]]
    assert ok["unstable"] == {"a": [], "b": []} and ok["unscored"] == []
    data = result.to_dict()
    assert data["scorers"]["ok"]["ci95"] == [low, high] and data["a"]["name"] == "a"


def test_evals_are_read_from_the_store_by_name_or_id_with_the_same_result(tmp_path: Path) -> None:
    db = tmp_path / "evals.db"
    a, b = _pair(db)
    assert compare("a", b.eval_id, store=str(db)).to_dict() == compare(a, b).to_dict()
    with pytest.raises(CompareError, match="no eval 'c' in the store"):
        compare("a", "c", store=str(db))
    with pytest.raises(CompareError, match="pass store="):
        compare("a", "b")


def test_different_datasets_are_refused_unless_allowed_then_only_shared_samples_pair(tmp_path: Path) -> None:
    db = tmp_path / "evals.db"
    a = evaluate(Upper, _data(WORDS[:6]), scorers=[_passing(A_PASSES)], store=str(db), name="a")
    b = evaluate(Upper, _data(WORDS[3:]), scorers=[_passing(B_PASSES)], store=str(db), name="b")
    with pytest.raises(CompareError, match=r"different datasets .* allow_different_datasets=True"):
        compare(a, b)
    result = compare(a, b, allow_different_datasets=True)
    assert not result.same_dataset
    assert list(result.paired) == ["w3", "w4", "w5"]
    assert list(result.only_a) == ["w0", "w1", "w2"] and list(result.only_b) == ["w6", "w7", "w8", "w9"]
    assert result.scorers["ok"]["n"] == 3 and result.scorers["ok"]["difference"] == 0.0
    assert result.scorers["ok"]["mcnemar"] == {"a_only": 0, "b_only": 0, "p_value": 1.0}


def test_samples_whose_epochs_disagree_are_unstable(tmp_path: Path) -> None:
    def flaky(sample: Sample, result: SampleResult) -> bool:
        return sample.sample_id != "w1" or result.epoch == 1

    db = tmp_path / "evals.db"
    a = evaluate(Upper, _data(WORDS[:3]), scorers=[scorers.code(flaky, name="ok")], store=str(db), name="a", epochs=2)
    b = evaluate(
        Upper,
        _data(WORDS[:3]),
        scorers=[scorers.code(flaky, name="ok", reducer="max")],
        store=str(db),
        name="b",
        epochs=2,
    )
    ok = compare(a, b).scorers["ok"]
    assert ok["unstable"] == {"a": ["w1"], "b": ["w1"]}
    # mean over epochs makes w1 0.5 in a (not binary); max (pass@2) makes it 1 in b
    assert not ok["binary"] and ok["mcnemar"] is None and ok["flips"] == {"pass_to_fail": [], "fail_to_pass": []}
    assert ok["mean_a"] == pytest.approx(2.5 / 3) and ok["mean_b"] == 1.0
    assert ok["reducers"] == {"a": "mean", "b": "max"}


def test_token_and_wall_time_differences(tmp_path: Path) -> None:
    from replay_agents import Prompted

    from qitos.models import FunctionModel

    def answer(tokens: int) -> Any:
        def reply(messages: list[dict[str, Any]]) -> Any:
            return {"text": "done", "usage": {"input_tokens": tokens, "output_tokens": 1}}

        return FunctionModel(reply, takes="messages")

    db = tmp_path / "evals.db"
    data = _data(WORDS[:4])
    a = evaluate(Prompted, data, scorers=[scorers.includes()], model=answer(10), store=str(db), name="a")
    b = evaluate(Prompted, data, scorers=[scorers.includes()], model=answer(30), store=str(db), name="b")
    result = compare(a, b)
    assert result.tokens["a"] == 44 and result.tokens["b"] == 124
    assert result.tokens["difference"] == 80 and result.tokens["per_sample"] == 20.0
    assert result.tokens["per_sample_ci95"] == (20.0, 20.0)
    assert result.wall_seconds["difference"] == pytest.approx(b.wall_seconds - a.wall_seconds)


def test_a_sample_that_failed_in_one_eval_is_listed_as_unscored(tmp_path: Path) -> None:
    db = tmp_path / "evals.db"
    words = ["w0", "boom1", "w2"]
    data = Dataset([Sample(w, w.upper(), id=w) for w in words], name="three")
    a = evaluate(Upper, data, scorers=[scorers.exact()], store=str(db), name="a")
    b = evaluate(Upper, data, scorers=[scorers.exact()], store=str(db), name="b")
    ok = compare(a, b).scorers["exact"]
    assert ok["n"] == 2 and ok["unscored"] == ["boom1"]
