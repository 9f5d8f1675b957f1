"""Replay evaluation: re-running an eval from its recorded replies, against a live run and inspect_ai's cache.

Run: .venv/bin/python bench/eval_replay.py [--samples 200] [--rounds 1] [--no-inspect] [--json OUT]

The model is ``bench/eval_server.py`` (its own process, answers after 200 ms, counts every request):
the same 3-turn script per sample as ``bench/eval.py`` (a ``lookup`` call, an ``add`` call, then the
answer), with all samples in flight. The agent has a two-line system prompt, ``PROMPT``.

1. Replay. A live qitos eval of N samples (durable, SQLite) against the server, then the same eval
   again with ``evaluate(..., replay=<the live eval>)``: the server counts the replay's model calls
   (target: 0) and the wall times are compared (target: the replay at least 10x faster).
2. A changed system prompt (``CHANGED``: its second line reworded). inspect_ai 0.3.x (in
   ``bench/.venvs/inspect``, as ``bench/eval.py`` makes it) runs the task with its model cache on
   (``generate(cache=True)``) with ``PROMPT``, again unchanged (its cache answers), then with
   ``CHANGED``: the server counts its calls. qitos runs ``CHANGED`` with ``replay=<the live eval>,
   on_divergence="mark"`` (target: 0 calls, and every sample reports its divergence at its first
   model request, step 0, naming the system prompt), and with ``cache=True`` only, qitos's own
   response cache, which misses like inspect's (keyed by the whole request).

Each run is a fresh process; the numbers are wall and CPU seconds around the eval call inside it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROMPT = "You answer with one word.\nUse lookup, then add, then give the word in upper case."
CHANGED = "You answer with one word.\nCall lookup, then add, then give the word in upper case."


def _eval_bench() -> Any:
    """``bench/eval.py`` (its server process, child runner and inspect_ai venv), loaded by path."""
    spec = importlib.util.spec_from_file_location("qitos_eval_bench", HERE / "eval.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while they are made
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- the qitos side (a child)


def qitos_child(n: int, base_url: str, db: str, name: str, prompt: str, replay: str, on_divergence: str) -> None:
    """One qitos eval of N samples; prints one JSON line (a child process of this script)."""
    from dataclasses import dataclass as _dataclass

    from qitos import AgentModule, Decision, StateSchema, tool
    from qitos.eval import Dataset, Sample, evaluate, scorers
    from qitos.models import OpenAICompatibleModel

    @tool(idempotent=True)
    def lookup(word: str) -> str:
        """Look a word up.

        Args:
            word: the word.
        """
        return f"{word}:{len(word)}"

    @tool()
    def add(a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: first.
            b: second.
        """
        return a + b

    @_dataclass
    class BenchState(StateSchema):
        pass

    class BenchAgent(AgentModule[BenchState, Any, Any]):
        tools = (lookup, add)

        def init_state(self, task: str, **kwargs: Any) -> BenchState:
            return BenchState(task=task, max_steps=6)

        def build_system_prompt(self, state: BenchState) -> str | None:
            return {"prompt": PROMPT, "changed": CHANGED}[prompt]

        def prepare(self, state: BenchState) -> str:
            return str(state.task)

        def reduce(self, state: BenchState, observation: Any, decision: Decision[Any]) -> BenchState:
            return state

    data = Dataset([Sample(f"Answer with the word w{i}", f"W{i}", id=f"s{i}") for i in range(n)], name="bench")
    model = OpenAICompatibleModel("m", base_url=base_url, api_key="sk-bench", max_retries=0, max_input_units=100_000)
    options: dict[str, Any] = {}
    if replay == "cache":
        options["cache"] = True
    elif replay != "-":
        options.update(replay=replay, on_divergence=on_divergence)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    report = evaluate(
        BenchAgent, data, scorers=[scorers.exact()], model=model, store=db, name=name, max_samples=n, **options
    )
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    divergences = [s.divergence for s in report.samples if s.divergence is not None]
    print(
        json.dumps(
            {
                "wall": wall,
                "cpu": cpu,
                "status": report.status,
                "samples": len(report.samples),
                "accuracy": report.metrics["exact"]["mean"],
                "diverged": len(divergences),
                "divergence_steps": sorted({d.get("step") for d in divergences}, key=str),
                "divergence_parts": dict(Counter(",".join(sorted(d.get("diff") or {})) for d in divergences)),
                "errors": dict(Counter((s.error or "")[:120] for s in report.samples if s.error)),
            }
        )
    )


# --------------------------------------------------------------------------- the orchestrator


def _qitos(bench: Any, server: Any, n: int, db: Path, name: str, prompt: str, replay: str, on: str) -> dict[str, Any]:
    server.stats(reset=True)
    args = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        str(n),
        server.url,
        str(db),
        name,
        prompt,
        replay,
        on,
    ]
    data, _, process_cpu, rss = bench._spawn(args)
    data.update(calls=server.stats(reset=True)["calls"], process_cpu=process_cpu, rss_mb=rss)
    return dict(data)


