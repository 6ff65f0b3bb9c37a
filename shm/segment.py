"""Named shared-memory segments: the front-end creates and unlinks them, workers only attach.

Names are `rs_<server pid>_<worker serial>_<kind>`, so a starting server can tell which segments
belong to a server that no longer runs and remove them.
"""

from __future__ import annotations

import contextlib
import os
import re
from multiprocessing import resource_tracker, shared_memory

PREFIX = "rs_"
_NAME = re.compile(r"^rs_(\d+)_")
SHM_DIR = "/dev/shm"


def segment_name(server_pid: int, serial: int, kind: str) -> str:
    return f"{PREFIX}{server_pid}_{serial}_{kind}"


class Segment:
    """One shared-memory segment and its mapping."""

    def __init__(self, shm: shared_memory.SharedMemory, owner: bool) -> None:
        self._shm = shm
        self.owner = owner
        self.name = shm.name
        self.buf: memoryview = shm.buf  # type: ignore[assignment]

    @classmethod
    def create(cls, name: str, size: int) -> Segment:
        shm = shared_memory.SharedMemory(name=name, create=True, size=size)
        shm.buf[:size] = bytes(size)  # type: ignore[index]
        return cls(shm, owner=True)

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
