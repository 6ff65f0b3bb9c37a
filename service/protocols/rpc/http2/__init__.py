"""gRPC's HTTP/2, server side, on the front-end's own loop (docs/design.md, "gRPC"), in rooms:
codec.py (the wire: frames, padding, HPACK blocks), flow.py (what is sent, the send windows,
the answers held unread), inflow.py (the receive windows, refilled as bytes are consumed, and
what a connection holds), streams.py (the calls: HEADERS, DATA, ends), grpc.py (a call's
messages and answers), connection.py (the connection's life, control frames, the budget, how
much one turn reads and how the connection ends).

What a call does with its request is the port's (rpc/server.py): `Port.begin` is given each new
stream once its headers are in, and the stream's `on_message` each request message. Any frame
that breaks the protocol ends its connection with GOAWAY (RFC 9113's connection errors) or its
stream with RST_STREAM; nothing a peer sends raises out of `data_received`.
"""

from ringserve.service.protocols.rpc.http2.codec import (
    ACK,
    CANCEL,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    INTERNAL_ERROR,
    NO_ERROR,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    H2Error,
    frame,
)
from ringserve.service.protocols.rpc.http2.connection import (
    FRAMES_PER_TURN,
    WASTE_BURST,
    WASTE_RATE,
    Connection,
)
from ringserve.service.protocols.rpc.http2.grpc import (
    CANCELLED,
    DEADLINE_EXCEEDED,
    FAILED_PRECONDITION,
    INTERNAL,
    INVALID_ARGUMENT,
    NOT_FOUND,
    OK,
    RESOURCE_EXHAUSTED,
    UNAUTHENTICATED,
    UNAVAILABLE,
    UNIMPLEMENTED,
    UNKNOWN,
    Port,
    Stream,
    parse_timeout,
)
from ringserve.service.protocols.rpc.http2.streams import MAX_CONTINUATIONS, RESET_IN_FLIGHT

__all__ = [
    "ACK", "CANCEL", "CANCELLED", "COMPRESSION_ERROR", "CONTINUATION", "DATA",
    "DEADLINE_EXCEEDED", "END_HEADERS", "END_STREAM", "ENHANCE_YOUR_CALM", "FAILED_PRECONDITION",
    "FLOW_CONTROL_ERROR", "FRAMES_PER_TURN", "FRAME_SIZE", "FRAME_SIZE_ERROR", "GOAWAY",
    "HEADERS", "INTERNAL", "INTERNAL_ERROR", "INVALID_ARGUMENT", "MAX_CONTINUATIONS",
    "NOT_FOUND", "NO_ERROR", "OK", "PADDED", "PING", "PREFACE", "PRIORITY", "PROTOCOL_ERROR",
    "PUSH_PROMISE", "REFUSED_STREAM", "RESET_IN_FLIGHT", "RESOURCE_EXHAUSTED", "RST_STREAM",
    "SETTINGS", "STREAM_CLOSED", "UNAUTHENTICATED", "UNAVAILABLE", "UNIMPLEMENTED", "UNKNOWN",
    "WASTE_BURST", "WASTE_RATE", "WINDOW_UPDATE", "Connection", "H2Error", "Port", "Stream",
    "frame", "parse_timeout",
]  # fmt: skip
