"""Tools: the ``@tool`` decorator, ``ToolSpec``, ``ToolRegistry`` and ``ToolResult``.

A tool is a Python callable with a JSON-schema description. ``@tool`` derives the schema from type
hints and the docstring (a Google-style ``Args:`` section gives parameter descriptions) and declares
how the engine should run it: ``timeout`` seconds, ``idempotent`` (safe to re-run after a crash),
``needs_approval`` (a human must approve each call), ``concurrency_safe`` (may run at the same time
as the other concurrency-safe calls of one decision), ``max_output_chars``.

A tool may be an ``async def`` function (its schema comes from hints and docstring the same way):
``ToolRegistry.acall`` awaits it on the running loop and runs sync tools in a given executor;
``ToolRegistry.call`` runs it to completion with ``asyncio.run`` (refused inside a running loop).

A caller that must act right before a tool's own code runs (a durable session records that a call
which is not idempotent has started) passes a ``CallStart``: ``begin`` runs in the thread that runs
a sync tool (an executor thread under ``acall``), just before the tool, and ``abegin`` on the loop
just before an ``async def`` tool is awaited. A call waiting for an executor thread has therefore
not begun. If ``begin``/``abegin`` raises, the tool does not run and the exception propagates.

``ToolRegistry.call`` never raises for a tool's own failure: unknown tools, invalid arguments,
exceptions and timeouts all become a ``ToolResult`` with ``ok=False`` and an ``error_kind`` that the
agent can read and react to.

Outputs: ``max_output_chars`` caps the output's *text form* (the string itself, or the JSON text
of any other output): an output whose text form is longer becomes that text cut to the cap plus a
``[truncated N of M characters]`` note, with ``truncated=True`` (so a 50 MB list never reaches the
store or the model whole). An output that is not valid Unicode text (a lone surrogate such as
``"\\ud800"``, in the string or anywhere in its JSON text) cannot be stored or sent to a model: the
call becomes a ``tool_error`` result saying where, not an escaped or altered output. So does an
output that is cyclic or nested too deeply to have a text form. Arguments holding a lone surrogate
are ``invalid_arguments`` (the tool does not run).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import datetime
import enum
import inspect
import json
import queue
import re
import threading
import time
import types
import typing
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Union, overload

from qitos.core._codec import check_text
from qitos.core._errors import CodecError, ToolDefinitionError

__all__ = [
    "DEFAULT_MAX_OUTPUT_CHARS",
    "CallStart",
    "ToolErrorKind",
    "ToolRegistry",
    "ToolResult",
    "ToolSpec",
    "compile_validator",
    "schema_for_function",
    "schema_for_type",
    "tool",
    "validate_arguments",
]

DEFAULT_MAX_OUTPUT_CHARS = 20_000

ToolErrorKind = Literal["unknown_tool", "invalid_arguments", "tool_error", "timeout", "rejected", "interrupted"]


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    """A registered tool: name, description, JSON schema of its arguments, and how to run it."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    func: Callable[..., Any] = field(repr=False)
    timeout: float | None = None
    idempotent: bool = False
    needs_approval: bool = False
    concurrency_safe: bool = False
    max_output_chars: int | None = DEFAULT_MAX_OUTPUT_CHARS

    def schema(self) -> dict[str, Any]:
        """The provider-neutral schema: ``{"name", "description", "parameters"}``."""
        return {"name": self.name, "description": self.description, "parameters": dict(self.parameters)}


