"""Hooks are called at every point in order, hook errors are reported; critics continue/stop/retry."""

from __future__ import annotations

from typing import Any

import pytest

import driven
from qitos import Action, Decision, Engine, tool
from qitos.engine._hooks import HOOK_METHODS, EngineHook, HookContext
from qitos.engine._policies import CriticVerdict
from qitos.trace._reader import open_run

pytestmark = pytest.mark.usefixtures("driver")  # each test runs through both drivers


@tool
def count() -> str:
    """Count a call."""
    calls.append(1)
    return f"call {len(calls)}"


calls: list[int] = []


def two_steps(state: Any, observation: Any) -> Decision[Any]:
    return Decision.final("done") if state.current_step == 1 else Decision.act([Action("count", {})])


class Recorder(EngineHook):
    """Records (method, step_id, what the context carries) for every hook point."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, str]] = []

    def _note(self, name: str, ctx: HookContext) -> None:
        carried = "".join(
            letter
            for letter, value in (("d", ctx.decision), ("o", ctx.observation), ("r", ctx.record), ("R", ctx.result))
            if value is not None
        )
        self.seen.append((name, ctx.step_id, carried))

    def on_run_start(self, ctx: HookContext) -> None:
        self._note("on_run_start", ctx)

    def on_before_decide(self, ctx: HookContext) -> None:
        self._note("on_before_decide", ctx)

    def on_after_decide(self, ctx: HookContext) -> None:
        self._note("on_after_decide", ctx)

    def on_before_act(self, ctx: HookContext) -> None:
        self._note("on_before_act", ctx)

    def on_after_act(self, ctx: HookContext) -> None:
        self._note("on_after_act", ctx)

    def on_before_reduce(self, ctx: HookContext) -> None:
        self._note("on_before_reduce", ctx)

    def on_after_reduce(self, ctx: HookContext) -> None:
        self._note("on_after_reduce", ctx)

    def on_step_end(self, ctx: HookContext) -> None:
        self._note("on_step_end", ctx)

    def on_run_end(self, ctx: HookContext) -> None:
        self._note("on_run_end", ctx)


def test_every_hook_point_is_called_in_order(policy_agent: Any) -> None:
    recorder = Recorder()
    driven.run(Engine(policy_agent(two_steps, tools=[count]), hooks=[recorder]), "t")
    step = [
        ("on_before_decide", ""),
        ("on_after_decide", "d"),
        ("on_before_act", "d"),
        ("on_after_act", "do"),
        ("on_before_reduce", "do"),
        ("on_after_reduce", "do"),
        ("on_step_end", "dor"),
    ]
    assert recorder.seen[1:8] == [(name, 0, carried) for name, carried in step]
    names = [name for name, _, _ in recorder.seen]
    # ACT runs on every step (an act event is emitted even for a final decision), so both its hooks do.
    assert names == ["on_run_start", *[n for n, _ in step], *[n for n, _ in step], "on_run_end"]
    assert recorder.seen[0] == ("on_run_start", 0, "")
    assert recorder.seen[-1] == ("on_run_end", 2, "R")
    assert ("on_step_end", 1, "dor") in recorder.seen
    assert set(HOOK_METHODS) == set(names)


def test_hooks_run_in_the_order_they_were_given(policy_agent: Any) -> None:
    order: list[str] = []

    class Tag(EngineHook):
        def __init__(self, tag: str) -> None:
            self.tag = tag

        def on_run_start(self, ctx: HookContext) -> None:
            order.append(self.tag)

    driven.run(Engine(policy_agent(two_steps, tools=[count]), hooks=[Tag("a"), Tag("b"), Tag("c")]), "t")
    assert order == ["a", "b", "c"]


def test_plain_objects_with_hook_methods_work_as_hooks(policy_agent: Any) -> None:
    seen: list[int] = []

    class Duck:
        def on_step_end(self, ctx: HookContext) -> None:
            seen.append(ctx.step_id)

    policy_agent(two_steps, tools=[count]).run("t", hooks=[Duck()], trace=False)
    assert seen == [0, 1]


def test_a_raising_hook_is_reported_as_an_error_event_and_the_run_finishes(policy_agent: Any) -> None:
    class Broken(EngineHook):
        def on_before_decide(self, ctx: HookContext) -> None:
            raise ValueError("hook bug")

    later = Recorder()
    result = driven.run(Engine(policy_agent(two_steps, tools=[count]), hooks=[Broken(), later]), "t")
    assert result.state.stop_reason == "final" and result.state.final_result == "done"
    errors = [e for e in result.events if e.event_type.value == "error"]
    assert len(errors) == 2  # once per step
    assert errors[0].error == "hook Broken.on_before_decide raised ValueError: hook bug"
    assert errors[0].payload == {"hook": "Broken", "method": "on_before_decide"}
    assert errors[0].ok is False and errors[0].step_id == 0 and errors[1].step_id == 1
    assert ("on_before_decide", 0, "") in later.seen  # the next hook still ran


def test_a_raising_run_start_and_run_end_hook_are_reported(policy_agent: Any) -> None:
    class Broken(EngineHook):
        def on_run_start(self, ctx: HookContext) -> None:
            raise RuntimeError("start")

        def on_run_end(self, ctx: HookContext) -> None:
            raise RuntimeError("end")

    result = driven.run(Engine(policy_agent(two_steps, tools=[count]), hooks=[Broken()]), "t")
    assert result.state.stop_reason == "final"
    messages = [e.error for e in result.events if e.event_type.value == "error"]
    assert "hook Broken.on_run_start raised RuntimeError: start" in messages
    assert "hook Broken.on_run_end raised RuntimeError: end" in messages


def test_a_raising_on_event_hook_is_reported_and_the_run_finishes(policy_agent: Any) -> None:
    class BrokenListener(EngineHook):
        def on_event(self, event: Any) -> None:
            if event.event_type.value == "decide":
                raise KeyError("listener")

    result = driven.run(Engine(policy_agent(two_steps, tools=[count]), hooks=[BrokenListener()]), "t")
    assert result.state.stop_reason == "final"
    errors = [e for e in result.events if e.event_type.value == "error"]
    assert errors and "BrokenListener.on_event" in (errors[0].error or "")


# --------------------------------------------------------------------------- critics


def test_a_continue_critic_changes_nothing(policy_agent: Any) -> None:
    class Fine:
        def evaluate(self, state: Any, decision: Any, observation: Any) -> CriticVerdict | None:
            return None if state.current_step else CriticVerdict("continue", "fine")

    result = driven.run(Engine(policy_agent(two_steps, tools=[count]), critics=[Fine()]), "t")
    assert result.state.stop_reason == "final" and result.step_count == 2
    critic_events = [e for e in result.events if e.event_type.value == "critic"]
    assert critic_events[0].payload == {"verdicts": [{"critic": "Fine", "action": "continue", "reason": "fine"}]}
    assert result.records[0].critics == [{"critic": "Fine", "action": "continue", "reason": "fine"}]


def test_a_stop_critic_stops_after_its_step(policy_agent: Any) -> None:
    class Halt:
        def evaluate(self, state: Any, decision: Any, observation: Any) -> CriticVerdict:
            return CriticVerdict("stop", "unsafe")

    result = driven.run(Engine(policy_agent(two_steps, tools=[count]), critics=[Halt()]), "t")
    assert result.state.stop_reason == "critic_stop" and result.step_count == 1


def test_a_retry_critic_restores_the_pre_step_state_and_reruns_the_step(policy_agent: Any) -> None:
    calls.clear()
    feedback: list[str | None] = []

    def policy(state: Any, observation: Any) -> Decision[Any]:
        feedback.append(getattr(observation, "feedback", None))
        return two_steps(state, observation)

    class RetryOnce:
        def __init__(self) -> None:
            self.asked = False

        def evaluate(self, state: Any, decision: Any, observation: Any) -> CriticVerdict:
            if not self.asked and state.current_step == 0:
                self.asked = True
                assert state.log == ["call 1"]  # reduce ran before the critic
                state.metrics["dirty"] = True
                return CriticVerdict("retry", "look again")
            return CriticVerdict()

    result = driven.run(Engine(policy_agent(policy, tools=[count]), critics=[RetryOnce()]), "t")
    assert calls == [1, 1]  # the step's tool ran again
    assert result.state.log == ["call 2"]  # the first attempt's reduce was undone
    assert "dirty" not in result.state.metrics
    assert feedback[0] is None and feedback[1] == "critic asked to retry: look again"
    assert result.step_count == 2 and len(result.records) == 2


def test_retries_are_bounded_and_the_step_then_stands(policy_agent: Any) -> None:
    calls.clear()

    class AlwaysRetry:
        def evaluate(self, state: Any, decision: Any, observation: Any) -> CriticVerdict:
            return CriticVerdict("retry", "again")

    engine = Engine(policy_agent(two_steps, tools=[count]), critics=[AlwaysRetry()], max_critic_retries=2)
    result = driven.run(engine, "t")
    assert len(calls) == 3  # first try + 2 retries on step 0
    assert result.state.log == ["call 3"]
    assert result.state.stop_reason == "final"


def test_a_listener_failing_on_run_end_keeps_run_end_last_and_the_error_in_the_trace(
    policy_agent: Any, tmp_path: Any
) -> None:
    class FailsOnEnd(EngineHook):
        def on_event(self, event: Any) -> None:
            if event.event_type.value == "run_end":
                raise RuntimeError("renderer crashed")

    result = driven.run(
        Engine(policy_agent(two_steps, tools=[count]), hooks=[FailsOnEnd()], trace_logdir=str(tmp_path)), "t"
    )
    types = [e.event_type.value for e in result.events]
    assert types[-1] == "run_end" and types.count("run_end") == 1
    errors = [e for e in result.events if e.event_type.value == "error"]
    assert errors and "FailsOnEnd.on_event raised RuntimeError: renderer crashed" in (errors[0].error or "")
    written = [e["event_type"] for e in open_run(result.run_dir).events()]
    assert written == types
