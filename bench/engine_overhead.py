"""Engine overhead: the cost of one agent step in the qitos Engine vs a LangGraph 1.2 StateGraph.

Run: .venv/bin/python bench/engine_overhead.py [--steps 1000] [--rounds 5] [--no-langgraph] [--otel]

Both sides do the same work per step, in-process, with no trace and no store/checkpointer:
a scripted decide (one call of a no-op tool), the tool call, and a reduce that appends a 16-byte
string to a list in the state.

- qitos: an ``AgentModule`` run by ``Engine.run`` (decide hook -> ToolRegistry -> reduce; the state
  stops itself at ``max_steps = N``).
- LangGraph ``langgraph==1.2.24``: a 2-node ``StateGraph`` (decide -> act -> decide ... -> END) with
  no checkpointer; the list channel uses the usual ``operator.add`` reducer (LangGraph requires
  reducers to return a new value; an in-place append double-counts). Copying a list of 1,000
  pointers costs about 1-2 us per step at the end, small next to the anchor's step. It runs in
  a separate venv, ``bench/.venvs/langgraph``, that this script creates with ``python3 -m venv`` and
  fills with pip on first use; the LangGraph side is a subprocess of that venv printing JSON.

Per-step timing is taken by the decide function itself: one ``time.perf_counter()`` appended to a
preallocated-size list per step (about 0.1 us, the same on both sides), so the cost of the 100
steps after step 0 can be compared with the cost of the last 100 steps without adding a hook.
``us/step`` is the wall time of the whole ``run``/``invoke`` divided by N (setup included).
Rounds interleave qitos and LangGraph so a change in machine load hits both; medians are reported.
The garbage collector stays on (its cost is part of a step) and each timed run starts after a
``gc.collect()``, on both sides.

``--otel`` adds a third line in each round: the same qitos run with OpenTelemetry on
(``Engine(otel=provider)``, an SDK ``TracerProvider`` with a ``SimpleSpanProcessor`` into an
``InMemorySpanExporter``, cleared after each run): the cost of a step span plus a tool span per step.
The plain qitos line is the disabled path (no tracer provider), which must not change.

Targets: qitos <= 25 us/step; >= 10x less than LangGraph; qitos last 100 steps within
1.5x of the first 100.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qitos import Action, AgentModule, Decision, Engine, StateSchema, ToolRegistry, tool

LANGGRAPH_VERSION = "1.2.24"
HERE = Path(__file__).resolve().parent
LG_VENV = HERE / ".venvs" / "langgraph"
PAYLOAD = "0123456789abcdef"  # 16 bytes
TARGET_US = 25.0
TARGET_RATIO = 10.0
TARGET_FLAT = 1.5
IDLE_ANCHOR_US = 270.0  # LangGraph per-step cost measured on this machine when idle

# --------------------------------------------------------------------------- qitos side


@dataclass
class BenchState(StateSchema):
    items: list[str] = field(default_factory=list)


@tool
def noop() -> str:
    """Do nothing."""
    return "ok"


class BenchAgent(AgentModule[BenchState, Any, Any]):
    """Scripted decide -> one no-op tool -> reduce appending 16 bytes."""

    def __init__(self, steps: int) -> None:
        super().__init__(tool_registry=ToolRegistry([noop]))
        self.steps = steps
        self.stamps: list[float] = []

    def init_state(self, task: str, **kwargs: Any) -> BenchState:
        return BenchState(task=task, max_steps=self.steps)

    def decide(self, state: BenchState, observation: Any) -> Decision[Any]:
        self.stamps.append(time.perf_counter())
        return Decision.act([Action("noop", {})])

    def reduce(self, state: BenchState, observation: Any, decision: Decision[Any]) -> BenchState:
        state.items.append(PAYLOAD)
        return state


def qitos_once(steps: int, otel: Any = None) -> dict[str, float]:
    """One timed qitos run of ``steps`` steps (with OpenTelemetry spans to ``otel`` when given)."""
    agent = BenchAgent(steps)
    engine = Engine(agent, otel=otel)
    gc.collect()  # every timed run starts from the same collector state (both sides do this)
    cpu_started, started = time.process_time(), time.perf_counter()
    result = engine.run("bench")
    total, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    if result.step_count != steps or len(result.state.items) != steps:
        raise SystemExit(f"qitos run did {result.step_count} steps ({result.state.stop_reason}); expected {steps}")
    return _summary(total, cpu, agent.stamps, steps)


def otel_provider() -> tuple[Any, Any]:
    """A TracerProvider exporting synchronously into memory, and its exporter (needs qitos[otel])."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def qitos_otel_once(steps: int, provider: Any, exporter: Any) -> dict[str, float]:
    """One timed qitos run with spans; checks the span count (run + a step and a tool span per step)."""
    exporter.clear()
    row = qitos_once(steps, otel=provider)
    spans = len(exporter.get_finished_spans())
    if spans != 1 + 2 * steps:
        raise SystemExit(f"the traced qitos run made {spans} spans; expected {1 + 2 * steps}")
    exporter.clear()
    return row


