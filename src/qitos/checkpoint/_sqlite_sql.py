"""The SQLite checkpoint store's schema, migrations and statements.

Kept apart from :mod:`qitos.checkpoint._sqlite_store` (which runs them) so the SQL can be read in one
place, as :mod:`qitos.checkpoint._postgres_sql` is for PostgreSQL. Fixed SQL strings: sqlite3
compiles each once and reuses it from its statement cache.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from qitos.checkpoint._records import StepWrite
from qitos.checkpoint._rules import (
    NO_WRITES_DIGEST,
    control_digest,
    fold_write_digests,
    head_digest,
    metadata_digest,
    write_digest,
)

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "Migration", "head_list_in", "tally_hex"]


@dataclass(frozen=True, slots=True)
class Migration:
    """One step of the schema history: its version, a name, its statements and any backfill."""

    version: int
    name: str
    statements: tuple[str, ...]
    # Run after the statements, in the same transaction: rewrites rows SQL alone cannot compute.
    backfill: Callable[[sqlite3.Cursor], None] | None = None


def _backfill_digests(cur: sqlite3.Cursor) -> None:
    """Migration 3: digests for the rows written before rows carried them."""
    for session_id, metadata in cur.execute("SELECT session_id, metadata FROM sessions").fetchall():
        cur.execute(
            "UPDATE sessions SET digest = ? WHERE session_id = ?", (metadata_digest(session_id, metadata), session_id)
        )
    rows = cur.execute("SELECT session_id, snapshot_id, sequence, lifecycle, updated_at FROM heads").fetchall()
    for session_id, snapshot_id, sequence, lifecycle, updated_at in rows:
        digest = head_digest(session_id, snapshot_id, sequence, lifecycle, updated_at)
        cur.execute("UPDATE heads SET digest = ? WHERE session_id = ?", (digest, session_id))
    rows = cur.execute("SELECT rowid, session_id, base_snapshot_id, step_id, kind, key, payload FROM writes").fetchall()
    for rowid, session_id, base, step_id, kind, key, payload in rows:
        write = StepWrite(session_id=session_id, base_snapshot_id=base, step_id=step_id, kind=kind, key=key, payload={})
        cur.execute("UPDATE writes SET digest = ? WHERE rowid = ?", (write_digest(write, payload), rowid))
    rows = cur.execute("SELECT session_id, position, kind, payload, created_at FROM control").fetchall()
    for session_id, position, kind, payload, created_at in rows:
        digest = control_digest(session_id, position, kind, payload, created_at)
        cur.execute(
            "UPDATE control SET digest = ? WHERE session_id = ? AND position = ?", (digest, session_id, position)
        )


def _backfill_tallies(cur: sqlite3.Cursor) -> None:
    """Migration 4: the tally of the pending writes on each head, from the rows written before it was kept."""
    rows = cur.execute(
        "SELECT h.session_id, COUNT(w.digest), GROUP_CONCAT(w.digest) FROM heads h JOIN writes w"
        " ON w.session_id = h.session_id AND w.base_snapshot_id = h.snapshot_id GROUP BY h.session_id"
    ).fetchall()
    for session_id, count, digests in rows:
        fold = fold_write_digests(NO_WRITES_DIGEST, digests.split(","))
        cur.execute(
            "UPDATE heads SET writes_count = ?, writes_digest = ? WHERE session_id = ?",
            (count, tally_hex(fold), session_id),
        )


# Ordered schema history. Never edit an applied migration: append a new one.
MIGRATIONS: Final[tuple[Migration, ...]] = (
    Migration(
        1,
        "initial schema",
        (
            "CREATE TABLE snapshots (snapshot_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, "
            "parent_id TEXT, base_id TEXT, sequence INTEGER NOT NULL, created_at TEXT NOT NULL, "
            "payload TEXT NOT NULL)",
            "CREATE TABLE heads (session_id TEXT PRIMARY KEY, snapshot_id TEXT NOT NULL, "
            "sequence INTEGER NOT NULL, lifecycle TEXT NOT NULL, updated_at TEXT NOT NULL, "
            "metadata TEXT NOT NULL)",
            "CREATE TABLE writes (session_id TEXT NOT NULL, base_snapshot_id TEXT NOT NULL, "
            "kind TEXT NOT NULL, key TEXT NOT NULL, step_id INTEGER NOT NULL, payload TEXT NOT NULL, "
            "PRIMARY KEY (session_id, base_snapshot_id, kind, key))",
            "CREATE TABLE control (session_id TEXT NOT NULL, position INTEGER NOT NULL, "
            "kind TEXT NOT NULL, payload TEXT NOT NULL, created_at TEXT NOT NULL, "
            "PRIMARY KEY (session_id, position)) WITHOUT ROWID",
            "CREATE TABLE blobs (digest TEXT PRIMARY KEY, data BLOB NOT NULL)",
        ),
    ),
    Migration(
        2,
        "compressed payloads and creation operation ids",
        (
            "ALTER TABLE snapshots ADD COLUMN encoding TEXT NOT NULL DEFAULT 'json'",
            "CREATE TABLE operations (operation_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, "
            "snapshot_id TEXT NOT NULL, created_at TEXT NOT NULL)",
        ),
    ),
    Migration(
        3,
        "session leases, verified rows, metadata written once",
        (
            # The metadata (with the task) moves out of the head row, which every commit rewrites.
            "CREATE TABLE sessions (session_id TEXT PRIMARY KEY, metadata TEXT NOT NULL, digest TEXT NOT NULL)",
            "INSERT INTO sessions (session_id, metadata, digest) SELECT session_id, metadata, '' FROM heads",
            "ALTER TABLE heads DROP COLUMN metadata",
            "ALTER TABLE heads ADD COLUMN digest TEXT NOT NULL DEFAULT ''",
            "ALTER TABLE heads ADD COLUMN control_seq INTEGER NOT NULL DEFAULT 0",
            "UPDATE heads SET control_seq = "
            "(SELECT COALESCE(MAX(position), 0) FROM control WHERE control.session_id = heads.session_id)",
            "ALTER TABLE writes ADD COLUMN digest TEXT NOT NULL DEFAULT ''",
            "ALTER TABLE control ADD COLUMN digest TEXT NOT NULL DEFAULT ''",
            "CREATE TABLE leases (session_id TEXT PRIMARY KEY, owner TEXT NOT NULL, token INTEGER NOT NULL, "
            "expires_at REAL NOT NULL)",
        ),
        _backfill_digests,
    ),
    Migration(
        4,
        "the head's tally of its unfinished step's pending writes; a step's writes end with it",
        (
            # How many pending writes the head's unfinished step has and the XOR of their digests
            # (qitos.checkpoint._rules): a write that is lost, or whose key columns were altered, is
            # detected. A commit that moves the head resets them, and the trigger deletes the rows of
            # the step the commit ended (restore reads only the head's): they no longer grow the file.
            # The rows of steps committed before stay: they hold those steps' model calls.
            "ALTER TABLE heads ADD COLUMN writes_count INTEGER NOT NULL DEFAULT 0",
            "ALTER TABLE heads ADD COLUMN writes_digest TEXT NOT NULL DEFAULT ''",
            "CREATE TRIGGER step_writes_done AFTER UPDATE OF snapshot_id ON heads"
            " WHEN OLD.writes_count > 0 AND NEW.snapshot_id IS NOT OLD.snapshot_id BEGIN"
            " DELETE FROM writes WHERE session_id = OLD.session_id AND base_snapshot_id = OLD.snapshot_id; END",
        ),
        _backfill_tallies,
    ),
)
SCHEMA_VERSION: Final[int] = MIGRATIONS[-1].version
"""The schema version this code writes; older files are migrated to it on open."""

SCHEMA_EXISTS = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
SCHEMA_TABLE = (
    "CREATE TABLE IF NOT EXISTS schema_version "
    "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
)
SCHEMA_VERSION_GET = "SELECT COALESCE(MAX(version), 0) FROM schema_version"
SCHEMA_RECORD = "INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)"

HEAD_CREATE = (
    "INSERT INTO heads (session_id, snapshot_id, sequence, lifecycle, updated_at, digest) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (session_id) DO NOTHING"
)
_HEAD_ADVANCE = (
    "UPDATE heads SET snapshot_id = ?, sequence = ?, lifecycle = ?, updated_at = ?, digest = ?, "
    "writes_count = 0, writes_digest = '' WHERE session_id = ? AND snapshot_id = ?"
)
HEAD_ADVANCE = f"{_HEAD_ADVANCE} RETURNING control_seq"
HEAD_ADVANCE_FENCED = (
    f"{_HEAD_ADVANCE} AND EXISTS (SELECT 1 FROM leases WHERE session_id = ? AND token = ? AND expires_at > ?)"
    " RETURNING control_seq"
)
METADATA_CREATE = "INSERT INTO sessions (session_id, metadata, digest) VALUES (?, ?, ?)"
METADATA_SET = "UPDATE sessions SET metadata = ?, digest = ? WHERE session_id = ?"
HEAD_ID = "SELECT snapshot_id FROM heads WHERE session_id = ?"
_HEAD_COLUMNS = (
    "h.session_id, h.snapshot_id, h.sequence, h.lifecycle, h.updated_at, h.digest, "
    "CAST(m.metadata AS BLOB), m.digest, h.control_seq FROM heads h LEFT JOIN sessions m ON m.session_id = h.session_id"
)
HEAD_GET = f"SELECT {_HEAD_COLUMNS} WHERE h.session_id = ?"
HEAD_LIST = f"SELECT {_HEAD_COLUMNS} ORDER BY h.rowid"


def head_list_in(count: int) -> str:
    """The heads in one of ``count`` lifecycles, in creation order."""
    return f"SELECT {_HEAD_COLUMNS} WHERE h.lifecycle IN ({', '.join('?' * count)}) ORDER BY h.rowid"


LEASE_GET = "SELECT owner, token, expires_at FROM leases WHERE session_id = ?"
LEASE_PUT = (
    "INSERT INTO leases (session_id, owner, token, expires_at) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (session_id) DO UPDATE SET owner = excluded.owner, token = excluded.token, "
    "expires_at = excluded.expires_at"
)
LEASE_RELEASE = "UPDATE leases SET expires_at = 0 WHERE session_id = ? AND token = ? AND owner = ?"
SNAPSHOT_SESSION = "SELECT session_id FROM snapshots WHERE snapshot_id = ?"
SNAPSHOT_INSERT = (
    "INSERT OR IGNORE INTO snapshots "
    "(snapshot_id, session_id, parent_id, base_id, sequence, created_at, encoding, payload) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_SNAPSHOT_COLUMNS = "snapshot_id, session_id, parent_id, base_id, sequence, created_at, encoding, payload"
SNAPSHOT_GET = (
    "SELECT snapshot_id, session_id, parent_id, base_id, sequence, created_at, encoding, "
    "CAST(payload AS BLOB) FROM snapshots WHERE snapshot_id = ?"
)
# The snapshot and its ancestors up to its base (``stop``), in one recursive query.
CHAIN = (
    f"WITH RECURSIVE chain({_SNAPSHOT_COLUMNS}, stop, depth) AS ("
    f" SELECT {_SNAPSHOT_COLUMNS}, base_id, 0 FROM snapshots WHERE snapshot_id = ?"
    " UNION ALL"
    " SELECT p.snapshot_id, p.session_id, p.parent_id, p.base_id, p.sequence, p.created_at, p.encoding,"
    " p.payload, chain.stop, chain.depth + 1"
    " FROM chain JOIN snapshots p ON p.snapshot_id = chain.parent_id"
    " WHERE chain.stop IS NOT NULL AND chain.snapshot_id != chain.stop AND chain.depth < ?)"
    " SELECT snapshot_id, session_id, parent_id, base_id, sequence, created_at, encoding,"
    " CAST(payload AS BLOB), stop, depth FROM chain"
)
# The chain's two ends: the snapshot's rowid and session, its base and the base's rowid.
CHAIN_ENDS = (
    "SELECT s.rowid, s.session_id, s.base_id, b.rowid FROM snapshots s "
    "LEFT JOIN snapshots b ON b.snapshot_id = s.base_id WHERE s.snapshot_id = ?"
)
CHAIN_RANGE = (
    "SELECT snapshot_id, session_id, parent_id, base_id, sequence, created_at, encoding, "
    "CAST(payload AS BLOB) FROM snapshots WHERE rowid BETWEEN ? AND ? AND session_id = ?"
)
# A session's head chain, newest first, staying within the session.
SESSION_CHAIN = (
    "WITH RECURSIVE chain(snapshot_id, parent_id, depth) AS ("
    " SELECT s.snapshot_id, s.parent_id, 0 FROM heads h JOIN snapshots s ON s.snapshot_id = h.snapshot_id"
    " WHERE h.session_id = ?1"
    " UNION ALL"
    " SELECT p.snapshot_id, p.parent_id, chain.depth + 1 FROM chain"
    " JOIN snapshots p ON p.snapshot_id = chain.parent_id WHERE p.session_id = ?1)"
    " SELECT snapshot_id FROM chain ORDER BY depth"
)
OPERATION_GET = "SELECT session_id FROM operations WHERE operation_id = ?"
OPERATION_INSERT = "INSERT INTO operations (operation_id, session_id, snapshot_id, created_at) VALUES (?, ?, ?, ?)"
WRITE_INSERT = (
    "INSERT OR IGNORE INTO writes (session_id, base_snapshot_id, kind, key, step_id, payload, digest) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
# The head's tally when the base is the session's head (row 0), then the writes in write order.
WRITE_LIST = (
    "SELECT 0, writes_count, NULL, NULL, NULL, writes_digest FROM heads WHERE session_id = ?1 AND snapshot_id = ?2"
    " UNION ALL SELECT rowid, step_id, CAST(kind AS BLOB), CAST(key AS BLOB), CAST(payload AS BLOB), digest"
    " FROM writes WHERE session_id = ?1 AND base_snapshot_id = ?2 ORDER BY 1"
)
# A write's base snapshot: its session, and that session's head with the tally of its writes.
WRITE_BASE = (
    "SELECT s.session_id, h.snapshot_id, h.writes_digest FROM snapshots s"
    " LEFT JOIN heads h ON h.session_id = ?1 WHERE s.snapshot_id = ?2"
)
WRITE_TALLY = (
    "UPDATE heads SET writes_count = writes_count + ?, writes_digest = ? WHERE session_id = ? AND snapshot_id = ?"
)
# Control positions come from a counter in the head row (never MAX()+1 over the items).
CONTROL_NEXT = "UPDATE heads SET control_seq = control_seq + 1 WHERE session_id = ? RETURNING control_seq"
CONTROL_SEQ = "SELECT control_seq FROM heads WHERE session_id = ?"
HEAD_AND_CONTROL_SEQ = "SELECT snapshot_id, control_seq FROM heads WHERE session_id = ?"
CONTROL_INSERT = (
    "INSERT INTO control (session_id, position, kind, payload, created_at, digest) VALUES (?, ?, ?, ?, ?, ?)"
)
CONTROL_LIST = (
    "SELECT position, CAST(kind AS BLOB), CAST(payload AS BLOB), CAST(created_at AS BLOB), digest FROM control "
    "WHERE session_id = ? AND position > ? ORDER BY position"
)
BLOB_INSERT = "INSERT OR IGNORE INTO blobs (digest, data) VALUES (?, ?)"
# One statement for any number of digests: they travel as one JSON array parameter.
BLOB_GET = "SELECT digest, data FROM blobs WHERE digest IN (SELECT value FROM json_each(?))"
KEEP_TABLE = "CREATE TEMP TABLE IF NOT EXISTS prune_keep (snapshot_id TEXT PRIMARY KEY)"
KEEP_CLEAR = "DELETE FROM temp.prune_keep"
KEEP_INSERT = "INSERT OR IGNORE INTO temp.prune_keep (snapshot_id) VALUES (?)"
KEEP_MISSING = (
    "SELECT k.snapshot_id FROM temp.prune_keep k LEFT JOIN snapshots s ON s.snapshot_id = k.snapshot_id "
    "WHERE s.snapshot_id IS NULL ORDER BY k.snapshot_id LIMIT 1"
)
# Rows as _stored_row reads them (the payload as bytes).
_STORED_COLUMNS = "snapshot_id, session_id, parent_id, base_id, sequence, created_at, encoding, CAST(payload AS BLOB)"
# The snapshots no head and no kept snapshot reaches through parent links.
PRUNE_DOOMED = (
    "WITH RECURSIVE reach(snapshot_id) AS ("
    " SELECT snapshot_id FROM heads UNION SELECT snapshot_id FROM temp.prune_keep"
    " UNION SELECT s.parent_id FROM snapshots s JOIN reach r ON s.snapshot_id = r.snapshot_id"
    " WHERE s.parent_id IS NOT NULL)"
    f" SELECT {_STORED_COLUMNS} FROM snapshots WHERE snapshot_id NOT IN (SELECT snapshot_id FROM reach)"
)
PRUNE = "DELETE FROM snapshots WHERE snapshot_id IN (SELECT value FROM json_each(?))"
DOOMED_WRITES = "SELECT payload FROM writes WHERE base_snapshot_id NOT IN (SELECT snapshot_id FROM snapshots)"
ALL_SNAPSHOTS = f"SELECT {_STORED_COLUMNS} FROM snapshots"
ALL_WRITES = "SELECT payload FROM writes"
BLOB_PRESENT = "SELECT digest FROM blobs WHERE digest IN (SELECT value FROM json_each(?))"
BLOB_DELETE = "DELETE FROM blobs WHERE digest IN (SELECT value FROM json_each(?))"
PRUNE_WRITES = "DELETE FROM writes WHERE base_snapshot_id NOT IN (SELECT snapshot_id FROM snapshots)"
SNAPSHOT_COUNT = "SELECT COUNT(*) FROM snapshots"


def tally_hex(fold: int) -> str:
    """A tally's digest as stored: 64 hex digits, or '' for none."""
    return f"{fold:064x}" if fold else ""
