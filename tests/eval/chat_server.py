"""An OpenAI-compatible chat server on 127.0.0.1 that plays a fixed 3-turn script per conversation.

Turn by the number of tool results in the request: 0 -> a ``lookup`` call on the task's first
word, 1 -> an ``add`` call, 2 -> the final answer (the task in upper case). So any number of
concurrent conversations get consistent answers. It counts every request (``calls``, and one line
per request in ``log_path`` when given, for counting across processes), tracks how many are open at
once (``max_open``), can wait ``delay`` seconds before answering and can answer 429 to the first
``throttle`` requests (with ``Retry-After: retry_after``).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ScriptServer:
    def __init__(
        self,
        *,
        delay: float = 0.0,
        log_path: str | None = None,
        throttle: int = 0,
        retry_after: float = 0.05,
        throttle_while_open: int | None = None,
    ) -> None:
        self.delay = delay
        self.log_path = log_path
        self.throttle = throttle
        self.retry_after = retry_after
        self.throttle_while_open = throttle_while_open  # answer 429 while more than this are open
        self.calls = 0
        self.throttled = 0
        self.open = 0
        self.max_open = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages") or []
        task = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
        first = task.split("Task:")[-1].split()[0] if task.split() else "x"
        turns = sum(1 for m in messages if m.get("role") == "tool")
        if turns == 0:
            message = {"role": "assistant", "content": None, "tool_calls": [_call("c1", "lookup", {"word": first})]}
        elif turns == 1:
            message = {"role": "assistant", "content": None, "tool_calls": [_call("c2", "add", {"a": 2, "b": 3})]}
        else:
            message = {"role": "assistant", "content": _answer(task)}
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        return {
            "id": "cmpl",
            "object": "chat.completion",
            "model": body.get("model", "m"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }

    def __enter__(self) -> ScriptServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with owner._lock:
                    owner.open += 1
                    owner.max_open = max(owner.max_open, owner.open)
                    too_many = owner.throttle_while_open is not None and owner.open > owner.throttle_while_open
                    throttled = owner.throttled < owner.throttle or too_many
                    if throttled:
                        owner.throttled += 1
                try:
                    if throttled:
                        self._send(429, {"error": {"message": "slow down"}}, {"Retry-After": str(owner.retry_after)})
                        return
                    if owner.delay:
                        time.sleep(owner.delay)
                    with owner._lock:
                        owner.calls += 1
                        if owner.log_path:
                            with open(owner.log_path, "a", encoding="utf-8") as handle:
                                handle.write(json.dumps(body.get("messages", [])[-1:])[:200] + "\n")
                    self._send(200, owner.reply(body), {})
                finally:
                    with owner._lock:
                        owner.open -= 1

            def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str]) -> None:
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(raw)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 1024

        self._server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _answer(prompt: str) -> str:
    return prompt.split("Task:")[-1].strip().splitlines()[0].upper() if "Task:" in prompt else prompt.strip().upper()


def serve_forever(port_file: str, log_path: str, delay: float) -> None:
    """Run a server until killed, writing its URL to ``port_file`` (for subprocess tests)."""
    with ScriptServer(delay=delay, log_path=log_path) as server:
        with open(port_file + ".tmp", "w", encoding="utf-8") as handle:
            handle.write(server.url)
        import os

        os.replace(port_file + ".tmp", port_file)
        while True:
            time.sleep(1)
