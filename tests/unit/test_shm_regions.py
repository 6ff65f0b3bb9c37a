"""The system shared-memory registry in process, over a real POSIX shared-memory object: every
placement is checked against the registered range before a byte moves, and unregister unmaps."""

from __future__ import annotations

import os
from collections.abc import Iterator
from multiprocessing import shared_memory

import pytest
from ringserve.service.protocols.http import HttpError
from ringserve.service.protocols.shm_regions import Placement, SystemRegions, placement


@pytest.fixture
def segment() -> Iterator[shared_memory.SharedMemory]:
    seg = shared_memory.SharedMemory(f"rs-unit-{os.getpid()}", create=True, size=8192)
    yield seg
    seg.close()
    seg.unlink()


def test_read_and_write_within_the_registered_range(segment: shared_memory.SharedMemory) -> None:
    regions = SystemRegions()
    regions.register("r", "/" + segment.name, 5000, 100)  # an offset off a page boundary
    segment.buf[5000 + 10 : 5000 + 14] = b"abcd"
    assert regions.read(Placement("r", 10, 4)) == b"abcd"
    regions.write(Placement("r", 96, 4), b"wxyz")
    assert bytes(segment.buf[5096:5100]) == b"wxyz"
    assert regions.status() == [
        {"name": "r", "key": "/" + segment.name, "offset": 5000, "byte_size": 100}
    ]
    for bad, why in (
        (Placement("r", 97, 4), "runs past region"),
        (Placement("nowhere", 0, 4), "no shared-memory region"),
    ):
        with pytest.raises(HttpError, match=why):
            regions.read(bad)
    with pytest.raises(HttpError, match="needs 8 bytes"):
        regions.write(Placement("r", 0, 4), b"12345678")
    assert bytes(segment.buf[5000:5004]) == b"\0\0\0\0"  # the refused write touched nothing
    mapping = regions.regions["r"].mapping
    regions.unregister("r")
    assert mapping.closed and regions.status() == []
    regions.unregister("r")  # an unknown name is no error


def test_register_refuses_what_cannot_be_mapped(segment: shared_memory.SharedMemory) -> None:
    regions = SystemRegions()
    key = "/" + segment.name
    cases = [
        (("a", key, 8000, 500), "runs past the 8192 bytes"),
        (("a", "/rs-no-such-object", 0, 8), "cannot open shared memory"),
        (("a", "/../etc/passwd", 0, 8), "not a POSIX shared-memory name"),
        (("a", "/rs_1_2_requests", 0, 8), "the server's own segments"),
        (("a", key, -1, 8), "offset must be a non-negative integer"),
        (("a", key, 0, 0), "byte_size must be positive"),
        (("", key, 0, 8), "needs a name"),
    ]
    for args, why in cases:
        with pytest.raises(HttpError, match=why):
            regions.register(*args)
    regions.register("a", key, 0, 8)
    with pytest.raises(HttpError, match="already registered"):
        regions.register("a", key, 0, 8)
    regions.unregister()
    assert not regions.regions


def test_placement_parameters() -> None:
    assert placement({}, "input text") is None
    params = {"shared_memory_region": "r", "shared_memory_byte_size": 16}
    assert placement(params, "x") == Placement("r", 0, 16)
    for bad in (
        {"shared_memory_region": "r"},
        {"shared_memory_offset": 4},
        {"shared_memory_region": "r", "shared_memory_byte_size": -1},
        {"shared_memory_region": 3, "shared_memory_byte_size": 1},
    ):
        with pytest.raises(HttpError):
            placement(bad, "x")
