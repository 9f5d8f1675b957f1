"""A real chat-completions HTTP server on 127.0.0.1 for adapter tests (plain JSON and SSE).

Each POST takes the next scripted reply; every request is recorded (path, headers, JSON body).
``refuse_streaming_with_tools``, when set, is the reply to every streamed request that has tools
(as some servers refuse to stream those), and the script is not consumed by it.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted answer: a status with a body, an SSE stream, a delay, or a dropped connection."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    sse: list[bytes] | None = None
    delay: float = 0.0
    chunk_delay: float = 0.0
    drop: bool = False
    drop_after_chunks: int | None = None


def json_reply(body: Any, *, status: int = 200, headers: dict[str, str] | None = None, delay: float = 0.0) -> Reply:
    """A JSON (or raw text/bytes) answer."""
    if isinstance(body, bytes):
        raw = body
    elif isinstance(body, str):
        raw = body.encode()
    else:
        raw = json.dumps(body).encode()
    return Reply(status=status, body=raw, headers={"Content-Type": "application/json", **(headers or {})}, delay=delay)


def sse_reply(
    chunks: list[Any], *, done: bool = True, chunk_delay: float = 0.0, drop_after_chunks: int | None = None
) -> Reply:
    """A text/event-stream answer: each chunk (dict or raw text) as one ``data:`` event."""
    events = [f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n".encode() for c in chunks]
    if done:
        events.append(b"data: [DONE]\n\n")
    return Reply(sse=events, chunk_delay=chunk_delay, drop_after_chunks=drop_after_chunks)


def completion(
    text: str | None = None,
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str | None = None,
    usage: tuple[int, int] = (11, 7),
    model: str = "loopback-model",
) -> dict[str, Any]:
    """A chat.completion body. ``tool_calls`` items: {"id", "name", "arguments": str}."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in tool_calls
        ]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
            }
        ],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
    }


def delta_chunk(
    *, content: str | None = None, tool_calls: list[dict[str, Any]] | None = None, finish_reason: str | None = None
) -> dict[str, Any]:
    """One chat.completion.chunk with a delta."""
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-s",
        "object": "chat.completion.chunk",
        "model": "loopback-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def usage_chunk(prompt: int, completion_tokens: int) -> dict[str, Any]:
    """The final chunk carrying usage (``stream_options.include_usage``)."""
    return {
        "id": "chatcmpl-s",
        "object": "chat.completion.chunk",
        "model": "loopback-model",
        "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion_tokens},
    }


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any


class LoopbackChatServer:
    """Start with ``with LoopbackChatServer() as server:``; ``server.url`` is the ``/v1`` root."""

    def __init__(self) -> None:
        self.script: deque[Reply] = deque()
        self.requests: list[Received] = []
        self.refuse_streaming_with_tools: Reply | None = None
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def push(self, *replies: Reply) -> None:
        with self._lock:
            self.script.extend(replies)

    @property
    def url(self) -> str:
        assert self._httpd is not None
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> LoopbackChatServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as separate writes

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw
                refused = server.refuse_streaming_with_tools
                with server._lock:
                    server.requests.append(Received(self.path, dict(self.headers.items()), body))
                    if refused is not None and isinstance(body, dict) and body.get("stream") and body.get("tools"):
                        reply = refused
                    else:
                        reply = (
                            server.script.popleft()
                            if server.script
                            else json_reply({"error": "script empty"}, status=599)
                        )
                if reply.delay:
                    time.sleep(reply.delay)
                if reply.drop:
                    self.close_connection = True
                    self.connection.close()
                    return
                if reply.sse is not None:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.close_connection = True
                    for i, event in enumerate(reply.sse):
                        if reply.drop_after_chunks is not None and i >= reply.drop_after_chunks:
                            self.connection.shutdown(2)
                            return
                        self.wfile.write(event)
                        self.wfile.flush()
                        if reply.chunk_delay:
                            time.sleep(reply.chunk_delay)
                    return
                self.send_response(reply.status)
                for key, value in reply.headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # clients that time out or hang up on purpose; not interesting

        self._httpd = Server(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._httpd is not None
        self._httpd.shutdown()
        self._httpd.server_close()


def unused_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (right now)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port
