"""messages.jsonl: every message a model request sent, stored once, referenced by runs of positions."""

from __future__ import annotations

from pathlib import Path

from qitos.core._exchange import ExchangeLog
from qitos.core.context import ContextContribution
from qitos.core.request_view import RequestView
from qitos.trace._reader import RunTrace
from qitos.trace._writer import MESSAGES_FILE, TraceWriter, message_runs

SYSTEM = [{"role": "system", "content": "You are terse."}]
KEY = "sk-live-0123456789abcdefSECRET"


def test_message_runs_fold_consecutive_positions() -> None:
    assert message_runs([0, 1, 2, 7, 8, 3]) == [[0, 2], [7, 8], [3, 3]]
    assert message_runs([]) == []


def test_each_message_is_stored_once_and_every_request_reads_back_what_it_sent(tmp_path: Path) -> None:
    writer = TraceWriter(str(tmp_path))
    run_dir = writer.start("run-1", {})
    log = ExchangeLog(log_id="log-1")
    ex = log.open([{"role": "user", "content": "What is 2 + 3?"}])
    first = RequestView.from_exchange_log(log, instructions=SYSTEM)
    refs_1 = writer.request_messages(first)
    log.record_output(
        ex.exchange_id,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}],
        },
    )
    log.record_tool_result(ex.exchange_id, "c1", "5")
    log.close(ex.exchange_id)
    log.open([])
    second = RequestView.from_exchange_log(log, instructions=SYSTEM)
    refs_2 = writer.request_messages(second)
    writer.finish("completed", {})

    assert refs_1 == [[0, 1]]
    assert refs_2 == [[0, 3]]  # the system prompt and the task are not written again
    lines = (Path(run_dir) / MESSAGES_FILE).read_text(encoding="utf-8").splitlines()
    assert len(lines) == 4
    trace = RunTrace(run_dir)
    assert trace.request_messages(refs_1) == first.messages()
    assert trace.request_messages(refs_2) == second.messages()


def test_secret_context_and_api_keys_never_reach_messages_jsonl(tmp_path: Path) -> None:
    writer = TraceWriter(str(tmp_path), secrets=[KEY])
    run_dir = writer.start("run-2", {})
    log = ExchangeLog(log_id="log-2")
    log.open([{"role": "user", "content": f"my key is {KEY}"}])
    secret = ContextContribution(
        contribution_id="vault", source="vault", content="the launch code is 0000", sensitivity="secret"
    )
    view = RequestView.from_exchange_log(log, instructions=SYSTEM, context_contributions=[secret])
    refs = writer.request_messages(view)
    writer.finish("completed", {})

    text = (Path(run_dir) / MESSAGES_FILE).read_text(encoding="utf-8")
    assert KEY not in text and "launch code" not in text
    messages = RunTrace(run_dir).request_messages(refs)
    [placeholder] = [m for m in messages if m.get("secret")]
    assert "vault" in placeholder["content"] and secret.digest in placeholder["content"]
    assert messages[-1]["content"] == "my key is [REDACTED]"


def test_a_run_that_never_called_a_model_writes_no_messages_file(tmp_path: Path) -> None:
    writer = TraceWriter(str(tmp_path))
    run_dir = writer.start("run-3", {})
    writer.finish("completed", {})
    assert not (Path(run_dir) / MESSAGES_FILE).exists()
    assert RunTrace(run_dir).request_messages([]) == []
