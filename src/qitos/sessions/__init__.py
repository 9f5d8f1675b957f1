"""Durable sessions' storage side: the snapshot format, its writer and reader, the step journal.

Depends on ``qitos.checkpoint`` and ``qitos.core`` only. The ``Session`` facade that runs the engine
lives in ``qitos.engine.session_runtime``, above this package. The face holds what a ``Session``'s
controls return: the receipts of ``pause``, ``steer`` and ``approve``/``reject``, and the lifecycle an
inspection reports.
"""

from qitos.sessions._control import ApprovalReceipt, PauseReceipt, SteeringReceipt
from qitos.sessions._inspection import SessionLifecycle

__all__ = ["ApprovalReceipt", "PauseReceipt", "SessionLifecycle", "SteeringReceipt"]
