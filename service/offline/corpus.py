"""Texts on disk, reached through mmap: line files (.txt, .tsv, .jsonl) and the corpus format.

A corpus is binary-protocol frames back to back (`u32 text_len | text | u64 tag`, tag = the
input line number), with an index of frame offsets (`CORPUS.idx`, little-endian i64) written
beside it. Readers map both files and copy only the one text they return, and can give back the
pages they walked (`release`), so walking a corpus of any size holds RSS flat.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from ringserve.wire.frames import LENGTH, TAG, encode_frame

SCAN_CHUNK = 8 << 20  # bytes scanned for newlines at a time: bounds the scan's temporary memory
RELEASE_BYTES = 1 << 20  # a sequential walk gives back mapped pages behind it in this step

# Why a line cannot be scored; the message is what its output line says.
OK = 0
BAD_UTF8 = 1
EMPTY = 2
BAD_JSON = 3
BAD_SCHEMA = 4
ERRORS = {
    BAD_UTF8: "text is not valid UTF-8",
    EMPTY: "text is empty",
    BAD_JSON: "malformed JSON",
    BAD_SCHEMA: 'a JSON line must be an object with a string "text" (and optional "text_pair")',
}


def input_kind(path: str | Path) -> str:
    """txt, tsv, jsonl or corpus, from the name (a corpus also from its index beside it)."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix in (".tsv", ".jsonl"):
        return suffix[1:]
    if suffix in (".corpus", ".frames", ".bin") or index_path(p).exists():
        return "corpus"
    return "txt"


def index_path(corpus: str | Path) -> Path:
    return Path(str(corpus) + ".idx")


def _map(path: str | Path) -> tuple[mmap.mmap | None, int]:
    size = os.path.getsize(path)
    if size == 0:  # mmap refuses an empty file
        return None, 0
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), size


def _release(mm: mmap.mmap | None, start: int, end: int) -> None:
    """Drop the mappings of [start, end): the page cache keeps the data, RSS drops it."""
    if mm is None or end <= start:
        return
    start -= start % mmap.PAGESIZE
    mm.madvise(mmap.MADV_DONTNEED, start, end - start)


class LineFile:
    """A text file's lines through mmap, indexed once by a chunked newline scan.

    `starts[i]` and `ends[i]` bound line i without its line break; the index costs 12 bytes a
    line and no text is held in memory.
    """

    def __init__(self, path: str | Path, kind: str) -> None:
        self.path = str(path)
        self.kind = kind
        self.mm, self.size = _map(path)
        self.starts, self.ends = self._index()

    def _index(self) -> tuple[np.ndarray, np.ndarray]:
        if self.mm is None:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        parts = []
        for pos in range(0, self.size, SCAN_CHUNK):
            chunk = np.frombuffer(self.mm, np.uint8, min(SCAN_CHUNK, self.size - pos), pos)
            parts.append(np.flatnonzero(chunk == 10).astype(np.int64) + pos)
            del chunk
            _release(self.mm, pos, pos + SCAN_CHUNK)
        newlines = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        ends = newlines
        if self.size and (not len(newlines) or newlines[-1] != self.size - 1):
            ends = np.append(newlines, self.size)  # a last line without a line break
        starts = np.empty_like(ends)
        starts[:1] = 0
        starts[1:] = ends[:-1] + 1
        return starts, ends.astype(np.int64)

    def __len__(self) -> int:
        return len(self.starts)

    def byte_lengths(self) -> np.ndarray:
        return (self.ends - self.starts).astype(np.int32)

    def raw(self, i: int) -> bytes:
        assert self.mm is not None
        data = self.mm[int(self.starts[i]) : int(self.ends[i])]
        return data[:-1] if data.endswith(b"\r") else data

    def record(self, i: int) -> tuple[int, bytes, bytes | None]:
        """(error code, text, text_pair) of line i; the text is valid, non-blank UTF-8 when OK."""
        return parse_line(self.raw(i), self.kind)

    def release(self, start: int = 0, end: int | None = None) -> None:
        _release(self.mm, start, self.size if end is None else end)

    def close(self) -> None:
        if self.mm is not None:
            self.mm.close()


def check_text(text: bytes) -> int:
    try:
        return OK if text.decode("utf-8").strip() else EMPTY
    except UnicodeDecodeError:
        return BAD_UTF8


def parse_line(raw: bytes, kind: str) -> tuple[int, bytes, bytes | None]:
    if kind == "tsv":
        raw = raw.split(b"\t", 1)[0]
    if kind != "jsonl":
        return check_text(raw), raw, None
    try:
        doc = json.loads(raw)
    except UnicodeDecodeError:
        return BAD_UTF8, b"", None
    except (ValueError, RecursionError):
        return BAD_JSON, b"", None
    pair = doc.get("text_pair") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or not isinstance(doc.get("text"), str):
        return BAD_SCHEMA, b"", None
    if pair is not None and not isinstance(pair, str):
        return BAD_SCHEMA, b"", None
    try:
        text = doc["text"].encode("utf-8")
        pair_b = pair.encode("utf-8") if pair is not None else None
    except UnicodeEncodeError:  # a lone surrogate escaped in the JSON
        return BAD_UTF8, b"", None
    code = check_text(text)
    if code == OK and pair_b is not None:
        code = check_text(pair_b)
    return code, text, pair_b


