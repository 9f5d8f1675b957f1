"""Declarative context policy: ``validate``, ``reduce`` and ``audit``, a policy written as data.

A policy is a plain mapping with camelCase keys (its JSON form), or the equivalent dataclasses::

    {"mode": "validate"}
    {"mode": "reduce", "triggerChars": 1800, "targetInputChars": 1500,
     "selection": {"mode": "sequence"},
     "steps": [{"id": "recent-history", "kind": "trim", "fragmentId": "history", "field": "messages",
                "grouping": {"kind": "user-turn"}, "keepGroups": 2, "targetChars": 1000}]}
    {"mode": "audit", "mutableFragmentIds": ["history"]}

Policies act on *fragments*: ``{"id": str, "value": <JSON>}``. A fragment's size is the length of
its value's canonical JSON (tokens: the token count of that text).

- ``validate`` changes nothing: the input must come out exactly as it went in.
- ``reduce`` fires when a trigger (``triggerChars`` / ``triggerTokens``) is exceeded (without
  triggers: when a target is exceeded) and runs its steps in sequence until the targets
  (``targetInputChars`` / ``targetInputTokens``; without targets: the triggers) are met. A ``trim``
  step drops the oldest ``user-turn`` groups of ``fragment.value[field]`` (a group starts at each
  ``user`` message; messages before the first one are kept), keeping at least ``keepGroups``
  groups, until the fragment is within ``targetChars`` or the overall target is met. Targets that
  cannot be met raise :class:`ContextPolicyViolation` carrying the receipt.
- ``audit`` changes nothing and checks that only ``mutableFragmentIds`` changed value between two
  inputs (fragments added or removed count as changed): it guards prompt-cache-friendly prefixes.

``validate_context_policy(policy, before, after)`` checks a policy (errors name the path, e.g.
``policy.steps[0].keepGroups``) and, given fragments, that ``after`` is an effect the policy
allows from ``before``. ``reduce_context`` and ``audit_context`` return a
:class:`ContextPolicyReceipt` (what fired, sizes before and after, each step's effect, what
changed). ``apply_context_policy(policy, view, previous=...)`` runs a policy over a
:class:`~qitos.core.request_view.RequestView` whose fragments are ``instructions``, ``tools``,
``context`` and ``history`` (``history.messages`` is the only trimmable field; trimming omits whole
exchanges, never protected ones, through a :class:`~qitos.core.request_view.CompactionReceipt`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any, Literal

from qitos.core._codec import canonical_json, sha256_hex
from qitos.core._errors import ConfigurationError, ContextError
from qitos.core.context import UnitCounter, unit_counter_for
from qitos.core.request_view import CompactionReceipt, RequestView, projection_digest

__all__ = [
    "ContextPolicy",
    "ContextPolicyError",
    "ContextPolicyReceipt",
    "ContextPolicyViolation",
    "apply_context_policy",
    "audit_context",
    "parse_context_policy",
    "reduce_context",
    "validate_context_policy",
]

REQUEST_FRAGMENT_IDS = ("instructions", "tools", "context", "history")
_REDUCE_POLICY_ID = "qitos.context_policy.reduce/v1"


class ContextPolicyError(ConfigurationError, ValueError):
    """A policy or fragment list is malformed. ``path`` names where (``policy.steps[0].kind``)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.path, self.message))


class ContextPolicyViolation(ContextError):
    """Fragments break what the policy allows, or a reduction cannot reach its target.
    ``path`` names the offending place; ``receipt`` is set when a reduction ran."""

    def __init__(self, path: str, message: str, receipt: ContextPolicyReceipt | None = None) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message
        self.receipt = receipt

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.path, self.message, self.receipt))


# --------------------------------------------------------------------------- policy shapes


@dataclass(frozen=True, kw_only=True)
class ValidatePolicy:
    """Check only; change nothing."""

    mode: Literal["validate"] = "validate"


