"""Where eval results live: eval-owned tables in the same database as the sessions.

An eval's rows sit beside the sessions its samples ran as, in the SQLite file or the PostgreSQL
database and schema that ``qitos.checkpoint._targets.open_store`` opens for the same target, and
never expire. Schema version 1 (table ``qitos_eval_meta`` holds ``schema_version``):

===================== =========================================== ==========================================
table                 key                                         ``data`` (canonical JSON)
===================== =========================================== ==========================================
``qitos_evals``       ``eval_id`` (``name`` unique)               :class:`EvalRecord`: name, creation time,
                                                                  pins (what makes it one experiment), the
                                                                  run spec ``qitos eval resume`` rebuilds from
``qitos_eval_samples`` ``eval_id``, ``position``                  one :class:`~qitos.eval.Sample` (``to_dict``)
``qitos_eval_attempts`` ``eval_id``, ``sample_id``, ``epoch``,     :class:`AttemptRecord`: one run of a sample
                      ``attempt``                                 (its session, outcome, tokens, time, error)
``qitos_eval_results`` ``eval_id``, ``sample_id``, ``epoch``       :class:`ResultRecord`: the sample x epoch's
                                                                  outcome, totals over its attempts
``qitos_eval_scorers`` ``eval_id``, ``scorer_id``                  :class:`ScorerRecord`: id, version, reducer,
                                                                  parameters
``qitos_eval_scores``  ``eval_id``, ``sample_id``, ``epoch``,      :class:`ScoreRecord`: value, answer,
                      ``scorer_id``                               explanation, metadata or the scoring error
``qitos_eval_divergences`` ``eval_id``, ``sample_id``, ``epoch``,  :class:`DivergenceRecord`: where a replayed
                      ``attempt``                                 sample first asked something else than its
                                                                  recording, and what changed
``qitos_eval_cache``   ``cache_key``                              :class:`CachedReply`: one model reply of the
                                                                  response cache (any eval of the store)
===================== =========================================== ==========================================

Every row keeps its record's canonical JSON in ``data`` and the SHA-256 of it in ``digest``; a
read checks it, so a damaged row raises :class:`~qitos.core._errors.IntegrityError` naming the
table and the row, never a wrong result. ``qitos_evals.status`` (``running``, ``complete``,
``incomplete``, ``failed``) is outside the digest: it is shown, never trusted (a resume looks at
the results themselves). Query the rows with SQL (``json_extract(data, '$.answer')`` in SQLite,
``data::jsonb ->> 'answer'`` in PostgreSQL).

Writes that must not be repeated use insert-if-absent: two processes running the same eval write
one result per sample x epoch (the session lease already makes one of them run it).
"""

from __future__ import annotations

import abc
import contextlib
import json
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from qitos.checkpoint._records import utc_now
from qitos.checkpoint._targets import open_store
from qitos.checkpoint.store import CheckpointStore
from qitos.core._codec import canonical_json, sha256_hex
from qitos.core._errors import ConfigurationError, IntegrityError
from qitos.core._install import install_command

__all__ = [
    "SCHEMA_VERSION",
    "AttemptRecord",
    "CachedReply",
    "DivergenceRecord",
    "EvalRecord",
    "EvalStore",
    "PostgresEvalStore",
    "ResultRecord",
    "ScoreRecord",
    "ScorerRecord",
    "SqliteEvalStore",
    "open_eval_store",
]

SCHEMA_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class EvalRecord:
    """One eval: its id and name, when it was created, its pins and the spec that rebuilds it."""

    eval_id: str
    name: str
    created_at: str
    pins: Mapping[str, Any]
    spec: Mapping[str, Any] | None = None  # what `qitos eval resume` rebuilds the run from (None: not possible)
    status: str = "running"


@dataclass(frozen=True, kw_only=True)
class AttemptRecord:
    """One run of one sample x epoch in its own session (``attempt`` 0 first, then each retry)."""

    eval_id: str
    sample_id: str
    epoch: int
    attempt: int
    session_id: str
    error: str | None
    answer: Any = None
    stop_reason: str | None = None
    steps: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    wall_seconds: float = 0.0
    tool_calls: Sequence[Mapping[str, Any]] = ()
    divergence: Mapping[str, Any] | None = None  # under replay: where the run left its recording


