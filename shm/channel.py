"""One worker's channel: its request and response rings, control block and two doorbells.

The front-end creates a channel (segments named `rs_<pid>_<serial>_<random>_<kind>`, reserved
before use: shm/segment.py; eventfds) and unlinks it after the worker has exited; the worker
attaches to the same names and only closes.
Both sides go through this module, so the segment kinds and ring geometry are written once.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringserve.shm import layout as L
from ringserve.shm.control import ControlBlock
from ringserve.shm.doorbell import EventFd, Semaphore
from ringserve.shm.ring import Ring
from ringserve.shm.segment import Segment


def request_ring_slots(max_body: int, max_frame: int, ring_slots: int) -> int:
    """ring_slots, raised to a power of two that holds the largest text a client may send
    twice over (a message that wraps needs its pad's room too), so every admitted text fits."""
    largest = max(max_body, max_frame) + L.RECORD_SIZE
    slots = max(1, ring_slots)
    while slots * L.REQUEST_SLOT_SIZE < 2 * largest:
        slots *= 2
    return 1 << (slots - 1).bit_length()


def response_ring_slots(ring_slots: int, max_queue: int) -> int:
    """Room for every answer the front-end may have outstanding with one worker."""
    return 1 << (2 * max(ring_slots, max_queue) - 1).bit_length()


@dataclass(frozen=True)
class ChannelNames:
    request: str
    response: str
    control: str


class Channel:
    """The shared structures between the front-end and one worker."""

    def __init__(
        self, req: Segment, rsp: Segment, ctl: Segment, requests: Ring, responses: Ring
    ) -> None:
        self.req_seg, self.rsp_seg, self.ctl_seg = req, rsp, ctl
        self.requests = requests
        self.responses = responses
        self.ctl = ControlBlock(ctl, create=req.owner)

    @classmethod
    def create(
        cls,
        server_pid: int,
        serial: int,
        req_slots: int,
        rsp_slots: int,
        predictable: bool = False,
    ) -> Channel:
        """The three segments, or none: a SegmentError (no room in /dev/shm) leaves nothing.
        `predictable`: test-only (segment.unique_names)."""
        sizes = {
            "req": L.ring_bytes(L.REQUEST_SLOT_SIZE, req_slots),
            "rsp": L.ring_bytes(L.RESPONSE_SLOT_SIZE, rsp_slots),
            "ctl": L.CONTROL_BYTES,
        }
        made: list[Segment] = []
        try:
            for kind, size in sizes.items():
                made.append(Segment.create_unique(server_pid, serial, kind, size, predictable))
        except BaseException:
            for seg in made:
                seg.close()
                seg.unlink()
            raise
        req, rsp, ctl = made
        return cls(
            req,
            rsp,
            ctl,
            Ring(req, L.REQUEST_SLOT_SIZE, req_slots),
            Ring(rsp, L.RESPONSE_SLOT_SIZE, rsp_slots),
        )

    @classmethod
    def attach(cls, names: ChannelNames) -> Channel:
        req = Segment.attach(names.request)
        rsp = Segment.attach(names.response)
        ctl = Segment.attach(names.control)
        return cls(req, rsp, ctl, Ring(req), Ring(rsp))

    @property
    def names(self) -> ChannelNames:
        return ChannelNames(self.req_seg.name, self.rsp_seg.name, self.ctl_seg.name)

    def close(self) -> None:
        """Drop every view into the segments, then the mappings."""
        self.requests.close()
        self.responses.close()
        self.ctl.close()
        for seg in (self.req_seg, self.rsp_seg, self.ctl_seg):
            seg.close()

    def unlink(self) -> None:
        """Remove the names (the creator only, after the worker has exited)."""
        for seg in (self.req_seg, self.rsp_seg, self.ctl_seg):
            seg.unlink()


class Doorbells:
    """The request semaphore (front-end posts, worker waits) and the answer eventfd."""

    def __init__(self, request: Semaphore | None = None, answer: EventFd | None = None) -> None:
        self.request = request if request is not None else Semaphore()
        self.answer = answer if answer is not None else EventFd()

    def fds(self) -> list[int]:
        return [self.request.fd, self.answer.fd]

    def close(self) -> None:
        self.request.close()
        self.answer.close()
