"""BFCL: the Berkeley Function Calling Leaderboard's Python categories, scored by an AST-style check.

The questions, function documents and possible answers come from the ``bfcl-eval`` package
(Apache-2.0), which ships them inside its wheel (``bfcl_eval/data/BFCL_v4_<category>.json`` and
``possible_answer/``); install it with ``pip install --no-deps bfcl-eval`` (its declared
dependencies are for running the leaderboard, not for reading its data). Categories: ``simple``
(one call of the one function given), ``multiple`` (one call, the right function among several),
``parallel`` (several calls of one function), ``parallel_multiple`` (several calls of several).

A sample's input is a JSON text holding the question and the category's function documents (so
:class:`BfclAgent` builds its tools from its own task, also when a session is resumed elsewhere);
its target the possible answers as ``[{"name", "arguments": {param: [allowed values]}}]``.
Function names are given to the model with ``.`` replaced by ``_`` (what OpenAI-compatible APIs
accept), in the tools and the targets alike.

:class:`BfclScorer` checks the calls the agent made as the leaderboard's AST checker does: the same
number of calls as expected, paired one to one (in any order) with the expected ones, each with the
expected function's name, every required parameter present, no parameter the function does not
declare, no parameter the answer does not list, optional ones left out only where the answer allows
it (``""`` among its values), and each value among the allowed ones for its declared type (numbers
compared as numbers, an int accepted for a float, strings compared case-, space- and
punctuation-insensitively, lists element by element, objects key by key).
"""

from __future__ import annotations

import importlib.resources
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from qitos.core._agent_module import AgentModule
from qitos.core._decision import Decision
from qitos.core._errors import ConfigurationError
from qitos.core._state import StateSchema
from qitos.core._tool import ToolSpec
from qitos.eval._dataset import Dataset, Sample
from qitos.eval._result import SampleResult
from qitos.eval.scorers import Score, Scorer, ScorerError

__all__ = ["CATEGORIES", "BfclAgent", "BfclScorer", "bfcl_dataset", "check_calls", "tool_schema"]

CATEGORIES = {
    "simple": "simple_python",
    "multiple": "multiple",
    "parallel": "parallel",
    "parallel_multiple": "parallel_multiple",
}
INSTALL = "pip install --no-deps bfcl-eval"
SYSTEM_PROMPT = (
    "You are an expert in composing functions. You are given a question and a set of possible functions. "
    "Make the function calls that answer the question, all of them in this one reply, with the argument "
    "values the question gives. If no function fits, say so in plain text instead."
)
_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}
_PUNCTUATION = re.compile(r"[ ,./\-_*^]")


def _read(name: str) -> list[dict[str, Any]]:
    try:
        root = importlib.resources.files("bfcl_eval").joinpath("data")
    except ModuleNotFoundError as exc:
        raise ConfigurationError(f"the BFCL benchmark reads its data from bfcl-eval: {INSTALL}") from exc
    try:
        text = root.joinpath(*name.split("/")).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigurationError(f"the installed bfcl-eval has no {name} ({exc})") from exc
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def tool_name(name: str) -> str:
    """A BFCL function name as the model is given it (``math.factorial`` -> ``math_factorial``)."""
    return name.replace(".", "_")


