"""``AgentModule`` (seed 004): the policy layer of an agent.

Subclass it, implement ``init_state`` and ``reduce``, and optionally ``decide``,
``build_system_prompt``, ``prepare`` and ``should_stop``. The engine owns the loop.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from qitos.core.decision import Decision
from qitos.core.errors import ConfigurationError
from qitos.core.state import StateSchema
from qitos.core.task import Task
from qitos.core.tool import ToolRegistry

if TYPE_CHECKING:
    from qitos.core.memory import Memory

__all__ = ["AgentModule"]

StateT = TypeVar("StateT", bound=StateSchema)
ObservationT = TypeVar("ObservationT")
ActionT = TypeVar("ActionT")


class AgentModule(ABC, Generic[StateT, ObservationT, ActionT]):
    """Base class of an agent: typed state plus hooks, run by the one canonical engine loop.

    Args:
        tool_registry: the tools the agent may call (a ``ToolRegistry``; None means no tools).
        llm: the model used when ``decide`` returns None (the model path): a model adapter, or a
            plain function ``messages -> text | ModelResponse`` (the engine wraps it as a
            ``qitos.models.function.FunctionModel``). Anything else raises ConfigurationError.
        model_parser: a text protocol parser turning model text into a ``Decision``.
        memory: an optional memory adapter.
        history: an optional history adapter.
        **config: extra settings, kept in ``self.config``.
    """

    def __init__(
        self,
        tool_registry: Any = None,
        llm: Any = None,
        model_parser: Any = None,
        memory: Memory | None = None,
        history: Any = None,
        **config: Any,
    ) -> None:
        self.tool_registry: ToolRegistry = tool_registry if tool_registry is not None else ToolRegistry()
        usable = callable(llm) or callable(getattr(llm, "complete", None))
        if llm is not None and (isinstance(llm, type) or not usable):
            raise ConfigurationError(
                f"llm must be a model adapter instance (with complete(view)) or a function messages -> text, "
                f"got {llm!r:.80}"
            )
        self.llm = llm
        self.model_parser = model_parser
        self.memory = memory
        self.history = history
        self.config: dict[str, Any] = dict(config)

    # ------------------------------------------------------------------ required hooks

    @abstractmethod
    def init_state(self, task: str, **kwargs: Any) -> StateT:
        """Create the initial state for a run of ``task``."""

    @abstractmethod
    def reduce(self, state: StateT, observation: ObservationT, decision: Decision[ActionT]) -> StateT:
        """Fold the step's observation and decision into the next state."""

    # ------------------------------------------------------------------ optional hooks

    def build_system_prompt(self, state: StateT) -> str | None:
        """A dynamic system prompt for the model path; None by default."""
        return None

    def prepare(self, state: StateT) -> str:
        """The model's input text for the state; ``str(state)`` by default."""
        return str(state)

    def decide(self, state: StateT, observation: ObservationT) -> Decision[ActionT] | None:
        """A custom decision; returning None takes the engine's model path."""
        return None

    def should_stop(self, state: StateT) -> bool:
        """An extra stop condition; False by default."""
        return False

    # ------------------------------------------------------------------ entry point

    def run(
        self,
        task: str | Task,
        return_state: bool = False,
        hooks: list[Any] | None = None,
        render_hooks: list[Any] | None = None,
        engine_kwargs: dict[str, Any] | None = None,
        workspace: str | None = None,
        max_steps: int | None = None,
        env: Any = None,
        parser: Any = None,
        search: Any = None,
        critics: list[Any] | None = None,
        stop_criteria: list[Any] | None = None,
        history_policy: Any = None,
        trace: Any = None,
        render: Any = None,
        trace_logdir: str = "./runs",
        trace_prefix: str | None = None,
        theme: str = "research",
        otel: Any = None,
        **state_kwargs: Any,
    ) -> Any:
        """Build an Engine, run ``task``, and return ``state.final_result``
        (the whole ``EngineResult`` when ``return_state=True``).

        ``trace`` is None or True (write ``trace_logdir/<run_id>/``), False (no trace files), or a
        ``TraceWriter``. ``render`` is a render hook object (for example the CLI's live renderer) or
        None; ``theme`` is passed to renderers that support themes. ``otel`` turns on OpenTelemetry
        spans (``True``, a TracerProvider or ``OtelSettings``; see ``qitos.engine.telemetry``).
        ``state_kwargs`` go to ``init_state``.
        """
        # The one place core reaches up to the engine: the convenience entry point of seed 004.
        engine_module = importlib.import_module("qitos.engine.engine")
        kwargs: dict[str, Any] = dict(engine_kwargs or {})
        all_hooks = [*(hooks or []), *(render_hooks or [])]
        if render is not None and render is not False:
            if hasattr(render, "theme"):
                render.theme = theme
            all_hooks.append(render)
        kwargs.setdefault("hooks", all_hooks)
        for name, value in (
            ("parser", parser),
            ("env", env),
            ("search", search),
            ("critics", critics),
            ("stop_criteria", stop_criteria),
            ("history_policy", history_policy),
            ("otel", otel),
        ):
            if value is not None:
                kwargs.setdefault(name, value)
        if trace is not False:
            kwargs.setdefault("trace_writer", trace if trace not in (None, True) else None)
            kwargs.setdefault("trace_logdir", trace_logdir)
            kwargs.setdefault("trace_prefix", trace_prefix)
        engine = engine_module.Engine(self, **kwargs)
        result = engine.run(task, workspace=workspace, max_steps=max_steps, **state_kwargs)
        return result if return_state else result.state.final_result
