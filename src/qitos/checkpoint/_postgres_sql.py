"""The PostgreSQL checkpoint store's schema, migrations and statements, for one schema name.

Kept apart from :mod:`qitos.checkpoint._postgres_store` (which runs them) so the SQL can be read in
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

from qitos.core._errors import ConfigurationError

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
        "initial schema: snapshots, heads with their lease, session metadata, verified rows",
        (
            "CREATE TABLE {s}.snapshots (snapshot_id text PRIMARY KEY, session_id text NOT NULL, "
            "parent_id text, base_id text, sequence bigint NOT NULL, created_at text NOT NULL, "
            "encoding text NOT NULL, payload bytea NOT NULL)",
            # The row every commit rewrites stays small: the metadata (with the task) lives in
            # sessions, written once. created_seq orders list_sessions; control_seq is the last control
            # position; the lease lives in the head row, so a commit's UPDATE checks the fencing token
            # on the very row it moves (READ COMMITTED re-checks it after waiting on a concurrent lease
            # change). lease_expires is seconds since the epoch by the database clock.
            "CREATE TABLE {s}.heads (session_id text PRIMARY KEY, "
            "created_seq bigint GENERATED ALWAYS AS IDENTITY, snapshot_id text NOT NULL, "
            "sequence bigint NOT NULL, lifecycle text NOT NULL, updated_at text NOT NULL, digest text NOT NULL, "
            "control_seq bigint NOT NULL DEFAULT 0, lease_owner text, lease_token bigint NOT NULL DEFAULT 0, "
            "lease_expires double precision NOT NULL DEFAULT 0)",
            "CREATE TABLE {s}.sessions (session_id text PRIMARY KEY, metadata bytea NOT NULL, digest text NOT NULL)",
            "CREATE TABLE {s}.writes (session_id text NOT NULL, base_snapshot_id text NOT NULL, "
            "kind text NOT NULL, key text NOT NULL, step_id bigint NOT NULL, payload bytea NOT NULL, "
            "digest text NOT NULL, write_seq bigint GENERATED ALWAYS AS IDENTITY, "
            "PRIMARY KEY (session_id, base_snapshot_id, kind, key))",
            "CREATE INDEX writes_base ON {s}.writes (base_snapshot_id)",
            "CREATE TABLE {s}.control (session_id text NOT NULL, position bigint NOT NULL, "
            "kind text NOT NULL, payload bytea NOT NULL, created_at text NOT NULL, digest text NOT NULL, "
            "PRIMARY KEY (session_id, position))",
            "CREATE TABLE {s}.blobs (digest text PRIMARY KEY, data bytea NOT NULL)",
            "CREATE TABLE {s}.operations (operation_id text PRIMARY KEY, session_id text NOT NULL, "
            "snapshot_id text NOT NULL, created_at text NOT NULL)",
        ),
    ),
    Migration(
        2,
        "drop writes_base: every read of pending writes names the session too (the primary key)",
        # It served no read and cost an index entry (a 64-character key) per pending write, in WAL and
        # on disk: two a step with one tool call (the decision and the call's start).
        ("DROP INDEX IF EXISTS {s}.writes_base",),
    ),
    Migration(
        3,
        "the head's tally of its unfinished step's pending writes; a step's writes end with it",
        # How many pending writes the head's unfinished step has and the XOR of their row digests
        # (qitos.checkpoint._rules), moved by the statement that stores them; the commit that ends the
        # step resets them and deletes its rows (restore reads only the head's), so `writes` holds the
        # unfinished steps' writes only. The rows of steps committed before stay (their model calls).
        (
            "ALTER TABLE {s}.heads ADD COLUMN writes_count bigint NOT NULL DEFAULT 0,"
            " ADD COLUMN writes_digest bit(256) NOT NULL DEFAULT 0::bit(256)",
            "UPDATE {s}.heads h SET writes_count = t.n, writes_digest = t.x FROM (SELECT session_id, base_snapshot_id,"
            " count(*) AS n, bit_xor(('x' || digest)::bit(256)) AS x FROM {s}.writes"
            " GROUP BY session_id, base_snapshot_id) t"
            " WHERE h.session_id = t.session_id AND h.snapshot_id = t.base_snapshot_id",
        ),
    ),
)
SCHEMA_VERSION: Final[int] = MIGRATIONS[-1].version
"""The schema version this code writes; older schemas are migrated to it on open."""


def _fence_refuses(token: str) -> str:
    """The condition on a head's lease row ``f`` under which a write with ``token`` is refused: no token
    while a live lease is held, or a token that is not the live lease's."""
    return (
        f"CASE WHEN {token} IS NULL THEN f.lease_owner IS NOT NULL AND f.lease_expires > f.now"
        f" ELSE NOT (f.lease_token = {token} AND f.lease_owner IS NOT NULL AND f.lease_expires > f.now) END"
    )


