"""Every fenced block of README.md runs as written.

The blocks are extracted in order and run in one empty directory, the way a reader pastes them:
python blocks as files run with ``python`` (``file=NAME`` in a ``<!-- readme-test: ... -->``
comment right above a block names its file, so later blocks can import it), bash blocks line by
line (each a ``qitos`` command). ``expect="TEXT"`` must appear in the block's output.
``server=openai`` starts a real OpenAI-compatible chat server on 127.0.0.1 for the block and points
``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` at it; ``server=otlp`` starts an OTLP/HTTP receiver on
127.0.0.1, sets ``OTEL_EXPORTER_OTLP_ENDPOINT`` and checks that spans arrived. ``text`` blocks are
not code. The first block is the
set-up pair of commands: it is checked verbatim, not run (it installs packages, and
``scripts/test.sh`` is what runs this suite).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import qitos
from otlp_receiver import otlp_receiver

# The adapter tests' real chat server (tests/models/loopback_chat_server.py).
sys.path.insert(0, str(Path(__file__).resolve().parent / "models"))
from loopback_chat_server import LoopbackChatServer, completion, json_reply

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SETUP = [
    "bash scripts/demo.sh    # install qitos with the embedded local model and run the demo agent (local SQLite store)",
    "bash scripts/test.sh    # install everything the tests need and run the whole suite (ruff, mypy, pytest)",
]
_FENCE = re.compile(r"(?:<!-- readme-test: (?P<directive>[^\n]*?) -->\n)?```(?P<lang>[a-z]*)\n(?P<body>.*?)\n```", re.S)


@dataclass
class Block:
    index: int
    lang: str
    body: str
    options: dict[str, str] = field(default_factory=dict)


def readme_blocks() -> list[Block]:
    blocks = []
    for i, match in enumerate(_FENCE.finditer(README.read_text(encoding="utf-8"))):
        options = dict(item.split("=", 1) for item in shlex.split(match["directive"] or ""))
        blocks.append(Block(i, match["lang"], match["body"], options))
    return blocks


def _env(extra: dict[str, str]) -> dict[str, str]:
    src = str(Path(qitos.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "QITOS_API_KEY", "QITOS_MODEL"):
        env.pop(name, None)
    for name in [n for n in env if n.startswith("OTEL_")]:
        env.pop(name)
    env["NO_PROXY"] = "127.0.0.1"
    env.update(extra)
    return env


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def test_the_readme_starts_with_its_two_setup_commands() -> None:
    first = readme_blocks()[0]
    assert first.lang == "bash" and first.body.splitlines() == SETUP
    for line in SETUP:
        assert (ROOT / line.split()[1]).is_file()


def test_every_block_is_python_bash_or_text() -> None:
    blocks = readme_blocks()
    assert {b.lang for b in blocks} <= {"python", "bash", "text"}, [b.lang for b in blocks]
    assert sum(b.lang == "python" for b in blocks) >= 3


def test_every_readme_block_runs_as_written(tmp_path: Path) -> None:
    ran = 0
    for block in readme_blocks()[1:]:
        if block.lang == "text":
            continue
        expect = block.options.get("expect")
        if block.lang == "python":
            name = block.options.get("file", f"block_{block.index}.py")
            (tmp_path / name).write_text(block.body + "\n", encoding="utf-8")
            if block.options.get("server") == "openai":
                with LoopbackChatServer() as server:
                    server.push(*[json_reply(completion("Hello")) for _ in range(3)])
                    env = _env({"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "sk-readme-test"})
                    out = _run([sys.executable, name], tmp_path, env)
                    assert server.requests, "the block did not talk to the server"
            else:
                out = _run([sys.executable, name], tmp_path, _env({}))
        else:
            lines = block.body.splitlines()
            for line in lines:
                assert line.startswith("qitos "), f"README bash block {block.index}: not a qitos command: {line!r}"
            if block.options.get("server") == "otlp":
                with otlp_receiver() as receiver:
                    env = _env({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url})
                    out = "".join(_run(["bash", "-c", line], tmp_path, env) for line in lines)
                assert receiver.named("invoke_agent"), "the block sent no spans"
            else:
                out = "".join(_run(["bash", "-c", line], tmp_path, _env({})) for line in lines)
        if expect is not None:
            assert expect in out, f"README block {block.index}: {expect!r} not in its output:\n{out}"
        ran += 1
    assert ran >= 4


@pytest.mark.parametrize("block", [b for b in readme_blocks() if b.lang == "python"], ids=lambda b: f"block{b.index}")
def test_python_blocks_are_lint_clean_enough_to_paste(block: Block) -> None:
    compile(block.body, f"README block {block.index}", "exec")
