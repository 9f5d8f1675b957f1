"""Handoff: an agent hands the conversation to another agent, on the same exchange log.

::

    team = Team({"triage": TriageAgent(), "billing": BillingAgent()}, first="triage", llm=model)
    Engine(team, checkpoint_store=store).session("My invoice is wrong").run()

A :class:`Team` is an AgentModule made of members that share one state type, a subclass of
:class:`TeamState`: the first member's state, or, when that is another StateSchema (a stock
``qitos.Agent``'s, say), that state with TeamState's fields added (:func:`team_state_type`). At
every step the active member decides, and (on the model path) its ``build_system_prompt`` /
``prepare`` and its tools make the request: the exchange log goes on under the new agent's
instructions and tools. Each member gets one extra tool per other member,
``transfer_to_<name>``; a successful call makes that member the active one when the step is
reduced (after the handing member's own ``reduce`` has seen the step), and the engine emits a
``handoff`` event (``from``, ``to``, ``call_id``). The active member and every handoff are in the
state (``active_agent``, ``handoffs``), so a session restored in another process continues under
the agent it was handed to.

Loop guard: at most ``max_handoffs`` handoffs in one state's life; and no immediate ping-pong: a
member that was just handed the conversation cannot hand it straight back to the one that handed
it over without having done a step of its own. A refused handoff is a failed tool call (the agent
reads why and goes on). The team runs with one model: the engine's (``Team(llm=...)``); members'
own ``llm`` are not used.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from qitos.core._agent_module import AgentModule
from qitos.core._decision import Decision
from qitos.core._errors import ConfigurationError, UsageError
from qitos.core._state import StateSchema
from qitos.core._tool import ToolRegistry, ToolResult, ToolSpec
from qitos.kit.parsers._base import DecisionParser
from qitos.models._function import ModelSource

__all__ = ["HANDOFF_PREFIX", "HandoffTool", "Team", "TeamState", "handoff_of", "team_state_type"]

HANDOFF_PREFIX = "transfer_to_"


@dataclass
class TeamState(StateSchema):
    """The state a team's members share: who is active, and the handoffs so far."""

    active_agent: str = ""
    handoffs: list[dict[str, Any]] = field(default_factory=list)


_TEAM_STATE_TYPES: dict[type[StateSchema], type[TeamState]] = {}


def team_state_type(state_type: type[StateSchema]) -> type[TeamState]:
    """``state_type`` with TeamState's fields: itself when it has them, else a subclass of both
    (one per state type, so a session restored in another process finds the same class again:
    its team's ``init_state`` makes it)."""
    if issubclass(state_type, TeamState):
        return state_type
    made = _TEAM_STATE_TYPES.get(state_type)
    if made is None:
        name = f"TeamState[{state_type.__module__}.{state_type.__qualname__}]"
        made = dataclasses.make_dataclass(name, [], bases=(state_type, TeamState), namespace={"__module__": __name__})
        made.__qualname__ = name
        _TEAM_STATE_TYPES[state_type] = made
    return made


class HandoffTool:
    """The function behind ``transfer_to_<target>``: asks the team to hand over (checks the guard)."""

    def __init__(self, team: Team, target: str) -> None:
        self.team = team
        self.target = target

    def __call__(self, reason: str = "") -> dict[str, Any]:
        """Request the handoff; the output names the target (the switch happens at REDUCE)."""
        source = self.team.check_handoff(self.target)
        return {"handoff_to": self.target, "handoff_from": source, "reason": reason}


def handoff_of(spec: ToolSpec | None, result: ToolResult) -> dict[str, Any] | None:
    """``{"from", "to"}`` when ``result`` is an accepted handoff (a ``HandoffTool`` call), else None."""
    output = result.output
    if not result.ok or type(output) is not dict or "handoff_to" not in output:
        return None
    if spec is None or not isinstance(spec.func, HandoffTool):
        return None
    return {"from": output.get("handoff_from"), "to": output["handoff_to"]}


class _TeamRegistry(ToolRegistry):
    """Every member's tools (so a step resumed after a restore finds its calls) and the handoff
    tools; the schemas a model is shown are the active member's only."""

    def __init__(self, team: Team) -> None:
        super().__init__()
        self._team = team
        self._by_member: dict[str, list[str]] = {}

    def add_member(self, member: str, specs: list[ToolSpec]) -> None:
        names = self._by_member.setdefault(member, [])
        for spec in specs:
            existing = self.get(spec.name)
            if existing is None:
                self.register(spec)
            elif existing.func is not spec.func:
                raise ConfigurationError(f"team members define two different tools named {spec.name!r}")
            names.append(spec.name)

    def schemas(self) -> list[dict[str, Any]]:
        wanted = self._by_member.get(self._team.active, [])
        return [spec.schema() for name in wanted if (spec := self.get(name)) is not None]

    def __iter__(self) -> Iterator[ToolSpec]:
        return iter([s for name in self._by_member.get(self._team.active, []) if (s := self.get(name)) is not None])


