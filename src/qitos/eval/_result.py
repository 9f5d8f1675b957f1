"""What a scorer is given about a run: :class:`SampleResult`, read from the session or the store."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["SampleResult"]


@dataclass(frozen=True, kw_only=True)
class SampleResult:
    """The outcome of one sample x epoch, as the scorers see it.

    ``answer`` is the final state's ``final_result`` (what scorers compare against unless they say
    otherwise); ``tool_calls`` are the agent's calls in order, each ``{"name", "arguments"}``;
    ``error`` is set when the run failed (the agent raised, the sample timed out...).
    """

    sample_id: str
    epoch: int
    session_id: str
    answer: Any = None
    stop_reason: str | None = None
    steps: int = 0
    tool_calls: Sequence[Mapping[str, Any]] = ()
    error: str | None = None

    @property
    def answer_text(self) -> str:
        """The answer as text ('' when there is none)."""
        return "" if self.answer is None else str(self.answer)
