"""Context contributions, their selection, budgets and unit counters.

Context is request *input* with identity, provenance, a budget and loss semantics. It is data:
selecting a contribution grants no tool permission. Contributors are consulted per request and
return :class:`ContextContribution` values; :class:`PriorityContextSelectionPolicy` chooses which
fit (required before optional, then priority, then identity); :class:`DeclaredContextBudgetPolicy`
turns the capacity a model adapter *declares* into a :class:`ContextBudget` (never inferred from a
model name).

Units: every budget is counted in one unit. ``characters`` (:class:`CharacterCounter`, the
:data:`default_unit_counter`) counts characters; ``tokens`` (:class:`TokenCounter`) counts tokens
with the offline ``quicktok-v1`` tokenizer (the ``qitos-kernel[tokens]`` extra). The units of a message
are the units of its canonical JSON text, so what is counted is what is sent.

Without the extra (a core ``pip install qitos-kernel``), :func:`unit_counter_for` ``("tokens")`` falls back
to :class:`EstimatedTokenCounter`: one token per 3 bytes of UTF-8, rounded up. That over-counts
English and JSON (about 4 to 4.5 bytes per ``cl100k_base`` token) and matches CJK text, so a
budget counted with it errs on the side of sending less. A request view built with it says so:
its provenance ``counter`` is ``["tokens", "estimate:utf8-bytes/3"]`` and its summary has
``units.estimated: true``. The tokenizer stays an extra because it brings numpy along.

A token count is exact only with the model's own tokenizer: a model adapter declares it as
``tokenizer`` (its name for the offline tokenizer, e.g. ``cl100k_base`` or ``o200k_base``; None, the
default, when the model's tokenizer is not one of them). ``unit_counter_for("tokens",
tokenizer=...)`` counts with that tokenizer when it is available; any other count (``cl100k_base``
for a SmolLM2 or Llama server, the byte estimate) is an estimate, and a request view's summary says
so (``units.estimated: true``) and names the tokenizer that counted (``units.tokenizer``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from qitos.core._codec import canonical_json, sha256_hex
from qitos.core._errors import ContextError, UsageError
from qitos.core._install import install_command

if TYPE_CHECKING:
    from qitos.core._exchange import ExchangeLog

__all__ = [
    "ContextContribution",
    "ContextContributor",
    "ContextRequest",
    "ContextSelectionPolicy",
    "DeclaredContextBudgetPolicy",
    "PriorityContextSelectionPolicy",
    "StaticContextContributor",
]

PLACEMENTS: tuple[str, ...] = ("system", "developer", "user")
"""Where a contribution may ask to be placed in a request, in request order."""
_HORIZONS = frozenset({"request", "session"})
_SENSITIVITIES = frozenset({"internal", "secret"})
_UNITS = frozenset({"characters", "tokens"})


# --------------------------------------------------------------------------- errors


class ContextContributionError(UsageError, ValueError):
    """A contribution or contributor is malformed (bad field, duplicate identity, wrong type)."""


class ContextBudgetExceededError(ContextError):
    """A request cannot fit its budget under the rules: protected or required items alone exceed it,
    or omission was needed and no compaction policy authorized it.

    ``required_units`` is what the request needs, ``available_units`` what the budget allows.
    """

    def __init__(self, message: str, *, required_units: int, available_units: int, unit: str = "characters"):
        super().__init__(message)
        self.required_units = required_units
        self.available_units = available_units
        self.unit = unit

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_budget_error,
            (self.__class__, str(self), self.required_units, self.available_units, self.unit),
        )


def _rebuild_budget_error(
    cls: type[ContextBudgetExceededError], message: str, required: int, available: int, unit: str
) -> ContextBudgetExceededError:
    return cls(message, required_units=required, available_units=available, unit=unit)


# --------------------------------------------------------------------------- unit counters


@runtime_checkable
class UnitCounter(Protocol):
    """Counts the units of a text. ``unit`` names what is counted (``characters``, ``tokens``)."""

    @property
    def unit(self) -> str:
        """What is counted."""
        ...

    def count(self, text: str) -> int:
        """Units of ``text``."""
        ...


@dataclass(frozen=True, slots=True)
class CharacterCounter:
    """Counts characters (Unicode code points)."""

    unit: str = field(default="characters", init=False)

    @property
    def cache_key(self) -> tuple[str, ...]:
        """Identity for caches of counts: equal keys count equally."""
        return ("characters",)

    def count(self, text: str) -> int:
        """Number of characters of ``text``."""
        return len(text)


class TokenCounter:
    """Counts tokens with an offline tokenizer (``quicktok-v1``; same ids as tiktoken).

    Encodings: ``cl100k_base`` (default), ``o200k_base``, ``o200k_harmony``, ``llama3``, ``qwen3``.
    Needs the ``qitos-kernel[tokens]`` extra; nothing is downloaded.
    """

    unit = "tokens"

    def __init__(self, encoding: str = "cl100k_base") -> None:
        try:
            import quicktok
        except ImportError as exc:  # pragma: no cover - exercised only without the extra
            raise ImportError(
                "TokenCounter needs the optional tokenizer package 'quicktok-v1'; "
                f"install it with: {install_command('tokens')}"
            ) from exc
        try:
            self._encoding = _encoding(quicktok, encoding)
        except (RuntimeError, KeyError, ValueError) as exc:
            raise ValueError(f"TokenCounter: unknown encoding {encoding!r} ({exc})") from exc
        self.encoding = encoding

    @property
    def cache_key(self) -> tuple[str, ...]:
        """Identity for caches of counts: equal keys count equally."""
        return ("tokens", self.encoding)

    def count(self, text: str) -> int:
        """Number of tokens of ``text`` (ordinary encoding, special tokens as text)."""
        return int(self._encoding.count(text))

    def __repr__(self) -> str:
        return f"TokenCounter(encoding={self.encoding!r})"


_ENCODINGS: dict[str, Any] = {}


def _encoding(quicktok: Any, name: str) -> Any:
    """The tokenizer of ``name``, loaded once per process (loading one takes ~10 ms; an engine is
    made per session, so many sessions would each pay it)."""
    loaded = _ENCODINGS.get(name)
    if loaded is None:
        loaded = _ENCODINGS[name] = quicktok.get_encoding(name)
    return loaded


class EstimatedTokenCounter:
    """Estimates tokens without a tokenizer: one per 3 bytes of UTF-8 text, rounded up.

    The fallback of :func:`unit_counter_for` when ``quicktok-v1`` is not installed (see the
    module docstring for why 3). Its ``cache_key`` names it, so counts from it are never mixed
    with exact ones.
    """

    unit = "tokens"
    estimated = True

    @property
    def cache_key(self) -> tuple[str, ...]:
        """Identity for caches of counts: equal keys count equally."""
        return ("tokens", "estimate:utf8-bytes/3")

    def count(self, text: str) -> int:
        """Estimated tokens of ``text``."""
        return -(-len(text.encode("utf-8")) // 3)

    def __repr__(self) -> str:
        return "EstimatedTokenCounter()"


default_unit_counter: UnitCounter = CharacterCounter()
"""The default counter: characters."""


def tokenizer_available() -> bool:
    """Whether the offline tokenizer (``quicktok-v1``, the ``qitos-kernel[tokens]`` extra) can be imported."""
    try:
        import quicktok  # noqa: F401
    except ImportError:
        return False
    return True


def unit_counter_for(unit: str, *, tokenizer: str | None = None) -> UnitCounter:
    """The standard counter for a unit name: characters, or tokens (``cl100k_base``; without the
    tokenizer installed, the :class:`EstimatedTokenCounter` estimate).

    ``tokenizer``: the model's own tokenizer, as its adapter declares it; tokens are then counted
    with it when the offline tokenizer package has it, else as without it.
    """
    if unit == "characters":
        return default_unit_counter
    if unit == "tokens":
        if not tokenizer_available():
            return EstimatedTokenCounter()
        if tokenizer is not None and tokenizer != "cl100k_base":
            try:
                return TokenCounter(tokenizer)
            except ValueError:
                pass  # a tokenizer the package does not know: counted with the default, an estimate
        return TokenCounter()
    raise ValueError(f"unit: no standard counter for {unit!r}; pass a counter whose unit is {unit!r}")


def counts_exactly(counter_key: Sequence[object], model_tokenizer: str | None) -> bool:
    """Whether a count by the counter with ``cache_key`` ``counter_key`` is exact for a model that
    declares ``model_tokenizer``: characters always are; tokens only by that very tokenizer."""
    if not counter_key or counter_key[0] != "tokens":
        return True
    return model_tokenizer is not None and list(counter_key[1:]) == [model_tokenizer]


def default_output_reserve(max_input_units: int) -> int:
    """The output reserve of a window of ``max_input_units``: a quarter of it, at most 8,000."""
    return min(8_000, max_input_units // 4)


# --------------------------------------------------------------------------- budget


@dataclass(frozen=True, kw_only=True, slots=True)
class ContextBudget:
    """How many input units one request may use. ``available_input_units`` is the maximum minus
    the units reserved for the model's output.

    ``reserved_output_units`` left as None scales with the window: a quarter of
    ``max_input_units``, at most 8,000 (:func:`default_output_reserve`), so
    ``ContextBudget(max_input_units=2000)`` reserves 500. After construction it is always an int.
    """

    max_input_units: int = 120_000
    reserved_output_units: int | None = None
    unit: Literal["characters", "tokens"] = "characters"
    protected_recent_exchanges: int = 1

    def __post_init__(self) -> None:
        if self.reserved_output_units is None and isinstance(self.max_input_units, int):
            object.__setattr__(self, "reserved_output_units", default_output_reserve(self.max_input_units))
        for name in ("max_input_units", "reserved_output_units", "protected_recent_exchanges"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"ContextBudget.{name}: must be an int, got {value!r}")
        if self.max_input_units <= 0:
            raise ValueError(f"ContextBudget.max_input_units: must be positive, got {self.max_input_units}")
        if not 0 <= self.output_reserve < self.max_input_units:
            raise ValueError(
                f"ContextBudget.reserved_output_units: must be in [0, max_input_units={self.max_input_units}), "
                f"got {self.reserved_output_units}"
            )
        if self.unit not in _UNITS:
            raise ValueError(f"ContextBudget.unit: must be one of {sorted(_UNITS)}, got {self.unit!r}")
        if self.protected_recent_exchanges < 0:
            raise ValueError(
                f"ContextBudget.protected_recent_exchanges: must be >= 0, got {self.protected_recent_exchanges}"
            )

    @property
    def output_reserve(self) -> int:
        """``reserved_output_units`` as the int it always is after construction."""
        reserve = self.reserved_output_units
        return reserve if reserve is not None else default_output_reserve(self.max_input_units)

    @property
    def available_input_units(self) -> int:
        """Units a request may use: ``max_input_units - reserved_output_units``."""
        return self.max_input_units - self.output_reserve

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form (includes ``available_input_units``)."""
        return {
            "max_input_units": self.max_input_units,
            "reserved_output_units": self.output_reserve,
            "available_input_units": self.available_input_units,
            "unit": self.unit,
            "protected_recent_exchanges": self.protected_recent_exchanges,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ContextBudget:
        """Inverse of :meth:`to_dict`."""
        values = {k: v for k, v in data.items() if k != "available_input_units"}
        return cls(**values)


@dataclass(frozen=True, slots=True)
class DeclaredContextBudgetPolicy:
    """Use adapter-declared capacity; never infer it from a model name.

    ``budget_for(max_input_units, unit)`` takes what a model adapter declares (``None`` when it
    declares nothing) and returns the :class:`ContextBudget` for one request.
    """

    default_max_input_units: int = 120000
    unit: str = "characters"
    protected_recent_exchanges: int = 1
    policy_id: str = "qitos.context.declared_budget/v1"

    def __post_init__(self) -> None:
        value = self.default_max_input_units
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"default_max_input_units: must be a positive int, got {self.default_max_input_units!r}")
        if self.unit not in _UNITS:
            raise ValueError(f"unit: must be one of {sorted(_UNITS)}, got {self.unit!r}")
        count = self.protected_recent_exchanges
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(
                f"protected_recent_exchanges: must be an int >= 0, got {self.protected_recent_exchanges!r}"
            )

    def budget_for(
        self,
        max_input_units: int | None = None,
        unit: str | None = None,
        *,
        reserved_output_units: int | None = None,
    ) -> ContextBudget:
        """The budget for a model that declares ``max_input_units`` counted in ``unit``.

        Undeclared capacity (``None``) falls back to ``default_max_input_units`` in this policy's
        unit. A declared capacity is only meaningful in the unit it was declared in, so a declared
        ``unit`` wins over the policy's. ``reserved_output_units`` defaults to a quarter of the
        capacity, at most 8,000 units.
        """
        if max_input_units is None:
            maximum, budget_unit = self.default_max_input_units, (unit or self.unit)
        else:
            if not isinstance(max_input_units, int) or isinstance(max_input_units, bool) or max_input_units <= 0:
                raise ValueError(
                    f"max_input_units: a declared capacity must be a positive int, got {max_input_units!r}"
                )
            maximum, budget_unit = max_input_units, (unit or self.unit)
        if budget_unit not in _UNITS:
            raise ValueError(f"unit: must be one of {sorted(_UNITS)}, got {budget_unit!r}")
        return ContextBudget(
            max_input_units=maximum,
            reserved_output_units=reserved_output_units,
            unit=budget_unit,  # type: ignore[arg-type]
            protected_recent_exchanges=self.protected_recent_exchanges,
        )