@dataclass(frozen=True, kw_only=True, init=False)
class ToolResult:
    """The outcome of one tool call, as the agent observes it."""

    call_id: str
    name: str
    ok: bool
    output: Any = None
    error: str | None = None
    error_kind: ToolErrorKind | None = None
    duration_ms: float = 0.0
    truncated: bool = False

    # Hand-written: the generated frozen __init__ costs ~2 µs more, once per tool call.
    def __init__(
        self,
        *,
        call_id: str,
        name: str,
        ok: bool,
        output: object = None,
        error: str | None = None,
        error_kind: ToolErrorKind | None = None,
        duration_ms: float = 0.0,
        truncated: bool = False,
    ) -> None:
        values = self.__dict__
        values["call_id"] = call_id
        values["name"] = name
        values["ok"] = ok
        values["output"] = output
        values["error"] = error
        values["error_kind"] = error_kind
        values["duration_ms"] = duration_ms
        values["truncated"] = truncated

    def as_text(self) -> str:
        """The text a model sees for this result."""
        if self.ok:
            return self.output if isinstance(self.output, str) else _to_text(self.output)
        return f"ERROR ({self.error_kind}): {self.error}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form for traces and durable storage."""
        return {
            "call_id": self.call_id,
            "name": self.name,
            "ok": self.ok,
            "output": _jsonable(self.output),
            "error": self.error,
            "error_kind": self.error_kind,
            "duration_ms": round(self.duration_ms, 3),
            "truncated": self.truncated,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolResult:
        """Inverse of :meth:`to_dict` (outputs come back as their JSON form)."""
        return cls(
            call_id=data["call_id"],
            name=data["name"],
            ok=bool(data["ok"]),
            output=data.get("output"),
            error=data.get("error"),
            error_kind=data.get("error_kind"),
            duration_ms=float(data.get("duration_ms", 0.0)),
            truncated=bool(data.get("truncated", False)),
        )


# --------------------------------------------------------------------------- decorator


@overload
def tool(func: Callable[..., object], /) -> Callable[..., Any]: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    idempotent: bool = False,
    needs_approval: bool = False,
    concurrency_safe: bool = False,
    max_output_chars: int | None = DEFAULT_MAX_OUTPUT_CHARS,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...


def tool(
    func: Callable[..., object] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    idempotent: bool = False,
    needs_approval: bool = False,
    concurrency_safe: bool = False,
    max_output_chars: int | None = DEFAULT_MAX_OUTPUT_CHARS,
) -> Any:
    """Mark a function (or method) as a tool. Use bare (``@tool``) or with options (``@tool(timeout=5)``).

    ``concurrency_safe=True`` lets the engine run the call together with the neighbouring
    concurrency-safe calls of the same decision (threads, or the event loop for ``async def`` tools);
    a call that is not is a barrier: it runs alone, after the calls before it have finished. A tool
    that needs approval never runs in parallel, whatever this flag says.

    The function stays callable as before; its ``ToolSpec`` is built when it is registered.
    """

    def mark(fn: Callable[..., object]) -> Callable[..., Any]:
        if timeout is not None and timeout <= 0:
            raise ToolDefinitionError(f"tool {fn.__name__!r}: timeout must be > 0, got {timeout}")
        fn.__qitos_tool__ = {  # type: ignore[attr-defined]
            "name": name or fn.__name__,
            "description": description,
            "timeout": timeout,
            "idempotent": idempotent,
            "needs_approval": needs_approval,
            "concurrency_safe": concurrency_safe,
            "max_output_chars": max_output_chars,
        }
        return fn

    return mark(func) if func is not None else mark


def _spec_from_callable(fn: Callable[..., object]) -> ToolSpec:
    """The spec of ``fn``; a bound method's is derived once per function (agents are built per run)."""
    function = getattr(fn, "__func__", None)
    if function is None or not inspect.ismethod(fn):
        return _derive_spec(fn)
    template = _METHOD_SPECS.get(function)
    if template is None:
        spec = _derive_spec(fn)
        _METHOD_SPECS[function] = replace(spec, func=_unbound)  # holds no instance, nor the function
        return spec
    return replace(template, func=fn)


def _unbound(*args: object, **kwargs: object) -> Any:  # pragma: no cover - a cached spec's placeholder, never called
    raise AssertionError("a cached method spec is always given its bound method")


# Specs of ``@tool`` methods by their function: hints, signature and docstring are read once.
_METHOD_SPECS: weakref.WeakKeyDictionary[Any, ToolSpec] = weakref.WeakKeyDictionary()
# And what registering one compiles (its validator, its enum converters), kept with the schema it
# was compiled from: every agent instance registers the same methods again.
_METHOD_CHECKS: weakref.WeakKeyDictionary[Any, tuple[Mapping[str, Any], Validator, dict[str, Any]]] = (
    weakref.WeakKeyDictionary()
)


def _checks(spec: ToolSpec) -> tuple[Validator, dict[str, Callable[[Any], Any]]]:
    """``spec``'s argument validator and enum converters, compiled once per method and schema."""
    function = getattr(spec.func, "__func__", None)
    cached = _METHOD_CHECKS.get(function) if function is not None else None
    if cached is not None and cached[0] is spec.parameters:
        return cached[1], cached[2]
    validator, converters = compile_validator(spec.parameters), _enum_converters(spec)
    if function is not None:
        _METHOD_CHECKS[function] = (spec.parameters, validator, converters)
    return validator, converters


def _derive_spec(fn: Callable[..., object]) -> ToolSpec:
    options: dict[str, Any] = dict(getattr(fn, "__qitos_tool__", None) or {"name": fn.__name__})
    doc_summary, param_docs = _parse_docstring(inspect.getdoc(fn) or "")
    return ToolSpec(
        name=options["name"],
        description=options.get("description") or doc_summary or options["name"],
        parameters=schema_for_function(fn, param_docs),
        func=fn,
        timeout=options.get("timeout"),
        idempotent=options.get("idempotent", False),
        needs_approval=options.get("needs_approval", False),
        concurrency_safe=options.get("concurrency_safe", False),
        max_output_chars=options.get("max_output_chars", DEFAULT_MAX_OUTPUT_CHARS),
    )


# --------------------------------------------------------------------------- schema


def schema_for_function(fn: Callable[..., object], param_docs: Mapping[str, str] | None = None) -> dict[str, Any]:
    """JSON schema (``type: object``) of ``fn``'s parameters, from its type hints."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:
        raise ToolDefinitionError(f"tool {fn.__name__!r}: cannot resolve type hints: {exc}") from exc
    properties: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in inspect.signature(fn).parameters.items():
        if pname in ("self", "cls") or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        hint = hints.get(pname, Any)
        try:
            prop = _schema_for_hint(hint)
        except ToolDefinitionError as exc:
            raise ToolDefinitionError(f"tool {fn.__name__!r}, parameter {pname!r}: {exc}") from exc
        if param_docs and pname in param_docs:
            prop["description"] = param_docs[pname]
        if param.default is param.empty:
            required.append(pname)
        elif param.default is None or isinstance(param.default, str | int | float | bool):
            prop["default"] = param.default
        properties[pname] = prop
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def schema_for_type(hint: object) -> dict[str, Any]:
    """JSON schema of a type: what a tool parameter may be, and also dataclasses (an object of their
    fields, nested dataclasses inline) and dates (ISO strings), as the strict codec decodes them.
    Raises ToolDefinitionError naming an unsupported (or recursive) type."""
    return _schema_for_hint(hint, records=())


def _schema_for_hint(hint: object, records: tuple[type, ...] | None = None) -> dict[str, Any]:
    # records: None for a tool parameter (plain JSON types only); else the dataclasses being described
    if hint is Any:
        return {}
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Union or origin is types.UnionType:
        arms = [a for a in args if a is not type(None)]
        inner = (
            _schema_for_hint(arms[0], records)
            if len(arms) == 1
            else {"anyOf": [_schema_for_hint(a, records) for a in arms]}
        )
        if type(None) in args:
            return {"anyOf": [inner, {"type": "null"}]}
        return inner
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (list, tuple, set, frozenset) or hint in (list, tuple, set, frozenset):
        item = _schema_for_hint(args[0], records) if args and args[0] is not Ellipsis else {}
        return {"type": "array", "items": item}
    if origin is dict or hint is dict:
        schema: dict[str, Any] = {"type": "object"}
        if len(args) == 2:
            schema["additionalProperties"] = _schema_for_hint(args[1], records)
        return schema
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"enum": [m.value for m in hint]}
    simple = {str: "string", bool: "boolean", int: "integer", float: "number", type(None): "null"}
    if hint in simple:
        return {"type": simple[hint]}
    if records is not None:
        if hint is datetime.datetime or hint is datetime.date:
            return {"type": "string", "format": "date-time" if hint is datetime.datetime else "date"}
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            return _record_schema(hint, records)
    raise ToolDefinitionError(f"unsupported type {hint!r}; use str, int, float, bool, list, dict, Literal, Enum")


def _record_schema(cls: type, records: tuple[type, ...]) -> dict[str, Any]:
    if cls in records:
        raise ToolDefinitionError(f"{cls.__qualname__} contains itself; a recursive dataclass has no inline schema")
    try:
        hints = typing.get_type_hints(cls)
    except Exception as exc:
        raise ToolDefinitionError(f"{cls.__qualname__}: cannot resolve type hints: {exc}") from exc
    properties: dict[str, Any] = {}
    required: list[str] = []
    for item in dataclasses.fields(cls):
        try:
            properties[item.name] = _schema_for_hint(hints.get(item.name, Any), (*records, cls))
        except ToolDefinitionError as exc:
            raise ToolDefinitionError(f"{cls.__qualname__}.{item.name}: {exc}") from exc
        if item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING:
            required.append(item.name)
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters)\s*:\s*$")
_ARG_LINE = re.compile(r"^\s{2,}(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Summary (text before sections) and per-parameter descriptions from a Google-style docstring."""
    summary_lines: list[str] = []
    params: dict[str, str] = {}
    lines = doc.splitlines()
    i = 0
    while i < len(lines) and not _ARGS_HEADER.match(lines[i]) and not re.match(r"^\s*\w+\s*:\s*$", lines[i]):
        summary_lines.append(lines[i])
        i += 1
    current: str | None = None
    in_args = False
    for line in lines[i:]:
        if _ARGS_HEADER.match(line):
            in_args = True
            continue
        if in_args:
            match = _ARG_LINE.match(line)
            if match:
                current = match.group(1).lstrip("*")
                params[current] = match.group(3).strip()
            elif line.strip() and line.startswith(" " * 6) and current:
                params[current] += " " + line.strip()
            elif line.strip() and not line.startswith(" "):
                in_args = False
    return " ".join(s.strip() for s in summary_lines if s.strip()), params


# --------------------------------------------------------------------------- validation


def validate_arguments(schema: Mapping[str, object], args: object) -> list[str]:
    """Problems with ``args`` against a JSON schema subset (type, properties, required, enum,
    items, anyOf, additionalProperties). An empty list means valid."""
    problems: list[str] = []
    compile_validator(schema)(args, "arguments", problems)
    return problems


Validator = Callable[[Any, str, list[str]], None]
_MAPPINGS = (dict, Mapping)

_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list | tuple),
    "object": lambda v: isinstance(v, dict | Mapping),
    "null": lambda v: v is None,
}


