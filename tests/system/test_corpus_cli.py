"""`ringserve corpus` as a user runs it (a child process): pack a JSON-lines file, read it
back with and without its index (the reader itself is tested in tests/unit/test_corpus.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ringserve.service.offline import corpus as C

from devkit.launcher import ROOT

LINES = [b"good one", b"", b"   ", b"\xff\xfe not utf-8", "caf\u00e9 \u2603".encode(), b"last"]


def test_pack_and_read_back(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    docs = [json.dumps({"text": t.decode("utf-8", "replace")}).encode() for t in LINES]
    src.write_bytes(b"\n".join([*docs, b"{broken", b'{"text": "after"}']) + b"\n")
    out = tmp_path / "c.corpus"
    cmd = [
        sys.executable,
        "-m",
        "ringserve.service.cli",
        "corpus",
        "--input",
        str(src),
        "--output",
        str(out),
    ]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert C.index_path(out).exists()
    corpus = C.Corpus(out)
    assert len(corpus) == len(docs) + 2
    frames = [corpus.frame(i) for i in range(len(corpus))]
    assert [tag for tag, _ in frames] == list(range(len(corpus)))  # tag = line number
    assert frames[0][1] == b"good one" and frames[-1][1] == b"after"
    assert frames[-2][1] == b""  # the broken JSON line keeps its place, as an empty text
    assert list(corpus.walk()) == frames
    corpus.close()
    C.index_path(out).unlink()  # without its index the reader rebuilds it by a walk
    again = C.Corpus(out)
    assert [again.frame(i) for i in range(len(again))] == frames
    again.close()
    with open(out, "ab") as f:  # a truncated last frame is refused, not misread
        f.write(b"\x10\x00\x00\x00abc")
    C.index_path(out).unlink()
    with pytest.raises(ValueError, match="truncated"):
        C.Corpus(out)
