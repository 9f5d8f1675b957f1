"""Secret redaction applied to every line qitos writes to disk."""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["REDACTED", "Redactor"]

REDACTED = "[REDACTED]"

_PATTERNS = (
    re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"),
)

# The start of a secret field's string value: "api_key": " as JSON text, or the same nested inside a
# JSON string at any depth (\"api_key\": \"). Group 1 is the backslashes escaping the quotes there.
_SECRET_FIELD = re.compile(
    r"(?i)\"(?:api[_-]?key|authorization|x-api-key|access[_-]?token|secret|password)(\\*)\"\s*:\s*\1\""
)


class Redactor:
    """Replaces known secret values and common key/token shapes with ``[REDACTED]``."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)

    def add(self, secret: str | None) -> None:
        """Also redact this exact value from now on."""
        if secret and len(secret) >= 4 and secret not in self._secrets:
            self._secrets.append(secret)
            self._secrets.sort(key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        if "earer" in text or "sk-" in text or '"' in text:
            text = _PATTERNS[0].sub(lambda m: f"{m.group(1)} {REDACTED}", text)
            text = _PATTERNS[1].sub(REDACTED, text)
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
