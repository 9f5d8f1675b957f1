"""Every scorer on its own: what it accepts, how it scores, how it fails."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from qitos.eval import Sample, SampleResult, Score, ScorerError, ScoringError, scorers
from qitos.eval.scorers import Scorer
from qitos.models import FunctionModel, ScriptedModel


def _score(
    scorer: Scorer, target: Any, answer: Any, *, calls: list[dict[str, Any]] | None = None, task: str = "q"
) -> Score:
    sample = Sample(task, target, id="x")
    scorer.check_target(sample)
    result = SampleResult(sample_id="x", epoch=1, session_id="s", answer=answer, tool_calls=tuple(calls or ()))
    return asyncio.run(scorer.ascore(sample, result))


def test_exact_and_includes_with_lists_of_targets() -> None:
    assert _score(scorers.exact(), "Paris", " Paris ").value is True
    assert _score(scorers.exact(), "Paris", "paris").value is False
    assert _score(scorers.exact(ignore_case=True), "Paris", "paris").value is True
    assert _score(scorers.exact(), ["4", "four"], "four").value is True
    assert _score(scorers.exact(), 4, "4").value is True
    assert _score(scorers.exact(), "x", None).value is False
    assert _score(scorers.includes(), "paris", "It is Paris, France.").value is True
    assert _score(scorers.includes(ignore_case=False), "paris", "It is Paris").value is False
    assert _score(scorers.includes(), ["rome", "paris"], "paris!").value is True


def test_pattern_extracts_the_first_group() -> None:
    found = _score(scorers.pattern(r"ANSWER:\s*(\w+)"), "blue", "thinking... ANSWER: Blue")
    assert (found.value, found.answer) == (True, "Blue")
    assert _score(scorers.pattern(r"ANSWER:\s*(\w+)"), "blue", "no answer").value is False
    assert _score(scorers.pattern(r"\d+"), None, "it is 42").value is True
    with pytest.raises(ScorerError, match="is not a regular expression"):
        scorers.pattern("(")


def test_numeric_reads_the_last_number_within_tolerance() -> None:
    assert _score(scorers.numeric(), 42, "first 7, then 42").value is True
    assert _score(scorers.numeric(), "1,234.5", "It costs 1,234.5 dollars").value is True
    assert _score(scorers.numeric(tolerance=0.001), 3.14159, "pi is 3.14").value is False
    assert _score(scorers.numeric(tolerance=0.001), 3.14159, "pi is 3.1416").value is True
    assert _score(scorers.numeric(), [1, 2], "-2").value is False
    assert _score(scorers.numeric(), 5, "no digits").value is False
    with pytest.raises(ScorerError, match="tolerance must be a number >= 0"):
        scorers.numeric(tolerance=-1)


def test_choice_finds_the_letter() -> None:
    for answer in ("ANSWER: B", "The answer is (B).", "B", "b) because", "I pick (B)"):
        found = _score(scorers.choice(), "B", answer)
        assert (found.value, found.answer) == (True, "B"), answer
    assert _score(scorers.choice(), "B", "ANSWER: C").value is False
    assert _score(scorers.choice(), ["A", "c"], "answer: c").value is True
    assert _score(scorers.choice(), "B", "no idea").value is False


@pytest.mark.parametrize(
    ("scorer", "target", "needs"),
    [
        (scorers.exact(), None, "a string or number"),
        (scorers.exact(), {"a": 1}, "a string or number"),
        (scorers.numeric(), "many", "a number"),
        (scorers.numeric(), [1, "x"], "a number"),
        (scorers.choice(), "AB", "a choice letter"),
        (scorers.choice(), 3, "a choice letter"),
        (scorers.tool_calls(), "lookup", "a list of"),
        (scorers.tool_calls(), [{"arguments": {}}], "a list of"),
    ],
)
def test_a_target_of_the_wrong_kind_names_the_sample_and_scorer(scorer: Scorer, target: Any, needs: str) -> None:
    with pytest.raises(ScorerError, match=f"scorer '{scorer.scorer_id}': sample 'x' has target .*; it needs {needs}"):
        scorer.check_target(Sample("q", target, id="x"))


def test_code_takes_sync_and_async_functions() -> None:
    async def judge(sample: Sample, result: SampleResult) -> Score:
        return Score(0.5, answer=result.answer_text, explanation="half")

    assert _score(scorers.code(lambda s, r: r.answer == "yes"), None, "yes").value is True
    assert _score(scorers.code(judge), None, "x").value == 0.5
    assert scorers.code(judge).scorer_id == "code:judge" and scorers.code(judge, version="3").version == "3"
    with pytest.raises(ScoringError, match="returned str, not a Score"):
        _score(scorers.code(lambda s, r: "nope"), None, "x")  # type: ignore[arg-type,return-value]
    with pytest.raises(ScorerError, match="needs a callable"):
        scorers.code("not callable")  # type: ignore[arg-type]


def test_tool_calls_any_order_allowed_values_and_strict_arguments() -> None:
    expected = [
        {"name": "get_weather", "arguments": {"city": ["Paris", "paris"], "unit": ["", "celsius"]}},
        {"name": "add", "arguments": {"a": 2, "b": 3}},
    ]
    scorer = scorers.tool_calls(expected)
    good = [{"name": "add", "arguments": {"a": 2.0, "b": 3}}, {"name": "get_weather", "arguments": {"city": "paris"}}]
    assert _score(scorer, None, None, calls=good).value is True
    assert _score(scorers.tool_calls(expected, ordered=True), None, None, calls=good).value is False
    extra_arg = [good[0], {"name": "get_weather", "arguments": {"city": "Paris", "when": "now"}}]
    assert _score(scorer, None, None, calls=extra_arg).value is False
    wrong_value = [good[0], {"name": "get_weather", "arguments": {"city": "Rome"}}]
    assert _score(scorer, None, None, calls=wrong_value).value is False
    missing = _score(scorer, None, None, calls=good[:1])
    assert missing.value is False and missing.explanation == "1 calls made, 2 expected"
    from_target = _score(
        scorers.tool_calls(),
        [{"name": "add", "arguments": {"a": 1}}],
        None,
        calls=[{"name": "add", "arguments": {"a": 1}}],
    )
    assert from_target.value is True
    with pytest.raises(ScorerError, match="expected tool calls are a list"):
        scorers.tool_calls([{"nom": "x"}])


def test_model_graded_records_its_judge_and_maps_grades() -> None:
    judge = ScriptedModel(["The answer matches the reference.\nGRADE: C"])
    scorer = scorers.model_graded(judge)
    found = _score(scorer, "Paris", "It is Paris", task="capital of France?")
    assert found.value == "C" and scorer.to_number("C") == 1.0 and scorer.to_number("I") == 0.0
    record = found.metadata["judge"]
    assert record["response"]["text"].endswith("GRADE: C") and len(record["request_digest"]) == 64
    prompt = record["messages"][-1]["content"]
    assert "capital of France?" in prompt and "Paris" in prompt and "It is Paris" in prompt
    partial = scorers.model_graded(ScriptedModel(["GRADE: P"]), grades={"C": 1, "P": 0.5, "I": 0})
    assert partial.to_number(_score(partial, "x", "y").value) == 0.5


def test_a_judge_that_answers_garbage_is_a_scoring_error() -> None:
    for reply in ("I think it is fine.", "GRADE: maybe", ""):
        with pytest.raises(ScoringError, match="the judge's reply has no grade among"):

            def judge(view: Any, r: str = reply) -> str:
                return r or " "

            _score(scorers.model_graded(FunctionModel(judge)), "x", "y")
    with pytest.raises(ScorerError, match=r"no \{answer\} slot"):
        scorers.model_graded(ScriptedModel([]), template="grade {input}")
    with pytest.raises(ScorerError, match="needs a model adapter"):
        scorers.model_graded("gpt")  # type: ignore[arg-type]


def test_reducers_and_ids_are_checked() -> None:
    assert scorers.exact(reducer="max").reducer == "max"
    assert scorers.exact(name="strict").scorer_id == "strict"
    with pytest.raises(ScorerError, match="reducer must be one of mean, max, min, mode"):
        scorers.exact(reducer="median")
    with pytest.raises(ScoringError, match="bool, number or string"):
        Score([1])  # type: ignore[arg-type]
    with pytest.raises(ScoringError, match="finite"):
        Score(float("nan"))
