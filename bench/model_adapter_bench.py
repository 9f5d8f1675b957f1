"""Model adapters: HTTP adapter overhead vs the official ``openai`` SDK, and the local model's speed.

Run: .venv/bin/python bench/model_adapter_bench.py [--calls 300] [--rounds 5] [--no-local]

1. Adapter overhead per call. One loopback chat-completions server (``http.server``, HTTP/1.1
   keep-alive, a canned JSON reply) on 127.0.0.1 serves three clients in the same process:

   - ``raw httpx``: ``httpx.Client.post`` of a prebuilt body, ``json.loads`` of the reply. The
     floor: server + loopback + HTTP parsing, no adapter work.
   - ``qitos``: ``OpenAICompatibleModel.complete(view)`` on a prebuilt ``RequestView`` (messages
     and tool schemas converted to the wire format, reply parsed into a ``ModelResponse``).
   - ``openai SDK``: ``OpenAI(base_url=...).chat.completions.create(model=, messages=, tools=)``
     with the same messages and tools (``pip install openai`` into the venv; bench only).

   Two shapes: ``plain`` (system + user message, text reply) and ``tools`` (two tools, a prior
   tool call and its result in the history, a tool-call reply). Rounds interleave the clients so
   a change in machine load hits all of them; the median of the per-round means is reported, and
   the adapter's own overhead as the difference to the raw floor.

2. Local model (the ``local`` extra): generation speed (tokens/s over a 120-token free answer, and
   the speed inside grammar-constrained tool calls) and the wall time for the Engine to finish the
   small tool task "What is 17 + 25?" with an ``add`` tool (model path: tool call, tool, answer),
   with the adapter's automatic thread choice (or ``--threads N``) and the 1-minute load average
   printed beside it: llama.cpp threads spin-wait, so on a busy 2-core machine 2 threads can be
   far slower than 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from qitos.core._exchange import ExchangeLog
from qitos.core.request_view import RequestView
from qitos.models._openai_compat import OpenAICompatibleModel

TOOLS = [
    {
        "name": "read_file",
        "description": "Read a UTF-8 text file in the workspace.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "File relative to the root."}},
            "required": ["path"],
            "additionalProperties": False,
        },
    },
    {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
]


def reply(tool_call: bool) -> bytes:
    message: dict[str, Any] = {"role": "assistant", "content": "The notes are indexed." if not tool_call else None}
    if tool_call:
        message["tool_calls"] = [
            {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": '{"a": 17, "b": 25}'}}
        ]
    body = {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1,
        "model": "bench-model",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_call else "stop"}],
        "usage": {"prompt_tokens": 42, "completion_tokens": 7, "total_tokens": 49},
    }
    return json.dumps(body).encode()


class Server:
    """Canned chat-completions replies: a tool call when the request carries tools."""

    def __enter__(self) -> Server:
        plain, tools = reply(False), reply(True)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as separate writes

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = tools if b'"tools"' in raw else plain
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def build_view(with_tools: bool) -> RequestView:
    log = ExchangeLog(log_id="bench")
    ex = log.open([{"role": "user", "content": "Index the notes in the workspace and add 17 and 25."}])
    if with_tools:
        log.record_output(
            ex.exchange_id,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "call_1", "name": "read_file", "arguments": {"path": "notes/a.md"}}],
            },
        )
        log.record_tool_result(ex.exchange_id, "call_1", "# A\nalpha line\n")
        log.close(ex.exchange_id)
        log.open([])
    return RequestView.from_exchange_log(
        log,
        instructions=[{"role": "system", "content": "You index notes with tools."}],
        tool_schemas=TOOLS if with_tools else [],
    )


def openai_args(view: RequestView) -> dict[str, Any]:
    from qitos.models._openai_compat import to_openai_messages, to_openai_tools

    args: dict[str, Any] = {"model": "bench-model", "messages": to_openai_messages(view.messages())}
    if view.tools():
        args["tools"] = to_openai_tools(view.tools())
    return args


@dataclass
class Series:
    name: str
    call: Callable[[], Any]
    means: list[float] = field(default_factory=list)


def measure(series: list[Series], calls: int, rounds: int) -> None:
    for s in series:  # warm-up: connections, imports, caches
        for _ in range(20):
            s.call()
    for _ in range(rounds):
        for s in series:
            started = time.perf_counter()
            for _ in range(calls):
                s.call()
            s.means.append((time.perf_counter() - started) / calls * 1e6)


def adapter_overhead(calls: int, rounds: int) -> None:
    try:
        import openai
    except ImportError:
        openai = None
        print("openai SDK not installed (.venv/bin/pip install openai): SDK column skipped\n")
    with Server() as server:
        model = OpenAICompatibleModel("bench-model", base_url=server.url, api_key="sk-bench-key", max_retries=0)
        client = httpx.Client(timeout=30)
        sdk = openai.OpenAI(base_url=server.url, api_key="sk-bench-key", max_retries=0) if openai else None
        rows = []
        for shape, with_tools in (("plain", False), ("tools", True)):
            view = build_view(with_tools)
            body = json.dumps(model.build_payload(view)).encode()
            headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench-key"}
            expected_tool = with_tools
            assert bool(model.complete(view).tool_calls) == expected_tool
            series = [
                Series(
                    "raw httpx",
                    lambda body=body, headers=headers: json.loads(
                        client.post(f"{server.url}/chat/completions", content=body, headers=headers).content
                    ),
                ),
                Series("qitos", lambda view=view: model.complete(view)),
            ]
            if sdk is not None:
                args = openai_args(view)
                assert bool(sdk.chat.completions.create(**args).choices[0].message.tool_calls) == expected_tool
                series.append(Series("openai SDK", lambda args=args: sdk.chat.completions.create(**args)))
            measure(series, calls, rounds)
            medians = {s.name: statistics.median(s.means) for s in series}
            rows.append((shape, medians))
        model.close()
        client.close()
    print(f"Adapter overhead per call (loopback server, {calls} calls x {rounds} rounds, median of round means)")
    header = ["shape", "raw httpx", "qitos", "openai SDK", "qitos - raw", "SDK - raw", "SDK / qitos"]
    print("  ".join(f"{h:>11}" for h in header))
    for shape, m in rows:
        raw, ours, sdk_us = m["raw httpx"], m["qitos"], m.get("openai SDK")
        cells = [shape, f"{raw:.0f} us", f"{ours:.0f} us"]
        if sdk_us is None:
            cells += ["-", f"{ours - raw:.0f} us", "-", "-"]
        else:
            cells += [f"{sdk_us:.0f} us", f"{ours - raw:.0f} us", f"{sdk_us - raw:.0f} us", f"{sdk_us / ours:.2f}x"]
        print("  ".join(f"{c:>11}" for c in cells))
    print()


def local_model(threads: int | None) -> None:
    try:
        from qitos.models._local import LocalModel
    except ImportError as exc:  # pragma: no cover - depends on the extra
        print(f"local model skipped: {exc}")
        return
    try:
        model = LocalModel(threads=threads)
    except ImportError as exc:
        print(f"local model skipped: {exc}")
        return
    from dataclasses import dataclass as dc
    from dataclasses import field as dc_field

    from qitos import Action, AgentModule, Decision, Engine, StateSchema, ToolRegistry, tool
    from qitos.core._decision import Observation

    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    model.load()
    load_s = time.perf_counter() - started

    log = ExchangeLog(log_id="bench-local")
    log.open([{"role": "user", "content": "Write a short paragraph about the sea."}])
    free = model.complete(RequestView.from_exchange_log(log))
    free_tps = free.raw["tokens_per_second"]
    free_tokens = free.usage.output_tokens

    @tool
    def add(a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)

    @dc
    class CalcState(StateSchema):
        results: list[str] = dc_field(default_factory=list)

    class CalculatorAgent(AgentModule[CalcState, Observation, Action]):
        def init_state(self, task: str, **kwargs: Any) -> CalcState:
            return CalcState(task=task, max_steps=6)

        def build_system_prompt(self, state: CalcState) -> str | None:
            return "You are a careful assistant."

        def prepare(self, state: CalcState) -> str:
            return state.task

        def reduce(self, state: CalcState, observation: Observation, decision: Decision[Action]) -> CalcState:
            state.results.extend(str(r.output) for r in observation.results if r.ok)
            return state

    model.close()  # a cold KV cache, as for a new run
    started = time.perf_counter()
    result = Engine(CalculatorAgent(tool_registry=ToolRegistry([add]), llm=model)).run("What is 17 + 25?")
    task_s = time.perf_counter() - started
    steps = [r.decision.mode for r in result.records]
    constrained = [r.model["response"]["raw"] for r in result.records if r.model]
    grammar_tps = statistics.mean(raw["tokens_per_second"] for raw in constrained)
    chosen = "auto" if threads is None else "forced"
    print(
        f"Local model: {model.model_id}, threads={model.threads} ({chosen}), load average {load_before:.1f} "
        f"on {os.cpu_count()} cores"
    )
    print(f"  load weights               {load_s * 1000:8.0f} ms")
    print(f"  free text                  {free_tps:8.1f} tokens/s ({free_tokens} tokens)")
    print(f"  grammar-constrained        {grammar_tps:8.1f} tokens/s (tool call / answer JSON)")
    print(
        f"  small tool task            {task_s:8.2f} s  steps={steps} answer={result.state.final_result!r} "
        f"tool results={result.state.results}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-local", action="store_true", help="skip the local model part")
    parser.add_argument("--no-http", action="store_true", help="skip the adapter overhead part")
    parser.add_argument("--threads", type=int, default=None, help="local model threads (default: automatic)")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}\n")
    if not args.no_http:
        adapter_overhead(args.calls, args.rounds)
    if not args.no_local:
        local_model(args.threads)


if __name__ == "__main__":
    main()
