"""What an agent and its engine add to every model request: the agent's memory and the history policy.

``AgentModule(memory=m)`` means: recall ``m`` fresh into every request's context. The model path
wraps it in a :class:`~qitos.kit.memory.adapter.MemorySourceAdapter` (namespace ``agent``) placed
after the composition's own contributors, unless one of those already recalls the same memory.

``Engine(history_policy=p)`` shapes what the model sees of the conversation (the run's exchange
log): ``p`` is a compaction policy (``compact()``, or ``compact_with_summary()`` for a summarizing
one, e.g. the kit's ``ClosedExchangeWindowCompactor`` / ``SummaryCompactor``) that may omit the
oldest closed exchanges, with a receipt, when the request does not fit its budget. It is used when
the model context names no compaction policy; naming two different ones is a ConfigurationError.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from qitos.core._errors import ConfigurationError
from qitos.kit.memory.adapter import MemorySourceAdapter

__all__ = ["AGENT_MEMORY_NAMESPACE", "check_history_policy", "request_compaction", "request_contributors"]

AGENT_MEMORY_NAMESPACE = "agent"


def check_history_policy(policy: object, context: object = None) -> Any:
    """``policy`` if it can serve as the history (compaction) policy next to ``context`` (the
    engine's model context), or None; else ConfigurationError (at engine construction)."""
    if policy is None:
        return None
    if callable(getattr(policy, "compact", None)) or callable(getattr(policy, "compact_with_summary", None)):
        request_compaction(getattr(context, "compaction_policy", None), policy)
        return policy
    raise ConfigurationError(
        f"history_policy= must be a compaction policy (with compact() or compact_with_summary(), e.g. "
        f"qitos.kit.context.compaction.ClosedExchangeWindowCompactor()), got {type(policy).__name__}"
    )


def request_contributors(agent: object, contributors: Sequence[object]) -> list[Any]:
    """The contributors consulted on each request: ``contributors``, then the agent's memory."""
    out = list(contributors)
    memory = getattr(agent, "memory", None)
    if memory is None or any(getattr(c, "memory", None) is memory for c in out):
        return out
    out.append(MemorySourceAdapter(memory, namespace=AGENT_MEMORY_NAMESPACE))
    return out


def request_compaction(context_policy: object, history_policy: object) -> Any:
    """The compaction policy of the model path: the context's, else the engine's history policy."""
    if context_policy is None:
        return history_policy
    if history_policy is not None and history_policy is not context_policy:
        raise ConfigurationError(
            "two compaction policies: the model context names one and history_policy= another; pass one"
        )
    return context_policy
