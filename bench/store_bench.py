"""Raw checkpoint-store cost per snapshot, side by side with a raw SQLite WAL insert, in one run.

    .venv/bin/python bench/store_bench.py [--n 1000]

Each step commits one snapshot whose payload is a 1 KiB delta (an append), moving the session
head with compare-and-swap. The anchor is a plain ``INSERT`` of the same 1 KiB into a WAL-mode
table with ``synchronous=NORMAL`` (autocommit), interleaved step by step with the store commits
so both see the same machine noise. Snapshot building (``SessionSnapshot.create``: canonical
JSON + SHA-256) is timed separately from the store commit. Also reported: the database size
after N commits, ``synchronous=FULL``, the in-memory store, reads, and a restore of the head
chain in a fresh process.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import statistics
import string
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from qitos.checkpoint._memory_store import InMemoryCheckpointStore
from qitos.checkpoint._records import SessionSnapshot, SessionSnapshotCommit, StepWrite
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
from qitos.checkpoint.store import CheckpointStore

KIB = "".join(random.Random(7).choice(string.ascii_letters + " ") for _ in range(1024))


def _files_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def _stats(samples: list[float]) -> dict[str, float]:
    us = [s * 1e6 for s in samples]
    k = max(1, len(us) // 10)
    return {
        "mean": statistics.fmean(us),
        "median": statistics.median(us),
        "p95": sorted(us)[int(len(us) * 0.95) - 1],
        "first": statistics.fmean(us[:k]),
        "last": statistics.fmean(us[-k:]),
        "first_median": statistics.median(us[:k]),
        "last_median": statistics.median(us[-k:]),
    }


def run_commits(
    store: CheckpointStore, n: int, anchor: Callable[[], float] | None = None
) -> tuple[list[float], list[float], list[float], list[SessionSnapshot]]:
    """N delta commits; returns (store commit times, create times, anchor times, snapshots)."""
    first = SessionSnapshot.create(session_id="bench", parent_id=None, base_id=None, sequence=0, payload={"full": {}})
    store.commit_session_snapshot(
        SessionSnapshotCommit(session_id="bench", expected_head=None, snapshot=first, lifecycle="created")
    )
    commit_t: list[float] = []
    create_t: list[float] = []
    anchor_t: list[float] = []
    snaps = [first]
    head = first
    for i in range(1, n + 1):
        t0 = time.perf_counter()
        nxt = SessionSnapshot.create(
            session_id="bench",
            parent_id=head.snapshot_id,
            base_id=first.snapshot_id,
            sequence=i,
            payload={"ops": [{"op": "append", "path": "notes", "value": KIB}]},
        )
        request = SessionSnapshotCommit(
            session_id="bench", expected_head=head.snapshot_id, snapshot=nxt, lifecycle="running"
        )
        t1 = time.perf_counter()
        store.commit_session_snapshot(request)
        t2 = time.perf_counter()
        create_t.append(t1 - t0)
        commit_t.append(t2 - t1)
        if anchor is not None:
            anchor_t.append(anchor())
        head = nxt
        snaps.append(nxt)
    return commit_t, create_t, anchor_t, snaps


def raw_anchor(path: Path) -> tuple[Callable[[], float], sqlite3.Connection]:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, data TEXT NOT NULL)")
    sql = "INSERT INTO t (data) VALUES (?)"

    def insert() -> float:
        t0 = time.perf_counter()
        conn.execute(sql, (KIB,))
        return time.perf_counter() - t0

    return insert, conn


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median µs per call (robust to the machine's other load)."""
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


_RESTORE = r"""
import sys, time
from qitos.checkpoint._sqlite_store import SqliteCheckpointStore
t0 = time.perf_counter()
store = SqliteCheckpointStore(sys.argv[1])
head = store.get_session_head("bench")
chain = store.load_chain(sys.argv[2] if len(sys.argv) > 2 else head.snapshot_id)
t1 = time.perf_counter()
print(f"{(t1 - t0) * 1e3:.3f} {len(chain)}")
"""


