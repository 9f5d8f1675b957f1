"""Compaction policies: closed-window omission and model-written summaries, end to end."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from qitos.core._codec import canonical_json, sha256_hex
from qitos.core._exchange import ExchangeLog
from qitos.core.context import ContextBudget
from qitos.core.request_view import (
    CompactionError,
    CompactionPolicy,
    RequestTarget,
    RequestView,
    SummarizingCompactionPolicy,
    projection_digest,
)
from qitos.kit.context.compaction import ClosedExchangeWindowCompactor, SummaryCompactor, SummaryModel

SYSTEM = [{"role": "system", "content": "You help with notes."}]


def add_turn(log: ExchangeLog, i: int, size: int = 150) -> str:
    eid = log.open([{"role": "user", "content": f"note {i}: " + "n" * size}]).exchange_id
    log.record_output(
        eid, {"role": "assistant", "tool_calls": [{"id": f"c{i}", "name": "save", "arguments": {"i": i}}]}
    )
    log.record_tool_result(eid, f"c{i}", f"saved {i}")
    log.close(eid)
    return eid


def make_log(n: int) -> ExchangeLog:
    log = ExchangeLog("notes")
    for i in range(n):
        add_turn(log, i)
    return log


@dataclass(frozen=True)
class Reply:
    text: str


class CountingSummarizer:
    """A real, deterministic summary model: reports which exchanges and notes it was shown."""

    request_target = RequestTarget(provider="local", model="counting-summarizer")

    def __init__(self, *, pad: int = 0) -> None:
        self.transcripts: list[str] = []
        self.pad = pad

    def complete(self, view: RequestView) -> Reply:
        messages = view.messages()
        assert messages[0]["role"] == "system"
        transcript = messages[-1]["content"]
        self.transcripts.append(transcript)
        exchanges = [line[3:] for line in transcript.splitlines() if line.startswith("## ")]
        prior = "prior summary kept; " if transcript.startswith("Summary of the conversation before") else ""
        return Reply(f"{prior}summarized {', '.join(exchanges)}" + "." * self.pad)


class BrokenSummarizer:
    def complete(self, view: RequestView) -> Reply:
        raise ConnectionError("model endpoint unreachable")


class SilentSummarizer:
    def complete(self, view: RequestView) -> Reply:
        return Reply("   ")


BUDGET = ContextBudget(max_input_units=3_000, reserved_output_units=0)


# --------------------------------------------------------------------------- closed window


def test_closed_window_compactor_declares_what_it_omits() -> None:
    compactor = ClosedExchangeWindowCompactor()
    receipt = compactor.compact(
        exchange_ids=["ex-000001", "ex-000002"], selected_digest="a" * 64, required_units=900, available_units=500
    )
    assert receipt is not None
    assert receipt.input_exchange_ids == ("ex-000001", "ex-000002")
    assert receipt.output_digest == "a" * 64
    assert receipt.policy_id == "qitos.context.closed_exchange_window/v1"
    assert "ex-000001..ex-000002" in receipt.declared_losses[0] and "without a summary" in receipt.declared_losses[0]
    assert receipt.model_reference is None
    assert compactor.compact(exchange_ids=[], selected_digest="a" * 64, required_units=1, available_units=1) is None


def test_closed_window_compactor_is_stateless_and_a_zero_arg_factory() -> None:
    assert isinstance(ClosedExchangeWindowCompactor(), CompactionPolicy)
    assert ClosedExchangeWindowCompactor() == ClosedExchangeWindowCompactor()
    kwargs: dict[str, Any] = {
        "exchange_ids": ["ex-000001"],
        "selected_digest": "b" * 64,
        "required_units": 2,
        "available_units": 1,
    }
    assert ClosedExchangeWindowCompactor().compact(**kwargs) == ClosedExchangeWindowCompactor().compact(**kwargs)


def test_a_200_step_conversation_under_a_small_budget_always_fits_with_receipts() -> None:
    log = ExchangeLog("long")
    compactor = ClosedExchangeWindowCompactor()
    omitted_before: Sequence[str] = ()
    for step in range(200):
        eid = log.open([{"role": "user", "content": f"step {step} " + "s" * 120}]).exchange_id
        view = RequestView.from_exchange_log(
            log, instructions=SYSTEM, context_budget=BUDGET, compaction_policy=compactor
        )
        sent = sum(len(canonical_json(m)) for m in view.messages())
        assert sent == view.selection.selected_units <= BUDGET.available_input_units
        assert view.selection.selected_exchange_ids[-1] == eid
        omitted = view.selection.omitted_exchange_ids
        if omitted:
            assert view.compaction_receipts[-1].input_exchange_ids == omitted
        assert omitted[: len(omitted_before)] == omitted_before  # the window only moves forward
        omitted_before = omitted
        log.record_output(eid, {"role": "assistant", "tool_calls": [{"id": f"c{step}", "name": "f"}]})
        log.record_tool_result(eid, f"c{step}", "ok")
        log.close(eid)
    assert len(omitted_before) > 150


# --------------------------------------------------------------------------- summaries


def test_summary_model_protocol_is_satisfied_by_a_plain_class() -> None:
    assert isinstance(CountingSummarizer(), SummaryModel)
    compactor = SummaryCompactor(CountingSummarizer(), model_reference="local:counting")
    assert isinstance(compactor, SummarizingCompactionPolicy)


def test_summary_replaces_omitted_exchanges_and_is_placed_before_the_history() -> None:
    model = CountingSummarizer()
    compactor = SummaryCompactor(model, model_reference="local:counting", reserve_units=600)
    log = make_log(30)
    view = RequestView.from_exchange_log(log, instructions=SYSTEM, context_budget=BUDGET, compaction_policy=compactor)
    omitted = view.selection.omitted_exchange_ids
    assert omitted and omitted[0] == "ex-000001"
    messages = view.messages()
    assert messages[1]["content"].startswith("note 0:")  # the task (the log's first input) is kept
    summary = messages[2]
    assert summary["role"] == "user"
    assert summary["content"].startswith(f'<compaction-summary exchanges="ex-000001..{omitted[-1]}"')
    assert f"summarized {', '.join(omitted)}" in summary["content"]
    assert messages[3]["content"].startswith(f"note {len(omitted)}:")  # history resumes right after
    (receipt,) = view.compaction_receipts
    assert receipt.input_exchange_ids == omitted
    assert receipt.model_reference == "local:counting"
    assert receipt.policy_id == "qitos.context.summary/v1"
    assert receipt.output_digest == sha256_hex(canonical_json(summary))
    assert "summary written by local:counting" in receipt.declared_losses[0]
    sent = sum(len(canonical_json(m)) for m in messages)
    assert sent == view.selection.selected_units <= BUDGET.available_input_units
    assert view.summary()["compaction_summary"]["receipt_id"] == receipt.receipt_id
    # The model saw the verbatim omitted exchanges, with tool calls and results.
    assert "note 0: nnn" in model.transcripts[0]
    assert '[assistant calls save (c0)] {"i":0}' in model.transcripts[0]
    assert "[tool result c0] saved 0" in model.transcripts[0]


def test_summaries_are_incremental_and_cached() -> None:
    model = CountingSummarizer()
    compactor = SummaryCompactor(model, model_reference="local:counting", reserve_units=600)
    log = make_log(30)
    first = RequestView.from_exchange_log(log, context_budget=BUDGET, compaction_policy=compactor)
    again = RequestView.from_exchange_log(log, context_budget=BUDGET, compaction_policy=compactor)
    assert again == first and compactor.calls == 1
    for i in range(30, 33):
        add_turn(log, i)
    later = RequestView.from_exchange_log(log, context_budget=BUDGET, compaction_policy=compactor)
    assert compactor.calls == 2
    newly = later.selection.omitted_exchange_ids[len(first.selection.omitted_exchange_ids) :]
    second = model.transcripts[1]
    assert second.startswith("Summary of the conversation before these exchanges:")
    assert "## ex-000001\n" not in second
    assert all(f"## {eid}" in second for eid in newly)
    assert "prior summary kept" in later.messages()[1]["content"]  # after the kept task


def test_an_oversized_summary_raises_and_builds_nothing() -> None:
    compactor = SummaryCompactor(CountingSummarizer(pad=5_000), model_reference="local:verbose", reserve_units=600)
    with pytest.raises(CompactionError, match="more than reserve_units=600") as info:
        RequestView.from_exchange_log(make_log(30), context_budget=BUDGET, compaction_policy=compactor)
    assert info.value.policy_id == "qitos.context.summary/v1"


def test_a_failing_summary_model_raises_a_clear_error() -> None:
    compactor = SummaryCompactor(BrokenSummarizer(), model_reference="remote:down")
    with pytest.raises(CompactionError, match="model endpoint unreachable") as info:
        RequestView.from_exchange_log(make_log(30), context_budget=BUDGET, compaction_policy=compactor)
    assert isinstance(info.value.__cause__, ConnectionError)


def test_an_empty_summary_is_an_error_not_a_silent_wipe() -> None:
    compactor = SummaryCompactor(SilentSummarizer(), model_reference="local:silent")
    with pytest.raises(CompactionError, match="no summary text"):
        RequestView.from_exchange_log(make_log(30), context_budget=BUDGET, compaction_policy=compactor)


def test_a_summary_compactor_alone_cannot_authorize_blind_omission() -> None:
    compactor = SummaryCompactor(CountingSummarizer(), model_reference="m")
    with pytest.raises(CompactionError, match="compact_with_summary"):
        compactor.compact(exchange_ids=["ex-000001"], selected_digest="a" * 64, required_units=2, available_units=1)


def test_summary_source_limit_is_enforced() -> None:
    compactor = SummaryCompactor(CountingSummarizer(), model_reference="m", max_source_units=100)
    with pytest.raises(CompactionError, match="max_source_units=100"):
        RequestView.from_exchange_log(make_log(30), context_budget=BUDGET, compaction_policy=compactor)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model_reference": ""}, "model_reference"),
        ({"model_reference": "m", "reserve_units": 0}, "reserve_units"),
        ({"model_reference": "m", "max_source_units": -1}, "max_source_units"),
    ],
)
def test_summary_compactor_arguments_are_checked(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SummaryCompactor(CountingSummarizer(), **kwargs)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="no complete"):
        SummaryCompactor(object(), model_reference="m")  # type: ignore[arg-type]


def test_without_omission_the_summary_model_is_never_called() -> None:
    model = CountingSummarizer()
    compactor = SummaryCompactor(model, model_reference="m")
    view = RequestView.from_exchange_log(make_log(3), context_budget=BUDGET, compaction_policy=compactor)
    assert view.selection.omitted_exchange_ids == () and model.transcripts == []
    assert view.selected_items_json and projection_digest(view.selected_items_json)


def test_the_shipped_scripted_model_can_write_summaries() -> None:
    from qitos.models._scripted import ScriptedModel

    model = ScriptedModel(["The user filed notes 0 to 22 with save; every save succeeded."])
    compactor = SummaryCompactor(model, model_reference="scripted:summary", reserve_units=600)
    view = RequestView.from_exchange_log(make_log(30), context_budget=BUDGET, compaction_policy=compactor)
    assert "every save succeeded" in view.messages()[1]["content"]  # after the kept task
    assert view.compaction_receipts[0].model_reference == "scripted:summary"
    (request,) = model.requests
    assert request.messages()[-1]["content"].startswith("## ex-000001")
