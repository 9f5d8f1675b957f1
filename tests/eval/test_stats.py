"""Statistics against values computed by hand."""

from __future__ import annotations

import math

import pytest

from qitos.eval._stats import bootstrap_ci, mean, reduce_epochs, stderr


def test_mean_and_stderr_by_hand() -> None:
    values = [1.0, 0.0, 1.0, 1.0]
    assert mean(values) == 0.75
    # sample variance: ((.25^2)*3 + .75^2) / 3 = 0.25; stderr = sqrt(0.25 / 4) = 0.25
    assert stderr(values) == pytest.approx(0.25)
    assert stderr([2.0, 4.0, 6.0]) == pytest.approx(math.sqrt(4 / 3))  # var 4, n 3
    assert mean([]) is None and stderr([1.0]) is None


def test_bootstrap_is_seeded_inside_the_range_and_degenerate_cases() -> None:
    values = [0.0, 1.0] * 20
    first = bootstrap_ci(values)
    assert first == bootstrap_ci(values)  # deterministic
    assert first is not None and 0.0 < first[0] < 0.5 < first[1] < 1.0
    # the normal approximation: 0.5 +- 1.96 * 0.5 / sqrt(40) = [0.345, 0.655]
    assert first[0] == pytest.approx(0.345, abs=0.04) and first[1] == pytest.approx(0.655, abs=0.04)
    assert bootstrap_ci([0.7]) == (0.7, 0.7)
    assert bootstrap_ci([1.0] * 5) == (1.0, 1.0)
    assert bootstrap_ci([]) is None


def test_reducers_over_epochs() -> None:
    values, numbers = [True, False, True], [1.0, 0.0, 1.0]
    assert reduce_epochs(values, numbers, "mean")[1] == pytest.approx(2 / 3)
    assert reduce_epochs(values, numbers, "max") == (True, 1.0)  # pass@k
    assert reduce_epochs(values, numbers, "min") == (False, 0.0)  # pass^k
    assert reduce_epochs(values, numbers, "mode") == (True, 1.0)
    assert reduce_epochs(["C", "I", "I"], [1.0, 0.0, 0.0], "mode") == ("I", 0.0)
    assert reduce_epochs(["B", "A"], [0.0, 1.0], "mode") == ("B", 0.0)  # a tie: the first seen
    with pytest.raises(ValueError, match="unknown reducer"):
        reduce_epochs([1], [1.0], "median")
