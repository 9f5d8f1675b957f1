"""Test agents, states, tools and a subprocess entry point for the durable-session tests.

Importable as ``session_agents`` (the tests put ``tests`` on ``PYTHONPATH``), so a session
created in one process can be restored in another: the snapshot names its state type as
``session_agents:NotesState``.

``NotesAgent`` does ``target`` tool steps and then answers. Step ``i`` calls, with fixed call ids:

- ``append_note`` (``s{i}-append``): **not idempotent**; appends ``note_bytes`` to the state;
- ``index_note`` (``s{i}-index``): idempotent (safe to re-run after a crash);
- ``publish`` (``s{i}-publish``, only at ``approval_at``): needs a human's approval.

Every tool writes ``begin <tool> <call>`` before its work and ``end <tool> <call>`` after it to a
side-effect log file, so a repeated call is visible after the fact. ``hang_at=i`` makes
``append_note`` of step ``i`` hang (after its ``begin`` line) the first time it runs, after
creating ``hang_marker``: the test waits for the marker, then kills the process.

The reducer appends the step index to ``steps_done`` and one record per tool result to
``observed``; ``decide`` records any steering text it is shown in ``steering_seen``.

Run ``python -m session_agents <command> --db ... --log ...`` (see :func:`main`); every command
prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import string
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qitos.checkpoint._targets import open_store
from qitos.checkpoint.store import CheckpointStore
from qitos.core._agent_module import AgentModule
from qitos.core._decision import Action, Decision, Observation
from qitos.core._errors import QitosError
from qitos.core._state import StateSchema
from qitos.core._tool import ToolRegistry, tool
from qitos.engine._composition import Composition, compose
from qitos.engine.runtime import LifecyclePolicy, RuntimeSnapshotContext
from qitos.models._scripted import ScriptedModel

__all__ = [
    "NotesAgent",
    "NotesModelAgent",
    "NotesState",
    "OneStepPerRun",
    "PauseAtStep",
    "PauseFirstTool",
    "barrier",
    "finish_cli",
    "main",
    "make_composition",
    "model_script",
    "read_side_log",
    "run_cli",
    "start_cli",
    "start_module",
    "subprocess_env",
    "summary",
]

HERE = Path(__file__).resolve().parent
_LETTERS = string.ascii_letters + " "


@dataclass
class NotesState(StateSchema):
    """The notes agent's state."""

    target: int = 20
    steps_done: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    observed: list[dict[str, Any]] = field(default_factory=list)
    steering_seen: list[str] = field(default_factory=list)


