"""A durable step writes at the crash-safety minimum: what a restore needs, and nothing more.

- a call's start is durable before a non-idempotent call runs (with the decision, when no model made it);
- an idempotent call needs no start: a restore runs it again;
- a non-idempotent call's result is durable before the step's next call starts; the last call's
  result rides with the step's boundary, which holds the whole outcome (an idempotent call's result
  always does: a restore runs the call again).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.core._agent_module import AgentModule
from qitos.core._decision import Action, Decision
from qitos.core._state import StateSchema
from qitos.core._tool import ToolRegistry, tool
from qitos.engine._composition import compose
from qitos.sessions._payload import SnapshotPayload


@tool
def send(text: str) -> str:
    """Send a text (not idempotent).

    Args:
        text: what to send.
    """
    return f"sent {text}"


@tool(idempotent=True)
def lookup(key: str) -> str:
    """Look a key up (idempotent).

    Args:
        key: the key.
    """
    return f"value of {key}"


class Scripted(AgentModule[StateSchema, Any, Action]):
    """Three steps, each calling the given tools, then an answer."""

    def __init__(self, calls: list[str]) -> None:
        super().__init__(tool_registry=ToolRegistry([send, lookup]))
        self.calls = calls

    def init_state(self, task: str, **kwargs: Any) -> StateSchema:
        return StateSchema(task=task, max_steps=5)

    def decide(self, state: StateSchema, observation: Any) -> Decision[Action]:
        step = state.current_step
        if step == 3:
            return Decision.final("done")
        args = {"send": {"text": f"t{step}"}, "lookup": {"key": f"k{step}"}}
        return Decision.act([Action(name, args[name], f"s{step}-{i}") for i, name in enumerate(self.calls)])

    def reduce(self, state: StateSchema, observation: Any, decision: Decision[Action]) -> StateSchema:
        return state


def _writes_by_step(tmp_path: Path, calls: list[str]) -> list[list[tuple[str, str]]]:
    """Every pending write the run made, by the step (base snapshot) it was made in, in write order.

    The commit that ends a step deletes its writes, so a trigger copies each one as it is stored.
    """
    db = tmp_path / "s.db"
    store = SqliteCheckpointStore(db)
    store.list_sessions()  # the file and its schema
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE seen (base TEXT, kind TEXT, key TEXT)")
        con.execute(
            "CREATE TRIGGER see AFTER INSERT ON writes BEGIN"
            " INSERT INTO seen VALUES (NEW.base_snapshot_id, NEW.kind, NEW.key); END"
        )
    session = compose(lambda: Scripted(calls), store).session("go")
    assert session.run().state.final_result == "done"
    chain = list(reversed(store.list_session_snapshots(session.session_id.value)))
    store.close()
    with sqlite3.connect(db) as con:
        seen = con.execute("SELECT base, kind, key FROM seen ORDER BY rowid").fetchall()
        assert con.execute("SELECT COUNT(*) FROM writes").fetchone() == (0,)  # each ended with its step
    return [[(kind, key) for b, kind, key in seen if b == base] for base in chain[:3]]


def test_one_non_idempotent_call_writes_its_start_with_the_decision_and_no_separate_result(tmp_path: Path) -> None:
    assert _writes_by_step(tmp_path, ["send"]) == [
        [("decision", "decision"), ("tool_started", f"s{step}-0")] for step in range(3)
    ]


def test_idempotent_calls_write_nothing_before_the_boundary(tmp_path: Path) -> None:
    assert _writes_by_step(tmp_path, ["lookup", "lookup"]) == [[], [], []]


def test_a_result_is_durable_before_the_next_call_starts(tmp_path: Path) -> None:
    assert _writes_by_step(tmp_path, ["send", "lookup", "send"]) == [
        [
            ("decision", "decision"),
            ("tool_started", f"s{step}-0"),
            ("tool_result", f"s{step}-0"),
            ("tool_result", f"s{step}-1"),  # rides with the next start
            ("tool_started", f"s{step}-2"),
        ]
        for step in range(3)
    ]


class SendThenWait(Scripted):
    """Step 0 sends; steps 1 and 2 call nothing; then an answer."""

    def decide(self, state: StateSchema, observation: Any) -> Decision[Action]:
        step = state.current_step
        if step == 0:
            return Decision.act([Action("send", {"text": "t0"}, "s0-0")])
        return Decision.final("done") if step == 3 else Decision.wait("nothing to do")


def test_a_batched_step_that_ran_a_non_idempotent_call_is_committed_at_its_boundary(tmp_path: Path) -> None:
    # Its last call's result lives only in the boundary: the batch may not hold it back while the
    # tool-free steps after it fill the batch.
    store = SqliteCheckpointStore(tmp_path / "s.db")
    composition = compose(lambda: SendThenWait(["send"]), store, durability="batched", batch_steps=16, batch_ms=60_000)
    session = composition.session("go")
    session.run()
    chain = store.list_session_snapshots(session.session_id.value)
    batches = [[s.step_id for s in SnapshotPayload.of(store.get_snapshot(i)).steps] for i in reversed(chain)]
    assert next(b for b in batches if b) == [0]  # step 0 alone, then the tool-free steps as one batch
    store.close()
