"""int8's accuracy-speed frontier, as the artifact build measured it: the default model's (from
its manifest) and, with --families, that of a tiny random model of every exported family (BERT,
DistilBERT, RoBERTa, XLM-R, ELECTRA, built as tests/model/test_hf.py builds them), with each build's
time. Agreement is with fp32 on the 1,000 rows of the selection split (the figures that chose the
recipe; the published cost is read on the publication split); speed is texts/s on one thread.

    python -m benchmarks.int8_frontier [--families]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from ringserve.factory.build import build_hf_artifact, default_artifact_dir
from ringserve.workers.artifact import Manifest, load_manifest


def table(name: str, manifest: Manifest) -> None:
    """The frontier the recipe was chosen on (selection split), then its published cost."""
    record = manifest.graphs.get("int8_selection", {})
    cost = manifest.int8
    fp32 = record.get("fp32_texts_per_s", {})
    least = record.get("min_speedup")
    print(f"\n{name}: fp32 texts/s {fp32}; chosen: {cost.get('recipe')} (at least {least}x)")
    print(f"  chosen on {record.get('texts')} rows: {record.get('split')}")
    head = ("recipe", "agreement", "accuracy", "max dscore", "texts/s", "x fp32")
    print("  {:34s} {:>9s} {:>8s} {:>10s} {:>8s} {:>6s}".format(*head))
    for row in record.get("frontier", []):
        mark = "*" if row["recipe"] == cost.get("recipe") else " "
        print(
            f" {mark}{row['recipe']:34s} {row['argmax_agreement']:9.4f} "
            f"{row.get('accuracy_int8', float('nan')):8.4f} {row['max_score_diff']:10.4f} "
            f"{row['texts_per_s']:8.1f} {row['speedup']:6.2f}"
        )
    keys = ("texts", "argmax_agreement", "argmax_agreement_ci95", "accuracy_fp32")
    keys += ("accuracy_int8", "accuracy_cost", "accuracy_cost_ci95", "mean_cosine")
    print(
        "  published (publication split): " + ", ".join(f"{k} {cost[k]}" for k in keys if k in cost)
    )


def families() -> None:
    import torch

    from devkit.hfmodels import MAX_LENGTH, MODELS, save_model

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in MODELS:
            source = save_model(name, root / "src")
            t0 = time.perf_counter()
            out = build_hf_artifact(root / "art" / name, source, name, MAX_LENGTH)
            took = time.perf_counter() - t0
            manifest = load_manifest(out)
            search = os.environ.get("RINGSERVE_INT8_SEARCH", "full")
            table(f"{name} (tiny, random; build {took:.1f} s, search {search})", manifest)
            for row in manifest.graphs.get("int8_selection", {}).get("failed", []):
                print(f"  failed: {row['recipe']}: {row['error']}")
            print(f"  fused graph: {manifest.graphs.get('fused')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--families", action="store_true", help="also every exported family")
    args = parser.parse_args()
    manifest = load_manifest(default_artifact_dir())
    table(f"default model {manifest.name}", manifest)
    print(f"  fused graph: {manifest.graphs.get('fused')}")
    if args.families:
        families()


if __name__ == "__main__":
    main()
