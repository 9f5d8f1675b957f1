"""The request inspector shows what each request sent and every failed attempt (API and browser).

Two runs of a real engine with traces: one whose model calls a tool and answers, one whose model
is retried once and then rejected (the step never commits; the inspector reads the request from
the error event).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from viewer_support import get

from qitos import AgentModule, StateSchema, ToolRegistry, tool
from qitos.core._errors import ModelError
from qitos.core.request_view import RequestView
from qitos.engine._engine import Engine
from qitos.models._function import FunctionModel
from qitos.viewer._server import ViewerServer

CHROMIUM = "/usr/bin/chromium"


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


class ModelAgent(AgentModule[StateSchema, Any, Any]):
    def __init__(self, model: FunctionModel) -> None:
        super().__init__(tool_registry=ToolRegistry([add]), llm=model)

    def init_state(self, task: str, **kwargs: Any) -> StateSchema:
        return StateSchema(task=task, max_steps=4)

    def reduce(self, state: StateSchema, observation: Any, decision: Any) -> StateSchema:
        return state


def _answering(view: RequestView) -> Any:
    last = view.messages()[-1]
    if last["role"] == "tool":
        return f"The sum is {last['content']}."
    return {"tool_calls": [{"id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}]}


@dataclass
class Runs:
    logdir: Path
    ok_run: str
    failed_run: str


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    logdir = tmp_path_factory.mktemp("requests")
    ok = Engine(ModelAgent(FunctionModel(_answering)), trace_logdir=str(logdir)).run("What is 2 + 3?")

    def rejected(view: RequestView) -> Any:
        failing.emit(
            "model_retry",
            {"attempt": 1, "max_retries": 3, "delay_s": 0.5, "reason": "HTTP 503", "status_code": 503, "error": "busy"},
        )
        raise ModelError("m: HTTP 422: messages[1].content must be a string", status_code=422)

    failing = FunctionModel(rejected)
    before = set(logdir.iterdir())
    with contextlib.suppress(ModelError):
        Engine(ModelAgent(failing), trace_logdir=str(logdir)).run("What is 4 + 4?")
    [failed_dir] = set(logdir.iterdir()) - before
    return Runs(logdir=logdir, ok_run=str(ok.run_id), failed_run=failed_dir.name)


@pytest.fixture(scope="module")
def server(runs: Runs) -> Iterator[ViewerServer]:
    with ViewerServer(str(runs.logdir), port=0) as srv:
        yield srv


def test_the_request_endpoint_returns_the_messages_each_step_sent(server: ViewerServer, runs: Runs) -> None:
    status, _, first = get(server, f"/api/runs/{runs.ok_run}/steps/0/request")
    assert status == 200 and first["status"] == "ok"
    assert [m["role"] for m in first["messages"]] == ["user"]
    _, _, second = get(server, f"/api/runs/{runs.ok_run}/steps/1/request")
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "tool"]
    assert second["messages"][1]["tool_calls"][0]["name"] == "add"
    assert second["model"]["response"]["text"] == "The sum is 5."


def test_the_request_endpoint_returns_a_failed_request_with_its_attempts(server: ViewerServer, runs: Runs) -> None:
    status, _, failed = get(server, f"/api/runs/{runs.failed_run}/steps/0/request")
    assert status == 200 and failed["status"] == "failed"
    assert [(a["status_code"], a["final"]) for a in failed["attempts"]] == [(503, False), (422, True)]
    assert "must be a string" in failed["attempts"][1]["error"]
    assert "What is 4 + 4?" in failed["messages"][-1]["content"]


def test_the_request_endpoint_rejects_a_bad_step_and_a_step_without_a_request(server: ViewerServer, runs: Runs) -> None:
    assert get(server, f"/api/runs/{runs.ok_run}/steps/x/request")[0] == 400
    assert get(server, f"/api/runs/{runs.ok_run}/steps/9/request")[0] == 404


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed")
def test_the_inspector_page_shows_messages_and_failed_attempts(server: ViewerServer, runs: Runs) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    problems: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox"])
        try:
            page = browser.new_page()
            page.on("pageerror", lambda exc: problems.append(str(exc)))
            page.set_default_timeout(10_000)
            page.goto(f"{server.url}#/runs/{runs.ok_run}/steps/1/request")
            page.wait_for_selector("ol.messages li.message")
            assert page.locator("ol.messages li.message").count() == 3
            assert "answers c1" in page.locator("ol.messages li.role-tool").inner_text()

            page.goto(f"{server.url}#/runs/{runs.failed_run}/steps/0/request")
            page.wait_for_selector("table.attempts tbody tr")
            assert page.locator("table.attempts tbody tr").count() == 2
            assert "must be a string" in page.locator("table.attempts tr.final").inner_text()
            assert page.locator("ol.messages li.message").count() >= 1
            assert "failed" in page.locator("p.error").inner_text()
        finally:
            browser.close()
    assert not problems, problems
