"""Tiny random Hugging Face classifiers of every supported architecture, built with
`transformers` at test time (nothing is downloaded), and the sample texts their tokenizers learn
from: for the tests of `ringserve export --from` and the int8 benchmark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from ringserve.factory.build import default_encoder_dir
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from devkit.launcher import DATA

MAX_LENGTH = 24  # short, so that long texts and pairs are truncated
SIZE = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}
# A wide initialiser: HF's default (0.02) makes every score about uniform, which would hide errors.
SIZE |= {"intermediate_size": 37, "initializer_range": 0.4}


def _texts(path: Path, n: int) -> list[str]:
    rows = path.read_text(encoding="utf-8").splitlines()[1 : n + 1]
    return [r.split("\t")[0] for r in rows]


SST2 = _texts(DATA / "sst2" / "sample.tsv", 400)
NEWS = _texts(DATA / "ag_news" / "sample.tsv", 20)


def bpe_tokenizer() -> Tokenizer:
    """A small byte-level BPE with RoBERTa's special tokens and post-processor."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(SST2, trainer)
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return tok


# name -> (config class, config fields, tokenizer kind, whether HF feeds token types)
MODELS: dict[str, tuple[str, dict[str, Any], str, bool]] = {
    "bert": (
        "BertConfig",
        SIZE | {"id2label": {0: "entailment", 1: "neutral", 2: "contradiction"}},
        "wordpiece",
        True,
    ),
    "distilbert": (
        "DistilBertConfig",
        {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 37, "initializer_range": 0.4},
        "wordpiece",
        False,
    ),
    "roberta": ("RobertaConfig", SIZE | {"pad_token_id": 1, "type_vocab_size": 1}, "bpe", False),
    "xlmr-reranker": (
        "XLMRobertaConfig",
        SIZE | {"pad_token_id": 1, "type_vocab_size": 1, "num_labels": 1},
        "bpe",
        False,
    ),
    "electra-multilabel": (
        "ElectraConfig",
        SIZE
        | {
            "embedding_size": 16,
            "problem_type": "multi_label_classification",
            "id2label": {0: "sports", 1: "politics", 2: "science", 3: "arts"},
        },
        "wordpiece",
        True,
    ),
}


def save_model(name: str, root: Path) -> Path:
    """A tiny randomly initialised classifier and its tokenizer, saved as HF saves them."""
    cls_name, fields, kind, _ = MODELS[name]
    if kind == "wordpiece":
        tok = Tokenizer.from_file(str(default_encoder_dir() / "tokenizer.json"))
    else:
        tok = bpe_tokenizer()
    positions = 40 + (2 if kind == "bpe" else 0)  # RoBERTa's positions start after padding_idx
    import transformers  # a test extra: only the tests that build these models need it

    config = getattr(transformers, cls_name)(
        vocab_size=tok.get_vocab_size(), max_position_embeddings=positions, **fields
    )
    torch.manual_seed(len(name))
    model = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    out = root / name
    model.save_pretrained(out)
    tok.save(str(out / "tokenizer.json"))
    return out
