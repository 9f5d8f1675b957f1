"""``qitos eval run --replay/--on-divergence/--cache`` and ``qitos eval cache clear`` in real subprocesses.

The model is the loopback chat server of ``tests/eval/chat_server.py``, which counts its requests.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from test_cli_eval import EVAL_TESTS, qitos_eval

if str(EVAL_TESTS) not in sys.path:
    sys.path.insert(0, str(EVAL_TESTS))

from chat_server import ScriptServer

ROWS = [{"id": f"s{i}", "input": w, "target": w.upper()} for i, w in enumerate(("alpha one", "beta two"))]


def _data(cwd: Path) -> None:
    (cwd / "words.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))


def test_replay_from_the_command_line_reports_divergences_and_calls_no_model(tmp_path: Path) -> None:
    _data(tmp_path)
    with ScriptServer() as server:
        model = ["--model", "openai:m", "--base-url", server.url]
        run = ["run", "words.jsonl", "--scorer", "exact", "--json"]
        live = json.loads(
            qitos_eval(tmp_path, *run, "--agent", "replay_agents:Prompted", *model, "--name", "live").stdout
        )
        assert live["metrics"]["exact"]["mean"] == 1.0 and server.calls == 6
        marked = qitos_eval(
            tmp_path,
            *run,
            "--agent",
            "replay_agents:Reworded",
            "--replay",
            "live",
            "--on-divergence",
            "mark",
            "--name",
            "reworded",
        )
        report = json.loads(marked.stdout)
        assert server.calls == 6  # no --model and no call: the recording answered
        assert [s["divergence"]["step"] for s in report["samples"]] == [0, 0]
        assert report["samples"][0]["divergence"]["diff"]["system"]["line"] == 2
        assert report["pins"]["replay"] == {"eval_id": live["eval_id"], "on_divergence": "mark"}
        shown = qitos_eval(tmp_path, "show", "reworded")  # the table marks diverged samples
        assert "diverged at step 0" in shown.stdout
        # the eval's command line is recorded: resuming it replays again
        resumed = json.loads(qitos_eval(tmp_path, "resume", "reworded", "--json").stdout)
        assert resumed["status"] == "complete" and server.calls == 6


def test_an_unknown_divergence_policy_and_a_missing_replay_source_are_usage_errors(tmp_path: Path) -> None:
    _data(tmp_path)
    bad = qitos_eval(
        tmp_path,
        "run",
        "words.jsonl",
        "--agent",
        "replay_agents:Prompted",
        "--replay",
        "x",
        "--on-divergence",
        "skip",
        check=2,
    )
    assert "--on-divergence takes stop, live, mark, got 'skip'" in bad.stderr
    missing = qitos_eval(
        tmp_path, "run", "words.jsonl", "--agent", "replay_agents:Prompted", "--replay", "nope", check=2
    )
    assert "cannot replay from eval 'nope': there is no such eval" in missing.stderr


def test_cache_then_cache_clear(tmp_path: Path) -> None:
    _data(tmp_path)
    with ScriptServer() as server:
        args = [
            "run",
            "words.jsonl",
            "--agent",
            "replay_agents:Prompted",
            "--model",
            "openai:m",
            "--base-url",
            server.url,
            "--cache",
            "--json",
        ]
        qitos_eval(tmp_path, *args, "--name", "one")
        qitos_eval(tmp_path, *args, "--name", "two")
        assert server.calls == 6
        cleared = qitos_eval(tmp_path, "cache", "clear")
        assert "cleared 6 cached model replies" in cleared.stdout
        qitos_eval(tmp_path, *args, "--name", "three")
        assert server.calls == 12
        assert json.loads(qitos_eval(tmp_path, "cache", "clear", "--json").stdout) == {"cleared": 6}
