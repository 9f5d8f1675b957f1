"""Compaction policies: how a request may lose old exchanges, with a receipt for every loss.

``ClosedExchangeWindowCompactor`` authorizes omitting the oldest eligible closed
exchanges *without* a summary and declares that loss. ``SummaryCompactor`` replaces them with a
model-written summary and declares what was summarized and by which model.

How a summary gets into the request: ``SummaryCompactor`` implements
:class:`~qitos.core.request_view.SummarizingCompactionPolicy`. ``RequestView.from_exchange_log``
leaves ``reserve_units`` of room, hands it the exchanges to omit, and places the returned summary
message (a ``user`` message wrapped in ``<compaction-summary>``) after the context contributions
and before the selected history. The receipt's ``output_digest`` is the SHA-256 of that message, its
``model_reference`` names the model, and its ``declared_losses`` say what the summary replaced. A
summary larger than ``reserve_units``, an empty summary or a failing model raise
:class:`~qitos.core.request_view.CompactionError` and no request is built.

Summaries are incremental: when the newly omitted exchanges extend the previously summarized ones
(same ids and digests), only the new exchanges and the previous summary are sent to the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from qitos.core._codec import canonical_json, sha256_hex
from qitos.core._exchange import Exchange, ExchangeIdRange, ExchangeLog
from qitos.core.context import ContextBudget, UnitCounter
from qitos.core.request_view import (
    CompactionError,
    CompactionReceipt,
    CompactionSummary,
    RequestView,
)

__all__ = ["ClosedExchangeWindowCompactor", "SummaryCompactor", "SummaryModel"]

DEFAULT_SUMMARY_INSTRUCTIONS = (
    "You compress the earlier part of an agent conversation so the agent can continue without it. "
    "Write a concise factual summary: the user's goals and constraints, decisions taken, tool calls "
    "made with their important results, facts learned, and open questions. Do not invent anything. "
    "Answer with the summary text only."
)


def _receipt_id(policy_id: str, exchange_ids: Sequence[str], output_digest: str) -> str:
    # The builder omits a contiguous run of exchanges, so first/last/count name it in O(1).
    span = [exchange_ids[0], exchange_ids[-1], len(exchange_ids)] if exchange_ids else []
    return "cmp-" + sha256_hex(canonical_json([policy_id, span, output_digest]))[:32]


def _span(ids: Sequence[str]) -> str:
    return ids[0] if len(ids) == 1 else f"{ids[0]}..{ids[-1]}"


@dataclass(frozen=True)
class ClosedExchangeWindowCompactor:
    """Omit the oldest eligible closed exchanges without a summary.

    RequestView owns eligibility and the ContextBudget recent-window boundary.
    This stateless policy authorizes that derived selection and records its loss;
    it never modifies an ExchangeLog or widens a budget or codec loss setting.
    """

    policy_id: str = "qitos.context.closed_exchange_window/v1"

    def compact(
        self, *, exchange_ids: Sequence[str], selected_digest: str, required_units: int, available_units: int
    ) -> CompactionReceipt | None:
        """A receipt for omitting exactly ``exchange_ids``; None if there is nothing to omit."""
        ids = exchange_ids if isinstance(exchange_ids, ExchangeIdRange) else tuple(exchange_ids)
        if not ids:
            return None
        return CompactionReceipt(
            receipt_id=_receipt_id(self.policy_id, ids, selected_digest),
            input_exchange_ids=ids,
            output_digest=selected_digest,
            policy_id=self.policy_id,
            declared_losses=(
                f"omitted {len(ids)} closed exchange(s) {_span(ids)} without a summary: their inputs, "
                f"outputs and tool results are not in the request (needed {required_units} units, "
                f"{available_units} available)",
            ),
        )


@runtime_checkable
class SummaryModel(Protocol):
    """What SummaryCompactor needs from a model: ``complete(view)`` returning an object whose
    ``.text`` is the answer. The qitos model adapters satisfy it."""

    def complete(self, view: RequestView) -> Any:
        """Answer the request."""
        ...


class SummaryCompactor:
    """Replace omitted exchanges with a model-written summary (see the module docstring).

    ``model_reference`` names the model in receipts (e.g. ``"openai:gpt-4o-mini"``).
    ``reserve_units`` is the room kept for the summary in the request; ``max_source_units`` caps
    what is sent to the summary model (in ``source_unit``, characters by default).
    """

    policy_id = "qitos.context.summary/v1"

    def __init__(
        self,
        model: SummaryModel,
        *,
        model_reference: str,
        reserve_units: int = 2_000,
        instructions: str = DEFAULT_SUMMARY_INSTRUCTIONS,
        max_source_units: int = 200_000,
    ) -> None:
        if not callable(getattr(model, "complete", None)):
            raise TypeError(f"SummaryCompactor: model {type(model).__name__} has no complete(view) method")
        if not isinstance(model_reference, str) or not model_reference.strip():
            raise ValueError("SummaryCompactor: model_reference must name the summarizing model")
        if not isinstance(reserve_units, int) or reserve_units <= 0:
            raise ValueError(f"SummaryCompactor: reserve_units must be a positive int, got {reserve_units!r}")
        if not isinstance(max_source_units, int) or max_source_units <= 0:
            raise ValueError(f"SummaryCompactor: max_source_units must be a positive int, got {max_source_units!r}")
        self.model = model
        self.model_reference = model_reference
        self.reserve_units = reserve_units
        self.instructions = instructions
        self.max_source_units = max_source_units
        # The last summary: (exchange ids, their digests, summary text).
        self._last: tuple[tuple[str, ...], tuple[str | None, ...], str] | None = None
        self.calls = 0

    def compact(
        self, *, exchange_ids: Sequence[str], selected_digest: str, required_units: int, available_units: int
    ) -> CompactionReceipt | None:
        """Not usable alone: summarizing needs the exchanges' contents. RequestView calls
        :meth:`compact_with_summary` for this policy."""
        raise CompactionError(
            "SummaryCompactor summarizes exchange contents; use it as compaction_policy of "
            "RequestView.from_exchange_log, which calls compact_with_summary",
            policy_id=self.policy_id,
        )

    def compact_with_summary(
        self,
        *,
        exchanges: Sequence[Exchange],
        selected_digest: str,
        required_units: int,
        available_units: int,
        counter: UnitCounter,
    ) -> CompactionSummary | None:
        """Summarize ``exchanges`` (incrementally when possible) and return the receipt and message."""
        if not exchanges:
            return None
        ids = tuple(e.exchange_id for e in exchanges)
        digests = tuple(e.digest for e in exchanges)
        previous, new = "", list(exchanges)
        if self._last is not None:
            last_ids, last_digests, last_text = self._last
            if ids == last_ids and digests == last_digests:
                return self._result(ids, last_text, required_units, available_units, counter)
            k = len(last_ids)
            if ids[:k] == last_ids and digests[:k] == last_digests:
                previous, new = last_text, list(exchanges[k:])
        text = self._summarize(previous, new)
        self._last = (ids, digests, text)
        return self._result(ids, text, required_units, available_units, counter)

    def _summarize(self, previous: str, exchanges: list[Exchange]) -> str:
        transcript = _transcript(exchanges)
        if previous:
            transcript = f"Summary of the conversation before these exchanges:\n{previous}\n\n{transcript}"
        if len(transcript) > self.max_source_units:
            raise CompactionError(
                f"the exchanges to summarize take {len(transcript)} characters, more than "
                f"max_source_units={self.max_source_units}",
                policy_id=self.policy_id,
            )
        log = ExchangeLog("summary-request")
        log.open([{"role": "user", "content": transcript}])
        view = RequestView.from_exchange_log(
            log,
            model=self.model,
            instructions=[{"role": "system", "content": self.instructions}],
            context_budget=ContextBudget(
                max_input_units=len(transcript) + len(self.instructions) + 1_000 + self.reserve_units,
                reserved_output_units=self.reserve_units,
            ),
            protocol_id="qitos.summary",
            tool_use_policy="none",
        )
        self.calls += 1
        response = self.model.complete(view)
        text = getattr(response, "text", None)
        if not isinstance(text, str) or not text.strip():
            raise CompactionError(
                f"summary model {self.model_reference} returned no summary text", policy_id=self.policy_id
            )
        return text.strip()

    def _result(
        self, ids: tuple[str, ...], text: str, required_units: int, available_units: int, counter: UnitCounter
    ) -> CompactionSummary:
        message = {
            "role": "user",
            "content": (
                f'<compaction-summary exchanges="{_span(ids)}" model="{self.model_reference}">\n'
                f"{text}\n</compaction-summary>"
            ),
        }
        units = counter.count(canonical_json(message))
        if units > self.reserve_units:
            raise CompactionError(
                f"the summary of {_span(ids)} by {self.model_reference} takes {units} {counter.unit}, more than "
                f"reserve_units={self.reserve_units}",
                policy_id=self.policy_id,
            )
        digest = sha256_hex(canonical_json(message))
        receipt = CompactionReceipt(
            receipt_id=_receipt_id(self.policy_id, ids, digest),
            input_exchange_ids=ids,
            output_digest=digest,
            policy_id=self.policy_id,
            declared_losses=(
                f"replaced {len(ids)} closed exchange(s) {_span(ids)} with a summary written by "
                f"{self.model_reference}; verbatim inputs, outputs, tool arguments and tool results are not "
                f"in the request (needed {required_units} units, {available_units} available)",
            ),
            model_reference=self.model_reference,
        )
        return CompactionSummary(receipt=receipt, message=message)


def _transcript(exchanges: Sequence[Exchange]) -> str:
    lines: list[str] = []
    for exchange in exchanges:
        lines.append(f"## {exchange.exchange_id}")
        for item in exchange.items:
            if item.role == "tool":
                lines.append(f"[tool result {item.tool_call_id}] {item.content or ''}")
            elif item.tool_calls:
                if item.content:
                    lines.append(f"[assistant] {item.content}")
                lines.extend(
                    f"[assistant calls {c.name} ({c.id})] {canonical_json(dict(c.arguments))}" for c in item.tool_calls
                )
            else:
                lines.append(f"[{item.role}] {item.content or ''}")
    return "\n".join(lines)
