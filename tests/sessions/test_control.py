"""What continues a waiting session, read from the store alone (``qitos.sessions._control``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import delegate_agents as da
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.engine._subagent import child_session_id
from qitos.sessions._control import acontinuation, continuation, continuation_position


def test_an_answer_to_the_delegated_child_a_parent_waits_on_continues_the_parent(tmp_path: Path) -> None:
    store = SqliteCheckpointStore(str(tmp_path / "s.db"))
    parent = da.parent_engine(store, approval_at=1).session("delegate, child needs approval")
    assert parent.run().state.stop_reason == "awaiting_approval"
    sid = parent.session_id.value
    child = child_session_id(sid, "d0")
    assert continuation(store, sid) is None  # nothing answered yet
    receipt = parent.approve("p1")
    assert receipt.session_id == child  # the answer is stored on the child that waits
    assert continuation_position(store, sid) is None  # the parent's own control holds nothing new
    assert continuation(store, sid) == (child, receipt.position)
    assert asyncio.run(acontinuation(store, sid)) == (child, receipt.position)
    assert continuation(store, child) == (child, receipt.position)
    assert parent.run().state.final_result == "answer:sub"
    assert continuation(store, sid) is None  # taken in, and the parent no longer waits
    assert asyncio.run(acontinuation(store, sid)) is None
