"""RequestView: one immutable, deterministic, provider-neutral model request.

``RequestView.from_exchange_log(log, ...)`` builds the request a model adapter sends:

1. instructions, tool schemas and *required* contributions are always placed;
2. the ``protected_recent_exchanges`` newest exchanges, the open exchange and (conservatively)
   everything from a continuation's exchange on are always placed;
3. then optional contributions (by the selection policy) and then older closed exchanges, newest
   first, as long as they fit. The selected history is always a contiguous suffix of the log.

If everything fits, nothing is omitted. If not, the oldest closed exchanges may be omitted only
through an explicit compaction policy: its ``compact(exchange_ids=, selected_digest=,
required_units=, available_units=)`` receives exactly the ids to omit and the SHA-256 of the
selected projection (the selected exchange items' canonical JSON texts joined by newlines), and
must return a :class:`CompactionReceipt` listing exactly those ids. No policy, a policy that
returns None, or protected items that alone exceed the budget raise
:class:`ContextBudgetExceededError`; a policy that fails or overflows raises
:class:`CompactionError`, and no request is built. Receipts passed in from earlier requests are
carried along but never authorize a new omission.

A *summarizing* policy (:class:`SummarizingCompactionPolicy`, e.g. the kit ``SummaryCompactor``)
is given the omitted exchanges themselves and returns a receipt plus one summary message. The
builder leaves ``reserve_units`` of room for it and places the summary right after the context
contributions, before the selected history; the receipt's ``output_digest`` is the SHA-256 of the
summary message's canonical JSON.

The task is never dropped: when the first exchange is omitted, the run's first input (the log's
first item, a ``user`` message: the task) is kept like the instructions, as a ``task`` context
record placed after the contributions and before any summary, and its units are reserved before
the omission is computed. ``summary()["pinned_task"]`` names it.

Exchanges are omitted whole, so a tool result is never sent without the assistant call that
declared it. Unit counts come from the log's incremental projection (prefix sums per counter), so a
build costs O(selected items + log n), not a re-count of the whole log.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, cast, runtime_checkable

from qitos.core._codec import canonical_json, sha256_hex
from qitos.core._errors import ConfigurationError, ContextError
from qitos.core._exchange import (
    CATEGORY_BITS,
    Exchange,
    ExchangeIdRange,
    ExchangeLog,
    ItemIdRange,
    categories_from_mask,
)
from qitos.core._output import FINAL_ANSWER_TOOL, STRUCTURED_OUTPUT
from qitos.core.context import (
    PLACEMENTS,
    ContextBudget,
    ContextBudgetExceededError,
    ContextContribution,
    ContextSelectionPolicy,
    PriorityContextSelectionPolicy,
    UnitCounter,
    counts_exactly,
    unit_counter_for,
)

__all__ = [
    "CompactionPolicy",
    "CompactionReceipt",
    "ContextBudgetExceededError",
    "RequestView",
]

REQUEST_VIEW_SCHEMA_VERSION = "qitos.request_view/v1"
_BUILDER = "qitos.request_builder/v1"
_SHA256 = re.compile(r"[0-9a-f]{64}")
TOOL_USE_POLICIES: tuple[str, ...] = ("auto", "required", "none")
"""The tool-use policies a request may have besides the name of one of its tools."""
_INSTRUCTION_ROLES = frozenset({"system", "developer", "user"})


class CompactionError(ContextError):
    """A compaction policy failed, broke its contract or overflowed; no request was built."""

    def __init__(self, message: str, *, policy_id: str = "unknown") -> None:
        super().__init__(message)
        self.policy_id = policy_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_compaction_error, (self.__class__, str(self), self.policy_id))


def _rebuild_compaction_error(cls: type[CompactionError], message: str, policy_id: str) -> CompactionError:
    return cls(message, policy_id=policy_id)


def projection_digest(items_json: Iterable[str]) -> str:
    """SHA-256 of a selected projection: item JSON texts joined by newlines."""
    return sha256_hex("\n".join(items_json))


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestTarget:
    """Which provider/model/transport a request is meant for, as declared (never inferred)."""

    provider: str = "unspecified"
    model: str = "unspecified"
    transport: str = "unspecified"
    api_mode: str = "chat"

    def to_dict(self) -> dict[str, str]:
        """JSON-native form."""
        return {"provider": self.provider, "model": self.model, "transport": self.transport, "api_mode": self.api_mode}

    @classmethod
    def from_model(cls, model: Any) -> RequestTarget:
        """The target a model adapter declares through ``request_target`` (attribute or method);
        an adapter that declares none gets the unspecified target."""
        declared = getattr(model, "request_target", None)
        if callable(declared):
            declared = declared()
        if declared is None:
            return cls()
        if isinstance(declared, RequestTarget):
            return declared
        if isinstance(declared, Mapping):
            return cls(**dict(declared))
        raise ConfigurationError(f"{type(model).__name__}.request_target must be a RequestTarget or mapping")


REASONING_EFFORTS: tuple[str, ...] = ("minimal", "low", "medium", "high")
"""The reasoning efforts a request may ask for (``ReasoningPolicy.effort``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReasoningPolicy:
    """How much a model should reason, and how provider reasoning content is treated when replayed.

    ``effort`` (None: the provider's default) is sent by the OpenAI-compatible adapter as
    ``reasoning_effort``; servers without reasoning models ignore it. The local (embedded) adapter
    has no reasoning setting and ignores it.

    ``mode`` and ``allow_loss`` are part of the request's identity but drive no adapter today: the
    built-in adapters keep no provider reasoning content in the exchange log, so there is nothing
    to preserve, drop or replay whatever the mode.
    """

    mode: Literal["preserve_if_supported", "drop", "inline_replay"] = "preserve_if_supported"
    allow_loss: bool = False
    effort: str | None = None

    def __post_init__(self) -> None:
        if self.effort is not None and self.effort not in REASONING_EFFORTS:
            raise ConfigurationError(
                f"ReasoningPolicy.effort: must be None or one of {list(REASONING_EFFORTS)}, got {self.effort!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form (``effort`` only when set, so older request ids are unchanged)."""
        out: dict[str, Any] = {"mode": self.mode, "allow_loss": self.allow_loss}
        if self.effort is not None:
            out["effort"] = self.effort
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class ContinuationRef:
    """A provider-side continuation (e.g. a previous response id) the request builds on.

    ``exchange_id`` is the exchange whose response it continues: that exchange and every later one
    are protected. ``None`` protects the whole log (the conservative choice).
    """

    reference_id: str
    provider: str
    model: str
    api_mode: str = "chat"
    exchange_id: str | None = None
    payload_digest: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form."""
        return {
            "reference_id": self.reference_id,
            "provider": self.provider,
            "model": self.model,
            "api_mode": self.api_mode,
            "exchange_id": self.exchange_id,
            "payload_digest": self.payload_digest,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class ArtifactRef:
    """A reference to an artifact (file, image) the request relies on; the body is not embedded."""

    artifact_id: str
    media_type: str = "application/octet-stream"
    digest: str | None = None
    required: bool = False
    description: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form."""
        return {
            "artifact_id": self.artifact_id,
            "media_type": self.media_type,
            "digest": self.digest,
            "required": self.required,
            "description": self.description,
        }


@dataclass(frozen=True)
class SelectionReport:
    """What a request selected and omitted, and why, with unit counts."""

    selected_item_ids: Sequence[str]
    omitted_item_ids: Sequence[str]
    selected_exchange_ids: Sequence[str]
    omitted_exchange_ids: Sequence[str]
    selected_categories: Sequence[str]
    omitted_categories: Sequence[str]
    selected_context_ids: Sequence[str]
    omitted_context_ids: Sequence[str]
    total_units: int
    selected_units: int
    omitted_units: int
    unit: str
    reasons: Sequence[str] = ()
    protected_exchange_ids: Sequence[str] = ()
    available_units: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form."""
        return {
            "selected_item_ids": list(self.selected_item_ids),
            "omitted_item_ids": list(self.omitted_item_ids),
            "selected_exchange_ids": list(self.selected_exchange_ids),
            "omitted_exchange_ids": list(self.omitted_exchange_ids),
            "selected_categories": list(self.selected_categories),
            "omitted_categories": list(self.omitted_categories),
            "selected_context_ids": list(self.selected_context_ids),
            "omitted_context_ids": list(self.omitted_context_ids),
            "total_units": self.total_units,
            "selected_units": self.selected_units,
            "omitted_units": self.omitted_units,
            "unit": self.unit,
            "reasons": list(self.reasons),
            "protected_exchange_ids": list(self.protected_exchange_ids),
            "available_units": self.available_units,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SelectionReport:
        """Inverse of :meth:`to_dict`."""

        def ids(name: str) -> tuple[str, ...]:
            return tuple(str(x) for x in data.get(name, ()))

        return cls(
            ids("selected_item_ids"),
            ids("omitted_item_ids"),
            ids("selected_exchange_ids"),
            ids("omitted_exchange_ids"),
            ids("selected_categories"),
            ids("omitted_categories"),
            ids("selected_context_ids"),
            ids("omitted_context_ids"),
            int(data["total_units"]),
            int(data["selected_units"]),
            int(data["omitted_units"]),
            str(data["unit"]),
            ids("reasons"),
            ids("protected_exchange_ids"),
            int(data.get("available_units", 0)),
        )


@dataclass(frozen=True)
class CompactionReceipt:
    """Declares a lossy transform of a request: which exchanges were omitted (or summarized), the
    digest of what replaced them, which policy did it, what was lost and by which model."""

    receipt_id: str
    input_exchange_ids: Sequence[str]
    output_digest: str
    policy_id: str
    declared_losses: tuple[str, ...] = ()
    model_reference: str | None = None

    def __post_init__(self) -> None:
        for name in ("receipt_id", "policy_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"CompactionReceipt.{name}: must be a non-empty string, got {value!r}")
        if not isinstance(self.output_digest, str) or not _SHA256.fullmatch(self.output_digest):
            raise ValueError(
                f"CompactionReceipt.output_digest: must be a lowercase SHA-256, got {self.output_digest!r}"
            )
        if not isinstance(self.input_exchange_ids, tuple | ExchangeIdRange):
            object.__setattr__(self, "input_exchange_ids", tuple(self.input_exchange_ids))
        object.__setattr__(self, "declared_losses", tuple(self.declared_losses))

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form."""
        return {
            "receipt_id": self.receipt_id,
            "input_exchange_ids": list(self.input_exchange_ids),
            "output_digest": self.output_digest,
            "policy_id": self.policy_id,
            "declared_losses": list(self.declared_losses),
            "model_reference": self.model_reference,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CompactionReceipt:
        """Inverse of :meth:`to_dict`."""
        return cls(
            receipt_id=data["receipt_id"],
            input_exchange_ids=tuple(data["input_exchange_ids"]),
            output_digest=data["output_digest"],
            policy_id=data["policy_id"],
            declared_losses=tuple(data.get("declared_losses", ())),
            model_reference=data.get("model_reference"),
        )


@dataclass(frozen=True, kw_only=True)
class CompactionSummary:
    """What a summarizing policy returns: the receipt and the summary message that replaces the
    omitted exchanges (role system, developer or user; string content)."""

    receipt: CompactionReceipt
    message: Mapping[str, Any]


@runtime_checkable
class CompactionPolicy(Protocol):
    """Authorizes omitting the given exchanges and declares the loss in a receipt."""

    def compact(
        self, *, exchange_ids: Sequence[str], selected_digest: str, required_units: int, available_units: int
    ) -> CompactionReceipt | None:
        """A receipt listing exactly ``exchange_ids``, or None to refuse."""
        ...


@runtime_checkable
class SummarizingCompactionPolicy(Protocol):
    """A compaction policy that replaces omitted exchanges with a summary message.

    ``reserve_units`` is the room the builder leaves for the summary.
    """

    reserve_units: int

    def compact_with_summary(
        self,
        *,
        exchanges: Sequence[Exchange],
        selected_digest: str,
        required_units: int,
        available_units: int,
        counter: UnitCounter,
    ) -> CompactionSummary | None:
        """A receipt for exactly these exchanges plus the summary message, or None to refuse."""
        ...


# --------------------------------------------------------------------------- the view


@dataclass(frozen=True)
class RequestView:
    """One immutable, deterministic provider-neutral model request view.

    Tool use: ``tool_use_policy`` is what the agent asks of this request: ``auto`` (the model
    chooses), ``required`` (it must call a tool), ``none`` (it must not) or the name of one of the
    request's tools (it must call that one). ``tool_use_satisfied`` says that the run already used
    a tool, which fulfils a ``required`` or named policy: :meth:`tool_choice` is then ``auto``, so
    "required until a tool was used, then auto" is one policy. Adapters send :meth:`tool_choice`
    (the OpenAI-compatible adapter as ``tool_choice``; the local adapter as its grammar).

    What the built-in adapters send: :meth:`messages`, :meth:`tools`, :meth:`tool_choice` and
    ``reasoning_policy.effort`` (see :class:`ReasoningPolicy`); a request for a typed answer
    (:meth:`output_schema`) goes out as its ``final_answer`` tool or as a ``response_format``. The
    other fields record how the request was built and are not sent: ``context_budget``,
    ``selection``, ``compaction_receipts``, ``provenance_json``, ``steering_boundary_json``,
    ``correlation_facts_json`` and ``protocol_id`` are for traces and checks; the other
    ``capability_requirements`` than ``structured_output``, ``continuation`` (chat completions have
    no previous-response id) and ``artifact_refs`` (bodies are not embedded) are ignored by both
    built-in adapters.
    """

    request_id: str
    target: RequestTarget
    source_log_id: str
    source_log_digest: str
    selected_items_json: tuple[str, ...] = field(repr=False)
    instructions_json: tuple[str, ...] = field(default=(), repr=False)
    tool_schemas_json: tuple[str, ...] = field(default=(), repr=False)
    context_json: tuple[str, ...] = field(default=(), repr=False)
    capability_requirements: tuple[str, ...] = ()
    reasoning_policy: ReasoningPolicy = field(default_factory=ReasoningPolicy)
    continuation: ContinuationRef | None = None
    context_budget: ContextBudget = field(default_factory=ContextBudget)
    selection: SelectionReport = field(
        default_factory=lambda: SelectionReport((), (), (), (), (), (), (), (), 0, 0, 0, "characters")
    )
    compaction_receipts: tuple[CompactionReceipt, ...] = ()
    artifact_refs: tuple[ArtifactRef, ...] = ()
    steering_boundary_json: str = "{}"
    correlation_facts_json: tuple[str, ...] = field(default=(), repr=False)
    provenance_json: str = "{}"
    protocol_id: str = "unknown"
    tool_use_policy: str = "auto"
    tool_use_satisfied: bool = False
    schema_version: str = REQUEST_VIEW_SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.schema_version != REQUEST_VIEW_SCHEMA_VERSION:
            raise ContextError(f"unsupported request view schema {self.schema_version!r}")
        policy = self.tool_use_policy
        if policy not in TOOL_USE_POLICIES and policy not in self._tool_names():
            raise ConfigurationError(
                f"tool_use_policy: must be auto, required, none or the name of one of the request's tools "
                f"{self._tool_names()}, got {policy!r}"
            )
        if not isinstance(self.tool_use_satisfied, bool):
            raise ConfigurationError(f"tool_use_satisfied: must be a bool, got {self.tool_use_satisfied!r}")

    def _tool_names(self) -> list[str]:
        return [str(json.loads(text).get("name")) for text in self.tool_schemas_json]

    # ------------------------------------------------------------------ reading

    @property
    def selected_items(self) -> tuple[dict[str, Any], ...]:
        """The selected exchange items as message dicts."""
        return tuple(json.loads(text) for text in self.selected_items_json)

    @property
    def provenance(self) -> dict[str, Any]:
        """Builder provenance: policies used, dropped contributions, revisions, authorizing receipt."""
        value: dict[str, Any] = json.loads(self.provenance_json)
        return value

    def messages(self) -> list[dict[str, Any]]:
        """The chat messages to send, in order: instructions, placed context contributions (and a
        compaction summary, if any), then the selected exchange items."""
        out = [json.loads(text) for text in self.instructions_json]
        out.extend(json.loads(text)["message"] for text in self.context_json)
        out.extend(json.loads(text) for text in self.selected_items_json)
        return out

    def tools(self) -> list[dict[str, Any]]:
        """The tool schemas as given: ``{"name", "description", "parameters"}``."""
        return [json.loads(text) for text in self.tool_schemas_json]

    def output_schema(self) -> dict[str, Any] | None:
        """The JSON schema a typed final answer must match, when the request asks for one
        (``structured_output`` among its capability requirements): the parameters of its
        ``final_answer`` tool (see ``qitos.core._output``). None for a request for plain text."""
        if STRUCTURED_OUTPUT not in self.capability_requirements:
            return None
        for text in self.tool_schemas_json:
            schema = json.loads(text)
            if schema.get("name") == FINAL_ANSWER_TOOL:
                return dict(schema.get("parameters") or {})
        return None

    def tool_choice(self) -> str | None:
        """What the model is asked about tools: ``auto``, ``required``, ``none`` or a tool's name;
        None when the request has no tools. A ``required`` or named policy that is already
        satisfied (``tool_use_satisfied``) becomes ``auto``."""
        if not self.tool_schemas_json:
            return None
        policy = self.tool_use_policy
        if policy in ("auto", "none"):
            return policy
        return "auto" if self.tool_use_satisfied else policy

    def summary(self, *, compact: bool = False) -> dict[str, Any]:
        """JSON-native summary for traces and the viewer. Never contains secret content (nor any
        contribution content: only ids, units and digests).

        With ``compact=True`` the omitted exchange ids (in ``exchanges.omitted`` and in each
        receipt's ``input_exchange_ids``) are given as runs ``[[first, last], ...]`` instead of every
        id, so a summary written on every step of a long run stays small; ``omitted_count`` and
        ``input_count`` give the counts in both forms.
        """
        sel = self.selection
        prov = self.provenance
        counter = prov.get("counter") or [sel.unit]
        contexts = [json.loads(text) for text in self.context_json]

        def ids(values: Sequence[str]) -> list[Any]:
            return _id_runs(values) if compact else list(values)

        receipts = []
        for receipt in self.compaction_receipts:
            record = receipt.to_dict()
            record["input_exchange_ids"] = ids(receipt.input_exchange_ids)
            record["input_count"] = len(receipt.input_exchange_ids)
            receipts.append(record)
        return {
            "request_id": self.request_id,
            "schema_version": self.schema_version,
            "source_log_id": self.source_log_id,
            "source_log_digest": self.source_log_digest,
            "target": self.target.to_dict(),
            "unit": sel.unit,
            "units": {
                "used": sel.selected_units,
                "available": self.context_budget.available_input_units,
                "max_input": self.context_budget.max_input_units,
                "reserved_output": self.context_budget.output_reserve,
                "total": sel.total_units,
                "omitted": sel.omitted_units,
                "counter": list(counter),
                "tokenizer": counter[1] if counter[0] == "tokens" and len(counter) > 1 else None,
                "estimated": not counts_exactly(counter, prov.get("model_tokenizer")),
            },
            "exchanges": {
                "selected": list(sel.selected_exchange_ids),
                "omitted": ids(sel.omitted_exchange_ids),
                "omitted_count": len(sel.omitted_exchange_ids),
                "protected": list(sel.protected_exchange_ids),
            },
            "contributions": {
                "selected": [
                    {k: c[k] for k in ("contribution_id", "source", "units", "digest", "sensitivity", "revision")}
                    for c in contexts
                    if c["kind"] == "contribution"
                ],
                "dropped": list(prov.get("dropped_contributions", [])),
            },
            "compaction_summary": next(
                ({"receipt_id": c["receipt_id"], "units": c["units"]} for c in contexts if c["kind"] == "summary"),
                None,
            ),
            "pinned_task": next((c["item_id"] for c in contexts if c["kind"] == "task"), None),
            "receipts": receipts,
            "authorizing_receipt_ids": list(prov.get("authorizing_receipt_ids", [])),
            "reasons": list(sel.reasons),
            "tools": [json.loads(t).get("name") for t in self.tool_schemas_json],
            "messages": len(self.instructions_json) + len(self.context_json) + len(self.selected_items_json),
        }

    # ------------------------------------------------------------------ building

    @classmethod
    def from_exchange_log(
        cls,
        log: ExchangeLog,
        *,
        model: Any = None,
        target: RequestTarget | None = None,
        instructions: Iterable[Mapping[str, Any]] = (),
        tool_schemas: Iterable[Mapping[str, Any]] = (),
        capability_requirements: Iterable[str] = (),
        reasoning_policy: ReasoningPolicy | None = None,
        continuation: ContinuationRef | None = None,
        context_budget: ContextBudget | None = None,
        context_contributions: Iterable[ContextContribution] = (),
        context_selection_policy: Any = None,
        context_unit_counter: Any = None,
        compaction_receipts: Iterable[CompactionReceipt] = (),
        compaction_policy: Any = None,
        artifact_refs: Iterable[ArtifactRef] = (),
        available_artifact_ids: Iterable[str] | None = None,
        protocol_id: str = "unknown",
        tool_use_policy: str = "auto",
        tool_use_satisfied: bool = False,
    ) -> RequestView:
        """Build the request for the log's current state. See the module docstring for the rules."""
        return _Builder(
            log=log,
            budget=context_budget or ContextBudget(),
            counter=context_unit_counter,
            tokenizer=_model_tokenizer(model),
            selection_policy=cast(ContextSelectionPolicy, context_selection_policy or PriorityContextSelectionPolicy()),
            compaction_policy=compaction_policy,
        ).build(
            target=target if target is not None else RequestTarget.from_model(model),
            instructions=instructions,
            tool_schemas=tool_schemas,
            capability_requirements=tuple(capability_requirements),
            reasoning_policy=reasoning_policy or ReasoningPolicy(),
            continuation=continuation,
            contributions=tuple(context_contributions),
            prior_receipts=tuple(compaction_receipts),
            artifact_refs=tuple(artifact_refs),
            available_artifact_ids=None if available_artifact_ids is None else frozenset(available_artifact_ids),
            protocol_id=protocol_id,
            tool_use_policy=tool_use_policy,
            tool_use_satisfied=tool_use_satisfied,
        )

    def with_omission(
        self, exchange_ids: Sequence[str], receipt: CompactionReceipt, *, counter: UnitCounter | None = None
    ) -> RequestView:
        """A new view without the *oldest* selected exchanges ``exchange_ids``, authorized by
        ``receipt`` (used by declarative context policies that trim history).

        The ids must be a leading run of the selected exchanges, none protected; the receipt must
        list exactly them and its ``output_digest`` must be the digest of the remaining selected
        projection (:func:`projection_digest`).
        """
        ids = tuple(exchange_ids)
        sel = self.selection
        if not ids:
            raise ContextError("with_omission: no exchange ids given")
        if tuple(sel.selected_exchange_ids[: len(ids)]) != ids:
            raise ContextError(
                f"with_omission: {list(ids)} is not a leading run of the selected exchanges "
                f"{list(sel.selected_exchange_ids[: len(ids) + 1])}..."
            )
        protected = set(sel.protected_exchange_ids).intersection(ids)
        if protected:
            raise ContextError(f"with_omission: protected exchange(s) {sorted(protected)} can never be omitted")
        if receipt.input_exchange_ids != ids:
            raise CompactionError(
                f"receipt {receipt.receipt_id!r} lists {list(receipt.input_exchange_ids)} but {list(ids)} are omitted",
                policy_id=receipt.policy_id,
            )
        dropped = set(ids)
        k = 0
        while k < len(sel.selected_item_ids) and sel.selected_item_ids[k].split("/", 1)[0] in dropped:
            k += 1
        remaining = self.selected_items_json[k:]
        if receipt.output_digest != projection_digest(remaining):
            raise CompactionError(
                f"receipt {receipt.receipt_id!r} output_digest does not match the remaining projection",
                policy_id=receipt.policy_id,
            )
        counter = counter or unit_counter_for(sel.unit, tokenizer=self.provenance.get("model_tokenizer"))
        dropped_units = sum(counter.count(text) for text in self.selected_items_json[:k])
        context_json = self.context_json
        task = None
        if not sel.omitted_item_ids and k:  # the log's first item (the task) is among the dropped
            task = _task_record(sel.selected_item_ids[0], self.selected_items_json[0], counter.count)
        if task is not None:
            dropped_units -= task["units"]
            summaries = [i for i, text in enumerate(context_json) if json.loads(text)["kind"] == "summary"]
            at = summaries[0] if summaries else len(context_json)
            context_json = (*context_json[:at], canonical_json(task), *context_json[at:])
        prov = self.provenance
        prov["authorizing_receipt_ids"] = [*prov.get("authorizing_receipt_ids", []), receipt.receipt_id]
        new_selection = replace(
            sel,
            selected_item_ids=sel.selected_item_ids[k:],
            omitted_item_ids=(*sel.omitted_item_ids, *sel.selected_item_ids[:k]),
            selected_exchange_ids=sel.selected_exchange_ids[len(ids) :],
            omitted_exchange_ids=(*sel.omitted_exchange_ids, *ids),
            selected_units=sel.selected_units - dropped_units,
            omitted_units=sel.omitted_units + dropped_units,
            reasons=(*sel.reasons, f"{receipt.policy_id} omitted {_span(ids)} (receipt {receipt.receipt_id})"),
        )
        return replace(
            self,
            request_id="req-" + sha256_hex(canonical_json([self.request_id, receipt.to_dict()])),
            selected_items_json=remaining,
            context_json=context_json,
            selection=new_selection,
            compaction_receipts=(*self.compaction_receipts, receipt),
            provenance_json=canonical_json(prov),
        )

    # ------------------------------------------------------------------ persistence

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form. Secret contribution content is replaced by its digest, so a view with
        secrets round-trips for inspection but is no longer sendable."""
        contexts = []
        for text in self.context_json:
            record = json.loads(text)
            if record.get("sensitivity") == "secret":
                record["message"] = {"role": record["message"]["role"], "content": None}
                record["redacted"] = True
            contexts.append(record)
        return {
            "schema_version": self.schema_version,
            "request_id": self.request_id,
            "target": self.target.to_dict(),
            "source_log_id": self.source_log_id,
            "source_log_digest": self.source_log_digest,
            "selected_items": list(self.selected_items),
            "instructions": [json.loads(t) for t in self.instructions_json],
            "tool_schemas": self.tools(),
            "context": contexts,
            "capability_requirements": list(self.capability_requirements),
            "reasoning_policy": self.reasoning_policy.to_dict(),
            "continuation": None if self.continuation is None else self.continuation.to_dict(),
            "context_budget": self.context_budget.to_dict(),
            "selection": self.selection.to_dict(),
            "compaction_receipts": [r.to_dict() for r in self.compaction_receipts],
            "artifact_refs": [a.to_dict() for a in self.artifact_refs],
            "steering_boundary": json.loads(self.steering_boundary_json),
            "correlation_facts": [json.loads(t) for t in self.correlation_facts_json],
            "provenance": self.provenance,
            "protocol_id": self.protocol_id,
            "tool_use_policy": self.tool_use_policy,
            "tool_use_satisfied": self.tool_use_satisfied,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestView:
        """Inverse of :meth:`to_dict`."""
        cont = data.get("continuation")
        return cls(
            schema_version=data["schema_version"],
            request_id=data["request_id"],
            target=RequestTarget(**data["target"]),
            source_log_id=data["source_log_id"],
            source_log_digest=data["source_log_digest"],
            selected_items_json=tuple(canonical_json(i) for i in data["selected_items"]),
            instructions_json=tuple(canonical_json(i) for i in data["instructions"]),
            tool_schemas_json=tuple(canonical_json(i) for i in data["tool_schemas"]),
            context_json=tuple(canonical_json(i) for i in data["context"]),
            capability_requirements=tuple(data["capability_requirements"]),
            reasoning_policy=ReasoningPolicy(**data["reasoning_policy"]),
            continuation=None if cont is None else ContinuationRef(**cont),
            context_budget=ContextBudget.from_dict(data["context_budget"]),
            selection=SelectionReport.from_dict(data["selection"]),
            compaction_receipts=tuple(CompactionReceipt.from_dict(r) for r in data["compaction_receipts"]),
            artifact_refs=tuple(ArtifactRef(**a) for a in data["artifact_refs"]),
            steering_boundary_json=canonical_json(data["steering_boundary"]),
            correlation_facts_json=tuple(canonical_json(f) for f in data["correlation_facts"]),
            provenance_json=canonical_json(data["provenance"]),
            protocol_id=data["protocol_id"],
            tool_use_policy=data["tool_use_policy"],
            tool_use_satisfied=data["tool_use_satisfied"],
        )


def _id_runs(ids: Sequence[str]) -> list[list[str]]:
    """Consecutive exchange ids (``ex-000001``, ``ex-000002``, ...) folded into ``[first, last]`` runs."""
    if isinstance(ids, ExchangeIdRange):
        return [[ids[0], ids[-1]]] if len(ids) else []
    runs: list[list[str]] = []
    previous = -2
    for eid in ids:
        number = int(eid[3:]) if eid.startswith("ex-") and eid[3:].isdigit() else -2
        if runs and number == previous + 1 and number >= 0:
            runs[-1][1] = eid
        else:
            runs.append([eid, eid])
        previous = number
    return runs


def _span(ids: Sequence[str]) -> str:
    if not ids:
        return "nothing"
    return ids[0] if len(ids) == 1 else f"{ids[0]}..{ids[-1]} ({len(ids)} exchanges)"


# --------------------------------------------------------------------------- the builder


def _model_tokenizer(model: object) -> str | None:
    """The tokenizer a model adapter declares as its own (``tokenizer``), or None."""
    declared = getattr(model, "tokenizer", None)
    if declared is None:
        return None
    if not isinstance(declared, str) or not declared:
        raise ConfigurationError(f"{type(model).__name__}.tokenizer must be a tokenizer name or None, got {declared!r}")
    return declared


class _Builder:
    """One build of a RequestView (kept out of the dataclass so the algorithm reads top to bottom)."""

    def __init__(
        self,
        *,
        log: ExchangeLog,
        budget: ContextBudget,
        counter: UnitCounter | None,
        tokenizer: str | None,
        selection_policy: ContextSelectionPolicy,
        compaction_policy: Any,
    ) -> None:
        if not isinstance(log, ExchangeLog):
            raise ConfigurationError(f"log: expected an ExchangeLog, got {type(log).__name__}")
        self.log = log
        self.budget = budget
        self.tokenizer = tokenizer
        self.counter: UnitCounter = (
            counter if counter is not None else unit_counter_for(budget.unit, tokenizer=tokenizer)
        )
        if self.counter.unit != budget.unit:
            raise ConfigurationError(
                f"context_unit_counter counts {self.counter.unit!r} but the budget is in {budget.unit!r}"
            )
        self.selection_policy = selection_policy
        self.compaction_policy = compaction_policy

    def _units(self, text: str) -> int:
        return self.counter.count(text)

    def build(
        self,
        *,
        target: RequestTarget,
        instructions: Iterable[Mapping[str, Any]],
        tool_schemas: Iterable[Mapping[str, Any]],
        capability_requirements: tuple[str, ...],
        reasoning_policy: ReasoningPolicy,
        continuation: ContinuationRef | None,
        contributions: tuple[ContextContribution, ...],
        prior_receipts: tuple[CompactionReceipt, ...],
        artifact_refs: tuple[ArtifactRef, ...],
        available_artifact_ids: frozenset[str] | None,
        protocol_id: str,
        tool_use_policy: str,
        tool_use_satisfied: bool,
    ) -> RequestView:
        log, budget, unit = self.log, self.budget, self.budget.unit
        available = budget.available_input_units
        instructions_json = _instructions(instructions)
        tools_json = _tool_schemas(tool_schemas)
        _check_continuation(continuation, target)
        _check_artifacts(artifact_refs, available_artifact_ids)
        for receipt in prior_receipts:
            if not isinstance(receipt, CompactionReceipt):
                raise ConfigurationError(
                    f"compaction_receipts: expected CompactionReceipt, got {type(receipt).__name__}"
                )
        fixed_units = sum(map(self._units, instructions_json)) + sum(map(self._units, tools_json))

        # -- protected suffix: recent window, open exchange, continuation.
        n = log.exchange_count
        proj = log.projection()
        closed = proj.closed_count
        open_ex = log.open_exchange
        p_start = max(0, n - budget.protected_recent_exchanges)
        if open_ex is not None:
            p_start = min(p_start, open_ex.index)
        if continuation is not None:
            if continuation.exchange_id is None:
                p_start = 0
            else:
                p_start = min(p_start, log.exchange(continuation.exchange_id).index)
        sums = proj.unit_sums(self.counter)
        open_texts = [m.json_text for m in open_ex.items] if open_ex is not None else []
        open_units = sum(map(self._units, open_texts))
        protected_units = sums[closed] - sums[p_start] + open_units
        base = fixed_units + protected_units
        if base > available:
            raise ContextBudgetExceededError(
                f"instructions, tool schemas and the protected exchanges alone need {base} {unit}, "
                f"but only {available} are available",
                required_units=base,
                available_units=available,
                unit=unit,
            )

        # -- contributions: required always, optional as they fit.
        selection = self.selection_policy.select(
            contributions, budget=budget, already_used_units=base, counter=self.counter
        )
        used = base + selection.selected_units
        older_units = sums[p_start]
        required_units = used + older_units
        contribution_units = dict(selection.units)

        # -- older closed exchanges: the longest suffix of [0, p_start) that fits.
        cut = 0
        reasons: list[str] = []
        policy = self.compaction_policy
        summarizing = isinstance(policy, SummarizingCompactionPolicy)
        task_record: dict[str, Any] | None = None
        if older_units > available - used:
            reserve = max(0, int(policy.reserve_units)) if summarizing else 0
            first_units = proj.first_item_units(self.counter)
            task_record = _task_record(proj.item_ids[0], proj.item_json[0], lambda _: first_units)
            task_units = task_record["units"] if task_record is not None else 0
            room = available - used - reserve - task_units
            cut = p_start if room < 0 else bisect_left(sums, older_units - room, 0, p_start + 1)
            cut = max(cut, 1)
        omitted_ids = ExchangeIdRange(0, cut)  # lazy: no per-request copy of every omitted id
        first_item = proj.item_offsets[cut]
        selected_items = (*proj.item_json[first_item : proj.item_offsets[closed]], *open_texts)
        selected_digest = projection_digest(selected_items)

        new_receipts: list[CompactionReceipt] = []
        summary_record: dict[str, Any] | None = None
        if cut:
            receipt, summary_message = self._compact(
                omitted_ids, selected_digest, required_units, available, summarizing
            )
            new_receipts.append(receipt)
            reasons.append(
                f"budget: omitted {_span(omitted_ids)} under {receipt.policy_id} (receipt {receipt.receipt_id})"
            )
            if summary_message is not None:
                summary_units = self._units(canonical_json(summary_message))
                after = used + sums[p_start] - sums[cut] + summary_units
                if after > available:
                    raise CompactionError(
                        f"compaction summary of {receipt.policy_id} needs {summary_units} {unit}; the request "
                        f"would need {after} but only {available} are available; nothing was built",
                        policy_id=receipt.policy_id,
                    )
                summary_record = {
                    "kind": "summary",
                    "receipt_id": receipt.receipt_id,
                    "units": summary_units,
                    "message": dict(summary_message),
                }
                used += summary_units
        used += sums[p_start] - sums[cut]
        if task_record is not None:
            used += task_record["units"]
            reasons.append(f"task: the run's first input ({task_record['item_id']}) is kept ahead of the history")
        if used > available:  # only reachable with a selection policy that ignores the budget
            # (or when the task itself does not fit next to the protected exchanges)
            raise ContextBudgetExceededError(
                f"the request needs {used} {unit} but only {available} are available "
                f"(selection policy {_policy_id(self.selection_policy)})",
                required_units=used,
                available_units=available,
                unit=unit,
            )

        # -- context records in placement order, then the summary.
        order = {p: i for i, p in enumerate(PLACEMENTS)}
        placed = sorted(enumerate(selection.selected), key=lambda ic: (order[ic[1].requested_placement], ic[0]))
        context_records = [
            canonical_json(
                {
                    "kind": "contribution",
                    "contribution_id": c.contribution_id,
                    "source": c.source,
                    "digest": c.digest,
                    "revision": c.revision,
                    "sensitivity": c.sensitivity,
                    "requested_placement": c.requested_placement,
                    "persistence_horizon": c.persistence_horizon,
                    "required": c.required,
                    "priority": c.priority,
                    "units": contribution_units.get(c.contribution_id, 0),
                    "message": c.message(),
                }
            )
            for _, c in placed
        ]
        if task_record is not None:
            context_records.append(canonical_json(task_record))
        if summary_record is not None:
            context_records.append(canonical_json(summary_record))
        reasons.extend(selection.reasons)

        selected_mask = 0
        for mask in proj.category_masks[cut:closed]:
            selected_mask |= mask
        if open_ex is not None:
            for item in open_ex.items:
                selected_mask |= _item_mask(item.role, bool(item.tool_calls))
        open_ids = [open_ex.exchange_id] if open_ex is not None else []
        open_item_ids = [f"{open_ex.exchange_id}/{k}" for k in range(len(open_texts))] if open_ex else []
        report = SelectionReport(
            tuple(proj.item_ids[first_item : proj.item_offsets[closed]]) + tuple(open_item_ids),
            ItemIdRange(proj.item_offsets, 0, first_item),
            tuple(proj.exchange_ids[cut:closed]) + tuple(open_ids),
            omitted_ids,
            categories_from_mask(selected_mask),
            categories_from_mask(proj.category_or[cut]),
            tuple(c.contribution_id for _, c in placed),
            tuple(c.contribution_id for c in selection.omitted),
            fixed_units + sums[closed] + open_units + selection.selected_units + selection.omitted_units,
            used,
            sums[cut] - (task_record["units"] if task_record is not None else 0) + selection.omitted_units,
            unit,
            tuple(reasons),
            tuple(proj.exchange_ids[p_start:closed]) + tuple(open_ids),
            available,
        )
        provenance = {
            "builder": _BUILDER,
            "selection_policy": _policy_id(self.selection_policy),
            "compaction_policy": None if policy is None else _policy_id(policy),
            "counter": getattr(self.counter, "cache_key", [self.counter.unit]),
            "selected_digest": selected_digest,
            "authorizing_receipt_ids": [r.receipt_id for r in new_receipts],
            "contribution_revisions": {c.contribution_id: c.revision for c in selection.selected if c.revision},
            "dropped_contributions": [
                {
                    "contribution_id": c.contribution_id,
                    "source": c.source,
                    "units": contribution_units.get(c.contribution_id, 0),
                    "digest": c.digest,
                    "sensitivity": c.sensitivity,
                }
                for c in selection.omitted
            ],
        }
        if self.tokenizer is not None:  # only when declared: the ids of other requests stay as they were
            provenance["model_tokenizer"] = self.tokenizer
        receipts = (*prior_receipts, *new_receipts)
        identity = {
            "schema": REQUEST_VIEW_SCHEMA_VERSION,
            "target": target.to_dict(),
            "log": [log.log_id, log.digest, cut, p_start],
            "instructions": sha256_hex("\n".join(instructions_json)),
            "tools": sha256_hex("\n".join(tools_json)),
            "context": sha256_hex("\n".join(context_records)),
            "capabilities": list(capability_requirements),
            "reasoning": reasoning_policy.to_dict(),
            "continuation": None if continuation is None else continuation.to_dict(),
            "budget": budget.to_dict(),
            "receipts": [_receipt_identity(r) for r in receipts],
            "artifacts": [a.to_dict() for a in artifact_refs],
            "protocol": [protocol_id, tool_use_policy, tool_use_satisfied],
            "provenance": provenance,
        }
        return RequestView(
            request_id="req-" + sha256_hex(canonical_json(identity)),
            target=target,
            source_log_id=log.log_id,
            source_log_digest=log.digest,
            selected_items_json=selected_items,
            instructions_json=instructions_json,
            tool_schemas_json=tools_json,
            context_json=tuple(context_records),
            capability_requirements=capability_requirements,
            reasoning_policy=reasoning_policy,
            continuation=continuation,
            context_budget=budget,
            selection=report,
            compaction_receipts=receipts,
            artifact_refs=artifact_refs,
            steering_boundary_json=canonical_json({"log_position": log.position, "exchange_count": n}),
            provenance_json=canonical_json(provenance),
            protocol_id=protocol_id,
            tool_use_policy=tool_use_policy,
            tool_use_satisfied=tool_use_satisfied,
        )

    def _compact(
        self,
        omitted_ids: ExchangeIdRange,
        selected_digest: str,
        required_units: int,
        available: int,
        summarizing: bool,
    ) -> tuple[CompactionReceipt, Mapping[str, Any] | None]:
        policy = self.compaction_policy
        unit = self.budget.unit
        if policy is None:
            raise ContextBudgetExceededError(
                f"the request needs {required_units} {unit} but only {available} are available; omitting "
                f"{_span(omitted_ids)} needs an explicit compaction policy and none is configured",
                required_units=required_units,
                available_units=available,
                unit=unit,
            )
        policy_id = _policy_id(policy)
        summary_message: Mapping[str, Any] | None = None
        try:
            if summarizing:
                exchanges = [self.log.exchange_at(i) for i in range(len(omitted_ids))]
                result = policy.compact_with_summary(
                    exchanges=exchanges,
                    selected_digest=selected_digest,
                    required_units=required_units,
                    available_units=available,
                    counter=self.counter,
                )
                receipt = None if result is None else result.receipt
                summary_message = None if result is None else result.message
            else:
                receipt = policy.compact(
                    exchange_ids=omitted_ids,
                    selected_digest=selected_digest,
                    required_units=required_units,
                    available_units=available,
                )
        except (ContextBudgetExceededError, CompactionError):
            raise
        except Exception as exc:
            raise CompactionError(
                f"compaction policy {policy_id} failed: {type(exc).__name__}: {exc}; nothing was omitted "
                "and no request was built",
                policy_id=policy_id,
            ) from exc
        if receipt is None:
            raise ContextBudgetExceededError(
                f"the request needs {required_units} {unit} but only {available} are available, and "
                f"compaction policy {policy_id} declined to omit {_span(omitted_ids)}",
                required_units=required_units,
                available_units=available,
                unit=unit,
            )
        if not isinstance(receipt, CompactionReceipt):
            raise CompactionError(
                f"compaction policy {policy_id} returned {type(receipt).__name__}, not a CompactionReceipt",
                policy_id=policy_id,
            )
        if receipt.input_exchange_ids != omitted_ids:
            raise CompactionError(
                f"receipt {receipt.receipt_id!r} of {policy_id} lists {_span(receipt.input_exchange_ids)} but the "
                f"request must omit exactly {_span(omitted_ids)}",
                policy_id=policy_id,
            )
        if summary_message is None:
            if receipt.output_digest != selected_digest:
                raise CompactionError(
                    f"receipt {receipt.receipt_id!r} of {policy_id} does not bind the selected projection "
                    "(output_digest != selected_digest)",
                    policy_id=policy_id,
                )
        else:
            if (
                not isinstance(summary_message, Mapping)
                or summary_message.get("role") not in _INSTRUCTION_ROLES
                or not isinstance(summary_message.get("content"), str)
                or set(summary_message) != {"role", "content"}
            ):
                raise CompactionError(
                    f"{policy_id}: a summary must be a {{role, content}} message with role system, developer "
                    "or user and string content",
                    policy_id=policy_id,
                )
            if receipt.output_digest != sha256_hex(canonical_json(dict(summary_message))):
                raise CompactionError(
                    f"receipt {receipt.receipt_id!r} of {policy_id} does not bind its summary "
                    "(output_digest != sha256 of the summary message)",
                    policy_id=policy_id,
                )
        return receipt, summary_message


def _task_record(item_id: str, item_json: str, count: Any) -> dict[str, Any] | None:
    """The context record that keeps the run's first input (the task) when its exchange is omitted;
    None when the log's first item is not a plain user message."""
    message = json.loads(item_json)
    if message.get("role") != "user" or message.get("tool_calls"):
        return None
    return {"kind": "task", "item_id": item_id, "units": int(count(item_json)), "message": message}


def _receipt_identity(receipt: CompactionReceipt) -> list[Any]:
    """A receipt's contribution to a request id, in O(1): its input ids are implied by the log
    digest and the cut, so only their span is included."""
    ids = receipt.input_exchange_ids
    return [
        receipt.receipt_id,
        receipt.policy_id,
        receipt.output_digest,
        [ids[0], ids[-1], len(ids)] if ids else [],
        list(receipt.declared_losses),
        receipt.model_reference,
    ]


def _policy_id(policy: object) -> str:
    return str(getattr(policy, "policy_id", type(policy).__name__))


def _item_mask(role: str, has_calls: bool) -> int:
    mask = CATEGORY_BITS["tool_results" if role == "tool" else role]
    return mask | CATEGORY_BITS["tool_calls"] if has_calls else mask


def _instructions(values: Iterable[Mapping[str, object]]) -> tuple[str, ...]:
    out = []
    for i, value in enumerate(values):
        if not isinstance(value, Mapping):
            raise ConfigurationError(f"instructions[{i}]: expected a mapping, got {type(value).__name__}")
        if value.get("role") not in _INSTRUCTION_ROLES:
            raise ConfigurationError(
                f"instructions[{i}].role: must be system, developer or user, got {value.get('role')!r}"
            )
        if not isinstance(value.get("content"), str):
            raise ConfigurationError(f"instructions[{i}].content: must be a string")
        if set(value) - {"role", "content"}:
            raise ConfigurationError(f"instructions[{i}]: unknown key(s) {sorted(set(value) - {'role', 'content'})}")
        out.append(canonical_json({"role": value["role"], "content": value["content"]}))
    return tuple(out)


def _tool_schemas(values: Iterable[Mapping[str, object]]) -> tuple[str, ...]:
    out, names = [], set()
    for i, value in enumerate(values):
        if not isinstance(value, Mapping):
            raise ConfigurationError(f"tool_schemas[{i}]: expected a mapping, got {type(value).__name__}")
        name = value.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"tool_schemas[{i}].name: must be a non-empty string")
        if name in names:
            raise ConfigurationError(f"tool_schemas[{i}].name: duplicate tool {name!r}")
        names.add(name)
        params = value.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, Mapping):
            raise ConfigurationError(f"tool_schemas[{i}].parameters: must be a JSON schema object")
        schema = {"name": name, "description": str(value.get("description") or ""), "parameters": dict(params)}
        try:
            out.append(canonical_json(schema))
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"tool_schemas[{i}]: not JSON-native ({exc})") from exc
    return tuple(out)


def _check_continuation(continuation: ContinuationRef | None, target: RequestTarget) -> None:
    if continuation is None:
        return
    if not isinstance(continuation, ContinuationRef):
        raise ConfigurationError(f"continuation: expected a ContinuationRef, got {type(continuation).__name__}")
    if target.provider != "unspecified" and (
        continuation.provider != target.provider
        or continuation.model != target.model
        or continuation.api_mode != target.api_mode
    ):
        raise ContextError(
            f"continuation {continuation.reference_id!r} belongs to {continuation.provider}/{continuation.model}/"
            f"{continuation.api_mode}, not to the target {target.provider}/{target.model}/{target.api_mode}"
        )


def _check_artifacts(refs: tuple[ArtifactRef, ...], available: frozenset[str] | None) -> None:
    for ref in refs:
        if not isinstance(ref, ArtifactRef):
            raise ConfigurationError(f"artifact_refs: expected ArtifactRef, got {type(ref).__name__}")
        if ref.required and (available is None or ref.artifact_id not in available):
            raise ContextError(f"required artifact {ref.artifact_id!r} is not available")