def compile_validator(schema: Mapping[str, Any]) -> Validator:
    """Turn a JSON schema (the subset above) into a fast validating function, once."""
    if "anyOf" in schema:
        arms = [compile_validator(arm) for arm in schema["anyOf"]]

        def any_of(value: object, path: str, problems: list[str]) -> None:
            for arm in arms:
                sub: list[str] = []
                arm(value, path, sub)
                if not sub:
                    return
            problems.append(f"{path}: {value!r:.60} matches none of the allowed types")

        return any_of
    checks: list[Validator] = []
    if "enum" in schema:
        allowed = list(schema["enum"])

        def enum_check(value: object, path: str, problems: list[str]) -> None:
            if value not in allowed:
                problems.append(f"{path}: {value!r:.60} is not one of {allowed!r}")

        checks.append(enum_check)
    expected = schema.get("type")
    type_tests: list[Callable[[Any], bool]] = []
    if expected is not None:
        kinds = expected if isinstance(expected, list) else [expected]
        type_tests = [_JSON_TYPES[k] for k in kinds if k in _JSON_TYPES]
        label = " or ".join(kinds)
    properties = {k: compile_validator(v) for k, v in (schema.get("properties") or {}).items()}
    required = tuple(schema.get("required", ()))
    extra = schema.get("additionalProperties", True)
    extra_check = compile_validator(extra) if isinstance(extra, Mapping) else None
    items = schema.get("items")
    item_check = compile_validator(items) if isinstance(items, Mapping) else None
    names = ", ".join(properties) or "none"

    single_test = type_tests[0] if len(type_tests) == 1 else None
    if (
        expected == "object"
        and not checks
        and extra is False
        and all(_simple_property(v) for v in (schema.get("properties") or {}).values())
    ):
        return _object_validator(schema, names)

    def check(value: object, path: str, problems: list[str]) -> None:
        if single_test is not None:
            if not single_test(value):
                problems.append(f"{path}: expected {label}, got {type(value).__name__} {value!r:.60}")
                return
        elif type_tests and not any(test(value) for test in type_tests):
            problems.append(f"{path}: expected {label}, got {type(value).__name__} {value!r:.60}")
            return
        for extra_rule in checks:
            extra_rule(value, path, problems)
        if isinstance(value, _MAPPINGS):
            for name in required:
                if name not in value:
                    problems.append(f"{path}: missing required argument {name!r}")
            for key, item in value.items():
                validator = properties.get(key)
                if validator is not None:
                    validator(item, f"{path}.{key}", problems)
                elif extra is False:
                    problems.append(f"{path}: unexpected argument {key!r} (expected: {names})")
                elif extra_check is not None:
                    extra_check(item, f"{path}.{key}", problems)
        elif item_check is not None and isinstance(value, list | tuple):
            for i, item in enumerate(value):
                item_check(item, f"{path}[{i}]", problems)

    return check


