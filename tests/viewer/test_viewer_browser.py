"""The viewer in a real headless browser: Debian chromium driven by Playwright for Python.

Screenshots go to ``test-artifacts/viewer/`` at the repository root (gitignored). Every page is
checked for script errors and Content-Security-Policy violations.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from viewer_support import CHROMIUM, HOSTILE, LAUNCH_ARGS, ViewerData

from qitos.trace import TraceWriter
from qitos.viewer._server import ViewerServer

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "viewer"

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
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
def problems() -> list[str]:
    """Script errors, console errors and CSP violations seen by the page (must stay empty)."""
    return []


@pytest.fixture
def page(browser: Any, server: ViewerServer, problems: list[str]) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    tab.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    tab.on("console", lambda msg: problems.append(f"console {msg.type}: {msg.text}") if msg.type == "error" else None)
    tab.set_default_timeout(10_000)
    yield tab
    context.close()
    assert not problems, problems


def _shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def _open(page: Any, server: ViewerServer, route: str, ready: str) -> None:
    page.goto(server.url + route)
    page.wait_for_selector(ready)


def test_board_lists_runs_and_sessions_with_filter_and_sort(
    page: Any, server: ViewerServer, viewer_data: ViewerData, api: Any
) -> None:
    expected = len(api("/api/runs")[2]["runs"])
    _open(page, server, "#/", "#runs-table tbody tr")
    page.wait_for_selector("#sessions-table tbody tr")
    runs = page.locator("#runs-table tbody tr")
    assert runs.count() == expected >= 5
    assert page.locator("#sessions-table tbody tr").count() == 4
    _shot(page, "board")

    page.fill("#filter", "through the model")
    assert runs.count() == 1
    assert runs.first.get_attribute("data-run") == viewer_data.compacted_run
    page.fill("#filter", "")
    page.select_option("#status-filter", "running")
    assert runs.count() == 1 and runs.first.get_attribute("data-run") == viewer_data.live_run
    page.select_option("#status-filter", "")

    page.click("#runs-table th:nth-child(5) button")  # Steps, ascending
    steps = [int(t) for t in page.locator("#runs-table tbody tr td:nth-child(5)").all_inner_texts()]
    assert steps == sorted(steps) and len(steps) == expected
    page.click("#runs-table th:nth-child(5) button")  # and descending
    steps = [int(t) for t in page.locator("#runs-table tbody tr td:nth-child(5)").all_inner_texts()]
    assert steps == sorted(steps, reverse=True)


def test_run_page_shows_the_timeline_and_each_steps_details(
    page: Any, server: ViewerServer, viewer_data: ViewerData, api: Any
) -> None:
    _open(page, server, "#/", f'tr[data-run="{viewer_data.compacted_run}"] a')
    page.click(f'tr[data-run="{viewer_data.compacted_run}"] a')
    page.wait_for_selector("details.step")
    assert page.locator("details.step").count() == 8
    step = page.locator('details.step[data-step="1"]')
    step.locator("summary").click()
    body = step.locator(".step-body")
    for heading in ("Decision", "Actions", "Observations", "State diff", "Model", "Request"):
        assert body.locator("h3", has_text=heading).count() == 1, heading
    assert "sessions.md" in body.inner_text()  # the scripted model reads in reverse order
    assert body.locator(".budget-bar .seg.used").count() == 1
    assert "1 receipt" in page.locator('details.step[data-step="5"] summary').inner_text()
    _shot(page, "run")
    _, _, events = api(f"/api/runs/{viewer_data.compacted_run}/events")
    page.click("details.events > summary")
    page.wait_for_selector(".events-table tbody tr")
    assert page.locator(".events-table tbody tr").count() == len(events["events"])
    assert page.locator(".events-table .badge", has_text="compaction").count() >= 1
    _shot(page, "run-events")


def test_request_inspector_shows_selection_budget_and_every_receipt(
    page: Any, server: ViewerServer, viewer_data: ViewerData, api: Any
) -> None:
    _, _, detail = api(f"/api/runs/{viewer_data.compacted_run}")
    last = [s for s in detail["steps"] if s.get("request_view")][-1]
    assert last["step_id"] == 5
    view = last["request_view"]
    _open(page, server, f"#/runs/{viewer_data.compacted_run}", 'details.step[data-step="5"]')
    page.locator('details.step[data-step="5"] summary').click()
    page.click('details.step[data-step="5"] a.button')
    page.wait_for_selector(".receipt")
    assert page.locator(".idlist.omitted li").count() == len(view["exchanges"]["omitted"])
    assert page.locator(".idlist.selected li").count() == len(view["exchanges"]["selected"])
    assert page.locator(".idlist.protected li").count() == len(view["exchanges"]["protected"])
    receipts = page.locator(".receipt")
    assert receipts.count() == len(view["receipts"])
    text = receipts.first.inner_text()
    receipt = view["receipts"][0]
    assert receipt["receipt_id"] in text and receipt["policy_id"] in text
    assert receipt["declared_losses"][0] in text
    assert page.locator(".budget-bar .seg").count() == 3
    assert f"selected {view['units']['used']:,}" in page.locator(".budget-legend").first.inner_text()
    _shot(page, "request-inspector")


def _run_label(run: Any) -> str:
    first, last = run if isinstance(run, list) else (run, run)
    return first if first == last else f"{first} \u2013 {last}"  # an en dash


def test_omitted_ranges_and_receipts_show_as_ranges_not_concatenated_ids(
    page: Any, server: ViewerServer, viewer_data: ViewerData, api: Any
) -> None:
    _, _, detail = api(f"/api/runs/{viewer_data.compacted_run}")
    view = [s for s in detail["steps"] if s.get("request_view")][-1]["request_view"]
    omitted = view["exchanges"]["omitted"]
    assert omitted and all(isinstance(run, list) for run in omitted)  # the stored compact form
    _open(page, server, f"#/runs/{viewer_data.compacted_run}", 'details.step[data-step="5"]')
    page.locator('details.step[data-step="5"] summary').click()
    page.click('details.step[data-step="5"] a.button')
    page.wait_for_selector(".receipt")
    chips = page.locator(".idlist.omitted li").all_inner_texts()
    assert chips == [_run_label(run) for run in omitted]
    count = page.locator(".idlist.omitted .count").inner_text()
    assert count == f"({view['exchanges']['omitted_count']})"
    receipt = view["receipts"][0]
    receipt_chips = page.locator(".receipt").first.locator(".chip").all_inner_texts()
    assert receipt_chips == [_run_label(run) for run in receipt["input_exchange_ids"]]
    assert all("," not in chip for chip in receipt_chips)


def test_a_script_in_a_tool_output_renders_as_text(page: Any, server: ViewerServer, viewer_data: ViewerData) -> None:
    _open(page, server, f"#/runs/{viewer_data.hostile_run}", "details.step")
    page.locator('details.step[data-step="0"] summary').click()
    output = page.locator('details.step[data-step="0"] .result pre.output')
    assert HOSTILE in output.inner_text()
    assert HOSTILE in page.locator('details.step[data-step="0"] dl.kv').first.inner_text()  # the rationale
    assert HOSTILE in page.locator("pre.answer").first.inner_text()  # the final answer
    assert page.locator("#app script, #app img, #app b").count() == 0
    assert page.evaluate("window.__pwned") is None
    assert "<script>alert(1)</script>" in page.locator("dl.kv").first.inner_text()  # the task
    _shot(page, "hostile-output-as-text")


def test_session_page_shows_the_fork_lineage_with_snapshots_and_integrity(
    page: Any, server: ViewerServer, viewer_data: ViewerData
) -> None:
    _open(page, server, "#/", f'tr[data-session="{viewer_data.child_session}"] a')
    page.click(f'tr[data-session="{viewer_data.child_session}"] a')
    page.wait_for_selector("ul.tree")
    nodes = page.locator("ul.tree li")
    assert nodes.count() == 2
    assert nodes.first.get_attribute("data-session") == viewer_data.parent_session
    current = page.locator("ul.tree li.current")
    assert current.get_attribute("data-session") == viewer_data.child_session
    assert "forked at" in current.inner_text()
    assert page.locator("ul.tree .badge", has_text="verified").count() == 2
    assert page.locator("ol.snapshots li").count() >= 1
    _shot(page, "session-lineage")
    page.click(f'ul.tree li[data-session="{viewer_data.parent_session}"] > .node a')
    page.wait_for_selector(f'ul.tree li.current[data-session="{viewer_data.parent_session}"]')


def test_session_page_shows_its_last_request_with_receipts(
    page: Any, server: ViewerServer, viewer_data: ViewerData
) -> None:
    _open(page, server, f"#/sessions/{viewer_data.model_session}", ".request-view")
    assert page.locator(".request-view .receipt").count() >= 1
    assert page.locator("table.grid tbody tr", has_text="list_files").count() >= 1  # the work graph
    _shot(page, "session-last-request")


def test_a_session_page_links_only_to_runs_with_a_trace(
    page: Any, server: ViewerServer, viewer_data: ViewerData, api: Any
) -> None:
    _open(page, server, f"#/sessions/{viewer_data.model_session}", "ol.snapshots")
    assert page.locator('a[href^="#/runs/"]').count() >= 1
    _open(page, server, f"#/sessions/{viewer_data.parent_session}", "ol.snapshots")
    (run_id,) = api(f"/api/sessions/{viewer_data.parent_session}")[2]["runs"]
    assert page.locator('a[href^="#/runs/"]').count() == 0  # its run wrote no trace: no "Not found" link
    assert page.locator("span.mono", has_text=run_id).count() == 1


def test_a_run_in_progress_updates_live_without_a_reload(
    page: Any, server: ViewerServer, viewer_data: ViewerData
) -> None:
    writer = TraceWriter(str(viewer_data.logdir))
    writer.start("run_browser_live", {"task": {"objective": "watch me"}, "agent": "LiveAgent"})
    step = {
        "decision": {"mode": "wait", "rationale": "thinking"},
        "actions": [],
        "results": [],
        "observation": {"results": []},
        "state_diff": [],
        "duration_ms": 2.0,
    }
    writer.step({"step_id": 0, **step})
    try:
        _open(page, server, "#/runs/run_browser_live", "details.step")
        assert page.locator("#live").is_visible()
        writer.step({"step_id": 1, **step})
        page.wait_for_selector('details.step[data-step="1"]')
        _shot(page, "live-run")
    finally:
        writer.finish("completed", {"stop_reason": "final", "steps": 2, "final_result": "watched"})
    page.wait_for_selector(".title-row .badge.b-completed")
    page.wait_for_selector("pre.answer")
    assert page.locator("#live").is_hidden()


def test_an_unknown_run_shows_a_not_found_page(page: Any, server: ViewerServer, problems: list[str]) -> None:
    _open(page, server, "#/runs/run_missing", ".error-card")
    assert "no run 'run_missing'" in page.locator(".error-card").inner_text()
    assert all("404" in p for p in problems)  # the browser logs the failed fetch itself
    problems.clear()
