"""Canonical JSON, SHA-256 digests and the strict value codec.

``canonical_json`` is the one byte form used for every digest in qitos: sorted keys, no
insignificant whitespace, UTF-8, no NaN or infinity. A lone surrogate (``"\\ud800"``, which has no
UTF-8 form) is written as its JSON escape ``\\ud800``, so the text always encodes as UTF-8 and
``json.loads`` gives the same string back; :func:`check_text` finds such strings where a value must
be refused instead (a task, see :class:`~qitos.core._task.Task`).

``encode_value`` / ``decode_value`` turn typed Python values into JSON-native data and back, guided
by type hints. They round-trip dataclasses (nested, subclassed as declared), enums, tuples, lists,
sets, dicts, datetimes and ``Optional``/``Union``/``Literal`` fields, and pydantic models declared
by their class (``model_dump(mode="json")`` / ``model_validate``; told by those methods, so
pydantic itself is never imported here). Anything they cannot bring back
exactly raises :class:`~qitos.core._errors.CodecError` naming the field path; nothing is silently
turned into ``None`` or a plain dict. That includes a cyclic value (a list or dict that contains
itself) and one nested deeper than the interpreter's recursion limit allows: the error names the
path where the cycle closes or the nesting gets too deep, never a bare ``RecursionError``.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import hashlib
import json
import math
import re
import sys
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any, Literal, Union

from qitos.core._errors import CodecError

__all__ = [
    "canonical_json",
    "check_text",
    "decode_key",
    "decode_value",
    "digest",
    "encode_key",
    "encode_value",
    "escape_surrogates",
    "field_hints",
    "is_model_class",
    "recursion_error",
    "sha256_hex",
]

_JSON_SCALARS = (str, int, bool, type(None))


# One encoder, built once: json.dumps with these options builds a new JSONEncoder on every call.
_CANONICAL_ENCODE = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def canonical_json(value: object) -> str:
    """The canonical JSON text of a JSON-native value (sorted keys, compact, no NaN; lone
    surrogates escaped). A cyclic or too deeply nested value raises CodecError."""
    try:
        text: str = _CANONICAL_ENCODE(value)
    except RecursionError:
        raise recursion_error(value, "value") from None
    except ValueError as exc:
        if "Circular reference" in str(exc):
            raise recursion_error(value, "value") from None
        raise
    return escape_surrogates(text)


def escape_surrogates(json_text: str) -> str:
    """JSON text with every lone surrogate written as its ``\\uXXXX`` escape: the same JSON value,
    now encodable as UTF-8 (the text itself when it has none, checked in O(1) for ASCII)."""
    if json_text.isascii():  # O(1) for most texts: CPython flags pure-ASCII strings
        return json_text
    try:
        json_text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub(_escape_surrogate, json_text)
    return json_text


_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape_surrogate(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def check_text(value: object, path: str) -> None:
    """Raise CodecError naming the path of the first string (or string key) in ``value`` holding a
    lone surrogate: text that cannot be written as UTF-8 and must be refused where it enters."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                match = _SURROGATE.search(item)
                if match is not None:
                    raise CodecError(
                        where,
                        f"contains a lone surrogate ({match.group()!a} at index {match.start()}), which is not "
                        "valid Unicode text and cannot be stored as UTF-8",
                    )
        elif isinstance(item, Mapping):
            for key, sub in item.items():
                if isinstance(key, str):
                    stack.append((key, f"{where} (key {key!a})"))
                stack.append((sub, f"{where}[{key!r}]"))
        elif isinstance(item, list | tuple | set | frozenset):
            stack.extend((sub, f"{where}[{i}]") for i, sub in enumerate(item))
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            stack.extend((getattr(item, f.name), f"{where}.{f.name}") for f in dataclasses.fields(item))


