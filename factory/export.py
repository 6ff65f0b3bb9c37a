"""`ringserve export` builds a model artifact: from a Hugging Face sequence-classification
directory, a sentence-transformers directory or a base model with `--pooling` (`--from DIR`), or
from a sentence-transformers encoder and a head trained by `ringserve train`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ringserve.factory.build import (
    DEFAULT_MAX_LENGTH,
    build_artifact,
    build_hf_artifact,
    default_encoder_dir,
    read_head,
)
from ringserve.factory.embedder import POOLINGS
from ringserve.factory.sparse import SPLADE
from ringserve.workers.artifact import ArtifactError, load_manifest


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ringserve export", description=__doc__)
    parser.add_argument(
        "--encoder",
        type=Path,
        default=None,
        help="dir with model.safetensors, config.json, tokenizer.json (default: all-MiniLM-L6-v2)",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--from",
        dest="source",
        type=Path,
        help="a Hugging Face save_pretrained dir (config.json, model.safetensors, tokenizer.json)",
    )
    source.add_argument("--head", type=Path, help="head JSON (from ringserve train)")
    parser.add_argument(
        "--pooling",
        choices=(*POOLINGS, SPLADE),
        default=None,
        help="with --from a base model (BertModel, ...): an embed model pooling this way; "
        "splade with a masked-language model (BertForMaskedLM, ...): a sparse model",
    )
    parser.add_argument("--out", type=Path, required=True, help="artifact directory to write")
    parser.add_argument("--name", default=None, help="model name (default: the --out dir name)")
    parser.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="truncate texts to N tokens, at most the model's own (default with --from: the "
        "model's own, its positions or its stated max_seq_length/model_max_length; with "
        f"--head: {DEFAULT_MAX_LENGTH})",
    )
    return parser


def _from_head(args: argparse.Namespace) -> Path:
    encoder = args.encoder or default_encoder_dir()
    head_state, head_info = read_head(args.head)
    extra = {
        "encoder": str(encoder) if args.encoder else "sentence-transformers/all-MiniLM-L6-v2",
        "head": head_info.get("provenance", {}),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return build_artifact(
        args.out,
        encoder,
        head_state,
        args.name or args.out.absolute().name,
        head_info["labels"],
        args.max_length or DEFAULT_MAX_LENGTH,
        extra,
    )


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.source is not None and args.encoder is not None:
        print("ringserve export: --encoder goes with --head, not --from", file=sys.stderr)
        return 2
    if args.pooling is not None and args.source is None:
        print("ringserve export: --pooling goes with --from", file=sys.stderr)
        return 2
    try:
        if args.source is not None:
            name = args.name or args.out.absolute().name
            out = build_hf_artifact(args.out, args.source, name, args.max_length, args.pooling)
        else:
            out = _from_head(args)
        manifest = load_manifest(out)
    except ArtifactError as exc:
        print(f"ringserve export: {exc}", file=sys.stderr)
        return 1
    print(out)
    print(manifest.fingerprint)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
