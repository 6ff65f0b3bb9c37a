"""Token classification served against the model's own ceiling, and against the peer a user
would write (transformers' pipeline behind FastAPI), side by side in one run on one machine.

The model: a base-size BertForTokenClassification (BERT-base's shapes: 12 layers of 768, 12
heads, 3,072 wide, 512 positions, the 30,522-token WordPiece of all-MiniLM-L6-v2, CoNLL's 9
labels) with random weights, exported by `ringserve export --from` (the plain fp32 graph, which
the server serves by default when no fused graph is kept).
ceiling: the raw graph in N pinned one-thread processes (N = the cores), on the same texts
         sorted within windows of C arriving texts and cut by the fastest of the serving
         benchmark's plans (benchmarks/serving.py `best_plan`), no tokenizing, no answers.
served:  `ringserve serve --model ART` with default options, one text per POST /v1/token-classify
         (aggregation simple), closed loop at concurrency C. The ceiling and served runs take
         turns, --runs rounds, and the best of each is kept (on a shared VM another tenant's
         load only slows a run down), each round's pair printed.
peer:    benchmarks/token_peer.py under uvicorn, N workers of one torch thread, the pipeline
         with aggregation simple, one text a call; best of --runs runs. Its entities are checked
         against ours on a few texts first (the same model, so they must agree).

Usage: python -m benchmarks.token_classify [--seconds 20] [--runs 3] [--c 32] [--texts 256]
(about 5 minutes on 2 cores; run it alone, under the project's heavy lock).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop
from ringserve.workers.batches import BATCH_OVERHEAD

from benchmarks.serving import CeilingPool, best_plan, stop_group, tree_cpu_s, wait_health
from devkit.http import http_message, http_request
from devkit.launcher import HOST, ROOT, SST2, Launched, free_port, inherited_env, load_texts
from devkit.load import LoadResult, run_load
from devkit.token_models import sharpen

CONLL = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
        "intermediate_size": 3072, "max_position_embeddings": 512}  # fmt: skip
PATH = "/v1/token-classify"


def build(work: Path) -> tuple[Path, Path]:
    """(the checkpoint, its artifact) under `work`, made once."""
    source, artifact = work / "bert-base-ner", work / "bert-base-ner-art"
    if not (artifact / "manifest.json").is_file():
        import torch
        import transformers
        from ringserve.factory import export
        from ringserve.factory.build import default_encoder_dir
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(default_encoder_dir() / "tokenizer.json"))
        labels = {
            "id2label": dict(enumerate(CONLL)),
            "label2id": {x: i for i, x in enumerate(CONLL)},
        }
        config = transformers.BertConfig(vocab_size=tok.get_vocab_size(), **BASE, **labels)
        torch.manual_seed(0)
        model = transformers.BertForTokenClassification(config).eval()
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tok, model_max_length=512, unk_token="[UNK]", pad_token="[PAD]",
            cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
        )  # fmt: skip
        sharpen(model, fast, 1)  # clear labels, as a trained model's: entities to group
        model.save_pretrained(source)
        fast.save_pretrained(source)
        os.environ["RINGSERVE_BUILD_GRAPHS"] = "plain"
        if export.main(["--from", str(source), "--out", str(artifact)]) != 0:
            raise RuntimeError("export failed")
    return source, artifact


def ceiling_plan(
    artifact: Path, texts: list[str], cores: int, c: int, seconds: float
) -> tuple[CeilingPool, list[Any]]:
    """The pinned processes, loaded, and the fastest of the plans at the c-text window."""
    from ringserve.workers.artifact import load_manifest, load_tokenizer

    tok = load_tokenizer(artifact, load_manifest(artifact).max_length)
    encodings = [e.ids for e in tok.encode_batch(texts)]
    pool = CeilingPool(cores)
    pool.load(str(artifact), "onnx", "fp32", "plain")
    name, batches = best_plan(pool, encodings, c, BATCH_OVERHEAD["onnx", "fp32"], seconds)
    print(f"ceiling: {cores} pinned 1-thread processes, plan {name!r} at the {c}-text window")
    return pool, batches


def load(port: int, pid: int, texts: list[str], c: int, seconds: float, runs: int) -> LoadResult:
    """The best of `runs` closed-loop runs at concurrency `c` (after a warm-up), with the CPU
    the server's process tree used a request printed."""
    bodies = [json.dumps({"text": t}).encode() for t in texts]
    requests = [http_message("POST", PATH, b, {"Content-Type": "application/json"}) for b in bodies]
    uvloop.run(run_load(port, requests, c, 2.0, warmup_s=0))
    best = None
    for _ in range(runs):
        cpu0 = tree_cpu_s(pid)[0]
        result = uvloop.run(run_load(port, requests, c, seconds, warmup_s=0))
        cpu = (tree_cpu_s(pid)[0] - cpu0) * 1000 / max(1, result.ok)
        print(f"  {result.row()} cpu={cpu:.1f}ms/req", flush=True)
        if best is None or result.rps > best.rps:
            best = result
    assert best is not None
    return best


