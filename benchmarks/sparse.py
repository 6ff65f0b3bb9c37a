"""A sparse (SPLADE) model of BERT-base's shapes served, against its ceiling and against
sentence-transformers' SparseEncoder behind FastAPI, in one run.

  python -m benchmarks.sparse [--seconds 10] [--workers 2] [--concurrency 32]

The model: a random BertForMaskedLM of bert-base-uncased's shapes (12 layers, 768 wide, 12
heads, the 30,522-term vocabulary), its decoder's bias lowered so that a text has tens to
hundreds of nonzero terms as a trained SPLADE model's (devkit/sparse_models.py), exported with
`--pooling splade --max-length 256` (the plain graph: fp32 on ONNX Runtime, as a server serves
it by default). The texts: SST-2 sentences.

1. Ceiling: the model alone on the texts, as benchmarks/serving.py defines it (the plain graph in
   as many pinned 1-thread processes as the server has workers, batches planned by length;
   measured before anything else runs).
2. Served: `/embed_sparse` one text a request, closed loop at the concurrency, after a warm-up.
3. Baseline: the same directory in sentence-transformers' SparseEncoder behind FastAPI under
   uvicorn (benchmarks/sparse_peer.py: one process, one `encode` a request, torch's threads),
   under the same load.
Prints served/ceiling and served/baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from devkit.http import HOST, http_message
from devkit.launcher import ROOT, SST2, Launched, free_port, inherited_env, load_texts
from devkit.load import run_load

MAX_LENGTH = 256  # the served model's and the peer's
BASE = {
    "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
    "intermediate_size": 3072, "max_position_embeddings": 512,
}  # fmt: skip


def build(work: Path) -> tuple[Path, Path]:
    """(the MLM directory, its sparse artifact)."""
    from ringserve.factory import export

    from devkit.builds import plain_builds
    from devkit.sparse_models import MLMS, save_mlm

    MLMS["bert-base"] = ("BertConfig", "BertForMaskedLM", BASE, "wordpiece")
    src = save_mlm("bert-base", work, max_length=MAX_LENGTH)
    art = work / "art"
    with plain_builds():
        args = ["--from", str(src), "--out", str(art), "--pooling", "splade"]
        assert export.main(args) == 0
    return src, art


def requests(texts: list[str]) -> list[bytes]:
    head = {"Content-Type": "application/json"}
    return [http_message("POST", "/embed_sparse", json.dumps({"inputs": t}).encode(), head)
            for t in texts]  # fmt: skip


def load(port: int, texts: list[str], c: int, seconds: float) -> Any:
    r = asyncio.run(run_load(port, requests(texts), c, seconds, warmup_s=3.0))
    assert not r.failed, r.codes
    return r


def baseline(src: Path, texts: list[str], c: int, seconds: float) -> Any:
    from benchmarks.serving import stop_group, wait_health

    port = free_port()
    env = {**inherited_env(), "RINGSERVE_SPARSE_PEER_DIR": str(src),
           "RINGSERVE_SPARSE_PEER_MAX_LENGTH": str(MAX_LENGTH)}  # fmt: skip
    cmd = [sys.executable, "-m", "uvicorn", "benchmarks.sparse_peer:app", "--host", HOST,
           "--port", str(port), "--workers", "1", "--log-level", "warning",
           "--no-access-log"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        wait_health(proc, port, "the SparseEncoder peer", 300)
        return load(port, texts, c, seconds)
    finally:
        stop_group(proc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument(
        "--texts", type=int, default=400, help="SST-2 sentences (the ceiling runs them whole)"
    )
    args = p.parse_args(argv)
    from benchmarks.serving import ceiling

    texts = load_texts(SST2, args.texts)
    with tempfile.TemporaryDirectory(prefix="bench-sparse-") as tmp:
        src, art = build(Path(tmp))
        ceil = ceiling(texts, workers=args.workers, model_dir=str(art), seconds=args.seconds)
        print(json.dumps({"ceiling_per_s": round(ceil, 2)}), flush=True)
        srv = Launched(Path(tmp), ["--model", str(art), "--workers", str(args.workers),
                                   "--spares", "0"])  # fmt: skip
        try:
            srv.wait_ready(args.workers, 300)
            served = load(srv.port, texts, args.concurrency, args.seconds)
        finally:
            srv.terminate(60)
        print(json.dumps({"served_per_s": round(served.rps, 2)}), flush=True)
        peer = baseline(src, texts, args.concurrency, args.seconds)
    row = {
        "model": "BertForMaskedLM, bert-base shapes, random, --pooling splade, fp32 ONNX Runtime",
        "texts": "SST-2", "c": args.concurrency, "workers": args.workers,
        "ceiling_per_s": round(ceil, 2), "served_per_s": round(served.rps, 2),
        "served_p50_ms": round(served.pct(50), 1), "served_p99_ms": round(served.pct(99), 1),
        "baseline_per_s": round(peer.rps, 2), "baseline_p50_ms": round(peer.pct(50), 1),
        "served_of_ceiling": round(served.rps / ceil, 3),
        "served_over_baseline": round(served.rps / peer.rps, 2),
    }  # fmt: skip
    print(json.dumps(row, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
