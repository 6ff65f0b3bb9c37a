"""`ringserve export` builds a model artifact from a BERT encoder directory and a head file."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from workers.artifact import (
    DEFAULT_MAX_LENGTH,
    ArtifactError,
    build_artifact,
    default_encoder_dir,
    load_manifest,
    read_head,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ringserve export", description=__doc__)
    parser.add_argument(
        "--encoder",
        type=Path,
        default=None,
        help="dir with model.safetensors, config.json, tokenizer.json (default: all-MiniLM-L6-v2)",
    )
    parser.add_argument("--head", type=Path, required=True, help="head JSON (from ringserve train)")
    parser.add_argument("--out", type=Path, required=True, help="artifact directory to write")
    parser.add_argument("--name", default=None, help="model name (default: the --out dir name)")
    parser.add_argument(
        "--max-length", type=int, default=DEFAULT_MAX_LENGTH, help="truncate texts to N tokens"
    )
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        encoder = args.encoder or default_encoder_dir()
        head_state, head_info = read_head(args.head)
        extra = {
            "encoder": str(encoder) if args.encoder else "sentence-transformers/all-MiniLM-L6-v2",
            "head": head_info.get("provenance", {}),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        out = build_artifact(
            args.out,
            encoder,
            head_state,
            args.name or args.out.absolute().name,
            head_info["labels"],
            args.max_length,
            extra,
        )
        manifest = load_manifest(out)
    except ArtifactError as exc:
        print(f"ringserve export: {exc}", file=sys.stderr)
        return 1
    print(out)
    print(manifest.fingerprint)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
