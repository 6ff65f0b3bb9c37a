"""Triton's system shared-memory extension: regions a co-located client created (POSIX shared
memory, `shm_open` keys) and registered by name, so that a KServe request's inputs are read
from, and its outputs written to, the client's memory instead of the socket. The client owns
each region: the server opens it on register and closes it on unregister or at exit, and never
unlinks it. Every offset and size is checked against the registered range before any byte is
touched; a bad one is a 400 (gRPC INVALID_ARGUMENT), for that request alone.

A region is the client's and may change under us: it is never mapped. A mapping of a file the
client then truncates turns the next access into SIGBUS, which kills the front-end and every
client with it. Its bytes move by os.pread / os.pwrite on the descriptor kept from register,
after a look at the file's size now; a read that comes back short (truncated meanwhile) is a
400 as well, and a write racing a truncation only grows the client's file again. The key is
opened without following a link, and must be a regular file.

Registered over HTTP (protocols/shm_regions.py) or gRPC (SystemSharedMemoryRegister, ...Status,
...Unregister: protocols/rpc/triton.py), into the one registry of this process, REGIONS.
"""

from __future__ import annotations

import atexit
import os
import stat
from dataclasses import dataclass
from typing import Any

from msgspec import UNSET
from ringserve.service.kserve import bodies
from ringserve.service.request.errors import RequestError, Rule
from ringserve.service.request.options import as_integer
from ringserve.shm import segment

MAX_REGIONS = 256  # regions at once: each holds a file descriptor


SHM_DIR = "/dev/shm"  # where Linux keeps shm_open's objects


UNKNOWN_REGION = Rule("no shared-memory region {name} is registered")
# What a well-formed register can still be refused for (SystemRegions.register): the key and
# the range it names
BAD_KEY = Rule("shared-memory key {key} is not a POSIX shared-memory name")
OWN_SEGMENT = Rule("shared-memory key {key} names one of the server's own segments")
TAKEN = Rule("shared-memory region {name} is already registered")
FULL = Rule("{n} shared-memory regions are registered already")
UNOPENED = Rule("cannot open shared memory {key}: {why}")
PAST_END = Rule("region {at} runs past the {n} bytes of {key}")
REGISTER_RULES = (UNOPENED, BAD_KEY, OWN_SEGMENT, TAKEN, PAST_END, FULL)
NO_CUDA = "CUDA shared memory is not served: ringserve's tensors live in host memory"


PARAM_REGION = "shared_memory_region"


PARAM_OFFSET = "shared_memory_offset"


PARAM_SIZE = "shared_memory_byte_size"


@dataclass(slots=True)
class Region:
    """One registered region: `byte_size` bytes from `offset` of the object named `key`,
    read and written through `fd` (opened at register, closed at unregister)."""

    name: str
    key: str
    offset: int
    byte_size: int
    fd: int

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }


@dataclass(slots=True, frozen=True)
class Placement:
    """Where a request puts one tensor: a region, an offset in it and a byte size."""

    region: str
    offset: int
    byte_size: int


def key_path(key: str) -> str:
    """The file of a shm_open key ("/name" or "name"); nothing outside /dev/shm."""
    name = key[1:] if key.startswith("/") else key
    if not name or "/" in name or "\0" in name or name in (".", ".."):
        raise RequestError(400, BAD_KEY.say(key=repr(key)))
    if name.startswith(segment.PREFIX):  # the server's own rings: never a client's to map
        raise RequestError(400, OWN_SEGMENT.say(key=repr(key)))
    return os.path.join(SHM_DIR, name)


def as_count(value: Any, where: str) -> int:
    """A non-negative integer (3.0 is one, as a body's Struct reads a JSON integer)."""
    count = as_integer(value)
    if count is None or count < 0:
        raise RequestError(400, f"{where} must be a non-negative integer")
    return count


