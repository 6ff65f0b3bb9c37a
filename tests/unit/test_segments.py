"""Our own segments can't be taken from us or sink us (issue 56): a worker's segments have
random names, each created with O_EXCL and tried again under another name when one is taken;
their space is reserved (posix_fallocate) before a page is touched, so a full /dev/shm is a
SegmentError that leaves nothing behind, never SIGBUS. tests/system/test_hostile_shm.py runs
both against a real server (a squatted name, a full private tmpfs)."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator

import pytest
from ringserve.shm import layout as L
from ringserve.shm import segment as segment_mod
from ringserve.shm.channel import Channel
from ringserve.shm.segment import (
    NAME_TRIES,
    SHM_DIR,
    Segment,
    SegmentError,
    list_segments,
    segment_name,
)

PID = os.getpid()


@pytest.fixture(autouse=True)
def nothing_left() -> Iterator[None]:
    yield
    assert list_segments(PID) == []


def test_names_are_random_and_keep_the_server_pid_first() -> None:
    made = [Segment.create_unique(PID, 7, "req", 4096) for _ in range(3)]
    try:
        names = [s.name for s in made]
        assert len(set(names)) == 3
        for name in names:
            pid, serial, token, kind = name.removeprefix("rs_").split("_")
            assert (pid, serial, kind) == (str(PID), "7", "req") and len(token) == 16
            assert segment_mod._NAME.match(name).group(1) == str(PID)  # remove_stale reads it
            assert os.stat(os.path.join(SHM_DIR, name)).st_mode & 0o777 == 0o600
    finally:
        for s in made:
            s.close()
            s.unlink()


def test_a_squatted_name_is_left_alone_and_another_one_taken() -> None:
    squatted = os.path.join(SHM_DIR, segment_name(PID, 8, "rsp"))
    with open(squatted, "wb") as f:
        f.write(b"someone else's")
    try:
        seg = Segment.create_unique(PID, 8, "rsp", 8192, predictable=True)
        assert seg.name != os.path.basename(squatted) and len(seg.buf) == 8192
        assert bytes(seg.buf[:16]) == bytes(16)
        seg.close()
        seg.unlink()
        with open(squatted, "rb") as f:
            assert f.read() == b"someone else's"  # never opened, truncated or unlinked
    finally:
        os.unlink(squatted)


def test_no_free_name_after_the_tries_is_a_segment_error(monkeypatch) -> None:
    monkeypatch.setattr(segment_mod.secrets, "token_hex", lambda n: "feedfacefeedface")
    taken = os.path.join(SHM_DIR, segment_name(PID, 9, "ctl", "feedfacefeedface"))
    open(taken, "wb").close()
    try:
        with pytest.raises(SegmentError, match=f"after {NAME_TRIES} tries"):
            Segment.create_unique(PID, 9, "ctl", 4096)
    finally:
        os.unlink(taken)


def test_a_full_shm_is_a_segment_error_that_leaves_nothing(monkeypatch) -> None:
    def full(fd: int, offset: int, size: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(segment_mod.os, "posix_fallocate", full)
    with pytest.raises(SegmentError, match=r"no room in /dev/shm for a 0\.0 MiB segment"):
        Segment.create_unique(PID, 10, "ctl", 4096)


def test_a_channel_is_made_whole_or_not_at_all(monkeypatch) -> None:
    """The third segment finds no room: the two made before it are removed."""
    real = os.posix_fallocate
    calls = []

    def third_full(fd: int, offset: int, size: int) -> None:
        calls.append(size)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, offset, size)

    monkeypatch.setattr(segment_mod.os, "posix_fallocate", third_full)
    with pytest.raises(SegmentError, match="No space left"):
        Channel.create(PID, 11, 8, 8)
    assert calls[2] == L.CONTROL_BYTES


def test_a_segment_is_reserved_whole_before_use() -> None:
    """posix_fallocate: every block of it is allocated at create, none left to fault in."""
    seg = Segment.create_unique(PID, 12, "req", 1 << 20)
    try:
        st = os.stat(os.path.join(SHM_DIR, seg.name))
        assert st.st_size == 1 << 20 and st.st_blocks * 512 >= 1 << 20
    finally:
        seg.close()
        seg.unlink()