def _summary(total: float, cpu: float, stamps: list[float], steps: int) -> dict[str, float]:
    window = min(100, max(1, (len(stamps) - 1) // 2))
    first = stamps[window] - stamps[0]
    last = stamps[-1] - stamps[-1 - window]
    return {
        "us_per_step": total / steps * 1e6,
        "cpu_us_per_step": cpu / steps * 1e6,
        "first_us": first / window * 1e6,
        "last_us": last / window * 1e6,
    }


# --------------------------------------------------------------------------- LangGraph side

LANGGRAPH_CHILD = r"""
import gc, json, operator, sys, time
from typing import Annotated, Any, TypedDict
import importlib.metadata
from langgraph.graph import END, START, StateGraph

PAYLOAD = "0123456789abcdef"
steps, runs = int(sys.argv[1]), int(sys.argv[2])


class State(TypedDict):
    items: Annotated[list, operator.add]
    pending: list


def noop() -> str:
    return "ok"


TOOLS = {"noop": noop}
stamps: list = []


def decide(state: State) -> dict:
    stamps.append(time.perf_counter())
    return {"pending": [{"name": "noop", "args": {}}]}


def act(state: State) -> dict:
    for call in state["pending"]:
        TOOLS[call["name"]](**call["args"])
    return {"items": [PAYLOAD]}


def route(state: State) -> str:
    return END if len(state["items"]) >= steps else "decide"


graph = StateGraph(State)
graph.add_node("decide", decide)
graph.add_node("act", act)
graph.add_edge(START, "decide")
graph.add_edge("decide", "act")
graph.add_conditional_edges("act", route, ["decide", END])
app = graph.compile()

out = []
for i in range(runs + 1):  # the first run warms up
    stamps.clear()
    gc.collect()
    cpu_started, started = time.process_time(), time.perf_counter()
    final = app.invoke({"items": [], "pending": []}, {"recursion_limit": 2 * steps + 10})
    total, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    assert len(final["items"]) == steps, len(final["items"])
    if i:
        out.append({"total": total, "cpu": cpu, "stamps": stamps})
print(json.dumps({"version": importlib.metadata.version("langgraph"), "runs": out}))
"""


def langgraph_python() -> Path:
    """The anchor venv's python, creating the venv and installing LangGraph when missing."""
    python = LG_VENV / "bin" / "python"
    check = [
        str(python),
        "-c",
        f"import importlib.metadata as m; assert m.version('langgraph') == '{LANGGRAPH_VERSION}'",
    ]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    base = shutil.which("python3") or sys.executable
    print(f"setting up {LG_VENV} (python3 -m venv; pip install langgraph=={LANGGRAPH_VERSION}) ...", flush=True)
    subprocess.run([base, "-m", "venv", str(LG_VENV)], check=True)
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            f"langgraph=={LANGGRAPH_VERSION}",
        ],
        check=True,
    )
    subprocess.run(check, check=True)
    return python


