"""The viewer's JSON API and static files, over a real server on 127.0.0.1 (in a thread)."""

from __future__ import annotations

import sqlite3
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from viewer_support import HOSTILE, HostileAgent, ViewerData, get

from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.core._errors import UsageError
from qitos.engine._composition import compose
from qitos.viewer._server import ViewerServer

BOARD_KEYS = {
    "run_id",
    "dir",
    "status",
    "task",
    "agent",
    "steps",
    "stop_reason",
    "tokens",
    "duration_s",
    "started_at",
    "ended_at",
    "final_result",
    "error",
    "model_steps",
    "receipts",
}


def test_the_server_listens_on_loopback_only(server: ViewerServer) -> None:
    assert server.httpd.server_address[0] == "127.0.0.1"
    assert server.url == f"http://127.0.0.1:{server.port}/"


def test_board_lists_every_run_newest_first(api: Any, viewer_data: ViewerData) -> None:
    status, _, body = api("/api/runs")
    assert status == 200
    assert body["logdir"] == str(viewer_data.logdir)
    rows = {r["run_id"]: r for r in body["runs"]}
    assert {viewer_data.scripted_run, viewer_data.compacted_run, viewer_data.hostile_run, viewer_data.live_run} <= set(
        rows
    )
    assert all(set(r) == BOARD_KEYS for r in body["runs"])
    started = [r["started_at"] for r in body["runs"]]
    assert started == sorted(started, reverse=True)
    compacted = rows[viewer_data.compacted_run]
    assert (compacted["status"], compacted["stop_reason"], compacted["steps"]) == ("completed", "final", 8)
    assert compacted["model_steps"] == 6 and compacted["receipts"] >= 1
    live = rows[viewer_data.live_run]
    assert (live["status"], live["steps"], live["stop_reason"]) == ("running", 1, None)
    assert live["duration_s"] is not None


def test_run_detail_has_the_manifest_and_every_step_with_its_request_view(api: Any, viewer_data: ViewerData) -> None:
    status, _, body = api(f"/api/runs/{viewer_data.compacted_run}")
    assert status == 200
    assert set(body) == {"run", "manifest", "steps"}
    assert body["manifest"]["run_id"] == viewer_data.compacted_run
    steps = body["steps"]
    assert [s["step_id"] for s in steps] == list(range(8))
    view = steps[5]["request_view"]
    assert "request_view" not in steps[-1]  # the agent wrote and answered without the model
    assert set(view["exchanges"]) >= {"selected", "omitted", "protected"}
    assert view["exchanges"]["omitted"] and view["receipts"]
    receipt = view["receipts"][0]
    assert receipt["input_exchange_ids"] and receipt["declared_losses"]
    assert view["units"]["used"] <= view["units"]["available"]


def test_a_unique_prefix_finds_a_run(api: Any, viewer_data: ViewerData) -> None:
    status, _, body = api(f"/api/runs/{viewer_data.hostile_run[:14]}")
    assert status == 200 and body["run"]["run_id"] == viewer_data.hostile_run


def test_tool_output_with_markup_is_returned_unchanged_as_data(api: Any, viewer_data: ViewerData) -> None:
    _, head, body = api(f"/api/runs/{viewer_data.hostile_run}")
    assert head["Content-Type"].startswith("application/json")
    assert HOSTILE in body["steps"][0]["results"][0]["output"]


def test_events_page_forward_with_after(api: Any, viewer_data: ViewerData) -> None:
    _, _, everything = api(f"/api/runs/{viewer_data.scripted_run}/events")
    events = everything["events"]
    assert events[0]["event_type"] == "run_start" and events[-1]["event_type"] == "run_end"
    assert everything["next"] == len(events)
    _, _, tail = api(f"/api/runs/{viewer_data.scripted_run}/events?after={len(events) - 2}")
    assert tail["events"] == events[-2:]
    _, _, none = api(f"/api/runs/{viewer_data.scripted_run}/events?after={len(events)}")
    assert none == {"events": [], "next": len(events)}