class Corpus:
    """A corpus file and its offsets index, both mapped; record i is the frame of line i."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.kind = "corpus"
        self.mm, self.size = _map(path)
        self.idx_mm: mmap.mmap | None = None
        self.offsets = self._load_index()

    def _load_index(self) -> np.ndarray:
        idx = index_path(self.path)
        if idx.exists() and idx.stat().st_size % 8 == 0 and idx.stat().st_size:
            self.idx_mm, _ = _map(idx)
            assert self.idx_mm is not None
            offsets = np.frombuffer(self.idx_mm, dtype="<i8")
            last = int(offsets[-1])
            if last + LENGTH.size <= self.size:  # cheap check that it belongs to this file
                n = LENGTH.unpack_from(self.mm, last)[0] if self.mm is not None else 0
                if last + LENGTH.size + n + TAG.size == self.size:
                    return offsets
            del offsets
            self.idx_mm.close()
            self.idx_mm = None
        offsets = self.scan()
        try:  # keep it beside the corpus for next time; a read-only place is fine too
            offsets.astype("<i8").tofile(idx)
        except OSError:
            pass
        return offsets

    def scan(self) -> np.ndarray:
        """Walk the frames once; refuse a truncated or corrupt file."""
        out = []
        pos = 0
        mm = self.mm
        while pos < self.size:
            assert mm is not None
            if pos + LENGTH.size > self.size:
                raise ValueError(f"{self.path}: truncated frame at byte {pos}")
            n = LENGTH.unpack_from(mm, pos)[0]
            if pos + LENGTH.size + n + TAG.size > self.size:
                raise ValueError(f"{self.path}: truncated frame at byte {pos}")
            out.append(pos)
            pos += LENGTH.size + n + TAG.size
        self.release()
        return np.array(out, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.offsets)

    def frame(self, i: int) -> tuple[int, bytes]:
        """(tag, text) of record i: the only copy made is of that text."""
        assert self.mm is not None
        pos = int(self.offsets[i])
        n = LENGTH.unpack_from(self.mm, pos)[0]
        start = pos + LENGTH.size
        return TAG.unpack_from(self.mm, start + n)[0], self.mm[start : start + n]

    def raw(self, i: int) -> bytes:
        return self.frame(i)[1]

    def record(self, i: int) -> tuple[int, bytes, bytes | None]:
        text = self.raw(i)
        return check_text(text), text, None

    def byte_lengths(self) -> np.ndarray:
        ends = np.append(self.offsets[1:], self.size).astype(np.int64)
        return (ends - self.offsets - LENGTH.size - TAG.size).astype(np.int32)

    def walk(self, start: int = 0) -> Iterator[tuple[int, bytes]]:
        """(tag, text) of every record from `start`, giving back the pages behind it."""
        done = start  # records before this one are released
        for i in range(start, len(self)):
            tag, text = self.frame(i)
            if int(self.offsets[i]) - int(self.offsets[done]) >= RELEASE_BYTES:
                self.release_records(done, i)
                done = i
            yield tag, text
        self.release()

    def release_records(self, lo: int, hi: int) -> None:
        """Give back the pages of records [lo, hi) and of their index entries. By record
        number, not by byte offset: a binary search in the index would map its pages again."""
        _release(self.mm, int(self.offsets[lo]), int(self.offsets[hi]))
        _release(self.idx_mm, lo * 8, hi * 8)

    def release(self) -> None:
        """Give back every mapped page of the corpus and its index (RSS, not the page cache)."""
        _release(self.mm, 0, self.size)
        _release(self.idx_mm, 0, len(self.offsets) * 8 if hasattr(self, "offsets") else 0)

    def close(self) -> None:
        self.offsets = np.zeros(0, np.int64)  # drop the view first: an exported buffer pins the map
        for mm in (self.idx_mm, self.mm):
            if mm is not None:
                mm.close()


def open_texts(path: str | Path) -> LineFile | Corpus:
    kind = input_kind(path)
    return Corpus(path) if kind == "corpus" else LineFile(path, kind)


def pack(src: str | Path, dst: str | Path) -> tuple[int, int]:
    """Write every line of `src` as a frame (tag = line number, 0-based) and the index beside it.

    A line that cannot be a text (broken JSON, wrong schema) becomes an empty frame, so record i
    is always line i; invalid UTF-8 is packed as it is. Returns (records, bad records).
    """
    lines = LineFile(src, input_kind(src))
    bad = 0
    offsets = np.zeros(len(lines), dtype="<i8")
    pos = 0
    with open(dst, "wb") as out:
        for i in range(len(lines)):
            code, text, _pair = lines.record(i)
            if code in (BAD_JSON, BAD_SCHEMA):
                text = b""
            bad += code != OK
            frame = encode_frame(text, i)
            offsets[i] = pos
            pos += len(frame)
            out.write(frame)
            if i % 65536 == 65535:
                lines.release(0, int(lines.ends[i]))
    offsets.tofile(index_path(dst))
    lines.close()
    return len(offsets), bad


def corpus_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="ringserve corpus", description="pack texts into binary-protocol frames for mmap"
    )
    parser.add_argument("--input", required=True, help=".txt, .tsv (first column) or .jsonl")
    parser.add_argument("--output", required=True, help="corpus file (its index: OUTPUT.idx)")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    try:
        n, bad = pack(args.input, args.output)
    except OSError as exc:
        parser.exit(2, f"ringserve corpus: {exc}\n")
    took = time.monotonic() - t0
    print(f"{n} records ({bad} not valid texts) -> {args.output} in {took:.2f} s")
    return 0
