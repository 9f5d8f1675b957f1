"""A small app built on the stock ``Agent``, importable as ``agent_app`` by the tests and their
subprocesses: the way a user's module makes an agent at import time and restores its sessions.

``make_agent(script)`` builds the agent with a ``ScriptedModel`` answering ``script`` (JSON-native
responses); ``agent`` is one made at import with the script in ``$AGENT_APP_SCRIPT`` (a JSON
list; empty by default), so ``--agent agent_app:agent`` names a configured instance.
``python -m agent_app resume --db DB --session S [--approve CALL]`` restores a session in a new
process, approves a call if asked, runs it and prints the outcome as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from qitos import Agent, compose, tool
from qitos.models.scripted import ScriptedModel

INSTRUCTIONS = "You publish short notes. Use the tools."


@tool
def word_count(text: str) -> int:
    """Count the words of a text.

    Args:
        text: the text.
    """
    return len(text.split())


@tool(needs_approval=True)
def publish(title: str) -> str:
    """Publish a note (a human approves each call).

    Args:
        title: the note's title.
    """
    return f"published {title!r}"


def make_agent(script: list[Any]) -> Agent:
    """The app's agent, its model answering ``script``."""
    return Agent(ScriptedModel(script), tools=[word_count, publish], instructions=INSTRUCTIONS, max_steps=8)


agent = make_agent(json.loads(os.environ.get("AGENT_APP_SCRIPT", "[]")))


def main() -> None:
    parser = argparse.ArgumentParser(prog="agent_app")
    parser.add_argument("command", choices=["resume"])
    parser.add_argument("--db", required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("--approve")
    parser.add_argument("--script", default="[]", help="the model's remaining responses (JSON list)")
    args = parser.parse_args()
    composition = compose(agent=make_agent(json.loads(args.script)), store=args.db)
    session = composition.restore(args.session)
    if args.approve:
        session.approve(args.approve)
    result = session.run()
    state = result.state
    print(
        json.dumps(
            {
                "stop_reason": state.stop_reason,
                "final_result": state.final_result,
                "state_type": type(state).__qualname__,
            }
        )
    )
    composition.runtime.checkpoint_store.close()


if __name__ == "__main__":
    main()