_SIMPLE_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict, Mapping),
}


def _simple_property(schema: object) -> bool:
    return (
        isinstance(schema, Mapping)
        and set(schema) <= {"type", "description", "default", "title"}
        and (schema.get("type") in _SIMPLE_TYPES)
    )


def _object_validator(schema: Mapping[str, Any], names: str) -> Validator:
    """The common case, checked without nested calls: an object of plain-typed properties."""
    types_by_name = {k: _SIMPLE_TYPES[v["type"]] for k, v in (schema.get("properties") or {}).items()}
    labels = {k: v["type"] for k, v in (schema.get("properties") or {}).items()}
    required = tuple(schema.get("required", ()))

    def check(value: object, path: str, problems: list[str]) -> None:
        if not isinstance(value, _MAPPINGS):
            problems.append(f"{path}: expected object, got {type(value).__name__} {value!r:.60}")
            return
        for name in required:
            if name not in value:
                problems.append(f"{path}: missing required argument {name!r}")
        for key, item in value.items():
            allowed = types_by_name.get(key)
            if allowed is None:
                problems.append(f"{path}: unexpected argument {key!r} (expected: {names})")
            elif not isinstance(item, allowed):
                problems.append(f"{path}.{key}: expected {labels[key]}, got {type(item).__name__} {item!r:.60}")

    return check


