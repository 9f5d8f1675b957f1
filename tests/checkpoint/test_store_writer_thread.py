"""``SyncCheckpointStore``'s async twins run on one writer thread per store."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from qitos.checkpoint.sqlite_store import SqliteCheckpointStore


def _writer_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("qitos-store-SqliteCheckpointStore")}


def test_concurrent_async_calls_of_one_store_share_its_single_writer_thread(tmp_path: Path) -> None:
    before = _writer_threads()
    store = SqliteCheckpointStore(str(tmp_path / "s.db"))
    started: set[threading.Thread] = set()

    async def main() -> list[object]:
        heads = await asyncio.gather(*(store.aget_session_head(f"ses-{i}") for i in range(50)))
        started.update(_writer_threads() - before)
        await store.aclose()
        return list(heads)

    assert asyncio.run(main()) == [None] * 50
    assert len(started) == 1  # one thread for the store, not one per call
    (thread,) = started
    thread.join(5)
    assert not thread.is_alive()  # aclose let the writer thread exit


def test_two_stores_get_two_writer_threads(tmp_path: Path) -> None:
    first = SqliteCheckpointStore(str(tmp_path / "a.db"))
    second = SqliteCheckpointStore(str(tmp_path / "b.db"))
    started: set[threading.Thread] = set()

    async def main() -> None:
        before = _writer_threads()
        await first.aget_session_head("ses-x")
        await second.aget_session_head("ses-x")
        await first.aget_session_head("ses-y")
        started.update(_writer_threads() - before)
        await first.aclose()
        await second.aclose()

    asyncio.run(main())
    assert len(started) == 2