def recursion_error(value: object, path: str) -> CodecError:
    """The CodecError for a value whose encoding hit the recursion limit: it names the path where
    ``value`` refers back to a container it is inside (a cycle), else the path where its nesting
    exceeds what the interpreter's recursion limit allows. Walks iteratively (never recurses); paths
    are spelled out for the first 32 levels, and ``...`` stands for the levels below."""
    on_path: set[int] = set()
    deepest = (0, path)
    # (item, path, depth, leaving): leaving=True marks the exit from a container.
    stack: list[tuple[Any, str, int, bool]] = [(value, path, 0, False)]
    while stack:
        item, where, depth, leaving = stack.pop()
        if leaving:
            on_path.discard(id(item))
            continue
        if not isinstance(item, Mapping | list | tuple | set | frozenset) and not (
            dataclasses.is_dataclass(item) and not isinstance(item, type)
        ):
            continue
        if id(item) in on_path:
            return CodecError(where, "the value is cyclic: it contains itself here, so it has no JSON form")
        if depth > deepest[0]:
            deepest = (depth, where)
        on_path.add(id(item))
        stack.append((item, where, depth, True))
        children = list(_children(item, where, depth < _SPELLED_LEVELS))
        stack.extend((sub, sub_path, depth + 1, False) for sub, sub_path in reversed(children))
    depth, where = deepest
    return CodecError(
        where,
        f"the value is nested {depth} levels deep, deeper than the interpreter's recursion limit "
        f"({sys.getrecursionlimit()}) allows to encode; flatten it",
    )


_SPELLED_LEVELS = 32


def _children(item: Any, where: str, spell: bool) -> Iterator[tuple[Any, str]]:
    """The items of a container with their paths (``where...`` for all of them once not ``spell``)."""
    below = where if where.endswith("...") else f"{where}..."
    if isinstance(item, Mapping):
        for key, sub in item.items():
            yield sub, f"{where}[{key!r}]" if spell else below
    elif isinstance(item, list | tuple | set | frozenset):
        for i, sub in enumerate(item):
            yield sub, f"{where}[{i}]" if spell else below
    else:
        for f in dataclasses.fields(item):
            yield getattr(item, f.name), f"{where}.{f.name}" if spell else below


def sha256_hex(text: str | bytes) -> str:
    """SHA-256 of text (UTF-8; a lone surrogate as its 3-byte form) or bytes, as 64 hex digits."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


def digest(value: object) -> str:
    """SHA-256 of the canonical JSON of a JSON-native value."""
    return sha256_hex(canonical_json(value))


_FIELD_HINTS: dict[type, dict[str, Any]] = {}


def field_hints(cls: type) -> dict[str, Any]:
    """Resolved type hints of a dataclass's fields (cached per class)."""
    hints = _FIELD_HINTS.get(cls)
    if hints is None:
        resolved = typing.get_type_hints(cls)
        hints = {f.name: resolved.get(f.name, Any) for f in dataclasses.fields(cls)}
        _FIELD_HINTS[cls] = hints
    return hints


# --------------------------------------------------------------------------- encode


def encode_value(value: object, hint: object = Any, path: str = "value") -> Any:
    """Encode ``value`` (declared as ``hint``) into JSON-native data, or raise CodecError.

    A value that does not fit its declared type (an ``int`` field holding ``"3"``, a ``date`` field
    holding a ``datetime``) fails here, naming the path, rather than when the data is decoded. So
    does a cyclic or too deeply nested value (see the module docstring).
    """
    try:
        return _encode(value, hint, path)
    except RecursionError:
        raise recursion_error(value, path) from None


def _encode(value: Any, hint: Any, path: str) -> Any:
    if value is None:
        return None
    kind = type(value)
    if (kind is str or kind is int or kind is bool) and (
        hint is Any or hint is kind or hint is object or (kind is int and hint is float)
    ):
        return value
    if kind is float and (hint is float or hint is Any or hint is object):
        return _encode_float(value, path)
    origin = typing.get_origin(hint)
    if hint is Any or hint is object:
        return _encode_untyped(value, path)
    if origin is Union or origin is types.UnionType:
        return _encode_union(value, hint, path)
    if origin is Literal:
        if value not in typing.get_args(hint):
            raise CodecError(path, f"{value!r} is not one of {typing.get_args(hint)!r}")
        return _encode_untyped(value, path)
    expected = origin or hint
    if not isinstance(expected, type):
        expected = None  # a TypeVar, NewType or similar: nothing to check the value against
    if isinstance(value, enum.Enum):
        if expected is not None and not _fits(value, expected):
            raise CodecError(path, _wrong_type(expected, value))
        return _encode_untyped(value.value, path)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if expected is not None and type(value) is not expected:
            raise CodecError(
                path,
                f"declared {_name(expected)} but holds {type(value).__qualname__}; "
                "a subclass instance cannot round-trip through the declared type",
            )
        return _encode_dataclass(value, path)
    if isinstance(value, _dt.date):  # also datetime
        if expected is not None and not _fits(value, expected):
            raise CodecError(path, _wrong_type(expected, value))
        return value.isoformat()
    if isinstance(value, float | str | int):  # bool is an int
        if expected is not None and not _fits(value, expected):
            raise CodecError(path, _wrong_type(expected, value))
        return _encode_float(value, path) if isinstance(value, float) else value
    if expected is not None and is_model_class(expected) and isinstance(value, expected):
        if type(value) is not expected:
            raise CodecError(
                path,
                f"declared {_name(expected)} but holds {type(value).__qualname__}; "
                "a subclass instance cannot round-trip through the declared type",
            )
        return _encode_untyped(value.model_dump(mode="json"), path)
    args = typing.get_args(hint)
    if isinstance(value, list | tuple | set | frozenset):
        if expected is not None and not isinstance(value, expected):
            raise CodecError(path, _wrong_type(expected, value))
        return _encode_sequence(value, origin, args, path)
    if isinstance(value, Mapping):
        if expected is not None and not isinstance(value, expected):
            raise CodecError(path, _wrong_type(expected, value))
        key_hint = args[0] if args else Any
        value_hint = args[1] if len(args) > 1 else Any
        return {encode_key(k, key_hint, path): _encode(v, value_hint, f"{path}[{k!r}]") for k, v in value.items()}
    raise CodecError(path, f"cannot encode {type(value).__qualname__}")


