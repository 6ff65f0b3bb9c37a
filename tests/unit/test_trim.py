"""process/trim.py: a worker idle for a second gives back the weights file's pages it read and
malloc's free memory, once an idle spell; never a page of a mapping it may have written."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from ringserve.workers.pages import release_file_pages
from ringserve.workers.process.trim import IDLE_TRIM_NS, Trim

MIB = 1 << 20


def resident_kib(path: Path) -> int:
    """Rss of this process's mappings of `path` (/proc/self/smaps)."""
    total, ours = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:
                ours = len(head) >= 6 and head[5] == str(path)
            elif ours and line.startswith("Rss:"):
                total += int(head[1])
    return total


def test_a_read_only_mapping_is_released_and_reads_the_same_after(tmp_path: Path) -> None:
    data = tmp_path / "model.onnx.data"
    data.write_bytes(os.urandom(4 * MIB))
    with open(data, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)  # shared, read-only: as OpenVINO's
    try:
        before = bytes(m)  # every page read: resident
        assert resident_kib(data) >= 4 * 1024 - 8
        released = release_file_pages([tmp_path])
        assert released >= 4 * MIB
        assert resident_kib(data) < 64  # gone from this process (still in the page cache)
        assert bytes(m) == before  # read again from the file: the same bytes
    finally:
        m.close()


def test_a_writable_mapping_and_other_directories_are_left_alone(tmp_path: Path) -> None:
    mine, other = tmp_path / "model", tmp_path / "elsewhere"
    mine.mkdir()
    other.mkdir()
    written, foreign = mine / "w.data", other / "r.data"
    written.write_bytes(b"\0" * MIB)
    foreign.write_bytes(os.urandom(MIB))
    with open(written, "r+b") as fw, open(foreign, "rb") as fr:
        w = mmap.mmap(fw.fileno(), 0, flags=mmap.MAP_PRIVATE)  # copy-on-write: ours to lose
        r = mmap.mmap(fr.fileno(), 0, prot=mmap.PROT_READ)
    try:
        w[:5] = b"kept!"  # a private page written: dropping it would lose this
        bytes(r)
        assert release_file_pages([mine]) == 0
        assert w[:5] == b"kept!"
        assert resident_kib(foreign) >= 1024 - 8  # not in the directories given
    finally:
        w.close()
        r.close()


def test_the_trim_comes_once_an_idle_spell_and_never_while_a_batch_runs(tmp_path: Path) -> None:
    trim = Trim([str(tmp_path)])
    assert trim.idle(IDLE_TRIM_NS, busy=False)  # the boot counts as a batch: the first spell
    assert not trim.idle(10 * IDLE_TRIM_NS, busy=False)  # once a spell
    trim.ran(20 * IDLE_TRIM_NS)
    assert not trim.idle(20 * IDLE_TRIM_NS + IDLE_TRIM_NS // 2, busy=False)  # too soon
    assert not trim.idle(22 * IDLE_TRIM_NS, busy=True)  # a batch still runs somewhere
    assert trim.idle(22 * IDLE_TRIM_NS, busy=False)
