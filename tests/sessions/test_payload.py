"""The snapshot payload is one typed record with a strict, versioned codec.

Every payload a real session writes decodes into :class:`SnapshotPayload` and encodes back to the
very JSON that was stored (so the snapshot id still verifies); payloads written by earlier formats
(the golden files) decode too; anything else is refused with an error naming the field, and a
stored payload that is not a session payload is reported as that snapshot's integrity failure.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import driven
import session_agents as sa
from qitos.checkpoint._records import SessionSnapshot, SessionSnapshotCommit
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.core._codec import canonical_json
from qitos.core._errors import CodecError, SnapshotIntegrityError
from qitos.models._base import ModelResponse
from qitos.models._scripted import ScriptedModel
from qitos.sessions._journal import PendingStep
from qitos.sessions._payload import (
    FORMAT,
    CallSummary,
    ForkOrigin,
    LogMark,
    SnapshotPayload,
    StepSummary,
)
from qitos.sessions._state_chunks import ChunkRef

GOLDEN = Path(__file__).with_name("golden")


def _all_payloads(store: SqliteCheckpointStore) -> list[SessionSnapshot]:
    return [
        store.get_snapshot(s) for head in store.list_sessions() for s in store.list_session_snapshots(head.session_id)
    ]


def test_a_base_and_a_delta_round_trip_through_bytes() -> None:
    base = SnapshotPayload(
        format=FORMAT,
        step_id=3,
        control_position=2,
        budget_used={"tokens": 10, "elapsed_seconds": 0.5},
        lifecycle="paused",
        run_id="run_1",
        trace={"trace_id": "t", "span_id": "s"},
        state_full={"task": "x", "notes": []},
        state_chunks={"items": (ChunkRef("a" * 64, 3, 90),)},
        log=LogMark(log_id="log-1", position=4, digest="d" * 64, chunks=("b" * 64,)),
        request_view="c" * 64,
        pending=PendingStep(step_id=3, decision={"mode": "act", "actions": []}, started={"c1"}, approval_calls=["c1"]),
        pause_position=2,
    )
    delta = SnapshotPayload(
        step_id=4,
        budget_used={"tokens": 11, "elapsed_seconds": 0.6},
        state_delta=({"op": "set", "field": "task", "value": "y"},),
        log=LogMark(log_id="log-1", position=6, digest="e" * 64, chunk="f" * 64),
        steps=(
            StepSummary(step_id=3, mode="act", calls=(CallSummary(call_id="c1", tool="t", ok=False, error_kind="x"),)),
            StepSummary(
                step_id=4,
                mode="final",
                model={"request_id": "r1", "request_digest": "9" * 64, "response": {"content": "done"}},
            ),
        ),
        fork_of=ForkOrigin(session_id="ses_a", snapshot_id="1" * 64),
    )
    for record in (base, delta):
        again = SnapshotPayload.from_bytes(record.to_bytes())
        assert again.to_bytes() == record.to_bytes()
        assert again == SnapshotPayload.from_json(record.to_json())
    assert SnapshotPayload.from_bytes(base.to_bytes()).pending == base.pending
    assert SnapshotPayload.from_bytes(delta.to_bytes()).steps == delta.steps
    assert base.is_base and not delta.is_base and delta.effective_lifecycle == "running"


def test_every_payload_a_session_writes_is_read_back_to_the_stored_bytes(tmp_path: Path) -> None:
    db, side = str(tmp_path / "s.db"), str(tmp_path / "side.log")
    composition = sa.make_composition(db, side, agent="model", model=ScriptedModel(sa.model_script(4)))
    session = composition.session("Index notes", target=4)
    session.steer("keep it short")
    driven.run(session)
    session.fork()
    store = composition.runtime.checkpoint_store
    assert isinstance(store, SqliteCheckpointStore)
    snapshots = _all_payloads(store)
    assert len(snapshots) >= 6
    for snapshot in snapshots:
        record = SnapshotPayload.of(snapshot)
        assert canonical_json(record.to_json()) == snapshot.canonical_payload(), snapshot.snapshot_id
    assert any(SnapshotPayload.of(s).fork_of is not None for s in snapshots)
    assert any(SnapshotPayload.of(s).steps for s in snapshots)


@pytest.mark.parametrize("name", ["format1", "format2"])
def test_payloads_of_earlier_formats_decode(tmp_path: Path, name: str) -> None:
    db = tmp_path / f"{name}.db"
    shutil.copyfile(GOLDEN / f"{name}.db", db)
    with SqliteCheckpointStore(db) as store:
        records = [SnapshotPayload.of(s) for s in _all_payloads(store)]
    bases = [r for r in records if r.is_base]
    assert bases and {r.format for r in bases} == {int(name[-1])}
    assert any(r.pending is not None for r in records) and any(r.steps for r in records)


@pytest.mark.parametrize(
    ("payload", "path", "reason"),
    [
        ({"step_id": 1, "state": {"delta": []}, "budget_used": {}, "surprise": 1}, "payload", "unknown field"),
        ({"step_id": "1", "state": {"delta": []}}, "payload.step_id", "expected an int, got str"),
        ({"state": {"delta": []}}, "payload.step_id", "expected an int, got null"),
        ({"step_id": 1}, "payload.state", "missing"),
        ({"step_id": 1, "state": {"full": {}}, "format": 3}, "payload.format", "format 3 is not one this qitos reads"),
        ({"step_id": 1, "state": {"full": {}}}, "payload.format", "format None is not one"),
        ({"step_id": 1, "state": {"full": {}, "delta": []}, "format": 2}, "payload.state", "both"),
        ({"step_id": 1, "state": {"delta": [{"op": 1}]}}, "payload.state.delta[0]", "expected a change"),
        ({"step_id": 1, "state": {"delta": []}, "log": {"log_id": "l", "position": 1}}, "payload.log", "digest"),
        (
            {"step_id": 1, "state": {"delta": []}, "budget_used": {"tokens": "9"}},
            "payload.budget_used.tokens",
            "number",
        ),
        ({"step_id": 1, "state": {"delta": []}, "step": [{"step_id": 1}]}, "payload.step[0].mode", "missing"),
        ({"step_id": 1, "state": {"delta": []}, "pending": {"decision": {}}}, "payload.pending", "not an unfinished"),
        (["not", "an", "object"], "payload", "expected an object, got list"),
    ],
)
def test_a_payload_that_is_not_one_is_refused_naming_the_field(payload: Any, path: str, reason: str) -> None:
    with pytest.raises(CodecError) as caught:
        SnapshotPayload.from_json(payload)
    assert caught.value.path == path and reason in caught.value.message


def test_bytes_that_are_not_json_are_refused() -> None:
    with pytest.raises(CodecError, match="payload: not JSON"):
        SnapshotPayload.from_bytes(b"\xff{")


def test_a_stored_payload_that_is_not_a_session_payload_is_reported_naming_its_snapshot(tmp_path: Path) -> None:
    db, side = str(tmp_path / "s.db"), str(tmp_path / "side.log")
    composition = sa.make_composition(db, side)
    session = composition.session("Index notes", target=2)
    store = composition.runtime.checkpoint_store
    sid = session.session_id.value
    head = store.get_session_head(sid)
    assert head is not None
    # A well-formed, digest-verified snapshot whose payload is some other program's: a store
    # accepts any JSON object, so only the session layer can tell.
    alien = SessionSnapshot.create(
        session_id=sid, parent_id=head.snapshot_id, base_id=None, sequence=1, payload={"ops": ["not ours"]}
    )
    store.commit_session_snapshot(
        SessionSnapshotCommit(session_id=sid, expected_head=head.snapshot_id, snapshot=alien, lifecycle="running")
    )
    inspection = composition.restore(sid).inspect()
    assert inspection.snapshot_integrity.startswith("corrupt: snapshots row " + alien.snapshot_id)
    assert "not a session payload: payload: unknown field(s) ['ops']" in inspection.snapshot_integrity
    with pytest.raises(SnapshotIntegrityError) as caught:
        driven.run(composition.restore(sid))
    assert caught.value.snapshot_id == alien.snapshot_id and caught.value.session_id == sid
    assert store.get_snapshot(head.snapshot_id).snapshot_id == head.snapshot_id  # nothing else was touched


def test_a_model_decided_step_keeps_its_model_call_in_its_summary_once_its_writes_are_gone(tmp_path: Path) -> None:
    db, side = str(tmp_path / "s.db"), str(tmp_path / "side.log")
    script = sa.model_script(3)
    composition = sa.make_composition(db, side, agent="model", model=ScriptedModel(script))
    session = composition.session("Index notes", target=3)
    driven.run(session)
    store = composition.runtime.checkpoint_store
    assert isinstance(store, SqliteCheckpointStore)
    session_id = session.session_id.value
    assert all(store.get_writes(session_id, s) == [] for s in store.list_session_snapshots(session_id))
    steps = sorted(
        (s for snap in _all_payloads(store) for s in SnapshotPayload.of(snap).steps), key=lambda s: s.step_id
    )
    assert [s.step_id for s in steps] == [0, 1, 2, 3]
    for step, reply in zip(steps, script, strict=True):
        assert step.model is not None and len(step.model["request_digest"]) == 64
        response = ModelResponse.from_dict(step.model["response"])
        if isinstance(reply, str):
            assert response.text == reply
        else:
            assert [c.id for c in response.tool_calls] == [c["id"] for c in reply["tool_calls"]]
