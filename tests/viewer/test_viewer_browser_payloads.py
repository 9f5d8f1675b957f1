"""Script payloads stored in sessions render as text on the viewer's pages, in a real headless
browser (every page x every payload), over the store of ``hostile_support``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from hostile_support import PAYLOADS, build_hostile_store
from viewer_support import CHROMIUM, LAUNCH_ARGS

from qitos.viewer._server import ViewerServer

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed"),
]


@pytest.fixture(scope="module")
def hostile_viewer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ViewerServer, dict[str, str]]]:
    base = tmp_path_factory.mktemp("hostile_browser")
    ids = build_hostile_store(base / "s.db")
    (base / "runs").mkdir()
    with ViewerServer(str(base / "runs"), db=str(base / "s.db"), port=0) as srv:
        yield srv, ids


@pytest.fixture(scope="module")
def tab(hostile_viewer: tuple[ViewerServer, dict[str, str]]) -> Iterator[tuple[Any, list[str]]]:
    problems: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))

        def on_dialog(dialog: Any) -> None:
            problems.append(f"dialog: {dialog.message}")
            dialog.dismiss()

        page.on("dialog", on_dialog)
        page.set_default_timeout(10_000)
        yield page, problems
        context.close()
        browser.close()


def _assert_inert(page: Any, problems: list[str]) -> None:
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#app script, #app img, #app svg, #app iframe, #pwn").count() == 0
    assert not problems, problems


def test_every_payload_is_shown_as_text_on_the_board(
    tab: tuple[Any, list[str]], hostile_viewer: tuple[ViewerServer, dict[str, str]]
) -> None:
    page, problems = tab
    srv, ids = hostile_viewer
    page.goto(srv.url + "#/")
    page.wait_for_selector(f'tr[data-session="{ids["payload0"]}"]')
    _assert_inert(page, problems)


@pytest.mark.parametrize("index", range(len(PAYLOADS)))
def test_a_payload_is_shown_as_text_on_its_session_page(
    tab: tuple[Any, list[str]], hostile_viewer: tuple[ViewerServer, dict[str, str]], index: int
) -> None:
    page, problems = tab
    srv, ids = hostile_viewer
    page.goto(srv.url + f"#/sessions/{ids[f'payload{index}']}")
    page.wait_for_selector("ul.tree")
    _assert_inert(page, problems)
    assert PAYLOADS[index].strip() in page.locator("#app").inner_text()
