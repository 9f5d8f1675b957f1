"""Context contracts: contributions, contributors, selection, budgets, unit counters."""

from __future__ import annotations

import pickle
from collections.abc import Sequence

import pytest

from qitos.core._codec import canonical_json
from qitos.core._errors import ContextError
from qitos.core._exchange import ExchangeLog
from qitos.core.context import (
    CharacterCounter,
    ContextBudget,
    ContextBudgetExceededError,
    ContextContribution,
    ContextContributionError,
    ContextRequest,
    DeclaredContextBudgetPolicy,
    PriorityContextSelectionPolicy,
    StaticContextContributor,
    TokenCounter,
    collect_context_contributions,
    default_unit_counter,
    unit_counter_for,
)


def contribution(cid: str, text: str = "x", **kw: object) -> ContextContribution:
    return ContextContribution(contribution_id=cid, source="test", content=text, **kw)  # type: ignore[arg-type]


REQUEST = ContextRequest(step_id=0, task="t", log=None)


def test_seed_static_contributor_example() -> None:
    contributor = StaticContextContributor("notes.project", "project", "Use supplied notes only.")
    (c,) = contributor.contribute(REQUEST)
    assert c.contribution_id == "notes.project" and c.source == "project"
    assert c.content == "Use supplied notes only."
    assert (c.priority, c.requested_placement, c.required, c.persistence_horizon, c.sensitivity) == (
        0,
        "developer",
        False,
        "request",
        "internal",
    )


def test_static_contributor_field_defaults_match_the_seed() -> None:
    s = StaticContextContributor("id", "src", {"k": 1})
    assert (s.priority, s.requested_placement, s.required, s.persistence_horizon, s.sensitivity) == (
        0,
        "developer",
        False,
        "request",
        "internal",
    )


def test_a_bad_static_contributor_fails_where_it_is_configured() -> None:
    with pytest.raises(ContextContributionError, match="requested_placement"):
        StaticContextContributor("id", "src", "v", requested_placement="assistant")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"contribution_id": ""}, "contribution_id"),
        ({"source": " "}, "source"),
        ({"priority": "high"}, "priority"),
        ({"persistence_horizon": "forever"}, "persistence_horizon"),
        ({"sensitivity": "public"}, "sensitivity"),
        ({"required": 1}, "required"),
        ({"content": {"s": {1, 2}}}, "JSON-native"),
    ],
)
def test_invalid_contributions_name_the_field(kwargs: dict[str, object], field: str) -> None:
    base: dict[str, object] = {"contribution_id": "c", "source": "s", "content": "v"}
    base.update(kwargs)
    with pytest.raises(ContextContributionError, match=field):
        ContextContribution(**base)  # type: ignore[arg-type]


def test_contribution_content_is_copied_and_digested() -> None:
    data = {"facts": ["a"]}
    c = contribution("c", data)  # type: ignore[arg-type]
    data["facts"].append("b")
    assert c.content == {"facts": ["a"]}
    assert len(c.digest) == 64


def test_secret_content_is_never_in_to_dict() -> None:
    c = contribution("key", "sk-very-secret", sensitivity="secret")
    assert "content" not in c.to_dict()
    assert c.to_dict()["digest"] == c.digest
    assert "sk-very-secret" in c.message()["content"]  # the model still gets it


def test_selection_is_required_then_priority_then_identity() -> None:
    items = [
        contribution("b", priority=5),
        contribution("a", priority=5),
        contribution("z", priority=9),
        contribution("r", priority=-1, required=True),
    ]
    sel = PriorityContextSelectionPolicy().select(items, budget=ContextBudget())
    assert [c.contribution_id for c in sel.selected] == ["r", "z", "a", "b"]
    assert sel.policy_id == "qitos.context.priority/v1"


def test_selection_is_deterministic_whatever_the_input_order() -> None:
    items = [contribution(f"c{i}", "x" * (i * 7 % 50), priority=i % 3) for i in range(20)]
    budget = ContextBudget(max_input_units=900, reserved_output_units=0)
    a = PriorityContextSelectionPolicy().select(items, budget=budget)
    b = PriorityContextSelectionPolicy().select(list(reversed(items)), budget=budget)
    assert a == b


