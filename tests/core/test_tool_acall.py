"""``ToolRegistry.acall`` makes exactly the checks ``call`` makes: arguments, output cap,
output text form; an ``async def`` tool gets its schema like a sync one."""

from __future__ import annotations

import asyncio
import concurrent.futures

from qitos.core._tool import ToolRegistry, tool


@tool(max_output_chars=5)
async def chatty(n: int) -> str:
    """Says too much.

    Args:
        n: how many times.
    """
    return "0123456789" * n


@tool
def broken_text() -> str:
    """Returns a lone surrogate."""
    return "bad \ud800 text"


def test_an_async_tool_has_a_schema_from_hints_and_docstring() -> None:
    spec = ToolRegistry([chatty]).get("chatty")
    assert spec is not None
    assert spec.description == "Says too much."
    assert spec.parameters["properties"] == {"n": {"type": "integer", "description": "how many times."}}


def test_acall_and_call_give_the_same_results_for_the_same_calls() -> None:
    registry = ToolRegistry([chatty, broken_text])
    calls = [
        ("chatty", {"n": 2}),
        ("chatty", {"n": "two"}),
        ("chatty", {"n": 1, "extra": True}),
        ("nope", {}),
        ("broken_text", {}),
        ("chatty", {"n": "\ud800"}),
    ]
    with concurrent.futures.ThreadPoolExecutor(2) as executor:

        async def main() -> list[tuple[object, ...]]:
            out: list[tuple[object, ...]] = []
            for name, args in calls:
                r = await registry.acall(name, args, call_id="c", executor=executor)
                out.append((r.ok, r.error_kind, r.output, r.truncated, r.error))
            return out

        awaited = asyncio.run(main())
    synced = []
    for name, args in calls:
        r = registry.call(name, args, call_id="c")
        synced.append((r.ok, r.error_kind, r.output, r.truncated, r.error))
    assert awaited == synced
    assert awaited[0][:2] == (True, None) and awaited[0][3] is True  # capped
    assert [a[1] for a in awaited[1:]] == [
        "invalid_arguments",
        "invalid_arguments",
        "unknown_tool",
        "tool_error",
        "invalid_arguments",
    ]
