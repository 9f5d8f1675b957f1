"""OpenAICompatibleModel's concurrency: ``max_connections``, ``fit_connections`` and 429 back-off,
against a real HTTP server on 127.0.0.1 that counts the requests open at once."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from qitos.core._errors import ConfigurationError
from qitos.core._exchange import ExchangeLog
from qitos.core.request_view import RequestView
from qitos.models import OpenAICompatibleModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "eval"))
from chat_server import ScriptServer


def _view(model: OpenAICompatibleModel, i: int) -> RequestView:
    log = ExchangeLog(f"log-{i}")
    log.open([{"role": "user", "content": f"Task: word{i}"}])
    return RequestView.from_exchange_log(log, model=model)


async def _many(model: OpenAICompatibleModel, n: int) -> list[Any]:
    return await asyncio.gather(*(model.acomplete(_view(model, i)) for i in range(n)))


def test_max_connections_caps_the_requests_open_at_once() -> None:
    with ScriptServer(delay=0.2) as server:
        model = OpenAICompatibleModel("m", base_url=server.url, api_key="sk-test", max_connections=4)
        replies = asyncio.run(_many(model, 12))
        assert len(replies) == 12 and server.calls == 12
        assert server.max_open == 4
        model.fit_connections(50)  # a cap given to the constructor stays
        assert model.max_connections == 4


def test_fit_connections_opens_more_than_httpx_default_pool_of_100() -> None:
    with ScriptServer(delay=0.5) as server:
        model = OpenAICompatibleModel("m", base_url=server.url, api_key="sk-test")
        assert model.max_connections == 100
        model.fit_connections(150)
        asyncio.run(_many(model, 150))
        assert server.max_open == 150


def test_429_lowers_the_concurrency_for_a_while_and_fails_nothing() -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    with ScriptServer(delay=0.1, throttle_while_open=5, retry_after=0.05) as server:
        model = OpenAICompatibleModel("m", base_url=server.url, api_key="sk-test", max_connections=40, max_retries=1)
        model.subscribe(lambda kind, payload: events.append((kind, payload)))

        async def run() -> tuple[list[Any], int]:
            replies = await _many(model, 40)
            return replies, model.concurrency

        replies, after = asyncio.run(run())
        assert len(replies) == 40 and server.calls == 40  # every request answered, none failed
        assert server.throttled > 0
        lowered = [p["concurrency"] for kind, p in events if kind == "model_retry" and "concurrency" in p]
        # additive increase between bursts may raise the limit again, so the reports need not be
        # monotonic: each is below the ceiling, and the bursts drove it down to the server's level
        assert lowered and max(lowered) < 40 and min(lowered) <= 5 and 1 <= after <= 40


def test_a_server_that_always_throttles_still_fails_once_at_one_request() -> None:
    from qitos.core._errors import ModelError

    with ScriptServer(throttle=10_000, retry_after=0.01) as server:
        model = OpenAICompatibleModel("m", base_url=server.url, api_key="sk-test", max_connections=8, max_retries=2)
        with pytest.raises(ModelError, match=r"HTTP 429.*gave up after 3 attempts"):
            asyncio.run(_many(model, 4))


def test_bad_max_connections_are_refused() -> None:
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ConfigurationError, match="max_connections must be an int >= 1"):
            OpenAICompatibleModel("m", base_url="http://127.0.0.1:1/v1", max_connections=bad)  # type: ignore[arg-type]
