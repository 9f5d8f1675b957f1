"""The eval benchmark's model server: OpenAI-compatible chat completions on 127.0.0.1, asyncio.

Run as ``python bench/eval_server.py PORT_FILE [--delay 0.2]`` (started by ``bench/eval.py``, in a
process of its own so its CPU is not charged to either framework). Every conversation gets the
same 3-turn script, chosen by the number of tool results in the request: 0 -> a ``lookup`` call,
1 -> an ``add`` call, 2 -> the final answer (the first word of the last user message in upper
case). It answers each request after ``--delay`` seconds, keeps HTTP/1.1 connections alive and
serves any number at once. ``GET /stats`` returns ``{"calls", "answered", "open", "max_open",
"first_at", "broken"}`` (``first_at``: ``time.time()`` of the first request; ``broken``: requests
whose client went away before the reply); ``GET /stats?reset=1`` also resets them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any


class Stats:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.calls = 0
        self.answered = 0
        self.open = 0
        self.max_open = 0
        self.first_at: float | None = None
        self.broken = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "answered": self.answered,
            "open": self.open,
            "max_open": self.max_open,
            "first_at": self.first_at,
            "broken": self.broken,
        }


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def reply(body: dict[str, Any]) -> dict[str, Any]:
    messages = body.get("messages") or []
    users = [m.get("content") or "" for m in messages if m.get("role") == "user"]
    text = users[-1] if users else ""
    if not isinstance(text, str):  # content parts
        text = " ".join(p.get("text", "") for p in text if isinstance(p, dict))
    word = (text.split() or ["x"])[-1]
    turns = sum(1 for m in messages if m.get("role") == "tool")
    if turns == 0:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "tool_calls": [_call("c1", "lookup", {"word": word})],
        }
    elif turns == 1:
        message = {"role": "assistant", "content": None, "tool_calls": [_call("c2", "add", {"a": 2, "b": 3})]}
    else:
        message = {"role": "assistant", "content": word.upper()}
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1,
        "model": body.get("model", "m"),
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if "tool_calls" in message else "stop"}
        ],
        "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25},
    }


async def serve(port_file: str, delay: float) -> None:
    stats = Stats()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target = lines[0].split(" ")[:2]
                headers = {
                    k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)
                }
                length = int(headers.get("content-length") or 0)
                raw = await reader.readexactly(length) if length else b""
                if method == "GET" and target.startswith("/stats"):
                    payload = json.dumps(stats.to_dict()).encode()
                    if "reset=1" in target:
                        stats.reset()
                    _write(writer, 200, payload)
                    await writer.drain()
                    continue
                stats.calls += 1
                if stats.first_at is None:
                    stats.first_at = time.time()
                stats.open += 1
                stats.max_open = max(stats.max_open, stats.open)
                try:
                    await asyncio.sleep(delay)
                    body = json.loads(raw or b"{}")
                    _write(writer, 200, json.dumps(reply(body)).encode())
                    await writer.drain()
                    stats.answered += 1
                except (ConnectionError, asyncio.CancelledError):
                    stats.broken += 1
                    raise
                finally:
                    stats.open -= 1
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    with open(port_file + ".tmp", "w", encoding="utf-8") as fh:
        fh.write(str(port))
    os.replace(port_file + ".tmp", port_file)
    async with server:
        await server.serve_forever()


def _write(writer: asyncio.StreamWriter, status: int, payload: bytes) -> None:
    writer.write(
        f"HTTP/1.1 {status} OK\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        "Connection: keep-alive\r\n\r\n".encode()
        + payload
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("port_file")
    parser.add_argument("--delay", type=float, default=0.2)
    args = parser.parse_args()
    asyncio.run(serve(args.port_file, args.delay))
