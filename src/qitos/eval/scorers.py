"""Scorers: small, named, versioned objects that score one sample's result.

Every scorer has a ``scorer_id`` (unique in an eval; ``name=`` overrides it), a ``version`` (bump
it when the scoring rule changes: an eval pins it) and a ``reducer`` that combines the scores of
a sample's epochs: ``"mean"`` (default), ``"max"`` (pass@k), ``"min"`` (pass^k) or ``"mode"``.

Scorers compare against the result's ``answer`` (the final state's ``final_result``) unless they
say otherwise, and check each sample's target up front (:meth:`Scorer.check_target`): a target of
the wrong kind raises :class:`ScorerError` naming the sample before any sample runs. A scorer that
raises while scoring records a scoring error for that sample (never a silent 0).

- :func:`exact` / :func:`includes` / :func:`pattern` / :func:`numeric` / :func:`choice`: text checks;
- :func:`code`: your function ``(sample, result) -> Score | bool | float``, sync or async;
- :func:`model_graded`: an LLM judge through any model adapter; its request and reply are kept in
  the score's ``metadata["judge"]``;
- :func:`tool_calls`: the agent's tool calls against the expected ones.
"""

from __future__ import annotations

import abc
import copy
import inspect
import math
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from qitos.core._errors import UsageError
from qitos.core._exchange import ExchangeLog
from qitos.core.context import ContextBudget
from qitos.core.request_view import RequestView
from qitos.eval._dataset import Sample
from qitos.eval._result import SampleResult
from qitos.models._base import ModelAdapter, request_digest

__all__ = [
    "choice",
    "code",
    "exact",
    "includes",
    "model_graded",
    "numeric",
    "pattern",
    "tool_calls",
]

REDUCERS = ("mean", "max", "min", "mode")
ScoreValue = bool | int | float | str


class ScorerError(UsageError):
    """A scorer cannot be used as given: a bad parameter, or a sample whose target it cannot read."""


class ScoringError(Exception):
    """Raised inside a scorer for a sample it cannot score (recorded as that sample's scoring error)."""


@dataclass(frozen=True)
class Score:
    """One score: ``value`` (bool, number or string), the ``answer`` it judged, why, and metadata."""

    value: ScoreValue
    answer: str | None = field(default=None, kw_only=True)
    explanation: str | None = field(default=None, kw_only=True)
    metadata: Mapping[str, Any] = field(default_factory=dict, kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.value, bool | int | float | str):
            raise ScoringError(f"a score's value is a bool, number or string, got {type(self.value).__name__}")
        if isinstance(self.value, float) and not math.isfinite(self.value):
            raise ScoringError(f"a score's value must be finite, got {self.value}")


class Scorer(abc.ABC):
    """Base class: subclasses set ``scorer_id``/``version`` and implement :meth:`ascore`."""

    scorer_id: str
    version: str

    def __init__(
        self, *, scorer_id: str, version: str, reducer: str = "mean", spec: Mapping[str, object] | None = None
    ):
        if reducer not in REDUCERS:
            raise ScorerError(f"reducer must be one of {', '.join(REDUCERS)}, got {reducer!r}")
        if not scorer_id:
            raise ScorerError("a scorer needs a non-empty scorer_id")
        self.scorer_id = scorer_id
        self.version = str(version)
        self.reducer = reducer
        self.spec: dict[str, Any] = dict(spec or {})

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.scorer_id!r}, version={self.version!r}, reducer={self.reducer!r})"

    def check_target(self, sample: Sample) -> None:  # noqa: B027 (optional hook)
        """Raise :class:`ScorerError` naming the sample when its target is of the wrong kind."""

    @abc.abstractmethod
    async def ascore(self, sample: Sample, result: SampleResult) -> Score:
        """Score one result (raise :class:`ScoringError`, or anything, to record a scoring error)."""

    def to_number(self, value: ScoreValue) -> float:
        """The value as a number for statistics: True 1, False 0; grades ``C``/``P``/``I`` 1/0.5/0."""
        if isinstance(value, bool):
            return 1.0 if value else 0.0
        if isinstance(value, int | float):
            return float(value)
        grade = {"C": 1.0, "P": 0.5, "I": 0.0}.get(value)
        if grade is None:
            raise ScoringError(f"scorer {self.scorer_id!r}: {value!r} has no numeric value")
        return grade

    def _wrong_target(self, sample: Sample, wants: str) -> ScorerError:
        return ScorerError(
            f"scorer {self.scorer_id!r}: sample {sample.id!r} has target {sample.target!r}; it needs {wants}"
        )


