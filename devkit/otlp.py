"""A real OTLP/HTTP trace receiver for the tests and benchmarks: a small HTTP server that
decodes each ExportTraceServiceRequest with the official opentelemetry-proto definitions and
keeps the spans (and the raw bodies, so a test can search every byte the server exported)."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass
class Span:
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    resource: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)

    def event(self, name: str) -> tuple[int, dict[str, Any]]:
        """The time and attributes of the one event of that name."""
        found = [(t, a) for n, t, a in self.events if n == name]
        assert len(found) == 1, (name, self.events)
        return found[0]


def value_of(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return None if kind is None else getattr(v, kind)


class Receiver:
    """Listens on 127.0.0.1:port for POST /v1/traces."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.bodies: list[bytes] = []
        self.paths: list[str] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver.take(self.path, body)
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def take(self, path: str, body: bytes) -> None:
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        spans = []
        for rs in req.resource_spans:
            resource = {a.key: value_of(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append(
                        Span(
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            s.name,
                            s.kind,
                            s.start_time_unix_nano,
                            s.end_time_unix_nano,
                            {a.key: value_of(a.value) for a in s.attributes},
                            resource,
                            [
                                (
                                    e.name,
                                    e.time_unix_nano,
                                    {a.key: value_of(a.value) for a in e.attributes},
                                )
                                for e in s.events
                            ],
                        )
                    )
        with self.lock:
            self.paths.append(path)
            self.bodies.append(body)
            self.spans.extend(spans)

    def trace(self, trace_id: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def all(self) -> list[Span]:
        with self.lock:
            return list(self.spans)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