def test_optional_contributions_that_do_not_fit_are_dropped_with_their_units() -> None:
    big, small = contribution("big", "x" * 500, priority=2), contribution("small", "y", priority=1)
    budget = ContextBudget(max_input_units=400, reserved_output_units=0)
    sel = PriorityContextSelectionPolicy().select([big, small], budget=budget, already_used_units=100)
    assert [c.contribution_id for c in sel.selected] == ["small"]
    assert [c.contribution_id for c in sel.omitted] == ["big"]
    assert sel.omitted_units == len(canonical_json(big.message()))
    assert sel.units["small"] == sel.selected_units


def test_required_contributions_that_cannot_fit_raise_with_units() -> None:
    req = contribution("must", "x" * 500, required=True)
    budget = ContextBudget(max_input_units=300, reserved_output_units=0)
    with pytest.raises(ContextBudgetExceededError, match="must") as info:
        PriorityContextSelectionPolicy().select([req], budget=budget)
    assert info.value.available_units == 300
    assert info.value.required_units == len(canonical_json(req.message()))
    assert isinstance(info.value, ContextError)


def test_duplicate_contribution_ids_are_rejected() -> None:
    with pytest.raises(ContextContributionError, match="duplicate"):
        PriorityContextSelectionPolicy().select([contribution("a"), contribution("a")], budget=ContextBudget())


def test_a_counter_in_another_unit_than_the_budget_is_rejected() -> None:
    with pytest.raises(ValueError, match="counts 'characters'"):
        PriorityContextSelectionPolicy().select([], budget=ContextBudget(unit="tokens"))


def test_context_budget_defaults_and_available_units() -> None:
    b = ContextBudget()
    assert (b.max_input_units, b.reserved_output_units, b.unit, b.protected_recent_exchanges) == (
        120_000,
        8_000,
        "characters",
        1,
    )
    assert b.available_input_units == 112_000
    assert ContextBudget.from_dict(b.to_dict()) == b


@pytest.mark.parametrize(("window", "reserve"), [(2_000, 500), (4_096, 1_024), (40_000, 8_000), (3, 0)])
def test_a_small_declared_window_gets_a_reserve_that_scales_with_it(window: int, reserve: int) -> None:
    budget = ContextBudget(max_input_units=window)
    assert budget.reserved_output_units == reserve
    assert budget.available_input_units == window - reserve
    assert budget.to_dict()["reserved_output_units"] == reserve
    assert ContextBudget.from_dict(budget.to_dict()) == budget


def test_an_explicit_reserve_is_kept_even_when_larger_than_the_scaled_one() -> None:
    assert ContextBudget(max_input_units=2_000, reserved_output_units=1_500).available_input_units == 500


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_input_units": 0}, "max_input_units"),
        ({"max_input_units": 100, "reserved_output_units": 100}, "reserved_output_units"),
        ({"unit": "bytes"}, "unit"),
        ({"protected_recent_exchanges": -1}, "protected_recent_exchanges"),
        ({"max_input_units": 10.5}, "max_input_units"),
    ],
)
def test_invalid_budgets_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ContextBudget(**kwargs)  # type: ignore[arg-type]


def test_seed_declared_budget_policy_example() -> None:
    policy = DeclaredContextBudgetPolicy(default_max_input_units=4096)
    budget = policy.budget_for(None, None)
    assert budget.max_input_units == 4096 and budget.unit == "characters"
    assert budget.reserved_output_units == 1024
    assert policy.policy_id == "qitos.context.declared_budget/v1"
    assert (DeclaredContextBudgetPolicy().default_max_input_units, DeclaredContextBudgetPolicy().unit) == (
        120000,
        "characters",
    )


