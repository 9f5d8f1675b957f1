"""SqliteCheckpointStore under real concurrency: processes, a fork, threads and asyncio tasks.

Worker processes are fresh interpreters (``sys.executable -c``) that share only the database
file; they line up on files in ``tmp_path`` so their commits really race.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from qitos.checkpoint._records import SessionSnapshot, SessionSnapshotCommit, StepWrite
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.core._errors import HeadConflictError

_CAS_WORKER = r"""
import json, sys, time
from pathlib import Path
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.checkpoint.store import SessionSnapshot, SessionSnapshotCommit
from qitos.core._errors import HeadConflictError

db, name, rounds, sync_dir = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
store = SqliteCheckpointStore(db)
for r in range(rounds):
    head = store.get_session_head("shared")
    mine = SessionSnapshot.create(session_id="shared", parent_id=head.snapshot_id, base_id=None,
                                  sequence=head.sequence + 1, payload={"by": name, "round": r})
    (sync_dir / f"ready-{r}-{name}").touch()
    while not (sync_dir / f"go-{r}").exists():
        time.sleep(0.0005)
    try:
        store.commit_session_snapshot(SessionSnapshotCommit(
            session_id="shared", expected_head=head.snapshot_id, snapshot=mine, lifecycle="running"))
        result = {"won": True, "snapshot": mine.snapshot_id, "expected": head.snapshot_id}
    except HeadConflictError as exc:
        result = {"won": False, "snapshot": mine.snapshot_id, "expected": exc.expected_head,
                  "actual": exc.actual_head}
    (sync_dir / f"result-{r}-{name}.json").write_text(json.dumps(result))
store.close()
"""

_WRITER_WORKER = r"""
import sys, time
from pathlib import Path
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.checkpoint.store import SessionSnapshot, SessionSnapshotCommit, StepWrite

db, session, steps, busy_ms, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5])
while not go.exists():
    time.sleep(0.0005)
with SqliteCheckpointStore(db, busy_timeout_ms=busy_ms) as store:
    head = SessionSnapshot.create(session_id=session, parent_id=None, base_id=None, sequence=0, payload={"full": {}})
    store.commit_session_snapshot(SessionSnapshotCommit(
        session_id=session, expected_head=None, snapshot=head, lifecycle="created"))
    base = head
    for i in range(1, steps + 1):
        assert store.put_writes([StepWrite(session_id=session, base_snapshot_id=head.snapshot_id, step_id=i,
                                           kind="decision", key="step", payload={"i": i})]) == [True]
        assert [w.payload for w in store.get_writes(session, head.snapshot_id)] == [{"i": i}]
        store.append_control(session, "steer", {"text": f"{session} {i}"})
        nxt = SessionSnapshot.create(session_id=session, parent_id=head.snapshot_id, base_id=base.snapshot_id,
                                     sequence=i, payload={"ops": [{"append": "x" * 1024}]})
        store.commit_session_snapshot(SessionSnapshotCommit(
            session_id=session, expected_head=head.snapshot_id, snapshot=nxt, lifecycle="running"))
        head = nxt