# The end of both pending-write statements: first write wins, the new writes join the tally of the
# head they were written on (a write on another base changes none), and one row per refusal or new write.
_WRITE_TAIL = (
    " ON CONFLICT (session_id, base_snapshot_id, kind, key) DO NOTHING"
    " RETURNING session_id, base_snapshot_id, kind, key, digest),"
    " tally AS (UPDATE {s}.heads h SET writes_count = h.writes_count + t.n, writes_digest = h.writes_digest # t.x"
    " FROM (SELECT session_id, base_snapshot_id, count(*) AS n, bit_xor(('x' || digest)::bit(256)) AS x"
    " FROM ins GROUP BY session_id, base_snapshot_id) t"
    " WHERE h.session_id = t.session_id AND h.snapshot_id = t.base_snapshot_id)"
    " SELECT 'bad', base_snapshot_id, session_id, owner, NULL, NULL, NULL FROM bad"
    " UNION ALL SELECT 'fence', session_id, lease_owner, token::text, lease_token::text,"
    " lease_expires::text, now::text FROM fenced"
    " UNION ALL SELECT 'new', session_id, base_snapshot_id, kind, key, NULL, NULL FROM ins"
)


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
            Migration(m.version, m.name, tuple(statement.format(s=s) for statement in m.statements)) for m in MIGRATIONS
        )
        self.create_schema = f"CREATE SCHEMA IF NOT EXISTS {s}"
        self.migration_lock = "SELECT pg_advisory_xact_lock(hashtext(%s))"
        self.schema_table = (
            f"CREATE TABLE IF NOT EXISTS {s}.schema_version "
            "(version integer PRIMARY KEY, name text NOT NULL, applied_at text NOT NULL)"
        )
        self.schema_version = f"SELECT COALESCE(MAX(version), 0) FROM {s}.schema_version"
        self.schema_record = f"INSERT INTO {s}.schema_version (version, name, applied_at) VALUES (%s, %s, %s)"
        # Every statement below finds its rows by key, so one plan fits all parameter values. Left to
        # choose, PostgreSQL keeps re-planning some of them for every call (a custom plan for the
        # pending-write statement took 0.23 ms to plan, longer than it took to run), so the store's
        # connections keep the generic plan of every statement they have prepared. A generic plan made
        # while a table is (nearly) empty would scan it for as long as the connection lives, and the
        # `writes` table is often empty (a step's writes end with its commit), so those connections
        # take an index wherever there is one.
        self.generic_plans = (
            "SELECT set_config('plan_cache_mode', 'force_generic_plan', false),"
            " set_config('enable_seqscan', 'off', false)"
        )

        # ---- heads and commits (one statement each; see PostgresCheckpointStore.commit_session_snapshot)
        now = "extract(epoch FROM clock_timestamp())::float8"
        self.now = now
        self._commits: dict[tuple[bool, ...], str] = {}
        # Why a commit changed nothing: the head and its lease, the operation's owner, the parent.
        self.commit_refused = (
            f"SELECT h.snapshot_id, h.lease_owner, h.lease_token, h.lease_expires, {now},"
            f" (SELECT session_id FROM {s}.operations WHERE operation_id = %(op)s::text),"
            " (%(parent)s::text IS NULL OR %(parent)s::text = %(expected)s::text"
            f" OR EXISTS (SELECT 1 FROM {s}.snapshots WHERE snapshot_id = %(parent)s::text))"
            f" FROM (SELECT 1) AS one LEFT JOIN {s}.heads h ON h.session_id = %(sid)s::text"
        )
        position_columns = "h.session_id, h.snapshot_id, h.sequence, h.lifecycle, h.updated_at, h.digest"
        head_fields = f"{position_columns}, m.metadata, m.digest, h.control_seq"
        head_columns = f"{head_fields} FROM {s}.heads h LEFT JOIN {s}.sessions m ON m.session_id = h.session_id"
        self.head_get = f"SELECT {head_columns} WHERE h.session_id = %s"
        self.head_list = f"SELECT {head_columns} ORDER BY h.created_seq"
        # Reads of a few heads among many look each head's metadata up by key (a LATERAL lookup,
        # which LIMIT keeps from being turned into a join): joined, a generic plan could hash a scan
        # of every session's metadata.
        metadata_by_key = (
            f"LEFT JOIN LATERAL (SELECT metadata, digest FROM {s}.sessions WHERE session_id = h.session_id LIMIT 1) m"
            " ON true"
        )
        # The waiting ones a fleet supervisor looks at.
        self.head_list_in = (
            f"SELECT {head_fields} FROM {s}.heads h {metadata_by_key}"
            " WHERE h.lifecycle = ANY(%s::text[]) ORDER BY h.created_seq"
        )
        # The many-heads reads start from the wanted ids and look each head up by key, as above. As
        # `heads WHERE session_id = ANY(...)`, a generic plan made while the table was small scans the
        # whole table at every call, and a fleet's Fleet.wait makes such a call at every poll.
        heads_by_id = (
            "FROM unnest(%s::text[]) AS w(session_id)"
            f" CROSS JOIN LATERAL (SELECT * FROM {s}.heads WHERE session_id = w.session_id LIMIT 1) h"
        )
        self.head_many = f"SELECT {head_fields} {heads_by_id} {metadata_by_key}"
        self.head_positions = f"SELECT {position_columns} {heads_by_id}"
        self.head_positions_in = f"{self.head_positions} WHERE h.lifecycle = ANY(%s::text[])"
        self.operation_get = f"SELECT session_id FROM {s}.operations WHERE operation_id = %s"

        # ---- leases: read with the database clock, then a compare-and-swap on the lease columns.
        # lease_take grants in one statement the leases next_lease (qitos.checkpoint._rules) grants:
        # free or lapsed (a new token), held by the asking owner (the same token) or by the runner it
        # takes over from (a new token); no row means the store reads the lease and decides there.
        self.lease_take = (
            f"UPDATE {s}.heads h SET lease_owner = %(owner)s::text,"
            " lease_token = CASE WHEN h.lease_owner = %(owner)s::text AND h.lease_expires > c.now"
            " AND h.lease_owner IS DISTINCT FROM %(take_over)s::text THEN h.lease_token ELSE h.lease_token + 1 END,"
            " lease_expires = c.now + %(ttl)s::float8"
            f" FROM (SELECT {now} AS now) c WHERE h.session_id = %(sid)s::text"
            " AND (h.lease_owner IS NULL OR h.lease_expires <= c.now OR h.lease_owner = %(owner)s::text"
            " OR h.lease_owner = %(take_over)s::text)"
            " RETURNING h.lease_token, h.lease_expires, h.snapshot_id, h.control_seq"
        )
        self.lease_get = f"SELECT lease_owner, lease_token, lease_expires, {now} FROM {s}.heads WHERE session_id = %s"
        self.lease_swap = (
            f"UPDATE {s}.heads SET lease_owner = %(owner)s::text, lease_token = %(token)s::bigint,"
            f" lease_expires = {now} + %(ttl)s::float8"
            " WHERE session_id = %(sid)s::text AND lease_owner IS NOT DISTINCT FROM %(old_owner)s::text"
            " AND lease_token = %(old_token)s::bigint AND lease_expires = %(old_expires)s::float8"
            " RETURNING lease_expires"
        )
        self.lease_release = (
            f"UPDATE {s}.heads SET lease_expires = 0 WHERE session_id = %s AND lease_token = %s AND lease_owner = %s"
        )

        # ---- snapshots and chains
        columns = "snapshot_id, session_id, parent_id, base_id, sequence, created_at, encoding, payload"
        self.snapshot_get = f"SELECT {columns} FROM {s}.snapshots WHERE snapshot_id = %s"
        # The snapshot and its ancestors up to its base (``stop``), in one recursive query.
        chain_cte = (
            f"WITH RECURSIVE chain({columns}, stop, depth) AS ("
            f" SELECT {columns}, base_id, 0 FROM {s}.snapshots WHERE snapshot_id = %(snap)s::text"
            " UNION ALL"
            " SELECT p.snapshot_id, p.session_id, p.parent_id, p.base_id, p.sequence, p.created_at, p.encoding,"
            " p.payload, chain.stop, chain.depth + 1"
            f" FROM chain JOIN {s}.snapshots p ON p.snapshot_id = chain.parent_id"
            " WHERE chain.stop IS NOT NULL AND chain.snapshot_id <> chain.stop AND chain.depth < %(max)s)"
        )
        self.chain = f"{chain_cte} SELECT {columns}, stop, depth FROM chain"
        # The chain and the writes on its head in one statement (what a restore reads): tagged rows,
        # the chain's columns, then a write's (its payload in the chain's payload column).
        self.chain_with_writes = (
            f"{chain_cte} SELECT 'chain', {columns}, stop, depth,"
            " NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::bigint FROM chain UNION ALL"
            " SELECT 'write', NULL, NULL, NULL, NULL, NULL, NULL, NULL, payload, NULL, NULL, step_id, kind, key,"
            f" digest, write_seq FROM {s}.writes WHERE session_id = %(sid)s::text AND base_snapshot_id = %(snap)s::text"
            " UNION ALL SELECT 'head', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, writes_count, NULL,"
            f" NULL, writes_digest::text, 0 FROM {s}.heads WHERE session_id = %(sid)s::text"
            " AND snapshot_id = %(snap)s::text"
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

        # ---- pending writes: see writes_put
        self._writes_put: dict[int, str] = {}
        # The head's tally first when the base is the session's head (0), then the writes in write order.
        self.writes_list = (
            f"SELECT 0, writes_count, NULL, NULL, NULL::bytea, writes_digest::text FROM {s}.heads"
            " WHERE session_id = %(sid)s::text AND snapshot_id = %(base)s::text"
            f" UNION ALL SELECT write_seq, step_id, kind, key, payload, digest FROM {s}.writes"
            " WHERE session_id = %(sid)s::text AND base_snapshot_id = %(base)s::text ORDER BY 1"
        )

        # ---- control items: the position from the head row's counter, the row digest computed here (it
        # covers the position) and the notify, all in the same statement
        sep = "convert_to(chr(31), 'UTF8')"
        self.control_append = (
            f"WITH pos AS (UPDATE {s}.heads SET control_seq = control_seq + 1 WHERE session_id = %(sid)s::text"
            " RETURNING control_seq),"
            f" ins AS (INSERT INTO {s}.control (session_id, position, kind, payload, created_at, digest)"
            " SELECT %(sid)s::text, control_seq, %(kind)s::text, %(payload)b::bytea, %(now)s::text,"
            " encode(sha256(convert_to('control', 'UTF8') || "
            + sep
            + " || convert_to(%(sid)s::text, 'UTF8') || "
            + sep
            + " || convert_to(control_seq::text, 'UTF8') || "
            + sep
            + " || convert_to(%(kind)s::text, 'UTF8')"
            " || " + sep + " || %(payload)b::bytea || " + sep + " || convert_to(%(now)s::text, 'UTF8')), 'hex')"
            " FROM pos RETURNING position)"
            " SELECT position, pg_notify(%(channel)s::text, %(sid)s::text)::text FROM ins"
        )
        # The head row's counter first (position -1; no row: no such session), then the items.
        self.control_list = (
            f"SELECT -1, NULL, NULL, NULL, NULL, control_seq FROM {s}.heads WHERE session_id = %(sid)s::text"
            f" UNION ALL SELECT position, kind, payload, created_at, digest, NULL FROM {s}.control"
            " WHERE session_id = %(sid)s::text AND position > %(after)s::bigint ORDER BY 1"
        )
        self.listen = f'LISTEN "{self.channel}"'

        # ---- blobs
        self.blobs_put = (
            f"INSERT INTO {s}.blobs (digest, data) SELECT * FROM unnest(%s::text[], %b::bytea[])"
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
        tables = ("snapshots", "heads", "sessions", "writes", "control", "blobs", "operations")
        self.vacuum = tuple(f"VACUUM (ANALYZE) {s}.{table}" for table in tables)
        # Sizes of the store's tables with their indexes and TOAST (benchmarks, `qitos sessions` stats).
        self.table_sizes = (
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relkind = 'r' ORDER BY c.relname"
        )

    def commit(self, *, create: bool, parent: bool, op: bool, blobs: bool, meta: bool, token: bool) -> str:
        """The one statement of a head commit, with only the parts this commit needs.

        ``create``: insert the head (``ON CONFLICT DO NOTHING``) instead of the conditional
        ``UPDATE ... WHERE snapshot_id = expected``; ``parent``: check that a parent other than the
        expected head is stored; ``op``: check and record the operation id; ``blobs``: insert blobs;
        ``meta``: replace the session metadata (a new session always writes it); ``token``: the fence
        wants this lease token (otherwise: no live lease may be held). Everything after the head
        runs only when the head moved; the statement returns how many heads moved (0 or 1) and the
        moved head's control counter.
        """
        key = (create, parent, op, blobs, meta, token)
        cached = self._commits.get(key)
        if cached is not None:
            return cached
        s, now = f'"{self.schema}"', self.now
        conditions = []
        if parent:
            conditions.append(f"EXISTS (SELECT 1 FROM {s}.snapshots WHERE snapshot_id = %(parent)s::text)")
        if op:
            conditions.append(f"NOT EXISTS (SELECT 1 FROM {s}.operations WHERE operation_id = %(op)s::text)")
        if create:
            head = (
                f"INSERT INTO {s}.heads (session_id, snapshot_id, sequence, lifecycle, updated_at, digest)"
                " SELECT %(sid)s::text, %(id)s::text, %(seq)s::bigint, %(lifecycle)s::text, %(now)s::text,"
                f" %(digest)s::text WHERE {' AND '.join(conditions) or 'true'}"
                " ON CONFLICT (session_id) DO NOTHING RETURNING control_seq"
            )
        else:
            # The fence, on the very row the UPDATE moves: a token must be the live lease's; without one,
            # no live lease may be held.
            if token:
                conditions.append(
                    f"lease_token = %(token)s::bigint AND lease_owner IS NOT NULL AND lease_expires > {now}"
                )
            else:
                conditions.append(f"NOT (lease_owner IS NOT NULL AND lease_expires > {now})")
            head = (
                f"UPDATE {s}.heads SET snapshot_id = %(id)s::text, sequence = %(seq)s::bigint,"
                " lifecycle = %(lifecycle)s::text, updated_at = %(now)s::text, digest = %(digest)s::text,"
                " writes_count = 0, writes_digest = 0::bit(256)"
                " WHERE session_id = %(sid)s::text AND snapshot_id = %(expected)s::text"
                f" AND {' AND '.join(conditions)} RETURNING control_seq"
            )
        parts = [
            f"WITH head AS ({head})",
            f"snap AS (INSERT INTO {s}.snapshots"
            " (snapshot_id, session_id, parent_id, base_id, sequence, created_at, encoding, payload)"
            " SELECT %(id)s::text, %(sid)s::text, %(parent)s::text, %(base)s::text, %(seq)s::bigint,"
            " %(created)s::text, %(encoding)s::text, %(payload)b::bytea FROM head"
            " ON CONFLICT (snapshot_id) DO NOTHING)",
        ]
        if not create:
            # The pending writes of the step this commit ends: its outcome is in the snapshot now.
            parts.append(
                f"done AS (DELETE FROM {s}.writes WHERE session_id = %(sid)s::text"
                " AND base_snapshot_id = %(expected)s::text AND EXISTS (SELECT 1 FROM head))"
            )
        if blobs:
            parts.append(
                f"blob AS (INSERT INTO {s}.blobs (digest, data) SELECT t.digest, t.data FROM head,"
                " unnest(%(digests)s::text[], %(datas)b::bytea[]) AS t(digest, data) ON CONFLICT (digest) DO NOTHING)"
            )
        if op:
            parts.append(
                f"op AS (INSERT INTO {s}.operations (operation_id, session_id, snapshot_id, created_at)"
                " SELECT %(op)s::text, %(sid)s::text, %(id)s::text, %(now)s::text FROM head)"
            )
        if create:
            parts.append(
                f"meta AS (INSERT INTO {s}.sessions (session_id, metadata, digest)"
                " SELECT %(sid)s::text, %(metadata)b::bytea, %(metadata_digest)s::text FROM head)"
            )
        elif meta:
            parts.append(
                f"meta AS (UPDATE {s}.sessions SET metadata = %(metadata)b::bytea, digest = %(metadata_digest)s::text"
                " FROM head WHERE session_id = %(sid)s::text)"
            )
        statement = ", ".join(parts) + " SELECT count(*), max(control_seq) FROM head"
        self._commits[key] = statement
        return statement

    def writes_put(self, count: int) -> str:
        """The statement storing ``count`` pending writes: the base check, the fence and the inserts
        in one statement (8 parameters a write: session, base, kind, key, step, payload, digest,
        lease token). The head rows are locked FOR SHARE, so a lease cannot change hands while the
        writes are made. Each head and each base is looked up by its key (LATERAL with its lock, a
        scalar subquery), never joined: with a join, the generic plan could hash a scan of a whole
        table. The writes come as rows of scalars, not arrays: psycopg adapts scalars several times
        faster."""
        statement = self._writes_put.get(count)
        if statement is None:
            statement = self._writes_put[count] = _writes_put(f'"{self.schema}"', self.now, count)
        return statement


def _writes_put(s: str, now: str, count: int) -> str:
    row = "(%s::text, %s::text, %s::text, %s::text, %s::bigint, %b::bytea, %s::text, %s::bigint, {n})"
    rows = ", ".join(row.format(n=n) for n in range(1, count + 1))
    return (
        f"WITH input AS MATERIALIZED (SELECT * FROM (VALUES {rows})"
        " AS t(session_id, base_snapshot_id, kind, key, step_id, payload, digest, token, ord)),"
        " fence AS MATERIALIZED (SELECT f.* FROM (SELECT DISTINCT session_id FROM input) u CROSS JOIN LATERAL"
        f" (SELECT h.session_id, h.lease_owner, h.lease_token, h.lease_expires, {now} AS now FROM {s}.heads h"
        " WHERE h.session_id = u.session_id FOR SHARE OF h) f),"
        " tokens AS (SELECT DISTINCT ON (session_id) session_id, token FROM input ORDER BY session_id, ord),"
        " bad AS (SELECT b.* FROM (SELECT i.base_snapshot_id, i.session_id, i.ord,"
        f" (SELECT s.session_id FROM {s}.snapshots s WHERE s.snapshot_id = i.base_snapshot_id) AS owner"
        " FROM input i) b WHERE b.owner IS DISTINCT FROM b.session_id ORDER BY b.ord LIMIT 1),"
        " fenced AS (SELECT t.session_id, t.token, f.lease_owner, f.lease_token, f.lease_expires, f.now"
        f" FROM tokens t JOIN fence f ON f.session_id = t.session_id WHERE {_fence_refuses('t.token')}),"
        f" ins AS (INSERT INTO {s}.writes (session_id, base_snapshot_id, kind, key, step_id, payload, digest)"
        " SELECT session_id, base_snapshot_id, kind, key, step_id, payload, digest FROM input"
        f" WHERE NOT EXISTS (SELECT 1 FROM bad) AND NOT EXISTS (SELECT 1 FROM fenced) ORDER BY ord"
        + _WRITE_TAIL.format(s=s)
    )
