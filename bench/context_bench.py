"""Context benchmark: RequestView build cost, per-step cost on a growing log, memdir retrieval.

Run: .venv/bin/python bench/context_bench.py [--quick]

Targets: build <= 2 ms at 10k exchanges with a budget that forces omission; per-step
request cost flat across a 5,000-step run (last 100 steps vs first 100); memdir retrieve of 10k
records <= 50 ms. The anchor measured side by side is the naive request builder that most
frameworks use: re-serialise and re-count the whole history on every request.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable

from qitos.core._exchange import ExchangeLog
from qitos.core.context import ContextBudget
from qitos.core.memory import MemoryRecord
from qitos.core.request_view import RequestView
from qitos.kit.context.compaction import ClosedExchangeWindowCompactor
from qitos.kit.memory.memdir_memory import MemdirMemory

SYSTEM = [{"role": "system", "content": "You are a careful assistant that keeps notes."}]
TOOLS = [{"name": "save_note", "description": "Save a note.", "parameters": {"type": "object", "properties": {}}}]
BUDGET = ContextBudget(max_input_units=24_000, reserved_output_units=4_000)
COMPACTOR = ClosedExchangeWindowCompactor()


def add_step(log: ExchangeLog, i: int) -> str:
    eid = log.open([{"role": "user", "content": f"step {i}: please file note {i} " + "lorem ipsum " * 8}]).exchange_id
    log.record_output(
        eid,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": f"call-{i}", "name": "save_note", "arguments": {"n": i}}],
        },
    )
    log.record_tool_result(eid, f"call-{i}", f"saved note {i}")
    log.close(eid)
    return eid


STEP_BUDGET = ContextBudget(max_input_units=6_000, reserved_output_units=1_000)


def build(log: ExchangeLog, budget: ContextBudget = BUDGET) -> RequestView:
    return RequestView.from_exchange_log(
        log, instructions=SYSTEM, tool_schemas=TOOLS, context_budget=budget, compaction_policy=COMPACTOR
    )


def naive_build(log: ExchangeLog) -> list[dict[str, object]]:
    """The anchor: turn the whole history into messages, serialise and count every one, trim."""
    messages = [m.to_dict() for e in log.exchanges for m in e.items]
    sizes = [len(json.dumps(m, sort_keys=True)) for m in messages]
    budget, kept, used = BUDGET.available_input_units, 0, 0
    for size in reversed(sizes):
        if used + size > budget:
            break
        used += size
        kept += 1
    return messages[len(messages) - kept :]


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median milliseconds of ``repeat`` calls."""
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def bench_build(sizes: list[int]) -> list[tuple[str, float, float, float, str]]:
    rows = []
    for n in sizes:
        log = ExchangeLog("bench")
        for i in range(n):
            add_step(log, i)
        start = time.perf_counter()
        view = build(log)  # first build counts every closed exchange once
        first = (time.perf_counter() - start) * 1000
        repeat = 200 if n <= 10_000 else 30
        warm = timed(lambda log=log: build(log), repeat)  # type: ignore[misc]
        naive = timed(lambda log=log: naive_build(log), 5 if n >= 100_000 else 20)  # type: ignore[misc]
        omitted = len(view.selection.omitted_exchange_ids)
        target = "<= 2 ms" if n == 10_000 else ""
        rows.append((f"{n:,} exchanges ({omitted:,} omitted)", first, warm, naive, target))
    return rows


def bench_steps(steps: int) -> tuple[float, float, float, float]:
    log = ExchangeLog("steps")
    build_ms: list[float] = []
    step_ms: list[float] = []
    for i in range(steps):
        t0 = time.perf_counter()
        eid = log.open([{"role": "user", "content": f"step {i}: note " + "lorem ipsum " * 8}]).exchange_id
        t1 = time.perf_counter()
        build(log, STEP_BUDGET)
        t2 = time.perf_counter()
        log.record_output(eid, {"role": "assistant", "tool_calls": [{"id": f"c{i}", "name": "save_note"}]})
        log.record_tool_result(eid, f"c{i}", "ok")
        log.close(eid)
        t3 = time.perf_counter()
        build_ms.append((t2 - t1) * 1000)
        step_ms.append((t3 - t0) * 1000)
    head, tail = slice(0, 100), slice(steps - 100, steps)
    return (
        statistics.median(build_ms[head]),
        statistics.median(build_ms[tail]),
        statistics.median(step_ms[head]),
        statistics.median(step_ms[tail]),
    )


def lstat_all(root: str) -> int:
    """The anchor for fresh retrieval: the cost of merely listing and lstat-ing every file."""
    count = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            os.lstat(os.path.join(folder, name))
            count += 1
    return count


