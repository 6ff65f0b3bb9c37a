"""Single-producer single-consumer message ring over a shared-memory segment.

Why it is correct without locks or fences on x86-64:
- Each counter has exactly one writer (tail: producer, head: consumer) and is an aligned 8-byte
  word on its own cache line, stored through memoryview.cast("q"), a single 8-byte store in
  CPython: a reader never sees a torn value.
- The producer copies the payload and the record header first and stores the tail last. x86-64
  (TSO) keeps stores in program order, so a consumer that reads the new tail also sees the
  payload. The consumer reads the tail before the payload, and loads are not reordered with
  other loads. The consumer copies a message out before it stores the head, so the producer
  never overwrites a slot still being read.
- CPython performs each of these stores inside a separate C call, so the compiler cannot
  reorder them either.
An ARM (weakly ordered) host would need a release store for the tail and head and an acquire
load for them on the other side (e.g. a small C helper with __atomic_store_n/__ATOMIC_RELEASE);
this module refuses nothing there, so do not run it on ARM without adding them.
"""

from __future__ import annotations

from collections.abc import Iterable

from ringserve.shm import layout as L
from ringserve.shm.segment import Segment

# nslots is a u32 in the record header; 2**30 slots is far beyond any sane ring.
MAX_SLOTS = 1 << 30
Message = tuple[int, bytes | memoryview, int, int]  # written: msg_id, payload, aux, meta
Record = tuple[int, int, int, bytes]  # read: msg_id, aux, meta, payload


class RingError(Exception):
    """The segment is not a ring of this version, or a record in it is corrupt."""


