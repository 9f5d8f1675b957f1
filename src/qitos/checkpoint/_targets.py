"""Opening a checkpoint store from the text that names it: a file path, ``sqlite:///...`` or a DSN.

Wherever a store is named by text (``compose(store=...)``, ``--db`` on every ``qitos`` command,
the viewer), :func:`open_store` maps it:

- ``postgresql://...`` or ``postgres://...``: a :class:`~qitos.checkpoint._postgres_store.PostgresCheckpointStore`
  (the ``qitos-kernel[postgres]`` extra). A ``schema=NAME`` query parameter picks the schema (default
  ``qitos``) and is not passed on to libpq;
- ``sqlite:///relative/path``, ``sqlite:////absolute/path`` or any other text: a
  :class:`~qitos.checkpoint._sqlite_store.SqliteCheckpointStore` on that file.

``psycopg`` is imported only when a PostgreSQL store is opened (or looked for: :func:`missing_store`
reads whether the schema holds a store, and never creates anything, unlike opening it).
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from qitos.checkpoint.store import CheckpointStore
from qitos.core._errors import CheckpointError, ConfigurationError
from qitos.core._redaction import redact_text

__all__ = [
    "check_target",
    "describe_target",
    "is_postgres_target",
    "missing_store",
    "open_store",
    "postgres_dsn",
    "sqlite_path",
    "store_exists",
]

_POSTGRES_SCHEMES = ("postgresql://", "postgres://")
_SQLITE_SCHEME = "sqlite://"
_DEFAULT_SCHEMA = "qitos"  # PostgresCheckpointStore's default schema


def is_postgres_target(target: str | os.PathLike[str]) -> bool:
    """Whether ``target`` names a PostgreSQL database (a ``postgresql://`` or ``postgres://`` URL)."""
    return isinstance(target, str) and target.lower().startswith(_POSTGRES_SCHEMES)


def sqlite_path(target: str | os.PathLike[str]) -> str | None:
    """The SQLite file ``target`` names, or None when it names a PostgreSQL database."""
    if is_postgres_target(target):
        return None
    text = os.fspath(target)
    if text.lower().startswith(_SQLITE_SCHEME):
        rest = text[len(_SQLITE_SCHEME) :]
        if not rest.startswith("/") or rest == "/":
            raise ConfigurationError(
                f"a SQLite URL is sqlite:///relative/path or sqlite:////absolute/path, got {text!r}"
            )
        return rest[1:]
    return text


def postgres_dsn(target: str) -> tuple[str, str | None]:
    """A PostgreSQL URL split into the DSN for libpq and the ``schema`` query parameter (or None).

    A URL that cannot be parsed (a bad host or port) is a :class:`ConfigurationError` saying so.
    """
    try:
        parts = urlsplit(target)
        parts.port  # noqa: B018  (parsed on access: a port that is not a number raises here)
    except ValueError as exc:
        raise ConfigurationError(f"not a valid PostgreSQL URL ({exc}): {describe_target(target)}") from None
    # The other parameters pass to libpq exactly as written: decoding and re-encoding them would turn
    # "%20" into "+", which libpq does not read as a space (options=-c%20name%3Dvalue).
    schemas: list[str] = []
    rest: list[str] = []
    for item in parts.query.split("&") if parts.query else []:
        name, _, value = item.partition("=")
        if unquote(name) == "schema":
            schemas.append(unquote(value))
        else:
            rest.append(item)
    dsn = urlunsplit((parts.scheme, parts.netloc, parts.path, "&".join(rest), parts.fragment))
    return dsn, (schemas[-1] if schemas else None)


def check_target(target: str | os.PathLike[str]) -> None:
    """Raise :class:`ConfigurationError` if ``target`` cannot name a store (a malformed URL); no I/O."""
    if is_postgres_target(target):
        postgres_dsn(str(target))
    elif not sqlite_path(target):
        raise ConfigurationError(f"no store named: {target!r} is neither a path nor a store URL")


def missing_store(target: str | os.PathLike[str]) -> str | None:
    """Why ``target`` names no existing session store, or None when it names one.

    For reading commands, which must never create a store: a SQLite file that does not exist; a
    PostgreSQL schema that does not exist or holds no qitos store (read on one connection, which
    creates nothing). A database that cannot be reached raises :class:`CheckpointError`.
    """
    path = sqlite_path(target)
    if path is not None:
        return None if os.path.isfile(path) else "the file does not exist"
    dsn, schema = postgres_dsn(str(target))
    schema = schema or _DEFAULT_SCHEMA
    try:
        import psycopg
    except ImportError as exc:
        raise ConfigurationError("a postgresql:// store needs psycopg: pip install 'qitos[postgres]'") from exc
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %s),"
                " to_regclass(format('%%I.schema_version', %s::text)) IS NOT NULL",
                (schema, schema),
            ).fetchone()
    except psycopg.Error as exc:
        raise CheckpointError(f"cannot connect to PostgreSQL at {describe_target(target)}: {exc}") from None
    if row is None or not row[0]:
        return f"schema {schema!r} does not exist"
    if not row[1]:
        return f"schema {schema!r} holds no qitos session store"
    return None


def store_exists(target: str | os.PathLike[str]) -> bool:
    """Whether ``target`` names an existing session store (see :func:`missing_store`)."""
    return missing_store(target) is None


def describe_target(target: str | os.PathLike[str]) -> str:
    """The store for messages and JSON: a SQLite file's absolute path, or a URL with its password
    redacted wherever it is written (``user:password@``, ``?password=``; see ``qitos.core._redaction``)."""
    path = sqlite_path(target)
    if path is not None:
        return os.path.abspath(path)
    return redact_text(str(target))


def open_store(target: str | os.PathLike[str], **options: Any) -> CheckpointStore:
    """The checkpoint store ``target`` names (see the module docs); ``options`` go to its class."""
    if is_postgres_target(target):
        from qitos.checkpoint._postgres_store import PostgresCheckpointStore

        dsn, schema = postgres_dsn(str(target))
        if schema is not None:
            options.setdefault("schema", schema)
        return PostgresCheckpointStore(dsn, **options)
    from qitos.checkpoint._sqlite_store import SqliteCheckpointStore

    path = sqlite_path(target)
    if not path:
        raise ConfigurationError(f"no store named: {target!r} is neither a path nor a store URL")
    return SqliteCheckpointStore(path, **options)
