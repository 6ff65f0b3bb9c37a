"""The system shared-memory registry in process, over a real POSIX shared-memory object: every
placement is checked against the registered range, and against the file as it is now, before a
byte moves; a region is never mapped (a truncated one would be SIGBUS), and unregister closes
it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from multiprocessing import shared_memory

import pytest
from ringserve.service.kserve import bodies
from ringserve.service.kserve.regions import Placement, SystemRegions, placement
from ringserve.service.request.errors import RequestError


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
        with pytest.raises(RequestError, match=why):
            regions.read(bad)
    with pytest.raises(RequestError, match="needs 8 bytes"):
        regions.write(Placement("r", 0, 4), b"12345678")
    assert bytes(segment.buf[5000:5004]) == b"\0\0\0\0"  # the refused write touched nothing
    fd = regions.regions["r"].fd
    regions.unregister("r")
    assert regions.status() == []
    with pytest.raises(OSError):
        os.fstat(fd)  # closed
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
        with pytest.raises(RequestError, match=why):
            regions.register(*args)
    regions.register("a", key, 0, 8)
    with pytest.raises(RequestError, match="already registered"):
        regions.register("a", key, 0, 8)
    regions.unregister()
    assert not regions.regions


def test_placement_parameters() -> None:
    """A tensor's parameters as its Struct holds them: built by gRPC unchecked, so the types
    are checked here too."""
    assert placement(None, "input text") is None
    assert placement(bodies.Placement(), "input text") is None
    params = {"shared_memory_region": "r", "shared_memory_byte_size": 16}
    assert placement(bodies.Placement(**params), "x") == Placement("r", 0, 16)
    for bad in (
        {"shared_memory_region": "r"},
        {"shared_memory_offset": 4},
        {"shared_memory_region": "r", "shared_memory_byte_size": -1},
        {"shared_memory_region": 3, "shared_memory_byte_size": 1},
    ):
        with pytest.raises(RequestError):
            placement(bodies.Placement(**bad), "x")  # type: ignore[arg-type]


def test_a_region_truncated_after_register_is_a_400_never_a_crash(
    segment: shared_memory.SharedMemory,
) -> None:
    """The attack of issue 56: register, then cut the file. A mapping would SIGBUS here."""
    regions = SystemRegions()
    regions.register("r", "/" + segment.name, 4096, 4096)
    path = f"/dev/shm/{segment.name}"
    os.truncate(path, 5000)  # the region's first 904 bytes are still there
    assert regions.read(Placement("r", 0, 904)) == bytes(904)
    for where in (Placement("r", 0, 905), Placement("r", 1000, 8)):
        with pytest.raises(RequestError, match="no longer whole") as info:
            regions.read(where)
        assert info.value.status == 400
        with pytest.raises(RequestError, match="no longer whole"):
            regions.write(where, b"x" * where.byte_size)
    assert os.stat(path).st_size == 5000  # the refused write did not grow it
    os.truncate(path, 0)
    with pytest.raises(RequestError, match="holds 0 bytes"):
        regions.read(Placement("r", 0, 1))
    os.truncate(path, 8192)  # whole again: served again
    regions.write(Placement("r", 8, 4), b"back")
    assert regions.read(Placement("r", 8, 4)) == b"back"
    regions.unregister()


def test_register_refuses_links_and_what_is_not_a_regular_file(
    segment: shared_memory.SharedMemory,
) -> None:
    """A local user's link in /dev/shm to a file of ours, or a FIFO (which would block an
    open), is refused at register."""
    link = f"/dev/shm/rs-unit-link-{os.getpid()}"
    fifo = f"/dev/shm/rs-unit-fifo-{os.getpid()}"
    os.symlink(f"/dev/shm/{segment.name}", link)
    os.mkfifo(fifo)
    regions = SystemRegions()
    try:
        with pytest.raises(RequestError, match="cannot open shared memory"):
            regions.register("l", "/" + os.path.basename(link), 0, 8)
        with pytest.raises(RequestError, match="not a regular file"):
            regions.register("f", "/" + os.path.basename(fifo), 0, 8)
    finally:
        os.unlink(link)
        os.unlink(fifo)
    assert not regions.regions
