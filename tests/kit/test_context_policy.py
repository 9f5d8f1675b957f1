"""Declarative ContextPolicy: validate, reduce and audit, with receipts and paths."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest

from qitos.core._codec import canonical_json
from qitos.core._errors import ConfigurationError, ContextError
from qitos.core._exchange import ExchangeLog
from qitos.core.context import ContextBudget, TokenCounter
from qitos.core.request_view import RequestView, projection_digest
from qitos.kit.context.policy import (
    AuditPolicy,
    ContextFragment,
    ContextPolicyError,
    ContextPolicyViolation,
    ReducePolicy,
    TrimReduction,
    ValidatePolicy,
    apply_context_policy,
    audit_context,
    context_policy_to_dict,
    parse_context_policy,
    reduce_context,
    request_fragments,
    validate_context_policy,
)

SEED_REDUCE: dict[str, Any] = {
    "mode": "reduce",
    "triggerChars": 1800,
    "targetInputChars": 1500,
    "selection": {"mode": "sequence"},
    "steps": [
        {
            "id": "recent-history",
            "kind": "trim",
            "fragmentId": "history",
            "field": "messages",
            "grouping": {"kind": "user-turn"},
            "keepGroups": 2,
            "targetChars": 1000,
        }
    ],
}


def history(turns: int, size: int = 200) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "preamble"}]
    for t in range(turns):
        messages.append({"role": "user", "content": f"turn {t} " + "u" * size})
        messages.append({"role": "assistant", "content": f"reply {t}"})
    return messages


def fragments(turns: int, size: int = 200) -> list[dict[str, Any]]:
    return [
        {"id": "system", "value": {"text": "You are terse."}},
        {"id": "history", "value": {"messages": history(turns, size)}},
    ]


# --------------------------------------------------------------------------- seed examples


def test_seed_validate_only_example() -> None:
    policy = {"mode": "validate"}
    validate_context_policy(policy, [], [])
    assert policy["mode"] == "validate"


def test_seed_reduce_configuration_example() -> None:
    policy: dict[str, Any] = json.loads(json.dumps(SEED_REDUCE))
    receipt = validate_context_policy(policy, [], [])
    assert receipt.mode == "reduce"
    assert policy["steps"][0]["keepGroups"] == 2


def test_mapping_and_dataclass_forms_are_equivalent() -> None:
    parsed = parse_context_policy(SEED_REDUCE)
    assert isinstance(parsed, ReducePolicy)
    assert parsed.steps == (
        TrimReduction(id="recent-history", fragment_id="history", field="messages", keep_groups=2, target_chars=1000),
    )
    assert context_policy_to_dict(parsed) == SEED_REDUCE
    assert parse_context_policy(parsed) == parsed
    assert parse_context_policy({"mode": "audit", "mutableFragmentIds": ["a"]}) == AuditPolicy(
        mutable_fragment_ids=("a",)
    )
    assert parse_context_policy(ValidatePolicy()) == ValidatePolicy()


# --------------------------------------------------------------------------- shape errors


def _bad(change: dict[str, Any], step_change: dict[str, Any] | None = None) -> dict[str, Any]:
    policy: dict[str, Any] = json.loads(json.dumps(SEED_REDUCE))
    policy.update(change)
    if step_change is not None:
        policy["steps"][0].update(step_change)
    return policy


@pytest.mark.parametrize(
    ("policy", "path"),
    [
        ({"mode": "shrink"}, "policy.mode"),
        ("validate", "policy"),
        ({"mode": "validate", "extra": 1}, "policy.extra"),
        (_bad({"steps": []}), "policy.steps"),
        (_bad({"triggerChars": 0}), "policy.triggerChars"),
        (_bad({"targetInputChars": 5000}), "policy.targetInputChars"),
        (_bad({"selection": {"mode": "parallel"}}), "policy.selection.mode"),
        (_bad({}, {"kind": "summarize"}), "policy.steps[0].kind"),
        (_bad({}, {"keepGroups": -1}), "policy.steps[0].keepGroups"),
        (_bad({}, {"grouping": {"kind": "token"}}), "policy.steps[0].grouping.kind"),
        (_bad({}, {"fragmentId": ""}), "policy.steps[0].fragmentId"),
        (_bad({}, {"targetChars": "1000"}), "policy.steps[0].targetChars"),
        (_bad({"steps": [SEED_REDUCE["steps"][0], SEED_REDUCE["steps"][0]]}), "policy.steps[1].id"),
        ({"mode": "reduce"}, "policy.steps"),
        ({"mode": "audit", "mutableFragmentIds": "history"}, "policy.mutableFragmentIds"),
        ({"mode": "audit", "mutableFragmentIds": ["a", "a"]}, "policy.mutableFragmentIds[1]"),
    ],
)
def test_invalid_policies_name_the_path(policy: Any, path: str) -> None:
    with pytest.raises(ContextPolicyError) as info:
        validate_context_policy(policy, [], [])
    assert info.value.path == path
    assert str(info.value).startswith(f"{path}: ")
    assert isinstance(info.value, ConfigurationError)


@pytest.mark.parametrize(
    ("before", "path"),
    [
        ([{"id": "a", "value": 1}, {"id": "a", "value": 2}], "before[1].id"),
        ([{"id": "a"}], "before[0].value"),
        ([{"id": "a", "value": {1, 2}}], "before[0].value"),
        ("nope", "before"),
    ],
)
def test_invalid_fragments_name_the_path(before: Any, path: str) -> None:
    with pytest.raises(ContextPolicyError) as info:
        validate_context_policy({"mode": "validate"}, before, before)
    assert info.value.path == path


def test_errors_pickle() -> None:
    err = ContextPolicyError("policy.mode", "bad")
    assert str(pickle.loads(pickle.dumps(err))) == "policy.mode: bad"
    violation = ContextPolicyViolation("after[0]", "changed")
    assert pickle.loads(pickle.dumps(violation)).path == "after[0]"


# --------------------------------------------------------------------------- reduce


def test_reduce_trims_oldest_user_turns_and_reports_each_step() -> None:
    before = fragments(10)
    result = reduce_context(SEED_REDUCE, before)
    receipt = result.receipt
    assert receipt.fired and receipt.trigger == "triggerChars"
    assert receipt.chars_before > 1800 and receipt.chars_after <= 1500 and receipt.target_reached
    (step,) = receipt.steps
    assert step.applied and step.groups_before == 10 and step.groups_after < 10
    assert step.removed_items == 2 * (step.groups_before - step.groups_after)
    assert step.reason in {"target reached", "targetChars reached"}
    assert receipt.changed_fragment_ids == ("history",)
    messages = next(f for f in result.fragments if f.id == "history").value["messages"]
    assert messages[0] == {"role": "system", "content": "preamble"}  # before the first user turn: kept
    assert messages[1]["content"].startswith(f"turn {10 - step.groups_after} ")
    assert result.fragments[0] == ContextFragment(id="system", value={"text": "You are terse."})
    validate_context_policy(SEED_REDUCE, before, [{"id": f.id, "value": f.value} for f in result.fragments])
    assert json.loads(json.dumps(receipt.to_dict()))["steps"][0]["stepId"] == "recent-history"


def test_reduce_below_the_trigger_changes_nothing() -> None:
    before = fragments(2, size=50)
    result = reduce_context(SEED_REDUCE, before)
    assert not result.receipt.fired and result.receipt.steps[0].reason == "not fired"
    assert [f.value for f in result.fragments] == [f["value"] for f in before]


def test_keep_groups_is_never_violated_and_an_unreachable_target_raises() -> None:
    before = fragments(3, size=2_000)
    with pytest.raises(ContextPolicyViolation, match="could not reach targetInputChars=1500") as info:
        reduce_context(SEED_REDUCE, before)
    receipt = info.value.receipt
    assert receipt is not None and receipt.target_reached is False
    assert receipt.steps[0].groups_after == 2 and receipt.steps[0].reason == "keepGroups reached"


def test_token_triggers_count_tokens() -> None:
    policy = {
        "mode": "reduce",
        "triggerTokens": 300,
        "targetInputTokens": 200,
        "steps": [
            {"id": "t", "kind": "trim", "fragmentId": "history", "field": "messages", "grouping": {"kind": "user-turn"}}
        ],
    }
    result = reduce_context(policy, fragments(10, size=100), token_counter=TokenCounter())
    assert result.receipt.trigger == "triggerTokens"
    assert result.receipt.tokens_before is not None and result.receipt.tokens_before > 300
    assert result.receipt.tokens_after is not None and result.receipt.tokens_after <= 200


def test_a_step_naming_a_missing_fragment_or_field_is_an_error() -> None:
    with pytest.raises(ContextPolicyError, match=r"policy\.steps\[0\]\.fragmentId"):
        reduce_context(SEED_REDUCE, [{"id": "other", "value": {}}])
    with pytest.raises(ContextPolicyError, match="no list field 'messages'"):
        reduce_context(SEED_REDUCE, [{"id": "history", "value": {"text": "x" * 3000}}])


# --------------------------------------------------------------------------- validate effects


def test_validate_policy_allows_no_change() -> None:
    before = fragments(2)
    validate_context_policy({"mode": "validate"}, before, before)
    after = json.loads(json.dumps(before))
    after[0]["value"]["text"] = "changed"
    with pytest.raises(ContextPolicyViolation, match="'system' changed under a validate policy") as info:
        validate_context_policy({"mode": "validate"}, before, after)
    assert info.value.path == "after[0].value"


def test_reduce_effects_are_checked() -> None:
    before = fragments(6)
    msgs = before[1]["value"]["messages"]

    def with_messages(new: list[Any]) -> list[dict[str, Any]]:
        after: list[dict[str, Any]] = json.loads(json.dumps(before))
        after[1]["value"]["messages"] = new
        return after

    validate_context_policy(SEED_REDUCE, before, with_messages(msgs[:1] + msgs[5:]))  # two turns dropped
    with pytest.raises(ContextPolicyViolation, match="whole leading user-turn groups") as info:
        validate_context_policy(SEED_REDUCE, before, with_messages(msgs[:3] + msgs[5:]))  # a middle turn
    assert info.value.path == "after[1].value.messages"
    with pytest.raises(ContextPolicyViolation, match="fewer than keepGroups=2"):
        validate_context_policy(SEED_REDUCE, before, with_messages(msgs[:1] + msgs[-2:]))
    other = json.loads(json.dumps(before))
    other[0]["value"]["text"] = "edited"
    with pytest.raises(ContextPolicyViolation, match="'system' is not reduced by any step") as info:
        validate_context_policy(SEED_REDUCE, before, other)
    assert info.value.path == "after[0].value"
    extra = json.loads(json.dumps(before))
    extra[1]["value"]["note"] = "added"
    with pytest.raises(ContextPolicyViolation, match="only the trimmed field may change"):
        validate_context_policy(SEED_REDUCE, before, extra)


# --------------------------------------------------------------------------- audit


def test_audit_allows_only_mutable_fragments_to_change() -> None:
    policy = {"mode": "audit", "mutableFragmentIds": ["history"]}
    before = fragments(2)
    after = json.loads(json.dumps(before))
    after[1]["value"]["messages"].append({"role": "user", "content": "new turn"})
    receipt = validate_context_policy(policy, before, after)
    assert receipt.changed_fragment_ids == ("history",)
    after[0]["value"]["text"] = "a new system prompt breaks the cached prefix"
    with pytest.raises(ContextPolicyViolation, match="'system' changed but is not in mutableFragmentIds") as info:
        audit_context(policy, before, after)
    assert info.value.path == "after[0].value"
    with pytest.raises(ContextPolicyViolation) as removed:
        audit_context(policy, before, before[1:])
    assert removed.value.path == "before[0]"
    with pytest.raises(ContextPolicyViolation) as added:
        audit_context(policy, before, [*before, {"id": "tools", "value": []}])
    assert added.value.path == "after[2]"


# --------------------------------------------------------------------------- request views


def conversation(turns: int, *, tool_steps: int = 1, size: int = 150) -> ExchangeLog:
    log = ExchangeLog("policy-log")
    for t in range(turns):
        for k in range(tool_steps):
            inputs = [{"role": "user", "content": f"turn {t} " + "u" * size}] if k == 0 else []
            eid = log.open(inputs).exchange_id
            log.record_output(eid, {"role": "assistant", "tool_calls": [{"id": f"c{t}-{k}", "name": "f"}]})
            log.record_tool_result(eid, f"c{t}-{k}", "ok")
            log.close(eid)
    return log


def test_a_request_can_be_reduced_under_a_policy_with_a_receipt() -> None:
    log = conversation(8, tool_steps=2)
    view = RequestView.from_exchange_log(log, instructions=[{"role": "system", "content": "sys"}])
    new_view, receipt = apply_context_policy(SEED_REDUCE, view)
    assert receipt.fired and receipt.target_reached
    omitted = new_view.selection.omitted_exchange_ids
    assert omitted and len(omitted) % 2 == 0  # whole user turns = two exchanges each
    assert omitted == tuple(e.exchange_id for e in log.exchanges[: len(omitted)])
    (cr,) = new_view.compaction_receipts
    assert cr.input_exchange_ids == omitted and cr.policy_id == "qitos.context_policy.reduce/v1"
    assert cr.output_digest == projection_digest(new_view.selected_items_json)
    assert "recent-history" in cr.declared_losses[0]
    assert new_view.messages()[1]["role"] == "user"  # history starts at a user turn
    sent = sum(len(canonical_json(m)) for m in new_view.messages())
    assert sent == new_view.selection.selected_units


def test_reducing_a_request_never_drops_protected_exchanges() -> None:
    log = conversation(3, tool_steps=1, size=2_000)
    budget = ContextBudget(protected_recent_exchanges=2)
    view = RequestView.from_exchange_log(log, context_budget=budget)
    policy = {**SEED_REDUCE, "steps": [{**SEED_REDUCE["steps"][0], "keepGroups": 0}]}
    with pytest.raises(ContextPolicyViolation) as info:
        apply_context_policy(policy, view)
    assert info.value.receipt is not None and info.value.receipt.steps[0].reason == "protected items reached"


def test_audit_between_consecutive_requests_guards_the_cached_prefix() -> None:
    log = conversation(2)
    system = [{"role": "system", "content": "stable prefix"}]
    first = RequestView.from_exchange_log(log, instructions=system)
    eid = log.open([{"role": "user", "content": "more"}]).exchange_id
    second = RequestView.from_exchange_log(log, instructions=system)
    policy = {"mode": "audit", "mutableFragmentIds": ["history"]}
    same, receipt = apply_context_policy(policy, second, previous=first)
    assert same is second and receipt.changed_fragment_ids == ("history",)
    changed = RequestView.from_exchange_log(log, instructions=[{"role": "system", "content": "drifted"}])
    with pytest.raises(ContextPolicyViolation, match="'instructions' changed"):
        apply_context_policy(policy, changed, previous=first)
    with pytest.raises(ContextPolicyError, match="previous"):
        apply_context_policy(policy, second)
    assert log.exchange(eid).inputs[0].content == "more"


def test_validate_policy_leaves_a_request_unchanged_and_other_fragments_cannot_be_trimmed() -> None:
    view = RequestView.from_exchange_log(conversation(2))
    same, receipt = apply_context_policy({"mode": "validate"}, view)
    assert same is view and not receipt.fired
    assert [f.id for f in request_fragments(view)] == ["instructions", "tools", "context", "history"]
    bad = _bad({}, {"fragmentId": "context"})
    with pytest.raises(ContextPolicyError, match=r"policy\.steps\[0\]"):
        apply_context_policy(bad, view)
    assert isinstance(ContextPolicyViolation("p", "m"), ContextError)
