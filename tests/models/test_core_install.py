"""A core install (no ``qitos[tokens]`` extra) runs the OpenAI-compatible adapter, whose unit is tokens.

The tokenizer is made unimportable in a real subprocess by a ``sitecustomize`` meta-path blocker on
its ``PYTHONPATH``; the agent there talks to a real chat-completions server on 127.0.0.1 that
reports no usage, so both the request budget and the usage are counted by the documented estimate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from loopback_chat_server import LoopbackChatServer, completion, delta_chunk, json_reply, sse_reply

SRC = Path(__file__).resolve().parents[2] / "src"

BLOCKER = """
import sys

class _NoTokenizer:
    def find_spec(self, name, path=None, target=None):
        if name == "quicktok" or name.startswith("quicktok."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: a core install)", name=name)
        return None

sys.meta_path.insert(0, _NoTokenizer())
"""

AGENT = """
import json, sys
from dataclasses import dataclass

from qitos import AgentModule, StateSchema
from qitos.core.context import tokenizer_available
from qitos.engine._hooks import EngineHook
from qitos.models._openai_compat import OpenAICompatibleModel

try:
    import quicktok  # noqa: F401
    blocked = False
except ImportError:
    blocked = True


@dataclass
class S(StateSchema):
    pass


class Agent(AgentModule):
    def init_state(self, task, **kwargs):
        return S(task=task)

    def reduce(self, state, observation, decision):
        return state


class Live(EngineHook):
    # A hook that watches events makes the run live: the model is asked to stream.
    def on_event(self, event):
        pass


model = OpenAICompatibleModel("m", base_url=sys.argv[1], max_input_units=2000, backoff_base=0.001)
hooks = [Live()] if sys.argv[2] == "stream" else []
result = Agent(llm=model).run("Say hello.", return_state=True, trace=False, hooks=hooks)
record = result.records[0]
print(json.dumps({
    "unit": model.unit,
    "blocked": blocked,
    "tokenizer_available": tokenizer_available(),
    "answer": result.state.final_result,
    "units": record.request_view["units"],
    "usage": record.model["response"]["usage"],
}))
"""


def run_without_tokenizer(tmp_path: Path, url: str, mode: str) -> dict[str, Any]:
    """Run AGENT in a subprocess in which ``import quicktok`` fails; return what it printed."""
    (tmp_path / "sitecustomize.py").write_text(BLOCKER, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(SRC)])}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(AGENT), url, mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return data


def estimate(text: str) -> int:
    """The documented fallback: one token per 3 bytes of UTF-8, rounded up."""
    return -(-len(text.encode("utf-8")) // 3)


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def test_the_openai_adapter_runs_without_the_tokenizer_and_says_its_counts_are_estimates(tmp_path: Path) -> None:
    body = completion("Hello!")
    del body["usage"]
    with LoopbackChatServer() as server:
        server.push(json_reply(body))
        data = run_without_tokenizer(tmp_path, server.url, "plain")
        sent = server.requests[0].body

    assert (data["unit"], data["blocked"], data["tokenizer_available"]) == ("tokens", True, False)
    assert data["answer"] == "Hello!"
    units = data["units"]
    assert units["counter"] == ["tokens", "estimate:utf8-bytes/3"] and units["estimated"] is True
    assert (units["max_input"], units["reserved_output"]) == (2000, 500)
    prompt = sum(estimate(canonical(m)) for m in sent["messages"])
    assert data["usage"] == {"input_tokens": prompt, "output_tokens": estimate("Hello!"), "estimated": True}


def test_a_streamed_answer_without_the_tokenizer_is_counted_too(tmp_path: Path) -> None:
    chunks = [delta_chunk(content="Hello"), delta_chunk(content=" there"), delta_chunk(finish_reason="stop")]
    with LoopbackChatServer() as server:
        server.push(sse_reply(chunks))
        data = run_without_tokenizer(tmp_path, server.url, "stream")
        sent = server.requests[0].body

    assert sent["stream"] is True
    assert data["answer"] == "Hello there"
    assert data["usage"]["estimated"] is True and data["usage"]["output_tokens"] == estimate("Hello there")
