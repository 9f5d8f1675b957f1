"""Cancellation: after the step (``cancelled``) or immediately (``cancelled_immediate``), everywhere it shows."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

import driven
from qitos import Action, Decision, Engine, tool
from qitos.engine._hooks import EngineHook, HookContext
from qitos.trace._reader import open_run

pytestmark = pytest.mark.usefixtures("driver")  # each test runs through both drivers

ran: list[str] = []


@tool
def work(n: int) -> str:
    """Record that work ran."""
    ran.append(f"work {n}")
    return f"did {n}"


def keep_working(state: Any, observation: Any) -> Decision[Any]:
    return Decision.act([Action("work", {"n": state.current_step})])


class CancelAt(EngineHook):
    """Calls engine.cancel(...) from one hook point at one step."""

    def __init__(self, method: str, step: int, *, immediate: bool) -> None:
        self.method, self.step, self.immediate = method, step, immediate
        self.engine: Engine[Any, Any, Any] | None = None

    def _maybe(self, name: str, ctx: HookContext) -> None:
        if name == self.method and ctx.step_id == self.step and self.engine is not None:
            self.engine.cancel(immediate=self.immediate)

    def on_after_decide(self, ctx: HookContext) -> None:
        self._maybe("on_after_decide", ctx)

    def on_after_act(self, ctx: HookContext) -> None:
        self._maybe("on_after_act", ctx)

    def on_step_end(self, ctx: HookContext) -> None:
        self._maybe("on_step_end", ctx)


def _engine(policy_agent: Any, hook: CancelAt, **kwargs: Any) -> Engine[Any, Any, Any]:
    engine = Engine(policy_agent(keep_working, tools=[work]), hooks=[hook], **kwargs)
    hook.engine = engine
    return engine


def test_cancel_after_the_step_commits_the_current_step(policy_agent: Any) -> None:
    ran.clear()
    result = driven.run(_engine(policy_agent, CancelAt("on_after_decide", 1, immediate=False)), "t")
    assert result.state.stop_reason == "cancelled"
    assert ran == ["work 0", "work 1"]  # step 1 finished
    assert result.step_count == 2 and len(result.records) == 2
    assert result.state.log == ["did 0", "did 1"]
    assert result.task_result.status == "stopped"


def test_cancel_immediate_after_decide_runs_no_tool_and_commits_nothing(policy_agent: Any) -> None:
    ran.clear()
    result = driven.run(_engine(policy_agent, CancelAt("on_after_decide", 1, immediate=True)), "t")
    assert result.state.stop_reason == "cancelled_immediate"
    assert ran == ["work 0"]
    assert result.step_count == 1 and len(result.records) == 1
    assert result.state.log == ["did 0"]


def test_cancel_immediate_after_act_skips_reduce(policy_agent: Any) -> None:
    ran.clear()
    result = driven.run(_engine(policy_agent, CancelAt("on_after_act", 0, immediate=True)), "t")
    assert result.state.stop_reason == "cancelled_immediate"
    assert ran == ["work 0"]
    assert result.state.log == [] and result.step_count == 0


def test_cancelled_immediate_is_written_to_state_result_end_event_and_manifest(
    policy_agent: Any, tmp_path: Path
) -> None:
    engine = _engine(policy_agent, CancelAt("on_after_decide", 0, immediate=True), trace_logdir=str(tmp_path))
    result = driven.run(engine, "t")
    assert result.state.stop_reason == "cancelled_immediate"
    assert result.task_result.stop_reason == "cancelled_immediate"
    assert result.task_result.status == "stopped"
    end = result.events[-1]
    assert end.event_type.value == "run_end" and end.payload["stop_reason"] == "cancelled_immediate"
    assert end.payload["status"] == "stopped"
    manifest = json.loads((Path(result.run_dir) / "manifest.json").read_text())
    assert manifest["status"] == "stopped"
    assert manifest["summary"]["stop_reason"] == "cancelled_immediate"
    trace = open_run(result.run_dir)
    assert trace.events()[-1]["payload"]["stop_reason"] == "cancelled_immediate"


def test_cancel_from_another_thread_stops_a_long_run(policy_agent: Any) -> None:
    third_step = threading.Event()
    proceed = threading.Event()

    @tool
    def gate(step: int) -> str:
        """Signal at step 3, then wait for the test."""
        if step == 3:
            third_step.set()
            proceed.wait(5)
        return "ok"

    engine = Engine(
        policy_agent(
            lambda s, o: Decision.act([Action("gate", {"step": s.current_step})]), tools=[gate], max_steps=10_000
        )
    )
    results: list[Any] = []
    worker = threading.Thread(target=lambda: results.append(driven.run(engine, "t")))
    worker.start()
    assert third_step.wait(5)
    engine.cancel()
    proceed.set()
    worker.join(5)
    assert not worker.is_alive()
    result = results[0]
    assert result.state.stop_reason == "cancelled"
    assert result.step_count == 4  # the step in flight finished and committed


def test_an_engine_can_run_again_after_a_cancelled_run(policy_agent: Any) -> None:
    hook = CancelAt("on_step_end", 0, immediate=False)
    engine = _engine(policy_agent, hook)
    assert driven.run(engine, "t").state.stop_reason == "cancelled"
    hook.engine = None
    second = driven.run(engine, "t")
    assert second.state.stop_reason == "max_steps_reached" and second.step_count == 10
