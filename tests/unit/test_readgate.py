"""The read gate every connection shares (service/protocols/readgate.py), on its own: reasons
add up and reading resumes only when none is left, a reason told twice is one pause, the ones
for good are never resumed, after EOF or a lost connection the transport is told nothing more,
and the turn's backlog is framed at the loop's next turn or at once. The connection tests are
test_read_pacing.py's."""

from __future__ import annotations

import asyncio

from ringserve.service.protocols.readgate import (
    BACKLOG,
    DRAINING,
    EOF,
    LOST,
    PIPELINE_FULL,
    WRITE_BLOCKED,
    ReadGate,
)


class Told:
    """A transport that keeps what it was told, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.calls.append("resume")


def attached(gate: ReadGate | None = None) -> tuple[ReadGate, Told]:
    gate = gate or ReadGate()
    told = Told()
    gate.attach(told)
    return gate, told


def test_a_reason_told_twice_is_one_pause_and_one_resume() -> None:
    gate, told = attached()
    gate.pause(WRITE_BLOCKED)
    gate.pause(WRITE_BLOCKED)
    assert told.calls == ["pause"] and gate.paused and gate.why == {WRITE_BLOCKED}
    gate.resume(WRITE_BLOCKED)
    gate.resume(WRITE_BLOCKED)
    assert told.calls == ["pause", "resume"] and not gate.paused and not gate.why


def test_reading_resumes_only_when_the_last_reason_goes() -> None:
    gate, told = attached()
    gate.pause(WRITE_BLOCKED)
    gate.pause(PIPELINE_FULL)
    gate.resume(WRITE_BLOCKED)
    assert told.calls == ["pause"] and gate.paused
    gate.resume(BACKLOG)  # never held: nothing changes
    assert told.calls == ["pause"]
    gate.resume(PIPELINE_FULL)
    assert told.calls == ["pause", "resume"]


def test_resumed_hears_only_a_real_resume() -> None:
    heard: list[int] = []
    gate, told = attached(ReadGate(resumed=lambda: heard.append(1)))
    gate.resume(WRITE_BLOCKED)
    assert heard == [] and told.calls == []
    gate.pause(WRITE_BLOCKED)
    gate.pause(PIPELINE_FULL)
    gate.resume(PIPELINE_FULL)
    assert heard == []
    gate.resume(WRITE_BLOCKED)
    assert heard == [1]


def test_draining_is_for_good_and_stops_the_transport() -> None:
    gate, told = attached()
    gate.pause(DRAINING)
    gate.resume(DRAINING)
    assert told.calls == ["pause"] and gate.done and not gate.lost


def test_after_eof_or_lost_the_transport_is_told_nothing_more() -> None:
    for end in (EOF, LOST):
        gate, told = attached()
        gate.pause(end)
        gate.pause(WRITE_BLOCKED)
        gate.resume(WRITE_BLOCKED)
        gate.resume(end)
        gate.drop_input()
        assert told.calls == [] and gate.done and gate.lost == (end == LOST)


def test_reasons_before_the_transport_are_told_when_it_comes() -> None:
    gate = ReadGate()
    gate.pause(WRITE_BLOCKED)
    gate, told = attached(gate)
    assert told.calls == ["pause"]


def test_dropping_input_reads_whatever_the_reasons() -> None:
    gate, told = attached()
    gate.pause(WRITE_BLOCKED)
    gate.drop_input()
    gate.pause(PIPELINE_FULL)
    assert told.calls == ["pause", "resume"] and not gate.paused


def test_a_backlog_is_framed_at_the_next_turn_and_reading_resumes() -> None:
    framed: list[int] = []

    async def run() -> tuple[list[str], list[str]]:
        gate, told = attached(ReadGate(8, lambda: framed.append(1)))
        gate.defer()
        gate.defer()  # the turn is asked for once
        at_once = list(told.calls)
        for _ in range(3):
            await asyncio.sleep(0)
        return at_once, told.calls

    at_once, after = asyncio.run(run())
    assert at_once == ["pause"] and after == ["pause", "resume"] and framed == [1]


def test_a_turn_that_leaves_a_backlog_again_keeps_reading_paused() -> None:
    turns = [3]

    async def run() -> tuple[ReadGate, Told]:
        def frame() -> None:
            turns[0] -= 1
            if turns[0]:
                gate.defer()

        gate, told = attached(ReadGate(8, frame))
        gate.pause(WRITE_BLOCKED)
        gate.defer()
        for _ in range(10):
            await asyncio.sleep(0)
        return gate, told

    gate, told = asyncio.run(run())
    assert turns == [0] and told.calls == ["pause"] and gate.why == {WRITE_BLOCKED}


def test_a_backlog_framed_at_once_leaves_its_turn_nothing_to_do() -> None:
    framed: list[int] = []

    async def run() -> Told:
        gate, told = attached(ReadGate(8, lambda: framed.append(1)))
        gate.defer()
        gate.turn()  # the drain: at once
        assert framed == [1] and not gate.backlog and told.calls == ["pause", "resume"]
        for _ in range(3):
            await asyncio.sleep(0)
        return told

    told = asyncio.run(run())
    assert framed == [1] and told.calls == ["pause", "resume"]


def test_a_lost_connections_backlog_is_never_framed() -> None:
    framed: list[int] = []

    async def run() -> Told:
        gate, told = attached(ReadGate(8, lambda: framed.append(1)))
        gate.defer()
        gate.pause(LOST)
        for _ in range(3):
            await asyncio.sleep(0)
        return told

    assert asyncio.run(run()).calls == ["pause"] and framed == []


def test_a_gate_given_a_loop_asks_it_for_the_turn() -> None:
    loop = asyncio.new_event_loop()
    try:
        framed: list[int] = []
        gate, told = attached(ReadGate(8, lambda: framed.append(1), loop=loop))
        gate.defer()  # no loop running: the turn is the given loop's
        loop.run_until_complete(asyncio.sleep(0))
        assert framed == [1] and told.calls == ["pause", "resume"]
    finally:
        loop.close()
