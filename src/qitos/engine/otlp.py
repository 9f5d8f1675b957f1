"""An OTLP/HTTP tracer provider configured by the standard ``OTEL_*`` variables (``qitos --otel``).

``otlp_tracer_provider()`` returns an SDK ``TracerProvider`` whose batch processor exports with
``OTLPSpanExporter`` (protobuf over HTTP). The exporter reads the standard variables itself:
``OTEL_EXPORTER_OTLP_ENDPOINT`` (default ``http://localhost:4318``, spans go to ``/v1/traces``),
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (the full URL), ``OTEL_EXPORTER_OTLP_HEADERS`` /
``..._TRACES_HEADERS``, ``..._TIMEOUT``, ``..._COMPRESSION``, ``..._CERTIFICATE``. The resource
comes from ``OTEL_SERVICE_NAME`` (default ``qitos``) and ``OTEL_RESOURCE_ATTRIBUTES``. Only the
``http/protobuf`` protocol is built in: any other ``OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL`` is refused
rather than ignored.

Needs the ``otel`` extra (``pip install 'qitos-kernel[otel]'``); nothing here is imported by ``import qitos``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from qitos.core._install import install_command
from qitos.core.errors import ConfigurationError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

__all__ = ["otlp_export", "otlp_tracer_provider"]

_PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")


def otlp_tracer_provider(*, service_name: str | None = None) -> TracerProvider:
    """A new TracerProvider exporting spans over OTLP/HTTP (see the module docstring)."""
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
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


@contextmanager
def otlp_export(enabled: bool) -> Iterator[TracerProvider | None]:
    """An OTLP provider for the block when ``enabled`` (else None), flushed and shut down at its end."""
    if not enabled:
        yield None
        return
    provider = otlp_tracer_provider()
    try:
        yield provider
    finally:
        provider.shutdown()
