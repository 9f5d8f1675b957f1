"""qitos: a Python agent kernel.

Typed agent state, one canonical decide -> act -> reduce loop, durable sessions, and honest
context management. Start with ``AgentModule`` and ``Engine``; ``compose`` gives durable sessions.
"""

from qitos.core.agent_module import AgentModule
from qitos.core.decision import Action, Decision
from qitos.core.state import StateSchema, StopReason
from qitos.core.task import Task, TaskBudget, TaskResource
from qitos.core.tool import ToolRegistry, tool
from qitos.engine.async_engine import AsyncEngine
from qitos.engine.composition import compose
from qitos.engine.engine import Engine
from qitos.engine.events import EngineResult

__version__ = "0.1.0"

__all__ = [
    "Action",
    "AgentModule",
    "AsyncEngine",
    "Decision",
    "Engine",
    "EngineResult",
    "StateSchema",
    "StopReason",
    "Task",
    "TaskBudget",
    "TaskResource",
    "ToolRegistry",
    "__version__",
    "compose",
    "tool",
]
