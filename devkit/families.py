"""Tiny random DeBERTa-v2 (v3 config), ModernBERT and MPNet checkpoints, built with
`transformers` and `tokenizers` at test time (nothing downloaded): classifiers, one-output
cross-encoders, base models and sentence-transformers directories with Dense and Normalize."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from devkit.hfmodels import NEWS, SST2, bpe_tokenizer

SIZE = {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4}
SIZE |= {"intermediate_size": 37, "initializer_range": 0.4}
# DeBERTa-v3's own settings, with buckets small enough that the test texts reach the log range.
DEBERTA_V3 = {
    "relative_attention": True,
    "position_buckets": 8,
    "max_relative_positions": -1,
    "norm_rel_ebd": "layer_norm",
    "share_att_key": True,
    "pos_att_type": "p2c|c2p",
    "position_biased_input": False,
    "type_vocab_size": 0,
    "layer_norm_eps": 1e-7,
    "max_position_embeddings": 64,
}
MODERNBERT = {
    "local_attention": 8,
    "global_attn_every_n_layers": 2,
    "max_position_embeddings": 8192,
}
FAMILIES = {"deberta-v2": "DebertaV2", "modernbert": "ModernBert", "mpnet": "MPNet"}


def unigram_tokenizer() -> Tokenizer:
    """A SentencePiece-style Unigram with Metaspace and DeBERTa-v3's [CLS] ... [SEP] template."""
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    special = ["[PAD]", "[CLS]", "[SEP]", "[UNK]"]
    trainer = trainers.UnigramTrainer(
        vocab_size=300, special_tokens=special, unk_token="[UNK]", show_progress=False
    )
    tok.train_from_iterator(SST2 + NEWS, trainer)
    tok.post_processor = _template(tok, "[CLS]", "[SEP]")
    return tok


def _template(tok: Tokenizer, cls: str, sep: str) -> Any:
    ids = [(cls, tok.token_to_id(cls)), (sep, tok.token_to_id(sep))]
    return processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1", special_tokens=ids
    )


def tokenizer_for(family: str) -> Tokenizer:
    if family == "deberta-v2":
        return unigram_tokenizer()
    tok = bpe_tokenizer()  # <s> 0, <pad> 1, </s> 2, <unk> 3
    if family == "modernbert":
        tok.post_processor = _template(tok, "<s>", "</s>")
    return tok


def config_for(family: str, vocab: int, extra: dict[str, Any]) -> Any:
    import transformers

    fields = SIZE | {"vocab_size": vocab} | extra
    if family == "deberta-v2":
        fields |= DEBERTA_V3
    elif family == "modernbert":
        fields |= MODERNBERT | {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}
        fields |= {"cls_token_id": 0, "sep_token_id": 2}
    else:
        fields |= {"max_position_embeddings": 66}
    return getattr(transformers, FAMILIES[family] + "Config")(**fields)


def save_classifier(family: str, root: Path, **extra: Any) -> Path:
    """A tiny random *ForSequenceClassification and its tokenizer.json, saved as HF does."""
    import transformers

    tok = tokenizer_for(family)
    config = config_for(family, tok.get_vocab_size(), extra)
    torch.manual_seed(7)
    model = getattr(transformers, FAMILIES[family] + "ForSequenceClassification")(config).eval()
    model.save_pretrained(root)
    tok.save(str(root / "tokenizer.json"))
    return root


def save_sentence_transformers(
    family: str, root: Path, dense: int = 24, default_prompt: str | None = None
) -> Path:
    """A sentence-transformers directory: the base model, mean pooling, a Tanh Dense to `dense`
    features and Normalize, with query/document prompts."""
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as st

    tok = tokenizer_for(family)
    base = root / "base"
    config = config_for(family, tok.get_vocab_size(), {})
    torch.manual_seed(11)
    getattr(transformers, FAMILIES[family] + "Model")(config).eval().save_pretrained(base)
    tok.save(str(base / "tokenizer.json"))
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(base / "tokenizer.json"),
        pad_token=tok.id_to_token(0 if family == "deberta-v2" else 1),
    )
    fast.save_pretrained(base)
    word = st.Transformer(str(base), max_seq_length=48)
    pooling = st.Pooling(word.get_embedding_dimension(), pooling_mode="mean")
    torch.manual_seed(13)
    proj = st.Dense(word.get_embedding_dimension(), dense, activation_function=torch.nn.Tanh())
    prompts = {"query": "query: ", "document": "search_document: "}
    model = SentenceTransformer(
        modules=[word, pooling, proj, st.Normalize()],
        prompts=prompts,
        default_prompt_name=default_prompt,
    )
    out = root / "st"
    model.save(str(out))
    return out


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data), encoding="utf-8")
