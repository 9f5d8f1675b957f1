"""Decisions: what the agent wants to do next, and what it then observed.

Build decisions with the factories ``Decision.act/final/wait/branch``; they validate their inputs.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, Literal, TypeVar

from qitos.core._errors import UsageError
from qitos.core._tool import ToolResult

__all__ = ["Action", "Decision", "DecisionError", "DecisionMode", "Observation"]

# Generated action ids: a random per-process prefix plus a counter (unique across processes, cheap).
_ID_PREFIX = os.urandom(6).hex()
_ID_COUNTER = itertools.count(1)

DecisionMode = Literal["act", "final", "wait", "branch"]
_MODES = ("act", "final", "wait", "branch")
_NO_META: Mapping[str, Any] = MappingProxyType({})
ActionT = TypeVar("ActionT")


class DecisionError(UsageError, ValueError):
    """A decision was built with missing or invalid parts."""


# The hot-path records below are frozen dataclasses with hand-written __init__s that write the
# instance __dict__ directly: the generated frozen __init__ costs about 2 µs more per object.


@dataclass(frozen=True, init=False)
class Action:
    """One tool call: ``Action(name, args, id)``; ``id`` is generated when absent."""

    name: str
    args: Mapping[str, Any] = field(default_factory=dict)
    id: str = ""

    def __init__(self, name: str, args: Mapping[str, object] | None = None, id: str = "") -> None:
        if not isinstance(name, str) or not name:
            raise DecisionError(f"Action.name must be a non-empty string, got {name!r}")
        values = self.__dict__
        values["name"] = name
        values["args"] = {} if args is None else args
        values["id"] = id or f"call_{_ID_PREFIX}{next(_ID_COUNTER):x}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form."""
        return {"id": self.id, "name": self.name, "args": dict(self.args)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Action:
        """Inverse of :meth:`to_dict`."""
        return cls(name=data["name"], args=dict(data.get("args") or {}), id=data.get("id", ""))


@dataclass(frozen=True, init=False)
class Decision(Generic[ActionT]):
    """The output of one decide phase. Prefer the factories, which validate."""

    mode: DecisionMode
    actions: tuple[Action, ...] = ()
    final_answer: str | None = None
    rationale: str | None = None
    candidates: tuple[Decision[ActionT], ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __init__(
        self,
        mode: DecisionMode,
        actions: tuple[Action, ...] = (),
        final_answer: str | None = None,
        rationale: str | None = None,
        candidates: tuple[Decision[ActionT], ...] = (),
        meta: Mapping[str, object] | None = None,
    ) -> None:
        if mode not in _MODES:
            raise DecisionError(f"Decision.mode must be one of {', '.join(_MODES)}, got {mode!r}")
        if len(actions) > 1:
            _check_unique_ids(actions)
        values = self.__dict__
        values["mode"] = mode
        values["actions"] = actions
        values["final_answer"] = final_answer
        values["rationale"] = rationale
        values["candidates"] = candidates
        values["meta"] = _NO_META if meta is None else meta

    @classmethod
    def act(
        cls, actions: Iterable[Action], rationale: str | None = None, *, meta: Mapping[str, Any] | None = None
    ) -> Decision[ActionT]:
        """Run one or more tool actions."""
        items = tuple(actions)
        if not items:
            raise DecisionError("Decision.act needs at least one Action")
        for item in items:
            if type(item) is not Action and not isinstance(item, Action):
                raise DecisionError(f"Decision.act takes Action objects, got {type(item).__name__}")
        return cls("act", items, None, rationale, (), None if meta is None else dict(meta))

    @classmethod
    def final(
        cls, answer: str, rationale: str | None = None, *, meta: Mapping[str, Any] | None = None
    ) -> Decision[ActionT]:
        """Finish the run with ``answer``."""
        if not isinstance(answer, str) or not answer.strip():
            raise DecisionError("Decision.final needs a non-empty answer string")
        return cls("final", (), answer, rationale, (), None if meta is None else dict(meta))

    @classmethod
    def wait(cls, rationale: str | None = None, *, meta: Mapping[str, Any] | None = None) -> Decision[ActionT]:
        """Take no action this step."""
        return cls("wait", (), None, rationale, (), None if meta is None else dict(meta))

    @classmethod
    def branch(
        cls,
        candidates: Iterable[Decision[ActionT]],
        rationale: str | None = None,
        *,
        meta: Mapping[str, Any] | None = None,
    ) -> Decision[ActionT]:
        """Propose several candidate decisions for a BranchSelector to choose from."""
        items = tuple(candidates)
        if not items:
            raise DecisionError("Decision.branch needs at least one candidate")
        for item in items:
            if not isinstance(item, Decision):
                raise DecisionError(f"Decision.branch takes Decision candidates, got {type(item).__name__}")
        return cls("branch", (), None, rationale, items, None if meta is None else dict(meta))

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form (meta must be JSON-native)."""
        data: dict[str, Any] = {"mode": self.mode}
        if self.actions:
            data["actions"] = [a.to_dict() for a in self.actions]
        if self.final_answer is not None:
            data["final_answer"] = self.final_answer
        if self.rationale is not None:
            data["rationale"] = self.rationale
        if self.candidates:
            data["candidates"] = [c.to_dict() for c in self.candidates]
        if self.meta:
            data["meta"] = dict(self.meta)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision[Any]:
        """Inverse of :meth:`to_dict`."""
        return cls(
            data["mode"],
            actions=tuple(Action.from_dict(a) for a in data.get("actions", ())),
            final_answer=data.get("final_answer"),
            rationale=data.get("rationale"),
            candidates=tuple(cls.from_dict(c) for c in data.get("candidates", ())),
            meta=dict(data.get("meta") or {}),
        )


def _check_unique_ids(actions: tuple[Action, ...]) -> None:
    """Each call of a decision is recorded, resumed and answered by its id: two calls may not share one."""
    seen: set[str] = set()
    for action in actions:
        if action.id in seen:
            names = [a.name for a in actions if a.id == action.id]
            raise DecisionError(
                f"Decision.act: action id {action.id!r} is used by more than one call ({', '.join(names)}); "
                "every call of a decision needs its own id"
            )
        seen.add(action.id)


@dataclass(frozen=True, init=False)
class Observation:
    """What the agent observed after a step: tool results, an environment observation, feedback.

    ``feedback`` carries engine messages the agent should react to: a model output that could not
    be parsed (with repair advice), a critic's retry reason, or an interrupted tool call.
    """

    results: tuple[ToolResult, ...] = ()
    env: Any = None
    feedback: str | None = None

    def __init__(self, results: tuple[ToolResult, ...] = (), env: object = None, feedback: str | None = None) -> None:
        values = self.__dict__
        values["results"] = results
        values["env"] = env
        values["feedback"] = feedback

    @property
    def ok(self) -> bool:
        """True when every tool call succeeded and there is no feedback."""
        return self.feedback is None and all(r.ok for r in self.results)

    @property
    def outputs(self) -> list[Any]:
        """The outputs of the tool calls, in call order (errors as their text)."""
        return [r.output if r.ok else r.as_text() for r in self.results]

    def result(self, call_id: str) -> ToolResult | None:
        """The result of one call, by id."""
        return next((r for r in self.results if r.call_id == call_id), None)

    def __iter__(self) -> Any:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form for traces."""
        data: dict[str, Any] = {"results": [r.to_dict() for r in self.results]}
        if self.feedback is not None:
            data["feedback"] = self.feedback
        if self.env is not None:
            data["env"] = self.env if isinstance(self.env, str | int | float | bool) else repr(self.env)
        return data
