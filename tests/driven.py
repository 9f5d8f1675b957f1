"""Run an Engine or a Session through the driver a test is parametrised with (sync or async).

Behavioural tests call ``driven.run(engine, task, ...)`` / ``driven.run(session, ...)`` instead of
``.run(...)``; the ``driver`` fixture (``tests/engine/conftest.py``) runs each such test once with
the synchronous driver (``run``) and once with the async driver (``asyncio.run(x.arun(...))``), so
one behavioural suite covers both without a copy.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["DRIVERS", "current", "run", "use"]

DRIVERS = ("sync", "async")
_mode = ["sync"]


def use(mode: str) -> None:
    """Select the driver for the following ``run`` calls."""
    if mode not in DRIVERS:
        raise ValueError(f"unknown driver {mode!r}")
    _mode[0] = mode


def current() -> str:
    """The driver in use."""
    return _mode[0]


def run(target: Any, *args: Any, **kwargs: Any) -> Any:
    """``target.run(...)`` with the sync driver, ``asyncio.run(target.arun(...))`` with the async one."""
    if _mode[0] == "sync":
        return target.run(*args, **kwargs)
    return asyncio.run(target.arun(*args, **kwargs))
