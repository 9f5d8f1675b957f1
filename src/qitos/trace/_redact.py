"""Secret redaction for trace files: the one policy of :mod:`qitos.core._redaction`, re-exported."""

from __future__ import annotations

from qitos.core._redaction import REDACTED, Redactor, redact_text

__all__ = ["REDACTED", "Redactor", "redact_text"]
