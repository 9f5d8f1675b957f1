"""A small app built on the stock ``Agent``, importable as ``agent_app`` by the tests and their
subprocesses: the way a user's module makes an agent at import time and restores its sessions.

``make_agent(script, typed=False)`` builds the agent with a ``ScriptedModel`` answering ``script``
(JSON-native responses); ``typed=True`` makes its final answer a :class:`Note`. ``agent`` is one
made at import with the script in ``$AGENT_APP_SCRIPT`` (a JSON list; empty by default), so
``--agent agent_app:agent`` names a configured instance. ``python -m agent_app resume --db DB
--session S [--approve CALL] [--typed]`` restores a session in a new process, approves a call if
asked, runs it and prints the outcome as JSON.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
from dataclasses import dataclass
from typing import Any

from qitos import Agent, compose, tool
from qitos.models._scripted import ScriptedModel

INSTRUCTIONS = "You publish short notes. Use the tools."


@dataclass(frozen=True)
class Note:
    """What the typed agent answers: the note it published."""

    title: str
    words: int


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


def make_agent(script: list[Any], *, typed: bool = False) -> Agent:
    """The app's agent, its model answering ``script`` (its answer a Note when ``typed``)."""
    return Agent(
        ScriptedModel(script),
        tools=[word_count, publish],
        instructions=INSTRUCTIONS,
        output_type=Note if typed else None,
        max_steps=8,
    )


agent = make_agent(json.loads(os.environ.get("AGENT_APP_SCRIPT", "[]")))


def main() -> None:
    parser = argparse.ArgumentParser(prog="agent_app")
    parser.add_argument("command", choices=["resume"])
    parser.add_argument("--db", required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("--approve")
    parser.add_argument("--script", default="[]", help="the model's remaining responses (JSON list)")
    parser.add_argument("--typed", action="store_true", help="the agent's answer is a Note")
    args = parser.parse_args()
    # The app as its module (under -m this file runs as __main__, whose Note is another class).
    app = importlib.import_module("agent_app")
    composition = compose(agent=app.make_agent(json.loads(args.script), typed=args.typed), store=args.db)
    session = composition.restore(args.session)
    if args.approve:
        session.approve(args.approve)
    result = session.run()
    state = result.state
    outcome = {"stop_reason": state.stop_reason, "final_result": state.final_result}
    if args.typed:
        output = state.output
        outcome["output_type"] = type(output).__qualname__
        outcome["output"] = [output.title, output.words] if isinstance(output, app.Note) else None
    print(json.dumps({**outcome, "state_type": type(state).__qualname__}))
    composition.runtime.checkpoint_store.close()


if __name__ == "__main__":
    main()
