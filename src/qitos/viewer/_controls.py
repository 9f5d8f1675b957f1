"""What the viewer's control buttons do: approve, reject, steer, pause and resume a session.

Approve, reject, steer and pause append a control item to the store (``qitos.sessions._control``),
exactly as ``qitos sessions approve|reject|steer|pause`` do; the session takes it in at its next
boundary. A delegated child's call is answered through its parent's page (the answer goes to the
child that waits).

Resume runs the session, which needs its agent, and the viewer never imports user code: it starts
``qitos sessions resume`` in a subprocess with the command the session's record gives
(:func:`qitos.viewer._data.resume_argv`: the recorded agent reference, the store, the recorded model
options) plus ``--trace-dir`` so its trace shows on the board. The subprocess inherits the viewer's
environment (API keys) and working directory, and its output goes to a log file under the trace
directory (``.viewer/``, which the board does not list). When the record cannot rebuild the agent,
or a fleet's workers run the session, nothing is started and the answer says what to do instead.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from qitos.checkpoint.store import CheckpointStore
from qitos.core._errors import UsageError
from qitos.distributed._naming import fleet_queue
from qitos.sessions._control import answer_approval, delegation_root, pause_session, steer_session
from qitos.sessions._inspection import SessionLifecycle, observed_lifecycle
from qitos.viewer._data import NotFoundError, how_it_continues, resume_argv, to_jsonable

__all__ = ["ACTIONS", "ConflictError", "Controls"]

ACTIONS = ("approve", "reject", "steer", "pause", "resume")
_MAX_TEXT = 20_000
_ENDED = {SessionLifecycle.COMPLETED.value, SessionLifecycle.STOPPED.value, SessionLifecycle.FAILED.value}


class ConflictError(UsageError):
    """The action does not apply to the session as it stands (HTTP 409); ``command`` says what to run."""

    def __init__(self, message: str, *, command: str | None = None) -> None:
        super().__init__(message)
        self.command = command


class Controls:
    """The control actions over one store (named ``db``), resumed runs tracing into ``logdir``."""

    def __init__(self, *, db: str, logdir: str) -> None:
        self.db = db
        self.logdir = logdir
        self._children: list[subprocess.Popen[bytes]] = []
        self._lock = threading.Lock()

    def act(self, store: CheckpointStore, session_id: str, action: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Do ``action`` on ``session_id`` with the request's JSON ``body``; the answer as JSON."""
        head = store.get_session_head(session_id)
        if head is None:
            raise NotFoundError(f"session {session_id!r} not found")
        if action == "approve" or action == "reject":
            call_id = _required_text(body, "call_id")
            reason = _optional_text(body, "reason") if action == "reject" else None
            receipt = answer_approval(store, session_id, call_id, approved=action == "approve", reason=reason)
            return {"receipt": to_jsonable(receipt), "next": how_it_continues(store, session_id, self.db)}
        if action == "steer":
            text = _required_text(body, "text")
            steering = steer_session(store, session_id, text)
            return {"receipt": to_jsonable(steering), "next": how_it_continues(store, session_id, self.db)}
        if action == "pause":
            return {"receipt": to_jsonable(pause_session(store, session_id))}
        if action == "resume":
            return self._resume(store, session_id)
        raise NotFoundError(f"no session action {action!r} (actions: {', '.join(ACTIONS)})")

    def _resume(self, store: CheckpointStore, session_id: str) -> dict[str, Any]:
        root_id = delegation_root(store, session_id)
        root = store.get_session_head(root_id)
        if root is None:
            raise NotFoundError(f"session {root_id!r} not found")
        lifecycle = observed_lifecycle(store, root)
        if lifecycle in _ENDED:
            raise ConflictError(f"session {root_id} has ended ({lifecycle}); fork it to go on from a snapshot")
        if lifecycle == SessionLifecycle.RUNNING:
            raise ConflictError(f"session {root_id} is running already")
        queue = fleet_queue(root.metadata)
        if queue is not None:
            raise ConflictError(f"a fleet worker on queue {queue!r} continues session {root_id}; nothing to start here")
        argv = resume_argv(store, session_id, self.db)
        if argv is None:
            raise ConflictError(
                f"session {root_id}'s agent cannot be rebuilt from its record, so the viewer cannot resume it",
                command=how_it_continues(store, session_id, self.db),
            )
        argv += ["--trace-dir", self.logdir]
        log_dir = os.path.join(self.logdir, ".viewer")
        os.makedirs(log_dir, exist_ok=True)
        log_path = os.path.join(log_dir, f"resume-{root_id}-{time.time_ns()}.log")
        with open(log_path, "wb") as log:
            # `python -m qitos.cli.app` is `qitos` in this interpreter (a PATH could name another one).
            child = subprocess.Popen(
                [sys.executable, "-m", "qitos.cli.app", *argv[1:]],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a run the viewer started outlives the viewer
            )
        with self._lock:
            self._children = [c for c in self._children if c.poll() is None] + [child]
        return {"started": True, "session_id": root_id, "pid": child.pid, "command": shlex.join(argv), "log": log_path}

    def close(self) -> None:
        """Reap the resumed runs that have finished (running ones go on by themselves)."""
        with self._lock:
            self._children = [c for c in self._children if c.poll() is None]


def _required_text(body: Mapping[str, object], key: str) -> str:
    value = _optional_text(body, key)
    if value is None or not value.strip():
        raise UsageError(f"{key} must be a non-empty string")
    return value


def _optional_text(body: Mapping[str, object], key: str) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise UsageError(f"{key} must be a string, got {type(value).__name__}")
    if len(value) > _MAX_TEXT:
        raise UsageError(f"{key} is longer than {_MAX_TEXT:,} characters")
    return value
