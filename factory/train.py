"""`ringserve train` fits the default head on frozen sentence embeddings; `evaluate` scores it.

The held-out split is a pure function of each sentence's text, so it never changes between runs
and duplicate sentences always fall on the same side.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from ringserve.factory.build import (
    DEFAULT_ENCODER_NAME,
    DEFAULT_HEAD,
    DEFAULT_LABELS,
    DEFAULT_MAX_LENGTH,
    default_artifact_dir,
    default_encoder_dir,
)
from ringserve.factory.model import build_classifier
from ringserve.workers.artifact import (
    ArtifactError,
    load_manifest,
    load_model,
    load_tokenizer,
    open_tokenizer,
)
from tokenizers import Tokenizer
from torch import Tensor

SPLIT_RULE = "held out iff int(sha1(utf8(sentence)).hexdigest(), 16) % {mod} == 0"
BATCH_SIZE = 128
L2 = 1e-4  # light ridge on the weights (not the bias), in units of mean cross-entropy

Row = tuple[str, int]


def read_tsv(path: Path) -> list[Row]:
    """(sentence, label) rows of a `sentence<TAB>label` file with a header and no quoting."""
    rows: list[Row] = []
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader, None)
        if header != ["sentence", "label"]:
            raise ValueError(f"{path}: header must be 'sentence<TAB>label', got {header!r}")
        for line, record in enumerate(reader, start=2):
            if len(record) != 2:
                raise ValueError(f"{path}:{line}: expected 2 columns, got {len(record)}")
            rows.append((record[0], int(record[1])))
    return rows


def is_held_out(text: str, mod: int) -> bool:
    return int(hashlib.sha1(text.encode("utf-8")).hexdigest(), 16) % mod == 0


def split(rows: Sequence[Row], mod: int) -> tuple[list[Row], list[Row]]:
    train = [row for row in rows if not is_held_out(row[0], mod)]
    held = [row for row in rows if is_held_out(row[0], mod)]
    return train, held


def run_batched(
    fn: Callable[[Tensor, Tensor], Tensor],
    tokenizer: Tokenizer,
    texts: Sequence[str],
    batch_size: int = BATCH_SIZE,
) -> Tensor:
    """fn(ids, mask) over all texts in length-sorted padded batches, rows back in input order."""
    encodings = tokenizer.encode_batch(list(texts))
    order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
    outputs: list[Tensor] = []
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            chunk = [encodings[i] for i in order[start : start + batch_size]]
            width = max(len(e.ids) for e in chunk)
            ids = torch.zeros((len(chunk), width), dtype=torch.int64)  # pad id 0
            mask = torch.zeros((len(chunk), width), dtype=torch.int64)
            for row, encoding in enumerate(chunk):
                ids[row, : len(encoding.ids)] = torch.tensor(encoding.ids)
                mask[row, : len(encoding.ids)] = 1
            outputs.append(fn(ids, mask).float())
    result = torch.empty((len(texts), outputs[0].shape[1]) if outputs else (0, 0))
    if outputs:
        result[torch.tensor(order)] = torch.cat(outputs)
    return result


def fit_head(features: Tensor, labels: Tensor, num_labels: int) -> tuple[Tensor, Tensor]:
    """Multinomial logistic regression by full-batch L-BFGS; returns (weight [C, D], bias [C])."""
    weight = torch.zeros((num_labels, features.shape[1]), requires_grad=True)
    bias = torch.zeros(num_labels, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [weight, bias], lr=1.0, max_iter=500, tolerance_grad=1e-7, line_search_fn="strong_wolfe"
    )

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(features @ weight.T + bias, labels) + L2 * weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return weight.detach().clone(), bias.detach().clone()


def accuracy(logits: Tensor, labels: Tensor) -> float:
    return float((logits.argmax(dim=1) == labels).double().mean()) if len(labels) else 0.0


def _use_all_cores() -> None:
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _train_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ringserve train", description=__doc__)
    parser.add_argument("--data", type=Path, required=True, help="TSV: sentence<TAB>label")
    parser.add_argument("--out", type=Path, default=DEFAULT_HEAD, help="head JSON to write")
    parser.add_argument("--encoder", type=Path, default=None, help="encoder dir (default: MiniLM)")
    parser.add_argument("--holdout-mod", type=int, default=10, help="1 in N sentences held out")
    parser.add_argument("--max-train", type=int, default=20000, help="training rows (subsample)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the training subsample")
    parser.add_argument(
        "--labels",
        default=",".join(DEFAULT_LABELS),
        help="label names, comma-separated, for label ids 0, 1, ... (default: SST-2's)",
    )
    return parser


def _subsample(train_rows: list[Row], max_train: int, seed: int) -> list[Row]:
    """`max_train` of the training rows, drawn with `seed` and kept in their order (all: 0)."""
    if not 0 < max_train < len(train_rows):
        return train_rows
    picked = sorted(random.Random(seed).sample(range(len(train_rows)), max_train))
    return [train_rows[i] for i in picked]


def _write_head(
    out: Path, labels: list[str], weight: Tensor, bias: Tensor, provenance: dict[str, Any]
) -> None:
    head = {
        "labels": labels,
        "weight": weight.tolist(),
        "bias": bias.tolist(),
        "provenance": provenance,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(head, indent=1) + "\n", encoding="utf-8")


def main(argv: list[str]) -> int:
    args = _train_parser().parse_args(argv)
    _use_all_cores()
    started = time.monotonic()
    rows = read_tsv(args.data)
    train_rows, held_rows = split(rows, args.holdout_mod)
    used = _subsample(train_rows, args.max_train, args.seed)
    print(f"{len(rows)} rows: {len(used)} of {len(train_rows)} for training, {len(held_rows)} held")

    try:
        encoder_dir = args.encoder or default_encoder_dir()
    except ArtifactError as exc:
        print(f"ringserve train: {exc}", file=sys.stderr)
        return 1
    model = build_classifier(encoder_dir)
    tokenizer = open_tokenizer(encoder_dir / "tokenizer.json", DEFAULT_MAX_LENGTH)
    x_train = run_batched(model.embed, tokenizer, [t for t, _ in used])
    x_held = run_batched(model.embed, tokenizer, [t for t, _ in held_rows])
    y_train = torch.tensor([y for _, y in used])
    y_held = torch.tensor([y for _, y in held_rows])
    print(f"embedded in {time.monotonic() - started:.0f} s")

    labels = [name.strip() for name in args.labels.split(",")]
    weight, bias = fit_head(x_train, y_train, len(labels))
    train_acc = accuracy(x_train @ weight.T + bias, y_train)
    held_acc = accuracy(x_held @ weight.T + bias, y_held)
    print(f"train accuracy: {train_acc:.4f} (n={len(used)})")
    print(f"held-out accuracy: {held_acc:.4f} (n={len(held_rows)})")

    provenance: dict[str, Any] = {
        "data_file": args.data.name,
        "data_sha256": _file_sha256(args.data),
        "rows": len(rows),
        "train_rows_available": len(train_rows),
        "train_rows_used": len(used),
        "held_out_rows": len(held_rows),
        "split_rule": SPLIT_RULE.format(mod=args.holdout_mod),
        "subsample": f"random.Random({args.seed}).sample of the training rows",
        "seed": args.seed,
        "l2": L2,
        "train_accuracy": round(train_acc, 4),
        "held_out_accuracy": round(held_acc, 4),
        "encoder": DEFAULT_ENCODER_NAME if args.encoder is None else str(args.encoder),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "torch": torch.__version__,
    }
    _write_head(args.out, labels, weight, bias, provenance)
    print(f"wrote {args.out} in {time.monotonic() - started:.0f} s")
    return 0


# Ships with the repository (data/README.md: held-out SST-2 rows, with provenance).
SAMPLE = Path(__file__).resolve().parent.parent / "data" / "sst2" / "sample.tsv"


def evaluate_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="ringserve evaluate", description="Accuracy of a model artifact on held-out rows."
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=SAMPLE,
        help="TSV: sentence<TAB>label (default: the SST-2 sample in data/, all held-out rows; "
        "the full training set by its path)",
    )
    parser.add_argument("--model", type=Path, default=None, help="artifact (default: built-in)")
    parser.add_argument("--holdout-mod", type=int, default=10, help="1 in N sentences held out")
    args = parser.parse_args(argv)
    if not args.data.is_file():
        print(
            f"ringserve evaluate: no data file {args.data}; give one with --data", file=sys.stderr
        )
        return 2
    _use_all_cores()
    try:
        artifact = args.model or default_artifact_dir()
        manifest = load_manifest(artifact)
        tokenizer = load_tokenizer(artifact, manifest.max_length)
        model = load_model(artifact)
    except ArtifactError as exc:
        print(f"ringserve evaluate: {exc}", file=sys.stderr)
        return 1
    _, held_rows = split(read_tsv(args.data), args.holdout_mod)
    logits = run_batched(model, tokenizer, [t for t, _ in held_rows])
    held_acc = accuracy(logits, torch.tensor([y for _, y in held_rows]))
    print(f"held-out accuracy: {held_acc:.4f} (n={len(held_rows)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
