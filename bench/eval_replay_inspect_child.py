"""The inspect_ai side of ``bench/eval_replay.py``: run in ``bench/.venvs/inspect`` (never imports qitos).

``python eval_replay_inspect_child.py N BASE_URL LOG_DIR PROMPT CACHE_DIR`` runs the benchmark's
task (``lookup`` and ``add`` tools, 3 model turns per sample) with the system prompt ``PROMPT`` (one
of the prompts in ``bench/eval_replay.py``, given as text) and inspect_ai's model cache on
(``generate(cache=True)``, kept in ``CACHE_DIR``), all N samples and connections allowed at once.
Prints one JSON line: eval wall and CPU seconds, status, accuracy and sample count.
"""

from __future__ import annotations

import json
import os
import sys
import time

START_WALL = time.time()
os.environ["INSPECT_CACHE_DIR"] = sys.argv[5]

from inspect_ai import Task, eval  # noqa: E402
from inspect_ai.dataset import Sample  # noqa: E402
from inspect_ai.scorer import exact  # noqa: E402
from inspect_ai.solver import generate, system_message, use_tools  # noqa: E402
from inspect_ai.tool import tool  # noqa: E402


@tool
def lookup():  # type: ignore[no-untyped-def]
    async def execute(word: str) -> str:
        """Look a word up.

        Args:
            word: the word.
        """
        return f"{word}:{len(word)}"

    return execute


@tool
def add():  # type: ignore[no-untyped-def]
    async def execute(a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: first.
            b: second.
        """
        return a + b

    return execute


def main() -> None:
    n, base_url, log_dir, prompt = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    os.environ["BENCH_BASE_URL"] = base_url
    os.environ["BENCH_API_KEY"] = "sk-bench"
    samples = [Sample(input=f"Answer with the word w{i}", target=f"W{i}", id=f"s{i}") for i in range(n)]
    solver = [system_message(prompt), use_tools([lookup(), add()]), generate(cache=True)]
    task = Task(dataset=samples, solver=solver, scorer=exact())
    cpu0, wall0 = time.process_time(), time.perf_counter()
    logs = eval(
        task,
        model="openai-api/bench/m",
        max_samples=n,
        max_connections=n,
        log_dir=log_dir,
        display="none",
        max_retries=0,
    )
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    log = logs[0]
    metrics = {name: m.value for s in (log.results.scores if log.results else []) for name, m in s.metrics.items()}
    print(
        json.dumps(
            {
                "wall": wall,
                "cpu": cpu,
                "status": log.status,
                "samples": len(log.samples or []),
                "accuracy": metrics.get("accuracy", metrics.get("mean")),
                "start_wall": START_WALL,
            }
        )
    )


if __name__ == "__main__":
    main()
