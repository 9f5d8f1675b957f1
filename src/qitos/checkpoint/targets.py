"""Opening a checkpoint store from the text that names it: a file path, ``sqlite:///...`` or a DSN.

Wherever a store is named by text (``compose(store=...)``, ``--db`` on every ``qitos`` command,
the viewer), :func:`open_store` maps it:

- ``postgresql://...`` or ``postgres://...``: a :class:`~qitos.checkpoint.postgres_store.PostgresCheckpointStore`
  (the ``qitos-kernel[postgres]`` extra). A ``schema=NAME`` query parameter picks the schema (default
  ``qitos``) and is not passed on to libpq;
- ``sqlite:///relative/path``, ``sqlite:////absolute/path`` or any other text: a
  :class:`~qitos.checkpoint.sqlite_store.SqliteCheckpointStore` on that file.

``psycopg`` is imported only when a PostgreSQL store is opened.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from qitos.checkpoint.store import CheckpointStore
from qitos.core.errors import ConfigurationError

__all__ = ["describe_target", "is_postgres_target", "open_store", "postgres_dsn", "sqlite_path", "store_exists"]

_POSTGRES_SCHEMES = ("postgresql://", "postgres://")
_SQLITE_SCHEME = "sqlite://"


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
    """A PostgreSQL URL split into the DSN for libpq and the ``schema`` query parameter (or None)."""
    parts = urlsplit(target)
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


def store_exists(target: str | os.PathLike[str]) -> bool:
    """Whether the store may already hold sessions: its SQLite file exists (a database is assumed to)."""
    path = sqlite_path(target)
    return path is None or os.path.isfile(path)


def describe_target(target: str | os.PathLike[str]) -> str:
    """The store for messages and JSON: a SQLite file's absolute path, a URL without its password."""
    path = sqlite_path(target)
    if path is not None:
        return os.path.abspath(path)
    parts = urlsplit(str(target))
    if parts.password is None:
        return str(target)
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def open_store(target: str | os.PathLike[str], **options: Any) -> CheckpointStore:
    """The checkpoint store ``target`` names (see the module docs); ``options`` go to its class."""
    if is_postgres_target(target):
        from qitos.checkpoint.postgres_store import PostgresCheckpointStore

        dsn, schema = postgres_dsn(str(target))
        if schema is not None:
            options.setdefault("schema", schema)
        return PostgresCheckpointStore(dsn, **options)
    from qitos.checkpoint.sqlite_store import SqliteCheckpointStore

    path = sqlite_path(target)
    if not path:
        raise ConfigurationError(f"no store named: {target!r} is neither a path nor a store URL")
    return SqliteCheckpointStore(path, **options)
