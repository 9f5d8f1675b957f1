"""The exchange log: the canonical, append-only, event-sourced record of a conversation.

An *exchange* is one model turn: the input items given to the model, the model's output message
and the results of the tool calls that output declared. It is **closed** when :meth:`ExchangeLog.close`
was called and every tool call of its output has a result; closed exchanges never change again.

Items are provider-neutral :class:`Message` values (``role``, ``content``, ``tool_calls``,
``tool_call_id``). Every method that takes an item accepts a :class:`Message` or a plain mapping
with those keys, and rejects anything malformed with :class:`ExchangeLogError`.

The log is event-sourced. Each change is one JSON-native *entry*::

    {"op": "open", "exchange_id": "ex-000001", "inputs": [<message>, ...]}
    {"op": "output", "exchange_id": "ex-000001", "message": <message>}
    {"op": "tool_result", "exchange_id": "ex-000001", "tool_call_id": "call_1", "content": "..."}
    {"op": "close", "exchange_id": "ex-000001"}

``log.entries(start)`` returns the entries from a position on, so a session persists only what is
new; ``ExchangeLog.replay(entries, log_id=...)`` rebuilds an identical log (same digest) in another
process and ``extend_entries`` applies later entries. ``log.digest`` is a hash chain,
``digest_n = sha256(digest_{n-1} + canonical_json(entry_n))``, updated in O(1) per entry.

At most one exchange is open at a time, and it is the newest: every exchange before it is closed.
The log keeps a projection index over the closed prefix (item JSON texts, item ids, categories and
per-counter unit prefix sums), extended incrementally, so that building a request is never a
re-serialisation or re-count of the whole log (see :meth:`ExchangeLog.projection`).
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from json.encoder import encode_basestring as _json_string
from typing import Any, Literal, Protocol, cast, overload

from qitos.core._codec import canonical_json, sha256_hex
from qitos.core._errors import UsageError
from qitos.core._identity import new_id
from qitos.core._redaction import Redactor

__all__ = [
    "CATEGORY_BITS",
    "EXCHANGE_LOG_SCHEMA",
    "Exchange",
    "ExchangeIdRange",
    "ExchangeLog",
    "ExchangeLogError",
    "ExchangeProjection",
    "ItemIdRange",
    "LoggedToolCall",
    "Message",
    "Role",
    "categories_from_mask",
    "exchange_id_at",
]

EXCHANGE_LOG_SCHEMA = "qitos.exchange_log/v1"
"""Schema tag; also the seed of the digest chain (``digest_0 = sha256(EXCHANGE_LOG_SCHEMA)``)."""

Role = Literal["system", "developer", "user", "assistant", "tool"]
_ROLES: frozenset[str] = frozenset({"system", "developer", "user", "assistant", "tool"})
_INPUT_ROLES: frozenset[str] = frozenset({"system", "developer", "user", "assistant"})

CATEGORY_BITS: dict[str, int] = {
    "system": 1,
    "developer": 2,
    "user": 4,
    "assistant": 8,
    "tool_calls": 16,
    "tool_results": 32,
}
"""Item categories reported by request selection, as bits of a mask."""


def categories_from_mask(mask: int) -> tuple[str, ...]:
    """The sorted category names present in a category bit mask."""
    return tuple(sorted(name for name, bit in CATEGORY_BITS.items() if mask & bit))


class ExchangeLogError(UsageError, ValueError):
    """An item or operation breaks the exchange log's rules (bad role, unknown call id, ...)."""


def exchange_id_at(index: int) -> str:
    """The id of the exchange at a position of its log (0 -> ``ex-000001``)."""
    return f"ex-{index + 1:06d}"


def _index_of(exchange_id: object) -> int:
    if isinstance(exchange_id, str) and exchange_id.startswith("ex-") and exchange_id[3:].isdigit():
        return int(exchange_id[3:]) - 1
    return -1