def langgraph_once(python: Path, steps: int) -> tuple[str, dict[str, float]]:
    """One timed LangGraph run (after a warm-up run) in the anchor venv."""
    proc = subprocess.run(
        [str(python), "-c", LANGGRAPH_CHILD, str(steps), "1"], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"LangGraph child failed:\n{proc.stderr[-2000:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    run = data["runs"][0]
    return str(data["version"]), _summary(run["total"], run["cpu"], run["stamps"], steps)


# --------------------------------------------------------------------------- report


def _median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="agent steps per run (default 1000)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds, each one qitos + one LangGraph run")
    parser.add_argument("--no-langgraph", action="store_true", help="measure qitos only (no anchor)")
    parser.add_argument("--otel", action="store_true", help="also time qitos with OpenTelemetry spans (in memory)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args()
    if args.steps < 3:
        parser.error("--steps must be >= 3")

    load_before = _load()
    python = None if args.no_langgraph else langgraph_python()
    qitos_once(args.steps)  # warm up imports and caches
    otel = otel_provider() if args.otel else None
    if otel is not None:
        qitos_otel_once(args.steps, *otel)
    q_rows: list[dict[str, float]] = []
    otel_rows: list[dict[str, float]] = []
    lg_rows: list[dict[str, float]] = []
    lg_version = LANGGRAPH_VERSION
    for _ in range(args.rounds):
        q_rows.append(qitos_once(args.steps))
        if otel is not None:
            otel_rows.append(qitos_otel_once(args.steps, *otel))
        if python is not None:
            lg_version, row = langgraph_once(python, args.steps)
            lg_rows.append(row)
    load_after = _load()

    q_us = _median(q_rows, "us_per_step")
    q_flat = statistics.median(r["last_us"] / r["first_us"] for r in q_rows)
    print(f"engine overhead: {args.steps} steps/run, {args.rounds} rounds, {os.cpu_count()} CPUs")
    print(f"load average (1/5/15 min): before {load_before}, after {load_after}")
    print()
    print(f"{'':<20}{'us/step':>9}{'min':>8}{'max':>8}{'cpu us':>8}{'first100':>10}{'last100':>9}{'last/first':>11}")
    lines = [("qitos Engine", q_rows)]
    if otel_rows:
        lines.append(("qitos Engine +otel", otel_rows))
    if lg_rows:
        lines.append((f"LangGraph {lg_version}", lg_rows))
    for name, rows in lines:
        us = [r["us_per_step"] for r in rows]
        flat = statistics.median(r["last_us"] / r["first_us"] for r in rows)
        print(
            f"{name:<20}{statistics.median(us):>9.1f}{min(us):>8.1f}{max(us):>8.1f}"
            f"{_median(rows, 'cpu_us_per_step'):>8.1f}"
            f"{_median(rows, 'first_us'):>10.1f}{_median(rows, 'last_us'):>9.1f}{flat:>10.2f}x"
        )
    print("us/step: wall time of a run / N (median, min, max over rounds); cpu us: process CPU time / N;")
    print("first100/last100: wall us per step over the 100 steps after step 0 / over the last 100 steps")
    print()
    results: dict[str, Any] = {
        "steps": args.steps,
        "rounds": args.rounds,
        "load_before": load_before,
        "load_after": load_after,
        "qitos": q_rows,
        "qitos_otel": otel_rows,
        "langgraph": lg_rows,
    }
    checks = [(f"qitos <= {TARGET_US:g} us/step", q_us <= TARGET_US, f"{q_us:.1f} us")]
    if otel_rows:
        otel_us = _median(otel_rows, "us_per_step")
        print(f"OpenTelemetry on: +{otel_us - q_us:.1f} us/step ({otel_us / q_us:.2f}x the disabled path)")
        results["otel_extra_us"] = otel_us - q_us
    if lg_rows:
        lg_us = _median(lg_rows, "us_per_step")
        ratio = lg_us / q_us
        print(f"ratio LangGraph / qitos: {ratio:.1f}x")
        print(
            f"(estimate only: at the anchor's idle-machine {IDLE_ANCHOR_US:g} us/step, this ratio "
            f"puts qitos at ~{IDLE_ANCHOR_US / ratio:.1f} us/step)"
        )
        checks.append((f">= {TARGET_RATIO:g}x less than LangGraph", ratio >= TARGET_RATIO, f"{ratio:.1f}x"))
        results["ratio"] = ratio
    checks.append((f"qitos last 100 within {TARGET_FLAT:g}x of first 100", q_flat <= TARGET_FLAT, f"{q_flat:.2f}x"))
    print("targets:")
    for label, ok, value in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {label:<42} ({value})")
    if args.json:
        results["checks"] = [{"target": label, "pass": ok, "value": value} for label, ok, value in checks]
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
