"""@tool and ToolRegistry: schemas from hints and docstrings, validation, and failures as results."""

from __future__ import annotations

import asyncio
import enum
import gc
import threading
import time
from dataclasses import replace
from typing import Any, Literal

import pytest

from qitos import ToolRegistry, tool
from qitos.core._errors import ToolDefinitionError
from qitos.core._tool import ToolResult, ToolSpec, validate_arguments


class Mode(enum.Enum):
    QUICK = "quick"
    DEEP = "deep"


@tool(idempotent=True)
def search(query: str, limit: int = 5, mode: Mode = Mode.QUICK, tags: list[str] | None = None) -> list[str]:
    """Search the notes.

    Args:
        query: what to look for.
        limit: the most results to return.
            Counted after de-duplication.
        mode: how hard to look.
        tags: only notes with these tags.
    """
    return [f"{query}:{i}" for i in range(limit)]


def test_schema_comes_from_type_hints_and_the_docstring() -> None:
    registry = ToolRegistry([search])
    spec = registry.get("search")
    assert spec is not None
    assert spec.description == "Search the notes."
    params = spec.parameters
    assert params["required"] == ["query"]
    assert params["additionalProperties"] is False
    props = params["properties"]
    assert props["query"] == {"type": "string", "description": "what to look for."}
    assert props["limit"]["type"] == "integer" and props["limit"]["default"] == 5
    assert props["limit"]["description"] == "the most results to return. Counted after de-duplication."
    assert props["mode"]["enum"] == ["quick", "deep"]
    assert props["tags"]["anyOf"] == [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]
    assert spec.idempotent is True and spec.needs_approval is False
    assert registry.schemas() == [{"name": "search", "description": "Search the notes.", "parameters": params}]


def test_decorated_function_stays_callable() -> None:
    assert search("x", limit=2) == ["x:0", "x:1"]


def test_tool_options_are_declared_on_the_spec() -> None:
    @tool(name="danger", timeout=3.0, needs_approval=True, max_output_chars=10, description="Risky.")
    def risky(path: str) -> str:
        return path

    spec = ToolRegistry([risky]).get("danger")
    assert spec is not None
    assert (spec.timeout, spec.needs_approval, spec.max_output_chars, spec.description) == (3.0, True, 10, "Risky.")


def test_literal_and_dict_hints_become_schemas() -> None:
    def pick(kind: Literal["a", "b"], weights: dict[str, float]) -> str:
        return kind

    props = ToolRegistry([pick]).get("pick").parameters["properties"]  # type: ignore[union-attr]
    assert props["kind"] == {"enum": ["a", "b"]}
    assert props["weights"] == {"type": "object", "additionalProperties": {"type": "number"}}


def test_an_unsupported_parameter_type_is_a_definition_error_naming_it() -> None:
    def bad(handle: threading.Lock) -> None:
        return None

    with pytest.raises(ToolDefinitionError, match="'handle'"):
        ToolRegistry([bad])


def test_duplicate_and_invalid_names_are_rejected() -> None:
    registry = ToolRegistry([search])
    with pytest.raises(ToolDefinitionError, match="already registered"):
        registry.register(search)
    with pytest.raises(ToolDefinitionError, match="invalid tool name"):
        registry.register(search, name="has space")


def test_a_non_positive_timeout_is_a_definition_error() -> None:
    with pytest.raises(ToolDefinitionError, match="timeout"):

        @tool(timeout=0)
        def never() -> None:
            return None


def test_include_registers_marked_methods_bound_to_their_object() -> None:
    class Notes:
        def __init__(self) -> None:
            self.items = ["a", "b"]

        @tool
        def count(self) -> int:
            """How many notes."""
            return len(self.items)

        def helper(self) -> None:
            return None

    registry = ToolRegistry()
    registry.include(Notes())
    assert registry.names() == ["count"]
    assert registry.call("count", {}).output == 2


# --------------------------------------------------------------------------- failures become results


