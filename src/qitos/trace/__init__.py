"""Run artifacts: writer, reader and redaction."""

from qitos.trace._reader import RunTrace, TraceError, list_runs, open_run
from qitos.trace._writer import TraceWriter

__all__ = ["RunTrace", "TraceError", "TraceWriter", "list_runs", "open_run"]
