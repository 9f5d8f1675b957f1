"""A durable session that waits for a human: a tool that needs approval pauses the session; the
answer is a durable control item, taken in when the session is resumed (here in the same
program; `qitos sessions approve` and the viewer give it from anywhere).

Run: python approval_session.py
"""
# prints: completed: sent 'the report'

from dataclasses import dataclass, field
from typing import Any

from qitos import Action, AgentModule, Decision, Observation, StateSchema, compose, tool
from qitos.checkpoint import SqliteCheckpointStore


@tool(needs_approval=True)
def send(text: str) -> str:
    """Send a text to the outside world.

    Args:
        text: what to send.
    """
    return f"sent {text!r}"


@dataclass
class SendState(StateSchema):
    sent: list[str] = field(default_factory=list)


class Sender(AgentModule[SendState, Observation, Action]):
    tools = (send,)

    def init_state(self, task: str, **kwargs: Any) -> SendState:
        return SendState(task=task, max_steps=4)

    def decide(self, state: SendState, observation: Observation) -> Decision[Action]:
        if state.sent:
            return Decision.final(state.sent[-1])
        return Decision.act([Action("send", {"text": state.task}, id="send-1")])

    def reduce(self, state: SendState, observation: Observation, decision: Decision[Action]) -> SendState:
        state.sent.extend(result.as_text() for result in observation.results)
        return state


if __name__ == "__main__":
    composition = compose(agent=Sender, checkpoint_store=SqliteCheckpointStore("approvals.db"))
    session = composition.session("the report")
    print(session.run().state.stop_reason)  # awaiting_approval
    batch = session.inspect().tool_batch  # the step's tool calls, stopped at the one awaiting approval
    assert batch is not None
    (waiting,) = batch.pending_approval
    print(f"approve {waiting.tool}({waiting.args}) with: qitos sessions approve {session.session_id.value} "
          f"{waiting.call_id} --db approvals.db")
    again = composition.restore(session.session_id.value)  # as another process would
    again.approve(waiting.call_id)
    result = again.run()
    print(f"{again.inspect().lifecycle}: {result.state.final_result}")
