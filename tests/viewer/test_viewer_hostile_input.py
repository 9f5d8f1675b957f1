"""Hostile input against the viewer: no secret in any session view, traversal URLs never
reach a file, and script payloads come back as inert JSON data (regressions of what held)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hostile_support import PAYLOADS, build_hostile_store
from viewer_support import get

from qitos.core._redaction import REDACTED
from qitos.viewer._server import ViewerServer
from secret_agents import API_KEY, HEADER_SECRET, TASK_KEY

TRAVERSALS = [
    "/../../../../etc/passwd",
    "/static/../server.py",
    "/static/../../viewer/_server.py",
    "/static/%2e%2e/server.py",
    "/static/%2e%2e%2fserver.py",
    "/static/..%2fserver.py",
    "/static/..%5cserver.py",
    "/static/app.js/../../server.py",
    "//etc/passwd",
    "/static//etc/passwd",
    "/static/app.js%00.html",
    "/%2e%2e/%2e%2e/etc/passwd",
    "/index.html/..",
    "/static/./app.js/..",
]


@pytest.fixture(scope="module")
def hostile_viewer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ViewerServer, dict[str, str]]]:
    base = tmp_path_factory.mktemp("hostile")
    ids = build_hostile_store(base / "s.db")
    (base / "runs").mkdir()
    with ViewerServer(str(base / "runs"), db=str(base / "s.db"), port=0) as srv:
        yield srv, ids


def test_session_views_never_show_the_task_key_or_configured_credentials(
    hostile_viewer: tuple[ViewerServer, dict[str, str]],
) -> None:
    srv, ids = hostile_viewer
    for path in ("/api/sessions", f"/api/sessions/{ids['secret']}"):
        status, _, body = get(srv, path)
        text = json.dumps(body)
        assert status == 200 and REDACTED in text, path
        for secret in (TASK_KEY, API_KEY, HEADER_SECRET):
            assert secret not in text, (path, secret)


@pytest.mark.parametrize("index", range(len(PAYLOADS)))
def test_script_payloads_come_back_as_json_data_unchanged(
    hostile_viewer: tuple[ViewerServer, dict[str, str]], index: int
) -> None:
    srv, ids = hostile_viewer
    status, head, body = get(srv, f"/api/sessions/{ids[f'payload{index}']}")
    assert status == 200 and head["Content-Type"].startswith("application/json")
    assert head["X-Content-Type-Options"] == "nosniff" and "default-src 'none'" in head["Content-Security-Policy"]
    assert body["session"]["task"] == PAYLOADS[index]


def _raw_get(srv: ViewerServer, path: str) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", f"127.0.0.1:{srv.port}")
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read()
    finally:
        conn.close()


@pytest.mark.parametrize("path", TRAVERSALS)
def test_traversal_urls_never_reach_a_file(hostile_viewer: tuple[ViewerServer, Any], path: str) -> None:
    srv, _ = hostile_viewer
    status, content_type, body = _raw_get(srv, path)
    assert status in (400, 404), (path, status)
    assert content_type.startswith("application/json")
    for marker in (b"root:", b"import ", b"def ", b"ViewerServer"):
        assert marker not in body, (path, marker)
