"""qitos.core: the contracts (dataclasses, protocols, errors, codec).

The face holds what a user catches or reads from a run: every qitos error and the exchange log's
records. The root package holds the rest (``StateSchema``, ``Task``, ``Decision``, ``tool``, ...);
``qitos.core.context``, ``qitos.core.memory`` and ``qitos.core.request_view`` are public modules of
their own. Everything else lives in private modules.
"""

from qitos.core._errors import (
    CheckpointError,
    CodecError,
    ConfigurationError,
    ContextError,
    HeadConflictError,
    IntegrityError,
    LeaseLostError,
    ModelError,
    QitosError,
    RunError,
    RunFailedError,
    SessionBusyError,
    SessionNotFoundError,
    SnapshotIntegrityError,
    StateValidationError,
    ToolDefinitionError,
    UsageError,
)
from qitos.core._exchange import Exchange, ExchangeLog

__all__ = [
    "CheckpointError",
    "CodecError",
    "ConfigurationError",
    "ContextError",
    "Exchange",
    "ExchangeLog",
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
