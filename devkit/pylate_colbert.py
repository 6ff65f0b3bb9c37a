"""PyLate's side of tests/model/test_colbert.py, run by the venv that `make install-test` builds
for it (.venv-pylate: PyLate 1.6 pins sentence-transformers 5.3 and transformers <= 5.3, below
the test extra's), never imported by the tests themselves.

`python devkit/pylate_colbert.py SPEC.json OUT_DIR`: SPEC names the tokenizer directory, the
texts and the model's sizes. A tiny random BERT is saved, made a ColBERT by PyLate (a random
projection) and saved by PyLate (OUT_DIR/pylate); the same weights are also written in
Stanford ColBERT's layout (OUT_DIR/stanford: HF_ColBERT, `bert.` names, `linear.weight`,
artifact.metadata) and loaded back by PyLate. For each, OUT_DIR/NAME.json holds PyLate's
`encode` of the queries and of the documents, `rank.rerank` of the documents for each query,
and each pair's MaxSim scored alone (`colbert_scores` without padding).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from pylate import models, rank
from pylate.scores import colbert_scores
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, BertConfig, BertModel


def reference(model: Any, spec: dict[str, Any]) -> dict[str, Any]:
    queries, documents = spec["queries"], spec["documents"]
    q = model.encode(queries, is_query=True, batch_size=4)
    d = model.encode(documents, is_query=False, batch_size=4)
    ids = list(range(len(documents)))
    ranked = rank.rerank(
        documents_ids=[ids] * len(queries), queries_embeddings=q, documents_embeddings=[d] * len(q)
    )
    alone = [
        [float(colbert_scores(torch.tensor(qe)[None], torch.tensor(de)[None])[0, 0]) for de in d]
        for qe in q
    ]
    return {
        "queries": [x.tolist() for x in q],
        "documents": [x.tolist() for x in d],
        "rank": [[{"id": int(h["id"]), "score": float(h["score"])} for h in r] for r in ranked],
        "alone": alone,
    }


def stanford(src: Path, dst: Path, spec: dict[str, Any]) -> None:
    """The PyLate model's weights in Stanford ColBERT's layout."""
    dst.mkdir()
    config = json.loads((src / "config.json").read_text())
    config["architectures"] = ["HF_ColBERT"]
    (dst / "config.json").write_text(json.dumps(config))
    tensors = {"bert." + k: v for k, v in load_file(str(src / "model.safetensors")).items()}
    tensors["linear.weight"] = load_file(str(src / "1_Dense" / "model.safetensors"))[
        "linear.weight"
    ]
    save_file(tensors, str(dst / "model.safetensors"))
    AutoTokenizer.from_pretrained(spec["tokenizer"]).save_pretrained(dst)
    meta = {
        "query_token_id": "[unused0]",
        "doc_token_id": "[unused1]",
        "query_maxlen": spec["query_length"],
        "doc_maxlen": spec["document_length"],
        "attend_to_mask_tokens": False,
    }
    (dst / "artifact.metadata").write_text(json.dumps(meta))


def main(spec_path: str, out: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    root = Path(out)
    torch.manual_seed(spec["seed"])
    tok = AutoTokenizer.from_pretrained(spec["tokenizer"])
    config = BertConfig(vocab_size=tok.vocab_size, **spec["config"])
    BertModel(config).save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    model = models.ColBERT(
        model_name_or_path=str(root / "base"),
        embedding_size=spec["embedding_size"],
        query_length=spec["query_length"],
        document_length=spec["document_length"],
        device="cpu",
    )
    model.save(str(root / "pylate"))
    saved = models.ColBERT(model_name_or_path=str(root / "pylate"), device="cpu")
    (root / "pylate.json").write_text(json.dumps(reference(saved, spec)))
    stanford(root / "pylate", root / "stanford", spec)
    loaded = models.ColBERT(model_name_or_path=str(root / "stanford"), device="cpu")
    (root / "stanford.json").write_text(json.dumps(reference(loaded, spec)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