@dataclass(frozen=True, kw_only=True)
class UserTurnGrouping:
    """Groups start at each ``user`` message."""

    kind: Literal["user-turn"] = "user-turn"


@dataclass(frozen=True, kw_only=True)
class SequenceSelection:
    """Run the steps in their declared order."""

    mode: Literal["sequence"] = "sequence"


@dataclass(frozen=True, kw_only=True)
class TrimReduction:
    """Drop the oldest groups of ``fragment.value[field]``, keeping at least ``keep_groups``."""

    id: str
    fragment_id: str
    field: str
    grouping: UserTurnGrouping = dc_field(default_factory=UserTurnGrouping)
    keep_groups: int = 1
    target_chars: int | None = None
    kind: Literal["trim"] = "trim"


@dataclass(frozen=True, kw_only=True)
class ReducePolicy:
    """Reduce content when a trigger is exceeded (see the module docstring)."""

    steps: tuple[TrimReduction, ...]
    trigger_chars: int | None = None
    target_input_chars: int | None = None
    trigger_tokens: int | None = None
    target_input_tokens: int | None = None
    selection: SequenceSelection = dc_field(default_factory=SequenceSelection)
    mode: Literal["reduce"] = "reduce"


@dataclass(frozen=True, kw_only=True)
class AuditPolicy:
    """Verify that only the listed fragments changed value, without reducing anything."""

    mutable_fragment_ids: tuple[str, ...]
    mode: Literal["audit"] = "audit"


ContextPolicy = ValidatePolicy | ReducePolicy | AuditPolicy


@dataclass(frozen=True, kw_only=True)
class ContextFragment:
    """One named piece of model input. ``value`` is JSON-native."""

    id: str
    value: Any


@dataclass(frozen=True, kw_only=True)
class StepEffect:
    """What one reduction step did."""

    step_id: str
    kind: str
    fragment_id: str
    applied: bool
    groups_before: int = 0
    groups_after: int = 0
    removed_items: int = 0
    chars_before: int = 0
    chars_after: int = 0
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form (camelCase, like the TypeScript receipts)."""
        return {
            "stepId": self.step_id,
            "kind": self.kind,
            "fragmentId": self.fragment_id,
            "applied": self.applied,
            "groupsBefore": self.groups_before,
            "groupsAfter": self.groups_after,
            "removedItems": self.removed_items,
            "charsBefore": self.chars_before,
            "charsAfter": self.chars_after,
            "reason": self.reason,
        }


@dataclass(frozen=True, kw_only=True)
class ContextPolicyReceipt:
    """What a policy did: whether it fired and why, sizes before and after, steps, changes."""

    mode: str
    fired: bool
    trigger: str | None
    chars_before: int
    chars_after: int
    tokens_before: int | None = None
    tokens_after: int | None = None
    target_reached: bool | None = None
    steps: tuple[StepEffect, ...] = ()
    changed_fragment_ids: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form (camelCase, like the TypeScript receipts)."""
        return {
            "mode": self.mode,
            "fired": self.fired,
            "trigger": self.trigger,
            "charsBefore": self.chars_before,
            "charsAfter": self.chars_after,
            "tokensBefore": self.tokens_before,
            "tokensAfter": self.tokens_after,
            "targetReached": self.target_reached,
            "steps": [s.to_dict() for s in self.steps],
            "changedFragmentIds": list(self.changed_fragment_ids),
        }


@dataclass(frozen=True, kw_only=True)
class ContextPolicyResult:
    """Reduced fragments and the receipt."""

    fragments: tuple[ContextFragment, ...]
    receipt: ContextPolicyReceipt


# --------------------------------------------------------------------------- parsing


