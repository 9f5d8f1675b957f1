"""``compose()``: bind an agent, a checkpoint store, a model and named extensions into sessions.

::

    composition = compose(agent=NotesAgent, checkpoint_store=SqliteCheckpointStore("sessions.db"))
    session = composition.session("Index notes")
    result = session.run()
    same = composition.restore(session.session_id.value)   # in any process, with SQLite

Extensions are bound by name: ``extensions={name: factory_or_instance}`` where a factory is a class or
a zero-argument callable. Every bound context contributor (anything with ``contribute``) is consulted
on each model request, in name order. ``compaction={"provider": name}`` and
``lifecycle={"provider": name}`` select one compactor and one lifecycle policy among them. A name that
no extension provides fails here, when ``compose()`` is called.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from qitos.checkpoint._memory_store import InMemoryCheckpointStore
from qitos.checkpoint._targets import open_store
from qitos.checkpoint.store import CheckpointStore
from qitos.core._agent_module import AgentModule
from qitos.core._errors import ConfigurationError
from qitos.core._task import Task
from qitos.core.context import ContextRequest
from qitos.engine._engine import Engine
from qitos.engine._model_path import ModelContext
from qitos.engine._tool_threads import ToolThreads
from qitos.engine.runtime import LifecyclePolicy
from qitos.engine.session_runtime import Session, anew_session, arestore_session, new_session, restore_session
from qitos.models._function import ModelSource
from qitos.sessions._lease import DEFAULT_LEASE_TTL

__all__ = ["Composition", "ResolverReference", "Runtime", "compose"]


@dataclass(frozen=True)
class ResolverReference:
    """A name bound in a composition and what it resolved to (recorded with each session)."""

    name: str
    kind: str
    provider: str


@dataclass
class Runtime:
    """What a composition bound: the store, the model, the extensions and the selected policies."""

    checkpoint_store: CheckpointStore
    model: ModelSource | None
    extensions: dict[str, Any]
    contributors: list[Any]
    compactor: Any
    lifecycle: LifecyclePolicy | None
    references: tuple[ResolverReference, ...]
    durability: str = "sync"
    batch_steps: int = 16
    batch_ms: float = 50.0
    lease_ttl: float = DEFAULT_LEASE_TTL
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    tool_use_policy: str | Callable[[ContextRequest], str] = "auto"


class Composition:
    """A bound agent and runtime. Get Sessions from it; never construct a Session directly."""

    def __init__(self, agent_factory: Callable[[], AgentModule[Any, Any, Any]], runtime: Runtime) -> None:
        self._agent_factory = agent_factory
        self.runtime = runtime

    @property
    def agent_factory(self) -> Callable[[], AgentModule[Any, Any, Any]]:
        """The zero-argument factory making this composition's agent (one per engine)."""
        return self._agent_factory

    def engine(self) -> Engine[Any, Any, Any]:
        """A fresh Engine for this composition's agent and runtime."""
        agent = self._agent_factory()
        if not isinstance(agent, AgentModule):
            raise ConfigurationError(f"the agent factory returned {type(agent).__name__}, not an AgentModule")
        runtime = self.runtime
        context = ModelContext(
            contributors=runtime.contributors,
            compaction_policy=runtime.compactor,
            tool_use_policy=runtime.tool_use_policy,
        )
        return Engine(
            agent,
            model=runtime.model,
            lifecycle=runtime.lifecycle,
            context=context,
            checkpoint_store=runtime.checkpoint_store,
            **runtime.engine_kwargs,
        )

    def session(self, task: str | Task, **state_kwargs: Any) -> Session:
        """Create a new durable Session for ``task`` (its first snapshot is committed now)."""
        return new_session(self.engine(), task, composition=self, **state_kwargs)

    async def asession(self, task: str | Task, **state_kwargs: Any) -> Session:
        """Async twin of :meth:`session` (for many sessions created on one event loop)."""
        return await anew_session(self.engine(), task, composition=self, **state_kwargs)

    def restore(self, session_id: str) -> Session:
        """The Session with this id, from the store's durable head (any process, with SQLite)."""
        return restore_session(self.engine(), session_id, composition=self)

    async def arestore(self, session_id: str) -> Session:
        """Async twin of :meth:`restore` (for many sessions resumed on one event loop)."""
        return await arestore_session(self.engine(), session_id, composition=self)

    def fork(self, session_id: str, *, snapshot: Any = None, operation_id: str | None = None) -> Session:
        """A new child Session from a verified snapshot of ``session_id`` (default: its head)."""
        return self.restore(session_id).fork(snapshot, operation_id=operation_id)


