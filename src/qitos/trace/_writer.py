"""Run artifacts: ``runs/<run_id>/manifest.json``, ``events.jsonl``, ``steps.jsonl`` and, once the
model is called, ``messages.jsonl``.

The manifest's ``status`` goes ``running`` -> ``completed`` | ``stopped`` | ``failed``. Every line
passes through a :class:`Redactor` first, so API keys and bearer tokens never reach the disk.

``messages.jsonl`` holds every message any model request of the run sent, each stored once:
``{"key": ..., "message": {...}}`` where the key is the exchange item's id (``ex-000003/1``) or,
for instructions and context, ``sha256:<digest of the message>``. A secret context contribution
is stored as a placeholder naming its id and digest (``"secret": true``), never its content.
:meth:`TraceWriter.request_messages` returns where a request's messages are, as runs
``[[first, last], ...]`` of line positions (0-based, inclusive): a whole transcript is usually one
or two runs, so a step record never copies the messages it sent.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any

from qitos.core._codec import canonical_json, escape_surrogates, sha256_hex
from qitos.trace._redact import Redactor

if TYPE_CHECKING:
    from qitos.core.request_view import RequestView

__all__ = ["MESSAGES_FILE", "TraceWriter", "displayed_messages", "message_runs"]

MESSAGES_FILE = "messages.jsonl"


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
        self._messages: IO[str] | None = None
        self._message_positions: dict[str, int] = {}

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

    def request_messages(self, view: RequestView) -> list[list[int]]:
        """Store the messages ``view`` sends that are not stored yet; return where all of them are
        in ``messages.jsonl`` (runs of line positions, see the module docstring). Empty before
        :meth:`start`."""
        if self.run_dir is None:
            return []
        positions: list[int] = []
        for key, line in _request_lines(view):
            position = self._message_positions.get(key)
            if position is None:
                if self._messages is None:
                    path = os.path.join(self.run_dir, MESSAGES_FILE)
                    self._messages = open(path, "a", encoding="utf-8")  # noqa: SIM115
                position = self._message_positions[key] = len(self._message_positions)
                self._messages.write(self.redact(escape_surrogates(line)) + "\n")
            positions.append(position)
        if self._messages is not None:
            self._messages.flush()
        return message_runs(positions)

    def update(self, **fields: Any) -> None:
        """Merge fields into the manifest and rewrite it."""
        self._manifest.update(fields)
        self._write_manifest()

    def finish(self, status: str, summary: Mapping[str, Any]) -> None:
        """Close the streams and write the final manifest."""
        for stream in (self._events, self._steps, self._messages):
            if stream is not None:
                stream.close()
        self._events = self._steps = self._messages = None
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


def message_runs(positions: Iterable[int]) -> list[list[int]]:
    """Positions folded into inclusive runs: ``[0, 1, 2, 7, 8]`` -> ``[[0, 2], [7, 8]]``."""
    runs: list[list[int]] = []
    for position in positions:
        if runs and position == runs[-1][1] + 1:
            runs[-1][1] = position
        else:
            runs.append([position, position])
    return runs


def displayed_messages(view: RequestView) -> list[dict[str, Any]]:
    """The messages ``view`` sends as the trace stores them: a secret context contribution becomes
    a placeholder naming its id and digest (with ``"secret": true``)."""
    out = []
    for _, line in _request_lines(view):
        record = json.loads(line)
        message: dict[str, Any] = record["message"]
        if record.get("secret"):
            message["secret"] = True
        out.append(message)
    return out


def _line(key: str, message_json: str, *, secret: bool = False) -> str:
    extra = ',"secret":true' if secret else ""
    return '{"key":' + json.dumps(key, ensure_ascii=False) + ',"message":' + message_json + extra + "}"


def _request_lines(view: RequestView) -> Iterator[tuple[str, str]]:
    """``(key, line)`` for every message ``view`` sends, in request order."""
    for text in view.instructions_json:
        yield "sha256:" + sha256_hex(text), _line("sha256:" + sha256_hex(text), text)
    for text in view.context_json:
        record = json.loads(text)
        message = record["message"]
        if record.get("sensitivity") == "secret":
            placeholder = {
                "role": message.get("role"),
                "content": f"[secret context {record.get('contribution_id')}: sha256 {record.get('digest')}]",
            }
            body = canonical_json(placeholder)
            yield "sha256:" + sha256_hex(body), _line("sha256:" + sha256_hex(body), body, secret=True)
            continue
        body = canonical_json(message)
        yield "sha256:" + sha256_hex(body), _line("sha256:" + sha256_hex(body), body)
    ids = view.selection.selected_item_ids
    texts = view.selected_items_json
    for i, text in enumerate(texts):
        key = ids[i] if len(ids) == len(texts) else "sha256:" + sha256_hex(text)
        yield key, _line(key, text)
