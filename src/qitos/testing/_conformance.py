"""The conformance suite every ``CheckpointStore`` must pass: the store contract, test by test.

A store written outside qitos proves itself with one import. Subclass
:class:`CheckpointStoreConformance` in a test module under a ``Test`` name and give it a ``store``
fixture that yields a fresh, empty store and closes it afterwards::

    import pytest
    from qitos.testing import CheckpointStoreConformance

    class TestMyStore(CheckpointStoreConformance):
        @pytest.fixture
        def store(self, tmp_path):
            with MyStore(tmp_path / "sessions.db") as store:
                yield store

``pytest`` then runs every test of the contract against it: heads and compare-and-set commits,
snapshot chains and forks, step writes, leases and fencing tokens, control items, blobs,
retention (prune and vacuum), closing, and the async twins. qitos runs the same class over its
in-memory, SQLite and PostgreSQL stores. The tests use the sync methods unless they test the async
twins, so a store may implement either half (the ``CheckpointStore`` defaults bridge the other).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from qitos.checkpoint._records import (
    BlobIntegrityError,
    DuplicateOperationError,
    PruneReport,
    SessionSnapshot,
    SessionSnapshotCommit,
    SnapshotNotFoundError,
    StepWrite,
)
from qitos.checkpoint.store import CheckpointStore
from qitos.core._errors import (
    CheckpointError,
    CodecError,
    HeadConflictError,
    LeaseLostError,
    SessionBusyError,
    SessionNotFoundError,
    SnapshotIntegrityError,
    UsageError,
)

__all__ = ["CheckpointStoreConformance"]


# --------------------------------------------------------------------------- helpers


def _snap(
    session_id: str,
    parent: SessionSnapshot | None,
    payload: Mapping[str, Any],
    *,
    base: SessionSnapshot | None = None,
    full: bool = False,
) -> SessionSnapshot:
    """A snapshot after ``parent``; its base is ``base``, else the parent's base, else the parent."""
    if full or parent is None:
        base_id = None
    elif base is not None:
        base_id = base.snapshot_id
    else:
        base_id = parent.base_id or parent.snapshot_id
    return SessionSnapshot.create(
        session_id=session_id,
        parent_id=None if parent is None else parent.snapshot_id,
        base_id=base_id,
        sequence=0 if parent is None else parent.sequence + 1,
        payload=payload,
    )


def _create(
    store: CheckpointStore,
    session_id: str,
    payload: Mapping[str, Any] | None = None,
    *,
    parent: SessionSnapshot | None = None,
    metadata: Mapping[str, Any] | None = None,
    operation_id: str | None = None,
) -> SessionSnapshot:
    """Create a session whose first snapshot is full (optionally forked from ``parent``)."""
    first = SessionSnapshot.create(
        session_id=session_id,
        parent_id=None if parent is None else parent.snapshot_id,
        base_id=None,
        sequence=0,
        payload=payload if payload is not None else {"full": {"notes": []}},
    )
    store.commit_session_snapshot(
        SessionSnapshotCommit(
            session_id=session_id,
            expected_head=None,
            snapshot=first,
            lifecycle="created",
            session_metadata=metadata,
            operation_id=operation_id,
        )
    )
    return first


def _advance(
    store: CheckpointStore,
    head: SessionSnapshot,
    payload: Mapping[str, Any],
    *,
    parent: SessionSnapshot | None = None,
    lifecycle: str = "running",
    **commit: Any,
) -> SessionSnapshot:
    """Commit a delta snapshot after ``parent`` (default: the head) with the head as expected."""
    new = _snap(head.session_id, parent or head, payload)
    store.commit_session_snapshot(
        SessionSnapshotCommit(
            session_id=head.session_id, expected_head=head.snapshot_id, snapshot=new, lifecycle=lifecycle, **commit
        )
    )
    return new


def _chain_of(store: CheckpointStore, session_id: str, steps: int) -> list[SessionSnapshot]:
    """A session with a full first snapshot and ``steps`` deltas; all snapshots, oldest first."""
    out = [_create(store, session_id)]
    for i in range(steps):
        out.append(_advance(store, out[-1], {"ops": [{"append": f"{session_id}-{i}"}]}))
    return out


def _blob(data: bytes) -> tuple[str, bytes]:
    return hashlib.sha256(data).hexdigest(), data


# --------------------------------------------------------------------------- pending writes


def _write(head: SessionSnapshot, kind: str, key: str, payload: Mapping[str, Any], step: int = 1) -> StepWrite:
    return StepWrite(
        session_id=head.session_id, base_snapshot_id=head.snapshot_id, step_id=step, kind=kind, key=key, payload=payload
    )


# --------------------------------------------------------------------------- retention


def _rewound(store: CheckpointStore) -> tuple[list[SessionSnapshot], SessionSnapshot, list[SessionSnapshot]]:
    """Session s: s0..s3, then a commit rewinding to s1 (s2, s3 become unreachable); fork f from s1."""
    snaps = _chain_of(store, "s", 3)
    rewind = _advance(store, snaps[3], {"ops": ["rewound"]}, parent=snaps[1])
    store.put_writes([_write(snaps[3], "decision", "step", {"mode": "act"})])
    store.put_writes([_write(rewind, "decision", "step", {"mode": "wait"})])
    fork = [_create(store, "f", parent=snaps[1])]
    fork.append(_advance(store, fork[0], {"ops": ["f1"]}))
    return snaps, rewind, fork


# --------------------------------------------------------------------------- the suite


