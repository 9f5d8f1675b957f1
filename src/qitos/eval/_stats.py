"""Statistics over per-sample scores: reducers over epochs, mean, standard error, bootstrap interval.

All pure functions of the values given (no state, no I/O), checked against hand-computed values in
``tests/eval/test_stats.py``. The bootstrap is seeded, so a report is the same every time it is
computed from the same rows.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "BOOTSTRAP_SEED",
    "bootstrap_ci",
    "mcnemar_exact",
    "mean",
    "pass_at_k",
    "reduce_epochs",
    "stderr",
]

BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 20250101


def mean(values: Sequence[float]) -> float | None:
    """The arithmetic mean (None for no values)."""
    return math.fsum(values) / len(values) if values else None


def stderr(values: Sequence[float]) -> float | None:
    """Standard error of the mean: sample standard deviation (n - 1) over sqrt(n); None below 2 values."""
    n = len(values)
    if n < 2:
        return None
    m = math.fsum(values) / n
    variance = math.fsum((v - m) ** 2 for v in values) / (n - 1)
    return math.sqrt(variance / n)


def bootstrap_ci(
    values: Sequence[float], *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED, level: float = 0.95
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean: ``resamples`` resamples with replacement, seeded.

    The bounds are the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of the resampled means
    (nearest rank). None for no values; a single value gives that value twice.
    """
    n = len(values)
    if n == 0:
        return None
    rng = random.Random(seed)
    data = list(values)
    means = sorted(math.fsum(rng.choices(data, k=n)) / n for _ in range(resamples))
    low = means[max(0, math.ceil((1 - level) / 2 * resamples) - 1)]
    high = means[min(resamples - 1, math.ceil((1 + level) / 2 * resamples) - 1)]
    return (low, high)


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """McNemar's exact test on paired binary outcomes: the two-sided p-value that ``a_only``
    (samples only the first eval passed) and ``b_only`` (only the second passed) came from a
    fair coin, ``min(1, 2 * P(X <= min(a_only, b_only)))`` with ``X ~ Binomial(a_only + b_only, 1/2)``.
    1.0 when no sample is discordant."""
    if a_only < 0 or b_only < 0:
        raise ValueError("discordant counts are >= 0")
    n = a_only + b_only
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(a_only, b_only) + 1))
    return min(1.0, float(2 * tail / 2**n))


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from ``n`` samples of which ``c`` passed:
    ``1 - C(n - c, k) / C(n, k)`` (1.0 when fewer than ``k`` failed)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def reduce_epochs(values: Sequence[object], numbers: Sequence[float], reducer: str) -> tuple[Any, float]:
    """One sample's epochs reduced: (the reduced value, it as a number).

    ``mean``: the mean of the numbers; ``max`` (pass@k): the best; ``min`` (pass^k): the worst;
    ``mode``: the most common value (ties: the one seen first), with its number.
    """
    if not values:
        raise ValueError("no values to reduce")
    if reducer == "mean":
        m = math.fsum(numbers) / len(numbers)
        return (values[0] if len(values) == 1 else m), m
    if reducer in ("max", "min"):
        pick = max if reducer == "max" else min
        index = pick(range(len(numbers)), key=lambda i: numbers[i])
        return values[index], numbers[index]
    if reducer == "mode":
        counts = Counter(_hashable(v) for v in values)
        best = max(counts.values())
        index = next(i for i, v in enumerate(values) if counts[_hashable(v)] == best)
        return values[index], numbers[index]
    raise ValueError(f"unknown reducer {reducer!r}")


def _hashable(value: object) -> Any:
    return (type(value).__name__, value) if isinstance(value, bool) else value
