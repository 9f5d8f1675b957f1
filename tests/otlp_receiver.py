"""A tiny OTLP/HTTP trace receiver on 127.0.0.1 for the exporter tests (stdlib http.server).

It decodes each ``POST /v1/traces`` body as an ``ExportTraceServiceRequest`` (the
``opentelemetry-proto`` package) and keeps the spans with their resource attributes, so a test
can assert what an exporter really sent over the wire.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

__all__ = ["ReceivedSpan", "Receiver", "otlp_receiver"]


@dataclass
class ReceivedSpan:
    """One decoded span: ids as hex, attributes and event names as plain Python values."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str]]
    status_code: int
    resource: dict[str, Any]


@dataclass
class Receiver:
    """What the receiver got: spans, and the content types of the requests."""

    url: str
    spans: list[ReceivedSpan] = field(default_factory=list)
    content_types: list[str] = field(default_factory=list)

    def named(self, prefix: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.name.startswith(prefix)]


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


def _attributes(items: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in items}


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    """Serve on an ephemeral 127.0.0.1 port for the block; yields the Receiver (``url`` is the root)."""
    lock = threading.Lock()
    received: list[ReceivedSpan] = []
    content_types: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            spans = []
            for resource_spans in request.resource_spans:
                resource = _attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        spans.append(
                            ReceivedSpan(
                                name=span.name,
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_span_id=span.parent_span_id.hex(),
                                attributes=_attributes(span.attributes),
                                events=[(e.name, _attributes(e.attributes)) for e in span.events],
                                links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                                status_code=span.status.code,
                                resource=resource,
                            )
                        )
            with lock:
                received.extend(spans)
                content_types.append(self.headers.get("Content-Type", ""))
            payload = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    receiver = Receiver(url=f"http://127.0.0.1:{server.server_address[1]}", spans=received)
    receiver.content_types = content_types
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
