"""``AgentModule``: the policy layer of an agent.

Subclass it, implement ``init_state`` and ``reduce``, and optionally ``decide``,
``build_system_prompt``, ``prepare`` and ``should_stop``. The engine owns the loop.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TextIO, TypeVar

from qitos.core._decision import Decision
from qitos.core._errors import ConfigurationError, RunFailedError
from qitos.core._output import OutputSpec
from qitos.core._state import StateSchema
from qitos.core._task import Env, Task
from qitos.core._tool import ToolRegistry
from qitos.core.request_view import CompactionPolicy, SummarizingCompactionPolicy

if TYPE_CHECKING:
    from qitos.core.memory import Memory

__all__ = ["DEFAULT_THEME", "AgentModule"]

DEFAULT_THEME = "research"

StateT = TypeVar("StateT", bound=StateSchema)
ObservationT = TypeVar("ObservationT")
ActionT = TypeVar("ActionT")


class AgentModule(ABC, Generic[StateT, ObservationT, ActionT]):
    """Base class of an agent: typed state plus hooks, run by the one canonical engine loop.

    A subclass can declare its tools as a class attribute, ``tools = (word_count, ...)``; they form
    the registry when none is passed, so ``MyAgent()`` and ``compose(agent=MyAgent)`` have them.

    ``output_type`` (class or instance attribute; None: text) types the final answer of the model
    path: a dataclass or a pydantic model. The model is then asked for a JSON object of that type,
    an answer that does not validate gets repair feedback, and ``run`` returns the typed value
    (see ``qitos.core._output``).

    Args:
        tool_registry: the tools the agent may call: a ``ToolRegistry`` or a sequence of tools
            (None: the class's ``tools``, by default none).
        llm: the model used when ``decide`` returns None (the model path); the original name, an
            alias of ``model=``. Stored as ``self.llm``. A model adapter, or a plain function
            ``messages -> text | ModelResponse`` (the engine wraps it as a
            ``qitos.models._function.FunctionModel``); anything else raises ConfigurationError.
        model_parser: a text protocol parser turning model text into a ``Decision``.
        memory: an optional ``Memory`` (anything with ``retrieve()``). On every model request the
            engine recalls it fresh into the request context through
            ``qitos.kit.memory.adapter.MemorySourceAdapter`` (namespace ``agent``); records become
            ``user``-placed contributions, cited by revision in the request view.
        history: must be None. qitos keeps the conversation in the run's exchange log, and what the
            model sees of it is shaped by ``Engine(history_policy=)`` (a compaction policy) and the
            context budget; any other value raises ConfigurationError rather than being ignored.
        **config: extra settings, kept in ``self.config``; except ``model=``, the agent's model adapter
            under the name used everywhere else (``Engine(model=)``, ``compose(model=)``), which is
            taken out and stored as ``self.llm``. Give ``model=`` or ``llm=``, not two different ones.
    """

    tools: ClassVar[Sequence[Any]] = ()
    """Tools (``@tool`` functions or ToolSpecs) every instance gets when no ``tool_registry`` is passed."""

    output_type: type | None = None
    """The type of the final answer on the model path (a dataclass or pydantic model), or None for text."""

    def __init__(
        self,
        tool_registry: object = None,
        llm: Any = None,
        model_parser: Any = None,
        memory: Memory | None = None,
        history: object = None,
        **config: object,
    ) -> None:
        model = config.pop("model", None)  # the canonical name; llm= stays for code written against it
        if model is not None and llm is not None and model is not llm:
            raise ConfigurationError("pass the agent's model once: model= (llm= is an alias for it)")
        self.tool_registry: ToolRegistry = _registry(tool_registry, type(self).tools)
        llm = llm if llm is not None else model
        usable = callable(llm) or callable(getattr(llm, "complete", None))
        if llm is not None and (isinstance(llm, type) or not usable):
            raise ConfigurationError(
                f"llm must be a model adapter instance (with complete(view)) or a function messages -> text, "
                f"got {llm!r:.80}"
            )
        self.llm = llm
        self.model_parser = model_parser
        if memory is not None and not callable(getattr(memory, "retrieve", None)):
            raise ConfigurationError(
                f"memory= must be a Memory (with a retrieve() method), got {type(memory).__name__}"
            )
        if history is not None:
            raise ConfigurationError(
                "history= is not supported: the conversation is the run's exchange log. To shape what the "
                "model sees of it, pass a compaction policy as Engine(history_policy=...) or "
                "compose(compaction=...); to add recalled facts, pass memory=."
            )
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
        env: Env | None = None,
        parser: Any = None,
        search: Any = None,
        critics: list[Any] | None = None,
        stop_criteria: list[Any] | None = None,
        history_policy: CompactionPolicy | SummarizingCompactionPolicy | None = None,
        trace: Any = None,
        render: Any = None,
        trace_logdir: str = "./runs",
        trace_prefix: str | None = None,
        theme: str = DEFAULT_THEME,
        otel: Any = None,
        progress: bool | TextIO = False,
        **state_kwargs: Any,
    ) -> Any:
        """Build an Engine, run ``task``, and return ``state.final_result``
        (the whole ``EngineResult`` when ``return_state=True``). With an ``output_type`` the final
        answer is returned as that type (None when the run ended without one).

        A run that ends with status ``failed`` (the model unreachable, an HTTP error, a request that
        does not fit its budget...) raises :class:`~qitos.core._errors.RunFailedError` carrying the
        ``EngineResult``; with ``return_state=True`` the result is returned instead. A run that
        stopped (a budget, max steps, a pause) returns its final result, which may be None.

        ``trace`` is None or True (write ``trace_logdir/<run_id>/``), False (no trace files), or a
        ``TraceWriter``. ``render`` is a render hook object (for example the CLI's ``LiveRenderer``)
        or None; ``theme`` is set on it (a renderer without a ``theme`` attribute, or no renderer,
        accepts only the default theme). ``history_policy`` goes to the Engine (a compaction policy).
        ``otel`` turns on OpenTelemetry spans (``True``, a TracerProvider or ``OtelSettings``; see
        ``qitos.engine._telemetry``). ``progress=True`` prints a line per step to stderr (or to the
        text stream given), rendered from the run's events (``qitos.engine._progress``).
        ``state_kwargs`` go to ``init_state``.
        """
        # The one place core reaches up to the engine: ``agent.run`` is the convenience entry point.
        engine_module = importlib.import_module("qitos.engine._engine")
        kwargs: dict[str, Any] = dict(engine_kwargs or {})
        all_hooks = [*(hooks or []), *(render_hooks or [])]
        if render is not None and render is not False:
            if hasattr(render, "theme"):
                render.theme = theme  # a renderer validates its themes when set
            elif theme != DEFAULT_THEME:
                raise ConfigurationError(f"theme={theme!r}: {type(render).__name__} has no themes")
            all_hooks.append(render)
        elif theme != DEFAULT_THEME:
            raise ConfigurationError(f"theme={theme!r} styles a renderer, but no render= hook was given")
        if progress is not False:
            printer = importlib.import_module("qitos.engine._progress").progress_printer(progress)
            if printer is not None:
                all_hooks.append(printer)
        kwargs["hooks"] = [*(kwargs.get("hooks") or []), *all_hooks]  # engine_kwargs' hooks and these
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
        if return_state:
            return result
        task_result = result.task_result
        if task_result is not None and task_result.status == "failed":
            raise RunFailedError(
                f"the run failed ({task_result.stop_reason}): {task_result.error or 'no error recorded'}",
                result=result,
                stop_reason=task_result.stop_reason,
                error=task_result.error,
            )
        final = result.state.final_result
        if self.output_type is None or final is None:
            return final
        return OutputSpec.of(self.output_type).parse(final)


def _registry(given: Any, declared: Sequence[Any]) -> ToolRegistry:
    if isinstance(given, ToolRegistry):
        return given
    if given is None:
        return ToolRegistry(declared)
    if isinstance(given, list | tuple):
        return ToolRegistry(given)
    raise ConfigurationError(f"tool_registry= must be a ToolRegistry or a list of tools, got {type(given).__name__}")
