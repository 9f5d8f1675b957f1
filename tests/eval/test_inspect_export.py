"""qitos eval export --format inspect: an inspect_ai log written by inspect_ai's own writer, read
back with ``inspect_ai.log.read_eval_log`` (both in subprocesses: inspect_ai stays out of the test
process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from replay_agents import Prompted

import qitos
from qitos.eval import Dataset, Sample, evaluate, scorers
from qitos.models import FunctionModel

HERE = Path(__file__).resolve().parent
READ_BACK = """
import json, sys
from inspect_ai.log import read_eval_log
log = read_eval_log(sys.argv[1])
print(json.dumps({
    "status": log.status,
    "task": log.eval.task,
    "model": log.eval.model,
    "epochs": log.eval.config.epochs,
    "samples": [
        {
            "id": s.id,
            "epoch": s.epoch,
            "input": s.input,
            "target": s.target,
            "scores": {k: v.value for k, v in (s.scores or {}).items()},
            "roles": [m.role for m in s.messages],
            "tool_calls": [c.function for m in s.messages if m.role == "assistant" for c in (m.tool_calls or [])],
            "output": s.output.completion,
            "tokens": {k: [u.input_tokens, u.output_tokens, u.total_tokens] for k, u in s.model_usage.items()},
            "session": s.metadata.get("qitos_session"),
        }
        for s in log.samples
    ],
    "metrics": {s.name: {k: m.value for k, m in s.metrics.items()} for s in log.results.scores},
    "usage": {k: [u.input_tokens, u.output_tokens, u.total_tokens] for k, u in log.stats.model_usage.items()},
}))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(qitos.__file__).resolve().parents[1]), str(HERE)])
    return env


def _qitos(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "qitos.cli.app", "eval", *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _model() -> FunctionModel:
    def reply(messages: list[dict[str, Any]]) -> Any:
        if not any(m["role"] == "tool" for m in messages):
            return {
                "tool_calls": [{"name": "lookup", "arguments": {"word": "x"}}],
                "usage": {"input_tokens": 7, "output_tokens": 3},
            }
        task = next(m["content"] for m in messages if m["role"] == "user")
        word = "alpha" if "alpha" in task else "beta" if "beta" in task else "nope"
        return {"text": word.upper(), "usage": {"input_tokens": 11, "output_tokens": 2}}

    return FunctionModel(reply, takes="messages", model_id="fn-model")


def test_an_eval_exported_for_inspect_reads_back_with_its_samples_scores_and_tokens(tmp_path: Path) -> None:
    db = tmp_path / "evals.db"
    data = Dataset(
        [Sample("alpha", "ALPHA", id="a"), Sample("beta", ["BETA", "B"], id="b"), Sample("gamma", "GAMMA", id="c")],
        name="greek",
    )
    report = evaluate(
        Prompted, data, scorers=[scorers.exact(), scorers.includes()], model=_model(), store=str(db), name="greek-v1"
    )
    assert report.total_tokens == 3 * (10 + 13)
    out = tmp_path / "greek.eval"
    done = _qitos(tmp_path, "export", "greek-v1", "--format", "inspect", str(out), "--db", str(db))
    assert done.returncode == 0, done.stderr
    assert f"wrote eval greek-v1 as an inspect_ai log: {out}" in done.stdout and out.is_file()
    read = subprocess.run([sys.executable, "-c", READ_BACK, str(out)], capture_output=True, text=True, timeout=300)
    assert read.returncode == 0, read.stderr
    log = json.loads(read.stdout)
    assert (log["status"], log["task"], log["model"], log["epochs"]) == ("success", "greek-v1", "qitos/fn-model", 1)
    assert [s["id"] for s in log["samples"]] == ["a", "b", "c"]
    assert [s["scores"] for s in log["samples"]] == [
        {"exact": True, "includes": True},
        {"exact": True, "includes": True},
        {"exact": False, "includes": False},
    ]
    first = log["samples"][0]
    assert first["input"] == "alpha" and first["target"] == "ALPHA" and first["output"] == "ALPHA"
    assert log["samples"][1]["target"] == ["BETA", "B"]
    assert first["roles"] == ["system", "user", "assistant", "tool", "assistant"] and first["tool_calls"] == ["lookup"]
    assert first["tokens"] == {"qitos/fn-model": [18, 5, 23]}
    assert first["session"] == report.samples[0].session_id
    assert log["usage"] == {"qitos/fn-model": [54, 15, 69]}
    assert log["metrics"]["exact"]["mean"] == report.metrics["exact"]["mean"]
    assert log["metrics"]["exact"]["stderr"] == report.metrics["exact"]["stderr"]


def test_exporting_a_missing_eval_or_to_an_unknown_format_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "evals.db"
    evaluate(
        Prompted,
        Dataset([Sample("alpha", "ALPHA", id="a")]),
        scorers=[scorers.exact()],
        model=_model(),
        store=str(db),
        name="x",
    )
    missing = _qitos(tmp_path, "export", "nope", str(tmp_path / "o.eval"), "--db", str(db))
    assert missing.returncode == 3 and "no eval 'nope'" in missing.stderr
    unknown = _qitos(tmp_path, "export", "x", str(tmp_path / "o.json"), "--format", "langsmith", "--db", str(db))
    assert unknown.returncode == 2 and "--format takes inspect" in unknown.stderr
    assert not (tmp_path / "o.eval").exists() and not (tmp_path / "o.json").exists()
