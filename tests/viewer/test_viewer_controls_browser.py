"""The viewer's controls in headless Chromium: a person approves, rejects, steers, pauses and
resumes from the session page opened at the address ``qitos trace serve`` prints; a page on
another origin that tries the same (with or without the token) changes nothing."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from controls_support import control_items, lifecycle, make_session
from viewer_support import CHROMIUM, LAUNCH_ARGS

from qitos.viewer._server import ViewerServer

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed"),
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        yield instance
        instance.close()


@pytest.fixture
def base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def viewer(base: Path) -> Iterator[ViewerServer]:
    with ViewerServer(str(base / "runs"), db=str(base / "sessions.db"), port=0) as srv:
        yield srv


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A tab of the viewer; script errors and CSP violations fail the test."""
    problems: list[str] = []
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    tab.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    tab.on("console", lambda msg: problems.append(f"console {msg.type}: {msg.text}") if msg.type == "error" else None)
    tab.set_default_timeout(20_000)
    yield tab
    context.close()
    assert not problems, problems


def _session_page(page: Any, viewer: ViewerServer, session_id: str, *, with_token: bool = True) -> None:
    url = viewer.control_url if with_token else viewer.url
    page.goto(f"{url}#/sessions/{session_id}")
    page.wait_for_selector("#controls")


def _wait_for(predicate: Any, what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_approve_then_resume_from_the_page_finishes_the_session(page: Any, viewer: ViewerServer, base: Path) -> None:
    session_id = make_session(base)
    _session_page(page, viewer, session_id)
    assert "token=" not in page.url  # taken out of the address bar, kept for this tab
    page.click('tr[data-call="call-publish"] button.approve')
    page.wait_for_selector("#control-answer:has-text('approve: done')")
    assert f"qitos sessions resume {session_id} --db" in page.inner_text("#control-answer")
    page.click("#resume")
    page.wait_for_selector("#control-answer:has-text('resumed in a new process')")
    page.wait_for_selector(".title-row .badge:has-text('completed')", timeout=90_000)
    assert lifecycle(base / "sessions.db", session_id) == "completed"
    assert page.locator("#controls").inner_text().count("has ended") == 1  # no buttons for an ended session


def test_reject_with_a_reason_steer_and_pause_from_the_page(page: Any, viewer: ViewerServer, base: Path) -> None:
    session_id = make_session(base)
    _session_page(page, viewer, session_id)
    page.fill("#steer-text", "say it kindly")
    page.click("#steer")
    page.wait_for_selector("#control-answer:has-text('steer: done')")
    page.click("#pause")
    page.wait_for_selector("#control-answer:has-text('pause: done')")
    page.fill('tr[data-call="call-publish"] input.reason', "not today")
    page.click('tr[data-call="call-publish"] button.reject')
    page.wait_for_selector("#control-answer:has-text('reject: done')")
    assert control_items(base / "sessions.db", session_id) == ["steer", "pause", "reject"]


def test_a_delegated_childs_call_is_approved_from_the_parents_page(page: Any, viewer: ViewerServer, base: Path) -> None:
    lead = make_session(base, "lead")
    _session_page(page, viewer, lead)
    row = page.locator('tr[data-call="call-publish"]')
    assert "in delegated" in row.inner_text()
    row.locator("button.approve").click()
    page.wait_for_selector("#control-answer:has-text('approve: done')")
    page.click("#resume")
    page.wait_for_selector(".title-row .badge:has-text('completed')", timeout=90_000)


def test_without_the_token_the_page_says_where_to_open_it(page: Any, viewer: ViewerServer, base: Path) -> None:
    session_id = make_session(base)
    _session_page(page, viewer, session_id, with_token=False)
    assert "address qitos trace serve printed" in page.inner_text("#controls")
    assert page.locator("#controls button").count() == 0


ATTACK = """<!doctype html><html><body><h1>cute cats</h1><iframe name="sink"></iframe>
<script>
window.results = {};
const viewer = "VIEWER";
const target = viewer + "api/sessions/SESSION/approve";
const body = JSON.stringify({call_id: "call-publish"});
async function attempt(name, run) {
  try { window.results[name] = await run(); } catch (e) { window.results[name] = "blocked"; }
}
(async () => {
  await attempt("cors_json_guessed_token", async () => (await fetch(target, {method: "POST",
    headers: {"Content-Type": "application/json", "X-Qitos-Token": "guess"}, body})).status);
  await attempt("cors_json_leaked_token", async () => (await fetch(target, {method: "POST",
    headers: {"Content-Type": "application/json", "X-Qitos-Token": "TOKEN"}, body})).status);
  await attempt("no_cors_text", async () => { await fetch(target, {method: "POST", mode: "no-cors",
    headers: {"Content-Type": "text/plain"}, body}); return "sent"; });
  await attempt("no_cors_resume", async () => { await fetch(viewer + "api/sessions/SESSION/resume",
    {method: "POST", mode: "no-cors", body: "{}"}); return "sent"; });
  await attempt("read_the_page", async () => (await fetch(viewer)).text());
  const form = document.createElement("form");
  form.method = "POST"; form.action = target; form.enctype = "text/plain"; form.target = "sink";
  const field = document.createElement("input");
  field.name = '{"call_id": "call-publish", "x": "'; field.value = '"}';
  form.appendChild(field); document.body.appendChild(form); form.submit();
  window.results.form = "submitted";
})();
</script></body></html>"""


@pytest.fixture
def attacker() -> Iterator[tuple[ThreadingHTTPServer, list[str]]]:
    """A page on another origin (another port of 127.0.0.1) that attacks the viewer."""
    pages: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            body = pages[0].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, pages
    server.shutdown()
    server.server_close()


def test_a_page_on_another_origin_cannot_trigger_any_control(
    browser: Any, viewer: ViewerServer, base: Path, attacker: tuple[ThreadingHTTPServer, list[str]]
) -> None:
    session_id = make_session(base)
    server, pages = attacker
    # Even a leaked token does not help a page on another origin.
    pages.append(ATTACK.replace("VIEWER", viewer.url).replace("SESSION", session_id).replace("TOKEN", viewer.token))
    context = browser.new_context()
    tab = context.new_page()
    tab.goto(f"http://127.0.0.1:{server.server_address[1]}/")
    tab.wait_for_function("window.results && window.results.form === 'submitted'", timeout=20_000)
    results = tab.evaluate("window.results")
    time.sleep(1.0)  # let the form post and the no-cors requests land
    context.close()
    assert results["cors_json_guessed_token"] == "blocked"  # the preflight is never granted
    assert results["cors_json_leaked_token"] == "blocked"
    assert results["read_the_page"] == "blocked"  # no CORS: the page cannot be read across origins
    db = base / "sessions.db"
    assert control_items(db, session_id) == []
    assert lifecycle(db, session_id) == "awaiting_approval"
    assert not (base / "runs" / ".viewer").exists()  # no resume was started
