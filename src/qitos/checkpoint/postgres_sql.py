"""The PostgreSQL checkpoint store's schema, migrations and statements, for one schema name.

Kept apart from :mod:`qitos.checkpoint.postgres_store` (which runs them) so the SQL can be read in
one place. Every statement names its tables through the store's schema (tests use one schema
each); payloads are ``bytea`` holding the exact canonical JSON bytes (or a Zstandard frame of them,
see ``encoding``), never ``jsonb``, which would reorder keys and break the digests. Timestamps the
contract returns are the stores' shared ISO text (``utc_now``); lease expiry uses the database
clock (``clock_timestamp()``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from qitos.core.errors import ConfigurationError

__all__ = ["SCHEMA_VERSION", "Migration", "StoreSql", "channel_name"]

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,40}")


@dataclass(frozen=True, slots=True)
class Migration:
    """One step of the schema history: its version, a name, and its statements (``{s}`` = schema)."""

    version: int
    name: str
    statements: tuple[str, ...]


# Ordered schema history. Never edit an applied migration: append a new one.
MIGRATIONS: Final[tuple[Migration, ...]] = (
    Migration(
        1,
        "initial schema",
        (
            "CREATE TABLE {s}.snapshots (snapshot_id text PRIMARY KEY, session_id text NOT NULL, "
            "parent_id text, base_id text, sequence bigint NOT NULL, created_at text NOT NULL, "
            "encoding text NOT NULL, payload bytea NOT NULL)",
            # created_seq: creation order for list_sessions; control_seq: the last control position.
            "CREATE TABLE {s}.heads (session_id text PRIMARY KEY, "
            "created_seq bigint GENERATED ALWAYS AS IDENTITY, snapshot_id text NOT NULL, "
            "sequence bigint NOT NULL, lifecycle text NOT NULL, updated_at text NOT NULL, "
            "metadata bytea NOT NULL, control_seq bigint NOT NULL DEFAULT 0)",
            "CREATE TABLE {s}.writes (session_id text NOT NULL, base_snapshot_id text NOT NULL, "
            "kind text NOT NULL, key text NOT NULL, step_id bigint NOT NULL, payload bytea NOT NULL, "
            "write_seq bigint GENERATED ALWAYS AS IDENTITY, "
            "PRIMARY KEY (session_id, base_snapshot_id, kind, key))",
            "CREATE INDEX writes_base ON {s}.writes (base_snapshot_id)",
            "CREATE TABLE {s}.control (session_id text NOT NULL, position bigint NOT NULL, "
            "kind text NOT NULL, payload bytea NOT NULL, created_at text NOT NULL, "
            "PRIMARY KEY (session_id, position))",
            "CREATE TABLE {s}.blobs (digest text PRIMARY KEY, data bytea NOT NULL)",
            "CREATE TABLE {s}.operations (operation_id text PRIMARY KEY, session_id text NOT NULL, "
            "snapshot_id text NOT NULL, created_at text NOT NULL)",
        ),
    ),
)
SCHEMA_VERSION: Final[int] = MIGRATIONS[-1].version
"""The schema version this code writes; older schemas are migrated to it on open."""


def channel_name(schema: str) -> str:
    """The LISTEN/NOTIFY channel on which a schema's control appends are announced."""
    return f"qitos_control_{schema}"


