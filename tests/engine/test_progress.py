"""``progress=True``: a line per step, rendered from the run's events, for ``agent.run`` and
``Session.run`` (and ``arun``), on stderr or a given stream; it never makes the model stream."""

from __future__ import annotations

import asyncio
import io
import re
from typing import Any

import pytest

from qitos import Action, Decision, compose, tool
from qitos.core._errors import ConfigurationError
from qitos.engine._engine import Engine
from qitos.engine._events import EngineEvent
from qitos.engine._events import EngineEventType as E
from qitos.engine._progress import ProgressPrinter
from qitos.models._scripted import ScriptedModel


@tool
def noop() -> str:
    """Do nothing."""
    return "nothing done"


def act_then_answer(state: Any, observation: Any) -> Decision[Any]:
    if state.current_step == 0:
        return Decision.act([Action("noop", {}, id="n0")])
    return Decision.final("42")


STEP = re.compile(r"^step +(\d+) (act|final|wait) +(?:(.*) · )?\d+ ms$")


def _check(text: str, *, tokens: bool = False) -> list[str]:
    lines = text.splitlines()
    assert lines[0].startswith("run run_") and lines[0].endswith("  answer the question")
    steps = [STEP.match(line) for line in lines[1:3]]
    assert all(steps), lines
    assert [(m.group(1), m.group(2)) for m in steps if m] == [("0", "act"), ("1", "final")]
    assert steps[0] is not None and (steps[0].group(3) or "").startswith("noop ok")
    assert lines[3].startswith("completed · final · 2 step(s) · ")
    assert lines[3].endswith(" tokens") and (tokens or lines[3].endswith("· 0 tokens"))
    assert lines[4] == "answer: 42"
    return lines


def test_agent_run_with_progress_prints_a_line_per_step(policy_agent: Any, capsys: pytest.CaptureFixture[str]) -> None:
    agent = policy_agent(act_then_answer, tools=[noop])
    assert agent.run("answer the question", progress=True, trace=False) == "42"
    captured = capsys.readouterr()
    assert captured.out == ""  # stderr, so a program's own output stays clean
    _check(captured.err)


def test_the_lines_come_from_the_events_alone(policy_agent: Any) -> None:
    live = io.StringIO()
    result = policy_agent(act_then_answer, tools=[noop]).run(
        "answer the question", progress=live, trace=False, return_state=True
    )
    replayed = io.StringIO()
    printer = ProgressPrinter(replayed)
    for event in result.events:
        printer(event)
    assert replayed.getvalue() == live.getvalue()
    _check(live.getvalue())


class StreamWatchingModel(ScriptedModel):
    """A scripted model that records whether each request asked for streamed text."""

    def __init__(self, responses: Any) -> None:
        super().__init__(responses)
        self.streamed: list[bool] = []

    def complete(self, view: Any, *, on_delta: Any = None) -> Any:
        self.streamed.append(on_delta is not None)
        return super().complete(view, on_delta=on_delta)


def test_session_run_and_arun_take_progress_and_do_not_make_the_model_stream(policy_agent: Any) -> None:
    model = StreamWatchingModel(
        [
            {
                "tool_calls": [{"id": "m1", "name": "noop", "arguments": {}}],
                "usage": {"input_tokens": 9, "output_tokens": 3},
            },
            {"text": "42", "usage": {"input_tokens": 20, "output_tokens": 1}},
        ]
        * 2
    )
    composition = compose(agent=lambda: policy_agent(lambda s, o: None, tools=[noop]), model=model)
    out = io.StringIO()
    result = composition.session("answer the question").run(progress=out)
    assert result.state.final_result == "42"
    lines = _check(out.getvalue(), tokens=True)
    assert "· 12 tokens ·" in lines[1] and "21 tokens ·" in lines[2] and lines[3].endswith("· 33 tokens")
    assert model.streamed == [False, False]  # a progress line needs no streamed text
    again = io.StringIO()
    asyncio.run(composition.session("answer the question").arun(progress=again))
    _check(again.getvalue(), tokens=True)


def test_progress_takes_true_false_or_a_stream(policy_agent: Any) -> None:
    agent = policy_agent(act_then_answer, tools=[noop])
    with pytest.raises(ConfigurationError, match="progress= takes True, False or a text stream"):
        agent.run("t", progress="loud", trace=False)
    with pytest.raises(ConfigurationError, match="progress="):
        compose(agent=lambda: agent).session("t").run(progress=3)  # type: ignore[arg-type]


def test_the_hooks_of_engine_kwargs_and_progress_both_run(policy_agent: Any) -> None:
    seen: list[str] = []

    class Counter(ProgressPrinter):
        def on_event(self, event: Any) -> None:
            seen.append(event.event_type.value)

    out = io.StringIO()
    policy_agent(act_then_answer, tools=[noop]).run(
        "answer the question", progress=out, trace=False, engine_kwargs={"hooks": [Counter()]}
    )
    assert seen[0] == "run_start" and seen[-1] == "run_end"
    _check(out.getvalue())


def test_retries_approval_waits_delegations_and_errors_get_a_line_as_they_happen() -> None:
    out = io.StringIO()
    printer = ProgressPrinter(out)
    for event in (
        EngineEvent(E.MODEL_RETRY, 0, payload={"attempt": 1, "max_retries": 3, "reason": "HTTP 429", "delay_s": 0.5}),
        EngineEvent(E.APPROVAL, 0, payload={"status": "pending", "tool": "publish", "call_id": "c1"}),
        EngineEvent(E.DELEGATE, 0, payload={"tool": "research", "status": "started", "child_session_id": "ses_c"}),
        EngineEvent(E.ERROR, 0, ok=False, error="ValueError: bad"),
    ):
        printer(event)
    assert out.getvalue().splitlines() == [
        "  model retry 1/3: HTTP 429 (waiting 0.5 s)",
        "  awaiting approval: publish call c1",
        "  delegate research: started (ses_c)",
        "  error: ValueError: bad",
    ]


def test_the_printer_is_an_engine_hook_too(policy_agent: Any) -> None:
    out = io.StringIO()
    Engine(policy_agent(act_then_answer, tools=[noop]), hooks=[ProgressPrinter(out)]).run("answer the question")
    _check(out.getvalue())