def restore_ms(db: Path, *snapshot_id: str) -> tuple[float, int]:
    """Fresh process: open the store, read the head, load a chain (timed after imports)."""
    out = subprocess.run(
        [sys.executable, "-c", _RESTORE, str(db), *snapshot_id], capture_output=True, text=True, check=True
    ).stdout.split()
    return float(out[0]), int(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="commits per run (default 1000)")
    n = parser.parse_args().n
    work = Path(tempfile.mkdtemp(prefix="qitos-store-bench-"))
    print(
        f"qitos checkpoint store bench: {n} commits of 1 KiB deltas; SQLite {sqlite3.sqlite_version}; "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; {work}"
    )

    # 1. SQLite store (NORMAL) interleaved with the raw WAL insert anchor; sizes right after.
    anchor, raw_conn = raw_anchor(work / "raw.db")
    db = work / "normal.db"
    store = SqliteCheckpointStore(db)
    commit_t, create_t, anchor_t, snaps = run_commits(store, n, anchor)
    store.close()
    raw_conn.close()
    normal_size = _files_size(db)
    raw_size = _files_size(work / "raw.db")

    # Reads and the other writes, on the same file.
    store = SqliteCheckpointStore(db)
    head = snaps[-1]
    get_us = timed(lambda: store.get_snapshot(head.snapshot_id), 300)
    chain_full_us = timed(lambda: store.load_chain(head.snapshot_id), 5)
    short = snaps[10]
    chain_short_us = timed(lambda: store.load_chain(short.snapshot_id), 300)
    writes_us = timed(
        lambda: store.put_writes(
            [
                StepWrite(
                    session_id="bench",
                    base_snapshot_id=head.snapshot_id,
                    step_id=n + 1,
                    kind="tool_result",
                    key=os.urandom(8).hex(),
                    payload={"content": KIB},
                )
            ]
        ),
        300,
    )
    control_us = timed(lambda: store.append_control("bench", "steer", {"text": "go on"}), 300)
    store.close()

    # 2. synchronous=FULL, and the in-memory store.
    full_store = SqliteCheckpointStore(work / "full.db", synchronous="FULL")
    full_t, _, _, _ = run_commits(full_store, n)
    full_store.close()
    memory_t, _, _, _ = run_commits(InMemoryCheckpointStore(), n)

    # 3. A large full materialization (64 KiB of conversation-like JSON), with and without compression.
    big = {"full": {"messages": [{"role": "user", "content": f"message {i}: " + KIB[:200]} for i in range(300)]}}
    compression = []
    for label, threshold in [("zstd from 512 B (default)", 512), ("never compressed", None)]:
        path = work / f"big-{threshold}.db"
        big_store = SqliteCheckpointStore(path, compress_min_bytes=threshold)
        times = []
        for i in range(30):
            snapshot = SessionSnapshot.create(
                session_id=f"big{i}", parent_id=None, base_id=None, sequence=0, payload=big
            )
            t0 = time.perf_counter()
            big_store.commit_session_snapshot(
                SessionSnapshotCommit(session_id=f"big{i}", expected_head=None, snapshot=snapshot, lifecycle="c")
            )
            times.append(time.perf_counter() - t0)
        read_us = timed(partial(big_store.get_snapshot, snapshot.snapshot_id), 30)
        big_store.close()
        compression.append((label, statistics.median(times) * 1e6, read_us, _files_size(path) / 30))
    big_bytes = len(
        SessionSnapshot.create(session_id="x", parent_id=None, base_id=None, sequence=0, payload=big)
        .canonical_payload()
        .encode()
    )

    # 4. Restore of the head chain (base + N deltas) and of a short chain, in a fresh process.
    restore_full = restore_ms(db)
    restore_short = restore_ms(db, snaps[16].snapshot_id)

    s, a, f, m, c = _stats(commit_t), _stats(anchor_t), _stats(full_t), _stats(memory_t), _stats(create_t)
    print()
    print(
        f"{'per snapshot (µs)':<38}{'mean':>9}{'median':>9}{'p95':>9}{'first10%':>10}{'last10%':>10}"
    )  # tenths: means
    for label, row in [
        ("raw sqlite3 WAL insert 1 KiB (anchor)", a),
        ("SqliteCheckpointStore commit NORMAL", s),
        ("SqliteCheckpointStore commit FULL", f),
        ("InMemoryCheckpointStore commit", m),
        ("SessionSnapshot.create (JSON+SHA256)", c),
    ]:
        print(
            f"{label:<38}{row['mean']:>9.1f}{row['median']:>9.1f}{row['p95']:>9.1f}"
            f"{row['first']:>10.1f}{row['last']:>10.1f}"
        )
    print()
    print(f"store commit / raw insert:  mean {s['mean'] / a['mean']:.2f}x   median {s['median'] / a['median']:.2f}x")
    print(
        f"store commit last10% / first10%: mean {s['last'] / s['first']:.2f}x, median "
        f"{s['last_median'] / s['first_median']:.2f}x  (raw anchor: mean {a['last'] / a['first']:.2f}x, "
        f"median {a['last_median'] / a['first_median']:.2f}x)"
    )
    print(f"create + commit (median): {c['median'] + s['median']:.1f} µs per durable snapshot")
    print()
    print(f"database after {n} commits: {normal_size / 1e6:.3f} MB ({normal_size / n:.0f} B/commit)")
    print(f"  raw anchor table with the same {n} x 1 KiB: {raw_size / 1e6:.3f} MB; ratio {normal_size / raw_size:.2f}x")
    print()
    print(
        f"get_snapshot: {get_us:.1f} µs   load_chain(11 snapshots): {chain_short_us:.1f} µs   "
        f"load_chain({n + 1} snapshots): {chain_full_us / 1e3:.2f} ms"
    )
    print(f"put_writes(1 x 1 KiB): {writes_us:.1f} µs   append_control: {control_us:.1f} µs")
    print(
        f"fresh process, open + head + load_chain: {restore_short[1]} snapshots {restore_short[0]:.2f} ms, "
        f"{restore_full[1]} snapshots {restore_full[0]:.2f} ms"
    )
    print()
    print(f"full materialization of {big_bytes / 1024:.0f} KiB canonical JSON, 30 sessions:")
    for label, commit_us, read_us, per_session in compression:
        print(
            f"  {label:<28} commit {commit_us:8.1f} µs   get_snapshot {read_us:8.1f} µs   "
            f"{per_session / 1024:6.1f} KiB on disk per snapshot"
        )


if __name__ == "__main__":
    main()