def _targets(sample: Sample) -> list[Any]:
    return list(sample.target) if isinstance(sample.target, list) else [sample.target]


def _text_targets(scorer: Scorer, sample: Sample) -> list[str]:
    items = _targets(sample)
    if (
        sample.target is None
        or not items
        or any(not isinstance(t, str | int | float) or isinstance(t, bool) for t in items)
    ):
        raise scorer._wrong_target(sample, "a string or number, or a list of them")
    return [str(t) for t in items]


class _TextScorer(Scorer):
    def __init__(
        self, kind: str, compare: Callable[[str, str], bool], *, name: str | None, reducer: str, ignore_case: bool
    ):
        super().__init__(
            scorer_id=name or kind, version="1", reducer=reducer, spec={"kind": kind, "ignore_case": ignore_case}
        )
        self._compare = compare
        self._fold = ignore_case

    def check_target(self, sample: Sample) -> None:
        _text_targets(self, sample)

    async def ascore(self, sample: Sample, result: SampleResult) -> Score:
        answer = result.answer_text.strip()
        for target in _text_targets(self, sample):
            a, t = (answer.casefold(), target.strip().casefold()) if self._fold else (answer, target.strip())
            if self._compare(a, t):
                return Score(True, answer=answer, explanation=f"matches {target!r}")
        return Score(False, answer=answer, explanation=f"no target matches (targets: {_targets(sample)!r})")


def exact(*, ignore_case: bool = False, name: str | None = None, reducer: str = "mean") -> Scorer:
    """True when the answer, stripped, equals the target (or one of a list of targets)."""
    return _TextScorer("exact", lambda a, t: a == t, name=name, reducer=reducer, ignore_case=ignore_case)


def includes(*, ignore_case: bool = True, name: str | None = None, reducer: str = "mean") -> Scorer:
    """True when the target (or one of a list of targets) occurs in the answer."""
    return _TextScorer("includes", lambda a, t: t in a, name=name, reducer=reducer, ignore_case=ignore_case)


class _Pattern(Scorer):
    def __init__(self, regex: str, *, name: str | None, reducer: str, ignore_case: bool):
        try:
            self._regex = re.compile(regex, re.IGNORECASE if ignore_case else 0)
        except re.error as exc:
            raise ScorerError(f"pattern: {regex!r} is not a regular expression ({exc})") from exc
        super().__init__(
            scorer_id=name or "pattern",
            version="1",
            reducer=reducer,
            spec={"kind": "pattern", "regex": regex, "ignore_case": ignore_case},
        )

    def check_target(self, sample: Sample) -> None:
        if sample.target is not None:
            _text_targets(self, sample)

    async def ascore(self, sample: Sample, result: SampleResult) -> Score:
        answer = result.answer_text
        match = self._regex.search(answer)
        if match is None:
            return Score(False, answer=None, explanation=f"no match for {self._regex.pattern!r}")
        found = next((g for g in match.groups() if g is not None), match.group(0))
        if sample.target is None:
            return Score(True, answer=found, explanation="the pattern matched")
        ok = any(found.strip().casefold() == t.strip().casefold() for t in _text_targets(self, sample))
        return Score(ok, answer=found, explanation=f"extracted {found!r}")


def pattern(regex: str, *, ignore_case: bool = True, name: str | None = None, reducer: str = "mean") -> Scorer:
    """Search the answer for ``regex``; its first group (or the whole match) is the answer.

    With a target: True when that answer equals the target (case-insensitive); without: True
    when the pattern matched.
    """
    return _Pattern(regex, name=name, reducer=reducer, ignore_case=ignore_case)


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|-?\.\d+")


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").strip())
    except ValueError:
        return None