class Peer:
    def __init__(self, source: Path, cores: int) -> None:
        self.port = free_port()
        env = {**inherited_env(), "OMP_NUM_THREADS": "1", "RINGSERVE_PEER_MODEL": str(source)}
        cmd = ["-m", "uvicorn", "benchmarks.token_peer:app", "--host", HOST, "--port",
               str(self.port), "--workers", str(cores), "--log-level", "warning",
               "--no-access-log"]  # fmt: skip
        self.proc = subprocess.Popen(
            [sys.executable, *cmd], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        self.pid = self.proc.pid
        wait_health(self.proc, self.port, "the peer", 300)


def post(port: int, text: str) -> Any:
    headers = {"Content-Type": "application/json"}  # FastAPI reads no body without it
    status, _, data = http_request(port, "POST", PATH, json.dumps({"text": text}), headers)
    assert status == 200, data
    return json.loads(data)


def agree(ours: int, peer: int, texts: list[str]) -> None:
    """The same model served both ways should give the same entities (scores within 1e-4;
    ringserve's ONNX Runtime and the peer's torch differ in the last float bits)."""
    same = 0
    for text in texts:
        a, b = post(ours, text), post(peer, text)
        spans = [(e["label"], e["start"], e["end"]) for e in a]
        if spans == [(e["label"], e["start"], e["end"]) for e in b] and all(
            abs(x["score"] - y["score"]) < 1e-4 for x, y in zip(a, b, strict=True)
        ):
            same += 1
    print(f"ringserve and the peer give the same entities on {same} of {len(texts)} texts")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--c", type=int, default=32)
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "rs-token-bench")
    args = parser.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    texts = load_texts(SST2, args.texts)
    source, artifact = build(args.work)
    when = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())
    print(f"model: BertForTokenClassification, base shapes, {len(CONLL)} labels ({artifact}); "
          f"{len(texts)} SST-2 texts; c={args.c}; {cores} cores; {when}")  # fmt: skip
    pool: CeilingPool | None
    pool, batches = ceiling_plan(artifact, texts, cores, args.c, max(2.0, args.seconds / 5))
    tmp = Path(tempfile.mkdtemp(prefix="rs-token-bench-"))
    server = Launched(tmp, ["--model", str(artifact)])
    tops: list[float] = []
    ours: LoadResult | None = None
    try:
        server.wait_ready()
        print("ceiling and served (ringserve serve, default options) in turns, the best of each "
              "kept (a shared machine's other load only ever slows a run):")  # fmt: skip
        for _ in range(args.runs):
            tops.append(pool.run(batches, args.seconds)[0])
            print(f"  ceiling {tops[-1]:.1f} texts/s", flush=True)
            run = load(server.port, server.pid, texts, args.c, args.seconds, 1)
            ours = run if ours is None or run.rps > ours.rps else ours
        pool.close()
        pool = None
        peer = Peer(source, cores)
        try:
            agree(server.port, peer.port, texts[:20])
            print(f"peer (transformers' pipeline behind FastAPI, {cores} uvicorn workers x 1 "
                  "thread):")  # fmt: skip
            theirs = load(peer.port, peer.pid, texts, args.c, args.seconds, args.runs)
        finally:
            stop_group(peer.proc)
    finally:
        server.terminate()
        if pool is not None:
            pool.close()
    assert ours is not None
    top = max(tops)
    print("\n| c | ceiling texts/s | served texts/s | served/ceiling | P50 / P99 ms | peer texts/s "
          "| peer P50 / P99 ms | served/peer |")  # fmt: skip
    print("| --- " * 8 + "|")
    print(f"| {args.c} | {top:.1f} | {ours.rps:.1f} | {ours.rps / top:.3f} | "
          f"{ours.pct(50):.0f} / {ours.pct(99):.0f} | {theirs.rps:.1f} | "
          f"{theirs.pct(50):.0f} / {theirs.pct(99):.0f} | "
          f"{ours.rps / theirs.rps:.2f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