@dataclass(frozen=True, kw_only=True)
class ResultRecord:
    """The outcome of one sample x epoch: its last attempt, with tokens and time summed over all."""

    eval_id: str
    sample_id: str
    epoch: int
    session_id: str
    error: str | None
    answer: Any = None
    stop_reason: str | None = None
    steps: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    wall_seconds: float = 0.0
    attempts: int = 1
    tool_calls: Sequence[Mapping[str, Any]] = ()
    divergence: Mapping[str, Any] | None = None  # under replay: where the last attempt left its recording


@dataclass(frozen=True, kw_only=True)
class ScorerRecord:
    """A scorer an eval is scored with: id, version, reducer over epochs and its parameters."""

    eval_id: str
    scorer_id: str
    version: str
    reducer: str
    spec: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ScoreRecord:
    """One scorer's score of one sample x epoch, or the error the scorer raised (``value`` None)."""

    eval_id: str
    sample_id: str
    epoch: int
    scorer_id: str
    scorer_version: str
    value: Any
    answer: str | None = None
    explanation: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class DivergenceRecord:
    """Where attempt ``attempt`` of a replayed sample x epoch first asked its model something else
    than the recording holds (``divergence``: step, model call, digests, diff, what was done)."""

    eval_id: str
    sample_id: str
    epoch: int
    attempt: int
    divergence: Mapping[str, Any]


@dataclass(frozen=True, kw_only=True)
class CachedReply:
    """One reply of the response cache: the model's response to the request ``cache_key`` names
    (a digest of the model, the parameters, the messages and the tools)."""

    cache_key: str
    model: Mapping[str, Any]
    request_digest: str
    response: Mapping[str, Any]
    created_at: str


_R = TypeVar("_R")


class EvalStore(abc.ABC):
    """The eval tables of one database. Sync methods (the runner calls them from a worker thread)."""

    @abc.abstractmethod
    def exists(self) -> bool:
        """Whether the database holds eval tables (a read: it creates nothing, unlike the other methods)."""

    @abc.abstractmethod
    def create_eval(self, record: EvalRecord, samples: Sequence[Mapping[str, Any]]) -> EvalRecord:
        """Insert the eval and its samples unless an eval of that name exists; the stored record."""

    @abc.abstractmethod
    def find_eval(self, ref: str) -> EvalRecord | None:
        """The eval whose id or name is ``ref``."""

    @abc.abstractmethod
    def list_evals(self) -> list[EvalRecord]:
        """Every eval, oldest first."""

    @abc.abstractmethod
    def set_status(self, eval_id: str, status: str) -> None:
        """Record where the eval stands (``running``, ``complete``, ``incomplete``, ``failed``)."""

    @abc.abstractmethod
    def samples(self, eval_id: str) -> list[dict[str, Any]]:
        """The eval's samples (``Sample.to_dict()`` each), in order."""

    @abc.abstractmethod
    def put_outcome(self, attempt: AttemptRecord, result: ResultRecord | None) -> bool:
        """Record an attempt and, when it is the last, the result, in one transaction.

        False (nothing written) when the attempt, or the result, is already recorded."""

    @abc.abstractmethod
    def attempts(self, eval_id: str) -> list[AttemptRecord]:
        """Every recorded attempt of the eval."""

    @abc.abstractmethod
    def results(self, eval_id: str) -> list[ResultRecord]:
        """Every recorded result of the eval."""

    @abc.abstractmethod
    def put_scorers(self, records: Sequence[ScorerRecord]) -> None:
        """Record scorers (a scorer already recorded under the id is replaced)."""

    @abc.abstractmethod
    def scorers(self, eval_id: str) -> list[ScorerRecord]:
        """The scorers recorded for the eval, by id."""

    @abc.abstractmethod
    def put_scores(self, records: Sequence[ScoreRecord], *, replace: bool = False) -> None:
        """Record scores; an existing one is kept unless ``replace`` (a rescoring)."""

    @abc.abstractmethod
    def scores(self, eval_id: str) -> list[ScoreRecord]:
        """Every recorded score of the eval."""

    @abc.abstractmethod
    def put_divergence(self, record: DivergenceRecord) -> bool:
        """Record where an attempt diverged from its recording (the first record of it stands)."""

    @abc.abstractmethod
    def divergences(self, eval_id: str) -> list[DivergenceRecord]:
        """Every recorded divergence of the eval."""

    @abc.abstractmethod
    def divergence(self, eval_id: str, sample_id: str, epoch: int, attempt: int) -> DivergenceRecord | None:
        """The recorded divergence of one attempt, if any."""

    @abc.abstractmethod
    def cached_reply(self, cache_key: str) -> CachedReply | None:
        """The cached reply to the request ``cache_key`` names, if any."""

    @abc.abstractmethod
    def put_cached_reply(self, record: CachedReply) -> bool:
        """Cache a reply (an existing one for the key stands); whether it was new."""

    @abc.abstractmethod
    def clear_cache(self) -> int:
        """Drop every cached reply; how many there were."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection (idempotent)."""


