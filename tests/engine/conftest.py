"""The ``driver`` fixture: a behavioural test marked with it runs through both drivers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import driven


@pytest.fixture(params=driven.DRIVERS)
def driver(request: pytest.FixtureRequest) -> Iterator[str]:
    """``sync`` or ``async``: the driver ``driven.run`` uses in this test."""
    driven.use(request.param)
    yield request.param
    driven.use("sync")
