"""Background WAL checkpoints for the SQLite store: a commit never pays for copying the log back.

In WAL mode every commit appends pages to ``<db>-wal``; a *checkpoint* copies them into the main
file (and syncs it) so the log can restart. SQLite's default runs that checkpoint inside whichever
commit crosses 1000 log pages, which turns one step in a few hundred into a multi-millisecond one
and, averaged over a run, roughly doubles the cost of a small commit.

:class:`WalCheckpointer` moves that work to a daemon thread with its own connection. The writer calls
:meth:`WalCheckpointer.committed` after each commit (a counter increment); every ``every`` commits
the thread runs ``PRAGMA wal_checkpoint(PASSIVE)``, which never blocks writers or readers (SQLite
releases the GIL while it runs). The writer keeps a larger ``wal_autocheckpoint`` (2000 pages) as a
safety net: the log stays bounded if this thread falls behind or the process forks without it, and
because a passive checkpoint racing continuous commits never backfills the very last frames, it is
also what lets the log restart from its beginning; by then the thread has copied almost everything,
so that commit pays little.

A checkpoint changes no committed data and is crash-safe at any instant, so stopping the thread
(``close``) or losing it (interpreter exit, ``fork``) loses nothing. A ``fork`` waits for a
running checkpoint to finish first: a child forked while the thread is inside SQLite would inherit
SQLite's internal mutexes locked and hang on its first query.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import weakref
from collections.abc import Callable
from typing import Final

__all__ = ["SAFETY_NET_PAGES", "WalCheckpointer"]

SAFETY_NET_PAGES: Final = 2000
"""The writer connection's own ``wal_autocheckpoint``: used only if the background thread lags."""

_LIVE: weakref.WeakSet[WalCheckpointer] = weakref.WeakSet()


def _before_fork() -> None:
    for checkpointer in list(_LIVE):
        checkpointer._busy.acquire()


def _after_fork_in_parent() -> None:
    for checkpointer in list(_LIVE):
        checkpointer._busy.release()


def _after_fork_in_child() -> None:
    for checkpointer in list(_LIVE):
        checkpointer._busy = threading.Lock()  # the thread holding nothing does not exist here


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


class WalCheckpointer:
    """Runs passive WAL checkpoints on a background thread, every ``every`` commits.

    ``connect`` opens a new connection to the same database (called once, on the thread). The
    thread starts with the first checkpoint that is due and stops at :meth:`close`.
    """

    def __init__(self, connect: Callable[[], sqlite3.Connection], *, every: int = 128) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self._connect = connect
        self._every = every
        self._pending = 0
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._busy = threading.Lock()  # held while the thread is inside SQLite (see _before_fork)
        _LIVE.add(self)
        self.checkpoints = 0
        """Checkpoints completed so far (observable by tests and benchmarks)."""
        self.last_error: sqlite3.Error | None = None
        """The last checkpoint failure, if any: a failed checkpoint is retried at the next one due."""

    def committed(self) -> None:
        """Count one commit; wake the thread when a checkpoint is due. Cheap: called per commit."""
        self._pending += 1
        if self._pending >= self._every:
            self._pending = 0
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="qitos-wal-checkpoint", daemon=True)
                self._thread.start()
            self._wake.set()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread, letting a running checkpoint finish (bounded by ``timeout``)."""
        self._stopping = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _loop(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stopping:
                    return
                with self._busy:
                    try:
                        if conn is None:
                            conn = self._connect()
                        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                        self.checkpoints += 1
                    except sqlite3.Error as exc:  # busy or I/O: the safety net and the next round cover it
                        self.last_error = exc
        finally:
            if conn is not None:
                with self._busy, contextlib.suppress(sqlite3.Error):
                    conn.close()
