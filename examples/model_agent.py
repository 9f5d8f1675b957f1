"""The model path: an agent that does not override decide asks its model at every step. Here the
model is a plain function of the chat messages (offline and deterministic); swap in
`qitos.models.OpenAICompatibleModel(...)` to talk to a server.

Run: python model_agent.py
"""
# prints: it is 21 degrees in Paris

from typing import Any

from qitos import AgentModule, Engine, StateSchema, tool
from qitos.models import FunctionModel


@tool(idempotent=True)
def temperature(city: str) -> int:
    """Today's temperature in a city, in degrees Celsius.

    Args:
        city: the city.
    """
    return {"Paris": 21, "Oslo": 9}.get(city, 15)


class WeatherAgent(AgentModule[StateSchema, object, object]):
    tools = (temperature,)

    def init_state(self, task: str, **kwargs: Any) -> StateSchema:
        return StateSchema(task=task, max_steps=4)

    def build_system_prompt(self, state: StateSchema) -> str:
        return "Answer weather questions with the temperature tool."

    def reduce(self, state: StateSchema, observation: object, decision: object) -> StateSchema:
        return state


def model(messages: list[dict[str, Any]]) -> str | dict[str, Any]:
    """Call the tool once, then answer from its result."""
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if not results:
        return {"tool_calls": [{"name": "temperature", "arguments": {"city": "Paris"}}]}
    return f"it is {results[-1]} degrees in Paris"


if __name__ == "__main__":
    result = Engine(WeatherAgent(), model=FunctionModel(model, takes="messages")).run("How warm is Paris?")
    print(result.state.final_result)