@pytest.mark.parametrize(
    ("path", "status", "message"),
    [
        ("/api/runs/run_does_not_exist", 404, "no run 'run_does_not_exist'"),
        ("/api/runs/run_", 400, "ambiguous"),
        ("/api/runs/x/events?after=-1", 400, "after must be a non-negative integer"),
        ("/api/nothing", 404, "no API endpoint /api/nothing"),
        ("/api/sessions/ses_nope", 404, "session 'ses_nope' not found"),
        ("/etc/passwd", 404, "no such page"),
        ("/static/../server.py", 404, "no such page"),
    ],
)
def test_errors_are_json_with_a_meaningful_status(api: Any, path: str, status: int, message: str) -> None:
    got, head, body = api(path)
    assert got == status
    assert head["Content-Type"].startswith("application/json")
    assert message in body["error"]


def test_a_bad_after_parameter_is_400(api: Any, viewer_data: ViewerData) -> None:
    status, _, body = api(f"/api/runs/{viewer_data.scripted_run}/events?after=abc")
    assert status == 400 and "after must be a non-negative integer" in body["error"]


def test_sessions_board_lists_the_store(api: Any, viewer_data: ViewerData) -> None:
    status, _, body = api("/api/sessions")
    assert status == 200
    assert body["available"] is True and body["db"] == str(viewer_data.db)
    rows = {s["session_id"]: s for s in body["sessions"]}
    assert set(rows) == {
        viewer_data.parent_session,
        viewer_data.child_session,
        viewer_data.model_session,
        viewer_data.orphan_session,
    }
    assert rows[viewer_data.child_session]["parent_session_id"] == viewer_data.parent_session


def test_session_detail_has_inspection_snapshots_and_the_fork_lineage(api: Any, viewer_data: ViewerData) -> None:
    status, _, body = api(f"/api/sessions/{viewer_data.child_session}")
    assert status == 200
    assert body["inspection"]["snapshot_integrity"] == "verified" == body["integrity"]
    assert body["snapshots"] and body["snapshot_count"] == len(body["snapshots"])
    tree = body["lineage"]
    assert (tree["session_id"], tree["current"], tree["integrity"]) == (viewer_data.parent_session, False, "verified")
    [child] = tree["children"]
    assert (child["session_id"], child["current"]) == (viewer_data.child_session, True)
    assert child["fork_snapshot_id"] == tree["snapshot_id"]  # forked at the parent's head, which never moved


def test_session_detail_shows_the_last_request_view_and_its_receipts(api: Any, viewer_data: ViewerData) -> None:
    _, _, body = api(f"/api/sessions/{viewer_data.model_session}")
    view = body["inspection"]["last_request_view"]
    assert view["receipts"] and view["exchanges"]["omitted"]
    steps = body["inspection"]["work_graph"]["steps"]
    assert len(steps) == 8 and steps[0]["tool_calls"][0]["tool"] == "list_files"
    assert body["runs"], "the runs of a session are linked"


def test_a_session_lists_which_of_its_runs_have_a_trace_here(api: Any, viewer_data: ViewerData) -> None:
    _, _, traced = api(f"/api/sessions/{viewer_data.model_session}")
    assert traced["runs"] and traced["traced_runs"] == traced["runs"]
    _, _, untraced = api(f"/api/sessions/{viewer_data.parent_session}")  # run without trace_logdir
    assert untraced["runs"] and untraced["traced_runs"] == []


def test_a_session_whose_agent_cannot_be_imported_is_inspected_from_the_store(
    api: Any, viewer_data: ViewerData
) -> None:
    # The read-only viewer never imports the agent: the whole inspection comes from the store.
    _, _, body = api(f"/api/sessions/{viewer_data.orphan_session}")
    assert body["inspection_error"] is None
    assert body["inspection"]["snapshot_integrity"] == "verified"
    assert body["inspection"]["head"]["session_id"] == viewer_data.orphan_session
    assert body["integrity"] == "verified"
    assert body["lineage"]["session_id"] == viewer_data.orphan_session