def _log(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def read_side_log(path: str | Path) -> list[tuple[str, str, str]]:
    """The side-effect log as ``(event, tool, call)`` triples, in order."""
    file = Path(path)
    if not file.exists():
        return []
    out = []
    for line in file.read_text(encoding="utf-8").splitlines():
        event, tool_name, call = line.split(" ")
        out.append((event, tool_name, call))
    return out


class NoteTools:
    """The tools; each writes its begin/end lines to the side-effect log."""

    def __init__(
        self,
        side_log: str,
        *,
        sleep: float = 0.0,
        hang_at: int | None = None,
        hang_marker: str | None = None,
        hang_tool: str = "append_note",
    ) -> None:
        self.side_log = side_log
        self.sleep = sleep
        self.hang_at = hang_at
        self.hang_marker = hang_marker
        self.hang_tool = hang_tool

    def _maybe_hang(self, tool_name: str, step: int) -> None:
        marker = self.hang_marker
        if tool_name == self.hang_tool and step == self.hang_at and marker and not os.path.exists(marker):
            Path(marker).write_text(str(os.getpid()), encoding="utf-8")
            time.sleep(600)  # the test kills the process here

    @tool
    def append_note(self, call: str, step: int, text: str) -> str:
        """Append a note (not idempotent: a second run would add it twice).

        Args:
            call: the call id (for the side-effect log).
            step: the step that made the call.
            text: the note.
        """
        _log(self.side_log, f"begin append_note {call}")
        self._maybe_hang("append_note", step)
        if self.sleep:
            time.sleep(self.sleep)
        _log(self.side_log, f"end append_note {call}")
        return f"noted {len(text)} chars at step {step}"

    @tool(idempotent=True)
    def index_note(self, call: str, step: int) -> str:
        """Re-index the notes (idempotent: safe to repeat).

        Args:
            call: the call id (for the side-effect log).
            step: the step that made the call.
        """
        _log(self.side_log, f"begin index_note {call}")
        self._maybe_hang("index_note", step)
        if self.sleep:
            time.sleep(self.sleep)
        _log(self.side_log, f"end index_note {call}")
        return f"indexed through step {step}"

    @tool(needs_approval=True)
    def publish(self, call: str, step: int) -> str:
        """Publish the notes (needs a human's approval; not idempotent).

        Args:
            call: the call id (for the side-effect log).
            step: the step that made the call.
        """
        _log(self.side_log, f"begin publish {call}")
        _log(self.side_log, f"end publish {call}")
        return f"published at step {step}"


class NotesAgent(AgentModule[NotesState, Observation, Action]):
    """``target`` tool steps (append + index, publish at ``approval_at``), then a final answer.

    Only every ``tools_every``-th step calls tools (0: none); the others are tool-free ``wait``
    steps that still append their note.
    """

    def __init__(
        self,
        side_log: str,
        *,
        sleep: float = 0.0,
        decide_sleep: float = 0.0,
        note_bytes: int = 16,
        hang_at: int | None = None,
        hang_marker: str | None = None,
        hang_tool: str = "append_note",
        approval_at: int | None = None,
        tools_every: int = 1,
        progress_log: str | None = None,
        llm: Any = None,
    ) -> None:
        registry = ToolRegistry()
        registry.include(
            NoteTools(side_log, sleep=sleep, hang_at=hang_at, hang_marker=hang_marker, hang_tool=hang_tool)
        )
        super().__init__(tool_registry=registry, llm=llm)
        self.note_bytes = note_bytes
        self.approval_at = approval_at
        self.tools_every = tools_every
        self.decide_sleep = decide_sleep
        self.progress_log = progress_log

    def init_state(self, task: str, **kwargs: Any) -> NotesState:
        target = int(kwargs.get("target", 20))
        return NotesState(task=task, target=target, max_steps=target + 5)

    def decide(self, state: NotesState, observation: Observation) -> Decision[Action] | None:
        if observation is not None and observation.feedback:
            state.steering_seen.append(observation.feedback)
        step = state.current_step
        if self.progress_log:
            _log(self.progress_log, f"decide {step} -")
        if self.decide_sleep:
            time.sleep(self.decide_sleep)
        if len(state.steps_done) >= state.target:
            return Decision.final(f"{len(state.notes)} notes")
        if not self.tools_every or step % self.tools_every:
            return Decision.wait("no tool needed")
        return Decision.act(_actions(step, self.note_bytes, self.approval_at))

    def reduce(self, state: NotesState, observation: Observation, decision: Decision[Action]) -> NotesState:
        if decision.mode == "final":
            return state
        for result in observation.results:
            state.observed.append(
                {"call": result.call_id, "tool": result.name, "ok": result.ok, "error_kind": result.error_kind}
            )
        state.steps_done.append(state.current_step)
        state.notes.append(_note(state.current_step, self.note_bytes))
        return state


class NotesModelAgent(NotesAgent):
    """The same agent on the model path: ``decide`` returns None and a model picks the calls."""

    def decide(self, state: NotesState, observation: Observation) -> Decision[Action] | None:
        return None

    def reduce(self, state: NotesState, observation: Observation, decision: Decision[Action]) -> NotesState:
        if decision.mode != "act":
            return state
        return super().reduce(state, observation, decision)


def _note(step: int, size: int) -> str:
    """A note of ``size`` characters: its step number, then random letters seeded by the step.

    Every note is new information (unique and not trivially compressible), so storage tests measure
    what is stored, not how well zlib handles repeats.
    """
    head = f"note {step}:"
    tail = random.Random(step).choices(_LETTERS, k=max(0, size - len(head)))
    return head + "".join(tail)


def _actions(step: int, note_bytes: int, approval_at: int | None) -> list[Action]:
    actions = [
        Action(
            "append_note", {"call": f"s{step}-append", "step": step, "text": _note(step, note_bytes)}, f"s{step}-append"
        ),
        Action("index_note", {"call": f"s{step}-index", "step": step}, f"s{step}-index"),
    ]
    if step == approval_at:
        actions.append(Action("publish", {"call": f"s{step}-publish", "step": step}, f"s{step}-publish"))
    return actions


def model_script(target: int, note_bytes: int = 16) -> list[Any]:
    """ScriptedModel responses making the model-path agent do what ``NotesAgent`` does."""
    responses: list[Any] = []
    for step in range(target):
        calls = [{"id": a.id, "name": a.name, "arguments": dict(a.args)} for a in _actions(step, note_bytes, None)]
        responses.append({"tool_calls": calls})
    responses.append("done")
    return responses


def barrier(directory: str | Path, point: str, name: str, parties: int = 2, timeout: float = 60.0) -> None:
    """Wait until ``parties`` processes (distinct ``name``) have reached ``point`` (a file barrier)."""
    root = Path(directory)
    (root / f"{point}-{name}").touch()
    deadline = time.monotonic() + timeout
    while len(list(root.glob(f"{point}-*"))) < parties:
        if time.monotonic() > deadline:
            raise TimeoutError(f"barrier {point} timed out in {name}")
        time.sleep(0.002)


class PauseAtStep(LifecyclePolicy):
    """Pause at the boundary before step ``step``."""

    policy_id = "tests.pause_at_step/v1"

    def __init__(self, step: int) -> None:
        self.step = step

    def should_pause(self, context: RuntimeSnapshotContext) -> bool:
        return context.phase == "boundary" and context.step_id == self.step


class PauseFirstTool(LifecyclePolicy):
    """The seed's example: pause before the first tool call of a run."""

    policy_id = "tests.pause_first_tool/v1"

    def __init__(self) -> None:
        self.seen: set[str | None] = set()

    def should_pause(self, context: RuntimeSnapshotContext) -> bool:
        if context.phase != "act" or context.run_id in self.seen:
            return False
        self.seen.add(context.run_id)
        return True


class OneStepPerRun(LifecyclePolicy):
    """Pause at every boundary after the first step of a run (so each ``run()`` does one step)."""

    policy_id = "tests.one_step_per_run/v1"

    def __init__(self) -> None:
        self.first: dict[str | None, int] = {}

    def should_pause(self, context: RuntimeSnapshotContext) -> bool:
        if context.phase != "boundary":
            return False
        first = self.first.setdefault(context.run_id, context.step_id)
        return context.step_id > first


def make_composition(
    db: str,
    side_log: str,
    *,
    agent: str = "notes",
    lifecycle: LifecyclePolicy | None = None,
    durability: str = "sync",
    batch_steps: int = 16,
    batch_ms: float = 50.0,
    model: Any = None,
    hooks: Sequence[Any] = (),
    store: CheckpointStore | None = None,
    lease_ttl: float = 30.0,
    **agent_kwargs: Any,
) -> Composition:
    """A composition of one of the test agents over a SQLite store at ``db`` (or ``store``)."""
    factory: Any
    if agent == "notes":
        factory = lambda: NotesAgent(side_log, **agent_kwargs)  # noqa: E731
    elif agent == "model":
        factory = lambda: NotesModelAgent(side_log, **agent_kwargs)  # noqa: E731
    else:
        raise ValueError(f"unknown test agent {agent!r}")
    extensions = {"policy": lifecycle} if lifecycle is not None else None
    return compose(
        agent=factory,
        store=store if store is not None else open_store(db),  # a SQLite file or a postgresql:// URL
        extensions=extensions,
        lifecycle={"provider": "policy"} if lifecycle is not None else None,
        model=model,
        durability=durability,
        batch_steps=batch_steps,
        batch_ms=batch_ms,
        lease_ttl=lease_ttl,
        hooks=list(hooks),
    )


def summary(result: Any) -> dict[str, Any]:
    """The JSON-native gist of an EngineResult."""
    state = result.state
    return {
        "stop_reason": state.stop_reason,
        "final_result": state.final_result,
        "current_step": state.current_step,
        "state": state.to_dict(),
    }


# --------------------------------------------------------------------------- subprocesses


def subprocess_env() -> dict[str, str]:
    """This environment with ``tests/`` first on PYTHONPATH, for a test's subprocesses."""
    env = dict(os.environ)
    paths = [str(HERE), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def start_cli(*args: str) -> subprocess.Popen[str]:
    """Start ``python -m session_agents ARGS`` in a new process (stdout/stderr piped)."""
    return start_module("session_agents", *args)


def start_module(module: str, *args: str) -> subprocess.Popen[str]:
    """Start ``python -m MODULE ARGS`` (a module of ``tests/``) in a new process (stdout/stderr piped)."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish_cli(proc: subprocess.Popen[str], timeout: float = 120.0) -> dict[str, Any]:
    """Wait for a process started by :func:`start_cli`; its JSON output (AssertionError if it failed)."""
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"{proc.args!r} exited with {proc.returncode}\nstdout: {out}\nstderr: {err}")
    if "database is locked" in err.lower() or "database is locked" in out.lower():
        raise AssertionError(f"'database is locked' reached the user:\n{err}")
    lines = [line for line in out.splitlines() if line.strip()]
    if not lines:
        raise AssertionError(f"{proc.args!r} printed nothing\nstderr: {err}")
    result: dict[str, Any] = json.loads(lines[-1])
    result["_stderr"] = err
    return result


def run_cli(*args: str, timeout: float = 120.0) -> dict[str, Any]:
    """Run ``python -m session_agents ARGS`` to the end in a new process; its JSON output."""
    return finish_cli(start_cli(*args), timeout)


# --------------------------------------------------------------------------- subprocess entry point


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="session_agents")
    parser.add_argument("command", choices=["run", "approve", "reject", "inspect"])
    parser.add_argument("--db", required=True)
    parser.add_argument("--log", default=os.devnull, help="side-effect log file")
    parser.add_argument("--session", help="session id (run without it creates a new session)")
    parser.add_argument("--agent", default="notes", choices=["notes", "model"])
    parser.add_argument("--target", type=int, default=20)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds each tool sleeps")
    parser.add_argument("--decide-sleep", type=float, default=0.0)
    parser.add_argument("--note-bytes", type=int, default=16)
    parser.add_argument("--hang-at", type=int)
    parser.add_argument("--hang-marker")
    parser.add_argument("--hang-tool", default="append_note")
    parser.add_argument("--approval-at", type=int)
    parser.add_argument("--tools-every", type=int, default=1, help="tools on every k-th step (0: never)")
    parser.add_argument("--progress-log")
    parser.add_argument("--pause-at", type=int, help="LifecyclePolicy: pause before this step")
    parser.add_argument("--one-step", action="store_true", help="LifecyclePolicy: one step per run")
    parser.add_argument("--durability", default="sync")
    parser.add_argument("--batch-steps", type=int, default=16)
    parser.add_argument("--batch-ms", type=float, default=50.0)
    parser.add_argument("--model-skip", type=int, help="model path: ScriptedModel from this response on")
    parser.add_argument("--barrier", help="a barrier directory: every round ends when --parties processes end it")
    parser.add_argument("--name", default="p", help="this process's name at the barriers")
    parser.add_argument("--rounds", type=int, default=1, help="how many runs to attempt")
    parser.add_argument("--start-barrier", help="wait here until --parties processes are ready to run")
    parser.add_argument("--parties", type=int, default=2)
    parser.add_argument("--lease-ttl", type=float, default=30.0)
    parser.add_argument("--text", default="", help="reject: the reason")
    parser.add_argument("--call", help="approve/reject: the call id")
    return parser


def _composition(args: argparse.Namespace) -> Composition:
    lifecycle: LifecyclePolicy | None = None
    if args.pause_at is not None:
        lifecycle = PauseAtStep(args.pause_at)
    elif args.one_step:
        lifecycle = OneStepPerRun()
    model = None
    kwargs: dict[str, Any] = {
        "sleep": args.sleep,
        "decide_sleep": args.decide_sleep,
        "note_bytes": args.note_bytes,
        "hang_at": args.hang_at,
        "hang_marker": args.hang_marker,
        "hang_tool": args.hang_tool,
        "approval_at": args.approval_at,
        "tools_every": args.tools_every,
        "progress_log": args.progress_log,
    }
    if args.agent == "model":
        model = ScriptedModel(model_script(args.target, args.note_bytes)[args.model_skip or 0 :])
    return make_composition(
        args.db,
        args.log,
        agent=args.agent,
        lifecycle=lifecycle,
        durability=args.durability,
        batch_steps=args.batch_steps,
        batch_ms=args.batch_ms,
        model=model,
        lease_ttl=args.lease_ttl,
        **kwargs,
    )


def _error(exc: BaseException) -> dict[str, Any]:
    return {"error": type(exc).__name__, "module": type(exc).__module__, "message": str(exc), **vars(exc)}


def main(argv: Sequence[str] | None = None) -> int:
    """The subprocess entry point; prints one JSON object."""
    args = _parser().parse_args(argv)
    composition = _composition(args)
    out: dict[str, Any] = {}
    if args.command == "run" and not args.session:
        args.session = composition.session("Index notes", target=args.target).session_id.value
    if args.command == "run":
        outcomes = []
        for round_ in range(args.rounds):
            session = composition.restore(args.session)
            if args.start_barrier:
                barrier(args.start_barrier, f"start{round_}", args.name, args.parties)
            try:
                outcomes.append({"ok": True, **summary(session.run())})
            except QitosError as exc:
                outcomes.append({"ok": False, **_error(exc)})
            if args.barrier:  # let every racer finish this round before anyone starts the next
                barrier(args.barrier, f"end{round_}", args.name, args.parties)
        out = {"session_id": args.session, **outcomes[0]} if args.rounds == 1 else {"outcomes": outcomes}
    elif args.command == "approve":
        out = {"position": composition.restore(args.session).approve(args.call).position}
    elif args.command == "reject":
        out = {"position": composition.restore(args.session).reject(args.call, args.text or None).position}
    elif args.command == "inspect":
        inspection = composition.restore(args.session).inspect()
        batch = inspection.tool_batch
        out = {
            "lifecycle": inspection.lifecycle.value,
            "snapshot_integrity": inspection.snapshot_integrity,
            "pending_approval": [c.call_id for c in batch.pending_approval] if batch else [],
        }
    print(json.dumps(out, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