# --------------------------------------------------------------------------- rows

_TABLES: dict[str, tuple[str, ...]] = {
    "qitos_evals": ("eval_id",),
    "qitos_eval_samples": ("eval_id", "position"),
    "qitos_eval_attempts": ("eval_id", "sample_id", "epoch", "attempt"),
    "qitos_eval_results": ("eval_id", "sample_id", "epoch"),
    "qitos_eval_scorers": ("eval_id", "scorer_id"),
    "qitos_eval_scores": ("eval_id", "sample_id", "epoch", "scorer_id"),
    "qitos_eval_divergences": ("eval_id", "sample_id", "epoch", "attempt"),
    "qitos_eval_cache": ("cache_key",),
}
_INTEGER_KEYS = frozenset({"position", "epoch", "attempt"})


def _encode(record: Any) -> tuple[str, str]:
    data = canonical_json(asdict(record) if not isinstance(record, Mapping) else dict(record))
    return data, sha256_hex(data)


def _decode(table: str, key: Sequence[object], data: str, digest: str) -> dict[str, Any]:
    row = "/".join(str(k) for k in key)
    if sha256_hex(data) != digest:
        raise IntegrityError(table, row, "content does not match its digest")
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise IntegrityError(table, row, f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise IntegrityError(table, row, "not a JSON object")
    return value


def _record(cls: type[_R], table: str, key: Sequence[object], data: str, digest: str) -> _R:
    value = _decode(table, key, data, digest)
    try:
        return cls(**value)
    except TypeError as exc:
        raise IntegrityError(table, "/".join(str(k) for k in key), f"not a {cls.__name__}: {exc}") from exc


class _SqlEvalStore(EvalStore):
    """The SQL both databases share; subclasses give the connection and the dialect."""

    placeholder = "?"

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix  # "" for SQLite, '"schema".' for PostgreSQL
        self._lock = threading.RLock()
        self._ready = False

    # ---- what a dialect provides

    @abc.abstractmethod
    def _write(self, statements: Sequence[tuple[str, Sequence[object]]]) -> list[int]:
        """Run the statements in one write transaction; each one's row count."""

    @abc.abstractmethod
    def _read(self, sql: str, args: Sequence[object]) -> list[tuple[Any, ...]]:
        """The rows of one query."""

    @abc.abstractmethod
    def _create_tables(self, ddl: Sequence[str]) -> None:
        """Run the DDL (idempotent) and check the schema version."""

    # ---- shared

    def _t(self, table: str) -> str:
        return f"{self._prefix}{table}"

    def _sql(self, text: str) -> str:
        return text.replace("?", self.placeholder) if self.placeholder != "?" else text

    def _ddl(self) -> list[str]:
        statements = [
            f"CREATE TABLE IF NOT EXISTS {self._t('qitos_eval_meta')} (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
        ]
        for table, key in _TABLES.items():
            columns = [f"{k} {'INTEGER' if k in _INTEGER_KEYS else 'TEXT'} NOT NULL" for k in key]
            if table == "qitos_evals":
                columns += ["name TEXT NOT NULL UNIQUE", "status TEXT NOT NULL", "updated_at TEXT NOT NULL"]
            columns += ["data TEXT NOT NULL", "digest TEXT NOT NULL", f"PRIMARY KEY ({', '.join(key)})"]
            statements.append(f"CREATE TABLE IF NOT EXISTS {self._t(table)} ({', '.join(columns)})")
        return statements

    def _ensure(self) -> None:
        if not self._ready:
            with self._lock:
                if not self._ready:
                    self._create_tables(self._ddl())
                    self._ready = True

    def _insert(
        self, table: str, key: Sequence[object], record: object, *, replace: bool = False
    ) -> tuple[str, list[Any]]:
        names = _TABLES[table]
        data, digest = _encode(record)
        columns = ", ".join([*names, "data", "digest"])
        marks = ", ".join("?" * (len(names) + 2))
        conflict = "DO UPDATE SET data = excluded.data, digest = excluded.digest" if replace else "DO NOTHING"
        sql = f"INSERT INTO {self._t(table)} ({columns}) VALUES ({marks}) ON CONFLICT ({', '.join(names)}) {conflict}"
        return self._sql(sql), [*key, data, digest]

    def _select(self, table: str, where: str, args: Sequence[object], order: str) -> list[tuple[Any, ...]]:
        names = _TABLES[table]
        sql = f"SELECT {', '.join(names)}, data, digest FROM {self._t(table)} WHERE {where} ORDER BY {order}"
        return self._read(self._sql(sql), args)

    def create_eval(self, record: EvalRecord, samples: Sequence[Mapping[str, object]]) -> EvalRecord:
        self._ensure()
        with self._lock:
            existing = self.find_eval(record.name)
            if existing is not None:
                return existing
            data, digest = _encode(record)
            statements: list[tuple[str, Sequence[Any]]] = [
                (
                    self._sql(
                        f"INSERT INTO {self._t('qitos_evals')} (eval_id, name, status, updated_at, data, digest) "
                        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
                    ),
                    [record.eval_id, record.name, record.status, utc_now(), data, digest],
                )
            ]
            for position, sample in enumerate(samples):
                statements.append(self._insert("qitos_eval_samples", (record.eval_id, position), sample))
            counts = self._write(statements)
            if counts and counts[0] == 0:  # another process created it first: theirs stands
                stored = self.find_eval(record.name)
                if stored is not None:
                    return stored
            return record

    def find_eval(self, ref: str) -> EvalRecord | None:
        self._ensure()
        sql = f"SELECT eval_id, status, data, digest FROM {self._t('qitos_evals')} WHERE eval_id = ? OR name = ?"
        rows = self._read(self._sql(sql), [ref, ref])
        rows.sort(key=lambda r: r[0] != ref)  # an id match first
        return self._eval(rows[0]) if rows else None

    def _eval(self, row: tuple[Any, ...]) -> EvalRecord:
        eval_id, status, data, digest = row
        value = _decode("qitos_evals", [eval_id], data, digest)
        value["status"] = status
        try:
            return EvalRecord(**value)
        except TypeError as exc:
            raise IntegrityError("qitos_evals", eval_id, f"not an EvalRecord: {exc}") from exc

    def list_evals(self) -> list[EvalRecord]:
        self._ensure()
        rows = self._read(f"SELECT eval_id, status, data, digest FROM {self._t('qitos_evals')}", [])
        records = [self._eval(row) for row in rows]
        return sorted(records, key=lambda r: (r.created_at, r.eval_id))

    def set_status(self, eval_id: str, status: str) -> None:
        self._ensure()
        sql = f"UPDATE {self._t('qitos_evals')} SET status = ?, updated_at = ? WHERE eval_id = ?"
        self._write([(self._sql(sql), [status, utc_now(), eval_id])])

    def samples(self, eval_id: str) -> list[dict[str, Any]]:
        self._ensure()
        rows = self._select("qitos_eval_samples", "eval_id = ?", [eval_id], "position")
        return [_decode("qitos_eval_samples", row[:2], row[2], row[3]) for row in rows]

    def put_outcome(self, attempt: AttemptRecord, result: ResultRecord | None) -> bool:
        self._ensure()
        key = (attempt.eval_id, attempt.sample_id, attempt.epoch)
        statements = [self._insert("qitos_eval_attempts", (*key, attempt.attempt), attempt)]
        if result is not None:
            statements.append(self._insert("qitos_eval_results", key, result))
        counts = self._write(statements)
        return bool(counts) and counts[-1] > 0

    def attempts(self, eval_id: str) -> list[AttemptRecord]:
        self._ensure()
        rows = self._select("qitos_eval_attempts", "eval_id = ?", [eval_id], "sample_id, epoch, attempt")
        return [_record(AttemptRecord, "qitos_eval_attempts", row[:4], row[4], row[5]) for row in rows]

    def results(self, eval_id: str) -> list[ResultRecord]:
        self._ensure()
        rows = self._select("qitos_eval_results", "eval_id = ?", [eval_id], "sample_id, epoch")
        return [_record(ResultRecord, "qitos_eval_results", row[:3], row[3], row[4]) for row in rows]

    def put_scorers(self, records: Sequence[ScorerRecord]) -> None:
        self._ensure()
        if records:
            self._write(
                [self._insert("qitos_eval_scorers", (r.eval_id, r.scorer_id), r, replace=True) for r in records]
            )

    def scorers(self, eval_id: str) -> list[ScorerRecord]:
        self._ensure()
        rows = self._select("qitos_eval_scorers", "eval_id = ?", [eval_id], "scorer_id")
        return [_record(ScorerRecord, "qitos_eval_scorers", row[:2], row[2], row[3]) for row in rows]

    def put_scores(self, records: Sequence[ScoreRecord], *, replace: bool = False) -> None:
        self._ensure()
        if records:
            self._write(
                [
                    self._insert(
                        "qitos_eval_scores", (r.eval_id, r.sample_id, r.epoch, r.scorer_id), r, replace=replace
                    )
                    for r in records
                ]
            )

    def scores(self, eval_id: str) -> list[ScoreRecord]:
        self._ensure()
        rows = self._select("qitos_eval_scores", "eval_id = ?", [eval_id], "sample_id, epoch, scorer_id")
        return [_record(ScoreRecord, "qitos_eval_scores", row[:4], row[4], row[5]) for row in rows]

    def put_divergence(self, record: DivergenceRecord) -> bool:
        self._ensure()
        key = (record.eval_id, record.sample_id, record.epoch, record.attempt)
        return self._write([self._insert("qitos_eval_divergences", key, record)])[0] > 0

    def divergences(self, eval_id: str) -> list[DivergenceRecord]:
        self._ensure()
        rows = self._select("qitos_eval_divergences", "eval_id = ?", [eval_id], "sample_id, epoch, attempt")
        return [_record(DivergenceRecord, "qitos_eval_divergences", row[:4], row[4], row[5]) for row in rows]

    def divergence(self, eval_id: str, sample_id: str, epoch: int, attempt: int) -> DivergenceRecord | None:
        self._ensure()
        key = [eval_id, sample_id, epoch, attempt]
        rows = self._select(
            "qitos_eval_divergences", "eval_id = ? AND sample_id = ? AND epoch = ? AND attempt = ?", key, "attempt"
        )
        if not rows:
            return None
        return _record(DivergenceRecord, "qitos_eval_divergences", rows[0][:4], rows[0][4], rows[0][5])

    def cached_reply(self, cache_key: str) -> CachedReply | None:
        self._ensure()
        rows = self._select("qitos_eval_cache", "cache_key = ?", [cache_key], "cache_key")
        if not rows:
            return None
        return _record(CachedReply, "qitos_eval_cache", rows[0][:1], rows[0][1], rows[0][2])

    def put_cached_reply(self, record: CachedReply) -> bool:
        self._ensure()
        return self._write([self._insert("qitos_eval_cache", (record.cache_key,), record)])[0] > 0

    def clear_cache(self) -> int:
        self._ensure()
        return self._write([(f"DELETE FROM {self._t('qitos_eval_cache')}", [])])[0]


class SqliteEvalStore(_SqlEvalStore):
    """The eval tables in a SQLite file (the sessions' file), or in memory (``":memory:"``)."""

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_ms: int = 30_000) -> None:
        super().__init__("")
        self.path = os.fspath(path)
        self._busy_timeout_ms = busy_timeout_ms
        self._conn: Any = None
        self._pid = os.getpid()

    def _connection(self) -> Any:
        import sqlite3

        if self._conn is None or self._pid != os.getpid():
            conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=self._busy_timeout_ms / 1000
            )
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
            if self.path != ":memory:":
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = NORMAL")
            self._conn, self._pid = conn, os.getpid()
        return self._conn

    def _write(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[int]:
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                counts = [conn.execute(sql, list(args)).rowcount for sql, args in statements]
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return counts

    def _read(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._connection().execute(sql, list(args)).fetchall())

    def _create_tables(self, ddl: Sequence[str]) -> None:
        self._write([(statement, []) for statement in ddl])
        _check_version(self, self._t("qitos_eval_meta"))

    def exists(self) -> bool:
        if self._ready:
            return True
        return bool(self._read("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'qitos_evals'", []))

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None


class PostgresEvalStore(_SqlEvalStore):
    """The eval tables in a PostgreSQL schema (the sessions' schema; extra ``qitos-kernel[postgres]``)."""

    placeholder = "%s"

    def __init__(self, dsn: str, *, schema: str = "qitos") -> None:
        if not schema.replace("_", "").isalnum():
            raise ConfigurationError(f"schema must be a plain identifier, got {schema!r}")
        super().__init__(f'"{schema}".')
        self.dsn = dsn
        self.schema = schema
        self._conn: Any = None
        self._pid = os.getpid()

    def _connection(self) -> Any:
        if self._conn is None or self._pid != os.getpid() or self._conn.closed:
            try:
                import psycopg
            except ImportError as exc:
                raise ConfigurationError(
                    f"a PostgreSQL eval store needs the postgres extra: {install_command('postgres')} ({exc})"
                ) from exc
            self._conn = psycopg.connect(self.dsn, autocommit=True)
            self._pid = os.getpid()
        return self._conn

    def _write(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[int]:
        with self._lock:
            conn = self._connection()
            with conn.transaction(), conn.cursor() as cur:
                counts = []
                for sql, args in statements:
                    cur.execute(sql, list(args))
                    counts.append(cur.rowcount)
                return counts

    def _read(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self._lock, self._connection().cursor() as cur:
            cur.execute(sql, list(args))
            return list(cur.fetchall())

    def _create_tables(self, ddl: Sequence[str]) -> None:
        with self._lock:
            import psycopg

            conn = self._connection()
            # the sessions' store may be creating the schema at this very moment
            with contextlib.suppress(psycopg.errors.UniqueViolation):
                conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
            with conn.transaction(), conn.cursor() as cur:
                # one creator at a time: concurrent CREATE TABLE IF NOT EXISTS can collide in the catalog
                cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"qitos_eval_schema:{self.schema}"])
                for statement in ddl:
                    cur.execute(statement)
        _check_version(self, self._t("qitos_eval_meta"))

    def exists(self) -> bool:
        if self._ready:
            return True
        rows = self._read("SELECT to_regclass(%s) IS NOT NULL", [f'"{self.schema}".qitos_evals'])
        return bool(rows and rows[0][0])

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None


def _check_version(store: _SqlEvalStore, meta: str) -> None:
    store._write(
        [
            (
                store._sql(f"INSERT INTO {meta} (key, value) VALUES (?, ?) ON CONFLICT DO NOTHING"),
                ["schema_version", str(SCHEMA_VERSION)],
            )
        ]
    )
    rows = store._read(store._sql(f"SELECT value FROM {meta} WHERE key = ?"), ["schema_version"])
    found = rows[0][0] if rows else None
    if found != str(SCHEMA_VERSION):
        raise ConfigurationError(
            f"the eval tables have schema version {found}; this qitos reads version {SCHEMA_VERSION}"
        )


def open_eval_store(target: CheckpointStore | str | os.PathLike[str]) -> tuple[CheckpointStore, EvalStore]:
    """The checkpoint store and the eval store of one target: a path, a DSN or a checkpoint store.

    An in-process store (``InMemoryCheckpointStore``) gets an in-memory eval store: its results
    last as long as the process, like its sessions.
    """
    store = open_store(target) if isinstance(target, str | os.PathLike) else target
    if not isinstance(store, CheckpointStore):
        raise ConfigurationError(f"store must be a path, a postgresql:// DSN or a CheckpointStore, got {store!r}")
    path = getattr(store, "path", None)
    dsn = getattr(store, "dsn", None)
    if isinstance(dsn, str):
        return store, PostgresEvalStore(dsn, schema=str(getattr(store, "schema", "qitos")))
    if isinstance(path, str):
        return store, SqliteEvalStore(path)
    return store, SqliteEvalStore(":memory:")
