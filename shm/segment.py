"""Named shared-memory segments: the front-end creates and unlinks them, workers only attach.

A worker's segments are named `rs_<server pid>_<worker serial>_<random>_<kind>`: the pid lets a
starting server tell which segments belong to a server that no longer runs and remove them; the
random part (64 bits from `secrets`) means nobody can take a name first. Each is created with
O_EXCL (never someone else's file), and a name found taken is tried again under another
(`create_unique`). Its space is reserved with posix_fallocate before any page is touched: on a
full /dev/shm a page touched through the mapping would be SIGBUS, here it is a SegmentError
that the caller answers (the supervisor refuses that spawn and keeps serving).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
from collections.abc import Iterator
from multiprocessing import resource_tracker, shared_memory

PREFIX = "rs_"
_NAME = re.compile(r"^rs_(\d+)_")
SHM_DIR = "/dev/shm"
NAME_TRIES = 8  # names tried before a create gives up (one taken by chance: 2**-64)


class SegmentError(Exception):
    """A segment could not be created: /dev/shm has no room for it, or no name was free."""


def segment_name(server_pid: int, serial: int, kind: str, token: str = "") -> str:
    """`rs_<pid>_<serial>_<token>_<kind>`; without a token the predictable name, for tests."""
    middle = f"{serial}_{token}" if token else str(serial)
    return f"{PREFIX}{server_pid}_{middle}_{kind}"


def unique_names(
    server_pid: int, serial: int, kind: str, predictable: bool = False
) -> Iterator[str]:
    """Names to try for one segment, each with a fresh random token. `predictable` (test-only:
    RINGSERVE_TEST_PREDICTABLE_SEGMENTS) tries the predictable name first, so that a test can
    take it first, as anyone could before the names were random."""
    if predictable:
        yield segment_name(server_pid, serial, kind)
    while True:
        yield segment_name(server_pid, serial, kind, secrets.token_hex(8))


def free_bytes() -> int | None:
    """What /dev/shm can still hold (None when it cannot be read)."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def reserve(name: str, size: int) -> None:
    """Create `name` (never an existing file: O_EXCL, no link followed, mode 0600) and reserve
    its `size` bytes. Raises FileExistsError when the name is taken, SegmentError when there is
    no room; leaves nothing behind on failure."""
    path = os.path.join(SHM_DIR, name)
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        os.unlink(path)
        if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            free = free_bytes()
            room = f" ({free / 2**20:.1f} MiB free)" if free is not None else ""
            raise SegmentError(
                f"no room in {SHM_DIR} for a {size / 2**20:.1f} MiB segment{room}: {exc.strerror}"
            ) from None
        raise SegmentError(f"cannot reserve {size} bytes for {name}: {exc.strerror}") from None
    finally:
        os.close(fd)


class Segment:
    """One shared-memory segment and its mapping."""

    def __init__(self, shm: shared_memory.SharedMemory, owner: bool) -> None:
        self._shm = shm
        self.owner = owner
        self.name = shm.name
        self.buf: memoryview = shm.buf  # type: ignore[assignment]

    @classmethod
    def create(cls, name: str, size: int) -> Segment:
        """A new segment of `size` zero bytes under `name` (FileExistsError when taken)."""
        reserve(name, size)  # new and reserved: its pages are zero, and touching one is safe
        try:
            shm = shared_memory.SharedMemory(name=name)  # the tracker unlinks it if we die
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(SHM_DIR, name))
            raise
        return cls(shm, owner=True)

    @classmethod
    def create_unique(
        cls, server_pid: int, serial: int, kind: str, size: int, predictable: bool = False
    ) -> Segment:
        """A worker's segment under a random name, another one tried when a name is taken."""
        names = unique_names(server_pid, serial, kind, predictable)
        for _ in range(NAME_TRIES):
            try:
                return cls.create(next(names), size)
            except FileExistsError:
                continue
        raise SegmentError(f"no free segment name for worker {serial} after {NAME_TRIES} tries")

    @classmethod
    def attach(cls, name: str) -> Segment:
        # Python 3.11 registers every attached segment with the resource tracker, which would
        # unlink it when this (non-owning) process exits: keep the tracker out of it.
        saved = resource_tracker.register
        resource_tracker.register = lambda *args, **kwargs: None
        try:
            shm = shared_memory.SharedMemory(name=name)
        finally:
            resource_tracker.register = saved
        return cls(shm, owner=False)

    def close(self) -> None:
        try:
            self._shm.close()
        except BufferError:
            pass  # a view is still alive; the mapping goes with the process

    def unlink(self) -> None:
        if self.owner:
            with contextlib.suppress(FileNotFoundError):
                self._shm.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(keep_pid: int | None = None) -> list[str]:
    """Unlink segments whose server pid no longer runs; returns the names removed."""
    removed: list[str] = []
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return removed
    for name in names:
        m = _NAME.match(name)
        if not m:
            continue
        pid = int(m.group(1))
        if pid == keep_pid or _alive(pid):
            continue
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed


def list_segments(server_pid: int) -> list[str]:
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(f"{PREFIX}{server_pid}_"))
    except FileNotFoundError:
        return []
