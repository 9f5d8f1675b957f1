"""Models for the benchmark tests, scripted from a benchmark's own data.

``oracle(benchmark)`` answers every request with the dataset's canonical answer (HumanEval: the
prompt and its canonical solution in a code block; BFCL: the expected calls, with the first value
each parameter allows); ``always_wrong(benchmark)`` answers every request wrongly (HumanEval: a
function that returns None; BFCL: a call of the first function offered, with no arguments).
"""

from __future__ import annotations

import json
from typing import Any

from qitos.core.request_view import RequestView
from qitos.eval.benchmarks import Benchmark
from qitos.models import FunctionModel


def _question(view: RequestView) -> str:
    return next(str(m.get("content") or "") for m in view.messages() if m.get("role") == "user")


def _given(options: Any) -> bool:
    return any(v != "" for v in (options if isinstance(options, list) else [options]))


def _resolve(value: Any) -> Any:
    """A concrete value from an allowed one: objects hold lists of allowed values per key."""
    if isinstance(value, dict):
        return {k: _first(v) for k, v in value.items() if _given(v)}
    if isinstance(value, list):
        return [_resolve(v) for v in value]
    return value


def _first(options: Any) -> Any:
    values = options if isinstance(options, list) else [options]
    return _resolve(next(v for v in values if v != ""))


def oracle(benchmark: Benchmark) -> FunctionModel:
    if benchmark.name == "humaneval":
        answers = {
            f"Complete this function:\n\n```python\n{s.input}```": f"```python\n{s.input}{s.target}```"
            for s in benchmark.dataset
        }
        return FunctionModel(lambda view: answers[_question(view)], model_id="oracle")
    calls: dict[tuple[str, str], Any] = {}
    for sample in benchmark.dataset:
        task = json.loads(str(sample.input))
        key = (task["question"], json.dumps(sorted(f["name"] for f in task["functions"])))
        calls[key] = [
            {
                "name": call["name"],
                "arguments": {k: _first(v) for k, v in call["arguments"].items() if _given(v)},
            }
            for call in sample.target
        ]

    def answer(view: RequestView) -> Any:
        if any(m.get("role") == "tool" for m in view.messages()):
            return "done"
        return {"tool_calls": calls[(_question(view), json.dumps(sorted(t["name"] for t in view.tools())))]}

    return FunctionModel(answer, model_id="oracle")


def always_wrong(benchmark: Benchmark) -> FunctionModel:
    if benchmark.name == "humaneval":
        return FunctionModel(lambda view: "```python\ndef nothing():\n    return None\n```", model_id="wrong")

    def answer(view: RequestView) -> Any:
        if any(m.get("role") == "tool" for m in view.messages()):
            return "done"
        return {"tool_calls": [{"name": view.tools()[0]["name"], "arguments": {}}]}

    return FunctionModel(answer, model_id="wrong")
