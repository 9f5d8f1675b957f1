"""The qitos error tree.

Every error qitos raises derives from :class:`QitosError`. Developer mistakes and run failures are
separate subtrees so callers can catch one without the other::

    QitosError
    ├── UsageError                  the developer's mistake (bad configuration or argument)
    │   ├── ConfigurationError      compose()/engine wiring: unknown extension, no model bound
    │   ├── StateValidationError    a StateSchema field breaks its rule (also a ValueError)
    │   ├── CodecError              a value cannot round-trip through the strict codec
    │   └── ToolDefinitionError     a @tool function whose signature cannot become a schema
    └── RunError                    something failed while running
        ├── RunFailedError          ``agent.run(task)`` ended as failed; ``result`` holds the EngineResult
        ├── ModelError              a model adapter failed (HTTP, timeout, malformed reply)
        ├── ContextError            a request could not be built (see qitos.core.request_view)
        ├── CheckpointError         durable storage
        │   ├── SessionNotFoundError
        │   ├── HeadConflictError   compare-and-swap on a session head lost
        │   ├── SessionBusyError    another runner holds the session's lease
        │   ├── LeaseLostError      this runner's lease expired or was taken over (fencing)
        │   └── IntegrityError      a stored row does not match its digest (names table, row, session)
        │       └── SnapshotIntegrityError   a snapshot's bytes do not match its identity
        └── (MemoryResourceError)   a bound memory root is missing; see qitos.core.memory

Pausing and awaiting approval are *signals* reported through ``StopReason``, never errors.
Errors carry typed fields, do no work in ``__init__`` beyond storing them, and pickle.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

__all__ = [
    "CheckpointError",
    "CodecError",
    "ConfigurationError",
    "ContextError",
    "HeadConflictError",
    "IntegrityError",
    "LeaseLostError",
    "ModelError",
    "QitosError",
    "RunError",
    "RunFailedError",
    "SessionBusyError",
    "SessionNotFoundError",
    "SnapshotIntegrityError",
    "StateValidationError",
    "ToolDefinitionError",
    "UsageError",
]


class QitosError(Exception):
    """Base of every error raised by qitos."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuild from the message only; subclasses with typed fields override this.
        return (self.__class__, self.args)


class UsageError(QitosError):
    """The caller used qitos wrongly; fix the code or configuration."""


class ConfigurationError(UsageError):
    """Wiring is wrong: an unknown extension name, a missing model, an invalid option."""


class StateValidationError(UsageError, ValueError):
    """A StateSchema field violates its rule. ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.field, self.message))


class CodecError(UsageError, TypeError):
    """A value cannot be encoded or decoded losslessly. ``path`` locates it (``state.items[3].when``)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.path, self.message))


class ToolDefinitionError(UsageError):
    """A tool cannot be registered (unsupported parameter type, duplicate name)."""


class RunError(QitosError):
    """A failure while running an agent."""


class RunFailedError(RunError):
    """A run ended with status ``failed`` (the model unreachable, a request that cannot be built...).

    Raised by ``AgentModule.run(task)`` instead of returning a final answer of None; with
    ``return_state=True`` the result is returned as usual. ``result`` is the run's ``EngineResult``
    (state, records, events, task result), ``stop_reason`` and ``error`` say why it failed. Pickling
    keeps the message, ``stop_reason`` and ``error`` (``result`` becomes None).
    """

    def __init__(self, message: str, *, result: Any = None, stop_reason: str | None = None, error: str | None = None):
        super().__init__(message)
        self.result = result
        self.stop_reason = stop_reason
        self.error = error

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_run_failed, (self.__class__, str(self), self.stop_reason, self.error))


def _rebuild_run_failed(
    cls: type[RunFailedError], message: str, stop_reason: str | None, error: str | None
) -> RunFailedError:
    return cls(message, stop_reason=stop_reason, error=error)


class ModelError(RunError):
    """A model adapter failed. ``status_code`` and ``body`` are set for HTTP failures."""

    def __init__(self, message: str, *, status_code: int | None = None, body: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.body = body

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_model_error, (self.__class__, str(self), self.status_code, self.body))