class StoreSql:
    """Every statement of the store, formatted once for one (validated) schema name."""

    def __init__(self, schema: str) -> None:
        if not isinstance(schema, str) or _SCHEMA_NAME.fullmatch(schema) is None:
            raise ConfigurationError(
                f"schema must be a lower-case SQL identifier of at most 41 characters "
                f"([a-z_][a-z0-9_]*), got {schema!r}"
            )
        self.schema = schema
        self.channel = channel_name(schema)
        s = f'"{schema}"'
        self.migrations = tuple(
            Migration(m.version, m.name, tuple(statement.format(s=s) for statement in m.statements))
            for m in MIGRATIONS
        )
        self.create_schema = f"CREATE SCHEMA IF NOT EXISTS {s}"
        self.migration_lock = "SELECT pg_advisory_xact_lock(hashtext(%s))"
        self.schema_table = (
            f"CREATE TABLE IF NOT EXISTS {s}.schema_version "
            "(version integer PRIMARY KEY, name text NOT NULL, applied_at text NOT NULL)"
        )
        self.schema_version = f"SELECT COALESCE(MAX(version), 0) FROM {s}.schema_version"
        self.schema_record = f"INSERT INTO {s}.schema_version (version, name, applied_at) VALUES (%s, %s, %s)"

        # ---- heads and commits (one statement each; see PostgresCheckpointStore.commit_session_snapshot)
        allowed = (
            "(%(parent)s::text IS NULL OR %(parent)s::text = %(expected)s::text"
            f" OR EXISTS (SELECT 1 FROM {s}.snapshots WHERE snapshot_id = %(parent)s::text))"
            " AND (%(op)s::text IS NULL"
            f" OR NOT EXISTS (SELECT 1 FROM {s}.operations WHERE operation_id = %(op)s::text))"
        )
        inserts = (
            f", snap AS (INSERT INTO {s}.snapshots"
            " (snapshot_id, session_id, parent_id, base_id, sequence, created_at, encoding, payload)"
            " SELECT %(id)s::text, %(sid)s::text, %(parent)s::text, %(base)s::text, %(seq)s::bigint,"
            " %(created)s::text, %(encoding)s::text, %(payload)s::bytea FROM head"
            " ON CONFLICT (snapshot_id) DO NOTHING)"
            f", blob AS (INSERT INTO {s}.blobs (digest, data)"
            " SELECT t.digest, t.data FROM head, unnest(%(digests)s::text[], %(datas)s::bytea[]) AS t(digest, data)"
            " ON CONFLICT (digest) DO NOTHING)"
            f", op AS (INSERT INTO {s}.operations (operation_id, session_id, snapshot_id, created_at)"
            " SELECT %(op)s::text, %(sid)s::text, %(id)s::text, %(now)s::text FROM head"
            " WHERE %(op)s::text IS NOT NULL)"
            " SELECT count(*) FROM head"
        )
        self.commit_create = (
            f"WITH head AS (INSERT INTO {s}.heads (session_id, snapshot_id, sequence, lifecycle, updated_at, metadata)"
            " SELECT %(sid)s::text, %(id)s::text, %(seq)s::bigint, %(lifecycle)s::text, %(now)s::text,"
            " COALESCE(%(metadata)s::bytea, '\\x7b7d'::bytea)"  # b"{}"
            f" WHERE {allowed}"
            " ON CONFLICT (session_id) DO NOTHING RETURNING 1)" + inserts
        )
        self.commit_advance = (
            f"WITH head AS (UPDATE {s}.heads SET snapshot_id = %(id)s::text, sequence = %(seq)s::bigint,"
            " lifecycle = %(lifecycle)s::text, updated_at = %(now)s::text,"
            " metadata = COALESCE(%(metadata)s::bytea, metadata)"
            f" WHERE session_id = %(sid)s::text AND snapshot_id = %(expected)s::text AND {allowed}"
            " RETURNING 1)" + inserts
        )
        # Why a commit changed nothing: the head, the operation's owner, whether the parent exists.
        self.commit_refused = (
            f"SELECT (SELECT snapshot_id FROM {s}.heads WHERE session_id = %(sid)s::text),"
            f" (SELECT session_id FROM {s}.operations WHERE operation_id = %(op)s::text),"
            " (%(parent)s::text IS NULL OR %(parent)s::text = %(expected)s::text"
            f" OR EXISTS (SELECT 1 FROM {s}.snapshots WHERE snapshot_id = %(parent)s::text))"
        )
        head_columns = "session_id, snapshot_id, sequence, lifecycle, updated_at, metadata"
        self.head_get = f"SELECT {head_columns} FROM {s}.heads WHERE session_id = %s"
        self.head_list = f"SELECT {head_columns} FROM {s}.heads ORDER BY created_seq"
        self.operation_get = f"SELECT session_id FROM {s}.operations WHERE operation_id = %s"

        # ---- snapshots and chains
        columns = "snapshot_id, session_id, parent_id, base_id, sequence, created_at, encoding, payload"
        self.snapshot_get = f"SELECT {columns} FROM {s}.snapshots WHERE snapshot_id = %s"
        # The snapshot and its ancestors up to its base (``stop``), in one recursive query.
        self.chain = (
            f"WITH RECURSIVE chain({columns}, stop, depth) AS ("
            f" SELECT {columns}, base_id, 0 FROM {s}.snapshots WHERE snapshot_id = %s"
            " UNION ALL"
            " SELECT p.snapshot_id, p.session_id, p.parent_id, p.base_id, p.sequence, p.created_at, p.encoding,"
            " p.payload, chain.stop, chain.depth + 1"
            f" FROM chain JOIN {s}.snapshots p ON p.snapshot_id = chain.parent_id"
            " WHERE chain.stop IS NOT NULL AND chain.snapshot_id <> chain.stop AND chain.depth < %s)"
            f" SELECT {columns}, stop, depth FROM chain"
        )
        self.session_chain = (
            "WITH RECURSIVE chain(snapshot_id, parent_id, depth) AS ("
            f" SELECT s.snapshot_id, s.parent_id, 0 FROM {s}.heads h JOIN {s}.snapshots s"
            " ON s.snapshot_id = h.snapshot_id WHERE h.session_id = %(sid)s::text"
            " UNION ALL"
            f" SELECT p.snapshot_id, p.parent_id, chain.depth + 1 FROM chain JOIN {s}.snapshots p"
            " ON p.snapshot_id = chain.parent_id WHERE p.session_id = %(sid)s::text)"
            " SELECT snapshot_id, depth FROM chain"
            f" UNION ALL SELECT NULL, -1 WHERE NOT EXISTS (SELECT 1 FROM {s}.heads WHERE session_id = %(sid)s::text)"
            " ORDER BY 2"
        )

        # ---- pending writes: the base check and the inserts in one statement
        self.writes_put = (
            "WITH input AS (SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::bigint[],"
            " %s::bytea[]) WITH ORDINALITY AS t(session_id, base_snapshot_id, kind, key, step_id, payload, ord)),"
            " bad AS (SELECT i.base_snapshot_id, i.session_id, s.session_id AS owner FROM input i"
            f" LEFT JOIN {s}.snapshots s ON s.snapshot_id = i.base_snapshot_id"
            " WHERE s.session_id IS DISTINCT FROM i.session_id ORDER BY i.ord LIMIT 1),"
            f" ins AS (INSERT INTO {s}.writes (session_id, base_snapshot_id, kind, key, step_id, payload)"
            " SELECT session_id, base_snapshot_id, kind, key, step_id, payload FROM input"
            " WHERE NOT EXISTS (SELECT 1 FROM bad) ORDER BY ord"
            " ON CONFLICT (session_id, base_snapshot_id, kind, key) DO NOTHING"
            " RETURNING session_id, base_snapshot_id, kind, key)"
            " SELECT 'bad', base_snapshot_id, session_id, owner, NULL FROM bad"
            " UNION ALL SELECT 'new', session_id, base_snapshot_id, kind, key FROM ins"
        )
        self.writes_list = (
            f"SELECT step_id, kind, key, payload FROM {s}.writes"
            " WHERE session_id = %s AND base_snapshot_id = %s ORDER BY write_seq"
        )

        # ---- control items: the position from the head row's counter, the notify in the same statement
        self.control_append = (
            f"WITH pos AS (UPDATE {s}.heads SET control_seq = control_seq + 1 WHERE session_id = %(sid)s::text"
            " RETURNING control_seq),"
            f" ins AS (INSERT INTO {s}.control (session_id, position, kind, payload, created_at)"
            " SELECT %(sid)s::text, control_seq, %(kind)s::text, %(payload)s::bytea, %(now)s::text FROM pos"
            " RETURNING position)"
            " SELECT position, pg_notify(%(channel)s::text, %(sid)s::text)::text FROM ins"
        )
        self.control_list = (
            f"SELECT position, kind, payload, created_at FROM {s}.control"
            " WHERE session_id = %(sid)s::text AND position > %(after)s::bigint"
            f" UNION ALL SELECT -1, NULL, NULL, NULL WHERE NOT EXISTS (SELECT 1 FROM {s}.heads"
            " WHERE session_id = %(sid)s::text) ORDER BY 1"
        )
        self.listen = f'LISTEN "{self.channel}"'

        # ---- blobs
        self.blobs_put = (
            f"INSERT INTO {s}.blobs (digest, data) SELECT * FROM unnest(%s::text[], %s::bytea[])"
            " ON CONFLICT (digest) DO NOTHING"
        )
        self.blobs_get = f"SELECT digest, data FROM {s}.blobs WHERE digest = ANY(%s::text[])"

        # ---- retention (one transaction; EXCLUSIVE locks let readers in and keep writers out)
        self.prune_lock = (
            f"LOCK TABLE {s}.heads, {s}.snapshots, {s}.writes, {s}.blobs, {s}.operations IN EXCLUSIVE MODE"
        )
        self.prune_missing = (
            "SELECT k FROM unnest(%s::text[]) AS k"
            f" WHERE NOT EXISTS (SELECT 1 FROM {s}.snapshots WHERE snapshot_id = k) ORDER BY k LIMIT 1"
        )
        self.prune_doomed = (
            "WITH RECURSIVE reach(snapshot_id) AS ("
            f" SELECT snapshot_id FROM {s}.heads UNION SELECT unnest(%s::text[])"
            f" UNION SELECT p.parent_id FROM {s}.snapshots p JOIN reach r ON p.snapshot_id = r.snapshot_id"
            " WHERE p.parent_id IS NOT NULL)"
            f" SELECT {columns} FROM {s}.snapshots WHERE snapshot_id NOT IN (SELECT snapshot_id FROM reach)"
        )
        self.prune_snapshots = f"DELETE FROM {s}.snapshots WHERE snapshot_id = ANY(%s::text[])"
        self.prune_writes = (
            f"DELETE FROM {s}.writes w WHERE NOT EXISTS"
            f" (SELECT 1 FROM {s}.snapshots s WHERE s.snapshot_id = w.base_snapshot_id) RETURNING payload"
        )
        self.snapshot_count = f"SELECT count(*) FROM {s}.snapshots"
        self.all_snapshots = f"SELECT {columns} FROM {s}.snapshots"
        self.all_writes = f"SELECT payload FROM {s}.writes"
        self.blobs_present = f"SELECT digest FROM {s}.blobs WHERE digest = ANY(%s::text[])"
        self.blobs_delete = f"DELETE FROM {s}.blobs WHERE digest = ANY(%s::text[])"
        tables = ("snapshots", "heads", "writes", "control", "blobs", "operations")
        self.vacuum = tuple(f"VACUUM (ANALYZE) {s}.{table}" for table in tables)
        # Sizes of the store's tables with their indexes and TOAST (benchmarks, `qitos sessions` stats).
        self.table_sizes = (
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relkind = 'r' ORDER BY c.relname"
        )
