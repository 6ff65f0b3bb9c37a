"""OpenTelemetry traces of requests, exported over OTLP/HTTP by the official SDK.

One span a request (kind SERVER), continuing a W3C `traceparent` when one came: its events
`admitted` (the admission ends; or `refused`) and `answered` (the last text's answer read; the
write follows, to the span's end), its child span `batch` (the batch its last text ran in: rows,
padded tokens; its runtime is its length; it starts when the queue wait ends) and, inside
that, `model` (the forward pass); the runtime (onnx, torch) is a resource attribute. The
worker's times come in its answer (shm.layout.pack_batch, the response record's aux word), so
only the front-end exports.

Spans are made after the fact, with explicit times, on the event loop: a few microseconds each;
the SDK's BatchSpanProcessor queues ended spans and a background thread encodes and sends them,
so the loop never waits for the collector. Nothing here runs, and nothing is imported, when
tracing is off. No span holds a text or a key: lengths and token counts only.

Protocol-neutral: `Tracing.start(...)` gives a RequestTrace (None when this one is not sampled);
a front-end calls `admitted`, `refused`, `answered` and `written` on it as its request moves.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ringserve.service.version import version
from ringserve.shm import layout as L

if TYPE_CHECKING:
    from ringserve.service.engine.dispatcher import Result

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def wanted(endpoint: str | None, env: dict[str, str] | None = None) -> bool:
    """Tracing is on with --otlp-endpoint or a standard endpoint variable, unless the SDK is
    disabled (OTEL_SDK_DISABLED) or the exporter is `none` (OTEL_TRACES_EXPORTER)."""
    env = dict(os.environ) if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(endpoint) or any(env.get(v) for v in ENDPOINT_VARS)


def traces_url(endpoint: str) -> str:
    """--otlp-endpoint as OTEL_EXPORTER_OTLP_ENDPOINT reads: a base URL gets `/v1/traces`."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--otlp-endpoint must be an http(s) URL, got {endpoint!r}")
    if parts.path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/traces"
    return endpoint


class Tracing:
    """The SDK's tracer provider, sampler (OTEL_TRACES_SAMPLER) and batch exporter."""

    def __init__(self, endpoint: str | None, runtime: str = "") -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import SpanKind, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        attrs: dict[str, Any] = {
            "service.version": version(),
            "ringserve.runtime": runtime,
        }
        if not os.environ.get("OTEL_SERVICE_NAME"):
            attrs["service.name"] = "ringserve"
        self.provider = TracerProvider(resource=Resource.create(attrs))  # sampler: from env
        exporter = (
            OTLPSpanExporter(endpoint=traces_url(endpoint)) if endpoint else OTLPSpanExporter()
        )
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("ringserve")
        self.propagator = TraceContextTextMapPropagator()
        self.server_kind = SpanKind.SERVER
        self.in_context = set_span_in_context
        self.runtime = runtime
        # Spans take wall-clock ns; the server measures on the monotonic clock.
        self.offset_ns = time.time_ns() - time.monotonic_ns()

    def start(
        self,
        name: str,
        protocol: str,
        received_ns: int,
        traceparent: bytes | None = None,
        tracestate: bytes | None = None,
        attributes: dict[str, Any] | None = None,
    ) -> RequestTrace | None:
        """The request's span from its last byte (monotonic ns); None when it is not sampled."""
        parent = None
        if traceparent is not None:
            carrier = {"traceparent": traceparent.decode("latin-1")}
            if tracestate is not None:
                carrier["tracestate"] = tracestate.decode("latin-1")
            parent = self.propagator.extract(carrier)  # an invalid one starts a new trace
        attrs = {"ringserve.protocol": protocol, **(attributes or {})}
        span = self.tracer.start_span(
            name,
            context=parent,
            kind=self.server_kind,
            attributes=attrs,
            start_time=received_ns + self.offset_ns,
        )
        if not span.is_recording():
            return None
        return RequestTrace(self, span, received_ns)

    def shutdown(self) -> None:
        """Send what is queued (at most 2 s), then stop the export thread."""
        self.provider.force_flush(2000)
        self.provider.shutdown()


class RequestTrace:
    """One sampled request's span and the stages it has passed; times are monotonic ns.

    Spans cost the loop about 17 us each and events about 5 (measured with the SDK here), so
    only what is an interval with work of its own is a span: the request, its batch and the
    model's forward pass. The admission and the answer are events on the request's span
    (`admitted`, `answered`): admission runs from the span's start to `admitted`, the queue
    from `admitted` to the batch, the write from `answered` to the span's end."""

    __slots__ = ("admitted_ns", "answered_ns", "received_ns", "root", "tracing")

    def __init__(self, tracing: Tracing, root: Any, received_ns: int) -> None:
        self.tracing = tracing
        self.root = root
        self.received_ns = received_ns
        self.admitted_ns = 0
        self.answered_ns = 0

    def child(
        self, name: str, start_ns: int, end_ns: int, attrs: dict[str, Any], parent: Any
    ) -> Any:
        t = self.tracing
        span = t.tracer.start_span(
            name,
            context=t.in_context(parent),
            attributes=attrs,
            start_time=start_ns + t.offset_ns,
        )
        span.end(end_time=max(start_ns, end_ns) + t.offset_ns)
        return span

    def event(self, name: str, at_ns: int, attrs: dict[str, Any]) -> None:
        self.root.add_event(name, attrs, timestamp=at_ns + self.tracing.offset_ns)

    def admitted(self, now_ns: int, texts: int, text_bytes: int) -> None:
        self.admitted_ns = now_ns
        self.root.set_attributes({"ringserve.texts": texts, "ringserve.text_bytes": text_bytes})
        self.event("admitted", now_ns, {})

    def refused(self, now_ns: int, why: str) -> None:
        """Refused at admission (why: `overloaded`, `rate_limited`); written() ends it."""
        self.event("refused", now_ns, {"ringserve.refusal": why})
        self.answered_ns = now_ns

    def answered(self, results: list[Result], now_ns: int) -> None:
        """Every text is in: the batch and model spans of the one answered last."""
        self.answered_ns = now_ns
        self.event("answered", now_ns, {"ringserve.tokens": sum(r.tokens for r in results)})
        last = max((r for r in results if r.batch), key=lambda r: r.read_ns, default=None)
        if last is None or not self.admitted_ns:
            return
        rows, length, start_ns = L.unpack_batch(last.batch, last.read_ns)
        start_ns = max(start_ns, self.admitted_ns)
        queue_us = (start_ns - self.admitted_ns) // 1000
        # Few attributes: each costs the loop a validation. What the times say is left out.
        batch = self.child(
            "batch",
            start_ns,
            last.read_ns,
            {
                "ringserve.batch.rows": rows,
                "ringserve.batch.padded_tokens": rows * length,
                "ringserve.queue.worker_us": min(queue_us, last.queued_us),
            },
            self.root,
        )
        model_end = min(last.read_ns, start_ns + last.model_us * 1000)
        self.child("model", start_ns, model_end, {}, batch)

    def written(self, status: int, now_ns: int) -> None:
        """The answer left: the request's span ends."""
        root = self.root
        root.set_attribute("http.response.status_code", status)
        if status >= 500:
            from opentelemetry.trace import Status, StatusCode

            root.set_status(Status(StatusCode.ERROR))
        root.end(end_time=now_ns + self.tracing.offset_ns)