def _rebuild_model_error(cls: type[ModelError], message: str, status_code: int | None, body: str | None) -> Any:
    return cls(message, status_code=status_code, body=body)


class ContextError(RunError):
    """A model request could not be assembled within its rules."""


class CheckpointError(RunError):
    """Durable storage failed or refused an operation."""


class SessionNotFoundError(CheckpointError, KeyError):
    """No session with this id exists in the store."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} not found")
        self.session_id = session_id

    def __str__(self) -> str:  # KeyError would quote the message
        return f"session {self.session_id!r} not found"

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.session_id,))


class HeadConflictError(CheckpointError):
    """A commit expected one head but the store holds another (another writer won)."""

    def __init__(self, session_id: str, expected_head: str | None, actual_head: str | None) -> None:
        super().__init__(
            f"session {session_id!r}: head moved; expected {expected_head or '<none>'}, "
            f"found {actual_head or '<none>'} (another writer committed first)"
        )
        self.session_id = session_id
        self.expected_head = expected_head
        self.actual_head = actual_head

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.session_id, self.expected_head, self.actual_head))


class SessionBusyError(CheckpointError):
    """Another runner holds this session's lease; nothing was executed.

    ``owner`` is the holder's id and ``expires_at`` (seconds since the epoch, by the store's clock)
    when the lease lapses unless renewed; after that another runner may take the session over.
    """

    def __init__(self, session_id: str, owner: str, expires_at: float) -> None:
        super().__init__(
            f"session {session_id!r} is being run by {owner!r} (lease until {_clock(expires_at)}); "
            "wait for that run to end, or for its lease to expire if its runner died"
        )
        self.session_id = session_id
        self.owner = owner
        self.expires_at = expires_at

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.session_id, self.owner, self.expires_at))


class LeaseLostError(CheckpointError):
    """A write carried a fencing token that is no longer the session's current, unexpired lease.

    The runner lost the session (its lease expired, or another runner took it over); the store
    refused the write, so a stale runner can never record a step or start a tool.
    """

    def __init__(self, session_id: str, token: int, reason: str) -> None:
        super().__init__(f"session {session_id!r}: lease token {token} is no longer valid ({reason})")
        self.session_id = session_id
        self.token = token
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.session_id, self.token, self.reason))


class IntegrityError(CheckpointError):
    """A stored row is damaged: its content does not match its digest, or it cannot be decoded.

    ``table`` and ``row`` locate it (``writes``, ``tool_result/call-1``), ``session_id`` names the
    session it belongs to when known. Restore never trusts such a row.
    """

    def __init__(self, table: str, row: str, reason: str, *, session_id: str | None = None) -> None:
        where = f"{table} row {row}" + (f" of session {session_id!r}" if session_id else "")
        super().__init__(f"{where}: {reason}")
        self.table = table
        self.row = row
        self.reason = reason
        self.session_id = session_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_integrity_error, (self.__class__, self.table, self.row, self.reason, self.session_id))


def _rebuild_integrity_error(
    cls: type[IntegrityError], table: str, row: str, reason: str, session_id: str | None
) -> IntegrityError:
    error = IntegrityError.__new__(cls)
    IntegrityError.__init__(error, table, row, reason, session_id=session_id)
    return error


class SnapshotIntegrityError(IntegrityError):
    """A snapshot's stored content does not match its identity digest, or cannot be read."""

    def __init__(self, snapshot_id: str, reason: str, *, session_id: str | None = None) -> None:
        super().__init__("snapshots", snapshot_id, reason, session_id=session_id)
        self.snapshot_id = snapshot_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_snapshot_error, (self.__class__, self.snapshot_id, self.reason, self.session_id))


def _rebuild_snapshot_error(
    cls: type[SnapshotIntegrityError], snapshot_id: str, reason: str, session_id: str | None
) -> SnapshotIntegrityError:
    return cls(snapshot_id, reason, session_id=session_id)


def _clock(epoch_seconds: float) -> str:
    return datetime.fromtimestamp(epoch_seconds, UTC).isoformat(timespec="milliseconds")
