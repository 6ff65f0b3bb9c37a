"""Tiny random masked-language models and sentence-transformers SparseEncoder directories built
with `transformers` and `sentence-transformers` at test time (nothing is downloaded), and the
SparseEncoder that is their reference: for the tests of sparse (SPLADE) models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from ringserve.factory.build import default_encoder_dir
from tokenizers import Tokenizer

from devkit.hfmodels import MAX_LENGTH, SIZE, bpe_tokenizer

# name -> (config class, MLM class, config fields, tokenizer kind)
MLMS: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "bert": ("BertConfig", "BertForMaskedLM", dict(SIZE), "wordpiece"),
    "distilbert": (
        "DistilBertConfig",
        "DistilBertForMaskedLM",
        {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 37, "initializer_range": 0.4},
        "wordpiece",
    ),
    "roberta": (
        "RobertaConfig",
        "RobertaForMaskedLM",
        SIZE | {"pad_token_id": 1, "type_vocab_size": 1},
        "bpe",
    ),
}
# The decoder's bias is lowered so that about this share of a token's logits stay positive: a
# text then has tens to hundreds of nonzero terms, as a trained SPLADE model's, not half the
# vocabulary (random weights alone give).
POSITIVE_SHARE = 0.005


def save_mlm(name: str, root: Path, seed: int = 7, max_length: int = MAX_LENGTH) -> Path:
    """A tiny random `*ForMaskedLM` (of MLMS's shapes; its positions 40 unless they say) with its
    tokenizer saved as `transformers` saves it (so that sentence-transformers loads the directory
    too), `max_length` its tokenizer's model_max_length."""
    import transformers

    cfg_name, cls_name, fields, kind = MLMS[name]
    wordpiece = kind == "wordpiece"
    tok = Tokenizer.from_file(str(default_encoder_dir() / "tokenizer.json")) if wordpiece else (
        bpe_tokenizer()
    )  # fmt: skip
    fields = {"max_position_embeddings": 40 + (0 if wordpiece else 2)} | fields
    config = getattr(transformers, cfg_name)(vocab_size=tok.get_vocab_size(), **fields)
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(config).eval()
    with torch.no_grad():
        ids = torch.randint(5, config.vocab_size, (4, 16))
        logits = model(input_ids=ids).logits.flatten()[:1_000_000]
        share = max(POSITIVE_SHARE, 20 / config.vocab_size)  # a small vocabulary: 20 a token
        model.get_output_embeddings().bias -= torch.quantile(logits, 1 - share)
    out = root / f"{name}-mlm"
    model.save_pretrained(out)
    tok.save(str(out / "tokenizer.json"))
    special = (
        {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
         "mask_token": "[MASK]"}
        if wordpiece
        else {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
              "cls_token": "<s>", "sep_token": "</s>", "mask_token": "<unk>"}
    )  # fmt: skip
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(out / "tokenizer.json"), model_max_length=max_length, **special
    )
    raw = (out / "tokenizer.json").read_bytes()
    fast.save_pretrained(out)
    (out / "tokenizer.json").write_bytes(raw)  # the tokenizer file as it was, unchanged
    return out


def save_sparse_encoder(mlm: Path, root: Path, pooling: str = "max") -> Path:
    """A SparseEncoder directory (its MLM module, then SpladePooling) of the MLM at `mlm`."""
    encoder = reference(mlm, pooling)
    out = root / f"{mlm.name}-sparse-encoder"
    encoder.save(str(out))
    return out


def reference(source: Path, pooling: str = "max", max_length: int = MAX_LENGTH) -> Any:
    """sentence-transformers' SparseEncoder of a SparseEncoder directory, or of an MLM directory
    with SpladePooling (`pooling`): what the served vectors must equal."""
    from sentence_transformers import SparseEncoder

    if (source / "modules.json").is_file():
        return SparseEncoder(str(source), device="cpu")
    from sentence_transformers.sparse_encoder.modules import SpladePooling, Transformer

    mlm = Transformer(str(source), transformer_task="fill-mask", max_seq_length=max_length)
    return SparseEncoder(modules=[mlm, SpladePooling(pooling)], device="cpu")


def encode(encoder: Any, texts: list[str]) -> np.ndarray:
    """The SparseEncoder's vectors [N, V] (dense), each text encoded alone."""
    with torch.no_grad():
        rows = [encoder.encode([t], convert_to_tensor=True).to_dense()[0] for t in texts]
    return torch.stack(rows).numpy().astype(np.float64)
