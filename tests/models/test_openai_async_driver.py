"""OpenAICompatibleModel under the async driver: streamed deltas become ``model_delta``
events in order and a retry is a ``model_retry`` event before them. A real chat-completions server
on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from loopback_chat_server import LoopbackChatServer, delta_chunk, json_reply, sse_reply, usage_chunk

from qitos import AgentModule, AsyncEngine, StateSchema
from qitos.engine._events import EngineEvent
from qitos.models._openai_compat import OpenAICompatibleModel


@dataclass
class PlainState(StateSchema):
    pass


class ModelAgent(AgentModule[PlainState, Any, Any]):
    def init_state(self, task: str, **kwargs: Any) -> PlainState:
        return PlainState(task=task, max_steps=3)

    def reduce(self, state: PlainState, observation: Any, decision: Any) -> PlainState:
        return state


@pytest.fixture
def server() -> Any:
    with LoopbackChatServer() as srv:
        yield srv


def test_the_async_driver_awaits_the_adapters_acomplete_and_streams_its_deltas_in_order(
    server: LoopbackChatServer,
) -> None:
    server.push(
        json_reply({"error": {"message": "slow down"}}, status=429, headers={"retry-after-ms": "10"}),
        sse_reply(
            [
                delta_chunk(content="The "),
                delta_chunk(content="sum "),
                delta_chunk(content="is 5."),
                delta_chunk(finish_reason="stop"),
                usage_chunk(30, 4),
            ]
        ),
    )
    model = OpenAICompatibleModel(
        "loopback-model", base_url=server.url, api_key="sk-test", backoff_base=0.001, backoff_max=0.01
    )
    engine = AsyncEngine(ModelAgent(llm=model))

    async def main() -> list[EngineEvent]:
        return [event async for event in engine.arun_stream("What is 2 + 3?")]

    events = asyncio.run(main())
    types = [e.event_type.value for e in events]
    assert [e.payload["text"] for e in events if e.event_type.value == "model_delta"] == ["The ", "sum ", "is 5."]
    assert types.index("model_retry") < types.index("model_delta") < types.index("decide")
    assert events[-1].payload["final_result"] == "The sum is 5."
    assert events[-1].payload["stop_reason"] == "final"
