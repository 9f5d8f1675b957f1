"""Evaluation throughput and resume: qitos.eval against inspect_ai, side by side in one run.

Run: .venv/bin/python bench/eval.py [--sizes 200,1000] [--rounds 1] [--kills 20] [--no-inspect] [--json OUT]

1. Throughput. One OpenAI-compatible server (``bench/eval_server.py``, its own process, asyncio,
   answers each request after 200 ms) plays the same 3-turn script to every sample: a ``lookup``
   tool call, an ``add`` tool call, then the answer. The same N samples run through

   - **qitos**: ``qitos.eval.evaluate`` with an agent on the model path (tools ``lookup``, ``add``),
     ``OpenAICompatibleModel``, ``max_samples=N`` (and so N connections), durable sessions and
     results in a fresh SQLite file, scorer ``exact``;
   - **inspect_ai 0.3.x** in ``bench/.venvs/inspect`` (made by this script with ``pip install
     inspect-ai``): a ``Task`` with ``use_tools(lookup, add)`` and ``generate()``, scorer ``exact``,
     ``max_samples=N``, ``max_connections=N``, the generic OpenAI-compatible provider
     (``openai-api/bench/m``), its eval log in a fresh directory.

   Each run is a fresh process; sizes and frameworks alternate (qitos, inspect, qitos, ...).
   Reported per run: the eval's wall time and CPU seconds (measured inside the process around the
   eval call), CPU per sample, the process's peak RSS and total CPU (``os.wait4``), the time from
   process start to the server's first request, and the ideal wall time (3 turns x 200 ms).

2. Resume (qitos only). A 200-sample eval is killed with SIGKILL 20 times at random moments (a
   random delay after each start, seeded), each kill followed by a resume, then one last resume
   runs to the end (the delays are drawn between 0.5 s and the time an uninterrupted run takes,
   start-up included, so kills land in start-up, mid-run and scoring alike). The server counts
   every request. Target: no request beyond the 600 of an
   uninterrupted run except the ones in flight at a kill (the server's open requests just before
   each kill), and the same answers and scores as an uninterrupted run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
INSPECT_VENV = HERE / ".venvs" / "inspect"
INSPECT_SPEC = "inspect-ai>=0.3,<0.4"
DELAY = 0.2
TURNS = 3


# --------------------------------------------------------------------------- the qitos side (a child)


def qitos_child(n: int, base_url: str, db: str, name: str) -> None:
    """Run the qitos eval of N samples; print one JSON line (a child process of this script)."""
    start_wall = time.time()
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

        def prepare(self, state: BenchState) -> str:
            return str(state.task)

        def reduce(self, state: BenchState, observation: Any, decision: Decision[Any]) -> BenchState:
            return state

    data = Dataset([Sample(f"Answer with the word w{i}", f"W{i}", id=f"s{i}") for i in range(n)], name="bench")
    model = OpenAICompatibleModel("m", base_url=base_url, api_key="sk-bench", max_retries=0, max_input_units=100_000)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    report = evaluate(BenchAgent, data, scorers=[scorers.exact()], model=model, store=db, name=name, max_samples=n)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    print(
        json.dumps(
            {
                "wall": wall,
                "cpu": cpu,
                "status": report.status,
                "samples": len(report.samples),
                "accuracy": report.metrics["exact"]["mean"],
                "start_wall": start_wall,
                "answers": {f"{s.id}": [s.answer, (s.scores.get("exact") or {}).get("value")] for s in report.samples},
                "errors": dict(Counter((s.error or "")[:120] for s in report.samples if s.error)),
            }
        )
    )


# --------------------------------------------------------------------------- the orchestrator


class Server:
    """``eval_server.py`` in its own process."""

    def __init__(self, delay: float) -> None:
        self.dir = tempfile.mkdtemp(prefix="qitos-eval-bench-")
        port_file = os.path.join(self.dir, "port")
        self.proc = subprocess.Popen([sys.executable, str(HERE / "eval_server.py"), port_file, "--delay", str(delay)])
        deadline = time.monotonic() + 30
        while not os.path.exists(port_file):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the benchmark server did not start")
            time.sleep(0.05)
        with open(port_file, encoding="utf-8") as fh:
            self.port = int(fh.read())
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def stats(self, *, reset: bool = False) -> dict[str, Any]:
        answer = httpx.get(f"http://127.0.0.1:{self.port}/stats" + ("?reset=1" if reset else ""), timeout=10)
        return dict(answer.json())

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class Run:
    side: str
    n: int
    wall: float
    cpu: float
    process_cpu: float
    rss_mb: float
    first_request: float | None
    accuracy: float | None
    calls: int
    max_open: int
    errors: dict[str, int] | None = None


def _spawn(args: list[str]) -> tuple[dict[str, Any], float, float, float]:
    """Run a child to its end: (its JSON line, start time, process CPU seconds, peak RSS in MiB)."""
    started = time.time()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, text=False)
    assert proc.stdout is not None and proc.stderr is not None
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{args[1]} failed ({proc.returncode}): {err.decode(errors='replace')[-3000:]}")
    line = out.decode().strip().splitlines()[-1]
    return json.loads(line), started, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def run_side(side: str, n: int, server: Server, work: Path) -> Run:
    server.stats(reset=True)
    tag = f"{side}-{n}-{time.monotonic_ns()}"
    if side == "qitos":
        args = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            str(n),
            server.url,
            str(work / f"{tag}.db"),
            tag,
        ]
    else:
        args = [
            str(INSPECT_VENV / "bin" / "python"),
            str(HERE / "eval_inspect_child.py"),
            str(n),
            server.url,
            str(work / tag),
        ]
    data, started, process_cpu, rss = _spawn(args)
    stats = server.stats(reset=True)
    first = stats["first_at"] - started if stats["first_at"] else None
    return Run(
        side,
        n,
        data["wall"],
        data["cpu"],
        process_cpu,
        rss,
        first,
        data.get("accuracy"),
        stats["calls"],
        stats["max_open"],
    )


def ensure_inspect() -> Path:
    """bench/.venvs/inspect with inspect-ai 0.3.x and the openai SDK its provider needs."""
    python = INSPECT_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(INSPECT_VENV)], check=True)
    probe = subprocess.run(
        [str(python), "-c", "import inspect_ai, openai; print(inspect_ai.__version__)"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        subprocess.run([str(python), "-m", "pip", "install", "-q", INSPECT_SPEC, "openai"], check=True)
        probe = subprocess.run(
            [str(python), "-c", "import inspect_ai; print(inspect_ai.__version__)"],
            capture_output=True,
            text=True,
            check=True,
        )
    return Path(probe.stdout.strip())


def throughput(sizes: list[int], rounds: int, with_inspect: bool, work: Path) -> list[Run]:
    server = Server(DELAY)
    runs: list[Run] = []
    try:
        for _ in range(rounds):
            for n in sizes:
                for side in ("qitos", "inspect") if with_inspect else ("qitos",):
                    run = run_side(side, n, server, work)
                    runs.append(run)
                    print(
                        f"  {side:8} N={n:5}  wall {run.wall:6.2f}s  cpu {run.cpu:6.2f}s  "
                        f"({1000 * run.cpu / n:5.1f} ms/sample)  rss {run.rss_mb:6.0f} MiB  "
                        f"first request {run.first_request or float('nan'):5.2f}s  calls {run.calls}  "
                        f"max open {run.max_open}  accuracy {run.accuracy}",
                        flush=True,
                    )
    finally:
        server.close()
    return runs


def resume(n: int, kills: int, seed: int, work: Path) -> dict[str, Any]:
    """Kill a qitos eval ``kills`` times at random moments, resuming after each; count calls."""
    rng = random.Random(seed)
    server = Server(DELAY)
    try:
        baseline_db = work / "resume-baseline.db"
        begun = time.monotonic()
        baseline, _, _, _ = _spawn(
            [sys.executable, str(Path(__file__).resolve()), "--child", str(n), server.url, str(baseline_db), "resume"]
        )
        base_calls = server.stats(reset=True)["calls"]
        span = time.monotonic() - begun  # kills land anywhere from start-up to the end of a whole run
        db = work / "resume.db"
        in_flight = 0
        killed = 0
        for _ in range(kills):
            proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--child", str(n), server.url, str(db), "resume"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=ROOT,
            )
            time.sleep(rng.uniform(0.5, span))
            if proc.poll() is not None:
                continue  # it finished before this kill: the next start is a resume of a finished eval
            in_flight += server.stats()["open"]
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            killed += 1
        final, _, _, _ = _spawn(
            [sys.executable, str(Path(__file__).resolve()), "--child", str(n), server.url, str(db), "resume"]
        )
        calls = server.stats(reset=True)["calls"]
    finally:
        server.close()
    return {
        "samples": n,
        "kills": killed,
        "uninterrupted_calls": base_calls,
        "calls": calls,
        "extra_calls": calls - base_calls,
        "in_flight_at_kills": in_flight,
        "same_answers_and_scores": final["answers"] == baseline["answers"],
        "status": final["status"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="200,1000")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--no-inspect", action="store_true")
    parser.add_argument("--no-resume", action="store_true")
    parser.add_argument("--no-throughput", action="store_true")
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--child", nargs=4, metavar=("N", "URL", "DB", "NAME"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        qitos_child(int(args.child[0]), args.child[1], args.child[2], args.child[3])
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    if not args.no_inspect:
        print(f"inspect_ai {ensure_inspect()} in {INSPECT_VENV}")
    work = Path(tempfile.mkdtemp(prefix="qitos-eval-bench-work-"))
    result: dict[str, Any] = {}
    try:
        runs = []
        if not args.no_throughput:
            print(f"throughput: {TURNS} turns x {DELAY * 1000:.0f} ms per sample, all samples in flight")
            runs = throughput(sizes, args.rounds, not args.no_inspect, work)
        result["throughput"] = [run.__dict__ for run in runs]
        print("\nmedians (qitos / inspect_ai):")
        for n in sizes if runs else []:
            q = [r for r in runs if r.side == "qitos" and r.n == n]
            i = [r for r in runs if r.side == "inspect" and r.n == n]
            qw, qc = statistics.median(r.wall for r in q), statistics.median(r.cpu for r in q)
            line = f"  N={n:5}: qitos wall {qw:.2f}s cpu {qc:.2f}s ({1000 * qc / n:.1f} ms/sample)"
            line += f", ideal {TURNS * DELAY:.1f}s"
            if i:
                iw, ic = statistics.median(r.wall for r in i), statistics.median(r.cpu for r in i)
                line += (
                    f"; inspect_ai wall {iw:.2f}s cpu {ic:.2f}s ({1000 * ic / n:.1f} ms/sample); "
                    f"wall ratio {qw / iw:.3f} [{'PASS' if qw <= iw / 10 else 'FAIL'} <= 0.1], "
                    f"cpu ratio {qc / ic:.3f} [{'PASS' if qc <= ic / 10 else 'FAIL'} <= 0.1]"
                )
            if n == 200:
                line += f"; {qw / (TURNS * DELAY):.1f}x ideal [{'PASS' if qw <= 2 * TURNS * DELAY else 'FAIL'} <= 2x]"
            print(line)
        if not args.no_resume:
            print(f"\nresume: {args.kills} kill -9s of a 200-sample eval, each followed by a resume")
            outcome = resume(200, args.kills, args.seed, work)
            result["resume"] = outcome
            ok = outcome["extra_calls"] <= outcome["in_flight_at_kills"] and outcome["same_answers_and_scores"]
            print(f"  {json.dumps(outcome)}  [{'PASS' if ok else 'FAIL'}]")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
