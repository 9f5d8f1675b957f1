"""Typed agent state: ``StateSchema``, ``StopReason`` and incremental change tracking.

A ``StateSchema`` records which fields changed since the last :meth:`StateSchema.drain_changes`.
Lists and dicts assigned to a field are adopted as tracked containers: appending to a list or
setting keys of a dict is recorded as a small delta (``extend`` / ``keys``), any other mutation
marks the whole field as replaced (``set``). Nested lists and dicts are adopted too, and a change
inside them marks their top-level field. The engine uses these deltas for the per-step state diff
in traces and sessions use them so storage grows with what is new, not with the whole state.

Adoption copies: after ``state.notes = my_list``, keep using ``state.notes``; later changes to
``my_list`` itself are not seen. Elements that are dataclasses are treated as values: replace them
(``state.items[i] = new``) rather than mutating them in place, or declare them ``frozen=True``.
"""

from __future__ import annotations

import contextlib
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Optional, Self, SupportsIndex, Union

from qitos.core._codec import decode_dataclass, encode_key, encode_value, field_hints, recursion_error
from qitos.core._errors import CodecError, StateValidationError

__all__ = [
    "StateSchema",
    "StopReason",
    "TrackedDict",
    "TrackedList",
    "apply_changes",
]


class StopReason(StrEnum):
    """Why a run ended (or paused). A str Enum: ``StopReason.FINAL == "final"``.

    Running out of steps has one name, ``max_steps_reached``, whichever limit applied (the task's
    budget, the engine's or the state's own ``max_steps``: a run has one step limit).
    ``BUDGET_STEPS`` is the same member under the name earlier versions emitted, and
    ``StopReason("budget_steps")``, the value they stored, reads as ``MAX_STEPS_REACHED``.
    """

    FINAL = "final"
    MAX_STEPS_REACHED = "max_steps_reached"
    BUDGET_STEPS = "max_steps_reached"
    BUDGET_TIME = "budget_time"
    BUDGET_TOKENS = "budget_tokens"
    AGENT_STOP = "agent_stop"
    CRITIC_STOP = "critic_stop"
    ENV_TERMINAL = "env_terminal"
    PAUSED = "paused"
    AWAITING_APPROVAL = "awaiting_approval"
    CANCELLED = "cancelled"
    CANCELLED_IMMEDIATE = "cancelled_immediate"
    TASK_VALIDATION_FAILED = "task_validation_failed"
    CONTEXT_BUDGET_EXCEEDED = "context_budget_exceeded"
    UNRECOVERABLE_ERROR = "unrecoverable_error"

    @classmethod
    def _missing_(cls, value: object) -> StopReason | None:
        # Sessions and traces written before the two names were one say "budget_steps".
        return cls.MAX_STEPS_REACHED if value == _LEGACY_BUDGET_STEPS else None


_LEGACY_BUDGET_STEPS = "budget_steps"


_CONTAINERS = (list, dict)
_object_setattr = object.__setattr__
_SCALARS = frozenset({str, int, float, bool, bytes, type(None)})

# Journal entries per top-level field: ("set",) | ("extend", start_index) | ("keys", set_of_keys)
_SET = ("set",)


class _Tracked:
    """Mixin holding the owner (state, field) and whether this container is nested inside it."""

    _q_owner: StateSchema | None
    _q_field: str
    _q_nested: bool

    def _q_bind(self, owner: StateSchema | None, name: str, nested: bool) -> None:
        self._q_owner = owner
        self._q_field = name
        self._q_nested = nested

    def _q_mark_set(self) -> None:
        owner = self._q_owner
        if owner is not None:
            owner._q_journal()[self._q_field] = _SET


def _adopt(value: object, owner: StateSchema | None, name: str, nested: bool) -> Any:
    """Wrap plain lists/dicts (recursively) as tracked containers bound to ``owner.name``; a cyclic
    or too deeply nested value raises CodecError naming the field (see ``qitos.core._codec``)."""
    try:
        return _adopt_tree(value, owner, name, nested)
    except RecursionError:
        raise recursion_error(value, f"state.{name}") from None


def _adopt_tree(value: object, owner: StateSchema | None, name: str, nested: bool) -> Any:
    if type(value) in _SCALARS:
        return value
    if isinstance(value, _Tracked):
        if value._q_owner is owner and value._q_field == name and value._q_nested == nested:
            return value
        value = list(value) if isinstance(value, list) else dict(typing.cast(dict[Any, Any], value))
    if isinstance(value, list):
        tracked_list = TrackedList(_adopt_tree(v, owner, name, True) for v in value)
        tracked_list._q_bind(owner, name, nested)
        return tracked_list
    if isinstance(value, dict):
        tracked_dict = TrackedDict((k, _adopt_tree(v, owner, name, True)) for k, v in value.items())
        tracked_dict._q_bind(owner, name, nested)
        return tracked_dict
    return value