class SystemRegions:
    """The registered regions of this server, by name (one front-end process holds them)."""

    def __init__(self) -> None:
        self.regions: dict[str, Region] = {}

    def register(self, name: str, key: str, offset: Any, byte_size: Any) -> None:
        """Map `byte_size` bytes at `offset` of `key`; 400 when it cannot be (a name already
        registered, a missing object, a range past its end)."""
        if not name:
            raise RequestError(400, "a shared-memory region needs a name")
        if name in self.regions:
            raise RequestError(400, TAKEN.say(name=repr(name)))
        if len(self.regions) >= MAX_REGIONS:
            raise RequestError(400, FULL.say(n=MAX_REGIONS))
        offset, byte_size = as_count(offset, "offset"), as_count(byte_size, "byte_size")
        if byte_size == 0:
            raise RequestError(400, "byte_size must be positive")
        path = key_path(key)
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO never blocks
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            raise RequestError(400, UNOPENED.say(key=repr(key), why=exc.strerror)) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise RequestError(400, f"shared memory {key!r} is not a regular file")
            if offset + byte_size > st.st_size:
                raise RequestError(
                    400, PAST_END.say(at=f"{offset}+{byte_size}", n=st.st_size, key=repr(key))
                )
        except BaseException:
            os.close(fd)
            raise
        self.regions[name] = Region(name, key, offset, byte_size, fd)

    def unregister(self, name: str | None = None) -> None:
        """Unmap one region (an unknown name is no error, as Triton has it), or all of them."""
        names = list(self.regions) if name is None else [name]
        for n in names:
            region = self.regions.pop(n, None)
            if region is not None:
                os.close(region.fd)

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        if name is None:
            return [r.status() for r in self.regions.values()]
        region = self.regions.get(name)
        if region is None:
            raise RequestError(400, UNKNOWN_REGION.say(name=repr(name)))
        return [region.status()]

    def span(self, where: Placement, size: int | None = None) -> tuple[Region, int, int]:
        """(region, position in its file, length) for a placement, checked against the range
        registered and against the file as it is now; `size` is what is read or written when
        it is known (an output's bytes: at most the placement's)."""
        region = self.regions.get(where.region)
        if region is None:
            raise RequestError(400, UNKNOWN_REGION.say(name=repr(where.region)))
        length = where.byte_size if size is None else size
        if size is not None and size > where.byte_size:
            raise RequestError(
                400,
                f"output needs {size} bytes, shared_memory_byte_size is {where.byte_size}",
            )
        if where.offset + where.byte_size > region.byte_size:
            raise RequestError(
                400,
                f"offset {where.offset} + byte size {where.byte_size} runs past region "
                f"{region.name!r} ({region.byte_size} bytes)",
            )
        position = region.offset + where.offset
        now = os.fstat(region.fd).st_size  # the client may have cut its file since register
        if position + length > now:
            raise truncated(region, now)
        return region, position, length

    def read(self, where: Placement) -> bytes:
        """A copy of the placement's bytes (the client may change its memory after)."""
        region, position, length = self.span(where)
        data = os.pread(region.fd, length, position)
        if len(data) != length:  # cut between the size's look and the read
            raise truncated(region, os.fstat(region.fd).st_size)
        return data

    def write(self, where: Placement, data: bytes) -> None:
        region, position, length = self.span(where, len(data))
        view = memoryview(data)
        while view:  # a file on tmpfs takes it whole; a short write is retried, not lost
            view = view[os.pwrite(region.fd, view, position + length - len(view)) :]


def truncated(region: Region, size: int) -> RequestError:
    return RequestError(
        400,
        f"shared-memory region {region.name!r} is no longer whole: {region.key!r} holds "
        f"{size} bytes, the region was registered at {region.offset}+{region.byte_size}",
    )


def placement(params: bodies.Placement | None, where: str) -> Placement | None:
    """A tensor's shared-memory parameters, checked; None when it names no region."""
    if params is None:
        return None
    region = params.shared_memory_region
    offset, size = params.shared_memory_offset, params.shared_memory_byte_size
    if region is UNSET:
        if offset is not UNSET or size is not UNSET:
            raise RequestError(400, f"{where}: shared-memory offset or size without a region")
        return None
    if not isinstance(region, str) or not region:
        raise RequestError(400, f"{where}: {PARAM_REGION} must be a region's name")
    if size is UNSET:
        raise RequestError(400, f"{where}: {PARAM_REGION} needs {PARAM_SIZE}")
    offset = as_count(0 if offset is UNSET else offset, f"{where}: {PARAM_OFFSET}")
    return Placement(region, offset, as_count(size, f"{where}: {PARAM_SIZE}"))


REGIONS = SystemRegions()  # this process's: HTTP and gRPC register into the same ones
atexit.register(REGIONS.unregister)