def test_unknown_tool_is_a_result_listing_the_available_tools() -> None:
    result = ToolRegistry([search]).call("serch", {"query": "x"}, call_id="c1")
    assert (result.ok, result.error_kind, result.call_id) == (False, "unknown_tool", "c1")
    assert "'serch'" in (result.error or "") and "search" in (result.error or "")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({}, "missing required argument 'query'"),
        ({"query": "x", "colour": 1}, "unexpected argument 'colour'"),
        ({"query": 3}, "arguments.query: expected string"),
        ({"query": "x", "limit": "5"}, "arguments.limit: expected integer"),
        ({"query": "x", "limit": True}, "arguments.limit: expected integer"),
        ({"query": "x", "mode": "slow"}, "arguments.mode"),
        ({"query": "x", "tags": ["a", 2]}, "arguments.tags"),
        ("query=x", "arguments must be an object"),
    ],
)
def test_invalid_arguments_are_a_result_that_says_what_is_wrong(args: Any, expected: str) -> None:
    result = ToolRegistry([search]).call("search", args)
    assert result.ok is False and result.error_kind == "invalid_arguments"
    assert expected in (result.error or "")


def test_validate_arguments_returns_every_problem() -> None:
    schema = ToolRegistry([search]).get("search").parameters  # type: ignore[union-attr]
    problems = validate_arguments(schema, {"limit": "x", "extra": 1})
    assert len(problems) == 3


def test_a_raising_tool_is_a_result_with_the_exception() -> None:
    def explode(n: int) -> int:
        raise KeyError(f"no item {n}")

    result = ToolRegistry([explode]).call("explode", {"n": 4})
    assert result.ok is False and result.error_kind == "tool_error"
    assert result.error == "KeyError: 'no item 4'"
    assert result.as_text().startswith("ERROR (tool_error)")


def test_a_slow_tool_times_out_as_a_result() -> None:
    release = threading.Event()

    @tool(timeout=0.2)
    def slow() -> str:
        release.wait(2.0)
        return "late"

    registry = ToolRegistry([slow])
    started = time.perf_counter()
    result = registry.call("slow", {})
    elapsed = time.perf_counter() - started
    release.set()
    registry.close()
    assert result.ok is False and result.error_kind == "timeout"
    assert "0.2" in (result.error or "")
    assert elapsed < 1.0


def test_abandoned_timed_out_calls_do_not_make_later_calls_time_out() -> None:
    release = threading.Event()
    ran: list[str] = []

    @tool(timeout=0.1)
    def hang() -> str:
        """Never returns in time."""
        release.wait(3.0)
        return "late"

    @tool(timeout=0.5)
    def fast() -> str:
        """Returns at once."""
        ran.append("fast")
        return "fast"

    registry = ToolRegistry([hang, fast])
    try:
        assert [registry.call("hang", {}).error_kind for _ in range(5)] == ["timeout"] * 5
        result = registry.call("fast", {})
        assert (result.ok, result.output, result.error) == (True, "fast", None)
        assert ran == ["fast"]
    finally:
        release.set()
        registry.close()


def _thread_reporting_registry(seen: list[threading.Thread]) -> ToolRegistry:
    """A registry with one timed tool, ``where``, that appends the thread it runs on to ``seen``."""

    @tool(timeout=1.0)
    def where() -> str:
        """Reports its thread."""
        seen.append(threading.current_thread())
        return "here"

    return ToolRegistry([where])


def test_timed_calls_run_on_reused_daemon_threads() -> None:
    seen: list[threading.Thread] = []
    registry = _thread_reporting_registry(seen)
    try:
        assert all(registry.call("where", {}).output == "here" for _ in range(20))
    finally:
        registry.close()
    assert all(t.daemon for t in seen)  # an abandoned call never holds up interpreter exit
    assert len(set(seen)) <= 2  # sequential calls reuse an idle thread instead of starting one each


def test_idle_worker_threads_exit_when_the_registry_is_dropped() -> None:
    seen: list[threading.Thread] = []
    registry = _thread_reporting_registry(seen)
    assert registry.call("where", {}).ok
    del registry
    gc.collect()
    seen[0].join(timeout=2.0)
    assert not seen[0].is_alive()


