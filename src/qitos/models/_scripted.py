"""Test doubles that are real adapters: ``ScriptedModel`` and ``ReplayModel``.

``FunctionModel`` lives in :mod:`qitos.models._function` and is importable from here too (its
earlier home). Each of the three implements :class:`~qitos.models._base.ModelAdapter` fully (capacity, streaming through
``on_delta``, events), need no network and are deterministic, so tests and offline demos run the
same engine path as a real provider.

A scripted response is one of:

- a ``str``: plain assistant text (the engine reads it as the final answer);
- a mapping with ``"tool_calls": [{"name": ..., "arguments": {...} | "<raw json>", "id"?: ...}]``
  and optionally ``"text"``, ``"finish_reason"`` and ``"usage": {"input_tokens", "output_tokens"}``
  (``arguments`` given as a string is kept raw, to script malformed JSON from a model);
- a :class:`~qitos.models._base.ModelResponse`, used as is.

Replay: ``ReplayModel.from_trace(run_dir)`` reads ``run_dir/steps.jsonl``. Every line is one step
record (a JSON object); a step that called the model carries::

    "model": {"request_id": "<RequestView.request_id>",
              "request_digest": "<qitos.models._base.request_digest(view)>",   # optional
              "response": <ModelResponse.to_dict()>}

and its step number under ``"step_id"`` (or ``"step"``; else its line position). A step may also
carry a list of such entries under ``"models"`` when it called the model more than once. Replay
returns the recorded responses in order. Before answering, it checks that the request it was given
is the one that was recorded: by ``request_digest`` when the trace has it, else by
``request_id`` (content-derived, so equal requests have equal ids). A mismatch raises
:class:`ReplayDivergenceError` naming the step; so does a request past the end of the recording.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qitos.core._errors import ConfigurationError, ModelError
from qitos.models._base import DeltaCallback, ModelResponse, Unit, request_digest
from qitos.models._doubles import RecordingAdapter, ScriptedResponse, coerce_response, stream_text
from qitos.models._function import FunctionModel

if TYPE_CHECKING:
    from qitos.core.request_view import RequestView

__all__ = [
    "FunctionModel",
    "ReplayDivergenceError",
    "ReplayEntry",
    "ReplayModel",
    "ScriptedModel",
    "ScriptedResponse",
    "coerce_response",
]


class ScriptedModel(RecordingAdapter):
    """Answers with a fixed list of responses, in order; records every view it received.

    Running out of responses raises :class:`~qitos.core._errors.ModelError` saying how many there
    were, rather than inventing an answer.
    """

    def __init__(
        self,
        responses: Iterable[ScriptedResponse],
        *,
        max_input_units: int | None = None,
        unit: Unit = "characters",
        model_id: str = "scripted",
    ) -> None:
        super().__init__(model_id=model_id, max_input_units=max_input_units, unit=unit)
        self._responses = [coerce_response(r, index=i, model=model_id) for i, r in enumerate(responses)]
        self._next = 0

    @property
    def remaining(self) -> int:
        """How many scripted responses are left."""
        return len(self._responses) - self._next

    def complete(self, view: RequestView, *, on_delta: DeltaCallback | None = None) -> ModelResponse:
        """Return the next scripted response (streaming its text when ``on_delta`` is given)."""
        with self._lock:
            self.requests.append(view)
            if self._next >= len(self._responses):
                raise ModelError(
                    f"ScriptedModel ran out of responses: request #{self._next + 1} but the script has "
                    f"{len(self._responses)}"
                )
            response = self._responses[self._next]
            self._next += 1
        stream_text(response, on_delta)
        return response


class ReplayDivergenceError(ModelError):
    """A replayed run asked something the recording does not have.

    ``step`` is the step of the recorded entry (None past the end), ``index`` the position of the
    model call in the recording, ``expected``/``actual`` the recorded and the new request digest
    (or request id).
    """

    def __init__(self, message: str, *, step: int | None, index: int, expected: str | None, actual: str | None) -> None:
        super().__init__(message)
        self.step = step
        self.index = index
        self.expected = expected
        self.actual = actual

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_divergence,
            (str(self), self.step, self.index, self.expected, self.actual),
        )


def _rebuild_divergence(
    message: str, step: int | None, index: int, expected: str | None, actual: str | None
) -> ReplayDivergenceError:
    return ReplayDivergenceError(message, step=step, index=index, expected=expected, actual=actual)


@dataclass(frozen=True, kw_only=True)
class ReplayEntry:
    """One recorded model call: where it happened, what was asked, what came back."""

    step: int | None
    response: ModelResponse
    request_id: str | None = None
    request_digest: str | None = None


class ReplayModel(RecordingAdapter):
    """Replays recorded model responses in order and reports where a new run diverges.

    ``ReplayModel(responses)`` replays a plain list (no request checks);
    ``ReplayModel.from_trace(run_dir)`` replays a recorded run (see the module docstring).
    """

    def __init__(
        self,
        responses: Iterable[ScriptedResponse | ReplayEntry],
        *,
        max_input_units: int | None = None,
        unit: Unit = "characters",
        model_id: str = "replay",
    ) -> None:
        super().__init__(model_id=model_id, max_input_units=max_input_units, unit=unit)
        self._entries: list[ReplayEntry] = []
        for i, item in enumerate(responses):
            if isinstance(item, ReplayEntry):
                self._entries.append(item)
            else:
                self._entries.append(ReplayEntry(step=None, response=coerce_response(item, index=i, model=model_id)))
        self._next = 0

    @classmethod
    def from_trace(
        cls,
        run_dir: str | Path,
        *,
        max_input_units: int | None = None,
        unit: Unit = "characters",
    ) -> ReplayModel:
        """Load the model responses recorded in ``run_dir/steps.jsonl``.

        Raises ConfigurationError when the file is missing, a line is not JSON, or a model entry
        has no readable response (naming the line).
        """
        path = Path(run_dir) / "steps.jsonl"
        if not path.is_file():
            raise ConfigurationError(f"no trace to replay: {path} does not exist")
        entries: list[ReplayEntry] = []
        with path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError as exc:
                    raise ConfigurationError(f"{path}:{lineno}: not a JSON line ({exc})") from exc
                if not isinstance(record, dict):
                    raise ConfigurationError(f"{path}:{lineno}: a step record must be a JSON object")
                step = record.get("step_id", record.get("step", lineno - 1))
                models: list[Any] = []
                if record.get("model") is not None:
                    models.append(record["model"])
                models.extend(record.get("models") or ())
                for item in models:
                    entries.append(_entry_from_record(item, step=step, where=f"{path}:{lineno}"))
        model_id = f"replay:{Path(run_dir).name}"
        return cls(entries, max_input_units=max_input_units, unit=unit, model_id=model_id)

    @property
    def entries(self) -> tuple[ReplayEntry, ...]:
        """The recorded model calls, in order."""
        return tuple(self._entries)

    @property
    def remaining(self) -> int:
        """How many recorded responses are left."""
        return len(self._entries) - self._next

    def complete(self, view: RequestView, *, on_delta: DeltaCallback | None = None) -> ModelResponse:
        """Return the next recorded response after checking the request matches the recording."""
        with self._lock:
            self.requests.append(view)
            index = self._next
            if index >= len(self._entries):
                raise ReplayDivergenceError(
                    f"replay diverged: model request #{index + 1} but the recording has only "
                    f"{len(self._entries)} model calls",
                    step=None,
                    index=index,
                    expected=None,
                    actual=view.request_id,
                )
            entry = self._entries[index]
            self._check(entry, view, index)
            self._next += 1
        stream_text(entry.response, on_delta)
        return entry.response

    @staticmethod
    def _check(entry: ReplayEntry, view: RequestView, index: int) -> None:
        if entry.request_digest is not None:
            expected, actual, what = entry.request_digest, request_digest(view), "request digest"
        elif entry.request_id is not None:
            expected, actual, what = entry.request_id, view.request_id, "request id"
        else:
            return
        if expected != actual:
            raise ReplayDivergenceError(
                f"replay diverged at step {entry.step} (model call #{index + 1}): the {what} is {actual}, "
                f"the recording has {expected}; the run is no longer asking what was recorded",
                step=entry.step,
                index=index,
                expected=expected,
                actual=actual,
            )


def _entry_from_record(item: object, *, step: object, where: str) -> ReplayEntry:
    if not isinstance(item, Mapping) or not isinstance(item.get("response"), Mapping):
        raise ConfigurationError(f"{where}: a model entry must be an object with a 'response' object")
    try:
        response = ModelResponse.from_dict(item["response"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigurationError(f"{where}: unreadable model response ({type(exc).__name__}: {exc})") from exc
    request_id = item.get("request_id")
    digest_value = item.get("request_digest")
    return ReplayEntry(
        step=step if isinstance(step, int) else None,
        response=response,
        request_id=str(request_id) if request_id is not None else None,
        request_digest=str(digest_value) if digest_value is not None else None,
    )
