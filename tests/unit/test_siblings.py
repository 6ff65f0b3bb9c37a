"""A lone batch's view of the pool (workers/runtime.py Siblings): the other workers' `busy`
words, read from their real control blocks in shared memory, as workers come and go."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
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


def test_idle_until_another_worker_is_busy(channels: list[Channel]) -> None:
    channels += [Channel.create(PID, 9100 + k, 8, 8) for k in range(3)]
    own, a, b = channels
    siblings = Siblings(PID, own.ctl_seg.name)
    assert siblings.idle(0.0)
    assert len(siblings.blocks) == 2  # its own block is not a sibling
    own.ctl.set("busy", 1)  # its own batch never counts
    assert siblings.idle(0.1)
    a.ctl.set("busy", 1)
    assert not siblings.idle(0.2)
    a.ctl.set("busy", 0)
    b.ctl.set("busy", 1)
    assert not siblings.idle(0.3)
    b.ctl.set("busy", 0)
    assert siblings.idle(0.4)


def test_workers_that_come_and_go_are_seen_at_the_next_scan(channels: list[Channel]) -> None:
    channels.append(Channel.create(PID, 9200, 8, 8))
    siblings = Siblings(PID, channels[0].ctl_seg.name)
    assert siblings.idle(0.0) and not siblings.blocks
    late = Channel.create(PID, 9201, 8, 8)
    channels.append(late)
    late.ctl.set("busy", 1)
    assert siblings.idle(0.5)  # not looked for again yet
    assert not siblings.idle(Siblings.RESCAN_S)
    late.ctl.set("busy", 0)
    late.close()  # the front-end unlinks a worker's channel after it exited
    for seg in (late.req_seg, late.rsp_seg, late.ctl_seg):
        seg.unlink()
    channels.remove(late)
    assert siblings.idle(2 * Siblings.RESCAN_S)
    assert not siblings.blocks  # its mapping is let go
