"""A lone batch's view of the pool (workers/runtime.py Siblings): the other workers' `busy`
words, read from their real control blocks in shared memory, as workers come and go."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from ringserve.shm import layout as L
from ringserve.shm.channel import Channel
from ringserve.shm.segment import list_segments
from ringserve.workers.runtime import Siblings

PID = os.getpid()  # a live "server": no other server's start-up cleans these segments away


@pytest.fixture
def channels() -> Iterator[list[Channel]]:
    made: list[Channel] = []
    yield made
    for ch in made:
        ch.close()
        for seg in (ch.req_seg, ch.rsp_seg, ch.ctl_seg):
            seg.unlink()
    assert list_segments(PID) == []


MS = 1_000_000
T0 = 10_000 * MS  # any monotonic time past the first rescan


def test_idle_until_another_worker_is_busy_or_just_was(channels: list[Channel]) -> None:
    channels += [Channel.create(PID, 9100 + k, 8, 8) for k in range(3)]
    own, a, b = channels
    siblings = Siblings(PID, own.ctl_seg.name)
    assert siblings.idle(T0)  # 0: never ran a batch
    assert len(siblings.blocks) == 2  # its own block is not a sibling
    own.ctl.set("busy", L.BUSY)  # its own batch never counts
    assert siblings.idle(T0 + 1 * MS)
    a.ctl.set("busy", L.BUSY)
    assert not siblings.idle(T0 + 2 * MS)
    a.ctl.set("busy", T0 + 3 * MS)  # its batch ended: quiet only QUIET_NS later
    assert not siblings.idle(T0 + 3 * MS + Siblings.QUIET_NS - 1)
    assert siblings.idle(T0 + 3 * MS + Siblings.QUIET_NS)
    b.ctl.set("busy", L.BUSY)
    assert not siblings.idle(T0 + 10 * MS)
    b.ctl.set("busy", T0 + 10 * MS)
    assert siblings.idle(T0 + 20 * MS)


def test_workers_that_come_and_go_are_seen_at_the_next_scan(channels: list[Channel]) -> None:
    channels.append(Channel.create(PID, 9200, 8, 8))
    siblings = Siblings(PID, channels[0].ctl_seg.name)
    rescan = int(Siblings.RESCAN_S * 1e9)
    assert siblings.idle(T0) and not siblings.blocks
    late = Channel.create(PID, 9201, 8, 8)
    channels.append(late)
    late.ctl.set("busy", L.BUSY)
    assert siblings.idle(T0 + rescan // 2)  # not looked for again yet
    assert not siblings.idle(T0 + rescan)
    late.ctl.set("busy", T0)
    late.close()  # the front-end unlinks a worker's channel after it exited
    for seg in (late.req_seg, late.rsp_seg, late.ctl_seg):
        seg.unlink()
    channels.remove(late)
    assert siblings.idle(T0 + 2 * rescan)
    assert not siblings.blocks  # its mapping is let go
