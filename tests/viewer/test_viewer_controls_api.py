"""The viewer's controls over HTTP: approve, reject, steer, pause and resume, and every way a
request that is not from the viewer's own page is refused with nothing written to the store."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controls_support import control_items, lifecycle, make_session, post

from qitos.viewer._server import ViewerServer


@pytest.fixture
def base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # the viewer's working directory: where a resumed run starts
    return tmp_path


@pytest.fixture
def viewer(base: Path) -> Iterator[ViewerServer]:
    with ViewerServer(str(base / "runs"), db=str(base / "sessions.db"), port=0) as srv:
        yield srv


def _wait_for_lifecycle(db: Path, session_id: str, wanted: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while lifecycle(db, session_id) != wanted:
        assert time.monotonic() < deadline, f"{session_id} never became {wanted}: {lifecycle(db, session_id)}"
        time.sleep(0.1)


@pytest.mark.parametrize(
    ("token", "headers", "status", "says"),
    [
        (None, {}, 403, "token is missing or wrong"),
        ("not-the-token", {}, 403, "token is missing or wrong"),
        ("", {"Origin": "http://evil.test"}, 403, "from http://evil.test is refused"),
        ("", {"Origin": "null"}, 403, "from null is refused"),
        ("", {"Sec-Fetch-Site": "cross-site"}, 403, "cross-site control request is refused"),
        ("", {"Content-Type": "text/plain"}, 415, "Content-Type: application/json"),
        ("", {"Content-Type": "application/x-www-form-urlencoded"}, 415, "Content-Type: application/json"),
        ("", {"Host": "evil.test"}, 403, "its own address"),
    ],
)
def test_a_request_not_from_the_viewers_page_is_refused_and_writes_nothing(
    base: Path, viewer: ViewerServer, token: str | None, headers: dict[str, str], status: int, says: str
) -> None:
    session_id = make_session(base)
    code, body = post(
        viewer, f"/api/sessions/{session_id}/approve", {"call_id": "call-publish"}, token=token, headers=headers
    )
    assert (code, says in body["error"]) == (status, True), body
    assert control_items(base / "sessions.db", session_id) == []


def test_bad_requests_are_clear_errors_that_write_nothing(base: Path, viewer: ViewerServer) -> None:
    session_id = make_session(base)
    cases = [
        (f"/api/sessions/{session_id}/approve", {}, 400, "call_id must be a non-empty string"),
        (f"/api/sessions/{session_id}/approve", {"call_id": "nope"}, 400, "nope"),
        (f"/api/sessions/{session_id}/steer", {"text": "  "}, 400, "text must be a non-empty string"),
        (f"/api/sessions/{session_id}/steer", {"text": 7}, 400, "text must be a string"),
        (f"/api/sessions/{session_id}/explode", {}, 404, "no session action 'explode'"),
        ("/api/sessions/ses_missing/pause", {}, 404, "not found"),
        ("/api/runs", {}, 404, "for POST"),
    ]
    for path, body, status, says in cases:
        code, answer = post(viewer, path, body)
        assert (code, says in answer["error"]) == (status, True), (path, answer)
    code, answer = post(viewer, f"/api/sessions/{session_id}/pause", raw=b"{not json")
    assert (code, answer["error"]) == (400, "the request body is not JSON")
    code, answer = post(viewer, f"/api/sessions/{session_id}/pause", raw=b"[]")
    assert (code, answer["error"]) == (400, "the request body must be a JSON object")
    code, answer = post(viewer, f"/api/sessions/{session_id}/steer", raw=json.dumps({"text": "x" * 70_000}).encode())
    assert code == 413
    assert control_items(base / "sessions.db", session_id) == []


def test_approve_then_resume_runs_the_session_in_a_subprocess(base: Path, viewer: ViewerServer) -> None:
    session_id = make_session(base)
    db = base / "sessions.db"
    code, body = post(viewer, f"/api/sessions/{session_id}/approve", {"call_id": "call-publish"})
    assert code == 200 and body["receipt"]["approved"] is True
    assert body["next"] == f"run: qitos sessions resume {session_id} --db {db}"
    code, body = post(viewer, f"/api/sessions/{session_id}/resume")
    assert code == 200 and body["started"] is True, body
    assert body["command"].startswith(f"qitos sessions resume {session_id} --db {db} --trace-dir")
    _wait_for_lifecycle(db, session_id, "completed")
    assert "completed" in Path(body["log"]).read_text()
    _, _, detail = _get(viewer, f"/api/sessions/{session_id}")
    assert detail["traced_runs"], "the resumed run traced into the viewer's trace directory"
    code, body = post(viewer, f"/api/sessions/{session_id}/resume")
    assert code == 409 and "has ended (completed)" in body["error"]


def test_reject_with_a_reason_steer_and_pause_are_control_items(base: Path, viewer: ViewerServer) -> None:
    session_id = make_session(base)
    db = base / "sessions.db"
    assert post(viewer, f"/api/sessions/{session_id}/steer", {"text": "say it kindly"})[0] == 200
    assert post(viewer, f"/api/sessions/{session_id}/pause")[0] == 200
    code, body = post(viewer, f"/api/sessions/{session_id}/reject", {"call_id": "call-publish", "reason": "not today"})
    assert code == 200 and body["receipt"]["approved"] is False and body["receipt"]["reason"] == "not today"
    assert control_items(db, session_id) == ["steer", "pause", "reject"]


def test_a_delegated_childs_call_is_answered_through_its_parent(base: Path, viewer: ViewerServer) -> None:
    lead = make_session(base, "lead")
    db = base / "sessions.db"
    _, _, detail = _get(viewer, f"/api/sessions/{lead}")
    (call,) = [c for c in detail["inspection"]["tool_batch"]["calls"] if c["status"] == "awaiting_approval"]
    child = call["session_id"]
    assert child and child != lead
    code, body = post(viewer, f"/api/sessions/{lead}/approve", {"call_id": call["call_id"]})
    assert code == 200 and body["receipt"]["session_id"] == child  # the answer went to the child
    code, body = post(viewer, f"/api/sessions/{child}/resume")  # resuming the child runs its parent
    assert code == 200 and body["session_id"] == lead
    _wait_for_lifecycle(db, lead, "completed")


def test_resume_says_what_to_run_when_the_record_cannot_rebuild_the_agent(base: Path, viewer: ViewerServer) -> None:
    (base / "inline.py").write_text(
        "import sys\n"
        "from publishing import Publisher\n"
        "from qitos import Engine\n"
        "from qitos.checkpoint import SqliteCheckpointStore\n"
        "class Named(Publisher):\n"
        "    def __init__(self, name):\n"
        "        super().__init__()\n"
        "if __name__ == '__main__':\n"
        "    s = Engine(Named('x'), checkpoint_store=SqliteCheckpointStore(sys.argv[1])).session('go')\n"
        "    s.run()\n"
        "    print(s.session_id.value)\n",
        encoding="utf-8",
    )
    make_session(base)  # writes publishing.py
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "inline.py", str(base / "sessions.db")], cwd=base, capture_output=True, text=True, check=True
    )
    session_id = out.stdout.strip()
    code, body = post(viewer, f"/api/sessions/{session_id}/resume")
    assert code == 409 and "cannot be rebuilt from its record" in body["error"]
    assert f"qitos sessions resume {session_id} --db {base / 'sessions.db'} --agent FACTORY" in body["command"]


def _get(viewer: ViewerServer, path: str) -> tuple[int, dict[str, str], dict[str, Any]]:
    from viewer_support import get

    status, headers, body = get(viewer, path)
    assert isinstance(body, dict)
    return status, headers, body


def test_the_empty_boards_command_runs_as_shown_and_fills_the_board(base: Path) -> None:
    from user_shell import sh

    with ViewerServer(str(base / "my runs"), db=str(base / "my db.db"), port=0) as srv:
        _, _, runs = _get(srv, "/api/runs")
        assert runs["runs"] == [] and isinstance(runs["demo_command"], str)
        sh(runs["demo_command"], base)
        _, _, runs = _get(srv, "/api/runs")
        _, _, sessions = _get(srv, "/api/sessions")
        assert len(runs["runs"]) == 1 and len(sessions["sessions"]) == 1
