"""Embeddings against classification on the same model and server, and a 1,000-document rerank
against 1,000 single pair requests, in one run.

  python -m benchmarks.embed [--seconds 5] [--workers 2]

1. One server of the default model (classify and embed from one forward). For each mix (short:
   SST-2 sentences; long: AG News descriptions) and each concurrency (1, 32, 64), a closed loop
   of `/v1/classify` and one of `/v1/embeddings`, one text a request, one after the other:
   answers per second of each, and their ratio; and both against the model's ceiling on the
   same texts as benchmarks/serving.py defines it (the raw model in as many pinned 1-thread
   processes as the server has workers, batches planned by length; measured before the server
   starts, so nothing else runs).
2. A cross-encoder of MiniLM's size: the all-MiniLM-L6-v2 encoder with a one-output head
   (random: only the cost matters here), built with `transformers` and exported with
   `ringserve export --from`. `/rerank` of one query and 1,000 SST-2 sentences, one request at a
   time, against the same 1,000 pairs as `/v1/classify` pair requests at c=1 and c=32: pairs per
   second each way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from devkit.http import http_message, http_request
from devkit.launcher import AG_NEWS, SST2, Launched, load_texts
from devkit.load import run_load

QUERY = "which film is worth seeing?"


def request(path: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return http_message("POST", path, data, {"Content-Type": "application/json"})


MIXES = (("short", SST2), ("long", AG_NEWS))


def ceilings(workers: int) -> dict[str, float]:
    from benchmarks.serving import ceiling

    return {mix: ceiling(load_texts(path, 2000), workers=workers) for mix, path in MIXES}


def embed_vs_classify(port: int, seconds: float, ceil: dict[str, float]) -> list[dict[str, Any]]:
    rows = []
    for mix, path in MIXES:
        texts = load_texts(path, 2000)
        classify = [request("/v1/classify", {"text": t}) for t in texts]
        embed = [request("/v1/embeddings", {"input": t}) for t in texts]
        for c in (1, 32, 64):
            a = asyncio.run(run_load(port, classify, c, seconds))
            b = asyncio.run(run_load(port, embed, c, seconds))
            assert not a.failed and not b.failed, (a.codes, b.codes)
            row = {"mix": mix, "c": c, "classify_per_s": round(a.rps, 1),
                   "embed_per_s": round(b.rps, 1), "ratio": round(b.rps / a.rps, 3),
                   "classify_p50_ms": round(a.pct(50), 1),
                   "embed_p50_ms": round(b.pct(50), 1), "ceiling_per_s": round(ceil[mix], 1),
                   "classify_of_ceiling": round(a.rps / ceil[mix], 3),
                   "embed_of_ceiling": round(b.rps / ceil[mix], 3)}  # fmt: skip
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def build_reranker(work: Path) -> Path:
    """MiniLM with a one-output head, exported as a rerank artifact."""
    import transformers
    from ringserve.factory import export
    from ringserve.factory.build import default_encoder_dir

    src, art = work / "src", work / "art"
    encoder = default_encoder_dir()
    model = transformers.BertForSequenceClassification.from_pretrained(encoder, num_labels=1)
    model.save_pretrained(src)
    (src / "tokenizer.json").write_bytes((encoder / "tokenizer.json").read_bytes())
    assert export.main(["--from", str(src), "--out", str(art), "--max-length", "256"]) == 0
    return art


def rerank_vs_pairs(port: int, docs: list[str], reps: int) -> dict[str, Any]:
    body = json.dumps({"query": QUERY, "texts": docs})
    t0 = time.perf_counter()
    for _ in range(reps):
        status, _, data = http_request(port, "POST", "/rerank", body, timeout=300)
        assert status == 200 and len(json.loads(data)) == len(docs), data[:200]
    rerank_s = (time.perf_counter() - t0) / reps
    out: dict[str, Any] = {"documents": len(docs), "rerank_s": round(rerank_s, 3),
                           "rerank_pairs_per_s": round(len(docs) / rerank_s, 1)}  # fmt: skip
    pairs = [request("/v1/classify", {"text": QUERY, "text_pair": d}) for d in docs]
    for c in (1, 32):
        r = asyncio.run(run_load(port, pairs, c, 3600, max_requests=len(docs), warmup_s=0))
        assert r.ok == len(docs), r.codes
        out[f"single_pairs_c{c}_s"] = round(r.seconds, 3)
        out[f"single_pairs_c{c}_per_s"] = round(r.rps, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--reps", type=int, default=3, help="1,000-document reranks timed")
    args = p.parse_args(argv)
    base = ["--workers", str(args.workers), "--spares", "0"]
    ceil = ceilings(args.workers)
    print(json.dumps({"ceiling_per_s": ceil}), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-embed-") as tmp:
        work = Path(tmp)
        srv = Launched(work, base)
        try:
            srv.wait_ready(args.workers, 300)
            rows = embed_vs_classify(srv.port, args.seconds, ceil)
        finally:
            srv.terminate(60)
        art = build_reranker(work)
        srv = Launched(work, ["--model", str(art), *base])
        try:
            srv.wait_ready(args.workers, 300)
            http_request(srv.port, "POST", "/rerank", json.dumps({"query": QUERY, "texts": ["x"]}))
            rerank = rerank_vs_pairs(srv.port, load_texts(SST2, 1000), args.reps)
        finally:
            srv.terminate(60)
    print(json.dumps({"embed_vs_classify": rows, "rerank": rerank}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