def test_a_tampered_snapshot_is_reported_corrupt_in_detail_and_lineage(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    store = SqliteCheckpointStore(db)
    session = compose(agent=HostileAgent, store=store).session("tamper with me")
    session.run()
    head = store.get_session_head(session.session_id.value)
    assert head is not None
    store.close()
    with sqlite3.connect(db) as conn:  # outside qitos: simulate a damaged file
        (payload,) = conn.execute("SELECT payload FROM snapshots WHERE snapshot_id = ?", (head.snapshot_id,)).fetchone()
        assert isinstance(payload, str) and '"lifecycle":"completed"' in payload
        conn.execute(
            "UPDATE snapshots SET payload = ? WHERE snapshot_id = ?",
            (payload.replace('"lifecycle":"completed"', '"lifecycle":"failed"'), head.snapshot_id),
        )
    with ViewerServer(str(tmp_path / "runs"), db=str(db), port=0) as srv:
        status, _, body = get(srv, f"/api/sessions/{session.session_id.value}")
    assert status == 200
    assert body["integrity"].startswith("corrupt:") and head.snapshot_id in body["integrity"]
    assert body["lineage"]["integrity"].startswith("corrupt:")


def test_without_a_store_the_sessions_board_says_so(tmp_path: Path) -> None:
    with ViewerServer(str(tmp_path / "runs"), db=str(tmp_path / "none.db"), port=0) as srv:
        _, _, board = get(srv, "/api/sessions")
        status, _, detail = get(srv, "/api/sessions/ses_x")
        _, _, runs = get(srv, "/api/runs")
    assert board == {"db": str(tmp_path / "none.db"), "available": False, "sessions": []}
    assert status == 404 and "no session store" in detail["error"]
    assert runs["runs"] == []
    assert not (tmp_path / "none.db").exists()


def test_a_run_in_progress_is_live_and_updates_as_it_grows(tmp_path: Path) -> None:
    from qitos.trace import TraceWriter

    writer = TraceWriter(str(tmp_path / "runs"))
    writer.start("run_growing", {"task": {"objective": "grow"}, "agent": "A"})
    step = {
        "decision": {"mode": "wait"},
        "actions": [],
        "results": [],
        "observation": {"results": []},
        "state_diff": [],
    }
    with ViewerServer(str(tmp_path / "runs"), port=0) as srv:
        writer.step({"step_id": 0, **step})
        _, _, first = get(srv, "/api/runs/run_growing")
        writer.step({"step_id": 1, **step})
        _, _, second = get(srv, "/api/runs/run_growing")
        writer.finish("completed", {"stop_reason": "final", "steps": 2})
        _, _, done = get(srv, "/api/runs")
    assert (first["run"]["status"], len(first["steps"])) == ("running", 1)
    assert (second["run"]["status"], len(second["steps"]), second["run"]["steps"]) == ("running", 2, 2)
    assert (done["runs"][0]["status"], done["runs"][0]["steps"]) == ("completed", 2)


def test_requests_for_another_host_are_refused(api: Any) -> None:
    status, _, body = api("/api/runs", headers={"Host": "attacker.example:80"})
    assert status == 403 and "own address" in body["error"]


def test_pages_are_served_with_a_strict_content_security_policy(api: Any) -> None:
    for path, kind in (("/", "text/html"), ("/static/app.js", "text/javascript"), ("/static/app.css", "text/css")):
        status, head, _ = api(path)
        assert status == 200 and head["Content-Type"].startswith(kind)
        assert "script-src 'self'" in head["Content-Security-Policy"]
        assert "default-src 'none'" in head["Content-Security-Policy"]
        assert head["X-Content-Type-Options"] == "nosniff"
        assert head["X-Frame-Options"] == "DENY"


def test_static_files_are_self_contained_and_never_parse_data_as_html() -> None:
    static = resources.files("qitos.viewer").joinpath("static")
    texts = {name: static.joinpath(name).read_text(encoding="utf-8") for name in ("index.html", "app.js", "app.css")}
    for name, text in texts.items():
        assert "https://" not in text and "//cdn" not in text, f"{name} refers to the network"
    js = texts["app.js"]
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in js, f"app.js uses {sink}"
    assert "<script>" not in texts["index.html"].replace('<script src="/static/app.js" defer></script>', "")


def test_only_get_and_the_controls_post_are_answered(server: ViewerServer) -> None:
    import urllib.error
    import urllib.request

    for method, code in (("PUT", 501), ("DELETE", 501), ("OPTIONS", 501), ("POST", 403)):  # POST: no token
        request = urllib.request.Request(server.url + "api/runs", method=method, data=b"{}")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=10)
        assert info.value.code == code, method


def test_a_port_in_use_is_a_clear_usage_error(server: ViewerServer) -> None:
    with pytest.raises(UsageError, match=f"cannot listen on 127.0.0.1:{server.port}"):
        ViewerServer(port=server.port)


def test_a_bad_port_is_refused() -> None:
    with pytest.raises(UsageError, match="port must be"):
        ViewerServer(port=70000)
