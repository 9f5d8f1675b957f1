"""An agent is typed state plus hooks: count the words of the task with a tool, then answer.

Run: python count_words.py
"""
# prints: 4 words

from dataclasses import dataclass, field
from typing import Any

from qitos import Action, AgentModule, Decision, Observation, StateSchema, tool


@tool(idempotent=True)
def word_count(text: str) -> int:
    """Count the words of a text.

    Args:
        text: the text to count.
    """
    return len(text.split())


@dataclass
class CountState(StateSchema):
    counts: list[int] = field(default_factory=list)


class CountAgent(AgentModule[CountState, Observation, Action]):
    tools = (word_count,)

    def init_state(self, task: str, **kwargs: Any) -> CountState:
        return CountState(task=task, max_steps=5)

    def decide(self, state: CountState, observation: Observation) -> Decision[Action]:
        if state.counts:
            return Decision.final(f"{state.counts[-1]} words")
        return Decision.act([Action("word_count", {"text": state.task})])

    def reduce(self, state: CountState, observation: Observation, decision: Decision[Action]) -> CountState:
        state.counts.extend(result.output for result in observation.results)
        return state


if __name__ == "__main__":
    print(CountAgent().run("the quick brown fox", trace_logdir="runs"))
