"""A session's last request shows the messages it sent (read back from the session's exchange log)."""

from __future__ import annotations

from typing import Any

from viewer_support import ViewerData


def test_session_detail_shows_the_messages_of_the_last_request(api: Any, viewer_data: ViewerData) -> None:
    _, _, body = api(f"/api/sessions/{viewer_data.model_session}")
    inspection = body["inspection"]
    messages = inspection["last_request_messages"]
    assert len(messages) == inspection["last_request_view"]["messages"]
    assert messages[0]["role"] == "system"
    roles = {m["role"] for m in messages}
    assert {"assistant", "tool"} <= roles
    calls = [m for m in messages if m.get("tool_calls")]
    assert calls and all(m["tool_calls"][0]["name"] for m in calls)