print("done", session)
"""


def _wait_for(paths: list[Path], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            raise AssertionError(f"workers never reached {[p.name for p in paths if not p.exists()]}")
        time.sleep(0.001)


def _create(store: SqliteCheckpointStore, session_id: str) -> SessionSnapshot:
    first = SessionSnapshot.create(session_id=session_id, parent_id=None, base_id=None, sequence=0, payload={})
    store.commit_session_snapshot(
        SessionSnapshotCommit(session_id=session_id, expected_head=None, snapshot=first, lifecycle="created")
    )
    return first


def _advance(store: SqliteCheckpointStore, head: SessionSnapshot, payload: dict[str, object]) -> SessionSnapshot:
    nxt = SessionSnapshot.create(
        session_id=head.session_id,
        parent_id=head.snapshot_id,
        base_id=None,
        sequence=head.sequence + 1,
        payload=payload,
    )
    store.commit_session_snapshot(
        SessionSnapshotCommit(session_id=head.session_id, expected_head=head.snapshot_id, snapshot=nxt, lifecycle="r")
    )
    return nxt


def test_two_processes_committing_on_the_same_head_exactly_one_wins(tmp_path: Path) -> None:
    db, rounds = tmp_path / "sessions.db", 4
    with SqliteCheckpointStore(db) as store:
        _create(store, "shared")
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _CAS_WORKER, str(db), name, str(rounds), str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("left", "right")
    ]
    try:
        for r in range(rounds):
            _wait_for([tmp_path / f"ready-{r}-{name}" for name in ("left", "right")])
            (tmp_path / f"go-{r}").touch()
            results_files = [tmp_path / f"result-{r}-{name}.json" for name in ("left", "right")]
            _wait_for(results_files)
            time.sleep(0.01)  # let the writer finish the file it just created
            results = [json.loads(path.read_text()) for path in results_files]
            winners = [res for res in results if res["won"]]
            losers = [res for res in results if not res["won"]]
            assert len(winners) == 1 and len(losers) == 1, results
            assert losers[0]["expected"] == winners[0]["expected"]
            assert losers[0]["actual"] == winners[0]["snapshot"]
            with SqliteCheckpointStore(db) as store:
                head = store.get_session_head("shared")
                assert head is not None and head.snapshot_id == winners[0]["snapshot"]
                assert head.sequence == r + 1
    finally:
        for worker in workers:
            _, err = worker.communicate(timeout=60)
            assert worker.returncode == 0, err
    with SqliteCheckpointStore(db) as store:
        assert len(store.list_session_snapshots("shared")) == rounds + 1


@pytest.mark.parametrize(
    "busy_timeout_ms",
    [
        pytest.param(5_000, id="sqlite-busy-handler"),
        # SQLite gives up at once, so every lock wait goes through the store's own retry loop.
        pytest.param(0, id="store-retries-only", marks=pytest.mark.slow),
    ],
)
def test_eight_processes_writing_one_file_never_see_database_is_locked(tmp_path: Path, busy_timeout_ms: int) -> None:
    db, go, steps = tmp_path / "shared.db", tmp_path / "go", 25
    sessions = [f"worker-{i}" for i in range(8)]
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER_WORKER, str(db), session, str(steps), str(busy_timeout_ms), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for session in sessions
    ]
    time.sleep(0.3)  # let the interpreters start; the database file does not exist yet
    go.touch()
    outcomes = [worker.communicate(timeout=240) for worker in workers]
    for worker, (out, err) in zip(workers, outcomes, strict=True):
        assert "locked" not in err.lower() and "busy" not in err.lower(), err
        assert worker.returncode == 0, err
        assert out.startswith("done"), out
    with SqliteCheckpointStore(db) as store:
        assert sorted(head.session_id for head in store.list_sessions()) == sessions
        for session in sessions:
            head = store.get_session_head(session)
            assert head is not None and head.sequence == steps
            chain = store.list_session_snapshots(session)
            assert len(chain) == steps + 1
            assert len(store.load_chain(head.snapshot_id)) == steps + 1
            assert [item.position for item in store.list_control(session)] == list(range(1, steps + 1))
            assert store.get_writes(session, chain[1]) == []  # each step's write ended with its commit


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_reopens_its_own_connection(tmp_path: Path) -> None:
    with SqliteCheckpointStore(tmp_path / "sessions.db") as store:
        head = _advance(store, _create(store, "s"), {"by": "parent"})
        pid = os.fork()
        if pid == 0:  # the child: use the inherited store object, then leave without pytest cleanup
            code = 1
            try:
                _advance(store, head, {"by": "child"})
                store.append_control("s", "steer", {"text": "from the child"})
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        child_head = store.get_session_head("s")
        assert child_head is not None and child_head.sequence == 2
        assert store.get_snapshot(child_head.snapshot_id).payload == {"by": "child"}
        _advance(store, store.get_snapshot(child_head.snapshot_id), {"by": "parent again"})
        assert [i.payload for i in store.list_control("s")] == [{"text": "from the child"}]
        assert len(store.list_session_snapshots("s")) == 4


def test_threads_share_one_store_safely(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    with SqliteCheckpointStore(tmp_path / "sessions.db") as store:

        def work(name: str) -> None:
            try:
                head = _create(store, name)
                for i in range(30):
                    head = _advance(store, head, {"i": i})
                    store.put_writes(
                        [
                            StepWrite(
                                session_id=name,
                                base_snapshot_id=head.snapshot_id,
                                step_id=i,
                                kind="k",
                                key="v",
                                payload={},
                            )
                        ]
                    )
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(f"t{i}",)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert sorted(h.sequence for h in store.list_sessions()) == [30] * 8


def test_concurrent_async_commits_to_one_session_serialize_by_compare_and_swap(tmp_path: Path) -> None:
    async def scenario(store: SqliteCheckpointStore) -> list[object]:
        first = _create(store, "s")

        async def attempt(i: int) -> object:
            nxt = SessionSnapshot.create(
                session_id="s", parent_id=first.snapshot_id, base_id=None, sequence=1, payload={"attempt": i}
            )
            try:
                return await store.acommit_session_snapshot(
                    SessionSnapshotCommit(session_id="s", expected_head=first.snapshot_id, snapshot=nxt, lifecycle="r")
                )
            except HeadConflictError as exc:
                return exc

        return list(await asyncio.gather(*(attempt(i) for i in range(10))))

    with SqliteCheckpointStore(tmp_path / "sessions.db") as store:
        outcomes = asyncio.run(scenario(store))
        conflicts = [o for o in outcomes if isinstance(o, HeadConflictError)]
        assert len(conflicts) == 9
        head = store.get_session_head("s")
        assert head is not None and all(c.actual_head == head.snapshot_id for c in conflicts)
