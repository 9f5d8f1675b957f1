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
        │   └── SnapshotIntegrityError   stored bytes do not match their digest
        └── (MemoryResourceError)   a bound memory root is missing; see qitos.core.memory

Pausing and awaiting approval are *signals* reported through ``StopReason``, never errors.
Errors carry typed fields, do no work in ``__init__`` beyond storing them, and pickle.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CheckpointError",
    "CodecError",
    "ConfigurationError",
    "ContextError",
    "HeadConflictError",
    "ModelError",
    "QitosError",
    "RunError",
    "RunFailedError",
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


class SnapshotIntegrityError(CheckpointError):
    """A snapshot's stored content does not match its identity digest, or cannot be read."""

    def __init__(self, snapshot_id: str, reason: str) -> None:
        super().__init__(f"snapshot {snapshot_id}: {reason}")
        self.snapshot_id = snapshot_id
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.snapshot_id, self.reason))
