"""An OTLP/HTTP tracer provider configured by the standard ``OTEL_*`` variables (``qitos --otel``).

``otlp_tracer_provider()`` returns an SDK ``TracerProvider`` whose batch processor exports with
``OTLPSpanExporter`` (protobuf over HTTP). The exporter reads the standard variables itself:
``OTEL_EXPORTER_OTLP_ENDPOINT`` (default ``http://localhost:4318``, spans go to ``/v1/traces``),
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (the full URL), ``OTEL_EXPORTER_OTLP_HEADERS`` /
``..._TRACES_HEADERS``, ``..._TIMEOUT``, ``..._COMPRESSION``, ``..._CERTIFICATE``. The resource
comes from ``OTEL_SERVICE_NAME`` (default ``qitos``) and ``OTEL_RESOURCE_ATTRIBUTES``. Only the
``http/protobuf`` protocol is built in: any other ``OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL`` is refused
rather than ignored.

At the end of ``otlp_export`` the spans still buffered are sent. A collector that cannot be
reached does not hold the exit up for the exporter's retries (about 8 s of backoff): the export is
given up on as soon as it fails (a slow collector that answers gets a few seconds), and the
exporter's retry warnings are replaced by one line on stderr saying what was not sent where.

Needs the ``otel`` extra (``pip install 'qitos-kernel[otel]'``); nothing here is imported by ``import qitos``.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from qitos.core._errors import ConfigurationError
from qitos.core._install import install_command

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

__all__ = ["otlp_export", "otlp_tracer_provider"]

_PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
_EXIT_GRACE_S = 5.0  # how long the last export may take at exit when the collector answers, slowly


def otlp_tracer_provider(*, service_name: str | None = None) -> TracerProvider:
    """A new TracerProvider exporting spans over OTLP/HTTP (see the module docstring)."""
    return _exporting_provider(service_name)[0]


def _exporting_provider(service_name: str | None) -> tuple[TracerProvider, Any]:
    for variable in _PROTOCOL_VARIABLES:
        protocol = os.environ.get(variable)
        if protocol:
            if protocol != "http/protobuf":
                raise ConfigurationError(f"{variable}={protocol!r}: qitos exports OTLP as http/protobuf only")
            break
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ConfigurationError(
            f"exporting OpenTelemetry spans needs the otel extra: {install_command('otel')} ({exc})"
        ) from exc
    name = service_name or os.environ.get("OTEL_SERVICE_NAME") or "qitos"
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    exporter = OTLPSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider, exporter


@contextmanager
def otlp_export(enabled: bool) -> Iterator[TracerProvider | None]:
    """An OTLP provider for the block when ``enabled`` (else None), flushed and shut down at its end."""
    if not enabled:
        yield None
        return
    provider, exporter = _exporting_provider(None)
    watch = _ExportWatch()
    logger = logging.getLogger(type(exporter).__module__)
    logger.addFilter(watch)
    try:
        yield provider
    finally:
        try:
            _shut_down(provider, exporter, watch)
        finally:
            logger.removeFilter(watch)
        if watch.first is not None:
            sys.stderr.write(f"qitos: OpenTelemetry spans were not all exported to {_endpoint()}: {watch.first}\n")


class _ExportWatch(logging.Filter):
    """Keeps the exporter's warnings (one per retry) off the terminal and notes that an export failed."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = threading.Event()
        self.first: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            if self.first is None:
                args = record.args if isinstance(record.args, tuple) else ()
                transient = str(record.msg).startswith("Transient error") and len(args) > 0
                self.first = str(args[0]) if transient else record.getMessage()
            self.failed.set()
        return False


def _shut_down(provider: TracerProvider, exporter: Any, watch: _ExportWatch) -> None:
    """``provider.shutdown()`` (the last export), given up on once an export has failed."""
    worker = threading.Thread(target=provider.shutdown, name="qitos-otlp-shutdown", daemon=True)
    worker.start()
    deadline = time.monotonic() + _EXIT_GRACE_S
    while worker.is_alive() and time.monotonic() < deadline:
        if watch.failed.wait(0.02):
            break
    if worker.is_alive():
        if watch.first is None:
            watch.first = f"the collector did not answer within {_EXIT_GRACE_S:g} s"
        exporter.shutdown()  # ends the exporter's retry wait at once
        worker.join(timeout=1.0)


def _endpoint() -> str:
    traces = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if traces:
        return traces
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318"
    return base.rstrip("/") + "/v1/traces"
