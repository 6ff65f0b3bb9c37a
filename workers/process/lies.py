"""Test-only: a worker that lies (RINGSERVE_TEST_LYING_WORKER=KIND[:N], workers/testhooks.py).

Worker serial 1 writes one malformed answer in place of its (N+1)th, of one KIND:
- "record": a record whose length disagrees with its slot count (shm/ring.py refuses it);
- "tail": a tail published four rings past the head (more than the ring can hold);
- "payload": a response header that counts more floats than follow it (shm/layout.py);
- "status": a status no worker gives;
- "label": a well-formed answer whose n and label_id are past the model's labels (only the
  front-end's check against the model's shape sees it: engine/answers.py answer_problem).

Nothing outside a worker can make its ring hold such a record, so the front-end's handling of
one (the worker killed and replaced, what it held rerouted) is tested through this hook.
"""

from __future__ import annotations

import struct

from ringserve.shm import layout as L
from ringserve.shm.ring import Ring
from ringserve.workers.spec import WorkerSpec
from ringserve.workers.testhooks import HOOKS

KINDS = ("record", "tail", "payload", "status", "label")
_WORD = struct.Struct("<q")


class Lie:
    def __init__(self, kind: str, after: int) -> None:
        if kind not in KINDS:
            raise ValueError(f"RINGSERVE_TEST_LYING_WORKER: {kind!r} is not one of {KINDS}")
        self.kind = kind
        self.after = after  # honest answers before the lie
        self.told = False

    @classmethod
    def from_hook(cls, spec: WorkerSpec, hook: str | None = None) -> Lie | None:
        """The lie this worker tells (only worker serial 1, so its replacement is honest)."""
        hook = HOOKS.lying_worker if hook is None else hook
        if not hook or spec.serial != 1:
            return None
        kind, _, after = hook.partition(":")
        return cls(kind, int(after or 0))

    def due(self, answers: int) -> bool:
        """Whether the lie replaces one of the next `answers` answers."""
        if self.told:
            return False
        if self.after >= answers:
            self.after -= answers
            return False
        return True

    def tell(self, ring: Ring, msg_id: int) -> None:
        """Publish the lie on the ring, in place of the answer to `msg_id`."""
        self.told = True
        buf = ring.segment.buf
        tail = _WORD.unpack_from(buf, L.TAIL_OFFSET)[0]
        if self.kind == "tail":
            _WORD.pack_into(buf, L.TAIL_OFFSET, tail + 4 * ring.slot_count)
            return
        if self.kind == "record":
            off = L.SLOTS_OFFSET + (tail & (ring.slot_count - 1)) * ring.slot_size
            L.RECORD.pack_into(buf, off, msg_id, 0, 1 << 20, 0, 1, 0)  # 1 MiB in one slot
            _WORD.pack_into(buf, L.TAIL_OFFSET, tail + 1)
            return
        if self.kind == "payload":
            payload = L.pack_response(L.STATUS_OK, n=1000) + bytes(8)  # 1000 floats: 2 follow
        elif self.kind == "status":
            payload = L.pack_response(200)
        else:  # label: 200 scores, the 150th the best; no model of ours has 200 labels
            payload = L.RESPONSE.pack(L.STATUS_OK, 0, 150, 200, 0, 0, 0, 0, 0, 0, 0)
            payload += bytes(4 * 200)
        ring.write_many([(msg_id, payload, 0, 0)])