class TrackedList(list[Any], _Tracked):
    """A list that reports its mutations to the owning state. Appends are cheap deltas."""

    _q_owner = None
    _q_field = ""
    _q_nested = False

    def _q_appending(self) -> None:
        owner = self._q_owner
        if owner is None:
            return
        journal = owner._q_journal()
        if self._q_nested:
            journal[self._q_field] = _SET
        elif self._q_field not in journal:
            journal[self._q_field] = ("extend", len(self))

    def _q_wrap(self, value: Any) -> Any:
        return _adopt(value, self._q_owner, self._q_field, True)

    def append(self, value: Any) -> None:
        owner = self._q_owner
        if owner is not None:
            # Inlined _q_appending: appending is the hot path of most agents' reduce.
            journal = owner.__dict__.get("_q_changes")
            if journal is None:
                journal = owner._q_journal()
            if self._q_nested:
                journal[self._q_field] = _SET
            elif self._q_field not in journal:
                journal[self._q_field] = ("extend", len(self))
            if type(value) not in _SCALARS:
                value = _adopt(value, owner, self._q_field, True)
        list.append(self, value)

    def extend(self, values: Iterable[Any]) -> None:
        self._q_appending()
        super().extend(self._q_wrap(v) for v in values)

    def __iadd__(self, values: Iterable[Any]) -> Self:  # type: ignore[misc]
        self.extend(values)
        return self

    def insert(self, index: SupportsIndex, value: Any) -> None:
        self._q_mark_set()
        super().insert(index, self._q_wrap(value))

    def __setitem__(self, index: Any, value: Any) -> None:
        self._q_mark_set()
        if isinstance(index, slice):
            super().__setitem__(index, [self._q_wrap(v) for v in value])
        else:
            super().__setitem__(index, self._q_wrap(value))

    def __delitem__(self, index: Any) -> None:
        self._q_mark_set()
        super().__delitem__(index)

    def __imul__(self, n: SupportsIndex) -> Self:
        self._q_mark_set()
        return super().__imul__(n)

    def pop(self, index: SupportsIndex = -1) -> Any:
        self._q_mark_set()
        return super().pop(index)

    def remove(self, value: Any) -> None:
        self._q_mark_set()
        super().remove(value)

    def clear(self) -> None:
        self._q_mark_set()
        super().clear()

    def sort(self, *args: Any, **kwargs: Any) -> None:
        self._q_mark_set()
        super().sort(*args, **kwargs)

    def reverse(self) -> None:
        self._q_mark_set()
        super().reverse()


