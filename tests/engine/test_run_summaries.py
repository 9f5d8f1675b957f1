"""A session run's trace summary and run_start event describe that run, not the whole session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qitos import Action, Decision, compose, tool
from qitos.engine._events import EngineEventType
from qitos.trace import open_run


@tool
def jot(text: str) -> str:
    """Jot a line down.

    Args:
        text: the line.
    """
    return text


@tool(needs_approval=True)
def send(text: str) -> str:
    """Send a line (a human approves it).

    Args:
        text: the line.
    """
    return "sent " + text


def policy(state: Any, observation: Any) -> Decision[Any]:
    if len(state.log) == 0:
        return Decision.act([Action("jot", {"text": "one"})])
    if len(state.log) == 1:
        return Decision.act([Action("send", {"text": "two"}, id="call-send")])
    if len(state.log) == 2:
        return Decision.act([Action("jot", {"text": "three"})])
    return Decision.final("done")


def test_a_resumed_run_reports_its_own_steps_and_only_it_is_labelled_resumed(policy_agent: Any, tmp_path: Path) -> None:
    composition = compose(agent=lambda: policy_agent(policy, tools=[jot, send]), trace_logdir=str(tmp_path))
    session = composition.session("jot and send")
    first = session.run()
    assert first.state.stop_reason == "awaiting_approval" and first.state.current_step == 1
    session.approve("call-send")
    second = session.run()
    assert second.state.final_result == "done" and second.state.current_step == 4

    starts = [next(e for e in r.events if e.event_type is EngineEventType.RUN_START) for r in (first, second)]
    assert [s.payload["resumed"] for s in starts] == [False, True]  # the session's first run is not resumed
    one, two = (open_run(str(r.run_dir)).manifest()["summary"] for r in (first, second))
    assert one["steps"] == 1 and "session" not in one
    assert two["steps"] == 3  # this run's steps 1..3, not the session's 4
    assert two["session"]["steps"] == 4
    assert 0 <= two["elapsed_seconds"] <= two["session"]["elapsed_seconds"]


def test_the_live_renderer_labels_only_resumed_runs_and_counts_their_own_steps(
    policy_agent: Any, tmp_path: Path
) -> None:
    import io

    from rich.console import Console

    from qitos.cli._render import LiveRenderer

    out = io.StringIO()
    console = Console(file=out, width=160)
    renderer = LiveRenderer(console, live=False)
    composition = compose(agent=lambda: policy_agent(policy, tools=[jot, send]), hooks=[renderer])
    session = composition.session("jot and send")
    session.run()
    first = out.getvalue()
    session.approve("call-send")
    session.run()
    second = out.getvalue()[len(first) :]
    assert "(resumed)" not in first and "· 1 step(s) ·" in first
    assert "(resumed)" in second and "· 3 step(s) (step 4 of the session) ·" in second
