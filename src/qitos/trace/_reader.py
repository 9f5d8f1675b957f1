"""Reading run artifacts back: the API the CLI, the viewer and ``ReplayModel`` use."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["RunTrace", "TraceError", "list_runs", "open_run"]


class TraceError(Exception):
    """A run directory is missing or unreadable."""


@dataclass(frozen=True)
class RunTrace:
    """One run's artifacts on disk."""

    run_dir: str

    @property
    def run_id(self) -> str:
        """The run id recorded in the manifest."""
        return str(self.manifest().get("run_id", os.path.basename(self.run_dir)))

    def manifest(self) -> dict[str, Any]:
        """The parsed ``manifest.json``."""
        path = os.path.join(self.run_dir, "manifest.json")
        try:
            with open(path, encoding="utf-8") as fh:
                data: dict[str, Any] = json.load(fh)
        except FileNotFoundError as exc:
            raise TraceError(f"{self.run_dir}: no manifest.json (not a run directory)") from exc
        except json.JSONDecodeError as exc:
            raise TraceError(f"{path}: invalid JSON ({exc})") from exc
        return data

    def events(self) -> list[dict[str, Any]]:
        """Every event, in order."""
        return list(self._lines("events.jsonl"))

    def steps(self) -> list[dict[str, Any]]:
        """Every step record, in order."""
        return list(self._lines("steps.jsonl"))

    def step(self, step_id: int) -> dict[str, Any] | None:
        """One step record by id, or None."""
        return next((s for s in self._lines("steps.jsonl") if s.get("step_id") == step_id), None)

    def messages(self) -> list[dict[str, Any]]:
        """Every stored request message (``messages.jsonl``), in order: ``{"key", "message"}``."""
        return list(self._lines("messages.jsonl"))

    def request_messages(self, runs: Any, *, stored: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """The messages a request sent, from the runs of positions its record holds (see
        :mod:`qitos.trace._writer`); ``stored`` is :meth:`messages` when already read. A position
        past the end (a line a live run has not written yet) raises TraceError."""
        lines = self.messages() if stored is None else stored
        out: list[dict[str, Any]] = []
        for run in runs or ():
            first, last = int(run[0]), int(run[1])
            if last >= len(lines) or first < 0 or first > last:
                raise TraceError(f"{self.run_dir}: messages [{first}, {last}] are not in messages.jsonl")
            for line in lines[first : last + 1]:
                message = dict(line.get("message") or {})
                if line.get("secret"):
                    message["secret"] = True
                out.append(message)
        return out

    def _lines(self, name: str) -> Iterator[dict[str, Any]]:
        path = os.path.join(self.run_dir, name)
        if not os.path.exists(path):
            return
        with open(path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    # A line being written by a live run may be incomplete; a broken middle line is an error.
                    if fh.read(1):
                        raise TraceError(f"{path}:{number}: invalid JSON line") from None
                    return


def open_run(run_dir: str) -> RunTrace:
    """Open a run directory (checks it has a manifest)."""
    trace = RunTrace(run_dir)
    trace.manifest()
    return trace


def list_runs(logdir: str = "./runs") -> list[RunTrace]:
    """Every run under ``logdir``, newest first (by manifest start time)."""
    if not os.path.isdir(logdir):
        return []
    runs = []
    for name in os.listdir(logdir):
        path = os.path.join(logdir, name)
        if os.path.isfile(os.path.join(path, "manifest.json")):
            runs.append(RunTrace(path))

    def started(run: RunTrace) -> str:
        try:
            return str(run.manifest().get("started_at") or "")
        except TraceError:
            return ""

    return sorted(runs, key=started, reverse=True)
