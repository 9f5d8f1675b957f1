"""``FunctionModel``: a model backed by a plain function, and :func:`as_model`, which turns what a
user passes as ``llm=`` into a model adapter.

``FunctionModel(fn)`` calls ``fn(view)`` with the :class:`~qitos.core.request_view.RequestView`;
``FunctionModel(fn, takes="messages")`` calls ``fn(messages)`` with the chat messages the view
holds (``view.messages()``: a list of ``{"role", "content", ...}`` dicts), the shape of most
"call my LLM" functions. Either way the function returns a ``str`` (the assistant's text), a
:class:`~qitos.models._base.ModelResponse`, or a scripted-response mapping (see
:mod:`qitos.models._doubles`); its exceptions propagate unchanged.

``AgentModule(llm=fn)`` with a plain callable works through :func:`as_model`: the engine wraps it
as ``FunctionModel(fn, takes="messages")``. A model adapter (anything with a callable
``complete``) is used as is; anything else is refused with a
:class:`~qitos.core._errors.ConfigurationError`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, cast

from qitos.core._errors import ConfigurationError
from qitos.models._base import DeltaCallback, ModelAdapter, ModelResponse, Unit
from qitos.models._doubles import RecordingAdapter, ScriptedResponse, coerce_response, stream_text

if TYPE_CHECKING:
    from qitos.core.request_view import RequestView

__all__ = ["FunctionModel", "ModelSource", "as_model"]

Takes = Literal["view", "messages"]

ModelSource: TypeAlias = ModelAdapter | Callable[..., ScriptedResponse]
"""What ``model=`` / ``llm=`` take: a model adapter, or a function ``messages -> text`` (see :func:`as_model`)."""


class FunctionModel(RecordingAdapter):
    """A model backed by a plain function: ``fn(view)``, or ``fn(messages)`` with ``takes="messages"``.

    The function's result is coerced like a scripted response (a ``str`` is the final text); its
    exceptions propagate unchanged (raise :class:`~qitos.core._errors.ModelError` to simulate a
    provider failure). Every view received is kept in ``requests``.
    """

    provider = "function"

    def __init__(
        self,
        fn: Callable[[Any], ScriptedResponse],
        *,
        takes: Takes = "view",
        max_input_units: int | None = None,
        unit: Unit = "characters",
        model_id: str = "function",
    ) -> None:
        if not callable(fn):
            raise ConfigurationError(f"FunctionModel needs a callable, got {type(fn).__name__}")
        if takes not in ("view", "messages"):
            raise ConfigurationError(f"takes must be 'view' or 'messages', got {takes!r}")
        super().__init__(model_id=model_id, max_input_units=max_input_units, unit=unit)
        self._fn = fn
        self.takes: Takes = takes

    def complete(self, view: RequestView, *, on_delta: DeltaCallback | None = None) -> ModelResponse:
        """Call the function and return its answer (its text streamed to ``on_delta`` when given)."""
        with self._lock:
            self.requests.append(view)
            index = len(self.requests) - 1
        value = self._fn(view.messages() if self.takes == "messages" else view)
        response = coerce_response(value, index=index, model=self.model_id)
        stream_text(response, on_delta)
        return response

    def describe(self) -> dict[str, Any]:
        """Adapter, model id, declared capacity, and what the function is given."""
        return {**super().describe(), "takes": self.takes}


def as_model(llm: ModelSource | None) -> ModelAdapter | None:
    """The model adapter for what was passed as ``llm=`` / ``model=``.

    None stays None (no model: the model path then reports that none is configured); an object
    with a callable ``complete`` is a model adapter and is returned as is; any other callable is
    wrapped as ``FunctionModel(llm, takes="messages")`` (model id: its name). Anything else raises
    :class:`~qitos.core._errors.ConfigurationError` naming what was given.
    """
    if llm is None or isinstance(llm, ModelAdapter):
        return llm
    if not inspect.isclass(llm) and callable(getattr(llm, "complete", None)):
        return cast(ModelAdapter, llm)  # an adapter in all but its base class: used as it is
    if callable(llm) and not inspect.isclass(llm):
        name = getattr(llm, "__qualname__", None) or getattr(llm, "__name__", None) or type(llm).__name__
        return FunctionModel(llm, takes="messages", model_id=str(name))
    if inspect.isclass(llm):
        what = f"the class {llm.__name__} (pass an instance)"
    else:
        what = f"{type(llm).__name__} {llm!r:.60}"
    raise ConfigurationError(
        f"llm must be a model adapter (an object with complete(view), e.g. OpenAICompatibleModel) or a "
        f"function messages -> text; got {what}"
    )