class _Numeric(Scorer):
    def __init__(self, tolerance: float, *, name: str | None, reducer: str):
        if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or tolerance < 0:
            raise ScorerError(f"numeric: tolerance must be a number >= 0, got {tolerance!r}")
        super().__init__(
            scorer_id=name or "numeric", version="1", reducer=reducer, spec={"kind": "numeric", "tolerance": tolerance}
        )
        self.tolerance = float(tolerance)

    def _numbers(self, sample: Sample) -> list[float]:
        out = []
        for target in _targets(sample):
            value = (
                target
                if isinstance(target, int | float) and not isinstance(target, bool)
                else (_number(target) if isinstance(target, str) else None)
            )
            if value is None or sample.target is None:
                raise self._wrong_target(sample, "a number (or numeric string), or a list of them")
            out.append(float(value))
        return out

    def check_target(self, sample: Sample) -> None:
        self._numbers(sample)

    async def ascore(self, sample: Sample, result: SampleResult) -> Score:
        found = _NUMBER.findall(result.answer_text)
        if not found:
            return Score(False, answer=None, explanation="no number in the answer")
        value = _number(found[-1])
        assert value is not None  # the pattern only matches numbers
        ok = any(abs(value - t) <= self.tolerance for t in self._numbers(sample))
        return Score(
            ok, answer=found[-1], explanation=f"{value} against {sample.target!r} (tolerance {self.tolerance})"
        )


def numeric(tolerance: float = 0, *, name: str | None = None, reducer: str = "mean") -> Scorer:
    """True when the last number in the answer is within ``tolerance`` of the target."""
    return _Numeric(tolerance, name=name, reducer=reducer)


_CHOICE_PATTERNS = (
    re.compile(r"(?:answer|choice)\s*(?:is)?\s*[:=]?\s*\(?([A-Z])\)?\b", re.IGNORECASE),
    re.compile(r"^\s*\(?([A-Z])\)?\s*(?:[.):]|$)", re.IGNORECASE),
    re.compile(r"\(([A-Z])\)"),
    re.compile(r"\b([A-Z])\b"),
)


class _Choice(Scorer):
    def __init__(self, *, name: str | None, reducer: str):
        super().__init__(scorer_id=name or "choice", version="1", reducer=reducer, spec={"kind": "choice"})

    def _letters(self, sample: Sample) -> list[str]:
        items = _targets(sample)
        if sample.target is None or any(
            not (isinstance(t, str) and re.fullmatch(r"[A-Za-z]", t.strip())) for t in items
        ):
            raise self._wrong_target(sample, "a choice letter (A-Z), or a list of them")
        return [str(t).strip().upper() for t in items]

    def check_target(self, sample: Sample) -> None:
        self._letters(sample)

    async def ascore(self, sample: Sample, result: SampleResult) -> Score:
        text = result.answer_text
        for regex in _CHOICE_PATTERNS:
            match = regex.search(text)
            if match:
                letter = match.group(1).upper()
                return Score(letter in self._letters(sample), answer=letter, explanation=f"chose {letter}")
        return Score(False, answer=None, explanation="no choice letter in the answer")


def choice(*, name: str | None = None, reducer: str = "mean") -> Scorer:
    """Multiple choice: the letter the answer picks ("ANSWER: B", "(B)", "B.") against the target letter."""
    return _Choice(name=name, reducer=reducer)


CodeFn = Callable[[Sample, SampleResult], "Score | bool | float | Awaitable[Score | bool | float]"]


class _Code(Scorer):
    def __init__(self, fn: CodeFn, *, name: str | None, version: str, reducer: str):
        if not callable(fn):
            raise ScorerError(f"code() needs a callable (sample, result) -> Score | bool | float, got {fn!r}")
        ref = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__qualname__)}"
        super().__init__(
            scorer_id=name or f"code:{getattr(fn, '__name__', 'fn')}",
            version=version,
            reducer=reducer,
            spec={"kind": "code", "fn": ref},
        )
        self._fn = fn

    async def ascore(self, sample: Sample, result: SampleResult) -> Score:
        value = self._fn(sample, result)
        if inspect.isawaitable(value):
            value = await value
        if isinstance(value, Score):
            return value
        if isinstance(value, bool | int | float):
            return Score(value, answer=result.answer_text or None)
        raise ScoringError(f"scorer {self.scorer_id!r} returned {type(value).__name__}, not a Score, bool or number")


