"""Every fenced block of README.md, and of every page of the documentation site (``docs/``),
runs as written; so does every program in ``examples/``.

Each document's blocks are extracted in order and run in one empty directory, the way a reader
pastes them: python blocks as files run with ``python`` (``file=NAME`` in a
``<!-- readme-test: ... -->`` comment right above a block, ``<!-- docs-test: ... -->`` on a docs
page, names its file, so later blocks can import it), bash blocks line by line (each a ``qitos``
command, or ``pytest`` on a page about testing). ``expect="TEXT"`` must appear in the block's
output. ``server=openai`` starts a real
OpenAI-compatible chat server on 127.0.0.1 for the block and points ``OPENAI_BASE_URL`` /
``OPENAI_API_KEY`` at it; ``server=otlp`` starts an OTLP/HTTP receiver on 127.0.0.1, sets
``OTEL_EXPORTER_OTLP_ENDPOINT`` and checks that spans arrived; ``server=postgres`` sets
``QITOS_DB`` to a ``postgresql://`` URL on a fresh schema of the tests' PostgreSQL server.
``text`` blocks are not code. The README's first block is the set-up pair of commands: it is
checked verbatim, not run (it installs packages, and ``scripts/test.sh`` is what runs this suite).
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
DOCS = sorted((ROOT / "docs").rglob("*.md"))
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
SETUP = [
    "bash scripts/demo.sh    # install qitos with the embedded local model and run the demo agent (local SQLite store)",
    "bash scripts/test.sh    # install everything the tests need and run the whole suite (ruff, mypy, pytest)",
]
_FENCE = re.compile(
    r"(?:<!-- (?:readme|docs)-test: (?P<directive>[^\n]*?) -->\n)?```(?P<lang>[a-z]*)\n(?P<body>.*?)\n```", re.S
)


@dataclass
class Block:
    index: int
    lang: str
    body: str
    options: dict[str, str] = field(default_factory=dict)


def readme_blocks() -> list[Block]:
    return document_blocks(README)


def document_blocks(path: Path) -> list[Block]:
    blocks = []
    for i, match in enumerate(_FENCE.finditer(path.read_text(encoding="utf-8"))):
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


def _page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_every_block_is_python_bash_or_text() -> None:
    blocks = readme_blocks()
    assert sum(b.lang == "python" for b in blocks) >= 3
    for path in [README, *DOCS]:
        langs = [b.lang for b in document_blocks(path)]
        assert set(langs) <= {"python", "bash", "text"}, (_page_id(path), langs)


def run_blocks(name: str, blocks: list[Block], cwd: Path, *, postgres: str | None = None) -> int:
    """Run ``blocks`` in order in ``cwd`` (see the module docstring); how many ran."""
    ran = 0
    for block in blocks:
        if block.lang == "text":
            continue
        expect = block.options.get("expect")
        server = block.options.get("server")
        extra = {"QITOS_DB": postgres} if server == "postgres" and postgres else {}
        if block.lang == "python":
            file_name = block.options.get("file", f"block_{block.index}.py")
            (cwd / file_name).write_text(block.body + "\n", encoding="utf-8")
            if server == "openai":
                with LoopbackChatServer() as chat:
                    chat.push(*[json_reply(completion("Hello")) for _ in range(3)])
                    env = _env({"OPENAI_BASE_URL": chat.url, "OPENAI_API_KEY": "sk-readme-test"})
                    out = _run([sys.executable, file_name], cwd, env)
                    assert chat.requests, f"{name} block {block.index} did not talk to the server"
            else:
                out = _run([sys.executable, file_name], cwd, _env(extra))
        else:
            lines = block.body.splitlines()
            for line in lines:
                assert line.startswith(("qitos ", "pytest ")), f"{name} bash block {block.index}: {line!r}"
            if server == "otlp":
                with otlp_receiver() as receiver:
                    env = _env({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url})
                    out = "".join(_run(["bash", "-c", line], cwd, env) for line in lines)
                assert receiver.named("invoke_agent"), f"{name} block {block.index} sent no spans"
            else:
                out = "".join(_run(["bash", "-c", line], cwd, _env(extra)) for line in lines)
        if expect is not None:
            assert expect in out, f"{name} block {block.index}: {expect!r} not in its output:\n{out}"
        ran += 1
    return ran


def test_every_readme_block_runs_as_written(tmp_path: Path) -> None:
    assert run_blocks("README", readme_blocks()[1:], tmp_path) >= 4


@pytest.mark.parametrize("page", DOCS, ids=_page_id)
def test_every_block_of_a_docs_page_runs_as_written(page: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    blocks = document_blocks(page)
    postgres = None
    if any(b.options.get("server") == "postgres" for b in blocks):
        from pg_server import drop_schema, fresh_schema

        dsn = request.getfixturevalue("pg_dsn")
        schema = fresh_schema()
        postgres = f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"
        request.addfinalizer(lambda: drop_schema(dsn, schema))
        request.addfinalizer(lambda: drop_schema(dsn, f"{schema}_dbos"))
    run_blocks(_page_id(page), blocks, tmp_path, postgres=postgres)


@pytest.mark.parametrize(
    "document", [p for p in [README, *DOCS] if any(b.lang == "python" for b in document_blocks(p))], ids=_page_id
)
def test_python_blocks_pass_the_projects_linter(document: Path, tmp_path: Path) -> None:
    """The python blocks, written out as the files a reader would paste, pass ``ruff check`` with the
    project's own rules. Imports sort as in the repository's examples: the standard library, other
    packages, qitos, then the reader's own files (the earlier blocks' ``file=NAME`` modules)."""
    blocks = [b for b in document_blocks(document) if b.lang == "python"]
    pytest.importorskip("ruff", reason="the dev extra installs ruff")
    for block in blocks:
        file_name = block.options.get("file", f"block_{block.index}.py")
        (tmp_path / file_name).write_text(block.body + "\n", encoding="utf-8")
    own = sorted(b.options["file"].removesuffix(".py") for b in blocks if "file" in b.options)
    command = [sys.executable, "-m", "ruff", "check", "--no-cache", "--config", str(ROOT / "pyproject.toml")]
    command += ["--config", "lint.isort.known-first-party = ['qitos']"]
    command += ["--config", f"lint.isort.known-local-folder = {own!r}", "."]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_runs_and_prints_what_it_says(example: Path, tmp_path: Path) -> None:
    """``python examples/NAME.py`` from an empty directory prints its ``# prints:`` line."""
    (expected,) = re.findall(r"^# prints: (.*)$", example.read_text(encoding="utf-8"), re.M)
    out = _run([sys.executable, str(example)], tmp_path, _env({}))
    assert expected in out, out
