"""The one redaction policy: what qitos removes before anything is written to disk or shown.

Pure (no I/O). Everything that persists or displays run data goes through a :class:`Redactor`: the
trace files, what a session writes to its checkpoint store (task and metadata, decisions and tool
arguments, tool results and error text, exchange-log entries, the stored request view), the engine's
events, ``qitos sessions show`` / the viewer's session pages, and error messages shown by the CLI.

What is replaced by ``[REDACTED]``:

- **configured credentials**, always: every exact value added to the redactor. The engine and the
  session runtime add the bound model's ``api_key`` and everything its ``secrets()`` returns (see
  :func:`model_credentials`); values shorter than 4 characters are ignored (they would match
  everywhere);
- **token shapes**: ``sk-…`` keys, ``Bearer …`` tokens, GitHub tokens (``ghp_…``, ``github_pat_…``)
  and the password of a URL of any scheme, in its user part (``scheme://user:password@host``,
  ``redis://:password@host``) or in its query (the value of a ``password``, ``passwd``, ``pwd``,
  ``secret``, ``token``, ``api_key``, ``apikey`` or ``access_token`` parameter, in any case, as in
  ``postgresql://app@/db?host=/run&password=…``);
- **secret fields**: the string value of a field named like ``api_key``, ``authorization``,
  ``x-api-key``, ``access_token``, ``secret`` or ``password`` — as a key of a mapping (see
  :meth:`Redactor.redact_value`) or inside JSON text at any nesting depth.

What a redacted stored value means: redaction happens before the store sees the data, so the
durable copy never holds the secret. A session restored from the store (in this process or any
other) continues from what was stored: its state, its pending decision's tool arguments and its
exchange log contain the marker ``[REDACTED]`` where the secret was, never the secret. The exchange
log redacts what it records as it records it (``ExchangeLog.redactor``), so what the model is sent
is what is stored, in the live run too; only the live agent state and the live decision (the tool
call arguments the engine executes) keep the real values, until a restore. Put credentials in
configuration (the model adapter, the environment, a tool's closure), not in a task or in agent
state, when a restored session must still be able to use them.

Redaction cannot know every secret: a value that is neither configured nor shaped like a token
passes unchanged. It only ever shortens or replaces text; JSON text stays valid JSON.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["REDACTED", "Redactor", "model_credentials", "redact_text"]

REDACTED = "[REDACTED]"

_MIN_SECRET = 4

# Token shapes. Each is only searched for when its cheap marker occurs in the text (see _SHAPES).
_BEARER = re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}")
_SK = re.compile(r"\bsk-[A-Za-z0-9_-]{8,}")
_GITHUB = re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})")
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s/:@\"']*:)([^\s/@\"']+)(@)")
# A secret query parameter's value; it ends where the parameter does, or at a quote or backslash (so
# the JSON text holding the URL stays valid).
_URL_QUERY_SECRET = re.compile(
    r"(?i)([?&;](?:password|passwd|pwd|secret|token|api[_-]?key|access[_-]?token)=)([^&#;\s\"'<>\\]+)"
)

# The start of a secret field's string value: "api_key": " as JSON text, or the same nested inside a
# JSON string at any depth (\"api_key\": \"). Group 1 is the backslashes escaping the quotes there.
_SECRET_FIELD = re.compile(
    r"(?i)\"(?:api[_-]?key|authorization|x-api-key|access[_-]?token|secret|password)(\\*)\"\s*:\s*\1\""
)
# The same names as mapping keys (redact_value): matched case-insensitively against the whole key.
_SECRET_KEY = re.compile(r"(?i)(?:api[_-]?key|authorization|x-api-key|access[_-]?token|secret|password)")


class Redactor:
    """Replaces configured secret values, token shapes and secret fields with ``[REDACTED]``.

    ``Redactor(secrets)`` covers the given exact values plus the shapes in the module docstring;
    :meth:`add` covers one more value from then on. Call it on text, or use :meth:`redact_value` on
    JSON-native data.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        kept = {s for s in secrets if isinstance(s, str) and len(s) >= _MIN_SECRET}
        self._secrets = sorted(kept, key=len, reverse=True)

    @property
    def secrets(self) -> tuple[str, ...]:
        """The exact values covered (longest first)."""
        return tuple(self._secrets)

    def add(self, secret: str | None) -> None:
        """Also redact this exact value from now on (ignored when shorter than 4 characters)."""
        if isinstance(secret, str) and len(secret) >= _MIN_SECRET and secret not in self._secrets:
            self._secrets.append(secret)
            self._secrets.sort(key=len, reverse=True)

    def add_all(self, secrets: Iterable[str]) -> None:
        """:meth:`add` each value."""
        for secret in secrets:
            self.add(secret)

    def __call__(self, text: str) -> str:
        """``text`` with every secret replaced (the same object when nothing matched)."""
        if len(text) < _MIN_SECRET:
            return text
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return _redact_shapes(text)

    def redact_value(self, value: Any) -> Any:
        """JSON-native ``value`` with every string redacted and the string value of every secret
        field (a mapping key such as ``api_key`` or ``password``) replaced by the marker.

        Containers are copied only where something changed; an untouched value is returned as is.
        """
        kind = type(value)
        if kind is str:
            return self(value)
        if kind in _ATOMS:
            return value
        if kind is dict or (kind is not list and kind is not tuple and isinstance(value, Mapping)):
            return self._redact_mapping(value)
        if kind is list or kind is tuple or isinstance(value, list | tuple):
            return self._redact_sequence(value)
        return value

    def _redact_mapping(self, value: Mapping[Any, Any]) -> Any:
        out: dict[Any, Any] | None = None
        for key, item in value.items():
            kind = type(item)
            if kind is str:
                new: Any = REDACTED if item and type(key) is str and _is_secret_key(key) else self(item)
            elif kind in _ATOMS:
                continue
            else:
                new = self.redact_value(item)
            if new is not item:
                if out is None:
                    out = dict(value)
                out[key] = new
        return value if out is None else out

    def _redact_sequence(self, value: list[Any] | tuple[Any, ...]) -> Any:
        items: list[Any] | None = None
        for i, item in enumerate(value):
            kind = type(item)
            if kind is str:
                new: Any = self(item)
            elif kind in _ATOMS:
                continue
            else:
                new = self.redact_value(item)
            if new is not item:
                if items is None:
                    items = list(value)
                items[i] = new
        if items is None:
            return value
        return items if isinstance(value, list) else tuple(items)