def compose(
    agent: type[AgentModule[Any, Any, Any]] | Callable[[], AgentModule[Any, Any, Any]] | AgentModule[Any, Any, Any],
    store: CheckpointStore | str | None = None,
    extensions: Mapping[str, object] | None = None,
    compaction: Mapping[str, str] | None = None,
    lifecycle: Mapping[str, str] | None = None,
    model: ModelSource | None = None,
    *,
    checkpoint_store: CheckpointStore | None = None,
    durability: str = "sync",
    batch_steps: int = 16,
    batch_ms: float = 50.0,
    lease_ttl: float = DEFAULT_LEASE_TTL,
    tool_workers: int | None = None,
    tool_use_policy: str | Callable[[ContextRequest], str] = "auto",
    **engine_kwargs: object,
) -> Composition:
    """Bind an agent (class, zero-argument factory or instance) with a store, extensions and a model.

    ``checkpoint_store`` is where sessions are stored (the name ``Engine(checkpoint_store=)`` and
    ``composition.runtime.checkpoint_store`` use); ``store`` is the same parameter under a short
    name (give one of them). It defaults to an in-process ``InMemoryCheckpointStore``; text names one
    (a SQLite file path, ``sqlite:///path`` or a ``postgresql://`` DSN; see ``qitos.checkpoint._targets``).
    ``durability`` is ``"sync"``
    (commit every boundary) or ``"batched"`` (group commit every ``batch_steps`` boundaries or
    ``batch_ms`` milliseconds; see ``qitos.engine.session_runtime`` for what a crash can lose).
    ``lease_ttl`` is how many seconds a run's hold on its session lasts without renewal: how long a
    session whose runner died waits before another runner may take it over (``qitos.sessions._lease``).
    ``tool_workers``: size of one executor shared by every session of this composition for its sync
    tools under ``Session.arun`` (default: the process-wide executor; see ``EngineLoop``).
    ``tool_use_policy``: the tool use of each model request: ``"auto"`` (the model chooses),
    ``"none"``, ``"required"`` or a tool's name (both hold until a tool was used, then ``auto``: the
    model must act first and can still finish), or a function ``ContextRequest -> str`` deciding per
    request (see ``qitos.engine._model_path.ModelContext``).
    Other keyword arguments go to the Engine (``budget=``, ``hooks=``, ``critics=`` ...).
    """
    if durability not in ("sync", "batched"):
        raise ConfigurationError(f"durability must be 'sync' or 'batched', got {durability!r}")
    if batch_steps < 1 or batch_ms <= 0:
        raise ConfigurationError("batch_steps must be >= 1 and batch_ms > 0")
    if store is not None and checkpoint_store is not None and store is not checkpoint_store:
        raise ConfigurationError("pass the checkpoint store once: checkpoint_store= (store= is its short alias)")
    store = checkpoint_store if checkpoint_store is not None else store
    if isinstance(lease_ttl, bool) or not isinstance(lease_ttl, int | float) or lease_ttl <= 0:
        raise ConfigurationError(f"lease_ttl must be a positive number of seconds, got {lease_ttl!r}")
    if tool_workers is not None:
        if isinstance(tool_workers, bool) or not isinstance(tool_workers, int) or tool_workers < 1:
            raise ConfigurationError(f"tool_workers must be a positive int, got {tool_workers!r}")
        # One executor for all the composition's engines (an engine per session), so the bound holds.
        engine_kwargs["tool_executor"] = ToolThreads(tool_workers)
    if not callable(tool_use_policy) and (not isinstance(tool_use_policy, str) or not tool_use_policy):
        raise ConfigurationError(
            f"tool_use_policy must be auto, required, none, a tool's name or a function, got {tool_use_policy!r}"
        )
    if isinstance(store, str):
        store = open_store(store)
    agent_factory = _agent_factory(agent)
    bound: dict[str, Any] = {}
    references: list[ResolverReference] = []
    for name in sorted(extensions or {}):
        value = (extensions or {})[name]
        instance = _instantiate(name, value)
        bound[name] = instance
        references.append(ResolverReference(name, _kind(instance), _provider(value)))
    contributors = [bound[n] for n in sorted(bound) if callable(getattr(bound[n], "contribute", None))]
    compactor = _select(bound, compaction, "compaction", "compact")
    lifecycle_policy = _select(bound, lifecycle, "lifecycle", "should_pause")
    runtime = Runtime(
        checkpoint_store=store if store is not None else InMemoryCheckpointStore(),
        model=model,
        extensions=bound,
        contributors=contributors,
        compactor=compactor,
        lifecycle=lifecycle_policy,
        references=tuple(references),
        durability=durability,
        batch_steps=batch_steps,
        batch_ms=batch_ms,
        lease_ttl=float(lease_ttl),
        engine_kwargs=dict(engine_kwargs),
        tool_use_policy=tool_use_policy,
    )
    return Composition(agent_factory, runtime)


def _agent_factory(agent: Any) -> Callable[[], AgentModule[Any, Any, Any]]:
    if isinstance(agent, AgentModule):
        return lambda: agent
    if callable(agent):
        return agent  # type: ignore[no-any-return]
    raise ConfigurationError(f"agent must be an AgentModule class, factory or instance, got {agent!r}")


def _instantiate(name: str, value: object) -> Any:
    if isinstance(value, type) or (callable(value) and not _looks_like_instance(value)):
        try:
            return value()
        except TypeError as exc:
            raise ConfigurationError(
                f"extension {name!r}: its factory must take no arguments ({exc}); pass a ready instance instead"
            ) from exc
    return value


def _looks_like_instance(value: object) -> bool:
    return any(callable(getattr(value, m, None)) for m in ("contribute", "compact", "should_pause", "retrieve"))


def _select(bound: Mapping[str, object], selection: Mapping[str, str] | None, what: str, method: str) -> Any:
    if not selection:
        return None
    unknown = set(selection) - {"provider"}
    if unknown or "provider" not in selection:
        raise ConfigurationError(f"{what}= takes {{'provider': name}}, got {dict(selection)!r}")
    name = selection["provider"]
    if name not in bound:
        known = ", ".join(sorted(bound)) or "none"
        raise ConfigurationError(f"{what} provider {name!r} is not a bound extension (bound: {known})")
    instance = bound[name]
    if not callable(getattr(instance, method, None)):
        raise ConfigurationError(f"extension {name!r} cannot serve as {what}: it has no {method}() method")
    return instance


def _kind(instance: object) -> str:
    for method, kind in (("compact", "compactor"), ("should_pause", "lifecycle"), ("contribute", "contributor")):
        if callable(getattr(instance, method, None)):
            return kind
    return "extension"


def _provider(value: object) -> str:
    target = value if isinstance(value, type) or (callable(value) and not _looks_like_instance(value)) else type(value)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"
