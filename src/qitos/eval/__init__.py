"""qitos.eval: run an agent over a dataset, score it, keep the results next to the sessions.

::

    from qitos.eval import Dataset, evaluate, scorers

    report = evaluate(MyAgent, Dataset.from_jsonl("questions.jsonl"), scorers=[scorers.exact()],
                      model=model, store="evals.db", name="baseline")
    print(report.metrics["exact"]["mean"])

Every sample x epoch runs as a durable session (``qitos.eval._runner``), so running the same eval
again (the same ``name`` in the same store) continues it: finished samples are read, not run, and
unfinished ones go on from their last committed step. Results, scores and the experiment's pins
live in eval tables of the same store (``qitos.eval._store`` documents them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence

from qitos.checkpoint.store import CheckpointStore
from qitos.eval import scorers
from qitos.eval._compare import CompareError, Comparison, compare
from qitos.eval._dataset import Dataset, DatasetError, Sample
from qitos.eval._replay import ReplaySourceError
from qitos.eval._report import EvalReport, SampleReport
from qitos.eval._result import SampleResult
from qitos.eval._runner import EvalChangedError, EvalProgress, EvalRun
from qitos.eval._store import EvalStore, open_eval_store
from qitos.eval.scorers import Score, Scorer, ScorerError, ScoringError
from qitos.models._function import ModelSource

__all__ = [
    "CompareError",
    "Comparison",
    "Dataset",
    "DatasetError",
    "EvalChangedError",
    "EvalProgress",
    "EvalReport",
    "EvalStore",
    "ReplaySourceError",
    "Sample",
    "SampleReport",
    "SampleResult",
    "Score",
    "Scorer",
    "ScorerError",
    "ScoringError",
    "aevaluate",
    "compare",
    "evaluate",
    "open_eval_store",
    "scorers",
]


async def aevaluate(
    agent: object,
    dataset: Dataset | Iterable[Sample],
    *,
    scorers: Scorer | Sequence[Scorer],
    model: ModelSource | None = None,
    store: CheckpointStore | str = "evals.db",
    name: str | None = None,
    epochs: int = 1,
    max_samples: int = 64,
    limit: int | None = None,
    sample_timeout: float | None = None,
    retries: int = 0,
    fail_on_error: int | float | None = None,
    fleet: object = None,
    engine_kwargs: Mapping[str, object] | None = None,
    replay: str | None = None,
    on_divergence: str = "stop",
    cache: bool = False,
) -> EvalReport:
    """Run ``agent`` over ``dataset`` and score it; the :class:`EvalReport`.

    ``agent``: an ``AgentModule`` class or factory, as ``compose`` takes it; ``model``: the model
    every sample's agent uses (default: the agent's own); ``store``: a SQLite path, a
    ``postgresql://`` DSN or a checkpoint store, where the sessions and the results live; ``name``:
    the eval's name in the store (the same name again continues it; default: a new name);
    ``epochs``: runs per sample; ``max_samples``: samples in flight at once; ``limit``: the first N
    samples only; ``sample_timeout``: seconds a sample may take (then it fails); ``retries``: new
    attempts for a failed sample; ``fail_on_error``: stop once this many samples (an int) or this
    share of them (a float in (0, 1)) failed; ``fleet``: a ``qitos.distributed.Fleet`` whose
    workers run the samples; ``engine_kwargs``: for each sample's Engine (``budget=``...).

    ``replay``: an earlier eval (id or name, in the same store) whose recorded model replies answer
    this one's requests, sample by sample and epoch by epoch, with no model call; a request that
    differs from the recorded one is a divergence (``SampleReport.divergence``: the step, what
    changed), and ``on_divergence`` says what then: ``"stop"`` the sample (it fails as diverged),
    ``"live"`` go on against the live model, ``"mark"`` go on with the recorded replies and flag it.
    ``cache``: answer requests from the store's response cache when it holds the same request (the
    model, parameters, messages and tools), and cache every live reply.
    """
    run = EvalRun(
        agent,
        dataset,
        scorers=scorers,
        model=model,
        store=store,
        name=name,
        epochs=epochs,
        max_samples=max_samples,
        limit=limit,
        sample_timeout=sample_timeout,
        retries=retries,
        fail_on_error=fail_on_error,
        fleet=fleet,
        engine_kwargs=engine_kwargs,
        replay=replay,
        on_divergence=on_divergence,
        cache=cache,
    )
    return await run.arun()


def evaluate(
    agent: object,
    dataset: Dataset | Iterable[Sample],
    *,
    scorers: Scorer | Sequence[Scorer],
    model: ModelSource | None = None,
    store: CheckpointStore | str = "evals.db",
    name: str | None = None,
    epochs: int = 1,
    max_samples: int = 64,
    limit: int | None = None,
    sample_timeout: float | None = None,
    retries: int = 0,
    fail_on_error: int | float | None = None,
    fleet: object = None,
    engine_kwargs: Mapping[str, object] | None = None,
    replay: str | None = None,
    on_divergence: str = "stop",
    cache: bool = False,
) -> EvalReport:
    """:func:`aevaluate` on a new event loop (Ctrl-C leaves the eval ``incomplete`` and resumable)."""
    return asyncio.run(
        aevaluate(
            agent,
            dataset,
            scorers=scorers,
            model=model,
            store=store,
            name=name,
            epochs=epochs,
            max_samples=max_samples,
            limit=limit,
            sample_timeout=sample_timeout,
            retries=retries,
            fail_on_error=fail_on_error,
            fleet=fleet,
            engine_kwargs=engine_kwargs,
            replay=replay,
            on_divergence=on_divergence,
            cache=cache,
        )
    )
