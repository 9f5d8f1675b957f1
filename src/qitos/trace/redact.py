"""Secret redaction applied to every line qitos writes to disk."""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["REDACTED", "Redactor"]

REDACTED = "[REDACTED]"

_PATTERNS = (
    re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"),
    re.compile(r"(?i)(\"(?:api[_-]?key|authorization|x-api-key|access[_-]?token|secret|password)\"\s*:\s*\")[^\"]*(\")"),
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
            text = _PATTERNS[2].sub(lambda m: f"{m.group(1)}{REDACTED}{m.group(2)}", text)
        return text
