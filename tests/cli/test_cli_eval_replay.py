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


def test_compare_two_evals_as_a_table_and_as_json(tmp_path: Path) -> None:
    rows = [{"id": w, "input": w, "target": w.upper()} for w in ("alpha", "beta", "bravo", "gamma")]
    (tmp_path / "words.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    first = json.loads(
        qitos_eval(tmp_path, "run", "words.jsonl", "--agent", "eval_agents:Upper", "--name", "upper", "--json").stdout
    )
    qitos_eval(tmp_path, "run", "words.jsonl", "--agent", "replay_agents:Lowering", "--name", "lower", "--json")
    table = qitos_eval(tmp_path, "compare", "upper", "lower").stdout
    assert "eval lower (B) against upper (A)" in table and "-0.500" in table
    assert "exact: beta pass -> fail" in table
    data = json.loads(qitos_eval(tmp_path, "compare", "upper", "lower", "--json").stdout)
    exact = data["scorers"]["exact"]
    assert exact["difference"] == -0.5 and exact["mcnemar"] == {"a_only": 2, "b_only": 0, "p_value": 0.5}
    assert exact["flips"]["pass_to_fail"][0]["a_sessions"] == [first["samples"][1]["session_id"]]
    (tmp_path / "other.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    qitos_eval(tmp_path, "run", "other.jsonl", "--agent", "eval_agents:Upper", "--name", "short", "--json")
    refused = qitos_eval(tmp_path, "compare", "upper", "short", check=2)
    assert "different datasets" in refused.stderr and "--allow-different-datasets" in refused.stderr
    allowed = json.loads(
        qitos_eval(tmp_path, "compare", "upper", "short", "--allow-different-datasets", "--json").stdout
    )
    assert allowed["only_a"] == ["bravo", "gamma"] and allowed["paired"] == ["alpha", "beta"]
    missing = qitos_eval(tmp_path, "compare", "upper", "nope", check=3)
    assert "no eval 'nope'" in missing.stderr


def test_rescoring_replays_the_judge_it_recorded(tmp_path: Path) -> None:
    rows = [{"id": w, "input": w, "target": w.upper()} for w in ("alpha", "beta")]
    (tmp_path / "words.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "correct.json").write_text(json.dumps(["Right.\nGRADE: C", "Right.\nGRADE: C"]))
    (tmp_path / "incorrect.json").write_text(json.dumps(["Wrong.\nGRADE: I", "Wrong.\nGRADE: I"]))
    qitos_eval(tmp_path, "run", "words.jsonl", "--agent", "eval_agents:Upper", "--name", "judged", "--json")
    judge = ["--scorer", "model_graded", "--json"]
    first = json.loads(qitos_eval(tmp_path, "score", "judged", *judge, "--model", "scripted:correct.json").stdout)
    assert first["metrics"]["model_graded"]["mean"] == 1.0
    # the judge now would answer I: replaying its recorded replies keeps C, asking it gives I
    replayed = qitos_eval(
        tmp_path, "score", "judged", *judge, "--model", "scripted:incorrect.json", "--replay", "judged"
    )
    assert json.loads(replayed.stdout)["metrics"]["model_graded"]["mean"] == 1.0
    asked = json.loads(qitos_eval(tmp_path, "score", "judged", *judge, "--model", "scripted:incorrect.json").stdout)
    assert asked["metrics"]["model_graded"]["mean"] == 0.0