def test_a_timed_tool_that_raises_is_a_tool_error_result() -> None:
    @tool(timeout=1.0)
    def broken() -> str:
        """Fails."""
        raise ValueError("bad input file")

    registry = ToolRegistry([broken])
    result = registry.call("broken", {})
    registry.close()
    assert (result.ok, result.error_kind, result.error) == (False, "tool_error", "ValueError: bad input file")


def test_an_async_tool_runs_and_times_out() -> None:
    @tool(timeout=0.2)
    async def nap(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "awake"

    registry = ToolRegistry([nap])
    assert registry.call("nap", {"seconds": 0.0}).output == "awake"
    result = registry.call("nap", {"seconds": 2.0})
    assert result.error_kind == "timeout"


def test_output_over_the_cap_is_truncated_and_marked() -> None:
    @tool(max_output_chars=10)
    def big() -> str:
        return "x" * 25

    result = ToolRegistry([big]).call("big", {})
    assert result.ok and result.truncated
    assert result.output.startswith("x" * 10) and "truncated 15 of 25" in result.output
    assert "x" * 11 not in result.output


def test_output_under_the_cap_is_untouched() -> None:
    @tool(max_output_chars=10)
    def small() -> str:
        return "short"

    result = ToolRegistry([small]).call("small", {})
    assert result.output == "short" and not result.truncated


def test_tool_result_round_trips_through_its_dict_form() -> None:
    result = ToolResult(call_id="c", name="n", ok=False, error="e", error_kind="timeout", duration_ms=1.5)
    assert ToolResult.from_dict(result.to_dict()) == result


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


def test_enum_annotated_parameters_receive_enum_members() -> None:
    received: dict[str, Any] = {}

    @tool
    def pick(mode: Mode, level: Level | None = None, modes: list[Mode] | None = None, note: str = "") -> str:
        """Records what it was given."""
        received.update(mode=mode, level=level, modes=modes, note=note)
        return "ok"

    registry = ToolRegistry([pick])
    args = {"mode": "deep", "level": 2, "modes": ["quick", "deep"], "note": "n"}
    assert registry.call("pick", args).ok
    assert received == {"mode": Mode.DEEP, "level": Level.HIGH, "modes": [Mode.QUICK, Mode.DEEP], "note": "n"}
    assert type(received["mode"]) is Mode and type(received["level"]) is Level
    assert args == {"mode": "deep", "level": 2, "modes": ["quick", "deep"], "note": "n"}  # the caller's args are kept
    assert registry.call("pick", {"mode": "quick", "level": None}).ok
    assert received["mode"] is Mode.QUICK and received["level"] is None and received["modes"] is None


def test_a_value_outside_the_enum_is_invalid_arguments_naming_the_parameter() -> None:
    registry = ToolRegistry([search])
    result = registry.call("search", {"query": "q", "mode": "slow"})
    assert result.ok is False and result.error_kind == "invalid_arguments"
    assert "arguments.mode" in (result.error or "") and "'slow'" in (result.error or "")


def test_an_enum_parameter_with_a_hand_written_schema_still_rejects_unknown_values() -> None:
    def run(mode: Mode) -> str:
        return mode.value

    spec = ToolSpec(
        name="run", description="d", parameters={"type": "object", "properties": {"mode": {"type": "string"}}}, func=run
    )
    registry = ToolRegistry([spec])
    assert registry.call("run", {"mode": "deep"}).output == "deep"
    result = registry.call("run", {"mode": "fast"})
    assert result.error_kind == "invalid_arguments"
    assert result.error == "arguments.mode: 'fast' is not a valid Mode"


# --------------------------------------------------------------------------- bad output and arguments


def test_the_output_cap_applies_to_the_text_form_of_any_output() -> None:
    @tool(max_output_chars=1000)
    def many() -> list[str]:
        """A long list."""
        return ["a" * 100] * 50_000

    @tool(max_output_chars=1000)
    def small() -> dict[str, int]:
        """A short dict."""
        return {"n": 1}

    registry = ToolRegistry([many, small])
    result = registry.call("many", {})
    assert result.ok and result.truncated and isinstance(result.output, str)
    assert result.output.startswith('["aaaa') and len(result.output) < 1100
    assert result.output.endswith("[truncated 5199000 of 5200000 characters]")  # 50,000 x len('"a...", ')
    assert registry.call("small", {}).output == {"n": 1}  # under the cap: kept as it was returned


def test_an_output_that_is_not_valid_text_becomes_a_tool_error() -> None:
    @tool
    def broken() -> str:
        """A lone surrogate."""
        return "ok \ud800 then"

    @tool
    def nested() -> dict[str, Any]:
        """A surrogate inside structured output."""
        return {"rows": ["fine", "bad\udc80"]}

    @tool
    def cyclic() -> list[Any]:
        """A list that contains itself."""
        loop: list[Any] = []
        loop.append(loop)
        return loop

    registry = ToolRegistry([broken, nested, cyclic])
    for name in ("broken", "nested"):
        result = registry.call(name, {})
        assert not result.ok and result.error_kind == "tool_error"
        assert "lone surrogate" in (result.error or "") and "valid text" in (result.error or "")
        (result.error or "").encode("utf-8")  # the message itself is valid text
    result = registry.call("cyclic", {})
    assert not result.ok and result.error_kind == "tool_error" and "cyclic" in (result.error or "")


def test_arguments_holding_a_lone_surrogate_are_invalid_and_the_tool_does_not_run() -> None:
    ran: list[str] = []

    @tool
    def echo(text: str, tags: list[str] | None = None) -> str:
        """Echo.

        Args:
            text: the text.
            tags: labels.
        """
        ran.append(text)
        return text

    registry = ToolRegistry([echo])
    result = registry.call("echo", {"text": "a\ud800"})
    assert result.error_kind == "invalid_arguments" and "arguments['text']" in (result.error or "")
    result = registry.call("echo", {"text": "fine", "tags": ["x", "\udfff"]})
    assert result.error_kind == "invalid_arguments" and "arguments['tags'][1]" in (result.error or "")
    assert ran == [] and registry.call("echo", {"text": "ünïcode"}).output == "ünïcode"


def test_tool_methods_of_two_instances_are_bound_to_their_own_instance() -> None:
    """A method's spec is derived once per function; each registry still calls its own object."""

    class Counter:
        def __init__(self, name: str) -> None:
            self.name = name

        @tool(idempotent=True)
        def whoami(self, suffix: str) -> str:
            """Say which counter this is.

            Args:
                suffix: appended to the name.
            """
            return self.name + suffix

    first, second = ToolRegistry(), ToolRegistry()
    first.include(Counter("a"))
    second.include(Counter("b"))
    assert first.call("whoami", {"suffix": "!"}, call_id="c1").output == "a!"
    assert second.call("whoami", {"suffix": "?"}, call_id="c2").output == "b?"
    spec = second.get("whoami")
    assert spec is not None and spec.idempotent and spec.parameters["properties"]["suffix"]["description"]


def test_a_method_registered_with_another_schema_is_checked_against_that_schema() -> None:
    """What registering a method compiles is reused only for the very schema it came from."""

    class Box:
        @tool
        def put(self, size: int) -> str:
            """Put something in.

            Args:
                size: how big.
            """
            return f"put {size}"

    plain = ToolRegistry()
    plain.include(Box())
    spec = plain.get("put")
    assert spec is not None
    strict = replace(spec, parameters={**spec.parameters, "properties": {"size": {"type": "integer", "enum": [1, 2]}}})
    custom = ToolRegistry([strict])
    again = ToolRegistry()
    again.include(Box())
    assert custom.call("put", {"size": 3}).error_kind == "invalid_arguments"
    assert again.call("put", {"size": 3}).output == "put 3" and plain.call("put", {"size": "x"}).ok is False