_ATOMS = frozenset({int, float, bool, type(None)})
_KEY_VERDICTS: dict[str, bool] = {}


def _is_secret_key(key: str) -> bool:
    """Whether a mapping key names a secret field (cached: payloads repeat a few keys)."""
    verdict = _KEY_VERDICTS.get(key)
    if verdict is None:
        verdict = _SECRET_KEY.fullmatch(key) is not None
        if len(_KEY_VERDICTS) < 4096:
            _KEY_VERDICTS[key] = verdict
    return verdict


_PATTERN_ONLY = Redactor()


def redact_text(text: str) -> str:
    """``text`` with token shapes and secret fields redacted (no configured values: for readers such
    as the CLI and the viewer, which never see the model's configuration)."""
    return _PATTERN_ONLY(text)


def model_credentials(model: object) -> tuple[str, ...]:
    """The credentials a model adapter is configured with: its ``api_key`` attribute (when a string)
    and every string its ``secrets()`` method returns. Empty for a model with neither."""
    found: list[str] = []
    key = getattr(model, "api_key", None)
    if isinstance(key, str):
        found.append(key)
    secrets = getattr(model, "secrets", None)
    if callable(secrets):
        found.extend(s for s in secrets() if isinstance(s, str))
    return tuple(s for s in dict.fromkeys(found) if len(s) >= _MIN_SECRET)


def _redact_shapes(text: str) -> str:
    # Every shape is at least 8 characters long, and all but bearer tokens hold a punctuation mark
    # that a one-character scan (memchr speed) finds or rules out before any longer search: a search
    # for more than one character costs about a hundred times as much.
    if len(text) < 8:
        return text
    if "earer" in text or "EARER" in text:
        text = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    if "-" in text and "sk-" in text:
        text = _SK.sub(REDACTED, text)
    if "_" in text and ("gh" in text or "github_pat_" in text):
        text = _GITHUB.sub(REDACTED, text)
    # A URL's password sits before an @ or in its query (after a ? and an =).
    at, query = "@" in text, "=" in text and "?" in text
    if (at or query) and "://" in text:
        if at:
            text = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{REDACTED}{m.group(3)}", text)
        if query:
            text = _URL_QUERY_SECRET.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    if '"' in text:
        text = _redact_secret_fields(text)
    return text


def _redact_secret_fields(text: str) -> str:
    """Replace the string value of every secret field (see ``_SECRET_FIELD``), keeping its quotes."""
    match = _SECRET_FIELD.search(text)
    if match is None:
        return text
    pieces: list[str] = []
    pos = 0
    while match is not None:
        end = _value_end(text, match.end(), len(match.group(1)))
        pieces.append(text[pos : match.end()])
        pieces.append(REDACTED)
        pos = end
        match = _SECRET_FIELD.search(text, pos)
    pieces.append(text[pos:])
    return "".join(pieces)


def _value_end(text: str, start: int, escapes: int) -> int:
    """Where the string value starting at ``start`` ends: at its closing quote and that quote's escapes.

    At nesting depth d the quotes are escaped by ``escapes`` = 2**d - 1 backslashes; a quote is the
    closing one when the backslashes before it, unescaped d times, leave it unescaped, that is when
    their count is ``escapes`` modulo ``2 * (escapes + 1)``. With no closing quote (cut-off text) the
    rest of the text is the value.
    """
    period = 2 * (escapes + 1)
    i = start
    while (quote := text.find('"', i)) >= 0:
        run_start = quote
        while run_start > start and text[run_start - 1] == "\\":
            run_start -= 1
        if (quote - run_start) % period == escapes:
            return quote - escapes
        i = quote + 1
    return len(text)