def _fits(value: object, cls: type) -> bool:
    """Whether ``value`` decodes back equal as ``cls``: ints fit float, bools fit only bool,
    a datetime does not fit date."""
    if cls is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if cls is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if cls is _dt.date:
        return isinstance(value, _dt.date) and not isinstance(value, _dt.datetime)
    return isinstance(value, cls)


def _wrong_type(expected: type, value: object) -> str:
    return f"declared {_name(expected)} but holds {type(value).__qualname__} {value!r:.60}"


def _encode_sequence(value: Any, origin: Any, args: tuple[Any, ...], path: str) -> list[Any]:
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        if len(args) != len(value):
            raise CodecError(path, f"expected a tuple of {len(args)} items, got {len(value)}")
        return [_encode(v, h, f"{path}[{i}]") for i, (v, h) in enumerate(zip(value, args, strict=True))]
    item_hint = args[0] if args else Any
    items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
    if item_hint in _PLAIN_ITEM_TYPES and all(type(v) is item_hint for v in items):
        return list(items)  # each item is its own JSON form: nothing to convert or check
    return [_encode(v, item_hint, f"{path}[{i}]") for i, v in enumerate(items)]


# Item types encoded as themselves (float is not: NaN and infinities are refused per item).
_PLAIN_ITEM_TYPES: frozenset[Any] = frozenset({str, int, bool})