def _keys(value: object, path: str, allowed: set[str], required: set[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ContextPolicyError(path, f"expected an object, got {type(value).__name__}")
    for key in value:
        if key not in allowed:
            raise ContextPolicyError(f"{path}.{key}", f"unknown field (allowed: {', '.join(sorted(allowed))})")
    for key in sorted(required):
        if key not in value:
            raise ContextPolicyError(f"{path}.{key}", "is required")
    return value


def _count(value: object, path: str, *, minimum: int = 1) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ContextPolicyError(path, f"must be an integer >= {minimum}, got {value!r}")
    return value


def _text(value: object, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise ContextPolicyError(path, f"must be a non-empty string, got {value!r}")
    return value


def parse_context_policy(value: object, path: str = "policy") -> ContextPolicy:
    """A policy from its mapping form (camelCase keys) or a policy dataclass, checked."""
    if isinstance(value, ValidatePolicy | ReducePolicy | AuditPolicy):
        value = context_policy_to_dict(value)
    if not isinstance(value, Mapping):
        raise ContextPolicyError(path, f"expected a policy object, got {type(value).__name__}")
    mode = value.get("mode")
    if mode == "validate":
        _keys(value, path, {"mode"}, {"mode"})
        return ValidatePolicy()
    if mode == "audit":
        _keys(value, path, {"mode", "mutableFragmentIds"}, {"mode", "mutableFragmentIds"})
        ids = value["mutableFragmentIds"]
        if isinstance(ids, str) or not isinstance(ids, Sequence):
            raise ContextPolicyError(f"{path}.mutableFragmentIds", "must be a list of fragment ids")
        seen: set[str] = set()
        for i, fid in enumerate(ids):
            _text(fid, f"{path}.mutableFragmentIds[{i}]")
            if fid in seen:
                raise ContextPolicyError(f"{path}.mutableFragmentIds[{i}]", f"duplicate fragment id {fid!r}")
            seen.add(fid)
        return AuditPolicy(mutable_fragment_ids=tuple(ids))
    if mode == "reduce":
        allowed = {
            "mode",
            "triggerChars",
            "targetInputChars",
            "triggerTokens",
            "targetInputTokens",
            "selection",
            "steps",
        }
        _keys(value, path, allowed, {"mode", "steps"})
        numbers = {k: _count(value.get(k), f"{path}.{k}") for k in sorted(allowed - {"mode", "selection", "steps"})}
        for trigger, target in (("triggerChars", "targetInputChars"), ("triggerTokens", "targetInputTokens")):
            t, g = numbers[trigger], numbers[target]
            if t is not None and g is not None and g > t:
                raise ContextPolicyError(f"{path}.{target}", f"must not exceed {trigger} ({g} > {t})")
        selection = value.get("selection", {"mode": "sequence"})
        _keys(selection, f"{path}.selection", {"mode"}, {"mode"})
        if selection["mode"] != "sequence":
            raise ContextPolicyError(f"{path}.selection.mode", f"must be 'sequence', got {selection['mode']!r}")
        steps = value["steps"]
        if isinstance(steps, str) or not isinstance(steps, Sequence) or not steps:
            raise ContextPolicyError(f"{path}.steps", "must be a non-empty list of reduction steps")
        parsed: list[TrimReduction] = []
        for i, step in enumerate(steps):
            parsed.append(_parse_step(step, f"{path}.steps[{i}]"))
            if parsed[-1].id in {s.id for s in parsed[:-1]}:
                raise ContextPolicyError(f"{path}.steps[{i}].id", f"duplicate step id {parsed[-1].id!r}")
        return ReducePolicy(
            steps=tuple(parsed),
            trigger_chars=numbers["triggerChars"],
            target_input_chars=numbers["targetInputChars"],
            trigger_tokens=numbers["triggerTokens"],
            target_input_tokens=numbers["targetInputTokens"],
        )
    raise ContextPolicyError(f"{path}.mode", f"must be 'validate', 'reduce' or 'audit', got {mode!r}")


def _parse_step(step: Any, path: str) -> TrimReduction:
    allowed = {"id", "kind", "fragmentId", "field", "grouping", "keepGroups", "targetChars"}
    _keys(step, path, allowed, {"id", "kind", "fragmentId", "field", "grouping"})
    if step["kind"] != "trim":
        raise ContextPolicyError(f"{path}.kind", f"unsupported reduction kind {step['kind']!r} (supported: 'trim')")
    grouping = _keys(step["grouping"], f"{path}.grouping", {"kind"}, {"kind"})
    if grouping["kind"] != "user-turn":
        raise ContextPolicyError(f"{path}.grouping.kind", f"must be 'user-turn', got {grouping['kind']!r}")
    keep = _count(step.get("keepGroups", 1), f"{path}.keepGroups", minimum=0)
    return TrimReduction(
        id=_text(step["id"], f"{path}.id"),
        fragment_id=_text(step["fragmentId"], f"{path}.fragmentId"),
        field=_text(step["field"], f"{path}.field"),
        keep_groups=1 if keep is None else keep,
        target_chars=_count(step.get("targetChars"), f"{path}.targetChars"),
    )


def context_policy_to_dict(policy: ContextPolicy) -> dict[str, Any]:
    """The mapping form (camelCase keys) of a policy dataclass."""
    if isinstance(policy, ValidatePolicy):
        return {"mode": "validate"}
    if isinstance(policy, AuditPolicy):
        return {"mode": "audit", "mutableFragmentIds": list(policy.mutable_fragment_ids)}
    out: dict[str, Any] = {"mode": "reduce"}
    for key, attr in (
        ("triggerChars", policy.trigger_chars),
        ("targetInputChars", policy.target_input_chars),
        ("triggerTokens", policy.trigger_tokens),
        ("targetInputTokens", policy.target_input_tokens),
    ):
        if attr is not None:
            out[key] = attr
    out["selection"] = {"mode": policy.selection.mode}
    out["steps"] = [
        {
            "id": s.id,
            "kind": s.kind,
            "fragmentId": s.fragment_id,
            "field": s.field,
            "grouping": {"kind": s.grouping.kind},
            "keepGroups": s.keep_groups,
            **({"targetChars": s.target_chars} if s.target_chars is not None else {}),
        }
        for s in policy.steps
    ]
    return out


def _fragments(values: Sequence[Any], path: str) -> tuple[ContextFragment, ...]:
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise ContextPolicyError(path, "must be a list of fragments")
    out: list[ContextFragment] = []
    seen: set[str] = set()
    for i, value in enumerate(values):
        if isinstance(value, ContextFragment):
            value = {"id": value.id, "value": value.value}
        _keys(value, f"{path}[{i}]", {"id", "value"}, {"id", "value"})
        fid = _text(value["id"], f"{path}[{i}].id")
        if fid in seen:
            raise ContextPolicyError(f"{path}[{i}].id", f"duplicate fragment id {fid!r}")
        seen.add(fid)
        try:
            canonical_json(value["value"])
        except (TypeError, ValueError) as exc:
            raise ContextPolicyError(f"{path}[{i}].value", f"not JSON-native ({exc})") from exc
        out.append(ContextFragment(id=fid, value=value["value"]))
    return tuple(out)


# --------------------------------------------------------------------------- sizes and groups


def _chars(fragments: Sequence[ContextFragment]) -> int:
    return sum(len(canonical_json(f.value)) for f in fragments)


def _tokens(fragments: Sequence[ContextFragment], counter: UnitCounter | None) -> int | None:
    return None if counter is None else sum(counter.count(canonical_json(f.value)) for f in fragments)


def _user_turn_starts(messages: Sequence[object]) -> list[int]:
    return [i for i, m in enumerate(messages) if isinstance(m, Mapping) and m.get("role") == "user"]


def _field_list(fragment: ContextFragment, step: TrimReduction, path: str) -> list[Any]:
    value = fragment.value
    if not isinstance(value, Mapping) or not isinstance(value.get(step.field), list):
        raise ContextPolicyError(path, f"fragment {fragment.id!r} has no list field {step.field!r} to trim")
    return list(value[step.field])


# --------------------------------------------------------------------------- reduce


def reduce_context(
    policy: object,
    fragments: Sequence[object],
    *,
    token_counter: UnitCounter | None = None,
    _boundaries: Callable[[list[Any]], tuple[list[int], int]] | None = None,
) -> ContextPolicyResult:
    """Run a reduce policy over fragments; other modes return the fragments unchanged."""
    parsed = parse_context_policy(policy)
    items = _fragments(fragments, "fragments")
    if not isinstance(parsed, ReducePolicy):
        size = _chars(items)
        return ContextPolicyResult(
            fragments=items,
            receipt=ContextPolicyReceipt(
                mode=parsed.mode, fired=False, trigger=None, chars_before=size, chars_after=size
            ),
        )
    uses_tokens = parsed.trigger_tokens is not None or parsed.target_input_tokens is not None
    counter = (token_counter or unit_counter_for("tokens")) if uses_tokens else None
    by_id = {f.id: i for i, f in enumerate(items)}
    for i, step in enumerate(parsed.steps):
        if step.fragment_id not in by_id:
            raise ContextPolicyError(f"policy.steps[{i}].fragmentId", f"no fragment {step.fragment_id!r} in the input")
    chars0, tokens0 = _chars(items), _tokens(items, counter)

    def over(chars: int, tokens: int | None, char_limit: int | None, token_limit: int | None) -> str | None:
        if char_limit is not None and chars > char_limit:
            return "triggerChars" if char_limit == parsed.trigger_chars else "targetInputChars"
        if token_limit is not None and tokens is not None and tokens > token_limit:
            return "triggerTokens" if token_limit == parsed.trigger_tokens else "targetInputTokens"
        return None

    has_trigger = parsed.trigger_chars is not None or parsed.trigger_tokens is not None
    has_target = parsed.target_input_chars is not None or parsed.target_input_tokens is not None
    target_chars = parsed.target_input_chars if has_target else parsed.trigger_chars
    target_tokens = parsed.target_input_tokens if has_target else parsed.trigger_tokens
    if has_trigger:
        trigger = over(chars0, tokens0, parsed.trigger_chars, parsed.trigger_tokens)
    elif has_target:
        trigger = over(chars0, tokens0, target_chars, target_tokens)
    else:
        trigger = "always"
    if trigger is None:
        receipt = ContextPolicyReceipt(
            mode="reduce",
            fired=False,
            trigger=None,
            chars_before=chars0,
            chars_after=chars0,
            tokens_before=tokens0,
            tokens_after=tokens0,
            target_reached=True,
            steps=tuple(
                StepEffect(step_id=s.id, kind=s.kind, fragment_id=s.fragment_id, applied=False, reason="not fired")
                for s in parsed.steps
            ),
        )
        return ContextPolicyResult(fragments=items, receipt=receipt)

    current = list(items)

    def reached() -> bool:
        if target_chars is None and target_tokens is None:
            return False
        return over(_chars(current), _tokens(current, counter), target_chars, target_tokens) is None

    effects: list[StepEffect] = []
    for i, step in enumerate(parsed.steps):
        index = by_id[step.fragment_id]
        fragment = current[index]
        messages = _field_list(fragment, step, f"policy.steps[{i}].field")
        starts, floor = _boundaries(messages) if _boundaries else (_user_turn_starts(messages), len(messages))
        fchars0 = len(canonical_json(fragment.value))
        if reached():
            effects.append(
                StepEffect(
                    step_id=step.id,
                    kind=step.kind,
                    fragment_id=step.fragment_id,
                    applied=False,
                    groups_before=len(starts),
                    groups_after=len(starts),
                    chars_before=fchars0,
                    chars_after=fchars0,
                    reason="target already reached",
                )
            )
            continue
        dropped_groups = 0
        groups = len(starts)
        reason = "keepGroups reached"
        while groups - dropped_groups > step.keep_groups:
            cut_to = starts[dropped_groups + 1] if dropped_groups + 1 < groups else len(messages)
            if cut_to > floor:
                reason = "protected items reached"
                break
            fvalue = dict(fragment.value)
            fvalue[step.field] = messages[: starts[0]] + messages[cut_to:]
            current[index] = ContextFragment(id=fragment.id, value=fvalue)
            dropped_groups += 1
            fchars = len(canonical_json(fvalue))
            if reached():
                reason = "target reached"
                break
            if step.target_chars is not None and fchars <= step.target_chars:
                reason = "targetChars reached"
                break
        final = current[index]
        removed = len(messages) - len(final.value[step.field]) if dropped_groups else 0
        effects.append(
            StepEffect(
                step_id=step.id,
                kind=step.kind,
                fragment_id=step.fragment_id,
                applied=dropped_groups > 0,
                groups_before=groups,
                groups_after=groups - dropped_groups,
                removed_items=removed,
                chars_before=fchars0,
                chars_after=len(canonical_json(final.value)),
                reason=reason,
            )
        )
    chars1, tokens1 = _chars(current), _tokens(current, counter)
    ok = (target_chars is None and target_tokens is None) or reached()
    receipt = ContextPolicyReceipt(
        mode="reduce",
        fired=True,
        trigger=trigger,
        chars_before=chars0,
        chars_after=chars1,
        tokens_before=tokens0,
        tokens_after=tokens1,
        target_reached=ok,
        steps=tuple(effects),
        changed_fragment_ids=tuple(f.id for f, g in zip(items, current, strict=True) if f is not g),
    )
    if not ok:
        wanted = (
            f"targetInputChars={target_chars}" if target_chars is not None else f"targetInputTokens={target_tokens}"
        )
        raise ContextPolicyViolation(
            "policy",
            f"reduce could not reach {wanted}: {chars1} characters"
            + ("" if tokens1 is None else f" / {tokens1} tokens")
            + " after every step",
            receipt,
        )
    return ContextPolicyResult(fragments=tuple(current), receipt=receipt)


# --------------------------------------------------------------------------- audit and validate


def _changed(before: Sequence[ContextFragment], after: Sequence[ContextFragment]) -> list[tuple[str, str]]:
    """(fragment id, path) of every fragment whose value differs, or that was added or removed."""
    old = {f.id: (i, f) for i, f in enumerate(before)}
    new = {f.id: (i, f) for i, f in enumerate(after)}
    out: list[tuple[str, str]] = []
    for fid, (i, f) in new.items():
        if fid not in old:
            out.append((fid, f"after[{i}]"))
        elif canonical_json(old[fid][1].value) != canonical_json(f.value):
            out.append((fid, f"after[{i}].value"))
    out.extend((fid, f"before[{i}]") for fid, (i, _) in old.items() if fid not in new)
    return out


def audit_context(policy: object, before: Sequence[object], after: Sequence[object]) -> ContextPolicyReceipt:
    """Check that only the audit policy's mutable fragments changed; raise a violation otherwise."""
    parsed = parse_context_policy(policy)
    if not isinstance(parsed, AuditPolicy):
        raise ContextPolicyError("policy.mode", f"audit_context needs an audit policy, got {parsed.mode!r}")
    old, new = _fragments(before, "before"), _fragments(after, "after")
    changed = _changed(old, new)
    for fid, path in changed:
        if fid not in parsed.mutable_fragment_ids:
            raise ContextPolicyViolation(
                path, f"fragment {fid!r} changed but is not in mutableFragmentIds {list(parsed.mutable_fragment_ids)}"
            )
    return ContextPolicyReceipt(
        mode="audit",
        fired=bool(changed),
        trigger=None,
        chars_before=_chars(old),
        chars_after=_chars(new),
        changed_fragment_ids=tuple(fid for fid, _ in changed),
    )


def validate_context_policy(policy: object, before: Sequence[object], after: Sequence[object]) -> ContextPolicyReceipt:
    """Check a policy's shape and, given fragments, that ``after`` is an effect it allows from
    ``before``. Raises :class:`ContextPolicyError` (shape) or :class:`ContextPolicyViolation`."""
    parsed = parse_context_policy(policy)
    old, new = _fragments(before, "before"), _fragments(after, "after")
    if isinstance(parsed, AuditPolicy):
        return audit_context(parsed, old, new)
    changed = _changed(old, new)
    if isinstance(parsed, ValidatePolicy):
        if changed or [f.id for f in old] != [f.id for f in new]:
            fid, path = changed[0] if changed else (new[0].id, "after")
            raise ContextPolicyViolation(
                path, f"fragment {fid!r} changed under a validate policy, which changes nothing"
            )
        size = _chars(old)
        return ContextPolicyReceipt(mode="validate", fired=False, trigger=None, chars_before=size, chars_after=size)
    # reduce: only trimmed fields of targeted fragments may change, by dropping leading groups.
    targets: dict[str, list[tuple[int, TrimReduction]]] = {}
    for i, step in enumerate(parsed.steps):
        targets.setdefault(step.fragment_id, []).append((i, step))
    if old or new:
        for i, step in enumerate(parsed.steps):
            if step.fragment_id not in {f.id for f in old}:
                raise ContextPolicyError(f"policy.steps[{i}].fragmentId", f"no fragment {step.fragment_id!r} in before")
    after_by_id = {f.id: (i, f) for i, f in enumerate(new)}
    for fid, path in changed:
        if fid not in targets or path.startswith("before") or not path.endswith(".value"):
            raise ContextPolicyViolation(path, f"fragment {fid!r} is not reduced by any step and must not change")
        j, fragment = after_by_id[fid]
        original = next(f for f in old if f.id == fid)
        _check_trim(original, fragment, targets[fid], f"after[{j}].value")
    return ContextPolicyReceipt(
        mode="reduce",
        fired=bool(changed),
        trigger=None,
        chars_before=_chars(old),
        chars_after=_chars(new),
        changed_fragment_ids=tuple(fid for fid, _ in changed),
    )


def _check_trim(
    before: ContextFragment, after: ContextFragment, steps: list[tuple[int, TrimReduction]], path: str
) -> None:
    if not isinstance(after.value, Mapping) or not isinstance(before.value, Mapping):
        raise ContextPolicyViolation(path, f"fragment {after.id!r} must stay an object")
    fields = {step.field for _, step in steps}
    for key in set(before.value) | set(after.value):
        if key not in fields and canonical_json(before.value.get(key)) != canonical_json(after.value.get(key)):
            raise ContextPolicyViolation(f"{path}.{key}", "only the trimmed field may change")
    for i, step in steps:
        old = _field_list(before, step, f"policy.steps[{i}].field")
        new = after.value.get(step.field)
        if not isinstance(new, list):
            raise ContextPolicyViolation(f"{path}.{step.field}", "must stay a list")
        starts = _user_turn_starts(old)
        preamble = old[: starts[0]] if starts else old
        allowed = [preamble + old[s:] for s in starts] + [old]
        allowed_json = {canonical_json(a) for a in allowed}
        if canonical_json(new) not in allowed_json:
            raise ContextPolicyViolation(
                f"{path}.{step.field}", "is not the original with whole leading user-turn groups removed"
            )
        kept = len(_user_turn_starts(new))
        if kept < min(step.keep_groups, len(starts)):
            raise ContextPolicyViolation(
                f"{path}.{step.field}", f"keeps {kept} user-turn group(s), fewer than keepGroups={step.keep_groups}"
            )


# --------------------------------------------------------------------------- request views


def request_fragments(view: RequestView) -> tuple[ContextFragment, ...]:
    """A RequestView as fragments: instructions, tools, context, history. Secret contributions
    appear by digest only, so audits can compare them without exposing them."""
    context: list[Any] = []
    for text in view.context_json:
        record = _loads(text)
        if record.get("sensitivity") == "secret":
            context.append({"role": record["message"]["role"], "secret_digest": record.get("digest")})
        else:
            context.append(record["message"])
    messages = view.messages()
    n_instr = len(view.instructions_json)
    return (
        ContextFragment(id="instructions", value={"messages": messages[:n_instr]}),
        ContextFragment(id="tools", value={"tools": view.tools()}),
        ContextFragment(id="context", value={"messages": context}),
        ContextFragment(id="history", value={"messages": [_loads(t) for t in view.selected_items_json]}),
    )


def _loads(text: str) -> Any:
    return json.loads(text)


def apply_context_policy(
    policy: object,
    view: RequestView,
    *,
    previous: RequestView | None = None,
    token_counter: UnitCounter | None = None,
) -> tuple[RequestView, ContextPolicyReceipt]:
    """Run a policy over a request. ``validate`` returns it unchanged; ``audit`` compares it with
    ``previous`` (required); ``reduce`` may trim ``history.messages`` by whole user-turn groups of
    exchanges, never protected ones, returning a new view that carries a compaction receipt."""
    parsed = parse_context_policy(policy)
    fragments = request_fragments(view)
    if isinstance(parsed, ValidatePolicy):
        return view, validate_context_policy(parsed, fragments, fragments)
    if isinstance(parsed, AuditPolicy):
        if previous is None:
            raise ContextPolicyError("previous", "an audit compares two requests; pass the previous RequestView")
        return view, audit_context(parsed, request_fragments(previous), fragments)
    for i, step in enumerate(parsed.steps):
        if step.fragment_id != "history" or step.field != "messages":
            raise ContextPolicyError(
                f"policy.steps[{i}]", "a RequestView can only trim fragmentId 'history', field 'messages'"
            )
    sel = view.selection
    exchange_of = [item_id.split("/", 1)[0] for item_id in sel.selected_item_ids]
    protected = set(sel.protected_exchange_ids)

    def boundaries(messages: list[Any]) -> tuple[list[int], int]:
        # Groups are whole exchanges: one starts at the first selected exchange and at every
        # exchange whose inputs hold a user message. Nothing from the first protected one on goes.
        starts: list[int] = []
        floor = len(messages)
        for k in range(len(messages)):
            eid = exchange_of[k]
            if k and exchange_of[k - 1] == eid:
                continue
            if eid in protected and floor == len(messages):
                floor = k
            end = k
            while end < len(messages) and exchange_of[end] == eid:
                end += 1
            if k == 0 or any(m.get("role") == "user" for m in messages[k:end]):
                starts.append(k)
        return starts, floor

    result = reduce_context(parsed, fragments, token_counter=token_counter, _boundaries=boundaries)
    history = next(f for f in result.fragments if f.id == "history").value["messages"]
    dropped_items = len(view.selected_items_json) - len(history)
    if dropped_items <= 0:
        return view, result.receipt
    dropped_ids = tuple(dict.fromkeys(exchange_of[:dropped_items]))
    remaining = view.selected_items_json[dropped_items:]
    effects = [s for s in result.receipt.steps if s.applied]
    losses = tuple(
        f"context policy step {s.step_id!r} trimmed {s.groups_before - s.groups_after} user-turn group(s) "
        f"({s.removed_items} items) of history (trigger {result.receipt.trigger})"
        for s in effects
    )
    digest = projection_digest(remaining)
    receipt = CompactionReceipt(
        receipt_id="cmp-" + sha256_hex(canonical_json([_REDUCE_POLICY_ID, list(dropped_ids), digest]))[:32],
        input_exchange_ids=dropped_ids,
        output_digest=digest,
        policy_id=_REDUCE_POLICY_ID,
        declared_losses=losses,
    )
    return view.with_omission(dropped_ids, receipt), result.receipt
