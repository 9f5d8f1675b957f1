"""``--otel`` on ``qitos demo``, ``qitos run`` and ``qitos sessions resume``: spans over OTLP/HTTP to a
real receiver on 127.0.0.1 (configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from otlp_receiver import Receiver, otlp_receiver


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Any:
    for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_SERVICE_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with otlp_receiver() as server:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", server.url)
        yield server


def test_demo_and_resume_with_otel_export_linked_runs_of_one_session(
    cli: Any, workdir: Path, receiver: Receiver
) -> None:
    data = cli.json("demo", "--policy", "scripted", "--json", "--otel", "--workspace", "ws", "--db", "s.db")
    assert data["status"] == "completed"
    (first,) = receiver.named("invoke_agent")
    assert first.name == "invoke_agent NotesAgent"
    assert first.attributes["qitos.session.id"] == data["session_id"]
    assert len(receiver.named("qitos.step")) == data["steps"]
    assert {s.attributes["gen_ai.tool.name"] for s in receiver.named("execute_tool")} >= {"list_files", "read_file"}

    resumed = cli.json("sessions", "resume", data["session_id"], "--db", "s.db", "--json", "--otel")
    assert resumed["session_id"] == data["session_id"]
    second = next(s for s in receiver.named("invoke_agent") if s.span_id != first.span_id)
    assert second.links == [(first.trace_id, first.span_id)]
    assert second.attributes["qitos.run.resumed"] is True


def test_run_without_otel_sends_nothing(cli: Any, workdir: Path, receiver: Receiver) -> None:
    cli.json("run", "cli_agents:ApprovalAgent", "say hello", "--json", "--session-db", "s.db")
    assert receiver.spans == []


def test_run_with_otel_exports_the_run(cli: Any, workdir: Path, receiver: Receiver) -> None:
    data = cli.json("run", "cli_agents:ApprovalAgent", "say hello", "--json", "--otel", "--session-db", "s.db")
    (run,) = receiver.named("invoke_agent")
    assert run.attributes["qitos.session.id"] == data["session_id"]
    assert run.attributes["qitos.stop_reason"] == "awaiting_approval"
    events = [name for span in receiver.named("qitos.step") for name, _ in span.events]
    assert "qitos.approval" in events
