"""qitos: a Python agent kernel.

Typed agent state, one canonical decide -> act -> reduce loop, durable sessions, and honest
context management. Start with ``AgentModule`` and ``Engine``; ``compose`` gives durable sessions.

The public surface, one obvious place per need:

- ``qitos``: the kernel's names (state, task, decision, agent, engine, tools, ``compose``) plus
  ``Agent`` (the stock tool-calling agent, ``Agent(model, tools=[...], instructions="...")``),
  ``Observation`` (what ``reduce`` receives), ``RuntimeBudget`` (the engine's limits) and
  ``RunFailedError`` (what ``agent.run`` raises when a run fails);
- ``qitos.models``: model adapters (``OpenAICompatibleModel``, ``ScriptedModel``, ``ReplayModel``,
  ``FunctionModel``, ``LocalModel``);
- ``qitos.checkpoint``: session stores (``SqliteCheckpointStore``, ``InMemoryCheckpointStore``);
- ``qitos.tools``: ``tool``, ``ToolRegistry`` and the kit's file, shell and MCP tools.

Each package's ``__init__`` is its face; modules named ``_name`` are internal.
"""

from qitos.core._agent_module import AgentModule
from qitos.core._decision import Action, Decision, Observation
from qitos.core._errors import RunFailedError
from qitos.core._state import StateSchema, StopReason
from qitos.core._task import Task, TaskBudget, TaskResource
from qitos.core._tool import ToolRegistry, tool
from qitos.engine._async_engine import AsyncEngine
from qitos.engine._composition import compose
from qitos.engine._engine import Engine
from qitos.engine._events import EngineResult
from qitos.engine.runtime import RuntimeBudget
from qitos.kit._agent import Agent

__version__ = "0.1.0"

__all__ = [
    "Action",
    "Agent",
    "AgentModule",
    "AsyncEngine",
    "Decision",
    "Engine",
    "EngineResult",
    "Observation",
    "RunFailedError",
    "RuntimeBudget",
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
