"""The corpus format and the mmap readers: what goes in comes out, by line, at a flat RSS."""

from __future__ import annotations

from pathlib import Path

from ringserve.service.offline import corpus as C

LINES = [b"good one", b"", b"   ", b"\xff\xfe not utf-8", "caf\u00e9 \u2603".encode(), b"last"]


def vm_rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_line_file_index_and_errors(tmp_path: Path) -> None:
    p = tmp_path / "in.txt"
    p.write_bytes(b"\n".join(LINES) + b"\r\n")  # CRLF on the last line, no empty line after
    lines = C.LineFile(p, "txt")
    assert len(lines) == len(LINES)
    got = [lines.record(i) for i in range(len(lines))]
    assert [t for _, t, _ in got] == LINES
    assert [c for c, _, _ in got] == [C.OK, C.EMPTY, C.EMPTY, C.BAD_UTF8, C.OK, C.OK]
    lines.close()


def test_tsv_and_jsonl_lines() -> None:
    assert C.parse_line(b"a text\t1", "tsv") == (C.OK, b"a text", None)
    assert C.parse_line(b'{"text": "x", "text_pair": "y"}', "jsonl") == (C.OK, b"x", b"y")
    assert C.parse_line(b'{"text": "x"', "jsonl")[0] == C.BAD_JSON
    assert C.parse_line(b'["x"]', "jsonl")[0] == C.BAD_SCHEMA
    assert C.parse_line(b'{"text": 3}', "jsonl")[0] == C.BAD_SCHEMA
    assert C.parse_line(b'{"text": "x", "text_pair": 1}', "jsonl")[0] == C.BAD_SCHEMA
    assert C.parse_line(b'{"text": "\\ud800"}', "jsonl")[0] == C.BAD_UTF8
    assert C.parse_line(b'{"text": " "}', "jsonl")[0] == C.EMPTY
    assert C.parse_line(b"\xff{}", "jsonl")[0] == C.BAD_UTF8


def test_walk_holds_rss_flat(tmp_path: Path) -> None:
    """Walking a 48 MiB corpus maps every page of it once; RSS must stay within a few MiB.

    The same walk without giving pages back grows RSS by about the file's size, which shows
    the measurement can see the difference."""
    out = tmp_path / "big.corpus"
    text = ("x" * 180 + " a sentence of some length").encode()
    n = 240_000
    with open(out, "wb") as f:
        for i in range(0, n, 10_000):
            f.write(b"".join(C.encode_frame(text, k) for k in range(i, i + 10_000)))
    corpus = C.Corpus(out)
    assert len(corpus) == n
    corpus.release()
    base = vm_rss_kib()
    peak = base
    for k, (tag, _text) in enumerate(corpus.walk()):
        if k % 5_000 == 0:
            peak = max(peak, vm_rss_kib())
        assert tag == k
    grew_mib = (peak - base) / 1024
    assert grew_mib < 6, f"RSS grew {grew_mib:.1f} MiB walking {out.stat().st_size >> 20} MiB"
    base = vm_rss_kib()
    for i in range(len(corpus)):  # the counterfactual: random access never gives pages back
        corpus.frame(i)
    assert (vm_rss_kib() - base) / 1024 > 20
    corpus.close()