# --------------------------------------------------------------------------- contributions


@dataclass(frozen=True, kw_only=True)
class ContextContribution:
    """One piece of request context with identity and provenance.

    ``content`` is JSON-native data (usually text); it is copied on construction. ``digest`` is the
    SHA-256 of its canonical JSON. ``revision`` is the provenance digest of what a source recalled.
    A ``secret`` contribution is sent to the model but only its digest appears in traces.
    """

    contribution_id: str
    source: str
    content: Any = field(repr=False, compare=False)
    priority: int = 0
    requested_placement: str = "developer"
    persistence_horizon: str = "request"
    sensitivity: str = "internal"
    required: bool = False
    revision: str | None = None
    digest: str = field(init=False)

    def __post_init__(self) -> None:
        for name in ("contribution_id", "source"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ContextContributionError(f"ContextContribution.{name}: must be a non-empty string, got {value!r}")
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise ContextContributionError(f"ContextContribution.priority: must be an int, got {self.priority!r}")
        if self.requested_placement not in PLACEMENTS:
            raise ContextContributionError(
                f"ContextContribution.requested_placement: must be one of {list(PLACEMENTS)}, "
                f"got {self.requested_placement!r}"
            )
        if self.persistence_horizon not in _HORIZONS:
            raise ContextContributionError(
                f"ContextContribution.persistence_horizon: must be one of {sorted(_HORIZONS)}, "
                f"got {self.persistence_horizon!r}"
            )
        if self.sensitivity not in _SENSITIVITIES:
            raise ContextContributionError(
                f"ContextContribution.sensitivity: must be one of {sorted(_SENSITIVITIES)}, got {self.sensitivity!r}"
            )
        if not isinstance(self.required, bool):
            raise ContextContributionError(f"ContextContribution.required: must be a bool, got {self.required!r}")
        if self.revision is not None and not isinstance(self.revision, str):
            raise ContextContributionError(f"ContextContribution.revision: must be a string, got {self.revision!r}")
        try:
            text = canonical_json(self.content)
        except (TypeError, ValueError) as exc:
            raise ContextContributionError(
                f"ContextContribution.content of {self.contribution_id!r}: not JSON-native data ({exc})"
            ) from exc
        object.__setattr__(self, "content", json.loads(text))
        object.__setattr__(self, "digest", sha256_hex(text))

    def render(self) -> str:
        """The text placed in the request: the content itself if it is a string, else its JSON."""
        return self.content if isinstance(self.content, str) else canonical_json(self.content)

    def message(self) -> dict[str, Any]:
        """The provider-neutral message this contribution becomes in a request."""
        return {
            "role": self.requested_placement,
            "content": f'<context id="{self.contribution_id}" source="{self.source}">\n{self.render()}\n</context>',
        }

    def to_dict(self, *, include_content: bool = True) -> dict[str, Any]:
        """JSON-native form. Secret content is never included unless ``include_content`` is true
        *and* the contribution is not secret; its digest always is."""
        out: dict[str, Any] = {
            "contribution_id": self.contribution_id,
            "source": self.source,
            "priority": self.priority,
            "requested_placement": self.requested_placement,
            "persistence_horizon": self.persistence_horizon,
            "sensitivity": self.sensitivity,
            "required": self.required,
            "revision": self.revision,
            "digest": self.digest,
        }
        if include_content and self.sensitivity != "secret":
            out["content"] = self.content
        return out


@dataclass(frozen=True)
class ContextRequest:
    """What a contributor is told about the request it contributes to: the step, the task text,
    the session's exchange log (None outside a session) and the agent state."""

    step_id: int
    task: str
    log: ExchangeLog | None
    state: Any = None


@runtime_checkable
class ContextContributor(Protocol):
    """Anything that contributes context to a request."""

    def contribute(self, request: ContextRequest) -> Sequence[ContextContribution]:
        """The contributions for this request (may be empty)."""
        ...


@dataclass(frozen=True)
class StaticContextContributor:
    """Small reusable contributor for project/user/session context."""

    contributor_id: str
    source: str
    value: Any = field(repr=False)
    priority: int = 0
    requested_placement: str = "developer"
    required: bool = False
    persistence_horizon: str = "request"
    sensitivity: str = "internal"

    def __post_init__(self) -> None:
        # Validate once, at construction, so a bad contributor fails where it is configured.
        self.contribute(ContextRequest(step_id=0, task="", log=None))

    def contribute(self, request: ContextRequest) -> Sequence[ContextContribution]:
        """One contribution with ``contribution_id == contributor_id``."""
        return (
            ContextContribution(
                contribution_id=self.contributor_id,
                source=self.source,
                content=self.value,
                priority=self.priority,
                requested_placement=self.requested_placement,
                required=self.required,
                persistence_horizon=self.persistence_horizon,
                sensitivity=self.sensitivity,
            ),
        )


def collect_context_contributions(
    contributors: Iterable[Any] | Mapping[str, Any], request: ContextRequest
) -> tuple[ContextContribution, ...]:
    """Ask each contributor (in name order for a mapping) and check the results.

    Raises :class:`ContextContributionError` if a contributor returns something that is not a
    sequence of contributions, or two contributions share an identity.
    """
    if isinstance(contributors, Mapping):
        named = [(str(name), contributors[name]) for name in sorted(contributors)]
    else:
        named = [(type(c).__name__, c) for c in contributors]
    out: list[ContextContribution] = []
    seen: dict[str, str] = {}
    for name, contributor in named:
        values = contributor.contribute(request)
        if isinstance(values, str | bytes | Mapping) or not isinstance(values, Sequence):
            raise ContextContributionError(
                f"context contributor {name!r} must return a sequence of ContextContribution, "
                f"got {type(values).__name__}"
            )
        for i, value in enumerate(values):
            if not isinstance(value, ContextContribution):
                raise ContextContributionError(
                    f"context contributor {name!r} returned {type(value).__name__} at [{i}], not a ContextContribution"
                )
            if value.contribution_id in seen:
                raise ContextContributionError(
                    f"duplicate contribution id {value.contribution_id!r} from {name!r} "
                    f"(already given by {seen[value.contribution_id]!r})"
                )
            seen[value.contribution_id] = name
            out.append(value)
    return tuple(out)


# --------------------------------------------------------------------------- selection


@dataclass(frozen=True, kw_only=True)
class ContextSelection:
    """The outcome of selecting contributions: what goes in, what was dropped, with units."""

    selected: tuple[ContextContribution, ...]
    omitted: tuple[ContextContribution, ...]
    selected_units: int
    omitted_units: int
    unit: str
    policy_id: str
    units: Mapping[str, int] = field(default_factory=dict)
    reasons: tuple[str, ...] = ()


@runtime_checkable
class ContextSelectionPolicy(Protocol):
    """Chooses which contributions fit a budget."""

    policy_id: str

    def select(
        self,
        contributions: Iterable[ContextContribution],
        *,
        budget: ContextBudget,
        already_used_units: int = 0,
        counter: UnitCounter = ...,
    ) -> ContextSelection:
        """Select contributions for the units left after ``already_used_units``."""
        ...


@dataclass(frozen=True)
class PriorityContextSelectionPolicy:
    """Default deterministic priority/identity selection policy.

    Order: required before optional, then higher ``priority`` first, then ``contribution_id``.
    Every required contribution is selected or the call raises :class:`ContextBudgetExceededError`;
    an optional one is selected if it still fits, otherwise dropped (later, smaller ones may fit).
    """

    policy_id: str = "qitos.context.priority/v1"

    def select(
        self,
        contributions: Iterable[ContextContribution],
        *,
        budget: ContextBudget,
        already_used_units: int = 0,
        counter: UnitCounter = default_unit_counter,
    ) -> ContextSelection:
        """Select contributions into the budget left after ``already_used_units``."""
        items = tuple(contributions)
        ids = [c.contribution_id for c in items]
        if len(ids) != len(set(ids)):
            dupes = sorted({i for i in ids if ids.count(i) > 1})
            raise ContextContributionError(f"duplicate contribution id(s) {dupes}")
        if counter.unit != budget.unit:
            raise ValueError(f"counter counts {counter.unit!r} but the budget is in {budget.unit!r}")
        ordered = sorted(items, key=lambda c: (not c.required, -c.priority, c.contribution_id))
        available = budget.available_input_units
        used = max(0, already_used_units)
        units = {c.contribution_id: counter.count(canonical_json(c.message())) for c in ordered}
        required_units = used + sum(units[c.contribution_id] for c in ordered if c.required)
        if required_units > available:
            missing = [c.contribution_id for c in ordered if c.required]
            raise ContextBudgetExceededError(
                f"required context {missing} needs {required_units} {budget.unit} with what is already "
                f"placed, but only {available} are available",
                required_units=required_units,
                available_units=available,
                unit=budget.unit,
            )
        selected: list[ContextContribution] = []
        omitted: list[ContextContribution] = []
        for contribution in ordered:
            size = units[contribution.contribution_id]
            if contribution.required or used + size <= available:
                selected.append(contribution)
                used += size
            else:
                omitted.append(contribution)
        return ContextSelection(
            selected=tuple(selected),
            omitted=tuple(omitted),
            selected_units=sum(units[c.contribution_id] for c in selected),
            omitted_units=sum(units[c.contribution_id] for c in omitted),
            unit=budget.unit,
            policy_id=self.policy_id,
            units=units,
            reasons=tuple(f"dropped {c.contribution_id}: does not fit the budget" for c in omitted),
        )
