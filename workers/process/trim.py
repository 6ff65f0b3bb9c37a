"""Giving memory back once a worker is idle. glibc's malloc keeps what a burst freed (the
activations of its largest batches) for the next one, and the weights file's pages a burst read
(the rows of the token embeddings its texts used) stay resident in the worker. After
IDLE_TRIM_NS with no batch, both are given back, once an idle spell: malloc_trim(0), and the
pages of the file's read-only mappings dropped from the worker (they stay in the page cache: the
next text's rows come back from it in a minor fault each). OpenVINO maps model.onnx.data
read-only; ONNX Runtime maps it copy-on-write (rw-p), and such a mapping is left alone, since a
page it wrote would be lost.

Measured on the default model served bf16 (OpenVINO, 2 cores, 2026-12-07): after an 8 s load at
c=32 the worker's PSS was 199 MiB, 159 MiB two seconds later (38 MiB of it the embedding rows'
pages). The release and trim took 4-16 ms (a test suite running beside it); it comes only after
a second with nothing to do, so a text that arrives then waits that long at most."""

from __future__ import annotations

from collections.abc import Iterable

from ringserve.workers.pages import release_file_pages

IDLE_TRIM_NS = 1_000_000_000  # a second of nothing: past a burst's gaps, long before a scrape


class Trim:
    def __init__(self, dirs: Iterable[str]) -> None:
        self.dirs = sorted(set(dirs))  # the model directories whose files the worker maps
        self.last_ns = 0  # when a batch last started
        self.owed = True  # a batch ran since the last trim (the boot counts as one)

    def ran(self, now_ns: int) -> None:
        self.last_ns = now_ns
        self.owed = True

    def idle(self, now_ns: int, busy: bool) -> bool:
        """Called when nothing is to run (`busy`: a batch still runs somewhere): trims once the
        worker has been idle IDLE_TRIM_NS since its last batch; whether it trimmed."""
        if not self.owed or busy or now_ns - self.last_ns < IDLE_TRIM_NS:
            return False
        self.owed = False
        release_file_pages(self.dirs)
        return True
