"""PostgreSQL sessions across real processes: many writers, racing lease takers, restore elsewhere.

Workers are ``python -c`` subprocesses running the code below against the same schema; the
session tests' agents (``session_agents``) run a real session in one process and resume it in
another through a ``postgresql://...?schema=`` URL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import session_agents as sa
from pg_server import pg_store
from qitos.checkpoint._postgres_store import PostgresCheckpointStore

ROOT = Path(__file__).resolve().parents[2]

_COMMITTER = textwrap.dedent(
    """
    import json, sys
    from qitos.checkpoint._postgres_store import PostgresCheckpointStore
    from qitos.checkpoint.store import SessionSnapshot, SessionSnapshotCommit
    dsn, schema, name, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    with PostgresCheckpointStore(dsn, schema=schema) as store:
        head = SessionSnapshot.create(session_id=name, parent_id=None, base_id=None, sequence=0, payload={"full": {}})
        store.commit_session_snapshot(
            SessionSnapshotCommit(session_id=name, expected_head=None, snapshot=head, lifecycle="created"))
        for i in range(steps):
            nxt = SessionSnapshot.create(session_id=name, parent_id=head.snapshot_id, base_id=head.base_id or
                                         head.snapshot_id, sequence=i + 1, payload={"ops": [name, i, "x" * 1024]})
            store.commit_session_snapshot(SessionSnapshotCommit(
                session_id=name, expected_head=head.snapshot_id, snapshot=nxt, lifecycle="running"))
            store.append_control(name, "steer", {"i": i})
            head = nxt
    print(json.dumps({"head": head.snapshot_id}))
    """
)

_RACER = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[5])
    import session_agents
    from qitos.checkpoint._postgres_store import PostgresCheckpointStore
    from qitos.core._errors import QitosError
    dsn, schema, name, barrier = sys.argv[1:5]
    out = {"name": name}
    with PostgresCheckpointStore(dsn, schema=schema) as store:
        store.list_sessions()  # connected and migrated before the start line
        session_agents.barrier(barrier, "start", name, parties=4)
        try:
            lease = store.acquire_lease("s", name, ttl_seconds=60)
            out.update(owner=lease.owner, token=lease.token)
        except QitosError as exc:
            out.update(error=type(exc).__name__, holder=getattr(exc, "owner", None), message=str(exc))
    print(json.dumps(out))
    """
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(ROOT / "src"), str(ROOT / "tests"), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def _run_all(commands: list[list[str]], timeout: float = 180) -> list[dict[str, Any]]:
    procs = [
        subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for cmd in commands
    ]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"worker failed ({proc.returncode}):\n{err}"
        assert "Traceback" not in err, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


@pytest.fixture
def store(pg_dsn: str) -> Iterator[PostgresCheckpointStore]:
    with pg_store(pg_dsn) as instance:
        yield instance


def test_eight_processes_committing_their_own_sessions_all_land(pg_dsn: str, store: PostgresCheckpointStore) -> None:
    steps = 25
    names = [f"p{n}" for n in range(8)]
    outs = _run_all([[sys.executable, "-c", _COMMITTER, pg_dsn, store.schema, name, str(steps)] for name in names])
    heads = {head.session_id: head for head in store.list_sessions()}
    assert sorted(heads) == names
    for name, out in zip(names, outs, strict=True):
        assert heads[name].snapshot_id == out["head"] and heads[name].sequence == steps
        chain = store.load_chain(out["head"])
        assert [s.sequence for s in chain] == list(range(steps + 1))
        assert [item.position for item in store.list_control(name)] == list(range(1, steps + 1))


def test_four_processes_racing_for_one_sessions_lease_leave_exactly_one_owner(
    pg_dsn: str, store: PostgresCheckpointStore, tmp_path: Path
) -> None:
    from qitos.checkpoint._records import SessionSnapshot, SessionSnapshotCommit

    first = SessionSnapshot.create(session_id="s", parent_id=None, base_id=None, sequence=0, payload={})
    store.commit_session_snapshot(
        SessionSnapshotCommit(session_id="s", expected_head=None, snapshot=first, lifecycle="created")
    )
    tests_dir = str(ROOT / "tests")
    outs = _run_all(
        [[sys.executable, "-c", _RACER, pg_dsn, store.schema, f"racer-{n}", str(tmp_path), tests_dir] for n in range(4)]
    )
    owners = [out for out in outs if "owner" in out]
    losers = [out for out in outs if "owner" not in out]
    assert len(owners) == 1, outs
    winner = owners[0]
    assert winner["token"] == 1
    assert [loser["error"] for loser in losers] == ["SessionBusyError"] * 3, losers
    assert {loser["holder"] for loser in losers} == {winner["name"]}
    lease = store.get_lease("s")
    assert lease is not None and (lease.owner, lease.token) == (winner["name"], 1)


def test_a_session_paused_in_one_process_resumes_in_another_from_postgres(
    pg_dsn: str, store: PostgresCheckpointStore, tmp_path: Path
) -> None:
    separator = "&" if "?" in pg_dsn else "?"
    url = f"{pg_dsn}{separator}schema={store.schema}"
    side = str(tmp_path / "side.log")
    reference = sa.make_composition(str(tmp_path / "ref.db"), str(tmp_path / "ref.log"))
    expected = reference.session("Index notes", target=8).run().state.to_dict()
    reference.runtime.checkpoint_store.close()

    first = sa.run_cli("run", "--db", url, "--log", side, "--target", "8", "--pause-at", "4")
    assert first["stop_reason"] == "paused"
    sid = first["session_id"]
    inspected = sa.run_cli("inspect", "--db", url, "--session", sid)
    assert (inspected["lifecycle"], inspected["snapshot_integrity"]) == ("paused", "verified")
    second = sa.run_cli("run", "--db", url, "--log", side, "--session", sid)

    assert second["stop_reason"] == "final"
    assert second["state"] == expected
    begins = Counter(call for event, _, call in sa.read_side_log(side) if event == "begin")
    assert set(begins.values()) == {1}
    head = store.get_session_head(sid)
    assert head is not None and head.lifecycle == "completed"
