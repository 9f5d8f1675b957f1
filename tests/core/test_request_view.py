"""RequestView: selection order, protection, loss receipts, determinism, and property tests."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qitos.core._codec import canonical_json
from qitos.core._errors import ConfigurationError, ContextError
from qitos.core._exchange import ExchangeLog
from qitos.core.context import (
    ContextBudget,
    ContextContribution,
    StaticContextContributor,
    TokenCounter,
)
from qitos.core.request_view import (
    REQUEST_VIEW_SCHEMA_VERSION,
    ArtifactRef,
    CompactionError,
    CompactionReceipt,
    ContextBudgetExceededError,
    ContinuationRef,
    RequestTarget,
    RequestView,
    projection_digest,
)
from qitos.kit.context.compaction import ClosedExchangeWindowCompactor

SYSTEM = [{"role": "system", "content": "You are a careful assistant."}]
TOOLS = [{"name": "lookup", "description": "Look a key up.", "parameters": {"type": "object", "properties": {}}}]


def build_log(sizes: Sequence[int], *, calls: Sequence[int] | None = None, open_last: bool = False) -> ExchangeLog:
    log = ExchangeLog("log-test")
    for i, size in enumerate(sizes):
        eid = log.open([{"role": "user", "content": f"q{i} " + "x" * size}]).exchange_id
        if open_last and i == len(sizes) - 1:
            break
        n_calls = calls[i] if calls else 1
        log.record_output(
            eid,
            {
                "role": "assistant",
                "content": None if n_calls else f"answer {i}",
                "tool_calls": [{"id": f"{eid}-{k}", "name": "lookup", "arguments": {"k": k}} for k in range(n_calls)],
            },
        )
        for k in range(n_calls):
            log.record_tool_result(eid, f"{eid}-{k}", f"r{k}")
        log.close(eid)
    return log


def units_of(view: RequestView) -> int:
    return sum(len(canonical_json(m)) for m in view.messages()) + sum(len(canonical_json(t)) for t in view.tools())


class Refusing:
    policy_id = "test.refuse"

    def compact(self, **_: object) -> CompactionReceipt | None:
        return None


class Exploding:
    policy_id = "test.explode"

    def compact(self, **_: object) -> CompactionReceipt | None:
        raise RuntimeError("summary service down")


class WrongIds:
    policy_id = "test.wrong"

    def compact(self, *, exchange_ids: Sequence[str], selected_digest: str, **_: object) -> CompactionReceipt:
        return CompactionReceipt("r", tuple(exchange_ids)[1:], selected_digest, self.policy_id)


class WrongDigest:
    policy_id = "test.digest"

    def compact(self, *, exchange_ids: Sequence[str], **_: object) -> CompactionReceipt:
        return CompactionReceipt("r", tuple(exchange_ids), "0" * 64, self.policy_id)


SMALL = ContextBudget(max_input_units=1_500, reserved_output_units=100)


# --------------------------------------------------------------------------- basics


def test_seed_example_builds_with_the_closed_window_compactor() -> None:
    log = build_log([10, 10])
    view = RequestView.from_exchange_log(log, compaction_policy=ClosedExchangeWindowCompactor())
    assert view.schema_version == REQUEST_VIEW_SCHEMA_VERSION
    assert view.selection.omitted_exchange_ids == ()
    assert view.source_log_digest == log.digest


def test_messages_are_instructions_then_context_then_history() -> None:
    log = build_log([5])
    contribs = [
        *StaticContextContributor("u", "user-notes", "likes tea", requested_placement="user").contribute(None),  # type: ignore[arg-type]
        *StaticContextContributor("d", "project", "use notes").contribute(None),  # type: ignore[arg-type]
        *StaticContextContributor("s", "policy", "be brief", requested_placement="system").contribute(None),  # type: ignore[arg-type]
    ]
    view = RequestView.from_exchange_log(log, instructions=SYSTEM, tool_schemas=TOOLS, context_contributions=contribs)
    msgs = view.messages()
    assert msgs[0] == SYSTEM[0]
    assert [m["role"] for m in msgs[1:4]] == ["system", "developer", "user"]
    assert msgs[2]["content"] == '<context id="d" source="project">\nuse notes\n</context>'
    assert [m["role"] for m in msgs[4:]] == ["user", "assistant", "tool"]
    assert msgs[5]["tool_calls"] == [{"id": "ex-000001-0", "name": "lookup", "arguments": {"k": 0}}]
    assert msgs[6] == {"role": "tool", "content": "r0", "tool_call_id": "ex-000001-0"}
    assert view.tools() == TOOLS


def test_if_everything_fits_nothing_is_omitted() -> None:
    log = build_log([50] * 30)
    view = RequestView.from_exchange_log(log, instructions=SYSTEM, context_budget=ContextBudget())
    assert view.selection.omitted_exchange_ids == ()
    assert len(view.selection.selected_exchange_ids) == 30
    assert view.compaction_receipts == ()
    assert view.selection.selected_units == units_of(view) == view.selection.total_units


def test_omission_without_a_policy_raises_naming_the_units() -> None:
    log = build_log([200] * 20)
    with pytest.raises(ContextBudgetExceededError, match="explicit compaction policy") as info:
        RequestView.from_exchange_log(log, instructions=SYSTEM, context_budget=SMALL)
    assert info.value.available_units == 1_400
    assert info.value.required_units > 1_400


def test_omitted_exchanges_are_listed_in_the_receipt() -> None:
    log = build_log([200] * 20)
    view = RequestView.from_exchange_log(
        log, instructions=SYSTEM, context_budget=SMALL, compaction_policy=ClosedExchangeWindowCompactor()
    )
    sel = view.selection
    (receipt,) = view.compaction_receipts
    assert receipt.input_exchange_ids == sel.omitted_exchange_ids
    assert sel.omitted_exchange_ids == tuple(f"ex-{i:06d}" for i in range(1, len(sel.omitted_exchange_ids) + 1))
    assert (*sel.omitted_exchange_ids, *sel.selected_exchange_ids) == tuple(e.exchange_id for e in log.exchanges)
    assert receipt.output_digest == projection_digest(view.selected_items_json)
    assert receipt.policy_id == "qitos.context.closed_exchange_window/v1"
    assert receipt.declared_losses and "without a summary" in receipt.declared_losses[0]
    assert receipt.model_reference is None
    assert sel.selected_units == units_of(view) <= 1_400
    assert sel.omitted_units + sel.selected_units == sel.total_units
    assert all(i.split("/")[0] in sel.omitted_exchange_ids for i in sel.omitted_item_ids)
    assert view.provenance["authorizing_receipt_ids"] == [receipt.receipt_id]


def test_the_selected_history_is_the_newest_that_fits() -> None:
    log = build_log([200] * 20)
    view = RequestView.from_exchange_log(
        log, instructions=SYSTEM, context_budget=SMALL, compaction_policy=ClosedExchangeWindowCompactor()
    )
    keep = len(view.selection.selected_exchange_ids)
    # One more exchange would not have fit.
    one_more = log.exchanges[-keep - 1]
    extra = sum(len(m.json_text) for m in one_more.items)
    assert view.selection.selected_units + extra > 1_400


def test_a_policy_that_declines_leaves_the_request_unbuilt() -> None:
    with pytest.raises(ContextBudgetExceededError, match="declined"):
        RequestView.from_exchange_log(build_log([200] * 20), context_budget=SMALL, compaction_policy=Refusing())


def test_a_failing_policy_raises_a_compaction_error_with_its_cause() -> None:
    with pytest.raises(CompactionError, match="summary service down") as info:
        RequestView.from_exchange_log(build_log([200] * 20), context_budget=SMALL, compaction_policy=Exploding())
    assert isinstance(info.value.__cause__, RuntimeError)
    assert info.value.policy_id == "test.explode"
    assert isinstance(info.value, ContextError)


@pytest.mark.parametrize(("policy", "match"), [(WrongIds(), "must omit exactly"), (WrongDigest(), "output_digest")])
def test_a_receipt_that_does_not_match_the_omission_is_rejected(policy: object, match: str) -> None:
    with pytest.raises(CompactionError, match=match):
        RequestView.from_exchange_log(build_log([200] * 20), context_budget=SMALL, compaction_policy=policy)


def test_a_receipt_from_an_earlier_request_never_authorizes_a_new_omission() -> None:
    log = build_log([200] * 20)
    earlier = RequestView.from_exchange_log(
        log, context_budget=SMALL, compaction_policy=ClosedExchangeWindowCompactor()
    )
    with pytest.raises(ContextBudgetExceededError):
        RequestView.from_exchange_log(log, context_budget=SMALL, compaction_receipts=earlier.compaction_receipts)
    carried = RequestView.from_exchange_log(
        log,
        context_budget=SMALL,
        compaction_receipts=earlier.compaction_receipts,
        compaction_policy=ClosedExchangeWindowCompactor(),
    )
    assert carried.compaction_receipts[0] == earlier.compaction_receipts[0]
    assert len(carried.compaction_receipts) == 2


def test_protected_items_that_alone_exceed_the_budget_raise_even_with_a_policy() -> None:
    log = build_log([2_000])
    with pytest.raises(ContextBudgetExceededError, match="protected exchanges alone") as info:
        RequestView.from_exchange_log(log, context_budget=SMALL, compaction_policy=ClosedExchangeWindowCompactor())
    assert info.value.required_units > info.value.available_units == 1_400


def test_the_recent_window_is_protected() -> None:
    log = build_log([200] * 20)
    budget = ContextBudget(max_input_units=3_000, reserved_output_units=0, protected_recent_exchanges=3)
    view = RequestView.from_exchange_log(log, context_budget=budget, compaction_policy=ClosedExchangeWindowCompactor())
    assert view.selection.protected_exchange_ids == ("ex-000018", "ex-000019", "ex-000020")
    assert set(view.selection.protected_exchange_ids) <= set(view.selection.selected_exchange_ids)


def test_the_open_exchange_is_protected_and_sent() -> None:
    log = build_log([200] * 10 + [5], open_last=True)
    budget = ContextBudget(max_input_units=1_000, reserved_output_units=0, protected_recent_exchanges=0)
    view = RequestView.from_exchange_log(log, context_budget=budget, compaction_policy=ClosedExchangeWindowCompactor())
    assert view.selection.selected_exchange_ids[-1] == "ex-000011"
    assert "ex-000011" in view.selection.protected_exchange_ids
    assert view.messages()[-1]["content"] == "q10 xxxxx"


def test_a_continuation_protects_its_exchange_and_everything_after() -> None:
    log = build_log([200] * 10)
    cont = ContinuationRef(reference_id="resp_1", provider="p", model="m", exchange_id="ex-000004")
    budget = ContextBudget(max_input_units=20_000, reserved_output_units=0)
    view = RequestView.from_exchange_log(log, context_budget=budget, continuation=cont)
    assert view.selection.protected_exchange_ids[0] == "ex-000004"
    tight = ContextBudget(max_input_units=1_500, reserved_output_units=0)
    with pytest.raises(ContextBudgetExceededError, match="protected"):
        RequestView.from_exchange_log(
            log, context_budget=tight, continuation=cont, compaction_policy=ClosedExchangeWindowCompactor()
        )


def test_a_continuation_without_an_exchange_protects_the_whole_log() -> None:
    log = build_log([10] * 5)
    cont = ContinuationRef(reference_id="resp_1", provider="p", model="m")
    view = RequestView.from_exchange_log(log, continuation=cont)
    assert len(view.selection.protected_exchange_ids) == 5


def test_a_continuation_for_another_target_is_rejected() -> None:
    cont = ContinuationRef(reference_id="r", provider="other", model="m")
    with pytest.raises(ContextError, match="belongs to other/m"):
        RequestView.from_exchange_log(build_log([1]), target=RequestTarget(provider="p", model="m"), continuation=cont)


def test_required_contributions_are_placed_before_older_exchanges() -> None:
    log = build_log([200] * 20)
    required = ContextContribution(contribution_id="rules", source="project", content="r" * 600, required=True)
    view = RequestView.from_exchange_log(
        log,
        context_budget=SMALL,
        context_contributions=[required],
        compaction_policy=ClosedExchangeWindowCompactor(),
    )
    assert view.selection.selected_context_ids == ("rules",)
    assert units_of(view) == view.selection.selected_units <= 1_400


def test_optional_contributions_come_before_older_exchanges_and_drops_are_reported() -> None:
    log = build_log([200] * 5)
    small = ContextContribution(contribution_id="small", source="s", content="tiny", priority=1)
    huge = ContextContribution(contribution_id="huge", source="s", content="h" * 5_000)
    budget = ContextBudget(max_input_units=2_000, reserved_output_units=0)
    view = RequestView.from_exchange_log(
        log,
        context_budget=budget,
        context_contributions=[huge, small],
        compaction_policy=ClosedExchangeWindowCompactor(),
    )
    assert view.selection.selected_context_ids == ("small",)
    assert view.selection.omitted_context_ids == ("huge",)
    dropped = view.summary()["contributions"]["dropped"]
    assert dropped[0]["contribution_id"] == "huge" and dropped[0]["units"] > 5_000


def test_secret_contributions_never_reach_summary_or_to_dict() -> None:
    secret = ContextContribution(contribution_id="key", source="vault", content="sk-SECRET-123", sensitivity="secret")
    view = RequestView.from_exchange_log(build_log([5]), context_contributions=[secret])
    assert any("sk-SECRET-123" in (m["content"] or "") for m in view.messages())
    assert "sk-SECRET-123" not in json.dumps(view.summary())
    assert "sk-SECRET-123" not in json.dumps(view.to_dict())
    assert view.summary()["contributions"]["selected"][0]["digest"] == secret.digest


def test_contribution_revisions_are_kept_as_provenance() -> None:
    c = ContextContribution(contribution_id="m", source="memory", content="fact", revision="abc123")
    view = RequestView.from_exchange_log(build_log([1]), context_contributions=[c])
    assert view.provenance["contribution_revisions"] == {"m": "abc123"}


def test_same_inputs_give_the_same_request_id() -> None:
    def make() -> RequestView:
        return RequestView.from_exchange_log(
            build_log([200] * 20),
            instructions=SYSTEM,
            tool_schemas=TOOLS,
            context_budget=SMALL,
            compaction_policy=ClosedExchangeWindowCompactor(),
        )

    a, b = make(), make()
    assert a.request_id == b.request_id
    assert a == b
    other = RequestView.from_exchange_log(
        build_log([200] * 20),
        instructions=[{"role": "system", "content": "different"}],
        tool_schemas=TOOLS,
        context_budget=SMALL,
        compaction_policy=ClosedExchangeWindowCompactor(),
    )
    assert other.request_id != a.request_id


def test_summary_is_json_native() -> None:
    view = RequestView.from_exchange_log(
        build_log([200] * 20), context_budget=SMALL, compaction_policy=ClosedExchangeWindowCompactor()
    )
    summary = json.loads(json.dumps(view.summary()))
    assert summary["request_id"] == view.request_id
    assert summary["units"]["available"] == 1_400
    assert summary["units"]["used"] == view.selection.selected_units
    assert summary["exchanges"]["omitted"] == list(view.selection.omitted_exchange_ids)
    assert summary["receipts"][0]["input_exchange_ids"] == summary["exchanges"]["omitted"]


def test_to_dict_round_trips() -> None:
    view = RequestView.from_exchange_log(
        build_log([200] * 20, open_last=True),
        instructions=SYSTEM,
        tool_schemas=TOOLS,
        context_budget=SMALL,
        context_contributions=StaticContextContributor("n", "p", {"a": 1}).contribute(None),  # type: ignore[arg-type]
        artifact_refs=[ArtifactRef(artifact_id="a1")],
        compaction_policy=ClosedExchangeWindowCompactor(),
    )
    back = RequestView.from_dict(json.loads(json.dumps(view.to_dict())))
    assert back == view
    assert back.messages() == view.messages()


def test_categories_are_reported() -> None:
    log = build_log([200] * 20, calls=[0] * 10 + [2] * 10)
    view = RequestView.from_exchange_log(log, context_budget=SMALL, compaction_policy=ClosedExchangeWindowCompactor())
    assert view.selection.selected_categories == ("assistant", "tool_calls", "tool_results", "user")
    assert view.selection.omitted_categories == ("assistant", "tool_calls", "tool_results", "user")
    nocalls = RequestView.from_exchange_log(build_log([1], calls=[0]))
    assert nocalls.selection.selected_categories == ("assistant", "user")


def test_token_budgets_count_tokens() -> None:
    log = build_log([400] * 30)
    budget = ContextBudget(max_input_units=800, reserved_output_units=0, unit="tokens")
    view = RequestView.from_exchange_log(log, context_budget=budget, compaction_policy=ClosedExchangeWindowCompactor())
    counter = TokenCounter()
    sent = sum(counter.count(canonical_json(m)) for m in view.messages())
    assert sent == view.selection.selected_units <= 800
    assert view.selection.unit == "tokens"


class _Declared:
    """A model that declares a token window and, maybe, its own tokenizer."""

    max_input_units = 4000
    unit = "tokens"

    def __init__(self, tokenizer: str | None) -> None:
        self.tokenizer = tokenizer


@pytest.mark.parametrize(
    ("tokenizer", "counted_with", "estimated"),
    [
        (None, "cl100k_base", True),  # a SmolLM2 server: cl100k counts are an estimate, so labelled
        ("smollm2", "cl100k_base", True),  # a tokenizer the package does not know: the same
        ("cl100k_base", "cl100k_base", False),  # the model's own tokenizer: exact
        ("o200k_base", "o200k_base", False),  # counted with the model's own, not cl100k
    ],
)
def test_a_token_count_is_exact_only_with_the_models_own_tokenizer(
    tokenizer: str | None, counted_with: str, estimated: bool
) -> None:
    model = _Declared(tokenizer)
    budget = ContextBudget(max_input_units=4000, unit="tokens")
    view = RequestView.from_exchange_log(build_log([50] * 3), model=model, context_budget=budget)
    units = view.summary()["units"]
    assert units["counter"] == ["tokens", counted_with] and units["tokenizer"] == counted_with
    assert units["estimated"] is estimated
    counter = TokenCounter(counted_with)
    assert view.selection.selected_units == sum(counter.count(canonical_json(m)) for m in view.messages())


def test_characters_are_counted_exactly_and_a_bad_tokenizer_declaration_is_refused() -> None:
    units = RequestView.from_exchange_log(build_log([10])).summary()["units"]
    assert units["counter"] == ["characters"] and units["tokenizer"] is None and units["estimated"] is False
    with pytest.raises(ConfigurationError, match="tokenizer must be a tokenizer name"):
        RequestView.from_exchange_log(build_log([10]), model=_Declared(""))


def test_a_counter_in_the_wrong_unit_is_rejected() -> None:
    with pytest.raises(ConfigurationError, match="counts 'tokens'"):
        RequestView.from_exchange_log(build_log([1]), context_unit_counter=TokenCounter())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"instructions": [{"role": "assistant", "content": "x"}]}, r"instructions\[0\]\.role"),
        ({"instructions": [{"role": "system", "content": 3}]}, r"instructions\[0\]\.content"),
        ({"tool_schemas": [{"name": "a"}, {"name": "a"}]}, "duplicate tool 'a'"),
        ({"tool_schemas": [{"description": "no name"}]}, r"tool_schemas\[0\]\.name"),
        ({"tool_use_policy": "always"}, "tool_use_policy"),
    ],
)
def test_bad_request_inputs_are_rejected(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        RequestView.from_exchange_log(build_log([1]), **kwargs)  # type: ignore[arg-type]


def test_a_required_artifact_must_be_available() -> None:
    ref = ArtifactRef(artifact_id="report.pdf", required=True)
    with pytest.raises(ContextError, match=r"report\.pdf"):
        RequestView.from_exchange_log(build_log([1]), artifact_refs=[ref])
    view = RequestView.from_exchange_log(build_log([1]), artifact_refs=[ref], available_artifact_ids=["report.pdf"])
    assert view.artifact_refs == (ref,)


def test_a_model_declares_its_target() -> None:
    class Declaring:
        request_target = RequestTarget(provider="openai-compatible", model="m1", transport="http")

    view = RequestView.from_exchange_log(build_log([1]), model=Declaring())
    assert view.target.model == "m1"
    assert RequestView.from_exchange_log(build_log([1]), model=object()).target == RequestTarget()


def test_with_omission_drops_leading_exchanges_under_a_receipt() -> None:
    view = RequestView.from_exchange_log(build_log([50] * 6))
    drop = view.selection.selected_exchange_ids[:2]
    remaining = view.selected_items_json[6:]
    receipt = CompactionReceipt("r-1", drop, projection_digest(remaining), "test.trim", ("two turns",))
    trimmed = view.with_omission(drop, receipt)
    assert trimmed.selection.omitted_exchange_ids == drop
    assert trimmed.selected_items_json == remaining
    assert trimmed.selection.selected_units == units_of(trimmed)
    assert trimmed.request_id != view.request_id
    with pytest.raises(ContextError, match="protected"):
        last = view.selection.selected_exchange_ids
        view.with_omission(last, CompactionReceipt("r", last, projection_digest(()), "t"))
    with pytest.raises(ContextError, match="leading run"):
        view.with_omission(("ex-000003",), receipt)


# --------------------------------------------------------------------------- caching


class CountingCounter:
    """A real character counter that records how often it is asked."""

    unit = "characters"
    cache_key = None

    def __init__(self) -> None:
        self.calls = 0

    def count(self, text: str) -> int:
        self.calls += 1
        return len(text)


def test_unit_counts_of_closed_exchanges_are_counted_once() -> None:
    log = build_log([20] * 200)
    counter = CountingCounter()
    budget = ContextBudget(max_input_units=2_000, reserved_output_units=0)
    policy = ClosedExchangeWindowCompactor()
    RequestView.from_exchange_log(log, context_budget=budget, context_unit_counter=counter, compaction_policy=policy)
    first = counter.calls
    assert first >= 600  # every item of 200 closed exchanges counted once
    RequestView.from_exchange_log(log, context_budget=budget, context_unit_counter=counter, compaction_policy=policy)
    assert counter.calls == first  # nothing re-counted
    eid = log.open([{"role": "user", "content": "new"}]).exchange_id
    log.record_output(eid, {"role": "assistant", "content": "ok"})
    log.close(eid)
    RequestView.from_exchange_log(log, context_budget=budget, context_unit_counter=counter, compaction_policy=policy)
    assert counter.calls == first + 2


# --------------------------------------------------------------------------- properties


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[ExchangeLog, ContextBudget, list[ContextContribution], bool]:
    n = draw(st.integers(min_value=0, max_value=25))
    sizes = draw(st.lists(st.integers(min_value=0, max_value=300), min_size=n, max_size=n))
    calls = draw(st.lists(st.integers(min_value=0, max_value=3), min_size=n, max_size=n))
    open_last = n > 0 and draw(st.booleans())
    log = build_log(sizes, calls=calls, open_last=open_last)
    max_units = draw(st.integers(min_value=200, max_value=8_000))
    budget = ContextBudget(
        max_input_units=max_units,
        reserved_output_units=draw(st.integers(min_value=0, max_value=max_units // 4)),
        protected_recent_exchanges=draw(st.integers(min_value=0, max_value=4)),
    )
    contribs = [
        ContextContribution(
            contribution_id=f"c{i}",
            source="s",
            content="k" * draw(st.integers(min_value=0, max_value=400)),
            priority=draw(st.integers(min_value=-2, max_value=2)),
            required=draw(st.booleans()) and i == 0,
        )
        for i in range(draw(st.integers(min_value=0, max_value=4)))
    ]
    return log, budget, contribs, draw(st.booleans())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_property_a_view_fits_or_raises_and_never_breaks_the_rules(
    scenario: tuple[ExchangeLog, ContextBudget, list[ContextContribution], bool],
) -> None:
    log, budget, contribs, with_policy = scenario
    policy = ClosedExchangeWindowCompactor() if with_policy else None
    available = budget.available_input_units
    try:
        view = RequestView.from_exchange_log(
            log, instructions=SYSTEM, context_budget=budget, context_contributions=contribs, compaction_policy=policy
        )
    except ContextBudgetExceededError as exc:
        assert exc.required_units > exc.available_units == available
        return
    sel = view.selection
    all_ids = tuple(e.exchange_id for e in log.exchanges)
    # Fits, and the reported units are what is sent.
    assert sel.selected_units == units_of(view) <= available
    # History is a contiguous suffix; omitted + selected = the whole log.
    assert (*sel.omitted_exchange_ids, *sel.selected_exchange_ids) == all_ids
    # Protected exchanges are never omitted.
    assert set(sel.protected_exchange_ids) <= set(sel.selected_exchange_ids)
    assert len(sel.protected_exchange_ids) >= min(budget.protected_recent_exchanges, len(all_ids))
    if log.open_exchange is not None:
        assert log.open_exchange.exchange_id in sel.protected_exchange_ids
    # The receipt lists exactly the omitted exchanges; no omission without one.
    if sel.omitted_exchange_ids:
        assert with_policy
        assert [r.input_exchange_ids for r in view.compaction_receipts] == [sel.omitted_exchange_ids]
    else:
        assert view.compaction_receipts == ()
    # If everything fits, nothing is omitted.
    if sel.total_units <= available:
        assert sel.omitted_exchange_ids == () and sel.omitted_context_ids == ()
    # A tool result never appears without its declaring call before it.
    declared: set[str] = set()
    for message in view.messages():
        for call in message.get("tool_calls", []):
            declared.add(call["id"])
        if message["role"] == "tool":
            assert message["tool_call_id"] in declared
    # Required contributions are always there.
    assert {c.contribution_id for c in contribs if c.required} <= set(sel.selected_context_ids)
    # Deterministic.
    again = RequestView.from_exchange_log(
        log, instructions=SYSTEM, context_budget=budget, context_contributions=contribs, compaction_policy=policy
    )
    assert again == view


def test_compact_summary_folds_omitted_ids_into_runs() -> None:
    view = RequestView.from_exchange_log(
        build_log([200] * 20), context_budget=SMALL, compaction_policy=ClosedExchangeWindowCompactor()
    )
    full, compact = view.summary(), view.summary(compact=True)
    omitted = full["exchanges"]["omitted"]
    assert compact["exchanges"]["omitted"] == [[omitted[0], omitted[-1]]]
    assert compact["exchanges"]["omitted_count"] == full["exchanges"]["omitted_count"] == len(omitted)
    assert compact["receipts"][0]["input_exchange_ids"] == [[omitted[0], omitted[-1]]]
    assert compact["receipts"][0]["input_count"] == len(omitted)
    assert len(json.dumps(compact)) < len(json.dumps(full))


def tool_loop_log(turns: int, size: int = 200) -> ExchangeLog:
    """The model path's shape: the task opens exchange 1; later exchanges have no user input."""
    log = ExchangeLog("log-loop")
    for i in range(turns):
        inputs = [{"role": "user", "content": "TASK: count the words of every note"}] if i == 0 else []
        eid = log.open(inputs).exchange_id
        call = {"id": f"c{i}", "name": "lookup", "arguments": {"k": i}}
        log.record_output(eid, {"role": "assistant", "content": None, "tool_calls": [call]})
        log.record_tool_result(eid, f"c{i}", "r" * size)
        log.close(eid)
    return log


