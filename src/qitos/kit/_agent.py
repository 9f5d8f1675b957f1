"""``Agent``: the stock tool-calling agent, in one line.

::

    from qitos import Agent

    agent = Agent(model, tools=[word_count], instructions="Answer in one sentence.")
    print(agent.run("How many words are in 'the quick brown fox'?"))

An ``Agent`` is an ordinary :class:`~qitos.core._agent_module.AgentModule` whose ``decide`` always
takes the engine's model path: every step asks the model, which calls tools or answers. The
conversation is the run's exchange log (the task is its first user message, ``instructions`` the
system prompt, steering and tool results follow), so the agent itself keeps nothing between steps
and one instance serves any number of runs. Its typed state is :class:`AgentState` (the built-in
fields of :class:`~qitos.core._state.StateSchema`). ``memory`` is recalled into every request.

Typed output: with ``output_type=`` a dataclass or a pydantic model, the final answer is a
validated object of that type (see ``qitos.core._output``: the model answers through a
``final_answer`` tool, or a ``response_format`` where the adapter declares one, and an answer that
does not validate is sent back with repair feedback, bounded by the step budget). ``agent.run``
returns it typed, and the state keeps it as ``state.output``: the state type is then
``AgentState[<module>.<Type>]``, a subclass of :class:`AgentState` with that one field
(:func:`typed_state`), so the value round-trips the codec through sessions and restores.

It goes wherever an agent goes: ``agent.run(...)``, ``Engine(agent)``, ``compose(agent=agent)`` (a
ready instance serves every session), ``delegate("research", agent)``, a ``Team`` member, an eval.

A restore rebuilds it from code, like any agent: the store holds the session (state, exchange log,
control items), never the model, the tools or the instructions. The process that restores builds
the same ``Agent`` (typically by importing the module that makes it) and hands it to ``compose``
or ``Engine`` before ``restore(session_id)``; from the command line, ``--agent module:name`` names
that instance (``qitos sessions resume S --agent app:agent``). The class alone cannot stand for a
configured agent, so ``Agent()`` without a model argument is an error rather than a bare agent
that would continue a session without its tools and instructions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from qitos.core._agent_module import AgentModule
from qitos.core._codec import canonical_json, sha256_hex
from qitos.core._decision import Action, Decision, Observation
from qitos.core._errors import ConfigurationError
from qitos.core._output import OutputSpec
from qitos.core._state import StateSchema
from qitos.core._tool import ToolRegistry

if TYPE_CHECKING:
    from qitos.core.memory import Memory
    from qitos.models._function import ModelSource

__all__ = ["Agent", "AgentState", "typed_state"]


@dataclass
class AgentState(StateSchema):
    """The state of a stock :class:`Agent`'s run: the built-in fields (the conversation is the
    run's exchange log, not state)."""


_TYPED_STATES: dict[type, type[AgentState]] = {}


def typed_state(output_type: type) -> type[AgentState]:
    """``AgentState`` with an ``output`` field of ``output_type`` (None until the final answer):
    one class per output type, named ``AgentState[<module>.<Type>]`` (a restore in another process
    finds it through the agent that makes it)."""
    made = _TYPED_STATES.get(output_type)
    if made is None:
        name = f"AgentState[{output_type.__module__}.{output_type.__qualname__}]"
        made = dataclasses.make_dataclass(
            name,
            [("output", Optional[output_type], dataclasses.field(default=None))],  # noqa: UP045
            bases=(AgentState,),
            namespace={"__module__": __name__, "__doc__": f"An Agent's state with its typed {name} answer."},
        )
        made.__qualname__ = name
        _TYPED_STATES[output_type] = made
    return made


class Agent(AgentModule[AgentState, Observation, Action]):
    """A tool-calling agent: a model, tools, instructions, optional memory.

    Args:
        model: the model adapter (or a function ``messages -> text``); None when the engine or
            ``compose(model=...)`` provides it. Required as an argument, so that the class alone
            never stands for a configured agent (see the module docstring).
        instructions: the system prompt of every request (None: none).
        tools: the tools the model may call (``@tool`` functions, ToolSpecs, ``delegate(...)``
            tools) or a ready ToolRegistry.
        memory: a ``Memory`` recalled fresh into every model request.
        output_type: the type of the final answer, a dataclass or a pydantic model (None: text).
        max_steps: the step limit of a run, unless a task or engine budget sets one.
    """

    def __init__(
        self,
        model: ModelSource | None,
        *,
        instructions: str | None = None,
        tools: Sequence[Any] | ToolRegistry = (),
        memory: Memory | None = None,
        output_type: type | None = None,
        max_steps: int = 10,
    ) -> None:
        if instructions is not None and not isinstance(instructions, str):
            raise ConfigurationError(f"Agent: instructions must be a string or None, got {type(instructions).__name__}")
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ConfigurationError(f"Agent: max_steps must be a positive int, got {max_steps!r}")
        if isinstance(tools, str) or not isinstance(tools, Sequence | ToolRegistry):
            raise ConfigurationError(f"Agent: tools must be a list of tools or a ToolRegistry, got {tools!r:.80}")
        registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
        super().__init__(tool_registry=registry, llm=model, memory=memory)
        self.instructions = instructions
        self.max_steps = max_steps
        self.output_type = output_type
        self._output = OutputSpec.of(output_type) if output_type is not None else None
        if self._output is not None:
            self._output.check_tools(registry.names(), "Agent")
        self._state_type = typed_state(output_type) if output_type is not None else AgentState

    def init_state(self, task: str, **kwargs: Any) -> AgentState:
        """A fresh state for ``task`` (``max_steps=`` may override the agent's step limit)."""
        unknown = set(kwargs) - {"max_steps"}
        if unknown:
            raise ConfigurationError(f"Agent.init_state: unknown argument(s) {sorted(unknown)} (it takes max_steps=)")
        return self._state_type(task=task, max_steps=int(kwargs.get("max_steps", self.max_steps)))

    def build_system_prompt(self, state: AgentState) -> str | None:
        """The ``instructions``."""
        return self.instructions

    def prepare(self, state: AgentState) -> str:
        """The task itself is the first user message."""
        return state.task

    def reduce(self, state: AgentState, observation: Observation, decision: Decision[Action]) -> AgentState:
        """Keep a typed final answer as ``state.output``; tool results and text are in the run's
        exchange log already."""
        spec = self._output
        if spec is not None and decision.mode == "final" and "output" in decision.meta:
            state.output = spec.from_data(decision.meta["output"])
        return state

    def describe(self) -> dict[str, Any]:
        """What makes this agent the agent it is, as JSON (for pins and traces): the digests of its
        instructions and tool schemas, its tool names and step limit; no model, no credentials."""
        schemas = self.tool_registry.schemas()
        return {
            "agent": f"{type(self).__module__}:{type(self).__qualname__}",
            "instructions_digest": sha256_hex(self.instructions or ""),
            "tools": [schema["name"] for schema in schemas],
            "tools_digest": sha256_hex(canonical_json(schemas)),
            "output_schema_digest": sha256_hex(canonical_json(self._output.schema)) if self._output else None,
            "max_steps": self.max_steps,
        }

    def __repr__(self) -> str:
        tools = ", ".join(self.tool_registry.names())
        return f"Agent(tools=[{tools}], instructions={self.instructions!r:.60}, max_steps={self.max_steps})"
