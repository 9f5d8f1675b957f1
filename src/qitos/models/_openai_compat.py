"""``OpenAICompatibleModel``: chat completions over HTTP (OpenAI, vLLM, Ollama, llama.cpp server...).

One adapter for every server that speaks the ``/v1/chat/completions`` wire format, over ``httpx``
(a sync ``Client`` for :meth:`~OpenAICompatibleModel.complete`, an ``AsyncClient`` for
:meth:`~OpenAICompatibleModel.acomplete`; both reused across calls).

Requests: the view's provider-neutral messages become chat messages (``developer`` is sent as
``system`` unless ``developer_role`` says otherwise); assistant tool calls become
``{"id", "type": "function", "function": {"name", "arguments": "<json>"}}``; tool results become
``tool`` messages. An assistant message without text is sent with ``"content": ""``, never
``null``: OpenAI accepts both, but servers that validate with a strict schema (llama-cpp-python's
server answers HTTP 500 to a ``null``) accept only the empty string. Every tool message must
answer a call declared by the assistant message before it, and every declared call must be
answered before the next turn; otherwise a :class:`~qitos.core._errors.ContextError` is raised
before anything is sent. Tools go out in the function format.

Per-request settings from the view: :meth:`~qitos.core.request_view.RequestView.tool_choice`
becomes ``tool_choice`` (``auto``, ``required``, ``none`` or ``{"type": "function", "function":
{"name": ...}}`` for a named tool, which is also how ``required`` goes out when there is only one
tool: llama-cpp-python's server supports a named tool but not ``required``), unless the
constructor's ``tool_choice`` fixes one for every request. ``auto`` is sent explicitly whenever
there are tools: llama-cpp-python's server offers the tools to the model only when a
``tool_choice`` is given. ``view.reasoning_policy.effort`` becomes ``reasoning_effort`` (servers
without reasoning models ignore it).

A request for a typed answer (``view.output_schema()``, see ``qitos.core._output``) goes out as its
``final_answer`` tool, unless the constructor declares that the server takes a JSON schema as
``response_format``: ``"json_schema"`` (OpenAI, vLLM, llama.cpp's llama-server, Ollama:
``{"type": "json_schema", "json_schema": {"name", "schema", "strict": false}}``) or
``"json_object"`` (llama-cpp-python's server: ``{"type": "json_object", "schema": ...}``). The
``final_answer`` tool is then left out (a tool choice naming it becomes ``none``: answer now) and
the reply's text is the JSON object.

Streaming: with ``on_delta`` the request is sent with ``"stream": true`` and the server-sent
events are read as they arrive: text deltas go to ``on_delta``, tool-call deltas are accumulated
by index, usage is taken from the final chunk (``stream_options.include_usage``). ``stream=False``
never streams (``on_delta`` then receives nothing; the reply arrives whole).

A server that refuses to stream (some refuse it for requests with tools): a streamed request
answered with no event at all (before this, ``stream ended before completion ... after 0
chunks``), or with a 4xx whose message is about streaming. A plain chat completion in place of the
stream is taken as the answer (its text goes to ``on_delta`` at once); otherwise the same request is
sent again without streaming, at once and outside the retry count, and this adapter stops
streaming that kind of request (with tools, or without). Both are reported to the listeners as a
``model_retry`` with ``reason`` ``"stream refused"`` and a ``hint`` (pass ``stream=False``, or
``qitos run --no-stream``, to skip the attempt).

Usage: when a response (streamed or not) carries no ``usage``, the adapter counts the tokens
itself, prompt (the canonical JSON of the messages and tool schemas sent) and completion (text,
tool names and arguments), with :func:`~qitos.core.context.unit_counter_for` ``("tokens")``
(with the model's ``tokenizer`` when declared and known to the ``qitos-kernel[tokens]`` extra, else
``cl100k_base``, else its documented estimate), and marks the usage ``estimated``. A token budget
is therefore enforced on every server. Declare ``tokenizer`` only when it is the model's own (say
``o200k_base`` for gpt-4o): token counts are exact only then, and request views label every other
count an estimate, naming the tokenizer that counted.

Failures: 408/409/429/5xx responses and connection errors or timeouts are retried up to
``max_retries`` times with jittered exponential backoff (``backoff_base * 2**attempt``, capped at
``backoff_max``, drawn from its upper half), honouring ``Retry-After`` / ``retry-after-ms`` up to
``max_retry_after`` seconds; each retry is reported to the adapter's listeners as
``("model_retry", {"attempt", "max_retries", "delay_s", "reason", "status_code", "error"})``
(``error``: the failed attempt's message, redacted, at most 500 characters). A stream that
already delivered text is never retried (the text was shown). A request the server rejected as
invalid is never retried either: other 4xx responses (400, 404, 422...) and a 5xx whose body
says the request failed validation (some servers answer a schema error with 500) raise
:class:`~qitos.core._errors.ModelError` at once with ``status_code``, the provider's message and
``body``. A body that is not the expected JSON raises ModelError naming what is wrong.

Concurrency: at most ``max_connections`` requests are open to the server at once (default
:data:`DEFAULT_MAX_CONNECTIONS`, httpx's pool size; :meth:`~OpenAICompatibleModel.fit_connections`
raises the default, as ``qitos.eval`` does for its ``max_samples``). Under the async driver a 429
answer lowers that limit for a while instead of failing: the limit halves, the request waits the
server's ``Retry-After`` (or ``backoff_base``) and goes again without using up a retry, and each
success after the pause raises the limit by one, back to ``max_connections``. Such a retry is
reported like any other (``model_retry``), with ``concurrency``: the limit now. Only at a limit
of one do 429 answers count against ``max_retries``.

Secrets: the API key (and any header value whose name mentions key, token, auth or secret) is
replaced by ``***`` in every error message, error body, event payload and ``repr``. An adapter with
no key (and no secret header) for a server that is not on this machine or its local network warns
once, before its first request (:class:`MissingAPIKeyWarning`): such a server usually refuses the
request with HTTP 401, after the run has started.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import ipaddress
import json
import random
import re
import threading
import time
import warnings
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

import httpx

from qitos.core._codec import canonical_json
from qitos.core._errors import ConfigurationError, ContextError, ModelError
from qitos.core._output import FINAL_ANSWER_TOOL
from qitos.core.context import UnitCounter, unit_counter_for
from qitos.models._base import (
    DeltaCallback,
    ModelAdapter,
    ModelResponse,
    ToolCall,
    Unit,
    Usage,
    check_allow_model_requests,
    check_capacity,
)

if TYPE_CHECKING:
    from qitos.core.request_view import RequestView

__all__ = ["MissingAPIKeyWarning", "OpenAICompatibleModel", "to_openai_messages", "to_openai_tools"]

_RETRY_STATUS = frozenset({408, 409, 429})
DEFAULT_MAX_CONNECTIONS = 100
"""Concurrent requests to the server without ``max_connections`` (httpx's pool size), until
:meth:`OpenAICompatibleModel.fit_connections` raises it."""
# A 5xx body in which the server says it rejected the request itself (pydantic, FastAPI, OpenAI).
_VALIDATION_BODY = re.compile(
    r"validation error|validationerror|failed validation|field required|input should be|"
    r"extra inputs are not permitted|invalid_request_error|unprocessable",
    re.IGNORECASE,
)
_SECRET_HEADER_HINTS = ("key", "token", "auth", "secret")
# A 4xx body saying the request was refused for asking to stream (not, say, an "upstream" error).
_ABOUT_STREAMING = re.compile(r"\bstream", re.IGNORECASE)


class MissingAPIKeyWarning(UserWarning):
    """An OpenAI-compatible model has no API key for a server that is not local (warned once)."""


@dataclass(frozen=True)
class _Failure:
    message: str
    retryable: bool
    status_code: int | None = None
    body: str | None = None
    retry_after: float | None = None
    reason: str = ""
    stream_refused: bool = False  # a 2xx answer to a streamed request that held no stream at all


class OpenAICompatibleModel(ModelAdapter):
    """A chat-completions model over HTTP. See the module docstring for behaviour.

    ``base_url`` is the API root (``http://127.0.0.1:8000/v1``); ``/chat/completions`` is added
    unless the URL already ends with it. Capacity is whatever you declare (``max_input_units`` in
    ``unit``), never derived from ``model``.
    """

    provider = "openai-compatible"
    transport = "http"

    def __init__(
        self,
        model: str,
        *,
        base_url: str,
        api_key: str | None = None,
        max_input_units: int | None = None,
        unit: Unit = "tokens",
        tokenizer: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        temperature: float | None = None,
        max_tokens: int | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        response_format: Literal["json_schema", "json_object"] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        developer_role: str = "system",
        stream: bool = True,
        stream_usage: bool = True,
        backoff_base: float = 0.5,
        backoff_max: float = 8.0,
        max_retry_after: float = 60.0,
        max_connections: int | None = None,
        transport: httpx.BaseTransport | None = None,
        async_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        check_capacity(max_input_units, unit)
        if not isinstance(model, str) or not model:
            raise ConfigurationError(f"model must be a non-empty string, got {model!r}")
        if not base_url.startswith(("http://", "https://")):
            raise ConfigurationError(f"base_url must start with http:// or https://, got {base_url!r}")
        if timeout <= 0:
            raise ConfigurationError(f"timeout must be > 0 seconds, got {timeout}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigurationError(f"max_retries must be an int >= 0, got {max_retries!r}")
        if backoff_base < 0 or backoff_max < 0 or max_retry_after < 0:
            raise ConfigurationError("backoff_base, backoff_max and max_retry_after must be >= 0")
        if response_format not in (None, "json_schema", "json_object"):
            raise ConfigurationError(
                f"response_format must be 'json_schema', 'json_object' or None, got {response_format!r}"
            )
        if max_connections is not None and (
            isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1
        ):
            raise ConfigurationError(f"max_connections must be an int >= 1 or None, got {max_connections!r}")
        self.model_id = model
        self.max_input_units = max_input_units
        self.unit = unit
        if tokenizer is not None and (not isinstance(tokenizer, str) or not tokenizer):
            raise ConfigurationError(f"tokenizer must be a tokenizer name or None, got {tokenizer!r}")
        self.tokenizer = tokenizer
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url if self.base_url.endswith("/chat/completions") else self.base_url + "/chat/completions"
        self.timeout = timeout
        self.max_retries = max_retries
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.tool_choice = tool_choice
        self.response_format = response_format
        self.extra_body = dict(extra_body or {})
        self.developer_role = developer_role
        self.stream = stream
        self.stream_usage = stream_usage
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.max_retry_after = max_retry_after
        self._headers = {"Content-Type": "application/json", **dict(headers or {})}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._secrets = tuple(
            s for s in [api_key or "", *(v for k, v in (headers or {}).items() if _looks_secret(k))] if len(s) >= 4
        )
        self._transport = transport
        self._async_transport = async_transport
        self._client: httpx.Client | None = None
        self._fixed_connections = max_connections is not None
        self.max_connections = max_connections if max_connections is not None else DEFAULT_MAX_CONNECTIONS
        self._aclients: dict[int, tuple[asyncio.AbstractEventLoop, _Shards, _Gate]] = {}
        self._client_lock = threading.Lock()
        self._tokens: UnitCounter | None = None
        # Kinds of request (with tools: True) the server refused to stream: they are sent unstreamed.
        self._stream_refused: set[bool] = set()
        self._key_checked = False

    # ------------------------------------------------------------------ public

    def complete(self, view: RequestView, *, on_delta: DeltaCallback | None = None) -> ModelResponse:
        """Send the view as a chat completion (streamed when ``on_delta`` is given and ``stream``)."""
        check_allow_model_requests()
        stream = self._streams(view, on_delta)
        body, headers, estimator = self._prepare(view, stream=stream)
        client = self._sync_client()
        attempt = 0
        while True:
            try:
                if on_delta is None or not stream:
                    response = client.post(self.url, content=body, headers=headers)
                    if response.status_code < 300:
                        return estimator.complete(self._parse_body(response.content))
                    failure = self._http_failure(response.status_code, response.headers, response.content)
                else:
                    with client.stream("POST", self.url, content=body, headers=headers) as response:
                        if response.status_code < 300:
                            read = self._read_stream(response.iter_lines(), on_delta)
                            if isinstance(read, ModelResponse):
                                return estimator.complete(read)
                            failure = read
                        else:
                            failure = self._http_failure(response.status_code, response.headers, response.read())
            except httpx.TransportError as exc:
                failure = self._transport_failure(exc)
            if stream and self._stream_refusal(view, failure):
                stream = False
                body, headers, estimator = self._prepare(view, stream=False)
                continue
            delay = self._retry_delay(failure, attempt)
            attempt += 1
            time.sleep(delay)

    async def acomplete(self, view: RequestView, *, on_delta: DeltaCallback | None = None) -> ModelResponse:
        """Async twin of :meth:`complete` over ``httpx.AsyncClient``."""
        check_allow_model_requests()
        stream = self._streams(view, on_delta)
        body, headers, estimator = self._prepare(view, stream=stream)
        client, gate = self._async_client()
        attempt = 0
        while True:
            await gate.acquire()
            try:
                if on_delta is None or not stream:
                    response = await client.post(self.url, content=body, headers=headers)
                    if response.status_code < 300:
                        gate.succeeded()
                        return estimator.complete(self._parse_body(response.content))
                    failure = self._http_failure(response.status_code, response.headers, response.content)
                else:
                    async with client.stream("POST", self.url, content=body, headers=headers) as response:
                        if response.status_code < 300:
                            gate.succeeded()
                            read = await self._aread_stream(response.aiter_lines(), on_delta)
                            if isinstance(read, ModelResponse):
                                return estimator.complete(read)
                            failure = read
                        else:
                            failure = self._http_failure(response.status_code, response.headers, await response.aread())
            except httpx.TransportError as exc:
                failure = self._transport_failure(exc)
            finally:
                gate.release()
            if stream and self._stream_refusal(view, failure):
                stream = False
                body, headers, estimator = self._prepare(view, stream=False)
                continue
            if failure.status_code == 429 and gate.limit > 1:
                # Too many at once: fewer requests in flight for a while, and this one waits its turn
                # again without using up a retry (at one request in flight, retries count again).
                pause = min(gate.throttled(failure.retry_after or self.backoff_base), self.max_retry_after)
                self.emit(
                    "model_retry",
                    {
                        "model": self.model_id,
                        "attempt": attempt + 1,
                        "max_retries": self.max_retries,
                        "delay_s": round(pause, 4),
                        "reason": failure.reason,
                        "status_code": 429,
                        "error": failure.message[:500],
                        "concurrency": gate.limit,
                    },
                )
                await asyncio.sleep(pause)
                continue
            delay = self._retry_delay(failure, attempt)
            attempt += 1
            await asyncio.sleep(delay)

    def fit_connections(self, in_flight: int) -> None:
        """Allow at least ``in_flight`` concurrent requests, unless ``max_connections`` was given.

        ``qitos.eval`` calls it with its ``max_samples``, so every sample in flight can have its
        request open; a cap given to the constructor is kept as it is.
        """
        if self._fixed_connections or in_flight <= self.max_connections:
            return
        self.max_connections = in_flight
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
        # Async clients are sized when made: the next request of each event loop makes a new one.
        stale = [client for entry in self._aclients.values() for client in entry[1].clients]
        self._aclients.clear()
        for old in stale:
            with contextlib.suppress(RuntimeError):  # no loop running here: nothing left to close
                asyncio.get_running_loop().create_task(old.aclose())

    def close(self) -> None:
        """Close the sync HTTP client (async clients: :meth:`aclose`)."""
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    async def aclose(self) -> None:
        """Close the async HTTP client of the running event loop, and the sync one."""
        loop = asyncio.get_running_loop()
        entry = self._aclients.pop(id(loop), None)
        if entry is not None:
            for client in entry[1].clients:
                await client.aclose()
        self.close()

    def __enter__(self) -> OpenAICompatibleModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def api_key(self) -> str | None:
        """The API key, for trace writers that redact it (never shown by ``repr`` or errors)."""
        auth = self._headers.get("Authorization", "")
        return auth.removeprefix("Bearer ") if auth else None

    def secrets(self) -> tuple[str, ...]:
        """Every secret this adapter sends (API key, secret-looking header values), for redaction."""
        return self._secrets

    def describe(self) -> dict[str, Any]:
        """Adapter, model id, declared capacity and the (redacted) base URL."""
        return {**super().describe(), "base_url": self._redact(self.base_url)}

    def __repr__(self) -> str:
        return (
            f"OpenAICompatibleModel(model={self.model_id!r}, base_url={self._redact(self.base_url)!r}, "
            f"max_input_units={self.max_input_units!r}, unit={self.unit!r})"
        )

    # ------------------------------------------------------------------ request building (I/O-free)

    def build_payload(self, view: RequestView, *, stream: bool = False) -> dict[str, Any]:
        """The JSON body this adapter sends for ``view``."""
        payload: dict[str, Any] = {
            "model": self.model_id,
            "messages": to_openai_messages(view.messages(), developer_role=self.developer_role),
        }
        tools = view.tools()
        wanted = view.tool_choice()
        output = view.output_schema() if self.response_format is not None else None
        if output is not None:
            payload["response_format"] = _response_format(self.response_format, output)
            tools = [t for t in tools if t["name"] != FINAL_ANSWER_TOOL]
            wanted = "none" if wanted == FINAL_ANSWER_TOOL else wanted
        if tools:
            payload["tools"] = to_openai_tools(tools)
            choice = self.tool_choice if self.tool_choice is not None else _tool_choice(wanted, tools)
            if choice is not None:
                payload["tool_choice"] = choice
        effort = view.reasoning_policy.effort
        if effort is not None:
            payload["reasoning_effort"] = effort
        if self.temperature is not None:
            payload["temperature"] = self.temperature
        if self.max_tokens is not None:
            payload["max_tokens"] = self.max_tokens
        if stream:
            payload["stream"] = True
            if self.stream_usage:
                payload["stream_options"] = {"include_usage": True}
        payload.update(self.extra_body)
        return payload

    def _prepare(self, view: RequestView, *, stream: bool) -> tuple[bytes, dict[str, str], _Estimator]:
        if not self._key_checked:
            self._warn_without_key()
        payload = self.build_payload(view, stream=stream)
        try:
            body = json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise ContextError(f"request for {self.model_id!r} is not JSON-serializable: {exc}") from exc
        headers = self._headers if not stream else {**self._headers, "Accept": "text/event-stream"}
        return body, headers, _Estimator(self, payload)

    def _warn_without_key(self) -> None:
        """Warn once, before the first request, when a remote server gets no credentials."""
        with self._client_lock:
            if self._key_checked:
                return
            self._key_checked = True
        if not self._secrets and not _is_local(self.base_url):
            warnings.warn(
                MissingAPIKeyWarning(
                    f"{self.model_id} at {self._redact(self.base_url)}: no API key is set for a server that is not on "
                    "this machine; it will likely refuse the requests (HTTP 401). Set $OPENAI_API_KEY (or "
                    "$QITOS_API_KEY for qitos run) or pass OpenAICompatibleModel(api_key=...)."
                ),
                stacklevel=4,
            )

    def _token_counter(self) -> UnitCounter:
        """The counter for usage estimates (created on first use: most servers report usage)."""
        counter = self._tokens
        if counter is None:
            counter = self._tokens = unit_counter_for("tokens", tokenizer=self.tokenizer)
        return counter

    # ------------------------------------------------------------------ clients

    def _sync_client(self) -> httpx.Client:
        client = self._client
        if client is None:
            with self._client_lock:
                if self._client is None:
                    self._client = httpx.Client(
                        timeout=httpx.Timeout(self.timeout), transport=self._transport, limits=self._limits()
                    )
                client = self._client
        return client

    def _async_client(self) -> tuple[httpx.AsyncClient, _Gate]:
        # An AsyncClient belongs to the loop it was first used on; keep them per live loop, with
        # the gate that holds the loop's requests in flight to the (adaptive) concurrency limit.
        # Many connections are split over several clients of at most _SHARD each, taken in turn:
        # httpcore's pool scans all its connections for every request it places, so one pool of
        # a thousand connections costs far more CPU per request than many small ones.
        loop = asyncio.get_running_loop()
        entry = self._aclients.get(id(loop))
        if entry is None or entry[0] is not loop:
            for key, (old_loop, _, _) in list(self._aclients.items()):
                if old_loop.is_closed():
                    del self._aclients[key]
            shards = -(-self.max_connections // _SHARD)
            per_shard = -(-self.max_connections // shards)
            limits = httpx.Limits(max_connections=per_shard, max_keepalive_connections=per_shard)
            tls = httpx.create_ssl_context()  # one for all the shards: each costs a read of the CA bundle
            clients = _Shards(
                [
                    httpx.AsyncClient(
                        timeout=httpx.Timeout(self.timeout),
                        transport=self._async_transport,
                        limits=limits,
                        verify=tls,
                    )
                    for _ in range(shards)
                ]
            )
            entry = (loop, clients, _Gate(self.max_connections))
            self._aclients[id(loop)] = entry
        return entry[1].next(), entry[2]

    def _limits(self) -> httpx.Limits:
        return httpx.Limits(max_connections=self.max_connections, max_keepalive_connections=self.max_connections)

    @property
    def concurrency(self) -> int:
        """Requests allowed in flight now on this thread's event loop (below ``max_connections`` for
        a while after the server answered 429); ``max_connections`` outside a loop."""
        try:
            entry = self._aclients.get(id(asyncio.get_running_loop()))
        except RuntimeError:
            return self.max_connections
        return entry[2].limit if entry is not None else self.max_connections

    # ------------------------------------------------------------------ failures and retries

    def _http_failure(self, status: int, headers: httpx.Headers, content: bytes) -> _Failure:
        text = self._redact(content.decode("utf-8", errors="replace"))
        detail = _provider_message(text)
        message = f"{self.model_id} at {self._redact(self.url)}: HTTP {status}: {detail}"
        retryable = status in _RETRY_STATUS or (status >= 500 and not _VALIDATION_BODY.search(text))
        retry_after = _retry_after(headers) if retryable else None
        return _Failure(message, retryable, status, text, retry_after, f"HTTP {status}")

    def _transport_failure(self, exc: httpx.TransportError) -> _Failure:
        if isinstance(exc, httpx.TimeoutException):
            detail = f"timed out after {self.timeout} s ({type(exc).__name__})"
            short = f"{type(exc).__name__} after {self.timeout} s"
        else:
            detail = f"connection failed ({type(exc).__name__}: {exc})"
            short = f"{type(exc).__name__}: {exc}"
        message = f"{self.model_id} at {self._redact(self.url)}: {self._redact(detail)}"
        return _Failure(message, True, reason=self._redact(short))

    def _retry_delay(self, failure: _Failure, attempt: int) -> float:
        """Seconds to wait before the next attempt; raises ModelError when there is none."""
        if not failure.retryable:
            raise ModelError(failure.message, status_code=failure.status_code, body=failure.body)
        if attempt >= self.max_retries:
            tries = attempt + 1
            raise ModelError(
                f"{failure.message} (gave up after {tries} attempt{'s' if tries > 1 else ''})",
                status_code=failure.status_code,
                body=failure.body,
            )
        if failure.retry_after is not None:
            if failure.retry_after > self.max_retry_after:
                raise ModelError(
                    f"{failure.message} (server asked to retry after {failure.retry_after:.0f} s, more than "
                    f"max_retry_after={self.max_retry_after:.0f} s)",
                    status_code=failure.status_code,
                    body=failure.body,
                )
            delay = failure.retry_after
        else:
            ceiling = min(self.backoff_max, self.backoff_base * (2**attempt))
            delay = ceiling / 2 + random.uniform(0, ceiling / 2)
        self.emit(
            "model_retry",
            {
                "model": self.model_id,
                "attempt": attempt + 1,
                "max_retries": self.max_retries,
                "delay_s": round(delay, 4),
                "reason": failure.reason,
                "status_code": failure.status_code,
                "error": failure.message[:500],
            },
        )
        return delay

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    # ------------------------------------------------------------------ responses

    def _parse_body(self, content: bytes) -> ModelResponse:
        try:
            data = json.loads(content)
        except ValueError as exc:
            excerpt = self._redact(content[:200].decode("utf-8", errors="replace"))
            raise ModelError(
                f"{self.model_id}: malformed response body, not JSON ({exc}): {excerpt!r}",
                status_code=200,
                body=self._redact(content.decode("utf-8", errors="replace")),
            ) from exc
        return self._parse_completion(data)

    def _parse_completion(self, data: Any) -> ModelResponse:
        def bad(problem: str) -> ModelError:
            body = self._redact(json.dumps(data, ensure_ascii=False)[:4000])
            return ModelError(f"{self.model_id}: malformed chat completion: {problem}", status_code=200, body=body)

        if not isinstance(data, dict):
            raise bad(f"expected a JSON object, got {type(data).__name__}")
        if data.get("error"):
            raise bad(f"provider error in a 200 response: {self._redact(_provider_message(json.dumps(data)))}")
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            raise bad("no 'choices'")
        choice = choices[0]
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            raise bad("choices[0] has no 'message' object")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            content = _content_text(content)
        calls = []
        for i, raw_call in enumerate(message.get("tool_calls") or ()):
            function = raw_call.get("function") if isinstance(raw_call, dict) else None
            if not isinstance(function, dict):
                raise bad(f"tool_calls[{i}] has no 'function' object")
            arguments = function.get("arguments", "")
            raw_arguments = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
            calls.append(
                ToolCall.from_raw(
                    id=str(raw_call.get("id") or f"call_{i}"),
                    name=str(function.get("name") or ""),
                    raw_arguments=raw_arguments,
                )
            )
        return ModelResponse(
            text=content,
            tool_calls=tuple(calls),
            usage=_usage(data.get("usage")) if isinstance(data.get("usage"), dict) else _NO_USAGE,
            finish_reason=choice.get("finish_reason"),
            model=str(data.get("model") or self.model_id),
            raw=data,
        )

    def _read_stream(self, lines: Iterable[str], on_delta: DeltaCallback) -> ModelResponse | _Failure:
        acc = _StreamAccumulator(self, on_delta)
        try:
            for line in lines:
                acc.feed(line)
                if acc.done:
                    break
        except httpx.TransportError as exc:
            acc.interrupted(exc)
        return self._stream_outcome(acc)

    async def _aread_stream(self, lines: Any, on_delta: DeltaCallback) -> ModelResponse | _Failure:
        acc = _StreamAccumulator(self, on_delta)
        try:
            async for line in lines:
                acc.feed(line)
                if acc.done:
                    break
        except httpx.TransportError as exc:
            acc.interrupted(exc)
        return self._stream_outcome(acc)

    def _stream_outcome(self, acc: _StreamAccumulator) -> ModelResponse | _Failure:
        """The stream's response; or, for an answer that held no event at all, the completion the
        server sent instead of a stream, or a refusal to stream (sent again unstreamed)."""
        acc.flush()
        if acc.chunks or acc.done:
            return acc.result()
        text = "\n".join(acc.other_lines).strip()
        try:
            data = json.loads(text) if text else None
        except ValueError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("choices"), list) and not data.get("error"):
            response = self._parse_completion(data)  # the server answered without streaming
            if response.text:
                acc.on_delta(response.text)
            return response
        detail = _provider_message(self._redact(text)) if text else "an empty body"
        return _Failure(
            f"{self.model_id} at {self._redact(self.url)}: a streamed request was answered without any "
            f"event ({detail})",
            False,
            200,
            self._redact(text) or None,
            reason="stream refused",
            stream_refused=True,
        )

    def _streams(self, view: RequestView, on_delta: DeltaCallback | None) -> bool:
        """Whether this request is sent streamed: asked for, allowed, and not of a refused kind."""
        return on_delta is not None and self.stream and bool(view.tool_schemas_json) not in self._stream_refused

    def _stream_refusal(self, view: RequestView, failure: _Failure) -> bool:
        """Whether a streamed request's failure is the server refusing to stream; if so, that kind
        of request is sent unstreamed from now on and the listeners get the hint."""
        refused = failure.stream_refused or (
            failure.status_code is not None
            and 400 <= failure.status_code < 500
            and failure.status_code not in _RETRY_STATUS
            and _ABOUT_STREAMING.search(failure.body or "") is not None
        )
        if not refused:
            return False
        with_tools = bool(view.tool_schemas_json)
        self._stream_refused.add(with_tools)
        kind = "a request with tools" if with_tools else "a request"
        hint = (
            f"the server did not stream {kind} ({failure.message}); it was sent again without streaming, "
            f"as every such request to it will be. Pass stream=False (qitos run --no-stream) to skip the attempt."
        )
        self.emit(
            "model_retry",
            {
                "model": self.model_id,
                "attempt": 1,
                "max_retries": self.max_retries,
                "delay_s": 0.0,
                "reason": "stream refused",
                "status_code": failure.status_code,
                "error": failure.message[:500],
                "hint": hint,
            },
        )
        return True


class _StreamAccumulator:
    """Assembles a ModelResponse from chat-completion SSE lines (I/O-free)."""

    def __init__(self, model: OpenAICompatibleModel, on_delta: DeltaCallback) -> None:
        self.model = model
        self.on_delta = on_delta
        self.text: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}
        self.data_lines: list[str] = []
        self.finish_reason: str | None = None
        self.usage: Any = None
        self.model_name = ""
        self.response_id = ""
        self.chunks = 0
        self.delivered = 0
        self.done = False
        self.other_lines: list[str] = []  # what is not server-sent events: a body in place of a stream
        self._other_size = 0

    def feed(self, line: str) -> None:
        line = line.rstrip("\r")
        if not line:
            self._dispatch()
        elif line.startswith("data:"):
            self.data_lines.append(line[5:].removeprefix(" "))
        elif not line.startswith((":", "event:", "id:", "retry:")) and self._other_size < _MAX_NON_EVENT_TEXT:
            self.other_lines.append(line)
            self._other_size += len(line)
        # other SSE fields (event:, id:, retry:) and comments (":") carry nothing we need

    def flush(self) -> None:
        """Dispatch the last event when the stream ended without its blank line."""
        self._dispatch()

    def _dispatch(self) -> None:
        if not self.data_lines:
            return
        data, self.data_lines = "\n".join(self.data_lines), []
        if data.strip() == "[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except ValueError as exc:
            raise ModelError(
                f"{self.model.model_id}: malformed stream chunk, not JSON ({exc}): {self.model._redact(data[:200])!r}",
                status_code=200,
                body=self.model._redact(data),
            ) from exc
        if not isinstance(chunk, dict):
            raise ModelError(f"{self.model.model_id}: malformed stream chunk: expected an object", status_code=200)
        if chunk.get("error"):
            detail = self.model._redact(_provider_message(json.dumps(chunk)))
            raise ModelError(f"{self.model.model_id}: provider error in stream: {detail}", status_code=200)
        self.chunks += 1
        self.model_name = chunk.get("model") or self.model_name
        self.response_id = chunk.get("id") or self.response_id
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if isinstance(content, str) and content:
                self.text.append(content)
                self.delivered += 1
                self.on_delta(content)
            for tc in delta.get("tool_calls") or ():
                self._merge_call(tc)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def _merge_call(self, tc: object) -> None:
        if not isinstance(tc, dict):
            return
        index = tc.get("index")
        slot = self.calls.setdefault(index if isinstance(index, int) else len(self.calls), {})
        slot.setdefault("id", "")
        slot.setdefault("name", "")
        slot.setdefault("arguments", "")
        if tc.get("id"):
            slot["id"] = str(tc["id"])
        function = tc.get("function") or {}
        name = function.get("name")
        if name and name != slot["name"]:  # some servers repeat the full name in every delta
            slot["name"] += str(name)
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            slot["arguments"] += arguments
        elif arguments is not None:
            slot["arguments"] += json.dumps(arguments, ensure_ascii=False)

    def interrupted(self, exc: httpx.TransportError) -> None:
        if self.delivered:
            raise ModelError(
                f"{self.model.model_id}: stream interrupted after {self.delivered} text chunks "
                f"({type(exc).__name__}); not retried because text was already delivered"
            ) from exc
        raise exc

    def result(self) -> ModelResponse:
        self.flush()
        if not self.done and self.finish_reason is None:
            raise ModelError(
                f"{self.model.model_id}: stream ended before completion (no [DONE] and no finish_reason "
                f"after {self.chunks} chunks)",
                status_code=200,
            )
        calls = tuple(
            ToolCall.from_raw(id=slot["id"] or f"call_{i}", name=slot["name"], raw_arguments=slot["arguments"])
            for i, slot in sorted(self.calls.items())
        )
        text = "".join(self.text)
        return ModelResponse(
            text=text if (text or not calls) else None,
            tool_calls=calls,
            usage=_usage(self.usage) if isinstance(self.usage, dict) else _NO_USAGE,
            finish_reason=self.finish_reason,
            model=self.model_name or self.model.model_id,
            raw={
                "id": self.response_id,
                "object": "chat.completion.stream",
                "chunks": self.chunks,
                "usage": self.usage,
            },
        )


_MAX_NON_EVENT_TEXT = 1 << 20
"""How much text that is not server-sent events a streamed answer may hold (kept to read it as a body)."""

_NO_USAGE = Usage()
"""The usage of a response that carried none (replaced by the estimator's count); compared by identity."""


class _Estimator:
    """Fills in the usage of a response whose server reported none, by counting tokens locally."""

    def __init__(self, model: OpenAICompatibleModel, payload: Mapping[str, Any]) -> None:
        self.model = model
        self.payload = payload

    def complete(self, response: ModelResponse) -> ModelResponse:
        if response.usage is not _NO_USAGE:
            return response
        counter = self.model._token_counter()
        prompt = sum(counter.count(canonical_json(m)) for m in self.payload["messages"])
        prompt += sum(counter.count(canonical_json(t)) for t in self.payload.get("tools") or ())
        completion = counter.count(response.text or "")
        completion += sum(counter.count(c.name) + counter.count(c.raw_arguments) for c in response.tool_calls)
        usage = Usage(input_tokens=prompt, output_tokens=completion, estimated=True)
        return replace(response, usage=usage)


def _tool_choice(choice: str | None, tools: Sequence[Mapping[str, object]]) -> str | dict[str, Any] | None:
    """The ``tool_choice`` to send for a view's tool choice (None: the request has no tools).

    ``required`` with exactly one tool is sent as that tool's name: the same demand, and the form
    that llama-cpp-python's function-calling handler supports (it fails on ``"required"``)."""
    if choice == "required" and len(tools) == 1:
        choice = str(tools[0]["name"])
    if choice is None or choice in ("auto", "required", "none"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def _response_format(kind: str | None, schema: Mapping[str, object]) -> dict[str, Any]:
    """The ``response_format`` asking for a JSON object matching ``schema``, in the server's form."""
    if kind == "json_object":
        return {"type": "json_object", "schema": dict(schema)}
    return {"type": "json_schema", "json_schema": {"name": FINAL_ANSWER_TOOL, "schema": dict(schema), "strict": False}}


# ---------------------------------------------------------------------- conversions


def to_openai_tools(tools: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Provider-neutral tool schemas in the OpenAI function-tool format."""
    return [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description") or "",
                "parameters": dict(t.get("parameters") or {"type": "object", "properties": {}}),
            },
        }
        for t in tools
    ]


def to_openai_messages(
    messages: Iterable[Mapping[str, Any]], *, developer_role: str = "system"
) -> list[dict[str, Any]]:
    """Provider-neutral messages as chat-completion messages, checking call/result pairing.

    Raises ContextError for a tool result without a preceding call, or a call left unanswered
    when the conversation moves on.
    """
    out: list[dict[str, Any]] = []
    pending: dict[str, str] = {}
    for i, msg in enumerate(messages):
        role = msg.get("role")
        if role != "tool" and pending:
            _unanswered(pending, i)
        if role == "assistant":
            item: dict[str, Any] = {"role": "assistant", "content": _text(msg.get("content"))}
            calls = msg.get("tool_calls") or ()
            if calls:
                item["tool_calls"] = []
                for call in calls:
                    call_id = str(call.get("id") or "")
                    if not call_id:
                        raise ContextError(f"message {i}: an assistant tool call has no id")
                    pending[call_id] = str(call.get("name"))
                    item["tool_calls"].append(
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": call.get("name"), "arguments": _arguments_text(call.get("arguments"))},
                        }
                    )
            out.append(item)
        elif role == "tool":
            call_id = str(msg.get("tool_call_id") or "")
            if call_id not in pending:
                raise ContextError(
                    f"message {i}: tool result for call {call_id!r} without a preceding assistant call declaring it"
                )
            del pending[call_id]
            out.append({"role": "tool", "tool_call_id": call_id, "content": _text(msg.get("content"))})
        elif role in ("system", "user", "developer"):
            out.append({"role": developer_role if role == "developer" else role, "content": _text(msg.get("content"))})
        else:
            raise ContextError(f"message {i}: unknown role {role!r}")
    if pending:
        _unanswered(pending, None)
    return out


def _unanswered(pending: Mapping[str, str], index: int | None) -> None:
    where = f"before message {index}" if index is not None else "at the end of the request"
    calls = ", ".join(f"{cid} ({name})" for cid, name in pending.items())
    raise ContextError(f"assistant tool calls without results {where}: {calls}")


def _text(content: object) -> Any:
    if content is None:
        return ""
    if isinstance(content, str | list):
        return content
    return json.dumps(content, ensure_ascii=False)


def _arguments_text(arguments: object) -> str:
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False)


def _content_text(content: object) -> str:
    """Text of a content-part list (``[{"type": "text", "text": ...}]``)."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _usage(data: object) -> Usage:
    if not isinstance(data, dict):
        return Usage()
    prompt = data.get("prompt_tokens", data.get("input_tokens", 0))
    completion = data.get("completion_tokens", data.get("output_tokens", 0))
    return Usage(
        input_tokens=prompt if isinstance(prompt, int) else 0,
        output_tokens=completion if isinstance(completion, int) else 0,
    )


def _provider_message(text: str) -> str:
    """The provider's error message from an error body (several common shapes), else an excerpt."""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str) and error:
            return error
        for key in ("message", "detail"):
            if data.get(key):
                return str(data[key])
    excerpt = text.strip()
    return (excerpt[:300] + "...") if len(excerpt) > 300 else (excerpt or "(empty body)")


def _retry_after(headers: httpx.Headers) -> float | None:
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _is_local(url: str) -> bool:
    """Whether ``url``'s host is this machine or an address of a private network."""
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name: nothing says it is local
    return address.is_loopback or address.is_private or address.is_unspecified


def _looks_secret(header_name: str) -> bool:
    lowered = header_name.lower()
    return any(hint in lowered for hint in _SECRET_HEADER_HINTS)


_SHARD = 8  # connections per async client (see _async_client; 8 took the least CPU in bench/eval.py)


class _Shards:
    """An event loop's async clients, handed out in turn."""

    def __init__(self, clients: list[httpx.AsyncClient]) -> None:
        self.clients = clients
        self._turn = 0

    def next(self) -> httpx.AsyncClient:
        self._turn = (self._turn + 1) % len(self.clients)
        return self.clients[self._turn]


class _Gate:
    """Holds an event loop's requests in flight to ``limit``, which 429 answers lower for a while.

    A 429 halves the limit (down to 1; the other 429s of the same pause do not) and starts a
    pause of the server's ``Retry-After`` (or the base backoff); after the pause each success
    raises it by one, back up to ``ceiling`` (additive increase, multiplicative decrease).
    """

    def __init__(self, ceiling: int) -> None:
        self.ceiling = ceiling
        self.limit = ceiling
        self.in_flight = 0
        self.calm_after = 0.0
        self.lower_again_after = 0.0
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> None:
        while self.in_flight >= self.limit:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif not waiter.cancelled():
                    self._wake()  # it was woken for a slot it will not take: pass it on
                raise
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight -= 1
        self._wake()

    def throttled(self, pause: float) -> float:
        now = time.monotonic()
        # The 429s of one pause lower the limit once (they answer requests sent before it fell);
        # 429s that keep coming after it lower it again, so a steady stream cannot pin it high.
        if now >= self.lower_again_after:
            self.limit = max(1, min(self.limit, self.in_flight + 1) // 2)
            self.lower_again_after = now + pause
        self.calm_after = max(self.calm_after, now + pause)
        return pause

    def succeeded(self) -> None:
        if self.limit < self.ceiling and time.monotonic() >= self.calm_after:
            self.limit += 1
            self._wake()

    def _wake(self) -> None:
        free = self.limit - self.in_flight
        while free > 0 and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                free -= 1