class TrackedDict(dict[Any, Any], _Tracked):
    """A dict that reports its mutations to the owning state. Key writes are cheap deltas."""

    _q_owner = None
    _q_field = ""
    _q_nested = False

    def _q_touch(self, key: Any) -> None:
        owner = self._q_owner
        if owner is None:
            return
        journal = owner._q_journal()
        if self._q_nested:
            journal[self._q_field] = _SET
            return
        entry = journal.get(self._q_field)
        if entry is None:
            journal[self._q_field] = ("keys", {key})
        elif entry[0] == "keys":
            entry[1].add(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._q_touch(key)
        super().__setitem__(key, _adopt(value, self._q_owner, self._q_field, True))

    def __delitem__(self, key: Any) -> None:
        self._q_touch(key)
        super().__delitem__(key)

    def pop(self, key: Any, *default: Any) -> Any:
        if key in self:
            self._q_touch(key)
        return super().pop(key, *default)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __ior__(self, other: Any) -> Self:  # type: ignore[misc]
        self.update(other)
        return self

    def popitem(self) -> tuple[Any, Any]:
        self._q_mark_set()
        return super().popitem()

    def clear(self) -> None:
        self._q_mark_set()
        super().clear()


@dataclass
class StateSchema:
    """Base class of an agent's typed state: the single source of truth during a run.

    Subclass it as a dataclass to add fields. ``max_steps`` must be ``> 0`` and
    ``>= current_step``; violations raise :class:`StateValidationError` naming the field.

    ``str(state)`` (the default model input of ``AgentModule.prepare``) is a readable rendering:
    the task first, then the subclass's own fields that hold something, then the final result if
    one is set; ``repr(state)`` stays the dataclass repr.
    """

    schema_version: int = 1
    task: str = ""
    current_step: int = 0
    max_steps: int = 10
    final_result: Optional[str] = None  # noqa: UP045 - spelled as the state's documented fields are
    stop_reason: Optional[str] = None  # noqa: UP045
    metadata: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)

    _q_validated_fields: ClassVar[frozenset[str]] = frozenset({"max_steps", "current_step"})

    def __post_init__(self) -> None:
        self.validate()

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_q_"):
            _object_setattr(self, name, value)
            return
        if type(value) not in _SCALARS:
            if isinstance(value, _CONTAINERS):
                value = _adopt(value, self, name, False)
            elif isinstance(value, StopReason) and name == "stop_reason":
                value = value.value
        _object_setattr(self, name, value)
        journal = self.__dict__.get("_q_changes")
        if journal is None:
            journal = self._q_journal()
        journal[name] = _SET
        if name in self._q_validated_fields:
            self._validate_steps(partial=True)

    def _q_journal(self) -> dict[str, Any]:
        journal: dict[str, Any] | None = self.__dict__.get("_q_changes")
        if journal is None:
            journal = {}
            object.__setattr__(self, "_q_changes", journal)
        return journal

    def __str__(self) -> str:
        lines = [f"Task: {self.task}" if self.task else "Task: (none)"]
        for name in field_hints(type(self)):
            if name in _BASE_FIELDS:
                continue
            value = getattr(self, name, None)
            if value is None or (isinstance(value, str | list | dict | tuple | set) and not value):
                continue
            lines.append(_render_field(name, value))
        if self.final_result is not None:
            lines.append(f"Final result: {self.final_result}")
        return "\n".join(lines)

    # ---------------------------------------------------------------- validation and control

    def validate(self) -> None:
        """Check the built-in field rules; raise StateValidationError naming the field."""
        self._validate_steps(partial=False)

    def _validate_steps(self, *, partial: bool) -> None:
        values = self.__dict__
        max_steps, current = values.get("max_steps"), values.get("current_step")
        if type(max_steps) is int and type(current) is int and 0 <= current <= max_steps and max_steps > 0:
            return  # the common case, checked cheaply
        if partial and ("max_steps" not in values or "current_step" not in values):
            return  # still inside __init__
        if not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps <= 0:
            raise StateValidationError("max_steps", f"must be an int > 0, got {max_steps!r}")
        if not isinstance(current, int) or isinstance(current, bool) or current < 0:
            raise StateValidationError("current_step", f"must be an int >= 0, got {current!r}")
        if max_steps < current:
            raise StateValidationError("max_steps", f"must be >= current_step ({current}), got {max_steps}")

    def set_stop(self, reason: StopReason | str, final_result: Optional[str] = None) -> None:  # noqa: UP045
        """Stop the run at the next stop check with ``reason`` (a StopReason or its string)."""
        try:
            stop = StopReason(reason)
        except ValueError as exc:
            valid = ", ".join(r.value for r in StopReason)
            raise StateValidationError("stop_reason", f"{reason!r} is not a StopReason ({valid})") from exc
        self.stop_reason = stop.value
        if final_result is not None:
            self.final_result = final_result

    # ---------------------------------------------------------------- codec

    def to_dict(self) -> dict[str, Any]:
        """Encode every field to JSON-native data (strict: raises CodecError with the field path)."""
        hints = field_hints(type(self))
        return {name: encode_value(getattr(self, name), hint, f"state.{name}") for name, hint in hints.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Rebuild a state of this class from :meth:`to_dict` output; the change journal starts empty."""
        state: Self = decode_dataclass(cls, data, "state")
        state._q_journal().clear()
        return state

    # ---------------------------------------------------------------- change tracking

    def drain_changes(self) -> list[dict[str, Any]]:
        """Encoded changes since the last drain, as ops for :func:`apply_changes`; clears the journal.

        Cost is proportional to what changed, not to the size of the state.
        """
        journal = self._q_journal()
        if not journal:
            return []
        hints = _drain_hints(type(self))
        values = self.__dict__
        ops: list[dict[str, Any]] = []
        for name in sorted(journal) if len(journal) > 1 else journal:
            entry = journal[name]
            if name not in hints:
                continue  # a plain attribute, not a dataclass field
            hint, item_hint, key_hint, value_hint = hints[name]
            value = values[name]
            if entry[0] == "extend" and item_hint is not None and isinstance(value, list):
                start = entry[1]
                items = [_encode(v, item_hint, name, start + i) for i, v in enumerate(value[start:])]
                ops.append({"op": "extend", "field": name, "start": start, "items": items})
            elif entry[0] == "keys" and key_hint is not None and isinstance(value, dict):
                # Keys are encoded exactly as to_dict encodes them (an Enum key -> its value, an int -> text).
                path = f"state.{name}"
                put: dict[str, Any] = {}
                removed: list[str] = []
                for key in entry[1]:
                    if key in value:
                        put[encode_key(key, key_hint, path)] = _encode(value[key], value_hint, name, key)
                    else:  # a key that cannot be encoded was never stored, so there is nothing to delete
                        with contextlib.suppress(CodecError):
                            removed.append(encode_key(key, key_hint, path))
                ops.append({"op": "keys", "field": name, "put": dict(sorted(put.items())), "delete": sorted(removed)})
            else:
                ops.append({"op": "set", "field": name, "value": _encode(value, hint, name, None)})
        journal.clear()
        return ops


_BASE_FIELDS = frozenset(
    {"schema_version", "task", "current_step", "max_steps", "final_result", "stop_reason", "metadata", "metrics"}
)


def _render_value(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, StrEnum):
        return value.value
    return repr(value) if not isinstance(value, list | dict | tuple) else _render_container(value)


def _render_container(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_render_value(k)}: {_render_value(v)}" for k, v in value.items()) + "}"
    return "[" + ", ".join(_render_value(v) for v in value) + "]"


def _render_field(name: str, value: object) -> str:
    label = name.replace("_", " ").capitalize()
    if isinstance(value, list | tuple) and any(isinstance(v, str) for v in value):
        return f"{label}:\n" + "\n".join(f"- {_render_value(v)}" for v in value)
    if isinstance(value, dict):
        return f"{label}:\n" + "\n".join(f"- {_render_value(k)}: {_render_value(v)}" for k, v in value.items())
    return f"{label}: {_render_value(value)}"


def apply_changes(data: dict[str, Any], ops: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Apply :meth:`StateSchema.drain_changes` ops to encoded state ``data`` in place; return it."""
    for op in ops:
        name = op["field"]
        kind = op["op"]
        if kind == "set":
            data[name] = op["value"]
        elif kind == "extend":
            current = data.get(name)
            if not isinstance(current, list) or len(current) != op["start"]:
                raise CodecError(f"state.{name}", f"extend at {op['start']} does not follow the stored value")
            current.extend(op["items"])
        elif kind == "keys":
            current = data.get(name)
            if not isinstance(current, dict):
                raise CodecError(f"state.{name}", "key update on a field that is not an object")
            current.update(op["put"])
            for key in op["delete"]:
                current.pop(key, None)
        else:
            raise CodecError(f"state.{name}", f"unknown change op {kind!r}")
    return data


_DRAIN_HINTS: dict[type, dict[str, tuple[Any, Any, Any, Any]]] = {}
_PASSTHROUGH = {str: (str, Any, object), int: (int, float, Any, object), bool: (bool, Any, object)}


def _encode(value: object, hint: object, name: str, key: object) -> Any:
    """encode_value, with the common scalar case answered before any path string is built."""
    accepted = _PASSTHROUGH.get(type(value))
    if accepted is not None and hint in accepted:
        return value
    if value is None:
        return None
    path = f"state.{name}" if key is None else f"state.{name}[{key!r}]"
    return encode_value(value, hint, path)


def _drain_hints(cls: type) -> dict[str, tuple[Any, Any, Any, Any]]:
    """Per field, cached per class: its type hint, then the hints that incremental ops encode with:
    list items (``extend``), dict keys and dict values (``keys``); None where that op does not apply
    and the field is re-encoded whole."""
    cached = _DRAIN_HINTS.get(cls)
    if cached is None:
        cached = {name: _field_plan(h) for name, h in field_hints(cls).items()}
        _DRAIN_HINTS[cls] = cached
    return cached


def _field_plan(hint: object) -> tuple[Any, Any, Any, Any]:
    base = hint
    if typing.get_origin(hint) in (Union, types.UnionType):
        arms = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(arms) != 1:
            return (hint, None, None, None)  # which arm a delta belongs to is not known here
        base = arms[0]
    if base is Any or base is object:
        return (hint, Any, str, Any)  # untyped: JSON-native data with string keys
    container = typing.get_origin(base) or base
    args = typing.get_args(base)
    if container is list:
        return (hint, args[0] if args else Any, None, None)
    if container is dict or container is Mapping:
        return (hint, None, args[0] if args else Any, args[1] if len(args) > 1 else Any)
    return (hint, None, None, None)
