"""Long texts, measured: windowed throughput against ordinary texts of a window's length, and
accuracy truncated against windowed, on AG News texts of one class joined to 2-8x max_length.

  python -m benchmarks.longtext [--seconds 20] [--concurrency 16] [--workers 2]

A head for AG News's four topics is trained on the sample's training rows (`ringserve train`,
the held-out rule of factory/train.py) and exported with --max-length 64 (`ringserve export`),
once, into --work. The joined texts are made only from the held-out rows, which the head never
saw. One server with --long-text window --window-stride 16 serves both loads and both modes:
- ordinary: the joined texts cut (by words) to at most 64 tokens, one text a request;
- windowed: the joined texts whole, one a request;
each a closed loop for --seconds after a warm-up. Rows (texts or windows) per second come from
the server's own batch-size histogram (its sum is rows run), so nothing is estimated.
Accuracy: every joined text asked with `truncate: true` (its first 64 tokens) and by default
(windowed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from devkit.http import classify_request, http_request
from devkit.launcher import AG_NEWS, ROOT, Launched
from devkit.load import run_load

MAX_LENGTH = 64
STRIDE = 16


def build_artifact(work: Path) -> Path:
    """The AG News head on MiniLM, max_length 64 (cached in `work`)."""
    art = work / f"ag-news-{MAX_LENGTH}"
    if (art / "manifest.json").exists():
        return art
    work.mkdir(parents=True, exist_ok=True)
    head = work / "ag-news-head.json"
    cli = [sys.executable, "-m", "ringserve.service.cli"]
    labels = "World,Sports,Business,Sci/Tech"  # data/README.md
    train = [*cli, "train", "--data", str(AG_NEWS), "--out", str(head), "--labels", labels]
    subprocess.run(train, cwd=ROOT, check=True)
    subprocess.run(
        [*cli, "export", "--head", str(head), "--out", str(art), "--max-length", str(MAX_LENGTH)],
        cwd=ROOT,
        check=True,
    )
    return art


def joined_texts(model_dir: Path, per_class: int, seed: int = 0) -> list[tuple[str, int, int]]:
    """(text, label, tokens): held-out AG News texts of one class joined until the text has
    between 2x and 8x max_length tokens (the target drawn uniformly)."""
    from ringserve.factory.train import read_tsv, split

    tok = tokenizer(model_dir)
    _, held = split(read_tsv(AG_NEWS), 10)
    by_label: dict[int, list[str]] = {}
    for text, label in held:
        by_label.setdefault(label, []).append(text)
    rng = random.Random(seed)
    out = []
    for label, pool in sorted(by_label.items()):
        while sum(1 for _, y, _ in out if y == label) < per_class:
            target = rng.randint(2 * MAX_LENGTH, 8 * MAX_LENGTH)
            text, n = "", 0
            for part in rng.sample(pool, len(pool)):
                longer = (text + " " + part).strip()
                m = len(tok.encode(longer).ids)
                if m > 8 * MAX_LENGTH:  # never past 8x: skip to a shorter part
                    continue
                text, n = longer, m
                if n >= target:
                    break
            if n >= 2 * MAX_LENGTH:
                out.append((text, label, n))
    return out


def tokenizer(model_dir: Path) -> Any:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def cut_to_window(tok: Any, text: str) -> str:
    """The text's first words that fit in max_length tokens (an ordinary text of that length)."""
    words = text.split()
    lo, hi = 1, len(words)
    while lo < hi:  # the most words that still fit
        mid = (lo + hi + 1) // 2
        if len(tok.encode(" ".join(words[:mid])).ids) <= MAX_LENGTH:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


def metric(port: int, name: str) -> float:
    _, _, body = http_request(port, "GET", "/metrics")
    for line in body.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    raise KeyError(name)


def measure(srv: Launched, texts: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Closed-loop load of one text a request; rows and tokens per second from the server."""
    reqs = [classify_request(t) for t in texts]
    asyncio.run(run_load(srv.port, reqs, args.concurrency, 3.0, warmup_s=0))  # warm-up
    rows0 = metric(srv.port, "ringserve_batch_size_sum")
    tok0 = metric(srv.port, "ringserve_tokens_total")
    res = asyncio.run(run_load(srv.port, reqs, args.concurrency, args.seconds, warmup_s=0))
    rows = metric(srv.port, "ringserve_batch_size_sum") - rows0
    tokens = metric(srv.port, "ringserve_tokens_total") - tok0
    return {
        "requests_per_s": round(res.rps, 1),
        "rows_per_s": round(rows / res.seconds, 1),
        "rows_per_request": round(rows / max(1, res.ok), 2),
        "tokens_per_row": round(tokens / max(1, rows), 1),
        "p50_ms": round(res.pct(50), 1),
        "failed": res.failed,
    }


def accuracy(srv: Launched, rows: list[tuple[str, int, int]], truncate: bool | None) -> float:
    right = 0
    for text, label, _ in rows:
        body: dict[str, Any] = {"text": text}
        if truncate is not None:
            body["truncate"] = truncate
        status, _, data = http_request(srv.port, "POST", "/v1/classify", json.dumps(body))
        assert status == 200, data
        right += json.loads(data)["label_id"] == label
    return right / len(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--per-class", type=int, default=50, help="joined texts of each class")
    p.add_argument("--work", type=Path, default=Path.home() / ".cache" / "ringserve" / "bench")
    args = p.parse_args(argv)
    art = build_artifact(args.work)
    rows = joined_texts(art, args.per_class)
    tok = tokenizer(art)
    short = [cut_to_window(tok, t) for t, _, _ in rows]
    launch = [
        "--model", str(art), "--workers", str(args.workers), "--spares", "0",
        "--long-text", "window", "--window-stride", str(STRIDE), "--max-windows", "16",
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        srv = Launched(tmp, launch)
        try:
            srv.wait_ready(args.workers)
            ordinary = measure(srv, short, args)
            windowed = measure(srv, [t for t, _, _ in rows], args)
            acc_cut = accuracy(srv, rows, True)
            acc_win = accuracy(srv, rows, None)
        finally:
            srv.terminate()
    tokens = sorted(n for _, _, n in rows)
    out = {
        "model": f"MiniLM + AG News head, max_length {MAX_LENGTH}, stride {STRIDE}",
        "texts": len(rows),
        "tokens_min_median_max": [tokens[0], tokens[len(tokens) // 2], tokens[-1]],
        "workers": args.workers,
        "concurrency": args.concurrency,
        "cpus": os.cpu_count(),
        "ordinary": ordinary,
        "windowed": windowed,
        "windows_per_s_over_texts_per_s": round(windowed["rows_per_s"] / ordinary["rows_per_s"], 3),
        "accuracy_truncated": round(acc_cut, 3),
        "accuracy_windowed": round(acc_win, 3),
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
