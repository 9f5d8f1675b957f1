"""Handoff: a Team of agents shares one exchange log and hands the conversation on with
`transfer_to_<name>` tools. The team is built by a named factory, so a session of it records this file's path and
`make_team`, and `qitos sessions resume` can rebuild it in another process.

Run: python team_handoff.py
"""
# prints: refund issued ['billing']

from typing import Any

from qitos import Action, AgentModule, Decision, compose
from qitos.checkpoint import SqliteCheckpointStore
from qitos.engine import Team, TeamState


class Triage(AgentModule[TeamState, object, Action]):
    def init_state(self, task: str, **kwargs: Any) -> TeamState:
        return TeamState(task=task, max_steps=6)

    def decide(self, state: TeamState, observation: object) -> Decision[Action]:
        return Decision.act([Action("transfer_to_billing", {"reason": "a refund"})])

    def reduce(self, state: TeamState, observation: object, decision: Decision[Action]) -> TeamState:
        return state


class Billing(AgentModule[TeamState, object, Action]):
    def init_state(self, task: str, **kwargs: Any) -> TeamState:
        return TeamState(task=task, max_steps=6)

    def decide(self, state: TeamState, observation: object) -> Decision[Action]:
        return Decision.final("refund issued")

    def reduce(self, state: TeamState, observation: object, decision: Decision[Action]) -> TeamState:
        return state


def make_team() -> Team:
    return Team({"triage": Triage(), "billing": Billing()}, first="triage")


if __name__ == "__main__":
    session = compose(agent=make_team, checkpoint_store=SqliteCheckpointStore("team.db")).session("I was charged twice")
    state = session.run().state
    print(state.final_result, [handoff["to"] for handoff in state.handoffs])