def code(fn: CodeFn, *, name: str | None = None, version: str = "1", reducer: str = "mean") -> Scorer:
    """Your function ``fn(sample, result)`` (sync or async) returning a Score, a bool or a number."""
    return _Code(fn, name=name, version=version, reducer=reducer)


DEFAULT_TEMPLATE = """You are grading an answer against a reference.

[Question]
{input}

[Reference answer]
{target}

[Submitted answer]
{answer}

Is the submitted answer correct? Think briefly, then end with a line "GRADE: C" if it is correct
or "GRADE: I" if it is incorrect."""

_GRADE = re.compile(r"GRADE\s*:\s*\**\s*([A-Za-z]+)")


class _ModelGraded(Scorer):
    def __init__(
        self,
        model: ModelAdapter,
        *,
        template: str,
        grades: Mapping[str, float],
        name: str | None,
        version: str,
        reducer: str,
    ):
        if not callable(getattr(model, "acomplete", None)):
            raise ScorerError(f"model_graded needs a model adapter, got {type(model).__name__}")
        if not grades or any(not isinstance(v, int | float) or isinstance(v, bool) for v in grades.values()):
            raise ScorerError(f"model_graded: grades maps each grade to a number, got {grades!r}")
        for slot in ("{answer}",):
            if slot not in template:
                raise ScorerError(f"model_graded: the template has no {slot} slot")
        describe = getattr(model, "describe", None)
        judge = describe() if callable(describe) else {"adapter": type(model).__name__}
        super().__init__(
            scorer_id=name or "model_graded",
            version=version,
            reducer=reducer,
            spec={"kind": "model_graded", "template": template, "grades": dict(grades), "judge": judge},
        )
        self.model = model
        self.template = template
        self.grades = {k.upper(): float(v) for k, v in grades.items()}

    def with_judge(self, model: ModelAdapter) -> _ModelGraded:
        """The same scorer (id, version, template, grades) asking ``model`` (a replaying or caching
        judge: ``qitos.eval._replay``)."""
        other = copy.copy(self)
        other.model = model
        return other

    def to_number(self, value: ScoreValue) -> float:
        if isinstance(value, str) and value.upper() in self.grades:
            return self.grades[value.upper()]
        return super().to_number(value)

    async def ascore(self, sample: Sample, result: SampleResult) -> Score:
        prompt = self.template.format(input=sample.task.objective, target=sample.target, answer=result.answer_text)
        log = ExchangeLog("judge")
        log.open([{"role": "user", "content": prompt}])
        view = RequestView.from_exchange_log(
            log,
            model=self.model,
            context_budget=ContextBudget(max_input_units=len(prompt) + 10_000),
            protocol_id="qitos.eval.judge",
            tool_use_policy="none",
        )
        response = await self.model.acomplete(view)
        text = response.text or ""
        record = {"request_digest": request_digest(view), "messages": view.messages(), "response": response.to_dict()}
        found = _GRADE.findall(text)
        grade = found[-1].upper() if found else None
        if grade not in self.grades:
            raise ScoringError(
                f"the judge's reply has no grade among {sorted(self.grades)} (a 'GRADE: X' line): {text[:200]!r}"
            )
        return Score(grade, answer=result.answer_text, explanation=text.strip()[:2000], metadata={"judge": record})


def model_graded(
    model: ModelAdapter,
    *,
    template: str = DEFAULT_TEMPLATE,
    grades: Mapping[str, float] | None = None,
    name: str | None = None,
    version: str = "1",
    reducer: str = "mean",
) -> Scorer:
    """An LLM judge: ``template`` (slots ``{input}``, ``{target}``, ``{answer}``) goes to ``model``,
    whose reply must end with ``GRADE: X`` for a grade X in ``grades`` (default ``C`` 1, ``I`` 0).

    The score's value is the grade; a reply without one is a scoring error, never a 0.
    """
    return _ModelGraded(
        model, template=template, grades=grades or {"C": 1.0, "I": 0.0}, name=name, version=version, reducer=reducer
    )