# --------------------------------------------------------------------------- registry


class CallStart(typing.Protocol):
    """What must happen right before a tool's own code runs (see the module docstring)."""

    def begin(self) -> None:
        """In the thread that runs a sync tool, just before it (raise: the tool does not run)."""
        ...

    async def abegin(self) -> None:
        """On the event loop, just before an ``async def`` tool is awaited (raise: it does not run)."""
        ...


class ToolRegistry:
    """Named tools an agent may call. Register functions, ``@tool`` methods of objects, or ToolSpecs."""

    def __init__(self, tools: Iterable[Callable[..., object] | ToolSpec] = ()) -> None:
        self._tools: dict[str, ToolSpec] = {}
        self._schemas: list[dict[str, Any]] | None = None
        self._validators: dict[str, Validator] = {}
        self._is_async: dict[str, bool] = {}
        self._converters: dict[str, dict[str, Callable[[Any], Any]]] = {}
        self._workers: _DaemonWorkers | None = None
        self._release_workers: weakref.finalize[Any, Any] | None = None
        for item in tools:
            self.register(item)

    def register(self, item: Callable[..., Any] | ToolSpec, *, name: str | None = None) -> ToolSpec:
        """Add a tool; returns its spec. Duplicate names are an error."""
        spec = item if isinstance(item, ToolSpec) else _spec_from_callable(item)
        if name:
            spec = replace(spec, name=name)
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", spec.name):
            raise ToolDefinitionError(f"invalid tool name {spec.name!r}: use letters, digits, _ . - (max 64)")
        if spec.name in self._tools:
            raise ToolDefinitionError(f"a tool named {spec.name!r} is already registered")
        self._tools[spec.name] = spec
        validator, converters = _checks(spec)
        self._validators[spec.name] = validator
        self._is_async[spec.name] = inspect.iscoroutinefunction(spec.func)
        if converters:
            self._converters[spec.name] = converters
        self._schemas = None
        return spec

    def include(self, obj: Any) -> list[ToolSpec]:
        """Register every ``@tool``-marked method of ``obj`` (bound to it)."""
        added = []
        for attr in dir(type(obj)):
            member = getattr(type(obj), attr, None)
            if callable(member) and hasattr(member, "__qitos_tool__"):
                added.append(self.register(getattr(obj, attr)))
        return added

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> typing.Iterator[ToolSpec]:
        return iter(self._tools.values())

    def names(self) -> list[str]:
        """Registered tool names, in registration order."""
        return list(self._tools)

    def get(self, name: str) -> ToolSpec | None:
        """The spec named ``name``, or None."""
        return self._tools.get(name)

    def schemas(self) -> list[dict[str, Any]]:
        """Provider-neutral schemas of every tool (cached until the registry changes)."""
        if self._schemas is None:
            self._schemas = [spec.schema() for spec in self._tools.values()]
        return self._schemas

    def call(self, name: str, args: Any, *, call_id: str = "", start: CallStart | None = None) -> ToolResult:
        """Run one tool call. Never raises for the tool's own failure; see the module docstring.

        An ``async def`` tool is run to completion with ``asyncio.run`` in the calling thread; called
        from a thread whose event loop is running, it is refused (a ``tool_error`` result telling to
        use ``acall`` / ``AsyncEngine``), because that loop cannot be re-entered. ``start.begin()``
        runs in the calling thread once the arguments are valid, just before the tool.
        """
        spec, prepared = self._prepare(name, args, call_id)
        if spec is None:
            return prepared  # type: ignore[no-any-return]
        if start is not None:
            start.begin()  # outside the try below: its failure is not the tool's
        started = time.perf_counter()
        try:
            if spec.timeout is None and not self._is_async[name]:
                output = spec.func(**prepared)
            else:
                output = self._invoke(spec, prepared)
        except concurrent.futures.TimeoutError:
            return _failure(call_id, name, "timeout", f"timed out after {spec.timeout} s", started)
        except Exception as exc:
            return _failure(call_id, name, "tool_error", f"{type(exc).__name__}: {exc}", started)
        return self._finish(spec, call_id, output, started)

    async def acall(
        self,
        name: str,
        args: Any,
        *,
        call_id: str = "",
        executor: concurrent.futures.Executor | None = None,
        start: CallStart | None = None,
    ) -> ToolResult:
        """Async twin of :meth:`call`: an ``async def`` tool is awaited on the running loop; a sync
        tool runs in ``executor`` (None: the loop's default executor). ``timeout`` applies to both;
        a sync call that times out keeps its executor thread until it returns (threads cannot be
        killed). Cancelling the awaiting task cancels an async tool; a sync one finishes unobserved.
        ``start.begin()`` runs in the executor thread just before a sync tool (not while the call
        waits for a thread), ``await start.abegin()`` just before an async one is awaited.
        """
        spec, prepared = self._prepare(name, args, call_id)
        if spec is None:
            return prepared  # type: ignore[no-any-return]
        is_async = self._is_async[name]
        if start is not None and is_async:
            await start.abegin()  # outside the try below: its failure is not the tool's
        started = time.perf_counter()
        try:
            if is_async:
                pending = spec.func(**prepared)
            else:
                # qitos' own tool threads (qitos.engine._tool_threads) put the result straight on the
                # loop; any other executor goes through run_in_executor.
                run_soon = getattr(executor, "run_soon", None)
                call = _Bound(spec.func, prepared) if start is None else _Begun(start, spec.func, prepared)
                pending = run_soon(call) if run_soon else asyncio.get_running_loop().run_in_executor(executor, call)
            output = await (pending if spec.timeout is None else asyncio.wait_for(pending, spec.timeout))
        except TimeoutError:
            return _failure(call_id, name, "timeout", f"timed out after {spec.timeout} s", started)
        except _StartFailed as failed:
            raise failed.error from None
        except Exception as exc:
            return _failure(call_id, name, "tool_error", f"{type(exc).__name__}: {exc}", started)
        return self._finish(spec, call_id, output, started)

    def _prepare(self, name: str, args: Any, call_id: str) -> tuple[ToolSpec | None, Any]:
        """``(spec, arguments to call it with)``, or ``(None, failure result)`` when it cannot run
        (shared by ``call`` and ``acall``)."""
        spec = self._tools.get(name)
        if spec is None:
            known = ", ".join(self._tools) or "none"
            return None, _failure(call_id, name, "unknown_tool", f"no tool named {name!r} (available: {known})")
        if not isinstance(args, _MAPPINGS):
            return None, _failure(call_id, name, "invalid_arguments", f"arguments must be an object, got {args!r:.80}")
        problems: list[str] = []
        self._validators[name](args, "arguments", problems)
        if problems:
            return None, _failure(call_id, name, "invalid_arguments", "; ".join(problems))
        if not _plain_text_values(args):
            try:
                check_text(args, "arguments")
            except CodecError as exc:
                return None, _failure(call_id, name, "invalid_arguments", str(exc))
        converters = self._converters.get(name)
        if converters is not None:  # only tools with Enum-annotated parameters
            try:
                args = _convert_arguments(args, converters)
            except ValueError as exc:
                return None, _failure(call_id, name, "invalid_arguments", str(exc))
        return spec, args

    def _finish(self, spec: ToolSpec, call_id: str, output: Any, started: float) -> ToolResult:
        """The result of a call that returned ``output``: capped at the tool's ``max_output_chars``
        (of its text form), refused when it has no valid text form (shared by ``call`` and ``acall``)."""
        name = spec.name
        truncated = False
        cap = spec.max_output_chars
        if type(output) is str:
            text = output
        elif output is None or type(output) in (int, bool, float):
            text = ""
        else:
            try:
                text = _to_text(output)
            except RecursionError:
                message = "the output is cyclic or nested too deeply to have a text form"
                return _failure(call_id, name, "tool_error", message, started)
        if not text.isascii():
            try:
                check_text(text, "output")
            except CodecError as exc:
                return _failure(call_id, name, "tool_error", f"{exc}; the tool must return valid text", started)
        if cap is not None and len(text) > cap:
            output = f"{text[:cap]}\n...[truncated {len(text) - cap} of {len(text)} characters]"
            truncated = True
        duration = (time.perf_counter() - started) * 1000.0
        return ToolResult(call_id=call_id, name=name, ok=True, output=output, duration_ms=duration, truncated=truncated)

    def _invoke(self, spec: ToolSpec, args: Mapping[str, Any]) -> Any:
        fn = spec.func
        if self._is_async[spec.name]:
            if _loop_running():
                raise _AsyncToolInLoopError(
                    f"async tool {spec.name!r} was called synchronously inside a running event loop; "
                    "await ToolRegistry.acall (AsyncEngine.arun, Session.arun) instead"
                )
            coro = fn(**args)
            if spec.timeout is None:
                return asyncio.run(coro)
            return asyncio.run(_with_timeout(coro, spec.timeout))
        if spec.timeout is None:
            return fn(**args)
        workers = self._workers
        if workers is None:
            workers = self._workers = _DaemonWorkers()
            # Idle workers exit when the registry is dropped without close(), as a pool's would.
            self._release_workers = weakref.finalize(self, workers.close)
        return workers.run(fn, args, spec.timeout)

    def close(self) -> None:
        """Let the idle worker threads used for tools with a timeout exit (calls still running finish
        in the background). The registry stays usable; a later timed call starts new workers."""
        if self._release_workers is not None:
            self._release_workers()  # closes the workers, once
            self._release_workers = None
        self._workers = None