def _encode_untyped(value: object, path: str) -> Any:
    """Encode a value whose declared type is Any: only JSON-native data round-trips there."""
    if isinstance(value, float):
        return _encode_float(value, path)
    if isinstance(value, _JSON_SCALARS):
        return value
    if isinstance(value, list):
        return [_encode_untyped(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise CodecError(path, f"key {k!r} is not a string; an untyped dict must have string keys")
            out[k] = _encode_untyped(v, f"{path}[{k!r}]")
        return out
    raise CodecError(
        path,
        f"a {type(value).__qualname__} under an untyped (Any) field cannot round-trip; "
        "declare the field's type or store JSON-native data",
    )


def _encode_float(value: float, path: str) -> float:
    if not math.isfinite(value):
        raise CodecError(path, f"{value!r} is not a finite number")
    return value


def _encode_union(value: object, hint: object, path: str) -> Any:
    arms = [a for a in typing.get_args(hint) if a is not type(None)]
    for arm in arms:
        if _matches(value, arm):
            return _encode(value, arm, path)
    raise CodecError(path, f"{type(value).__qualname__} matches no member of {hint}")


def _matches(value: object, hint: object) -> bool:
    if hint is Any or hint is object:
        return True
    origin = typing.get_origin(hint) or hint
    if origin is Literal:
        return value in typing.get_args(hint)
    return isinstance(origin, type) and _fits(value, origin)


def encode_key(key: Any, hint: Any, path: str) -> str:
    """Encode a dict key declared as ``hint`` into a JSON object key, or raise CodecError.

    Strings stay as they are, enum members become their value and ints (also int-valued enum
    members) their decimal text; :func:`decode_key` brings each back. Under an undeclared
    (``Any``) key type only string keys can round-trip.
    """
    if type(key) is str and (hint is str or hint is Any or hint is object):
        return key
    declared = isinstance(hint, type) and hint is not object and hint is not Any  # Any is a class since 3.11
    if declared and not _fits(key, hint):
        raise CodecError(path, f"dict key {key!r} is not a {hint.__qualname__}")
    raw = key.value if isinstance(key, enum.Enum) else key
    if isinstance(raw, str) and (declared or isinstance(key, str)):
        return raw
    if type(raw) is int and (hint is int or (declared and issubclass(hint, enum.Enum))):
        return str(raw)
    raise CodecError(
        path, f"dict key {key!r} cannot round-trip as a JSON object key; declare the key type (str, int or an Enum)"
    )


def _encode_dataclass(value: object, path: str) -> dict[str, Any]:
    hints = field_hints(type(value))
    return {name: _encode(getattr(value, name), hint, f"{path}.{name}") for name, hint in hints.items()}


# --------------------------------------------------------------------------- decode


def decode_value(data: object, hint: object = Any, path: str = "value") -> Any:
    """Decode JSON-native ``data`` into a value of type ``hint``, or raise CodecError (also for
    data nested too deeply to decode)."""
    try:
        return _decode(data, hint, path)
    except RecursionError:
        raise recursion_error(data, path) from None


def _decode(data: object, hint: object, path: str) -> Any:
    if hint is Any or hint is object:
        return data
    origin = typing.get_origin(hint)
    if origin is Union or origin is types.UnionType:
        return _decode_union(data, hint, path)
    if data is None:
        if hint is type(None):
            return None
        raise CodecError(path, f"None is not a valid {_name(hint)}")
    if origin is Literal:
        if data not in typing.get_args(hint):
            raise CodecError(path, f"{data!r} is not one of {typing.get_args(hint)!r}")
        return data
    if origin is typing.ClassVar:
        raise CodecError(path, "ClassVar fields are not state")
    if isinstance(hint, type):
        return _decode_class(data, hint, path)
    if origin in (list, tuple, set, frozenset):
        return _decode_sequence(data, origin, typing.get_args(hint), path)
    if origin in (dict, Mapping) or origin is typing.get_origin(Mapping[str, Any]):
        if not isinstance(data, dict):
            raise CodecError(path, f"expected an object, got {type(data).__qualname__}")
        args = typing.get_args(hint)
        key_hint = args[0] if args else Any
        value_hint = args[1] if len(args) > 1 else Any
        return {decode_key(k, key_hint, path): _decode(v, value_hint, f"{path}[{k!r}]") for k, v in data.items()}
    raise CodecError(path, f"unsupported declared type {hint!r}")


def _decode_class(data: Any, cls: type, path: str) -> Any:
    if issubclass(cls, enum.Enum):
        try:
            return cls(data)
        except ValueError as exc:
            raise CodecError(path, f"{data!r} is not a valid {cls.__qualname__}") from exc
    if dataclasses.is_dataclass(cls):
        if not isinstance(data, dict):
            raise CodecError(path, f"expected an object for {cls.__qualname__}, got {type(data).__qualname__}")
        return _decode_dataclass(cls, data, path)
    if is_model_class(cls):
        try:
            return cls.model_validate(data)  # type: ignore[attr-defined]
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            first = str(exc).splitlines()
            raise CodecError(path, f"not a valid {cls.__qualname__}: {' '.join(first[:3])}") from exc
    if cls is bool:
        if not isinstance(data, bool):
            raise CodecError(path, f"expected a bool, got {data!r}")
        return data
    if cls is int:
        if not isinstance(data, int) or isinstance(data, bool):
            raise CodecError(path, f"expected an int, got {data!r}")
        return data
    if cls is float:
        if not isinstance(data, int | float) or isinstance(data, bool):
            raise CodecError(path, f"expected a number, got {data!r}")
        return float(data)
    if cls is str:
        if not isinstance(data, str):
            raise CodecError(path, f"expected a string, got {data!r}")
        return data
    if cls in (_dt.datetime, _dt.date):
        try:
            return cls.fromisoformat(data)
        except (TypeError, ValueError) as exc:
            raise CodecError(path, f"{data!r} is not an ISO {cls.__name__}") from exc
    if cls in (list, tuple, set, frozenset):
        return _decode_sequence(data, cls, (), path)
    if cls is dict:
        if not isinstance(data, dict):
            raise CodecError(path, f"expected an object, got {type(data).__qualname__}")
        return data
    raise CodecError(path, f"unsupported declared type {cls.__qualname__}")


def decode_dataclass(cls: type, data: Mapping[str, object], path: str) -> Any:
    """Build dataclass ``cls`` from encoded field data, checking for unknown fields."""
    try:
        return _decode_dataclass(cls, data, path)
    except RecursionError:
        raise recursion_error(data, path) from None


def _decode_dataclass(cls: type, data: Mapping[str, object], path: str) -> Any:
    hints = field_hints(cls)
    unknown = set(data) - set(hints)
    if unknown:
        raise CodecError(path, f"unknown field(s) for {cls.__qualname__}: {sorted(unknown)}")
    init_kwargs: dict[str, Any] = {}
    late: dict[str, Any] = {}
    init_names = {f.name for f in dataclasses.fields(cls) if f.init}
    for name, raw in data.items():
        value = _decode(raw, hints[name], f"{path}.{name}")
        (init_kwargs if name in init_names else late)[name] = value
    try:
        obj = cls(**init_kwargs)
    except TypeError as exc:
        raise CodecError(path, f"cannot build {cls.__qualname__}: {exc}") from exc
    for name, value in late.items():
        object.__setattr__(obj, name, value)
    return obj


# Item types whose JSON form is the value itself: a list of exactly these decodes to a copy.
_EXACT_ITEM_TYPES: frozenset[Any] = frozenset({str, int, bool, float})


def _decode_sequence(data: Any, origin: Any, args: tuple[Any, ...], path: str) -> Any:
    if not isinstance(data, list):
        raise CodecError(path, f"expected an array, got {type(data).__qualname__}")
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        if len(args) != len(data):
            raise CodecError(path, f"expected {len(args)} items, got {len(data)}")
        return tuple(_decode(v, h, f"{path}[{i}]") for i, (v, h) in enumerate(zip(data, args, strict=True)))
    item_hint = args[0] if args else Any
    if (
        item_hint is Any
        or item_hint is object
        or (item_hint in _EXACT_ITEM_TYPES and all(type(v) is item_hint for v in data))
    ):
        items = list(data)  # nothing to convert or check per item (a long list of strings, say)
    else:
        items = [_decode(v, item_hint, f"{path}[{i}]") for i, v in enumerate(data)]
    if origin is list:
        return items
    return origin(items)


def _decode_union(data: object, hint: object, path: str) -> Any:
    arms = typing.get_args(hint)
    if data is None:
        if type(None) in arms:
            return None
        raise CodecError(path, f"None is not a valid {hint}")
    errors: list[str] = []
    candidates = [arm for arm in arms if arm is not type(None)]
    first: tuple[Any] | None = None
    for arm in candidates:
        try:
            value = _decode(data, arm, path)
        except CodecError as exc:
            errors.append(exc.message)
            continue
        if len(candidates) == 1:
            return value
        # Several arms may accept the data (a datetime arm reads "2024-01-01" too): prefer the one
        # that encodes the value back to the same data, that is the arm it was encoded from.
        try:
            if encode_value(value, arm, path) == data:
                return value
        except CodecError:
            pass
        if first is None:
            first = (value,)
    if first is not None:
        return first[0]
    raise CodecError(path, f"{data!r} matches no member of {hint} ({'; '.join(errors)})")


def decode_key(key: str, hint: object, path: str) -> Any:
    """Decode a JSON object key written by :func:`encode_key` back to a key of type ``hint``."""
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        member = _enum_keys(hint).get(key)
        if member is None:
            raise CodecError(path, f"dict key {key!r} is not a valid {hint.__qualname__}")
        return member
    if hint is int:
        try:
            return int(key)
        except ValueError as exc:
            raise CodecError(path, f"dict key {key!r} is not an int") from exc
    return key


_ENUM_KEYS: dict[type, dict[str, Any]] = {}


def _enum_keys(cls: type[enum.Enum]) -> dict[str, Any]:
    """Members of ``cls`` by their JSON object key (as :func:`encode_key` writes it); cached."""
    members = _ENUM_KEYS.get(cls)
    if members is None:
        members = {}
        for member in cls:
            value = member.value
            if isinstance(value, str):
                members[value] = member
            elif type(value) is int:
                members[str(value)] = member
        _ENUM_KEYS[cls] = members
    return members


def is_model_class(tp: object) -> bool:
    """Whether ``tp`` is a pydantic model class, told by its methods (pydantic is never imported)."""
    return isinstance(tp, type) and all(
        callable(getattr(tp, name, None)) for name in ("model_validate", "model_json_schema", "model_dump")
    )


def _name(hint: object) -> str:
    return getattr(hint, "__qualname__", repr(hint))
