"""qitos.engine: the one canonical loop and its runtimes."""

from qitos.engine.async_engine import AsyncEngine
from qitos.engine.delegation import Delegation, delegate
from qitos.engine.engine import Engine
from qitos.engine.events import EngineEvent, EngineEventType, EngineResult, EventStream, StepRecord
from qitos.engine.fanout import CandidateOutcome, FanoutSelector
from qitos.engine.handoff import Team, TeamState
from qitos.engine.hooks import EngineHook, HookContext
from qitos.engine.policies import Critic, CriticVerdict, FinalResultCriteria, FirstCandidateSelector, StopCriteria
from qitos.engine.runtime import LifecyclePolicy, RuntimeBudget, RuntimeSnapshotContext

__all__ = [
    "AsyncEngine",
    "CandidateOutcome",
    "Critic",
    "CriticVerdict",
    "Delegation",
    "Engine",
    "EngineEvent",
    "EngineEventType",
    "EngineHook",
    "EngineResult",
    "EventStream",
    "FanoutSelector",
    "FinalResultCriteria",
    "FirstCandidateSelector",
    "HookContext",
    "LifecyclePolicy",
    "RuntimeBudget",
    "RuntimeSnapshotContext",
    "StepRecord",
    "StopCriteria",
    "Team",
    "TeamState",
    "delegate",
]