class Team(AgentModule[TeamState, Any, Any]):
    """Members that hand the conversation to each other (see the module docstring).

    Args:
        members: name -> AgentModule (they share the first member's state type; see the module docstring).
        first: the member that starts.
        max_handoffs: how many handoffs one state may have.
        llm: the model of the whole team (the model path of every member).
    """

    def __init__(
        self,
        members: Mapping[str, AgentModule[Any, Any, Any]],
        *,
        first: str,
        max_handoffs: int = 8,
        llm: ModelSource | None = None,
        model_parser: DecisionParser | None = None,
    ) -> None:
        if first not in members:
            raise ConfigurationError(f"Team: first={first!r} is not a member ({sorted(members)})")
        if isinstance(max_handoffs, bool) or max_handoffs < 0:
            raise ConfigurationError(f"Team: max_handoffs must be >= 0, got {max_handoffs!r}")
        self.members = dict(members)
        self.first = first
        self.max_handoffs = max_handoffs
        self.active = first
        self._state: TeamState | None = None
        registry = _TeamRegistry(self)
        super().__init__(tool_registry=registry, llm=llm, model_parser=model_parser)
        for name, member in self.members.items():
            handoffs = [
                ToolSpec(
                    name=f"{HANDOFF_PREFIX}{other}",
                    description=f"Hand the conversation to the {other} agent.",
                    parameters={
                        "type": "object",
                        "properties": {"reason": {"type": "string", "description": "why"}},
                        "additionalProperties": False,
                    },
                    func=HandoffTool(self, other),
                )
                for other in self.members
                if other != name
            ]
            registry.add_member(name, [*member.tool_registry, *handoffs])

    # ---- the guard

    def check_handoff(self, target: str) -> str:
        """The active member's name if it may hand over to ``target`` now; else UsageError saying why."""
        state = self._state
        source = state.active_agent if state is not None else self.active
        done = state.handoffs if state is not None else []
        if target == source:
            raise UsageError(f"{source} is already the active agent")
        if len(done) >= self.max_handoffs:
            raise UsageError(f"no more handoffs: the limit of {self.max_handoffs} is reached; answer yourself")
        last = done[-1] if done else None
        step = state.current_step if state is not None else 0
        if last is not None and last["to"] == source and last["from"] == target and step <= last["step"] + 1:
            raise UsageError(f"{target} just handed the conversation to {source}; do a step yourself first")
        return source

    # ---- AgentModule, delegated to the active member

    def _member(self, state: TeamState) -> AgentModule[Any, Any, Any]:
        self._state = state
        self.active = state.active_agent or self.first
        return self.members[self.active]

    def init_state(self, task: str, **kwargs: Any) -> TeamState:
        state = self.members[self.first].init_state(task, **kwargs)
        if not isinstance(state, StateSchema):
            raise ConfigurationError(f"team members must use a StateSchema subclass, got {type(state).__name__}")
        if not isinstance(state, TeamState):
            state = team_state_type(type(state)).from_dict(state.to_dict())
        state.active_agent = self.first
        self._state = state
        self.active = self.first
        return state

    def build_system_prompt(self, state: TeamState) -> str | None:
        return self._member(state).build_system_prompt(state)

    def prepare(self, state: TeamState) -> str:
        return self._member(state).prepare(state)

    def decide(self, state: TeamState, observation: Any) -> Decision[Any] | None:
        return self._member(state).decide(state, observation)

    def should_stop(self, state: TeamState) -> bool:
        return self._member(state).should_stop(state)

    def reduce(self, state: TeamState, observation: Any, decision: Decision[Any]) -> TeamState:
        member = self._member(state)
        new_state = member.reduce(state, observation, decision) or state
        for result in getattr(observation, "results", ()):
            move = handoff_of(self.tool_registry.get(result.name), result)
            if move is not None:
                new_state.handoffs = [*new_state.handoffs, {**move, "step": new_state.current_step}]
                new_state.active_agent = move["to"]
        self._member(new_state)
        return new_state