class _Job:
    __slots__ = ("done", "error", "fn", "kwargs", "result")

    def __init__(self, fn: Callable[..., object], kwargs: Mapping[str, object]) -> None:
        self.fn = fn
        self.kwargs = kwargs
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class _DaemonWorkers:
    """Daemon threads that run tool calls with a timeout.

    A thread cannot be killed, so a call that times out is reported and keeps its thread until it
    returns. Each call takes an idle thread or starts a new one, so abandoned calls never make later
    calls wait (as a fixed-size pool would once all its workers are stuck), and as daemons they never
    hold up interpreter exit. Up to ``max_idle`` finished threads are kept for reuse.
    """

    def __init__(self, max_idle: int = 4) -> None:
        self._idle: list[queue.SimpleQueue[_Job | None]] = []
        self._lock = threading.Lock()
        self._max_idle = max_idle
        self._closed = False

    def run(self, fn: Callable[..., object], kwargs: Mapping[str, object], timeout: float) -> Any:
        """Run ``fn(**kwargs)`` on a worker; raise TimeoutError if it has not returned in ``timeout`` s."""
        job = _Job(fn, kwargs)
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), name="qitos-tool", daemon=True).start()
        inbox.put(job)
        if not job.done.wait(timeout):
            raise concurrent.futures.TimeoutError()
        if job.error is not None:
            raise job.error
        return job.result

    def _serve(self, inbox: queue.SimpleQueue[_Job | None]) -> None:
        while True:
            job = inbox.get()
            if job is None:
                return
            try:
                job.result = job.fn(**job.kwargs)
            except BaseException as exc:  # handed to the caller, as a Future would
                job.error = exc
            with self._lock:  # idle again before signalling, so the caller's next call reuses this thread
                keep = not self._closed and len(self._idle) < self._max_idle
                if keep:
                    self._idle.append(inbox)
            job.done.set()
            del job
            if not keep:
                return

    def close(self) -> None:
        """Stop the idle threads; busy ones exit when their call returns."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for inbox in idle:
            inbox.put(None)


def _enum_converters(spec: ToolSpec) -> dict[str, Callable[[Any], Any]]:
    """Per parameter annotated with an Enum (or ``Enum | None``, ``list[Enum]``): turns its JSON value
    into members. Empty for most tools, which then pay nothing per call."""
    properties = spec.parameters.get("properties") or {}
    try:
        hints = typing.get_type_hints(spec.func)
    except Exception:
        return {}  # a callable without resolvable hints (e.g. a hand-built ToolSpec): values pass as given
    converters: dict[str, Callable[[Any], Any]] = {}
    for pname, hint in hints.items():
        if pname in properties:
            converter = _enum_converter(hint)
            if converter is not None:
                converters[pname] = converter
    return converters


def _enum_converter(hint: Any) -> Callable[[Any], Any] | None:
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        cls: type[enum.Enum] = hint
        by_value = {m.value: m for m in cls if isinstance(m.value, str | int | float)}

        def to_member(value: Any) -> Any:
            try:
                return by_value[value]
            except (KeyError, TypeError):  # a member, an unhashable or unknown value: the Enum decides
                return cls(value)

        return to_member
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Union or origin is types.UnionType:
        arms = [a for a in args if a is not type(None)]
        inner = _enum_converter(arms[0]) if len(arms) == 1 else None
        if inner is not None:
            return lambda value: None if value is None else inner(value)
        return None
    if origin is list and args:
        item = _enum_converter(args[0])
        if item is not None:
            return lambda value: [item(v) for v in value]
    return None


def _convert_arguments(args: Mapping[str, object], converters: Mapping[str, Callable[[Any], Any]]) -> dict[str, Any]:
    """A copy of validated ``args`` with Enum-annotated values converted; ValueError names the argument."""
    converted = dict(args)
    for pname, convert in converters.items():
        if pname in converted:
            try:
                converted[pname] = convert(converted[pname])
            except (ValueError, TypeError) as exc:
                raise ValueError(f"arguments.{pname}: {exc}") from exc
    return converted


class _AsyncToolInLoopError(RuntimeError):
    """An ``async def`` tool called through the sync path from inside a running event loop."""


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class _Bound:
    """``fn(**kwargs)`` as a zero-argument callable for an executor (keyword arguments kept as given)."""

    __slots__ = ("fn", "kwargs")

    def __init__(self, fn: Callable[..., object], kwargs: Mapping[str, object]) -> None:
        self.fn = fn
        self.kwargs = kwargs

    def __call__(self) -> Any:
        return self.fn(**self.kwargs)


class _StartFailed(Exception):
    """``CallStart.begin`` raised in the executor thread: the tool did not run (``acall`` re-raises
    ``error`` rather than reporting a tool failure)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class _Begun(_Bound):
    """``start.begin()`` then ``fn(**kwargs)``, in the thread that runs the call."""

    __slots__ = ("start",)

    def __init__(self, start: CallStart, fn: Callable[..., object], kwargs: Mapping[str, object]) -> None:
        super().__init__(fn, kwargs)
        self.start = start

    def __call__(self) -> Any:
        try:
            self.start.begin()
        except BaseException as exc:
            raise _StartFailed(exc) from exc
        return self.fn(**self.kwargs)


async def _with_timeout(coro: Any, timeout: float) -> Any:
    try:
        return await asyncio.wait_for(coro, timeout)
    except TimeoutError as exc:
        raise concurrent.futures.TimeoutError() from exc


def _failure(call_id: str, name: str, kind: ToolErrorKind, message: str, started: float | None = None) -> ToolResult:
    duration = (time.perf_counter() - started) * 1000.0 if started is not None else 0.0
    return ToolResult(call_id=call_id, name=name, ok=False, error=message, error_kind=kind, duration_ms=duration)


def _plain_text_values(args: Mapping[str, Any]) -> bool:
    """Whether every argument is ASCII text, a number, a bool or None (the common case, and then no
    argument can hold a lone surrogate; anything else is checked by ``check_text``)."""
    for value in args.values():
        kind = type(value)
        if kind is str:
            if not value.isascii():
                return False
        elif kind is not int and kind is not bool and kind is not float and value is not None:
            return False
    return True


def _jsonable(value: object) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    return repr(value)


def _to_text(value: object) -> str:
    try:
        return json.dumps(_jsonable(value), ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)
