"""A process's resident pages of the model files it maps, dropped (workers/process/trim.py, and
workers/runtimes/openvino.py after a compile)."""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterable
from pathlib import Path

_MADV_DONTNEED = 4  # linux/mman.h


def release_file_pages(dirs: Iterable[str | Path], maps: str = "/proc/self/maps") -> int:
    """Drop this process's resident pages of the read-only mappings of files in `dirs` (the
    ONNX graph's weights), and give malloc's free memory back: bytes of mappings released.

    OpenVINO maps model.onnx.data to read it and keeps the mapping as long as the compiled
    model lives, every page of it resident after the compile, though the compiled model runs
    on bf16 copies of its own. Dropped, a page it reads again comes back from the page cache
    (about 16 of the 86 MiB of the default model, over a grid of shapes); the mapping is
    read-only (r--s), so nothing written is lost. Measured on the default model: a worker's
    mapping 86 -> 0 MiB after the compile, the same scores before and after
    (docs/guides/runtimes.md, "bf16's memory")."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    prefixes = tuple(str(Path(d).resolve()) + "/" for d in dirs)
    released = 0
    with open(maps) as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or not fields[5].strip().startswith(prefixes) or "w" in fields[1]:
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if libc.madvise(start, end - start, _MADV_DONTNEED) == 0:
                released += end - start
    with contextlib.suppress(AttributeError):  # glibc's; musl has none
        libc.malloc_trim(0)
    return released
