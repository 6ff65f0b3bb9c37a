"""Rings of known content for the ring tests, in one process and across two: each message's
payload is derived from its id and ends in a crc, so loss, duplication, reordering and
corruption all show; scenarios say the ring's shape and the messages; segments are this
process's own, so a test can check that none is left."""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from ringserve.shm import layout as L
from ringserve.shm.ring import Ring
from ringserve.shm.segment import Segment, segment_name

PID = os.getpid()
_serial = itertools.count(1)
WAIT_LONG_S = 2.0  # a safety net only: a wait that times out with messages pending = lost wake-up
WAIT_SHORT_S = 0.005  # big messages: a lone PAD is seen at the consumer's next look (see Ring)


def payload_for(msg_id: int, length: int) -> bytes:
    """Bytes that only this id gives, ending in the crc32 of the rest when there is room."""
    if length < 4:
        return msg_id.to_bytes(8, "little")[:length]
    body = random.Random(msg_id).randbytes(length - 4)
    return body + zlib.crc32(body).to_bytes(4, "little")


def aux_for(msg_id: int) -> int:
    return (msg_id * 0x9E3779B97F4A7C15) % (1 << 64) - (1 << 63)  # spans the whole i64 range


def meta_for(msg_id: int) -> int:
    return (msg_id * 0x9E3779B1) % (1 << 32)  # spans the whole u32 meta word


@dataclass(frozen=True)
class Scenario:
    slot_size: int
    slot_count: int
    start: int  # the head and tail counters before the first message
    first_id: int
    lengths: tuple[int, ...]
    batches: tuple[int, ...]  # write_many sizes, cycled (1 goes through try_write)
    read_limit: int
    sync_every: int = 0  # every n-th write waits for the consumer to drain the ring (0: never)

    @property
    def big(self) -> bool:
        """A message of more than half the ring may wait on a lone PAD (see Ring.write_many)."""
        return any(self.need(n) > self.slot_count // 2 for n in self.lengths)

    @property
    def wait_s(self) -> float:
        return WAIT_SHORT_S if self.big else WAIT_LONG_S

    def need(self, length: int) -> int:
        return L.slots_for(length, self.slot_size)

    def message(self, i: int) -> tuple[int, bytes, int, int]:
        msg_id = self.first_id + i
        return msg_id, payload_for(msg_id, self.lengths[i]), aux_for(msg_id), meta_for(msg_id)


def check(sc: Scenario, index: int, msg: tuple[int, int, int, bytes]) -> str | None:
    """What is wrong with the `index`-th message received, or None."""
    msg_id, aux, meta, payload = msg
    if index >= len(sc.lengths):
        return f"unexpected extra message {msg_id}"
    want_id, want_payload, want_aux, want_meta = sc.message(index)
    if msg_id != want_id:
        return f"message {index}: id {msg_id}, expected {want_id}"
    if len(payload) >= 4 and zlib.crc32(payload[:-4]) != int.from_bytes(payload[-4:], "little"):
        return f"message {msg_id}: crc mismatch"
    if payload != want_payload or aux != want_aux or meta != want_meta:
        return f"message {msg_id}: payload, aux or meta differs"
    return None


# -- segments of this process ---------------------------------------------------------------------
def new_segment(size: int) -> Segment:
    return Segment.create(segment_name(PID, next(_serial), "test"), size)


def tail_of(ring: Ring) -> int:
    return int(ring._words[L.TAIL_OFFSET // 8])


def set_counters(seg: Segment, head: int, tail: int) -> None:
    words = seg.buf[: L.SLOTS_OFFSET].cast("q")
    words[L.HEAD_OFFSET // 8] = head
    words[L.TAIL_OFFSET // 8] = tail
    words.release()


@contextlib.contextmanager
def scenario_ring(sc: Scenario) -> Iterator[tuple[Segment, Ring]]:
    seg = new_segment(L.ring_bytes(sc.slot_size, sc.slot_count))
    Ring(seg, sc.slot_size, sc.slot_count).close()
    set_counters(seg, sc.start, sc.start)
    ring = Ring(seg)
    try:
        yield seg, ring
    finally:
        ring.close()
        seg.close()
        seg.unlink()