def test_compaction_keeps_the_task_ahead_of_the_history() -> None:
    log = tool_loop_log(20)
    budget = ContextBudget(max_input_units=1_500, reserved_output_units=0)
    view = RequestView.from_exchange_log(
        log, instructions=SYSTEM, context_budget=budget, compaction_policy=ClosedExchangeWindowCompactor()
    )
    assert view.selection.omitted_exchange_ids[0] == "ex-000001"  # the task's exchange is omitted...
    messages = view.messages()
    assert messages[0] == SYSTEM[0]
    assert messages[1] == {"role": "user", "content": "TASK: count the words of every note"}  # ...its task is not
    assert messages[2]["role"] == "assistant"
    assert view.summary()["pinned_task"] == "ex-000001/0"
    sel = view.selection
    assert sel.selected_units == units_of(view) <= budget.available_input_units
    assert sel.omitted_units + sel.selected_units == sel.total_units
    (receipt,) = view.compaction_receipts
    assert receipt.output_digest == projection_digest(view.selected_items_json)


def test_the_task_is_not_pinned_while_its_exchange_is_sent() -> None:
    view = RequestView.from_exchange_log(tool_loop_log(3), instructions=SYSTEM)
    assert view.summary()["pinned_task"] is None
    assert [m["role"] for m in view.messages()].count("user") == 1


def test_with_omission_keeps_the_task() -> None:
    view = RequestView.from_exchange_log(tool_loop_log(6, size=50))
    drop = view.selection.selected_exchange_ids[:2]
    remaining = view.selected_items_json[5:]
    receipt = CompactionReceipt("r-1", drop, projection_digest(remaining), "test.trim", ("two turns",))
    trimmed = view.with_omission(drop, receipt)
    assert trimmed.messages()[0]["content"] == "TASK: count the words of every note"
    assert trimmed.messages()[1]["role"] == "assistant"
    assert trimmed.selection.selected_units == units_of(trimmed)
