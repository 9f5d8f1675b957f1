"""Typed final answers: :class:`OutputSpec` turns an ``output_type`` into a schema and a validator.

An agent declares the type of its final answer as ``output_type`` (``AgentModule.output_type``,
``Agent(output_type=...)``): a dataclass, or a pydantic model (pydantic is never imported by qitos;
a model class is recognised by its ``model_validate`` / ``model_json_schema`` methods). On the
model path the answer then has to be a JSON object of that type:

- the request offers it as a tool, :data:`FINAL_ANSWER_TOOL` (``final_answer``), whose parameters
  are the type's JSON schema, and asks for :data:`STRUCTURED_OUTPUT` among its
  ``capability_requirements``. An adapter whose server supports ``response_format`` with a JSON
  schema sends the schema that way instead (``OpenAICompatibleModel(response_format=...)``);
  every other adapter sends the tool (:meth:`RequestView.output_schema
  <qitos.core.request_view.RequestView.output_schema>` reads it back);
- the reply is a ``final_answer`` call, or text that is exactly such a JSON object (optionally in
  a fenced code block). It is validated (:meth:`OutputSpec.validate`); one that does not validate
  gets repair feedback naming the problems, like a bad tool call, and the model tries again,
  bounded by the step budget. A valid one ends the run: ``Decision.final`` with the JSON text as
  the answer and the JSON data as ``meta["output"]``.

The typed value round-trips the strict codec (``qitos.core._codec`` encodes a dataclass field by
field and a pydantic model with ``model_dump(mode="json")``), so a state field declared with the
type survives sessions, forks and restores.
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from qitos.core._codec import decode_value, encode_value, is_model_class
from qitos.core._errors import CodecError, ConfigurationError, RunError, ToolDefinitionError
from qitos.core._tool import compile_validator, schema_for_type

__all__ = [
    "FINAL_ANSWER_TOOL",
    "STRUCTURED_OUTPUT",
    "OutputSpec",
    "OutputValidationError",
]

FINAL_ANSWER_TOOL = "final_answer"
"""The name of the tool that carries a typed final answer."""

STRUCTURED_OUTPUT = "structured_output"
"""The capability requirement of a request whose ``final_answer`` tool schema is its output schema."""

_FENCED = re.compile(r"^```[a-zA-Z]*\s*\n(?P<body>.*)\n```$", re.S)


class OutputValidationError(RunError, ValueError):
    """A final answer does not match the output type. ``problems`` lists what is wrong."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.problems,))


@dataclass(frozen=True)
class OutputSpec:
    """The schema and the validator of one output type (build with :meth:`of`)."""

    output_type: type
    schema: Mapping[str, Any]

    _cache: ClassVar[dict[type, OutputSpec]] = {}

    @classmethod
    def of(cls, output_type: Any) -> OutputSpec:
        """The spec of ``output_type`` (a dataclass or a pydantic model class); ConfigurationError
        naming the problem for anything else."""
        cached = cls._cache.get(output_type) if isinstance(output_type, type) else None
        if cached is not None:
            return cached
        if is_model_class(output_type):
            schema = dict(output_type.model_json_schema())
        elif isinstance(output_type, type) and dataclasses.is_dataclass(output_type):
            try:
                schema = schema_for_type(output_type)
            except ToolDefinitionError as exc:
                raise ConfigurationError(f"output_type {output_type.__qualname__}: {exc}") from exc
        else:
            raise ConfigurationError(
                f"output_type must be a dataclass or a pydantic model class, got {output_type!r:.80}"
            )
        if schema.get("type") != "object":
            raise ConfigurationError(f"output_type {output_type.__qualname__}: its JSON schema is not an object")
        spec = cls(output_type=output_type, schema=schema)
        cls._cache[output_type] = spec
        return spec

    def check_tools(self, tool_names: Collection[str], owner: str) -> None:
        """ConfigurationError when ``owner``'s tools already use the name of the answer's tool."""
        if FINAL_ANSWER_TOOL in tool_names:
            raise ConfigurationError(
                f"{owner} has a tool named {FINAL_ANSWER_TOOL!r}, the name its typed answer ({self.name}) is given "
                "by; rename the tool"
            )

    @property
    def name(self) -> str:
        """The type's name, as the model reads it."""
        return self.output_type.__name__

    def tool_schema(self) -> dict[str, Any]:
        """The ``final_answer`` tool a request offers for this type."""
        return {
            "name": FINAL_ANSWER_TOOL,
            "description": (
                f"Give your final answer as a {self.name} object (call this once you have it, and nothing "
                "else in the same reply)."
            ),
            "parameters": dict(self.schema),
        }

    def validate(self, data: Any) -> Any:
        """The typed value of JSON ``data``; OutputValidationError naming every problem."""
        if is_model_class(self.output_type):
            try:
                return self.output_type.model_validate(data)  # type: ignore[attr-defined]
            except ValueError as exc:  # pydantic's ValidationError is a ValueError
                raise OutputValidationError(_model_problems(exc)) from exc
        problems: list[str] = []
        compile_validator(self.schema)(data, "answer", problems)
        if problems:
            raise OutputValidationError(problems)
        try:
            return decode_value(data, self.output_type, "answer")
        except CodecError as exc:
            raise OutputValidationError([str(exc)]) from exc

    def parse(self, text: str) -> Any:
        """The typed value of a JSON text (optionally in a fenced code block)."""
        body = text.strip()
        fenced = _FENCED.match(body)
        if fenced is not None:
            body = fenced.group("body").strip()
        try:
            data = json.loads(body)
        except ValueError as exc:
            raise OutputValidationError([f"the answer is not JSON ({exc})"]) from exc
        return self.validate(data)

    def to_data(self, value: Any) -> Any:
        """The JSON-native form of a typed value (the codec's)."""
        return encode_value(value, self.output_type, "answer")

    def from_data(self, data: Any) -> Any:
        """A typed value back from :meth:`to_data` (the codec's)."""
        return decode_value(data, self.output_type, "answer")

    def feedback(self, problems: list[str]) -> str:
        """Repair advice for an answer with ``problems``."""
        return (
            f"Your final answer is not a valid {self.name}: " + "; ".join(problems) + ". Call "
            f"{FINAL_ANSWER_TOOL} again (alone) with arguments that match its schema, or reply with only that "
            "JSON object."
        )


def _model_problems(exc: ValueError) -> list[str]:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        found = [
            f"{'.'.join(str(p) for p in e.get('loc', ())) or 'answer'}: {e.get('msg', '')}"
            for e in typing.cast(list[dict[str, Any]], errors())
        ]
        if found:
            return found
    return [str(exc).splitlines()[0] if str(exc) else type(exc).__name__]
