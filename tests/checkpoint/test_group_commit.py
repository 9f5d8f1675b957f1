"""Group commit: the writes of many sessions in flight share transactions, each behind its own checks.

A store has one writer per process; an async caller's reads and its group's writes run on its event
loop, with no thread hop. A refused fence inside a group fails that session alone and delays no other; a
group that does not commit acknowledges nothing. On SQLite and on PostgreSQL (the test cluster).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pg_server import pg_store
from qitos.checkpoint._records import SessionSnapshot, SessionSnapshotCommit, StepWrite
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.checkpoint.store import CheckpointStore
from qitos.core._errors import LeaseLostError


def _qitos_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("qitos-")}


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CheckpointStore]:
    if request.param == "sqlite":
        with SqliteCheckpointStore(tmp_path / "s.db") as sqlite:
            yield sqlite
        return
    with pg_store(request.getfixturevalue("pg_dsn")) as postgres:
        yield postgres


def _first(session_id: str) -> SessionSnapshotCommit:
    snapshot = SessionSnapshot.create(session_id=session_id, parent_id=None, base_id=None, sequence=0, payload={})
    return SessionSnapshotCommit(session_id=session_id, expected_head=None, snapshot=snapshot, lifecycle="created")


def _next(head: SessionSnapshot, token: int | None, step: int) -> SessionSnapshotCommit:
    snapshot = SessionSnapshot.create(
        session_id=head.session_id, parent_id=head.snapshot_id, base_id=head.snapshot_id, sequence=step,
        payload={"step": step},
    )  # fmt: skip
    return SessionSnapshotCommit(
        session_id=head.session_id,
        expected_head=head.snapshot_id,
        snapshot=snapshot,
        lifecycle="running",
        lease_token=token,
    )


def test_async_reads_and_grouped_writes_run_on_the_event_loop(tmp_path: Path) -> None:
    store = SqliteCheckpointStore(str(tmp_path / "s.db"))
    before = _qitos_threads()
    seen: dict[str, set[threading.Thread]] = {}

    async def main() -> None:
        heads = await asyncio.gather(*(store.aget_session_head(f"ses-{i}") for i in range(50)))
        assert heads == [None] * 50
        receipts = await asyncio.gather(*(store.acommit_session_snapshot(_first(f"ses-{i}")) for i in range(50)))
        assert [r.sequence for r in receipts] == [0] * 50
        seen["started"] = {t for t in _qitos_threads() - before if "wal-checkpoint" not in t.name}
        await store.aclose()

    asyncio.run(main())
    assert seen["started"] == set()  # no thread hop for a read or a write
    assert store._groups.written == 50 and store._groups.groups < 50  # the writes shared transactions


def test_a_fence_refused_inside_a_group_fails_that_session_alone(store: CheckpointStore) -> None:
    async def main() -> tuple[list[Any], int]:
        heads = [_first(f"s{i}") for i in range(40)]
        await asyncio.gather(*(store.acommit_session_snapshot(c) for c in heads))
        leases = await asyncio.gather(*(store.aacquire_lease(f"s{i}", "runner", ttl_seconds=60) for i in range(40)))
        # Another runner takes session s7 over: s7's runner still holds the old token.
        await store.aacquire_lease("s7", "usurper", ttl_seconds=60, take_over_from="runner")
        groups = store._groups.groups  # type: ignore[attr-defined]
        outcomes = await asyncio.gather(
            *(
                store.acommit_session_snapshot(_next(c.snapshot, lease.token, 1))
                for c, lease in zip(heads, leases, strict=True)
            ),
            return_exceptions=True,
        )
        return outcomes, store._groups.groups - groups  # type: ignore[attr-defined]

    outcomes, groups = asyncio.run(main())
    refused = [i for i, outcome in enumerate(outcomes) if isinstance(outcome, BaseException)]
    assert refused == [7] and isinstance(outcomes[7], LeaseLostError)
    assert groups < 40  # the commits shared groups, the refused one among them
    for i in range(40):
        head = store.get_session_head(f"s{i}")
        assert head is not None and head.sequence == (0 if i == 7 else 1)


def test_a_refused_write_batch_inside_a_group_fails_that_session_alone(store: CheckpointStore) -> None:
    async def main() -> list[Any]:
        heads = [_first(f"s{i}") for i in range(10)]
        await asyncio.gather(*(store.acommit_session_snapshot(c) for c in heads))
        leases = await asyncio.gather(*(store.aacquire_lease(f"s{i}", "runner", ttl_seconds=60) for i in range(10)))
        await store.aacquire_lease("s3", "usurper", ttl_seconds=60, take_over_from="runner")
        writes = [
            StepWrite(session_id=c.session_id, base_snapshot_id=c.snapshot.snapshot_id, step_id=1, kind="tool_started",
                      key="call", payload={"name": "charge"}, lease_token=lease.token)
            for c, lease in zip(heads, leases, strict=True)
        ]  # fmt: skip
        return await asyncio.gather(*(store.aput_writes([w]) for w in writes), return_exceptions=True)

    outcomes = asyncio.run(main())
    assert [isinstance(o, LeaseLostError) for o in outcomes] == [i == 3 for i in range(10)]
    assert [o for i, o in enumerate(outcomes) if i != 3] == [[True]] * 9
    for i in range(10):
        head = store.get_session_head(f"s{i}")
        assert head is not None
        assert len(store.get_writes(f"s{i}", head.snapshot_id)) == (0 if i == 3 else 1)


def test_sync_callers_on_many_threads_share_groups_and_each_gets_its_own_outcome(tmp_path: Path) -> None:
    with SqliteCheckpointStore(tmp_path / "s.db") as store:
        errors: list[BaseException] = []

        def one(i: int) -> None:
            try:
                head = _first(f"t{i}")
                store.commit_session_snapshot(head)
                for step in range(1, 6):
                    advance = _next(head.snapshot, None, step)
                    store.commit_session_snapshot(advance)
                    head = advance
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        assert store._groups.written == 16 * 6
        assert all(store.get_session_head(f"t{i}").sequence == 5 for i in range(16))  # type: ignore[union-attr]


def test_a_group_that_does_not_commit_acknowledges_nothing(tmp_path: Path) -> None:
    """An error that ends the transaction itself (not one piece's own refusal) fails every piece of
    its group, and none of their rows is stored."""
    with SqliteCheckpointStore(tmp_path / "s.db") as store:
        store.list_sessions()
        gate = threading.Event()
        outcomes: dict[str, Any] = {}

        def blocker(cur: Any) -> None:
            gate.wait(10)  # holds the first group open until the others wait behind it

        def interrupted(cur: Any) -> None:
            raise KeyboardInterrupt  # ends the group's transaction, not just this piece

        first = threading.Thread(target=lambda: store._write(blocker))
        first.start()
        while not store._groups._leading:
            pass

        def submit(name: str, work: Any) -> None:
            try:
                outcomes[name] = store._write(work)
            except BaseException as exc:
                outcomes[name] = exc

        waiting = [
            threading.Thread(target=submit, args=("commit", lambda cur: store._commit_work(_first("lost"))(cur))),
            threading.Thread(target=submit, args=("interrupted", interrupted)),
        ]
        for thread in waiting:
            thread.start()
        while len(store._groups._waiting) < 2:
            pass
        gate.set()
        for thread in (first, *waiting):
            thread.join(10)
        assert isinstance(outcomes["commit"], KeyboardInterrupt) and isinstance(
            outcomes["interrupted"], KeyboardInterrupt
        )
        assert store.get_session_head("lost") is None
        store.commit_session_snapshot(_first("after"))  # the writer goes on
        assert store.get_session_head("after") is not None


@pytest.mark.timeout(60)
def test_a_sync_write_inside_the_event_loop_of_a_group_in_progress_does_not_wait_for_it(
    store: CheckpointStore,
) -> None:
    """A synchronous call made on an event loop whose task writes the group in progress (a steer from
    async code while that loop's sessions commit) cannot wait for that task: it is written alone."""

    async def main() -> tuple[list[Any], int]:
        await store.acommit_session_snapshot(_first("steered"))
        commits = [asyncio.ensure_future(store.acommit_session_snapshot(_first(f"s{i}"))) for i in range(20)]
        await asyncio.sleep(0)  # the commits are queued, their group's writer is a task of this loop
        item = store.append_control("steered", "steer", {"text": "now"})  # sync, on this very loop
        return await asyncio.gather(*commits), item.position

    receipts, position = asyncio.run(main())
    assert len(receipts) == 20 and position == 1
    assert [item.payload for item in store.list_control("steered")] == [{"text": "now"}]