class _LazyIds(Sequence[str]):
    """Shared behaviour of the lazy id sequences: they compare, add and hash like tuples."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _LazyIds) and type(other) is type(self) and self._key() == other._key():
            return True
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __add__(self, other: Sequence[str]) -> tuple[str, ...]:
        return (*self, *other)

    def __radd__(self, other: Sequence[str]) -> tuple[str, ...]:
        return (*other, *self)

    def __repr__(self) -> str:
        n = len(self)
        if n == 0:
            return "()"
        return f"<{type(self).__name__} {self[0]}..{self[n - 1]} ({n})>"

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...
    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        n = len(self)
        if isinstance(index, slice):
            lo, hi, step = index.indices(n)
            return self._sub(lo, max(lo, hi)) if step == 1 else tuple(self)[index]
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"{type(self).__name__} index out of range")
        return self._at(index)

    def _key(self) -> tuple[Any, ...]:  # pragma: no cover - overridden
        raise NotImplementedError

    def _at(self, index: int) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    def _sub(self, lo: int, hi: int) -> Sequence[str]:  # pragma: no cover - overridden
        raise NotImplementedError


class ExchangeIdRange(_LazyIds):
    """The ids of exchanges ``[start, stop)`` of a log, without materializing them.

    Equal to the tuple of the same ids; ``in`` is O(1). Used for omitted exchanges so that a request
    over a long log does not copy every omitted id.
    """

    __slots__ = ("start", "stop")

    def __init__(self, start: int, stop: int) -> None:
        self.start, self.stop = start, max(start, stop)

    def _key(self) -> tuple[Any, ...]:
        return (self.start, self.stop)

    def __len__(self) -> int:
        return self.stop - self.start

    def _at(self, index: int) -> str:
        return exchange_id_at(self.start + index)

    def _sub(self, lo: int, hi: int) -> Sequence[str]:
        return ExchangeIdRange(self.start + lo, self.start + hi)

    def __iter__(self) -> Iterator[str]:
        return (exchange_id_at(i) for i in range(self.start, self.stop))

    def __contains__(self, value: object) -> bool:
        index = _index_of(value)
        return self.start <= index < self.stop and value == exchange_id_at(index)


class ItemIdRange(_LazyIds):
    """The item ids (``ex-000001/0``, ...) of flat items ``[lo, hi)`` of a log's closed prefix,
    computed from its item offsets on demand (the offsets of closed exchanges never change)."""

    __slots__ = ("hi", "lo", "offsets")

    def __init__(self, offsets: Sequence[int], lo: int, hi: int) -> None:
        self.offsets, self.lo, self.hi = offsets, lo, max(lo, hi)

    def _key(self) -> tuple[Any, ...]:
        return (id(self.offsets), self.lo, self.hi)

    def __len__(self) -> int:
        return self.hi - self.lo

    def _at(self, index: int) -> str:
        flat = self.lo + index
        exchange = bisect_right(self.offsets, flat) - 1
        return f"{exchange_id_at(exchange)}/{flat - self.offsets[exchange]}"

    def _sub(self, lo: int, hi: int) -> Sequence[str]:
        return ItemIdRange(self.offsets, self.lo + lo, self.lo + hi)

    def __iter__(self) -> Iterator[str]:
        if self.lo >= self.hi:
            return
        exchange = bisect_right(self.offsets, self.lo) - 1
        for flat in range(self.lo, self.hi):
            while self.offsets[exchange + 1] <= flat:
                exchange += 1
            yield f"{exchange_id_at(exchange)}/{flat - self.offsets[exchange]}"


# --------------------------------------------------------------------------- items


@dataclass(frozen=True, kw_only=True, slots=True)
class LoggedToolCall:
    """One tool call as recorded in the exchange log (declared by an assistant message).

    ``arguments`` is a JSON object. Not to be confused with ``qitos.models.ToolCall``, the call a
    model adapter returns (which also keeps the model's raw argument text).
    """

    id: str
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-native form ``{"id", "name", "arguments"}``."""
        return {"id": self.id, "name": self.name, "arguments": dict(self.arguments)}

    @classmethod
    def from_value(cls, value: LoggedToolCall | Mapping[str, Any], path: str = "tool_call") -> LoggedToolCall:
        """Validate a LoggedToolCall or a mapping with ``id``, ``name`` and ``arguments``."""
        if isinstance(value, LoggedToolCall):
            data: Mapping[str, Any] = value.to_dict()
        elif isinstance(value, Mapping):
            data = value
        else:
            raise ExchangeLogError(f"{path}: expected a tool call mapping, got {type(value).__name__}")
        unknown = set(data) - {"id", "name", "arguments"}
        if unknown:
            raise ExchangeLogError(f"{path}: unknown key(s) {sorted(unknown)}")
        call_id, name = data.get("id"), data.get("name")
        if not isinstance(call_id, str) or not call_id:
            raise ExchangeLogError(f"{path}.id: must be a non-empty string, got {call_id!r}")
        if not isinstance(name, str) or not name:
            raise ExchangeLogError(f"{path}.name: must be a non-empty string, got {name!r}")
        arguments = data.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as exc:
                raise ExchangeLogError(f"{path}.arguments: not valid JSON text ({exc.msg})") from exc
        if not isinstance(arguments, Mapping):
            raise ExchangeLogError(f"{path}.arguments: must be a JSON object, got {type(arguments).__name__}")
        # Round-trip through canonical JSON: proves the value is JSON-native and isolates it.
        try:
            isolated = json.loads(canonical_json(dict(arguments)))
        except (TypeError, ValueError) as exc:
            raise ExchangeLogError(f"{path}.arguments: not JSON-native ({exc})") from exc
        return cls(id=call_id, name=name, arguments=isolated)


@dataclass(frozen=True, kw_only=True, slots=True)
class Message:
    """One provider-neutral conversation item.

    ``tool_calls`` only on ``assistant`` messages; ``tool_call_id`` exactly on ``tool`` messages.
    ``json_text`` is the canonical JSON text of :meth:`to_dict`, computed once.
    """

    role: Role
    content: str | None = None
    tool_calls: tuple[LoggedToolCall, ...] = ()
    tool_call_id: str | None = None
    json_text: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.role not in _ROLES:
            raise ExchangeLogError(f"role: must be one of {sorted(_ROLES)}, got {self.role!r}")
        if self.content is not None and not isinstance(self.content, str):
            raise ExchangeLogError(f"content: must be a string or None, got {type(self.content).__name__}")
        if self.tool_calls and self.role != "assistant":
            raise ExchangeLogError(f"tool_calls: only assistant messages declare tool calls, not {self.role!r}")
        ids = [call.id for call in self.tool_calls]
        if len(ids) != len(set(ids)):
            raise ExchangeLogError(f"tool_calls: duplicate tool call id in {ids}")
        if self.role == "tool":
            if not isinstance(self.tool_call_id, str) or not self.tool_call_id:
                raise ExchangeLogError("tool_call_id: a tool message must name the call it answers")
        elif self.tool_call_id is not None:
            raise ExchangeLogError(f"tool_call_id: only tool messages carry one, not {self.role!r}")
        object.__setattr__(self, "json_text", canonical_json(self.to_dict()))

    def to_dict(self) -> dict[str, Any]:
        """JSON-native dict: ``role`` and ``content`` always, ``tool_calls``/``tool_call_id`` if set."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [call.to_dict() for call in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out

    @classmethod
    def from_value(cls, value: Message | Mapping[str, Any], path: str = "message") -> Message:
        """Accept a Message or a mapping with ``role``/``content``/``tool_calls``/``tool_call_id``."""
        if isinstance(value, Message):
            return value
        if not isinstance(value, Mapping):
            raise ExchangeLogError(f"{path}: expected a message or mapping, got {type(value).__name__}")
        unknown = set(value) - {"role", "content", "tool_calls", "tool_call_id"}
        if unknown:
            raise ExchangeLogError(f"{path}: unknown key(s) {sorted(unknown)}")
        raw_calls = value.get("tool_calls") or ()
        if isinstance(raw_calls, str | bytes) or not isinstance(raw_calls, Sequence):
            raise ExchangeLogError(f"{path}.tool_calls: must be a list of tool calls")
        calls = tuple(LoggedToolCall.from_value(c, f"{path}.tool_calls[{i}]") for i, c in enumerate(raw_calls))
        role = value.get("role")
        if role not in _ROLES:
            raise ExchangeLogError(f"{path}.role: must be one of {sorted(_ROLES)}, got {role!r}")
        try:
            return cls(
                role=cast(Role, role),
                content=value.get("content"),
                tool_calls=calls,
                tool_call_id=value.get("tool_call_id"),
            )
        except ExchangeLogError as exc:
            raise ExchangeLogError(f"{path}.{exc}") from None


# --------------------------------------------------------------------------- exchanges


@dataclass(frozen=True, kw_only=True, slots=True)
class Exchange:
    """One model turn: inputs, the model's output and the results of its tool calls.

    ``digest`` (SHA-256 of the canonical items) is set once the exchange is closed.
    """

    exchange_id: str
    index: int
    inputs: tuple[Message, ...]
    output: Message | None = None
    tool_results: tuple[Message, ...] = ()
    closed: bool = False
    digest: str | None = None

    @property
    def items(self) -> tuple[Message, ...]:
        """Inputs, then the output (if any), then tool results in recording order."""
        if self.output is None:
            return self.inputs + self.tool_results
        return (*self.inputs, self.output, *self.tool_results)

    @property
    def tool_calls(self) -> tuple[LoggedToolCall, ...]:
        """The tool calls declared by the output (empty without one)."""
        return self.output.tool_calls if self.output is not None else ()

    @property
    def pending_tool_call_ids(self) -> tuple[str, ...]:
        """Declared tool call ids that have no result yet, in declaration order."""
        answered = {r.tool_call_id for r in self.tool_results}
        return tuple(c.id for c in self.tool_calls if c.id not in answered)


class _Counter(Protocol):
    @property
    def unit(self) -> str: ...

    def count(self, text: str) -> int: ...


@dataclass(slots=True)
class _UnitPrefix:
    counter: _Counter
    # sums[i] = units of the closed exchanges [0, i).
    sums: list[int] = field(default_factory=lambda: [0])
    # units of the log's first item (the task), counted once when first asked for.
    first_item: int | None = None


@dataclass(slots=True)
class ExchangeProjection:
    """Incremental projection of a log's closed prefix, shared by every request built from it.

    ``item_json`` / ``item_ids`` are flat over all closed exchanges in order; ``item_offsets[i]`` is
    the first flat index of exchange ``i``; ``category_or[i]`` is the OR of category masks of
    exchanges ``[0, i)``; ``exchange_ids[i]`` the id of exchange ``i``. Read-only for callers.
    """

    exchange_ids: list[str] = field(default_factory=list)
    item_json: list[str] = field(default_factory=list)
    item_ids: list[str] = field(default_factory=list)
    item_offsets: list[int] = field(default_factory=lambda: [0])
    category_masks: list[int] = field(default_factory=list)
    category_or: list[int] = field(default_factory=lambda: [0])
    units: dict[Any, _UnitPrefix] = field(default_factory=dict)

    @property
    def closed_count(self) -> int:
        """Number of (leading) closed exchanges covered."""
        return len(self.exchange_ids)

    def unit_sums(self, counter: _Counter) -> list[int]:
        """Prefix sums of the units of closed exchanges under ``counter`` (extended lazily)."""
        key: Any = getattr(counter, "cache_key", None)
        if key is None:
            key = ("id", id(counter))
        prefix = self.units.get(key)
        if prefix is None or (prefix.counter is not counter and key == ("id", id(counter))):
            prefix = _UnitPrefix(counter=counter)
            self.units[key] = prefix
        sums = prefix.sums
        count = counter.count
        texts, offsets = self.item_json, self.item_offsets
        for i in range(len(sums) - 1, len(self.exchange_ids)):
            sums.append(sums[-1] + sum(count(text) for text in texts[offsets[i] : offsets[i + 1]]))
        return sums

    def first_item_units(self, counter: _Counter) -> int:
        """Units of the first closed item (the run's task) under ``counter``; counted once.

        Call :meth:`unit_sums` with the same counter first (it creates the cache entry).
        """
        key: Any = getattr(counter, "cache_key", None)
        prefix = self.units.get(key if key is not None else ("id", id(counter)))
        if prefix is None:
            return counter.count(self.item_json[0])
        if prefix.first_item is None:
            prefix.first_item = counter.count(self.item_json[0])
        return prefix.first_item


def _category_mask(exchange: Exchange) -> int:
    """Category bits of an exchange's items."""
    mask = 0
    for item in exchange.items:
        mask |= CATEGORY_BITS["tool_results" if item.role == "tool" else item.role]
        if item.tool_calls:
            mask |= CATEGORY_BITS["tool_calls"]
    return mask


# --------------------------------------------------------------------------- the log


class ExchangeLog:
    """Append-only, event-sourced record of exchanges. See the module docstring."""

    def __init__(self, log_id: str | None = None) -> None:
        if log_id is not None and (not isinstance(log_id, str) or not log_id):
            raise ExchangeLogError(f"log_id: must be a non-empty string or None, got {log_id!r}")
        self.log_id: str = log_id or new_id("log")
        self._exchanges: list[Exchange] = []
        self._by_id: dict[str, int] = {}
        # Each entry is kept as its canonical JSON text: what the hash chain covers, what
        # entries_json() joins, and what entries() parses into fresh copies.
        self._entry_texts: list[str] = []
        self._digest = sha256_hex(EXCHANGE_LOG_SCHEMA)
        self._open: int | None = None
        self._projection = ExchangeProjection()
        self._exchanges_cache: tuple[Exchange, ...] | None = ()
        # Applied to every message and tool result recorded from now on (never to replayed
        # entries, which were redacted when first recorded): the log is what the model is sent and
        # what a session stores, so a secret redacted here is in neither (see qitos.core._redaction).
        self.redactor: Redactor | None = None
        self._replaying = False

    # ------------------------------------------------------------------ reading

    @property
    def exchanges(self) -> tuple[Exchange, ...]:
        """Every exchange, oldest first (cached until the next change)."""
        if self._exchanges_cache is None:
            self._exchanges_cache = tuple(self._exchanges)
        return self._exchanges_cache

    @property
    def exchange_count(self) -> int:
        """Number of exchanges (O(1))."""
        return len(self._exchanges)

    def exchange(self, exchange_id: str) -> Exchange:
        """The exchange with this id; ExchangeLogError if unknown."""
        index = self._by_id.get(exchange_id)
        if index is None:
            raise ExchangeLogError(f"unknown exchange {exchange_id!r} in log {self.log_id!r}")
        return self._exchanges[index]

    def exchange_at(self, index: int) -> Exchange:
        """The exchange at a position (0 = oldest)."""
        return self._exchanges[index]

    @property
    def open_exchange(self) -> Exchange | None:
        """The open exchange, if there is one (always the newest)."""
        return None if self._open is None else self._exchanges[self._open]

    @property
    def digest(self) -> str:
        """Hash-chain digest of every entry so far (content only; the log id is not part of it)."""
        return self._digest

    @property
    def position(self) -> int:
        """Number of entries applied so far."""
        return len(self._entry_texts)

    def entries(self, start: int = 0) -> list[dict[str, Any]]:
        """JSON-native entries from position ``start`` on (copies; safe to persist)."""
        return [json.loads(text) for text in self._texts_from(start, "entries")]

    def entries_json(self, start: int = 0, stop: int | None = None) -> str:
        """The canonical JSON text of the entries from ``start`` up to ``stop`` (default: the end),
        without building the entries."""
        return "[" + ",".join(self._texts_from(start, "entries_json", stop)) + "]"

    def _texts_from(self, start: int, caller: str, stop: int | None = None) -> list[str]:
        texts = self._entry_texts
        end = len(texts) if stop is None else stop
        if start < 0 or start > end or end > len(texts):
            raise ExchangeLogError(f"{caller}(start={start}, stop={stop}): positions outside 0..{len(texts)}")
        return texts[start:end]

    def projection(self) -> ExchangeProjection:
        """The projection index over the closed prefix (for request builders; do not mutate)."""
        return self._projection

    # ------------------------------------------------------------------ writing

    def open(self, inputs: Iterable[Message | Mapping[str, Any]]) -> Exchange:
        """Open a new exchange with these input items and return it."""
        if self._open is not None:
            raise ExchangeLogError(
                f"exchange {self._exchanges[self._open].exchange_id!r} is still open; close it first"
            )
        if isinstance(inputs, Mapping | Message):
            raise ExchangeLogError("inputs: expected a list of messages, got a single message")
        messages = tuple(self._redacted(Message.from_value(m, f"inputs[{i}]")) for i, m in enumerate(inputs))
        for i, message in enumerate(messages):
            if message.role not in _INPUT_ROLES or message.tool_calls:
                raise ExchangeLogError(
                    f"inputs[{i}]: an input is a system/developer/user/assistant message without tool "
                    f"calls (got role {message.role!r}); record tool results with record_tool_result"
                )
        exchange_id = exchange_id_at(len(self._exchanges))
        exchange = Exchange(exchange_id=exchange_id, index=len(self._exchanges), inputs=messages)
        self._exchanges.append(exchange)
        self._by_id[exchange_id] = exchange.index
        self._open = exchange.index
        # The entry's canonical text, assembled from the messages' own (keys in sorted order).
        inputs_json = ",".join(m.json_text for m in messages)
        text = f'{{"exchange_id":{_json_string(exchange_id)},"inputs":[{inputs_json}],"op":"open"}}'
        self._commit(text)
        return exchange

    def record_output(self, exchange_id: str, message: Message | Mapping[str, Any]) -> Exchange:
        """Record the model's output message (an assistant message) of an open exchange."""
        exchange = self._require_open(exchange_id, "record_output")
        parsed = self._redacted(Message.from_value(message, "message"))
        if parsed.role != "assistant":
            raise ExchangeLogError(f"message.role: a model output is an assistant message, got {parsed.role!r}")
        if exchange.output is not None:
            raise ExchangeLogError(f"exchange {exchange_id!r} already has an output")
        updated = replace(exchange, output=parsed)
        self._replace(updated)
        self._commit(f'{{"exchange_id":{_json_string(exchange_id)},"message":{parsed.json_text},"op":"output"}}')
        return updated

    def record_tool_result(self, exchange_id: str, tool_call_id: str, content: Any) -> Exchange:
        """Record the result of one declared tool call. ``content`` is a string (other JSON-native
        values are stored as their canonical JSON text)."""
        exchange = self._require_open(exchange_id, "record_tool_result")
        if not isinstance(tool_call_id, str) or not tool_call_id:
            raise ExchangeLogError(f"tool_call_id: must be a non-empty string, got {tool_call_id!r}")
        declared = {c.id for c in exchange.tool_calls}
        if tool_call_id not in declared:
            raise ExchangeLogError(
                f"exchange {exchange_id!r} declares no tool call {tool_call_id!r} "
                f"(declared: {sorted(declared) or 'none'})"
            )
        if any(r.tool_call_id == tool_call_id for r in exchange.tool_results):
            raise ExchangeLogError(f"tool call {tool_call_id!r} of {exchange_id!r} already has a result")
        if content is not None and not isinstance(content, str):
            try:
                content = canonical_json(content)
            except (TypeError, ValueError) as exc:
                raise ExchangeLogError(f"content: not a string or JSON-native value ({exc})") from exc
        if content is not None and self.redactor is not None and not self._replaying:
            content = self.redactor(content)
        result = Message(role="tool", content=content, tool_call_id=tool_call_id)
        updated = replace(exchange, tool_results=(*exchange.tool_results, result))
        self._replace(updated)
        content_json = "null" if content is None else _json_string(content)
        self._commit(
            f'{{"content":{content_json},"exchange_id":{_json_string(exchange_id)},"op":"tool_result",'
            f'"tool_call_id":{_json_string(tool_call_id)}}}',
        )
        return updated

    def close(self, exchange_id: str) -> Exchange:
        """Close an exchange; every declared tool call must have a result."""
        exchange = self._require_open(exchange_id, "close")
        pending = exchange.pending_tool_call_ids
        if pending:
            raise ExchangeLogError(f"cannot close {exchange_id!r}: tool call(s) {list(pending)} have no result yet")
        texts = [m.json_text for m in exchange.items]
        closed = replace(exchange, closed=True, digest=sha256_hex("\n".join(texts)))
        self._replace(closed)
        self._open = None
        self._index_closed(closed, texts)
        self._commit(f'{{"exchange_id":{_json_string(exchange_id)},"op":"close"}}')
        return closed

    # ------------------------------------------------------------------ event sourcing

    @classmethod
    def replay(cls, entries: Iterable[Mapping[str, Any]], *, log_id: str) -> ExchangeLog:
        """Rebuild a log from its entries; the result has the same digest as the original."""
        log = cls(log_id)
        log.extend_entries(entries)
        return log

    def extend_entries(self, entries: Iterable[Mapping[str, Any]]) -> None:
        """Apply entries (as produced by :meth:`entries`) after the current position (as they are:
        the redactor is not applied again, so the digest chain comes out the same)."""
        self._replaying = True
        try:
            self._extend_entries(entries)
        finally:
            self._replaying = False

    def _extend_entries(self, entries: Iterable[Mapping[str, Any]]) -> None:
        for offset, entry in enumerate(entries):
            where = f"entries[{offset}] (position {self.position})"
            if not isinstance(entry, Mapping):
                raise ExchangeLogError(f"{where}: expected an entry object, got {type(entry).__name__}")
            op, exchange_id = entry.get("op"), entry.get("exchange_id")
            try:
                if op == "open":
                    expected = exchange_id_at(len(self._exchanges))
                    if exchange_id != expected:
                        raise ExchangeLogError(f"open of {exchange_id!r} but the next exchange is {expected!r}")
                    self.open(entry.get("inputs") or ())
                elif op == "output":
                    self.record_output(str(exchange_id), entry.get("message") or {})
                elif op == "tool_result":
                    self.record_tool_result(str(exchange_id), entry.get("tool_call_id", ""), entry.get("content"))
                elif op == "close":
                    self.close(str(exchange_id))
                else:
                    raise ExchangeLogError(f"unknown op {op!r}")
            except ExchangeLogError as exc:
                raise ExchangeLogError(f"{where}: {exc}") from None

    # ------------------------------------------------------------------ internals

    def _require_open(self, exchange_id: str, operation: str) -> Exchange:
        exchange = self.exchange(exchange_id)
        if exchange.closed:
            raise ExchangeLogError(f"{operation}: exchange {exchange_id!r} is closed; closed exchanges never change")
        return exchange

    def _redacted(self, message: Message) -> Message:
        if self.redactor is None or self._replaying:
            return message
        data = message.to_dict()
        clean = self.redactor.redact_value(data)
        return message if clean is data else Message.from_value(clean, "message")

    def _replace(self, exchange: Exchange) -> None:
        self._exchanges[exchange.index] = exchange
        self._exchanges_cache = None

    def _commit(self, text: str) -> None:
        """Append an entry given as its canonical JSON ``text`` and extend the hash chain. Each op
        assembles that text from parts it already has (keys in sorted order), so no entry is
        built and encoded again."""
        self._entry_texts.append(text)
        self._digest = sha256_hex(self._digest + text)
        self._exchanges_cache = None

    def _index_closed(self, exchange: Exchange, texts: list[str]) -> None:
        proj = self._projection
        # Only the newest exchange can be open, so closed exchanges always extend the prefix.
        if exchange.index != proj.closed_count:  # pragma: no cover - guarded by the single-open rule
            raise ExchangeLogError("internal: closed exchanges out of order")
        proj.exchange_ids.append(exchange.exchange_id)
        proj.item_json.extend(texts)
        proj.item_ids.extend(f"{exchange.exchange_id}/{k}" for k in range(len(texts)))
        proj.item_offsets.append(len(proj.item_json))
        mask = _category_mask(exchange)
        proj.category_masks.append(mask)
        proj.category_or.append(proj.category_or[-1] | mask)

    def __repr__(self) -> str:
        return f"ExchangeLog(log_id={self.log_id!r}, exchanges={len(self._exchanges)}, position={self.position})"
