"""The binary protocol's bytes in one place: frames, answers and their statuses.

A frame is `u32 text_len | text | u64 tag`; an answer is
`u64 tag | u8 status | u8 flags | u16 label_id | u16 n | n x f32 scores`, all little-endian; the
flags byte (the contract's reserved byte) has bit 0 set when the text was cut, bit 1 when it was
scored in windows.
The server, the clients, the corpus files, the tests and the benchmarks all read and write them
through this module, so that the format is written down once.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

from ringserve.shm.layout import (
    STATUS_BAD_REQUEST,
    STATUS_DEADLINE,
    STATUS_INTERNAL,
    STATUS_OK,
    STATUS_OVERLOADED,
    STATUS_RATE_LIMITED,
    STATUS_UNKNOWN_MODEL,
)

LENGTH = struct.Struct("<I")
TAG = struct.Struct("<Q")
ANSWER = struct.Struct("<QBBHH")  # tag, status, flags, label_id, n; then n x f32
TRUNCATED = 1  # flags bit 0: the text was cut to the model's max_length
WINDOWED = 2  # flags bit 1: the text was scored in windows
INT8 = 16  # flags bit 4 (--precision int8-checked): int8's scores, sure enough
SECOND_LOOK = 32  # flags bit 5 (--precision int8-checked): fp32's scores, a close call
SCORE = struct.Struct("<f")

# The statuses an answer may carry are the worker's own, so none needs translating.
OK, BAD_REQUEST, OVERLOADED, DEADLINE, INTERNAL, UNKNOWN_MODEL, RATE_LIMITED = (
    STATUS_OK,
    STATUS_BAD_REQUEST,
    STATUS_OVERLOADED,
    STATUS_DEADLINE,
    STATUS_INTERNAL,
    STATUS_UNKNOWN_MODEL,
    STATUS_RATE_LIMITED,
)
STATUS_NAMES = {
    OK: "ok",
    BAD_REQUEST: "bad request",
    OVERLOADED: "overloaded",
    DEADLINE: "deadline passed",
    INTERNAL: "internal error",
    UNKNOWN_MODEL: "unknown or unloaded model",
    RATE_LIMITED: "over the key's rate",
}


@dataclass(slots=True)
class Answer:
    tag: int
    status: int
    label_id: int = 0
    scores: list[float] = field(default_factory=list)
    flags: int = 0  # TRUNCATED, WINDOWED

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def status_name(self) -> str:
        return STATUS_NAMES.get(self.status, f"status {self.status}")


def encode_frame(text: str | bytes, tag: int) -> bytes:
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return LENGTH.pack(len(data)) + data + TAG.pack(tag)


AUTH_PREFIX = b"AUTH "  # a keyed server's first frame: `AUTH KEY`, tag 0 (service.auth)


def auth_frame(key: str) -> bytes:
    """The frame a client sends first to a server started with --api-key; answered tag 0,
    status 0, no scores, or the connection closes."""
    return encode_frame(AUTH_PREFIX + key.encode("ascii"), 0)


MODEL_PREFIX = b"MODEL "  # `MODEL name[:version]`, tag 0: selects the connection's model


def model_frame(name: str, version: int | str | None = None) -> bytes:
    """The frame that selects the connection's model for the frames after it; answered tag 0,
    status 0, or status 5 for a model the server does not hold."""
    text = name if version is None else f"{name}:{version}"
    return encode_frame(MODEL_PREFIX + text.encode("utf-8"), 0)


def parse_model_selection(text: bytes) -> tuple[str, str | None] | None:
    """(name, version or None) of a `MODEL name[:version]` frame's text (the name "" when it
    names none, or not in UTF-8: no model has it); None when the text is no selection. A
    version is the digits after the last colon."""
    if not text.startswith(MODEL_PREFIX):
        return None
    try:
        rest = text[len(MODEL_PREFIX) :].decode("utf-8").strip()
    except UnicodeDecodeError:
        return "", None
    name, colon, version = rest.rpartition(":")
    if not colon or not version.isdigit() or not name:
        name, version = rest, ""
    return name, version or None


def encode_answer(
    tag: int, status: int, label_id: int = 0, scores: bytes = b"", flags: int = 0
) -> bytes:
    """`scores` is the raw little-endian f32 bytes (a numpy float32 array's tobytes())."""
    return ANSWER.pack(tag, status, flags, label_id, len(scores) // SCORE.size) + scores


def status_answer(tag: int, status: int) -> bytes:
    """An answer with no scores: every refusal and failure."""
    return ANSWER.pack(tag, status, 0, 0, 0)


def iter_frames(data: bytes | bytearray, max_frame: int) -> Iterator[tuple[int, bytes]]:
    """(tag, text) of each whole frame, in order, up to a partial frame or a length over
    `max_frame`. The server's own parser is inlined for speed; this one is for files and tests."""
    pos, end = 0, len(data)
    while end - pos >= LENGTH.size:
        (n,) = LENGTH.unpack_from(data, pos)
        stop = pos + LENGTH.size + n + TAG.size
        if n > max_frame or stop > end:
            return
        (tag,) = TAG.unpack_from(data, stop - TAG.size)
        yield tag, bytes(data[pos + LENGTH.size : stop - TAG.size])
        pos = stop


def parse_answers(buf: bytes | bytearray) -> tuple[list[Answer], int]:
    """Every whole answer at the start of `buf`, and how many bytes they take."""
    out: list[Answer] = []
    pos, end = 0, len(buf)
    while end - pos >= ANSWER.size:
        tag, status, flags, label_id, n = ANSWER.unpack_from(buf, pos)
        stop = pos + ANSWER.size + SCORE.size * n
        if stop > end:
            break
        scores = list(struct.unpack_from(f"<{n}f", buf, pos + ANSWER.size)) if n else []
        out.append(Answer(tag, status, label_id, scores, flags))
        pos = stop
    return out, pos


class AnswerParser:
    """Incremental: feed it bytes as they come, get back every answer they complete."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[Answer]:
        self.buffer += data
        out, used = parse_answers(self.buffer)
        del self.buffer[:used]
        return out
