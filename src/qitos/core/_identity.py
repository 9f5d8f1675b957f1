"""Typed identities: sessions, runs, agents, snapshots, work items and attempts.

Each is its own frozen type with a ``.value`` string, so a run id can never be passed where a
session id is expected. ``new()`` makes a fresh random identity with a readable prefix;
``SnapshotIdentity`` is instead the SHA-256 of the snapshot's canonical content.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar, Self

__all__ = [
    "AgentIdentity",
    "AttemptIdentity",
    "RunIdentity",
    "SessionIdentity",
    "SnapshotIdentity",
    "WorkItemIdentity",
    "new_id",
]


def new_id(prefix: str) -> str:
    """A fresh random identifier ``<prefix>_<24 hex digits>`` (96 random bits)."""
    return f"{prefix}_{os.urandom(12).hex()}"


@dataclass(frozen=True, slots=True)
class _Identity:
    value: str
    prefix: ClassVar[str] = "id"

    def __post_init__(self) -> None:
        if not isinstance(self.value, str) or not self.value:
            raise ValueError(f"{type(self).__name__}.value must be a non-empty string, got {self.value!r}")

    @classmethod
    def new(cls) -> Self:
        """A fresh random identity of this kind."""
        return cls(new_id(cls.prefix))

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class SessionIdentity(_Identity):
    """A durable session: outlives runs and processes."""

    prefix: ClassVar[str] = "ses"


@dataclass(frozen=True, slots=True)
class RunIdentity(_Identity):
    """One ``run()`` of a session or agent."""

    prefix: ClassVar[str] = "run"


@dataclass(frozen=True, slots=True)
class AgentIdentity(_Identity):
    """The agent (module class) that a session runs."""

    prefix: ClassVar[str] = "agt"


@dataclass(frozen=True, slots=True)
class SnapshotIdentity(_Identity):
    """An immutable step-boundary snapshot; the value is the SHA-256 of its canonical content."""

    prefix: ClassVar[str] = "snap"


@dataclass(frozen=True, slots=True)
class WorkItemIdentity(_Identity):
    """A unit of work inside a session (a step or a tool call)."""

    prefix: ClassVar[str] = "work"


@dataclass(frozen=True, slots=True)
class AttemptIdentity(_Identity):
    """One attempt at a work item (a retry after a crash is a new attempt)."""

    prefix: ClassVar[str] = "att"
