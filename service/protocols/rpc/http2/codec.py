"""HTTP/2's wire (RFC 9113): frame types, flags and error codes, a frame's bytes, reading whole
frames out of a connection's buffer, padding, and header blocks (HPACK is the `hpack`
package's: its dynamic table and Huffman code)."""

from __future__ import annotations

import struct
from typing import cast

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE = range(9)
CONTINUATION = 9
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
# Error codes (RFC 9113 7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 5, 6, 7, 8, 9
ENHANCE_YOUR_CALM = 11
MAX_WINDOW = 2**31 - 1
FRAME_SIZE = 16384  # the largest frame we take (the default; we never raise it)
HEADER_LIST = 65536  # the largest decoded header list we take

Frame = tuple[int, int, int, bytes]  # (type, flags, stream id, payload)


class H2Error(Exception):
    """A connection error: GOAWAY with `code`, then close."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return struct.pack(">BHBBI", n >> 16, n & 0xFFFF, kind, flags, stream) + payload


def error_code(code: int) -> bytes:
    return struct.pack(">I", code)


def read_preface(buf: bytearray) -> int:
    """The bytes of the client's preface at the start of `buf` (24), or 0 while it is short."""
    if len(buf) < len(PREFACE):
        if not PREFACE.startswith(bytes(buf)):
            raise H2Error(PROTOCOL_ERROR, "not an HTTP/2 preface")
        return 0
    if buf[: len(PREFACE)] != PREFACE:
        raise H2Error(PROTOCOL_ERROR, "not an HTTP/2 preface")
    return len(PREFACE)


def read_frames(buf: bytearray, most: int) -> list[Frame]:
    """At most `most` whole frames from the front of `buf`, taken out of it; a partial frame
    stays. A length over our SETTINGS_MAX_FRAME_SIZE is a connection error at once."""
    frames: list[Frame] = []
    pos, end = 0, len(buf)
    with memoryview(buf) as view:  # one copy of each payload (a bytearray slice would be two)
        while end - pos >= 9 and len(frames) < most:
            n = (buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2]
            if n > FRAME_SIZE:
                raise H2Error(FRAME_SIZE_ERROR, "frame over SETTINGS_MAX_FRAME_SIZE")
            if end - pos < 9 + n:
                break
            sid = int.from_bytes(view[pos + 5 : pos + 9]) & MAX_WINDOW
            frames.append((buf[pos + 3], buf[pos + 4], sid, bytes(view[pos + 9 : pos + 9 + n])))
            pos += 9 + n
    del buf[:pos]
    return frames


def strip(flags: int, payload: bytes) -> bytes:
    """A DATA or HEADERS payload without its padding."""
    if flags & PADDED:
        if not payload or payload[0] >= len(payload):
            raise H2Error(PROTOCOL_ERROR, "padding too long")
        return payload[1 : len(payload) - payload[0]]
    return payload


# The decoded lists HeaderDecoder keeps, in bytes as they cost here (their fields' bytes and
# FIELD_COST for each field's objects, and the block): a client's repeated calls need one or
# two lists of a few hundred bytes; 64 blocks of fields were 6.8 MiB a connection (issue 56).
KEPT_BYTES = 16384
FIELD_COST = 128  # a field's two bytes objects, its tuple and its list slot, about


def kept_cost(block: bytes, fields: list[tuple[bytes, bytes]]) -> int:
    return len(block) + sum(len(n) + len(v) + FIELD_COST for n, v in fields)


class HeaderDecoder:
    """Header blocks to fields. A block of one-byte indexed fields only (a client's repeated
    call: every header already in the tables) changes no table, so its fields are kept and
    reused while the dynamic table stays as it is, up to KEPT_BYTES a connection; any other
    block may change it, and empties what was kept."""

    def __init__(self) -> None:
        self.decoder = hpack.Decoder(max_header_list_size=HEADER_LIST)
        self.known: dict[bytes, list[tuple[bytes, bytes]]] = {}
        self.kept = 0  # bytes kept in `known` (kept_cost)

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        indexed = all(b > 0x80 and b != 0xFF for b in block)
        if indexed:
            kept = self.known.get(block)
            if kept is not None:
                return kept
        elif self.known:
            self.known.clear()
            self.kept = 0
        # always: the dynamic table must follow (raw: each field a (bytes, bytes) pair)
        fields = cast(list[tuple[bytes, bytes]], self.decoder.decode(block, raw=True))
        if indexed:
            cost = kept_cost(block, fields)
            if self.kept + cost <= KEPT_BYTES:
                self.known[block] = fields
                self.kept += cost
        return fields