def tool_schema(schema: Mapping[str, object]) -> dict[str, Any]:
    """A BFCL parameter schema as JSON Schema (``dict`` -> object, ``float`` -> number, ``tuple`` ->
    array, ``any`` -> no type)."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type":
            kind = _TYPES.get(str(value), value)
            if kind is not None:
                out["type"] = kind
        elif key == "properties" and isinstance(value, Mapping):
            out["properties"] = {name: tool_schema(sub) for name, sub in value.items() if isinstance(sub, Mapping)}
        elif key == "items" and isinstance(value, Mapping):
            out["items"] = tool_schema(value)
        else:
            out[key] = value
    return out


def bfcl_dataset(categories: Sequence[str] = ("simple", "multiple", "parallel")) -> Dataset:
    """The questions of ``categories`` as one Dataset (ids as BFCL gives them, ``simple_python_0`` ...)."""
    unknown = [c for c in categories if c not in CATEGORIES]
    if unknown or not categories:
        raise ConfigurationError(f"BFCL categories are {', '.join(CATEGORIES)}; got {list(categories)!r}")
    samples = []
    for category in categories:
        name = CATEGORIES[category]
        questions = _read(f"BFCL_v4_{name}.json")
        answers = {row["id"]: row["ground_truth"] for row in _read(f"possible_answer/BFCL_v4_{name}.json")}
        for row in questions:
            question = "\n".join(m["content"] for turn in row["question"] for m in turn if m.get("role") == "user")
            functions = [
                {
                    "name": tool_name(f["name"]),
                    "description": f.get("description", ""),
                    "parameters": tool_schema(f.get("parameters") or {}),
                }
                for f in row["function"]
            ]
            expected = [
                {"name": tool_name(fn), "arguments": dict(args)}
                for call in answers[row["id"]]
                for fn, args in call.items()
            ]
            task = json.dumps({"question": question, "functions": functions}, ensure_ascii=False)
            samples.append(Sample(task, expected, id=row["id"], metadata={"category": category}))
    return Dataset(samples, name="bfcl-" + "-".join(categories))


def _task(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(f"a BFCL task is JSON with a question and functions: {exc}") from exc
    if not isinstance(value, dict) or not isinstance(value.get("functions"), list):
        raise ConfigurationError("a BFCL task is JSON with a question and functions")
    return value


@dataclass
class BfclState(StateSchema):
    """The state of a BFCL run: the calls the model made (in order)."""

    calls: list[dict[str, Any]] = field(default_factory=list)


def _recorded(**arguments: object) -> str:
    return "recorded"


class BfclAgent(AgentModule[BfclState, Any, Any]):
    """Asks its model once, with its task's functions as tools; the calls it makes are the answer.

    The tools only record their calls (BFCL checks what is called, not what it returns)."""

    def init_state(self, task: str, **kwargs: Any) -> BfclState:
        return BfclState(task=task, max_steps=3)

    def build_system_prompt(self, state: BfclState) -> str | None:
        return SYSTEM_PROMPT

    def prepare(self, state: BfclState) -> str:
        return str(_task(state.task).get("question", ""))

    def decide(self, state: BfclState, observation: Any) -> Decision[Any] | None:
        registry = self.tool_registry
        for function in _task(state.task)["functions"]:  # this session's tools (also after a restore)
            if function["name"] not in registry:
                registry.register(
                    ToolSpec(
                        name=function["name"],
                        description=str(function.get("description") or function["name"]),
                        parameters=function.get("parameters") or {"type": "object", "properties": {}},
                        func=_recorded,
                        idempotent=True,
                    )
                )
        if state.calls:  # the model made its calls: that is the answer
            return Decision.final(json.dumps(state.calls, ensure_ascii=False, sort_keys=True))
        return None

    def reduce(self, state: BfclState, observation: Any, decision: Decision[Any]) -> BfclState:
        for action in decision.actions or ():
            state.calls.append({"name": action.name, "arguments": dict(action.args)})
        return state


# --------------------------------------------------------------------------- the AST-style check


def check_calls(
    expected: Sequence[Mapping[str, object]],
    calls: Sequence[Mapping[str, object]],
    functions: Sequence[Mapping[str, object]],
) -> tuple[bool, str]:
    """Whether ``calls`` answer as ``expected`` allows (see the module docstring), and why not."""
    if len(calls) != len(expected):
        return False, f"{len(calls)} calls made, {len(expected)} expected"
    docs = {str(f.get("name")): f for f in functions}
    reasons: list[str] = []

    def pair(todo: list[Mapping[str, Any]], left: list[Mapping[str, Any]]) -> bool:
        if not todo:
            return True
        head = todo[0]
        for i, call in enumerate(left):
            ok, why = _check_call(head, call, docs)
            if ok and pair(todo[1:], left[:i] + left[i + 1 :]):
                return True
            if not ok:
                reasons.append(why)
        return False

    if pair(list(expected), list(calls)):
        return True, "the calls match"
    return False, reasons[0] if reasons else "the calls do not match"


def _check_call(expected: Mapping[str, Any], call: Mapping[str, Any], docs: Mapping[str, Any]) -> tuple[bool, str]:
    name = str(expected.get("name"))
    if call.get("name") != name:
        return False, f"called {call.get('name')!r}, expected {name!r}"
    arguments = call.get("arguments")
    if not isinstance(arguments, Mapping):
        return False, f"{name}: the arguments are not an object"
    parameters = (docs.get(name) or {}).get("parameters") or {}
    declared = parameters.get("properties") or {}
    allowed: Mapping[str, Any] = expected.get("arguments") or {}
    for required in parameters.get("required") or ():
        if required not in arguments:
            return False, f"{name}: required parameter {required!r} is missing"
    for key, value in arguments.items():
        if key not in declared:
            return False, f"{name}: the function has no parameter {key!r}"
        if key not in allowed:
            return False, f"{name}: parameter {key!r} is not expected"
        if not _value_ok(value, allowed[key], declared.get(key) or {}):
            return False, f"{name}: {key}={value!r} is not one of {allowed[key]!r}"
    for key, options in allowed.items():
        if key not in arguments and "" not in _as_list(options):
            return False, f"{name}: parameter {key!r} is missing"
    return True, ""


def _as_list(options: object) -> list[Any]:
    return list(options) if isinstance(options, list) else [options]


def _value_ok(value: object, options: object, schema: Mapping[str, object]) -> bool:
    return any(option != "" and _same(value, option, schema) for option in _as_list(options))


def _same(value: Any, option: Any, schema: Mapping[str, Any]) -> bool:
    kind = schema.get("type")
    if option is None:  # a default of None, given explicitly
        return value is None
    if isinstance(option, bool) or kind == "boolean":
        return isinstance(value, bool) and value == option
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool) and value == option
    if kind == "number" or (isinstance(option, int | float) and kind is None):
        return isinstance(value, int | float) and not isinstance(value, bool) and float(value) == float(option)
    if isinstance(option, str):
        return isinstance(value, str) and _standard(value) == _standard(option)
    if isinstance(option, list):
        items = schema.get("items") or {}
        return (
            isinstance(value, list)
            and len(value) == len(option)
            and all(_same(v, o, items) for v, o in zip(value, option, strict=True))
        )
    if isinstance(option, Mapping):
        return isinstance(value, Mapping) and _object_ok(value, option, schema)
    return bool(value == option)


def _object_ok(value: Mapping[str, Any], option: Mapping[str, Any], schema: Mapping[str, Any]) -> bool:
    properties = schema.get("properties") or {}
    for key, item in value.items():
        if key not in option or not _value_ok(item, option[key], properties.get(key) or {}):
            return False
    return all(key in value or "" in _as_list(choices) for key, choices in option.items())


def _standard(text: str) -> str:
    return _PUNCTUATION.sub("", text).lower().replace("'", '"')


class BfclScorer(Scorer):
    """The agent's calls against the sample's possible answers (see the module docstring)."""

    def __init__(self, *, name: str | None = None, reducer: str = "mean"):
        super().__init__(scorer_id=name or "bfcl", version="1", reducer=reducer, spec={"kind": "bfcl"})

    def check_target(self, sample: Sample) -> None:
        target = sample.target
        if not isinstance(target, list) or not all(isinstance(c, Mapping) and "name" in c for c in target):
            raise ScorerError(f"scorer {self.scorer_id!r}: sample {sample.id!r} has no BFCL answer as its target")
        if not isinstance(sample.input, str):
            raise ScorerError(f"scorer {self.scorer_id!r}: sample {sample.id!r} needs its BFCL task as input")
        try:
            _task(sample.input)
        except ConfigurationError as exc:
            raise ScorerError(f"scorer {self.scorer_id!r}: sample {sample.id!r}: {exc}") from None

    async def ascore(self, sample: Sample, result: SampleResult) -> Score:
        functions = _task(str(sample.input))["functions"]
        calls = [dict(c) for c in result.tool_calls]
        ok, why = check_calls(list(sample.target), calls, functions)
        made = ", ".join(f"{c.get('name')}({json.dumps(c.get('arguments'), sort_keys=True)})" for c in calls)
        return Score(ok, answer=made or "no calls", explanation=why)
