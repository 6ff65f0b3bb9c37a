"""Served/ceiling for one base-size model of each new family (DeBERTa-v3, ModernBERT, MPNet),
random weights of the real shapes, in one run on one machine: each exported with `ringserve
export --from`, served with the default layout and runtime, and measured against its own ceiling
(the model alone in pinned processes, benchmarks/serving.py) on the short mix at c=32.

    python -m benchmarks.families [--families deberta-v2,modernbert,mpnet] [--seconds 6]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import serving
from devkit.builds import CHEAP_BUILDS
from devkit.launcher import load_texts

# The base checkpoints' shapes: microsoft/deberta-v3-base, answerdotai/ModernBERT-base,
# microsoft/mpnet-base (all-mpnet-base-v2's encoder).
BASE: dict[str, dict[str, Any]] = {
    "deberta-v2": {
        "vocab_size": 128100, "hidden_size": 768, "num_hidden_layers": 12,
        "num_attention_heads": 12, "intermediate_size": 3072, "max_position_embeddings": 512,
        "relative_attention": True, "position_buckets": 256, "norm_rel_ebd": "layer_norm",
        "share_att_key": True, "pos_att_type": "p2c|c2p", "position_biased_input": False,
        "type_vocab_size": 0, "layer_norm_eps": 1e-7, "max_relative_positions": -1,
    },
    "modernbert": {
        "vocab_size": 50368, "hidden_size": 768, "num_hidden_layers": 22,
        "num_attention_heads": 12, "intermediate_size": 1152, "local_attention": 128,
        "global_attn_every_n_layers": 3, "max_position_embeddings": 8192,
        "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "cls_token_id": 0,
        "sep_token_id": 2,
    },
    "mpnet": {
        "vocab_size": 30527, "hidden_size": 768, "num_hidden_layers": 12,
        "num_attention_heads": 12, "intermediate_size": 3072, "max_position_embeddings": 514,
    },
}  # fmt: skip


def build(family: str, root: Path) -> Path:
    """A base-size random classifier of `family` with the tests' tokenizer (its ids fall inside
    the real vocabulary), exported to root/art."""
    import torch
    import transformers
    from ringserve.factory import export

    from devkit.families import FAMILIES, tokenizer_for

    tok = tokenizer_for(family)
    config = getattr(transformers, FAMILIES[family] + "Config")(**BASE[family])
    torch.manual_seed(0)
    model = getattr(transformers, FAMILIES[family] + "ForSequenceClassification")(config)
    source = root / family
    model.eval().save_pretrained(source)
    tok.save(str(source / "tokenizer.json"))
    out = root / "art" / family
    assert export.main(["--from", str(source), "--out", str(out), "--max-length", "128"]) == 0
    return out


def measure(family: str, artifact: Path, args: argparse.Namespace) -> float:
    """served/ceiling at c=32 on the short mix, the default runtime."""
    from ringserve.workers.artifact import load_manifest, load_tokenizer

    sargs, _ = serving.options(
        ["--quick", "--no-peer", "--mixes", "short", "--levels", "32", "--skip-limits",
         "--skip-256", "--seconds", str(args.seconds), "--texts", str(args.texts),
         "--server-args", f"--model {artifact}"]
    )  # fmt: skip
    manifest = load_manifest(artifact)
    texts = {"short": load_texts(serving.MIXES["short"], args.texts)}
    tok = load_tokenizer(str(artifact), manifest.max_length)
    encs = {"short": [e.ids for e in tok.encode_batch(texts["short"])]}
    print(f"{family}: {statistics.mean(map(len, encs['short'])):.1f} tokens a text", flush=True)
    pool = serving.CeilingPool(sargs.cores)
    try:
        pool.load(str(artifact), *serving.RUNTIMES[0][:2])
        _, levels = serving.run_config(sargs, pool, str(artifact), texts, encs, serving.RUNTIMES[0])
    finally:
        pool.close()
    level = levels["short", 32]
    return level.served.load.rps / level.ceiling


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default=",".join(BASE))
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--texts", type=int, default=600)
    args = p.parse_args(argv)
    # int8 is not what is served or measured here (fp32 is): build it the tests' cheap way
    # (today's recipe alone, 400 publication rows), or the builds take most of the run.
    for key, value in CHEAP_BUILDS.items():
        os.environ.setdefault(key, value)
    ratios = {}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ringserve-families-") as tmp:
        for family in args.families.split(","):
            t = time.monotonic()
            artifact = build(family, Path(tmp))
            print(f"{family}: built in {time.monotonic() - t:.0f} s", flush=True)
            ratios[family] = measure(family, artifact, args)
    print("\n| family | served/ceiling, c=32, short mix |\n| --- | --- |")
    for family, ratio in ratios.items():
        print(f"| {family} | {ratio:.3f} |")
    print(f"took {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
