"""qitos.engine: the one canonical loop and its runtimes.

``Engine``, ``AsyncEngine``, ``EngineResult``, ``RuntimeBudget`` and ``compose`` are at the root
(``from qitos import Engine``); this face holds what a user adds around them: hooks and events,
stop criteria and critics, fan-out, teams and delegation, lifecycle policies, compositions and
OpenTelemetry settings. ``qitos.engine.session_runtime`` (``Session``) and ``qitos.engine.runtime``
(``LifecyclePolicy``) are public modules of their own; everything else lives in private modules.
"""

from qitos.engine._composition import Composition
from qitos.engine._delegation import Delegation, delegate
from qitos.engine._events import EngineEvent, EngineEventType, EventStream, StepRecord
from qitos.engine._fanout import CandidateOutcome, FanoutSelector
from qitos.engine._handoff import Team, TeamState
from qitos.engine._hooks import EngineHook, HookContext
from qitos.engine._policies import Critic, CriticVerdict, FinalResultCriteria, FirstCandidateSelector, StopCriteria
from qitos.engine._telemetry import OtelSettings
from qitos.engine.runtime import RuntimeSnapshotContext

__all__ = [
    "CandidateOutcome",
    "Composition",
    "Critic",
    "CriticVerdict",
    "Delegation",
    "EngineEvent",
    "EngineEventType",
    "EngineHook",
    "EventStream",
    "FanoutSelector",
    "FinalResultCriteria",
    "FirstCandidateSelector",
    "HookContext",
    "OtelSettings",
    "RuntimeSnapshotContext",
    "StepRecord",
    "StopCriteria",
    "Team",
    "TeamState",
    "delegate",
]