class CheckpointStoreConformance:
    """Every test of the ``CheckpointStore`` contract, run against the store the ``store`` fixture yields.

    Subclass it under a name pytest collects (``TestMyStore``) and override ``store`` with a
    fixture yielding a fresh, empty store; the suite closes nothing itself, except in the tests of
    closing (so ``close`` must be idempotent, as the contract says). Lease tests wait about a tenth
    of a second for short leases to expire, using the store's own clock.
    """

    @pytest.fixture
    def store(self) -> CheckpointStore:
        """Override in the subclass: yield a fresh, empty store of your kind, and close it afterwards."""
        raise UsageError(
            f"{type(self).__name__} must define a `store` fixture yielding a fresh, empty CheckpointStore "
            "(see qitos.testing.CheckpointStoreConformance)"
        )

    @pytest.fixture(autouse=True)
    def _a_fresh_empty_store(self, store: object) -> None:
        # Every test counts on starting from nothing; a shared or reused store would fail them far
        # from the cause, so say what is wrong before the first one runs.
        if not isinstance(store, CheckpointStore):
            raise UsageError(f"{type(self).__name__}.store must yield a CheckpointStore, got {type(store).__name__}")
        held = [head.session_id for head in store.list_sessions()]
        if held:
            raise UsageError(
                f"{type(self).__name__}.store must yield an empty store; it already holds sessions {held[:5]}"
            )

    # ----------------------------------------------------------------------- heads and commits

    def test_creating_a_session_sets_its_head(self, store: CheckpointStore) -> None:
        first = SessionSnapshot.create(session_id="s", parent_id=None, base_id=None, sequence=0, payload={"a": 1})
        receipt = store.commit_session_snapshot(
            SessionSnapshotCommit(
                session_id="s",
                expected_head=None,
                snapshot=first,
                lifecycle="created",
                session_metadata={"agent": "notes", "task": "Index notes"},
            )
        )
        assert (receipt.session_id, receipt.snapshot_id, receipt.previous_head, receipt.sequence) == (
            "s",
            first.snapshot_id,
            None,
            0,
        )
        head = store.get_session_head("s")
        assert head is not None
        assert (head.snapshot_id, head.sequence, head.lifecycle) == (first.snapshot_id, 0, "created")
        assert head.metadata == {"agent": "notes", "task": "Index notes"}
        assert head.updated_at == receipt.committed_at

    def test_head_of_an_unknown_session_is_none(self, store: CheckpointStore) -> None:
        assert store.get_session_head("nope") is None

    def test_creating_an_existing_session_conflicts_naming_the_current_head(self, store: CheckpointStore) -> None:
        first = _create(store, "s")
        again = SessionSnapshot.create(session_id="s", parent_id=None, base_id=None, sequence=0, payload={"b": 2})
        with pytest.raises(HeadConflictError) as caught:
            store.commit_session_snapshot(
                SessionSnapshotCommit(session_id="s", expected_head=None, snapshot=again, lifecycle="created")
            )
        assert (caught.value.session_id, caught.value.expected_head, caught.value.actual_head) == (
            "s",
            None,
            first.snapshot_id,
        )
        assert first.snapshot_id in str(caught.value)
        with pytest.raises(SnapshotNotFoundError):
            store.get_snapshot(again.snapshot_id)

    def test_advancing_moves_the_head_and_reports_the_previous_one(self, store: CheckpointStore) -> None:
        first = _create(store, "s")
        second = _snap("s", first, {"ops": [1]})
        receipt = store.commit_session_snapshot(
            SessionSnapshotCommit(session_id="s", expected_head=first.snapshot_id, snapshot=second, lifecycle="paused")
        )
        assert receipt.previous_head == first.snapshot_id
        assert receipt.snapshot_id == second.snapshot_id
        assert receipt.sequence == 1
        head = store.get_session_head("s")
        assert head is not None
        assert (head.snapshot_id, head.sequence, head.lifecycle) == (second.snapshot_id, 1, "paused")

    def test_a_stale_expected_head_conflicts_naming_both_heads_and_stores_nothing(self, store: CheckpointStore) -> None:
        first = _create(store, "s")
        winner = _advance(store, first, {"ops": ["winner"]})
        loser = _snap("s", first, {"ops": ["loser"]})
        with pytest.raises(HeadConflictError) as caught:
            store.commit_session_snapshot(
                SessionSnapshotCommit(
                    session_id="s",
                    expected_head=first.snapshot_id,
                    snapshot=loser,
                    lifecycle="running",
                    blobs=dict([_blob(b"loser blob")]),
                )
            )
        error = caught.value
        assert (error.expected_head, error.actual_head) == (first.snapshot_id, winner.snapshot_id)
        assert first.snapshot_id in str(error) and winner.snapshot_id in str(error)
        head = store.get_session_head("s")
        assert head is not None and head.snapshot_id == winner.snapshot_id
        with pytest.raises(SnapshotNotFoundError):
            store.get_snapshot(loser.snapshot_id)
        assert store.get_blobs([_blob(b"loser blob")[0]]) == {}

    def test_advancing_an_unknown_session_raises_session_not_found(self, store: CheckpointStore) -> None:
        first = SessionSnapshot.create(session_id="ghost", parent_id=None, base_id=None, sequence=0, payload={})
        with pytest.raises(SessionNotFoundError) as caught:
            store.commit_session_snapshot(
                SessionSnapshotCommit(session_id="ghost", expected_head="0" * 64, snapshot=first, lifecycle="running")
            )
        assert caught.value.session_id == "ghost"

    def test_a_snapshot_of_another_session_is_refused(self, store: CheckpointStore) -> None:
        other = SessionSnapshot.create(session_id="a", parent_id=None, base_id=None, sequence=0, payload={})
        with pytest.raises(UsageError, match="belongs to session 'a'"):
            store.commit_session_snapshot(
                SessionSnapshotCommit(session_id="b", expected_head=None, snapshot=other, lifecycle="created")
            )
        assert store.get_session_head("b") is None

    def test_a_snapshot_whose_parent_is_not_stored_is_refused_and_nothing_changes(self, store: CheckpointStore) -> None:
        orphan = SessionSnapshot.create(session_id="s", parent_id="f" * 64, base_id=None, sequence=1, payload={})
        with pytest.raises(SnapshotNotFoundError) as caught:
            store.commit_session_snapshot(
                SessionSnapshotCommit(session_id="s", expected_head=None, snapshot=orphan, lifecycle="created")
            )
        assert caught.value.snapshot_id == "f" * 64
        assert store.get_session_head("s") is None
        assert store.list_sessions() == []

    def test_a_snapshot_altered_after_creation_is_refused(self, store: CheckpointStore) -> None:
        good = SessionSnapshot.create(session_id="s", parent_id=None, base_id=None, sequence=0, payload={"a": 1})
        forged = SessionSnapshot(
            snapshot_id=good.snapshot_id,
            session_id="s",
            parent_id=None,
            base_id=None,
            sequence=0,
            created_at=good.created_at,
            payload={"a": 2},
        )
        with pytest.raises(SnapshotIntegrityError) as caught:
            store.commit_session_snapshot(
                SessionSnapshotCommit(session_id="s", expected_head=None, snapshot=forged, lifecycle="created")
            )
        assert caught.value.snapshot_id == good.snapshot_id
        assert store.get_session_head("s") is None

    def test_session_metadata_is_kept_and_replaced_only_when_given(self, store: CheckpointStore) -> None:
        first = _create(store, "s", metadata={"agent": "a1", "parent_session": None})
        second = _advance(store, first, {"ops": [1]})
        head = store.get_session_head("s")
        assert head is not None and head.metadata == {"agent": "a1", "parent_session": None}
        _advance(store, second, {"ops": [2]}, session_metadata={"agent": "a1", "task": "renamed"})
        head = store.get_session_head("s")
        assert head is not None and head.metadata == {"agent": "a1", "task": "renamed"}

    def test_an_operation_id_creates_one_session_and_a_second_use_names_it(self, store: CheckpointStore) -> None:
        parent = _chain_of(store, "parent", 2)
        child = _create(store, "child-1", parent=parent[1], operation_id="fork-op-1")
        assert store.find_session_by_operation("fork-op-1") == "child-1"
        assert store.find_session_by_operation("other-op") is None
        with pytest.raises(DuplicateOperationError) as caught:
            _create(store, "child-2", parent=parent[1], operation_id="fork-op-1")
        assert (caught.value.operation_id, caught.value.session_id) == ("fork-op-1", "child-1")
        assert store.get_session_head("child-2") is None
        head = store.get_session_head("child-1")
        assert head is not None and head.snapshot_id == child.snapshot_id
        parent_head = store.get_session_head("parent")
        assert parent_head is not None and parent_head.snapshot_id == parent[-1].snapshot_id

    def test_a_commit_refuses_a_non_json_payload_naming_it(self, store: CheckpointStore) -> None:
        with pytest.raises(CodecError, match="payload"):
            SessionSnapshot.create(session_id="s", parent_id=None, base_id=None, sequence=0, payload={"t": (1, 2)})
        with pytest.raises(CodecError, match="payload"):
            SessionSnapshot.create(
                session_id="s", parent_id=None, base_id=None, sequence=0, payload={"x": float("nan")}
            )
        with pytest.raises(CodecError, match="session_metadata"):
            _create(store, "s", metadata={1: "not a string key"})  # type: ignore[dict-item]
        assert store.get_session_head("s") is None

    # ----------------------------------------------------------------------- snapshots and chains

    def test_a_snapshot_reads_back_verified_and_equal(self, store: CheckpointStore) -> None:
        payload = {"full": {"notes": ["été", "日本語", 'quote " and \\ slash'], "n": 1.5, "ok": True, "none": None}}
        first = _create(store, "s", payload)
        loaded = store.get_snapshot(first.snapshot_id)
        assert loaded == first
        assert loaded.payload == payload
        loaded.verify()

    def test_an_unknown_snapshot_raises_snapshot_not_found(self, store: CheckpointStore) -> None:
        with pytest.raises(SnapshotNotFoundError) as caught:
            store.get_snapshot("a" * 64)
        assert isinstance(caught.value, KeyError) and isinstance(caught.value, CheckpointError)
        assert caught.value.snapshot_id == "a" * 64
        with pytest.raises(SnapshotNotFoundError):
            store.load_chain("a" * 64)

    def test_mutating_a_payload_after_commit_does_not_change_what_is_stored(self, store: CheckpointStore) -> None:
        payload: dict[str, Any] = {"full": {"notes": ["a"]}}
        first = _create(store, "s", payload)
        payload["full"]["notes"].append("sneaky")
        loaded = store.get_snapshot(first.snapshot_id)
        assert loaded.payload == {"full": {"notes": ["a"]}}
        loaded.payload["full"]["notes"].append("also sneaky")
        assert store.get_snapshot(first.snapshot_id).payload == {"full": {"notes": ["a"]}}

    def test_a_large_payload_round_trips(self, store: CheckpointStore) -> None:
        payload = {"full": {"text": "lorem ipsum dolor sit amet " * 5000, "items": list(range(3000))}}
        first = _create(store, "s", payload)
        assert store.get_snapshot(first.snapshot_id).payload == payload
        assert store.load_chain(first.snapshot_id) == [first]

    def test_the_chain_of_a_full_snapshot_is_itself(self, store: CheckpointStore) -> None:
        first = _create(store, "s")
        assert store.load_chain(first.snapshot_id) == [first]

    def test_the_chain_runs_from_the_base_to_the_snapshot_oldest_first(self, store: CheckpointStore) -> None:
        snaps = _chain_of(store, "s", 3)
        rematerialized = _snap("s", snaps[-1], {"full": {"notes": ["x"]}}, full=True)
        store.commit_session_snapshot(
            SessionSnapshotCommit(
                session_id="s", expected_head=snaps[-1].snapshot_id, snapshot=rematerialized, lifecycle="running"
            )
        )
        after = _advance(store, rematerialized, {"ops": ["after full"]})
        last = _advance(store, after, {"ops": ["last"]})
        assert store.load_chain(snaps[-1].snapshot_id) == snaps
        assert [s.snapshot_id for s in store.load_chain(last.snapshot_id)] == [
            rematerialized.snapshot_id,
            after.snapshot_id,
            last.snapshot_id,
        ]

    def test_a_fork_chain_reaches_into_its_parent_session(self, store: CheckpointStore) -> None:
        parent = _chain_of(store, "parent", 3)
        fork_first = _snap("child", parent[2], {"ops": ["child-0"]})  # base: the parent's full snapshot
        store.commit_session_snapshot(
            SessionSnapshotCommit(session_id="child", expected_head=None, snapshot=fork_first, lifecycle="created")
        )
        child_next = _advance(store, fork_first, {"ops": ["child-1"]})
        chain = store.load_chain(child_next.snapshot_id)
        assert [s.snapshot_id for s in chain] == [s.snapshot_id for s in parent[:3]] + [
            fork_first.snapshot_id,
            child_next.snapshot_id,
        ]
        assert [s.session_id for s in chain] == ["parent"] * 3 + ["child"] * 2
        head = store.get_session_head("parent")
        assert head is not None and head.snapshot_id == parent[-1].snapshot_id

    def test_a_base_that_is_not_an_ancestor_fails_the_chain_naming_the_snapshot(self, store: CheckpointStore) -> None:
        first = _create(store, "s")
        other = _create(store, "other")
        wrong = _snap("s", first, {"ops": [1]}, base=other)
        store.commit_session_snapshot(
            SessionSnapshotCommit(session_id="s", expected_head=first.snapshot_id, snapshot=wrong, lifecycle="running")
        )
        with pytest.raises(SnapshotIntegrityError) as caught:
            store.load_chain(wrong.snapshot_id)
        assert caught.value.snapshot_id == wrong.snapshot_id
        assert other.snapshot_id in str(caught.value)

    def test_sessions_are_listed_in_creation_order(self, store: CheckpointStore) -> None:
        for name in ["zeta", "alpha", "mid"]:
            _create(store, name)
        _advance(store, store.get_snapshot(store.list_sessions()[0].snapshot_id), {"ops": [1]})
        assert [head.session_id for head in store.list_sessions()] == ["zeta", "alpha", "mid"]
        assert store.list_sessions()[0].sequence == 1

    def test_sessions_are_listed_by_lifecycle_in_creation_order(self, store: CheckpointStore) -> None:
        for name in ["zeta", "alpha", "mid", "last"]:
            _create(store, name)
        heads = {head.session_id: head for head in store.list_sessions()}
        _advance(store, store.get_snapshot(heads["zeta"].snapshot_id), {"ops": [1]}, lifecycle="paused")
        _advance(store, store.get_snapshot(heads["mid"].snapshot_id), {"ops": [1]}, lifecycle="awaiting_approval")
        _advance(store, store.get_snapshot(heads["last"].snapshot_id), {"ops": [1]}, lifecycle="completed")
        waiting = store.list_sessions(lifecycles=("awaiting_approval", "paused"))
        assert [(head.session_id, head.lifecycle) for head in waiting] == [
            ("zeta", "paused"),
            ("mid", "awaiting_approval"),
        ]
        assert waiting[0] == store.get_session_head("zeta")  # whole records, metadata and counters too
        assert [head.session_id for head in store.list_sessions(lifecycles={"created"})] == ["alpha"]
        assert store.list_sessions(lifecycles=["failed"]) == store.list_sessions(lifecycles=[]) == []
        assert [head.session_id for head in asyncio.run(store.alist_sessions(lifecycles=["completed"]))] == ["last"]
        with pytest.raises(UsageError, match="not a single string"):
            store.list_sessions(lifecycles="paused")
        with pytest.raises(UsageError, match="must hold strings"):
            store.list_sessions(lifecycles=[1])  # type: ignore[list-item]

    def test_a_sessions_snapshots_are_listed_newest_first_within_the_session(self, store: CheckpointStore) -> None:
        parent = _chain_of(store, "parent", 2)
        child = _create(store, "child", parent=parent[1])
        child_next = _advance(store, child, {"ops": [1]})
        assert store.list_session_snapshots("parent") == [s.snapshot_id for s in reversed(parent)]
        assert store.list_session_snapshots("child") == [child_next.snapshot_id, child.snapshot_id]
        with pytest.raises(SessionNotFoundError):
            store.list_session_snapshots("ghost")

    def test_the_first_write_of_a_key_is_kept(self, store: CheckpointStore) -> None:
        head = _create(store, "s")
        first = _write(head, "tool_started", "call-1", {"name": "grep"})
        assert store.put_writes([first, _write(head, "decision", "step", {"mode": "act"})]) == [True, True]
        assert store.put_writes([_write(head, "tool_started", "call-1", {"name": "other"})]) == [False]
        writes = store.get_writes("s", head.snapshot_id)
        assert [(w.kind, w.key, dict(w.payload)) for w in writes] == [
            ("tool_started", "call-1", {"name": "grep"}),
            ("decision", "step", {"mode": "act"}),
        ]
        assert writes[0] == first

    def test_writes_come_back_in_write_order_per_base(self, store: CheckpointStore) -> None:
        first = _create(store, "s")
        second = _advance(store, first, {"ops": [1]})
        store.put_writes([_write(first, "tool_result", "b", {"n": 1}), _write(first, "tool_result", "a", {"n": 2})])
        store.put_writes([_write(second, "tool_result", "a", {"n": 3}, step=2)])
        store.put_writes([_write(first, "tool_result", "c", {"n": 4})])
        assert [w.key for w in store.get_writes("s", first.snapshot_id)] == ["b", "a", "c"]
        assert [(w.key, w.step_id) for w in store.get_writes("s", second.snapshot_id)] == [("a", 2)]
        assert store.get_writes("s", "0" * 64) == []

    def test_a_restores_reads_are_the_chain_and_the_writes_on_its_head(self, store: CheckpointStore) -> None:
        snaps = _chain_of(store, "s", 3)
        head, earlier = snaps[-1], snaps[-2]
        store.put_writes([_write(head, "tool_result", "b", {"n": 1}), _write(head, "decision", "a", {"n": 2})])
        store.put_writes([_write(earlier, "tool_result", "other base", {"n": 3})])
        _create(store, "t")
        chain, writes = store.load_chain_with_writes("s", head.snapshot_id)
        assert chain == store.load_chain(head.snapshot_id) == snaps
        assert writes == store.get_writes("s", head.snapshot_id) and [w.key for w in writes] == ["b", "a"]
        assert asyncio.run(store.aload_chain_with_writes("s", head.snapshot_id)) == (chain, writes)
        assert store.load_chain_with_writes("s", earlier.snapshot_id)[1] == store.get_writes("s", earlier.snapshot_id)
        assert store.load_chain_with_writes("t", head.snapshot_id) == (snaps, [])  # no writes of another session
        with pytest.raises(SnapshotNotFoundError):
            store.load_chain_with_writes("s", "0" * 64)

    def test_the_commit_that_moves_a_head_ends_its_steps_writes(self, store: CheckpointStore) -> None:
        snaps = _chain_of(store, "s", 1)
        head, earlier = snaps[-1], snaps[0]
        other = _create(store, "t")
        store.put_writes([_write(head, "decision", "step", {"mode": "act"}), _write(earlier, "tool_result", "old", {})])
        store.put_writes([_write(other, "decision", "step", {"mode": "act"})])
        moved = _advance(store, head, {"ops": ["next"]})
        assert store.get_writes("s", head.snapshot_id) == []  # its outcome is in the snapshot now
        assert [w.key for w in store.get_writes("s", earlier.snapshot_id)] == ["old"]  # not the head's: kept
        assert [w.key for w in store.get_writes("t", other.snapshot_id)] == ["step"]  # another session's: kept
        assert store.put_writes([_write(moved, "tool_started", "c1", {})]) == [True]
        assert store.load_chain_with_writes("s", moved.snapshot_id)[1] == store.get_writes("s", moved.snapshot_id)

    def test_a_write_batch_with_a_bad_write_stores_none_of_it(self, store: CheckpointStore) -> None:
        head = _create(store, "s")
        other = _create(store, "other")
        good = _write(head, "tool_result", "ok", {"n": 1})
        foreign = StepWrite(
            session_id="s", base_snapshot_id=other.snapshot_id, step_id=1, kind="tool_result", key="x", payload={}
        )
        with pytest.raises(CheckpointError, match="belongs to session 'other'"):
            store.put_writes([good, foreign])
        missing = StepWrite(session_id="s", base_snapshot_id="e" * 64, step_id=1, kind="k", key="x", payload={})
        with pytest.raises(SnapshotNotFoundError):
            store.put_writes([good, missing])
        with pytest.raises(CodecError, match="tool_result/bad"):
            store.put_writes([good, _write(head, "tool_result", "bad", {"v": {1, 2}})])
        assert store.get_writes("s", head.snapshot_id) == []
        assert store.put_writes([]) == []

    def test_a_large_write_batch_is_stored_whole_or_not_at_all(self, store: CheckpointStore) -> None:
        """Hundreds of writes in one call (a store may split them into statements, never the batch)."""
        head = _create(store, "s")
        batch = [_write(head, "tool_result", f"call-{i:03}", {"n": i}) for i in range(150)]
        assert store.put_writes(batch) == [True] * 150
        assert store.put_writes([*batch[:2], _write(head, "tool_result", "new", {})]) == [False, False, True]
        assert [w.key for w in store.get_writes("s", head.snapshot_id)] == [w.key for w in batch] + ["new"]
        later = [_write(head, "tool_result", f"later-{i:03}", {"n": i}) for i in range(150)]
        missing = StepWrite(session_id="s", base_snapshot_id="e" * 64, step_id=1, kind="k", key="x", payload={})
        with pytest.raises(SnapshotNotFoundError):
            store.put_writes([*later, missing])  # the bad write is past the first hundred
        with pytest.raises(SnapshotNotFoundError):
            asyncio.run(store.aput_writes([*later, missing]))
        assert len(store.get_writes("s", head.snapshot_id)) == 151

    # ----------------------------------------------------------------------- leases and fencing

    def test_a_granted_lease_names_the_head_and_control_position_it_was_granted_on(
        self, store: CheckpointStore
    ) -> None:
        first = _create(store, "s")
        lease = store.acquire_lease("s", "runner-a", ttl_seconds=30)
        assert (lease.head_snapshot_id, lease.control_seq) == (first.snapshot_id, 0)
        second = _snap("s", first, {"ops": [1]})
        request = SessionSnapshotCommit(
            session_id="s",
            expected_head=first.snapshot_id,
            snapshot=second,
            lifecycle="paused",
            lease_token=lease.token,
        )
        store.commit_session_snapshot(request)
        store.release_lease(lease)
        store.append_control("s", "steer", {"text": "go on"})
        again = asyncio.run(store.aacquire_lease("s", "runner-b", ttl_seconds=30))
        assert (again.head_snapshot_id, again.control_seq) == (second.snapshot_id, 1)
        renewed = store.renew_lease(again, ttl_seconds=30)
        assert renewed == store.get_lease("s") and renewed.token == again.token  # the grant's view is not compared

    def test_a_lease_has_one_owner_and_a_second_owner_is_told_who_holds_it(self, store: CheckpointStore) -> None:
        _create(store, "s")
        lease = store.acquire_lease("s", "runner-a", ttl_seconds=30)
        assert (lease.session_id, lease.owner, lease.token) == ("s", "runner-a", 1)
        assert lease.expires_at > time.time() + 20
        with pytest.raises(SessionBusyError, match="runner-a") as caught:
            store.acquire_lease("s", "runner-b", ttl_seconds=30)
        assert caught.value.owner == "runner-a" and caught.value.expires_at == pytest.approx(lease.expires_at)
        again = store.acquire_lease("s", "runner-a", ttl_seconds=60)
        assert again.token == lease.token and again.expires_at > lease.expires_at
        assert store.get_lease("s") == again
        assert store.get_lease("unknown") is None
        with pytest.raises(SessionNotFoundError):
            store.acquire_lease("unknown", "runner-a", ttl_seconds=30)
        with pytest.raises(UsageError, match="ttl_seconds"):
            store.acquire_lease("s", "runner-a", ttl_seconds=0)

    def test_an_expired_or_released_lease_is_taken_over_with_a_new_token(self, store: CheckpointStore) -> None:
        _create(store, "s")
        first = store.acquire_lease("s", "runner-a", ttl_seconds=0.05)
        time.sleep(0.08)
        second = store.acquire_lease("s", "runner-b", ttl_seconds=30)
        assert second.token == first.token + 1 and second.owner == "runner-b"
        with pytest.raises(LeaseLostError, match="taken over"):
            store.renew_lease(first, ttl_seconds=30)
        store.release_lease(first)  # stale: changes nothing
        assert store.get_lease("s") == second
        store.release_lease(second)
        third = store.acquire_lease("s", "runner-c", ttl_seconds=30)
        assert third.token == second.token + 1

    def test_renewing_extends_a_live_lease_and_refuses_an_expired_one(self, store: CheckpointStore) -> None:
        _create(store, "s")
        lease = store.acquire_lease("s", "runner-a", ttl_seconds=0.2)
        renewed = store.renew_lease(lease, ttl_seconds=30)
        assert renewed.token == lease.token and renewed.expires_at > lease.expires_at
        short = store.renew_lease(renewed, ttl_seconds=0.05)
        time.sleep(0.08)
        with pytest.raises(LeaseLostError, match="expired"):
            store.renew_lease(short, ttl_seconds=30)

    def test_commits_and_writes_carry_the_fencing_token_and_a_stale_one_is_refused(
        self, store: CheckpointStore
    ) -> None:
        head = _create(store, "s")
        stale = store.acquire_lease("s", "runner-a", ttl_seconds=0.05)
        time.sleep(0.08)
        live = store.acquire_lease("s", "runner-b", ttl_seconds=30)
        with pytest.raises(LeaseLostError, match="taken over"):
            _advance(store, head, {"ops": [1]}, lease_token=stale.token)
        with pytest.raises(LeaseLostError):
            store.put_writes([replace(_write(head, "tool_started", "c1", {}), lease_token=stale.token)])
        with pytest.raises(SessionBusyError, match="runner-b"):
            _advance(store, head, {"ops": [1]})  # no token while someone holds a live lease
        with pytest.raises(SessionBusyError):
            store.put_writes([_write(head, "tool_started", "c1", {})])
        assert store.get_writes("s", head.snapshot_id) == []
        current = store.get_session_head("s")
        assert current is not None and current.snapshot_id == head.snapshot_id
        assert store.put_writes([replace(_write(head, "tool_started", "c1", {}), lease_token=live.token)]) == [True]
        moved = _advance(store, head, {"ops": [1]}, lease_token=live.token)
        assert store.get_session_head("s").snapshot_id == moved.snapshot_id  # type: ignore[union-attr]

    def test_a_runner_whose_lease_expired_cannot_commit_even_if_nobody_took_over(self, store: CheckpointStore) -> None:
        head = _create(store, "s")
        lease = store.acquire_lease("s", "zombie", ttl_seconds=0.05)
        time.sleep(0.08)
        with pytest.raises(LeaseLostError, match="expired"):
            _advance(store, head, {"ops": [1]}, lease_token=lease.token)
        with pytest.raises(LeaseLostError, match="expired"):
            store.put_writes([replace(_write(head, "tool_started", "c1", {}), lease_token=lease.token)])
        _advance(store, head, {"ops": [1]})  # the lapsed lease no longer blocks a token-less writer

    def test_waiting_for_control_returns_new_items_or_nothing_after_the_timeout(self, store: CheckpointStore) -> None:
        _create(store, "s")
        started = time.monotonic()
        assert store.wait_for_control("s", after=0, timeout=0.1) == []
        assert time.monotonic() - started >= 0.09
        item = store.append_control("s", "steer", {"text": "go"})
        assert store.wait_for_control("s", after=0, timeout=5) == [item]
        assert asyncio.run(store.await_control("s", after=0, timeout=5)) == [item]

    # ----------------------------------------------------------------------- control items

    def test_control_positions_increase_per_session(self, store: CheckpointStore) -> None:
        _create(store, "a")
        _create(store, "b")
        items = [
            store.append_control("a", "steer", {"text": "first"}),
            store.append_control("b", "pause", {}),
            store.append_control("a", "pause", {"reason": "user"}),
            store.append_control("a", "approve", {"call_id": "c1"}),
        ]
        assert [(i.session_id, i.position, i.kind) for i in items] == [
            ("a", 1, "steer"),
            ("b", 1, "pause"),
            ("a", 2, "pause"),
            ("a", 3, "approve"),
        ]
        listed = store.list_control("a")
        assert listed == [items[0], items[2], items[3]]
        assert listed[0].payload == {"text": "first"}

    def test_a_commit_reports_the_sessions_newest_control_position(self, store: CheckpointStore) -> None:
        head = _create(store, "s")
        lease = store.acquire_lease("s", "runner", ttl_seconds=30)

        def commit(after: SessionSnapshot, token: int | None) -> tuple[SessionSnapshot, int | None]:
            new = _snap("s", after, {"ops": [1]})
            request = SessionSnapshotCommit(
                session_id="s", expected_head=after.snapshot_id, snapshot=new, lifecycle="running", lease_token=token
            )
            return new, store.commit_session_snapshot(request).control_seq

        head, seen = commit(head, lease.token)
        assert seen == 0
        store.append_control("s", "steer", {"text": "one"})
        store.append_control("s", "pause", {})
        head, seen = commit(head, lease.token)
        assert seen == 2
        store.release_lease(lease)
        store.append_control("s", "steer", {"text": "two"})
        _, seen = commit(head, None)  # the token-less path reports it too
        assert seen == 3 == store.list_control("s")[-1].position

    def test_a_head_reports_the_sessions_newest_control_position(self, store: CheckpointStore) -> None:
        _create(store, "s")
        _create(store, "other")
        head = store.get_session_head("s")
        assert head is not None and head.control_seq == 0
        store.append_control("s", "steer", {"text": "one"})
        store.append_control("s", "pause", {})
        store.append_control("other", "pause", {})
        head = store.get_session_head("s")
        assert head is not None and head.control_seq == 2 == store.list_control("s")[-1].position
        assert {h.session_id: h.control_seq for h in store.list_sessions()} == {"s": 2, "other": 1}
        assert store.get_session_heads(["other"])["other"].control_seq == 1
        assert asyncio.run(store.aget_session_head("s")) == head

    def test_many_heads_are_read_at_once_and_missing_sessions_are_left_out(self, store: CheckpointStore) -> None:
        a, b = _create(store, "a"), _create(store, "b")
        b = _advance(store, b, {"ops": [1]})
        heads = store.get_session_heads(["b", "missing", "a", "b"])
        assert sorted(heads) == ["a", "b"]
        assert heads["a"] == store.get_session_head("a") and heads["a"].snapshot_id == a.snapshot_id
        assert heads["b"].snapshot_id == b.snapshot_id and heads["b"].sequence == 1
        assert store.get_session_heads([]) == {}
        assert asyncio.run(store.aget_session_heads(["a", "missing"])) == {"a": heads["a"]}

    def test_positions_say_where_heads_stand_without_their_metadata(self, store: CheckpointStore) -> None:
        _create(store, "a")
        b = _advance(store, _create(store, "b"), {"ops": [1]})
        positions = store.get_session_positions(["b", "missing", "a", "b"])
        assert sorted(positions) == ["a", "b"]
        for sid, position in positions.items():
            head = store.get_session_head(sid)
            assert head is not None
            assert (position.session_id, position.snapshot_id, position.sequence, position.lifecycle) == (
                sid,
                head.snapshot_id,
                head.sequence,
                head.lifecycle,
            )
        assert positions["b"].snapshot_id == b.snapshot_id and positions["b"].sequence == 1
        assert store.get_session_positions([]) == {}
        assert asyncio.run(store.aget_session_positions(["a", "missing"])) == {"a": positions["a"]}
        # Only the heads in the given lifecycles ("b" is running, "a" created), as a waiter polls them.
        assert store.get_session_positions(["a", "b", "missing"], lifecycles=["running", "paused"]) == {
            "b": positions["b"]
        }
        assert store.get_session_positions(["a", "b"], lifecycles=[]) == {}
        assert asyncio.run(store.aget_session_positions(["a", "b"], lifecycles={"created"})) == {"a": positions["a"]}
        with pytest.raises(UsageError, match="not a single string"):
            store.get_session_positions(["a"], lifecycles="created")

    def test_control_items_are_listed_after_a_position_and_by_kind(self, store: CheckpointStore) -> None:
        _create(store, "s")
        for kind in ["steer", "pause", "steer", "reject", "approve"]:
            store.append_control("s", kind, {"kind": kind})
        assert [i.position for i in store.list_control("s", after=2)] == [3, 4, 5]
        assert [i.position for i in store.list_control("s", kinds=["steer"])] == [1, 3]
        assert [i.position for i in store.list_control("s", after=1, kinds={"approve", "reject"})] == [4, 5]
        assert store.list_control("s", after=5) == []

    def test_control_rejects_bad_input_clearly(self, store: CheckpointStore) -> None:
        _create(store, "s")
        with pytest.raises(SessionNotFoundError):
            store.append_control("ghost", "pause", {})
        with pytest.raises(SessionNotFoundError):
            store.list_control("ghost")
        with pytest.raises(UsageError, match="single string"):
            store.list_control("s", kinds="steer")
        with pytest.raises(UsageError, match="after"):
            store.list_control("s", after=-1)
        with pytest.raises(UsageError, match="control kind"):
            store.append_control("s", "", {})
        with pytest.raises(CodecError, match="control steer"):
            store.append_control("s", "steer", {"text": ("tuple",)})
        assert store.list_control("s") == []

    # ----------------------------------------------------------------------- blobs

    def test_blobs_are_content_addressed_and_verified(self, store: CheckpointStore) -> None:
        key, data = _blob(b"a large tool output" * 100)
        store.put_blobs({key: data})
        store.put_blobs({key: data})  # idempotent
        assert store.get_blobs([key, "0" * 64]) == {key: data}
        with pytest.raises(BlobIntegrityError) as caught:
            store.put_blobs({"1" * 64: b"does not hash to that"})
        assert caught.value.digest == "1" * 64
        assert store.get_blobs(["1" * 64]) == {}
        with pytest.raises(UsageError, match="single string"):
            store.get_blobs(key)

    def test_blobs_in_a_commit_are_stored_with_the_snapshot(self, store: CheckpointStore) -> None:
        first = _create(store, "s")
        key, data = _blob(b"exchange item body")
        _advance(store, first, {"ops": [{"blob": key}]}, blobs={key: data})
        assert store.get_blobs([key]) == {key: data}
        bad = _snap("s", first, {"ops": []})
        with pytest.raises(BlobIntegrityError):
            store.commit_session_snapshot(
                SessionSnapshotCommit(
                    session_id="s",
                    expected_head=first.snapshot_id,
                    snapshot=bad,
                    lifecycle="running",
                    blobs={key: b"x"},
                )
            )

    def test_prune_keeps_every_head_chain_and_drops_the_unreachable(self, store: CheckpointStore) -> None:
        snaps, rewind, fork = _rewound(store)
        report = store.prune()
        assert report == PruneReport(deleted_snapshots=2, kept_snapshots=5)
        for gone in snaps[2:]:
            with pytest.raises(SnapshotNotFoundError):
                store.get_snapshot(gone.snapshot_id)
        assert store.get_writes("s", snaps[3].snapshot_id) == []
        assert [w.key for w in store.get_writes("s", rewind.snapshot_id)] == ["step"]
        assert [s.snapshot_id for s in store.load_chain(rewind.snapshot_id)] == [
            snaps[0].snapshot_id,
            snaps[1].snapshot_id,
            rewind.snapshot_id,
        ]
        assert store.load_chain(fork[1].snapshot_id) == fork
        assert store.prune() == PruneReport(deleted_snapshots=0, kept_snapshots=5)

    def test_prune_drops_the_blobs_only_pruned_snapshots_mentioned_and_keeps_every_other(
        self, store: CheckpointStore
    ) -> None:
        snaps = _chain_of(store, "s", 1)
        (only_pruned, d1), (shared, d2), (only_kept, d3), (orphan, d4), (in_write, d5) = (
            _blob(text) for text in (b"pruned run", b"shared run", b"kept run", b"not yet committed", b"write blob")
        )
        doomed = _advance(store, snaps[1], {"state": {"chunks": {"notes": [[only_pruned, 1, 9], [shared, 1, 9]]}}},
                         blobs={only_pruned: d1, shared: d2})  # fmt: skip
        store.put_blobs({in_write: d5, orphan: d4})
        _advance(store, doomed, {"log": {"chunks": [shared, only_kept]}}, parent=snaps[1], blobs={only_kept: d3})
        # A write on doomed after the head left it (one made while it was the head ended with that commit).
        store.put_writes([_write(doomed, "decision", "step", {"view": in_write})])

        report = store.prune()

        assert report == PruneReport(deleted_snapshots=1, kept_snapshots=3, deleted_blobs=2)
        assert set(store.get_blobs([only_pruned, shared, only_kept, orphan, in_write])) == {shared, only_kept, orphan}
        assert store.prune().deleted_blobs == 0

    def test_prune_keeps_named_snapshots_with_their_chains(self, store: CheckpointStore) -> None:
        snaps, _, _ = _rewound(store)
        report = store.prune(keep=[snaps[3].snapshot_id])
        assert report == PruneReport(deleted_snapshots=0, kept_snapshots=7)
        assert store.load_chain(snaps[3].snapshot_id) == snaps
        assert [w.kind for w in store.get_writes("s", snaps[3].snapshot_id)] == ["decision"]

    def test_prune_with_an_unknown_keep_raises_and_deletes_nothing(self, store: CheckpointStore) -> None:
        snaps, _, _ = _rewound(store)
        with pytest.raises(SnapshotNotFoundError) as caught:
            store.prune(keep=["9" * 64])
        assert caught.value.snapshot_id == "9" * 64
        assert store.get_snapshot(snaps[3].snapshot_id) == snaps[3]
        with pytest.raises(UsageError, match="single string"):
            store.prune(keep=snaps[3].snapshot_id)

    def test_vacuum_after_prune_keeps_every_reachable_snapshot_restorable(self, store: CheckpointStore) -> None:
        _, rewind, fork = _rewound(store)
        store.prune()
        store.vacuum()
        for head in store.list_sessions():
            chain = store.load_chain(head.snapshot_id)
            assert chain[-1].snapshot_id == head.snapshot_id
            for snapshot in chain:
                snapshot.verify()
        assert store.get_snapshot(rewind.snapshot_id) == rewind
        assert store.list_session_snapshots("f") == [fork[1].snapshot_id, fork[0].snapshot_id]

    # ----------------------------------------------------------------------- lifecycle and async twins

    def test_a_closed_store_refuses_calls(self, store: CheckpointStore) -> None:
        _create(store, "s")
        store.close()
        with pytest.raises(CheckpointError, match="closed"):
            store.get_session_head("s")
        store.close()  # idempotent

    def test_the_store_is_a_context_manager(self, store: CheckpointStore) -> None:
        with store as entered:
            assert entered is store
            _create(store, "s")
        with pytest.raises(CheckpointError, match="closed"):
            store.list_sessions()

    def test_the_async_twins_do_what_the_sync_methods_do(self, store: CheckpointStore) -> None:
        async def scenario() -> None:
            first = SessionSnapshot.create(session_id="s", parent_id=None, base_id=None, sequence=0, payload={"a": 1})
            await store.acommit_session_snapshot(
                SessionSnapshotCommit(
                    session_id="s", expected_head=None, snapshot=first, lifecycle="created", operation_id="op"
                )
            )
            second = _snap("s", first, {"ops": [1]})
            receipt = await store.acommit_session_snapshot(
                SessionSnapshotCommit(session_id="s", expected_head=first.snapshot_id, snapshot=second, lifecycle="run")
            )
            assert receipt.previous_head == first.snapshot_id
            head = await store.aget_session_head("s")
            assert head is not None and head.snapshot_id == second.snapshot_id
            assert await store.afind_session_by_operation("op") == "s"
            assert await store.aget_snapshot(second.snapshot_id) == second
            assert await store.aload_chain(second.snapshot_id) == [first, second]
            assert [h.session_id for h in await store.alist_sessions()] == ["s"]
            assert await store.alist_session_snapshots("s") == [second.snapshot_id, first.snapshot_id]
            assert await store.aput_writes([_write(second, "decision", "d", {})]) == [True]
            assert [w.key for w in await store.aget_writes("s", second.snapshot_id)] == ["d"]
            item = await store.aappend_control("s", "steer", {"text": "hi"})
            assert await store.alist_control("s", after=0, kinds=["steer"]) == [item]
            lease = await store.aacquire_lease("s", "runner", ttl_seconds=30)
            assert await store.aget_lease("s") == lease
            assert (await store.arenew_lease(lease, ttl_seconds=60)).token == lease.token
            await store.arelease_lease(lease)
            key, data = _blob(b"async")
            await store.aput_blobs({key: data})
            assert await store.aget_blobs([key]) == {key: data}
            assert await store.aprune(keep=()) == PruneReport(deleted_snapshots=0, kept_snapshots=2)
            await store.avacuum()
            async with store:
                pass
            with pytest.raises(CheckpointError, match="closed"):
                await store.alist_sessions()

        asyncio.run(scenario())