class _ToolCalls(Scorer):
    def __init__(
        self, expected: Sequence[Mapping[str, object]] | None, *, ordered: bool, name: str | None, reducer: str
    ):
        if expected is not None:
            _check_calls(expected, "tool_calls(expected)")
        super().__init__(
            scorer_id=name or "tool_calls",
            version="1",
            reducer=reducer,
            spec={
                "kind": "tool_calls",
                "expected": None if expected is None else [dict(c) for c in expected],
                "ordered": ordered,
            },
        )
        self.expected = expected
        self.ordered = ordered

    def _expected(self, sample: Sample) -> Sequence[Mapping[str, Any]]:
        if self.expected is not None:
            return self.expected
        try:
            return _check_calls(sample.target, f"sample {sample.id!r}")
        except ScorerError:
            raise self._wrong_target(sample, 'a list of {"name": ..., "arguments": {...}}') from None

    def check_target(self, sample: Sample) -> None:
        self._expected(sample)

    async def ascore(self, sample: Sample, result: SampleResult) -> Score:
        expected = list(self._expected(sample))
        actual = [dict(c) for c in result.tool_calls]
        made = ", ".join(f"{c.get('name')}({c.get('arguments')})" for c in actual) or "no calls"
        if len(actual) != len(expected):
            return Score(False, answer=made, explanation=f"{len(actual)} calls made, {len(expected)} expected")
        if self.ordered:
            ok = all(_call_matches(e, a) for e, a in zip(expected, actual, strict=True))
        else:
            ok = _match_all(expected, actual)
        return Score(
            ok, answer=made, explanation="the calls match" if ok else "the calls differ from the expected ones"
        )


def _check_calls(value: object, where: str) -> Sequence[Mapping[str, Any]]:
    if not isinstance(value, list) or not all(
        isinstance(c, Mapping) and isinstance(c.get("name"), str) and isinstance(c.get("arguments", {}), Mapping)
        for c in value
    ):
        raise ScorerError(f'{where}: expected tool calls are a list of {{"name": ..., "arguments": {{...}}}}')
    return value


def _call_matches(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> bool:
    if expected.get("name") != actual.get("name"):
        return False
    want = expected.get("arguments") or {}
    got = actual.get("arguments") or {}
    if not isinstance(got, Mapping) or set(got) - set(want):
        return False
    for key, allowed in want.items():
        options = allowed if isinstance(allowed, list) else [allowed]
        if key not in got:
            if "" in options or None in options:  # an optional argument the call may leave out
                continue
            return False
        if not any(_same(got[key], option) for option in options):
            return False
    return True


def _same(got: object, want: object) -> bool:
    if isinstance(got, int | float) and isinstance(want, int | float) and not isinstance(got, bool):
        return float(got) == float(want)
    return bool(got == want)


def _match_all(expected: list[Mapping[str, Any]], actual: list[dict[str, Any]]) -> bool:
    """A one-to-one pairing of expected and actual calls exists (small lists: backtracking)."""
    if not expected:
        return not actual
    head, rest = expected[0], expected[1:]
    for i, call in enumerate(actual):
        if _call_matches(head, call) and _match_all(rest, actual[:i] + actual[i + 1 :]):
            return True
    return False


def tool_calls(
    expected: Sequence[Mapping[str, object]] | None = None,
    *,
    ordered: bool = False,
    name: str | None = None,
    reducer: str = "mean",
) -> Scorer:
    """The agent's tool calls against ``expected`` (default: the sample's target).

    ``expected`` is a list of ``{"name": ..., "arguments": {...}}``; an argument given as a list
    means "any of these values" (``""`` or None among them: the call may leave it out). True when
    the calls pair one to one with the expected ones (in order with ``ordered=True``), with the
    same names, no unexpected arguments and allowed values.
    """
    return _ToolCalls(expected, ordered=ordered, name=name, reducer=reducer)
