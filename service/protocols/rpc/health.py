"""The gRPC port's standard services: `grpc.health.v1.Health` (Check, and Watch streams told of
each change and ended at the drain) and server reflection (grpc_reflection's own servicer
logic, one message at a time). Neither needs the key, as the standard services are probed;
both answer within the connection's budget of unread answers (http2 Stream.send)."""

from __future__ import annotations

from typing import Any

from grpc_health.v1 import health_pb2
from ringserve.service.protocols.rpc import http2 as h2
from ringserve.service.protocols.rpc.http2 import Stream

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class Health:
    """What health last said, the Watch streams open, and reflection of `services` (the first
    is the one health answers for, with "")."""

    def __init__(self, services: tuple[str, ...]) -> None:
        self.services = services
        self.serving: int | None = None  # the status health last said
        self.watches: set[Stream] = set()  # open Watch streams (of "" or the service)
        self.ended = False  # the drain: Watch streams end at once
        self.reflection: Any = None  # grpc_reflection's servicer, made at the first use

    def update(self, serving: bool) -> None:
        status = SERVING if serving else NOT_SERVING
        if status != self.serving:
            self.serving = status
            message = health_pb2.HealthCheckResponse(status=status).SerializeToString()
            for stream in list(self.watches):
                stream.send(message)
                if stream.done:  # ended: its client left our answers unread (Stream.unread)
                    self.watches.discard(stream)

    def end_watches(self) -> None:
        self.ended = True
        for stream in list(self.watches):
            stream.finish()
        self.watches.clear()

    def status(self, stream: Stream) -> int | None:
        """The status for the requested service; None (answered) for bad bytes."""
        try:
            service = health_pb2.HealthCheckRequest.FromString(stream.request or b"").service
        except Exception:  # noqa: BLE001 - protobuf's DecodeError and its kin
            stream.finish(h2.INVALID_ARGUMENT, "request is not a valid protobuf message")
            return None
        if service not in ("", self.services[0]):
            return SERVICE_UNKNOWN
        return self.serving if self.serving is not None else NOT_SERVING

    def check(self, stream: Stream) -> None:
        status = self.status(stream)
        if status == SERVICE_UNKNOWN:
            stream.finish(h2.NOT_FOUND, "unknown service")
        elif status is not None:
            stream.reply(health_pb2.HealthCheckResponse(status=status).SerializeToString())

    def watch(self, stream: Stream) -> None:
        """The status now, then each change, until the drain ends the stream (or the client)."""
        status = self.status(stream)
        if status is None:
            return
        stream.send(health_pb2.HealthCheckResponse(status=status).SerializeToString())
        if stream.done:  # past the connection's budget of unread answers
            return
        if self.ended:
            stream.finish()
        elif status != SERVICE_UNKNOWN:
            self.watches.add(stream)
            stream.on_cancel = self.watches.discard

    def reflect(self, stream: Stream, data: bytes) -> None:
        """One ServerReflectionRequest, answered by grpc_reflection's own servicer logic, and
        paid from the connection's budget of work that serves no inference."""
        from grpc_reflection.v1alpha import reflection, reflection_pb2

        if self.reflection is None:
            self.reflection = reflection.ReflectionServicer(list(self.services))
        try:
            request = reflection_pb2.ServerReflectionRequest.FromString(data)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError and its kin
            stream.finish(h2.INVALID_ARGUMENT, "request is not a valid protobuf message")
            return
        for answer in self.reflection.ServerReflectionInfo(iter([request]), None):
            data = answer.SerializeToString()
            # Paid from the connection's budget, by its size: a file's descriptor (8 KB, 9
            # units) takes 80 us to make, so a flood of 30-byte requests would be seconds of
            # the loop; a connection gets about 110 at once, then 11 a second.
            stream.conn.waste("reflection requests", 1 + len(data) / 1024)
            stream.send(data)


def keep_one(stream: Stream, data: bytes) -> None:
    """A unary call's request message: the first is kept; a second is an error."""
    if stream.request is not None:
        stream.finish(h2.INVALID_ARGUMENT, "a unary call takes one request message")
        return
    stream.request = data


def end_ok(stream: Stream) -> None:
    stream.finish()