def _inspect(bench: Any, server: Any, n: int, work: Path, tag: str, prompt: str, cache: Path) -> dict[str, Any]:
    server.stats(reset=True)
    python = bench.INSPECT_VENV / "bin" / "python"
    args = [
        str(python),
        str(HERE / "eval_replay_inspect_child.py"),
        str(n),
        server.url,
        str(work / tag),
        prompt,
        str(cache),
    ]
    data, _, process_cpu, rss = bench._spawn(args)
    data.update(calls=server.stats(reset=True)["calls"], process_cpu=process_cpu, rss_mb=rss)
    return dict(data)


def _line(label: str, run: dict[str, Any]) -> str:
    extra = ""
    if run.get("diverged"):
        extra = f"  diverged {run['diverged']} at steps {run['divergence_steps']} ({run['divergence_parts']})"
    if run.get("errors"):
        extra += f"  errors {run['errors']}"
    return (
        f"  {label:44} wall {run['wall']:6.2f}s  cpu {run['cpu']:6.2f}s  model calls {run['calls']:4}  "
        f"accuracy {run['accuracy']}{extra}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--no-inspect", action="store_true")
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--child", nargs=7, metavar=("N", "URL", "DB", "NAME", "PROMPT", "REPLAY", "ON"))
    args = parser.parse_args()
    if args.child:
        n, url, db, name, prompt, replay, on = args.child
        qitos_child(int(n), url, db, name, prompt, replay, on)
        return
    bench = _eval_bench()
    n = args.samples
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {n} samples x 3 turns x 200 ms")
    if not args.no_inspect:
        print(f"inspect_ai {bench.ensure_inspect()} in {bench.INSPECT_VENV}")
    work = Path(tempfile.mkdtemp(prefix="qitos-eval-replay-bench-"))
    server = bench.Server(bench.DELAY)
    result: dict[str, Any] = {"replay": [], "changed_prompt": []}
    try:
        print("\n1. replay of an unchanged eval")
        for round_no in range(args.rounds):
            db = work / f"replay-{round_no}.db"
            live = _qitos(bench, server, n, db, "live", "prompt", "-", "stop")
            print(_line("qitos live", live))
            again = _qitos(bench, server, n, db, "replayed", "prompt", "live", "stop")
            print(_line("qitos replay=live", again))
            result["replay"].append({"live": live, "replay": again})
        live_wall = statistics.median(r["live"]["wall"] for r in result["replay"])
        replay_wall = statistics.median(r["replay"]["wall"] for r in result["replay"])
        calls = sum(r["replay"]["calls"] for r in result["replay"])
        print(
            f"  median: live {live_wall:.2f}s, replay {replay_wall:.2f}s: {live_wall / replay_wall:.1f}x faster "
            f"[{'PASS' if replay_wall * 10 <= live_wall else 'FAIL'} >= 10x]; replay model calls {calls} "
            f"[{'PASS' if calls == 0 else 'FAIL'} == 0]"
        )

        print("\n2. one line of the system prompt changed")
        db = work / "replay-0.db"
        changed: dict[str, Any] = {}
        if not args.no_inspect:
            cache = work / "inspect-cache"
            changed["inspect_first"] = _inspect(bench, server, n, work, "first", PROMPT, cache)
            print(_line("inspect_ai cache on, first run", changed["inspect_first"]))
            changed["inspect_same"] = _inspect(bench, server, n, work, "same", PROMPT, cache)
            print(_line("inspect_ai cache on, unchanged re-run", changed["inspect_same"]))
            changed["inspect_changed"] = _inspect(bench, server, n, work, "changed", CHANGED, cache)
            print(_line("inspect_ai cache on, prompt changed", changed["inspect_changed"]))
        changed["qitos_mark"] = _qitos(bench, server, n, db, "changed-mark", "changed", "live", "mark")
        print(_line("qitos replay=live, on_divergence=mark", changed["qitos_mark"]))
        _qitos(bench, server, n, db, "cache-warm", "prompt", "cache", "stop")  # fills qitos's cache
        changed["qitos_cache"] = _qitos(bench, server, n, db, "changed-cache", "changed", "cache", "stop")
        print(_line("qitos cache=True (after a warm run), changed", changed["qitos_cache"]))
        result["changed_prompt"] = changed
        mark = changed["qitos_mark"]
        ok = mark["calls"] == 0 and mark["diverged"] == n and mark["divergence_steps"] == [0]
        verdict = "PASS" if ok else "FAIL"
        print(f"  qitos mark: {mark['calls']} calls, {mark['diverged']}/{n} diverged at step 0 [{verdict}]")
        if "inspect_changed" in changed:
            print(f"  inspect_ai: {changed['inspect_changed']['calls']} calls for the changed prompt (every request)")
    finally:
        server.close()
        shutil.rmtree(work, ignore_errors=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