def test_declared_capacity_and_unit_win_over_the_default() -> None:
    policy = DeclaredContextBudgetPolicy(protected_recent_exchanges=3)
    budget = policy.budget_for(32_000, "tokens")
    assert (budget.max_input_units, budget.unit, budget.protected_recent_exchanges) == (32_000, "tokens", 3)
    assert budget.reserved_output_units == 8_000
    assert policy.budget_for(1000, None, reserved_output_units=10).available_input_units == 990


@pytest.mark.parametrize("bad", [0, -5, True, 2.5])
def test_a_bad_declared_capacity_is_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="max_input_units"):
        DeclaredContextBudgetPolicy().budget_for(bad, None)  # type: ignore[arg-type]


def test_character_counter_is_the_default() -> None:
    assert default_unit_counter.unit == "characters"
    assert CharacterCounter().count("héllo") == 5
    assert unit_counter_for("characters") is default_unit_counter


def test_token_counter_counts_offline_tokens() -> None:
    counter = TokenCounter()
    assert counter.unit == "tokens"
    assert counter.count("hello world") == 2  # cl100k_base: "hello", " world"
    assert TokenCounter("o200k_base").count("hello world") == 2
    assert unit_counter_for("tokens").count("hello world") == 2


def test_token_counter_rejects_an_unknown_encoding() -> None:
    with pytest.raises(ValueError, match="no-such-encoding"):
        TokenCounter("no-such-encoding")


def test_unknown_unit_has_no_standard_counter() -> None:
    with pytest.raises(ValueError, match="bytes"):
        unit_counter_for("bytes")


class _ListContributor:
    def __init__(self, *values: ContextContribution) -> None:
        self.values = values

    def contribute(self, request: ContextRequest) -> Sequence[ContextContribution]:
        return self.values


class _BadContributor:
    def contribute(self, request: ContextRequest) -> object:
        return "not a list"


def test_collect_consults_contributors_in_name_order() -> None:
    got = collect_context_contributions(
        {"b": _ListContributor(contribution("from-b")), "a": _ListContributor(contribution("from-a"))},
        ContextRequest(step_id=1, task="t", log=ExchangeLog()),
    )
    assert [c.contribution_id for c in got] == ["from-a", "from-b"]


def test_collect_rejects_duplicates_and_bad_return_values() -> None:
    with pytest.raises(ContextContributionError, match="duplicate contribution id 'x'"):
        collect_context_contributions(
            {"a": _ListContributor(contribution("x")), "b": _ListContributor(contribution("x"))}, REQUEST
        )
    with pytest.raises(ContextContributionError, match="'bad' must return a sequence"):
        collect_context_contributions({"bad": _BadContributor()}, REQUEST)


def test_budget_error_pickles_with_its_fields() -> None:
    err = ContextBudgetExceededError("too big", required_units=10, available_units=5, unit="tokens")
    back = pickle.loads(pickle.dumps(err))
    assert (back.required_units, back.available_units, back.unit, str(back)) == (10, 5, "tokens", "too big")


def test_seed_audited_selector_subclass_example(capsys: pytest.CaptureFixture[str]) -> None:
    class AuditedSelector(PriorityContextSelectionPolicy):
        def select(self, contributions, **options):  # type: ignore[no-untyped-def]
            contributions = tuple(contributions)
            print([item.contribution_id for item in contributions])
            return super().select(contributions, **options)

    from qitos.core.request_view import RequestView

    log = ExchangeLog()
    log.open([{"role": "user", "content": "hi"}])
    view = RequestView.from_exchange_log(
        log, context_contributions=[contribution("b"), contribution("a")], context_selection_policy=AuditedSelector()
    )
    assert capsys.readouterr().out.strip() == "['b', 'a']"
    assert view.selection.selected_context_ids == ("a", "b")
    assert view.provenance["selection_policy"] == "qitos.context.priority/v1"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"default_max_input_units": 0}, "default_max_input_units"),
        ({"default_max_input_units": True}, "default_max_input_units"),
        ({"unit": "words"}, "unit"),
        ({"protected_recent_exchanges": -1}, "protected_recent_exchanges"),
    ],
)
def test_a_bad_budget_policy_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        DeclaredContextBudgetPolicy(**kwargs)  # type: ignore[arg-type]