class Ring:
    """One direction of a worker's channel. Exactly one process produces, one consumes."""

    def __init__(self, segment: Segment, slot_size: int = 0, slot_count: int = 0) -> None:
        self.segment = segment
        buf = segment.buf
        if slot_size:  # creating: write the header
            if not _geometry_ok(slot_size, slot_count):
                raise ValueError(
                    f"slot_count must be a power of two up to {MAX_SLOTS} and slot_size a multiple "
                    f"of 8, at least {L.RECORD_SIZE + 8}"
                )
            L.RING_HEADER.pack_into(buf, 0, L.MAGIC_RING, L.VERSION, slot_size, slot_count)
        magic, version, slot_size, slot_count = L.RING_HEADER.unpack_from(buf, 0)
        if magic != L.MAGIC_RING or version != L.VERSION:
            raise RingError(f"segment {segment.name} is not a version {L.VERSION} ring")
        if not _geometry_ok(slot_size, slot_count):  # read from shared memory: check before use
            raise RingError(f"segment {segment.name} has a bad geometry {slot_size}x{slot_count}")
        if len(buf) < L.ring_bytes(slot_size, slot_count):
            raise RingError(f"segment {segment.name} is smaller than its header says")
        self.slot_size = slot_size
        self.slot_count = slot_count
        self.mask = slot_count - 1
        self._words = buf[: L.SLOTS_OFFSET].cast("q")
        self._tail_i = L.TAIL_OFFSET // 8
        self._head_i = L.HEAD_OFFSET // 8
        self._data = buf[L.SLOTS_OFFSET : L.ring_bytes(slot_size, slot_count)]
        # Producer-side cache of the consumer's head: re-read only when the ring looks full.
        self._head_seen = self._words[self._head_i]

    # -- producer -----------------------------------------------------------------------------
    def max_payload(self) -> int:
        """The largest payload that can ever fit: it takes the whole ring, so only when empty."""
        return self.slot_count * self.slot_size - L.RECORD_SIZE

    def _room(self, tail: int, slots: int) -> bool:
        """Whether `slots` more slots after `tail` are free; re-reads the head only when needed."""
        if tail + slots - self._head_seen <= self.slot_count:
            return True
        self._head_seen = self._words[self._head_i]
        return tail + slots - self._head_seen <= self.slot_count

    def try_write(
        self, msg_id: int, payload: bytes | memoryview, aux: int = 0, meta: int = 0
    ) -> bool:
        """Copy one message in and publish it; False when the ring is full (see write_many)."""
        return self.write_many(((msg_id, payload, aux, meta),)) == 1

    def write_many(self, messages: Iterable[Message]) -> int:
        """Write messages (msg_id, payload, aux, meta) in order and publish them with one
        store; returns how many fitted.

        A message that would run past the last slot is moved to slot 0 behind a PAD record.
        When the PAD fits but the message does not yet, the PAD is published alone: a message
        of more than half the ring could otherwise never fit (at slot s of an empty ring it
        needs the s slots before it, which only the consumer's passing the PAD frees), and
        publishing the PAD early never delays the message. The consumer skips PADs silently,
        without a doorbell, so such a message waits for the consumer's next look.
        A message of more than max_payload() bytes never fits; it publishes nothing.
        """
        tail = start_tail = self._words[self._tail_i]
        data = self._data
        size = self.slot_size
        count = 0
        for msg_id, payload, aux, meta in messages:
            length = len(payload)
            need = L.slots_for(length, size)
            if need > self.slot_count:
                break
            start = tail & self.mask
            if start + need > self.slot_count:
                pad = self.slot_count - start
                if not self._room(tail, pad):
                    break
                L.RECORD.pack_into(data, start * size, 0, 0, 0, L.FLAG_PAD, pad, 0)
                tail += pad
                start = 0
            if not self._room(tail, need):
                break
            off = start * size
            L.RECORD.pack_into(data, off, msg_id, aux, length, 0, need, meta)
            data[off + L.RECORD_SIZE : off + L.RECORD_SIZE + length] = payload
            tail += need
            count += 1
        if tail != start_tail:
            self._words[self._tail_i] = tail  # publish: after every payload
        return count

    # -- consumer -----------------------------------------------------------------------------
    def pending(self) -> int:
        """Slots published and not yet released (a consumer-side view)."""
        return self._words[self._tail_i] - self._words[self._head_i]

    def read(self, limit: int = 1 << 30) -> list[Record]:
        """Copy out up to `limit` published messages as (msg_id, aux, meta, payload); release
        them. Everything the producer wrote is checked before it is used (its tail, each
        record's slot count and length): a RingError releases nothing, and says the producer
        is broken or lying (the front-end then replaces that worker)."""
        head = self._words[self._head_i]
        tail = self._words[self._tail_i]
        if not 0 <= tail - head <= self.slot_count:  # the producer's word: trust nothing of it
            raise RingError(
                f"{self.segment.name}: tail {tail} is not within one ring of head {head}"
            )
        out: list[Record] = []
        data = self._data
        size = self.slot_size
        while head < tail and len(out) < limit:
            off = (head & self.mask) * size
            msg_id, aux, length, flags, nslots, meta = L.RECORD.unpack_from(data, off)
            if nslots < 1 or head + nslots > tail or (head & self.mask) + nslots > self.slot_count:
                raise RingError(f"corrupt record at slot {head & self.mask} of {self.segment.name}")
            if not flags & L.FLAG_PAD:
                if L.slots_for(length, size) != nslots:
                    raise RingError(f"record length {length} disagrees with its {nslots} slots")
                payload = bytes(data[off + L.RECORD_SIZE : off + L.RECORD_SIZE + length])
                out.append((msg_id, aux, meta, payload))
            head += nslots
        self._words[self._head_i] = head  # release: after the copies
        return out

    def close(self) -> None:
        # Views into the mapping must go before the segment can be closed.
        self._words.release()
        self._data.release()


def _geometry_ok(slot_size: int, slot_count: int) -> bool:
    return (
        0 < slot_count <= MAX_SLOTS
        and not slot_count & (slot_count - 1)
        and slot_size % 8 == 0
        and slot_size >= L.RECORD_SIZE + 8
    )
