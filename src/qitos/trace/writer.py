"""Run artifacts: ``runs/<run_id>/manifest.json``, ``events.jsonl`` and ``steps.jsonl``.

The manifest's ``status`` goes ``running`` -> ``completed`` | ``stopped`` | ``failed``. Every line
passes through a :class:`Redactor` first, so API keys and bearer tokens never reach the disk.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import IO, Any

from qitos.core.codec import escape_surrogates
from qitos.trace.redact import Redactor

__all__ = ["TraceWriter"]


def _dumps(value: Any) -> str:
    return escape_surrogates(json.dumps(value, ensure_ascii=False, default=repr, separators=(",", ":")))


class TraceWriter:
    """Writes one run's artifacts under ``logdir/<run_id>/``."""

    def __init__(
        self,
        logdir: str = "./runs",
        *,
        prefix: str | None = None,
        secrets: Iterable[str] = (),
    ) -> None:
        self.logdir = logdir
        self.prefix = prefix
        self.redact = Redactor(secrets)
        self.run_dir: str | None = None
        self._manifest: dict[str, Any] = {}
        self._events: IO[str] | None = None
        self._steps: IO[str] | None = None

    def start(self, run_id: str, manifest: Mapping[str, Any]) -> str:
        """Create the run directory and a ``running`` manifest; returns the directory."""
        name = f"{self.prefix}_{run_id}" if self.prefix else run_id
        self.run_dir = os.path.join(self.logdir, name)
        os.makedirs(self.run_dir, exist_ok=True)
        self._manifest = {
            "run_id": run_id,
            "status": "running",
            "started_at": datetime.now(UTC).isoformat(),
            "ended_at": None,
            **manifest,
        }
        self._write_manifest()
        self._events = open(os.path.join(self.run_dir, "events.jsonl"), "a", encoding="utf-8")  # noqa: SIM115
        self._steps = open(os.path.join(self.run_dir, "steps.jsonl"), "a", encoding="utf-8")  # noqa: SIM115
        return self.run_dir

    def event(self, event: Mapping[str, Any]) -> None:
        """Append one event line."""
        if self._events is not None:
            self._events.write(self.redact(_dumps(event)) + "\n")

    def step(self, record: Mapping[str, Any]) -> None:
        """Append one step line and flush both streams (a live viewer reads them)."""
        if self._steps is not None and self._events is not None:
            self._steps.write(self.redact(_dumps(record)) + "\n")
            self._steps.flush()
            self._events.flush()

    def update(self, **fields: Any) -> None:
        """Merge fields into the manifest and rewrite it."""
        self._manifest.update(fields)
        self._write_manifest()

    def finish(self, status: str, summary: Mapping[str, Any]) -> None:
        """Close the streams and write the final manifest."""
        for stream in (self._events, self._steps):
            if stream is not None:
                stream.close()
        self._events = self._steps = None
        self._manifest.update(status=status, ended_at=datetime.now(UTC).isoformat(), summary=dict(summary))
        self._write_manifest()

    def _write_manifest(self) -> None:
        assert self.run_dir is not None
        path = os.path.join(self.run_dir, "manifest.json")
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(
                self.redact(escape_surrogates(json.dumps(self._manifest, ensure_ascii=False, default=repr, indent=2)))
            )
        os.replace(tmp, path)
