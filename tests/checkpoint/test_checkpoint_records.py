"""The store contract itself: record dataclasses, snapshot digests, the ABC's twins, errors."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import pickle
from typing import Any

import pytest
from test_store_conformance import AsyncOnlyStore

from qitos.checkpoint._memory_store import InMemoryCheckpointStore
from qitos.checkpoint._records import (
    BlobIntegrityError,
    ControlItem,
    DuplicateOperationError,
    PruneReport,
    SessionCommitReceipt,
    SessionHeadRecord,
    SessionSnapshot,
    SessionSnapshotCommit,
    SnapshotNotFoundError,
    StepWrite,
    snapshot_content_text,
)
from qitos.checkpoint.store import CheckpointStore, SyncCheckpointStore
from qitos.core._codec import canonical_json, digest
from qitos.core._errors import CodecError, SnapshotIntegrityError, UsageError

RECORDS = [
    SessionSnapshot,
    SessionHeadRecord,
    SessionSnapshotCommit,
    SessionCommitReceipt,
    StepWrite,
    ControlItem,
    PruneReport,
]


def test_the_snapshot_id_is_the_sha256_of_its_canonical_content() -> None:
    payload = {"full": {"b": [1, 2.5, None], "a": 'é " \\ \n 日本', "c": {"z": True, "y": False}}}
    snapshot = SessionSnapshot.create(
        session_id="sess",
        parent_id="p" * 64,
        base_id="b" * 64,
        sequence=7,
        payload=payload,
        created_at="2026-01-01T00:00:00.000000Z",
    )
    content = {
        "session_id": "sess",
        "parent_id": "p" * 64,
        "base_id": "b" * 64,
        "sequence": 7,
        "created_at": "2026-01-01T00:00:00.000000Z",
        "payload": payload,
    }
    assert snapshot.snapshot_id == digest(content)
    root = SessionSnapshot.create(session_id="s", parent_id=None, base_id=None, sequence=0, payload={})
    assert root.snapshot_id == digest(
        {
            "session_id": "s",
            "parent_id": None,
            "base_id": None,
            "sequence": 0,
            "created_at": root.created_at,
            "payload": {},
        }
    )
    assert snapshot_content_text(
        session_id="sess",
        parent_id="p" * 64,
        base_id="b" * 64,
        sequence=7,
        created_at="2026-01-01T00:00:00.000000Z",
        payload_json=canonical_json(payload),
    ) == canonical_json(content)


def test_verify_detects_a_payload_changed_after_creation() -> None:
    payload: dict[str, Any] = {"notes": ["a"]}
    snapshot = SessionSnapshot.create(session_id="s", parent_id=None, base_id=None, sequence=0, payload=payload)
    snapshot.verify()
    payload["notes"].append("b")
    with pytest.raises(SnapshotIntegrityError) as caught:
        snapshot.verify()
    assert caught.value.snapshot_id == snapshot.snapshot_id
    # What a store persists is the canonical form fixed at creation, which still matches the id.
    assert snapshot.canonical_payload() == '{"notes":["a"]}'


def test_a_directly_built_snapshot_with_a_wrong_id_fails_verification() -> None:
    forged = SessionSnapshot(
        snapshot_id="0" * 64, session_id="s", parent_id=None, base_id=None, sequence=0, created_at="t", payload={}
    )
    with pytest.raises(SnapshotIntegrityError, match=r"0{64}"):
        forged.canonical_payload()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sequence": -1}, "sequence"),
        ({"sequence": True}, "sequence"),
        ({"session_id": ""}, "session_id"),
        ({"parent_id": 5}, "parent_id"),
        ({"created_at": ""}, "created_at"),
    ],
)
def test_snapshot_create_rejects_bad_fields_naming_them(kwargs: dict[str, Any], message: str) -> None:
    fields: dict[str, Any] = {"session_id": "s", "parent_id": None, "base_id": None, "sequence": 0, "payload": {}}
    fields.update(kwargs)
    with pytest.raises(UsageError, match=message):
        SessionSnapshot.create(**fields)


@pytest.mark.parametrize(
    "payload",
    [{"t": (1, 2)}, {"k": {1: "int key"}}, {"s": {1, 2}}, {"f": float("inf")}, {"o": object()}, ["not", "a", "map"]],
)
def test_a_payload_that_would_not_round_trip_through_json_is_refused(payload: Any) -> None:
    with pytest.raises(CodecError, match=r"snapshot\.payload"):
        SessionSnapshot.create(session_id="s", parent_id=None, base_id=None, sequence=0, payload=payload)


@pytest.mark.parametrize("record", RECORDS)
def test_records_are_frozen_and_keyword_only(record: type) -> None:
    params = dataclasses.fields(record)
    assert all(f.kw_only for f in params if f.init)
    assert record.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_a_commit_request_defaults_to_no_blobs_and_no_operation() -> None:
    snapshot = SessionSnapshot.create(session_id="s", parent_id=None, base_id=None, sequence=0, payload={})
    request = SessionSnapshotCommit(session_id="s", expected_head=None, snapshot=snapshot, lifecycle="created")
    assert (dict(request.blobs), request.operation_id, request.session_metadata) == ({}, None, None)
    with pytest.raises(TypeError):
        SessionSnapshotCommit("s", None, snapshot, "created")  # type: ignore[call-arg]


def test_store_errors_pickle_with_their_fields() -> None:
    for error in [
        SnapshotNotFoundError("abc"),
        DuplicateOperationError("op", "child"),
        BlobIntegrityError("d" * 64, "bytes hash to x"),
    ]:
        clone = pickle.loads(pickle.dumps(error))
        assert type(clone) is type(error)
        assert clone.__dict__ == error.__dict__
        assert str(clone) == str(error)
    assert str(SnapshotNotFoundError("abc")) == "snapshot 'abc' not found"


def test_a_store_missing_an_async_twin_fails_at_instantiation() -> None:
    methods = {name: value for name, value in vars(AsyncOnlyStore).items() if name != "aprune"}
    incomplete = type("Incomplete", (CheckpointStore,), methods)
    with pytest.raises(TypeError, match="aprune"):
        incomplete()


def test_a_sync_store_missing_a_sync_method_fails_at_instantiation() -> None:
    methods = {name: value for name, value in vars(InMemoryCheckpointStore).items() if name != "load_chain"}
    incomplete = type("Incomplete", (SyncCheckpointStore,), methods)
    with pytest.raises(TypeError, match="load_chain"):
        incomplete()


def test_a_default_sync_method_inside_an_event_loop_points_to_the_async_twin() -> None:
    store = AsyncOnlyStore()

    async def misuse() -> None:
        store.list_sessions()

    with pytest.raises(UsageError, match="await alist_sessions"):
        asyncio.run(misuse())
    assert store.list_sessions() == []


def _stored(payload_json: str, sequence: int = 0) -> tuple[str, str, None, None, int, str, bytes]:
    content = snapshot_content_text(
        session_id="s", parent_id=None, base_id=None, sequence=sequence, created_at="t", payload_json=payload_json
    )
    digest = hashlib.sha256(content.encode()).hexdigest()
    return (digest, "s", None, None, sequence, "t", payload_json.encode())


def test_rows_rebuilt_together_keep_each_payload_with_its_snapshot() -> None:
    rows = [_stored(json.dumps({"n": i, "text": "é" * i}, ensure_ascii=False), i) for i in range(50)]
    snapshots = SessionSnapshot.from_stored_rows(rows)
    assert [s.payload["n"] for s in snapshots] == list(range(50))
    assert [s.snapshot_id for s in snapshots] == [r[0] for r in rows]
    assert snapshots[7].canonical_payload() == rows[7][6].decode()


def test_a_verified_payload_holding_two_json_values_is_named_not_merged() -> None:
    bad = _stored('{"a":1},{"b":2}', 1)  # hashes correctly, but is not one JSON object
    with pytest.raises(SnapshotIntegrityError) as caught:
        SessionSnapshot.from_stored_rows([_stored('{"a":0}'), bad, _stored('{"c":3}', 2)])
    assert caught.value.snapshot_id == bad[0]


def test_a_verified_payload_that_is_not_an_object_is_named() -> None:
    bad = _stored("[1,2]", 1)
    with pytest.raises(SnapshotIntegrityError, match="not a JSON object") as caught:
        SessionSnapshot.from_stored_rows([_stored('{"a":0}'), bad])
    assert caught.value.snapshot_id == bad[0]


def test_the_contract_module_holds_the_abcs_and_names_the_records_at_the_seed_path() -> None:
    import inspect

    from qitos.checkpoint import _records, _rules, store
    from qitos.checkpoint._records import SessionCommitReceipt, SessionHeadRecord, SessionSnapshotCommit

    # The seed's path: the contract and the records its methods take and return.
    from qitos.checkpoint.store import CheckpointStore

    assert (SessionHeadRecord, SessionSnapshotCommit, SessionCommitReceipt) == (
        _records.SessionHeadRecord,
        _records.SessionSnapshotCommit,
        _records.SessionCommitReceipt,
    )
    defined_here = [
        obj for obj in vars(store).values() if inspect.isclass(obj) and obj.__module__ == "qitos.checkpoint.store"
    ]
    assert sorted(c.__name__ for c in defined_here) == ["CheckpointStore", "SyncCheckpointStore"]
    assert all(inspect.isabstract(c) for c in defined_here) and CheckpointStore in defined_here
    for name in store.__all__:  # every other name is a record or an error defined in _records
        assert getattr(store, name) is getattr(_records, name, getattr(store, name))
    assert not any(inspect.isclass(obj) and obj.__module__ == _rules.__name__ for obj in vars(_rules).values())