def bench_memdir(records: int) -> dict[str, float]:
    """MemdirMemory at ``records`` records (segment files), beside the floor of the old layout."""
    with tempfile.TemporaryDirectory() as tmp:
        root = f"{tmp}/memory"
        memory = MemdirMemory(root, create=True)
        start = time.perf_counter()
        for i in range(records):
            memory.append(MemoryRecord("user", f"fact {i}: the value of key-{i} is {i * 7}", i, record_id=f"fact-{i}"))
        append_ms = (time.perf_counter() - start) * 1000 / records
        fresh = MemdirMemory(root)
        start = time.perf_counter()
        got = fresh.retrieve({"max_items": None})
        cold = (time.perf_counter() - start) * 1000
        assert len(got) == records
        warm_all = timed(lambda: fresh.retrieve({"max_items": None}), 10)
        warm_top = timed(lambda: fresh.retrieve({"contains": "key-99", "max_items": 20}), 10)
        writer = MemdirMemory(root)  # a second instance: on disk, the same as another process's append
        after_append = []
        for k in range(10):
            writer.append(MemoryRecord("user", f"external fact {k}", records + k, record_id=f"external-{k}"))
            start = time.perf_counter()
            got = fresh.retrieve({"max_items": None})
            after_append.append((time.perf_counter() - start) * 1000)
            assert got[-1].record_id == f"external-{k}" and len(got) == records + k + 1
        # The anchor: the floor of any fresh read of the earlier one-file-per-record layout.
        per_record = f"{tmp}/per-record/user"
        os.makedirs(per_record)
        for i in range(records):
            with open(f"{per_record}/r-{i:040x}.md", "w", encoding="utf-8") as handle:
                handle.write(f'---\nrecord_id: "fact-{i}"\n---\nfact {i}: the value of key-{i} is {i * 7}')
        floor = timed(lambda: lstat_all(f"{tmp}/per-record"), 10)
        return {
            "append_ms": append_ms,
            "cold": cold,
            "warm_all": warm_all,
            "warm_top": warm_top,
            "after_append": statistics.median(after_append),
            "floor": floor,
            "segment_floor": timed(lambda: lstat_all(root), 10),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    args = parser.parse_args()
    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    steps = 1_000 if args.quick else 5_000
    records = 2_000 if args.quick else 10_000

    print("RequestView build (budget 20,000 characters, closed-window compaction)")
    print(f"{'log':<36}{'first ms':>10}{'warm ms':>10}{'naive ms':>10}{'naive/warm':>12}  target")
    for label, first, warm, naive, target in bench_build(sizes):
        print(f"{label:<36}{first:>10.2f}{warm:>10.3f}{naive:>10.2f}{naive / warm:>11.0f}x  {target}")

    b_head, b_tail, s_head, s_tail = bench_steps(steps)
    print(f"\nGrowing log, {steps:,} steps, budget 5,000 characters (omission from step ~20 on)")
    print(f"{'  median ms':<40}{'first 100':>10}{'last 100':>11}{'last/first':>12}")
    print(f"{'  request build':<40}{b_head:>10.3f}{b_tail:>11.3f}{b_tail / b_head:>12.2f}  target: flat (<= ~1.5)")
    print(f"{'  whole step (log + build)':<40}{s_head:>10.3f}{s_tail:>11.3f}{s_tail / s_head:>12.2f}")

    memdir = bench_memdir(records)
    print(f"\nMemdirMemory, {records:,} records (one append-only segment file per type)")
    for label, value, unit, note in (
        ("append", memdir["append_ms"], "ms/record", "target < 0.5"),
        ("retrieve all, new instance", memdir["cold"], "ms", "target well under 100 (parses every block)"),
        ("retrieve all, warm fresh", memdir["warm_all"], "ms", "target <= 50 ms"),
        ("retrieve filtered top 20", memdir["warm_top"], "ms", "target <= 50 ms"),
        ("retrieve after 1 external append", memdir["after_append"], "ms", "(reads the file, parses the tail)"),
        ("anchor: os.walk + lstat, 1 file/record", memdir["floor"], "ms", "(floor of a fresh read, old layout)"),
        ("os.walk + lstat of the segments", memdir["segment_floor"], "ms", ""),
    ):
        print(f"  {label:<40}{value:9.2f} {unit:<10} {note}".rstrip())
    print(f"  anchor / warm fresh retrieve: {memdir['floor'] / memdir['warm_all']:.0f}x")


if __name__ == "__main__":
    main()
