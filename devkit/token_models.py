"""Tiny random `*ForTokenClassification` checkpoints of every family, built with `transformers` at
test time (nothing downloaded), each saved with its fast tokenizer as `save_pretrained` writes
it: BERT on a WordPiece (all-MiniLM-L6-v2's, uncased, accents stripped), DeBERTa-v3 on a
SentencePiece-style Unigram, XLM-R on a byte-level BPE, and the other families on theirs.

The classifier is scaled so that each token's top label is clear (a random head's logits are
near zero, its labels near uniform, which would make every entity a coin toss and hide the
aggregation paths); `O` gets a bias so that entities end and begin. The texts mix accents, CJK
and emoji, which all three tokenizer kinds offset differently.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from devkit import families as fam
from devkit.hfmodels import SIZE, bpe_tokenizer

LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "MISC", "B-ORG", "I-ORG"]
MAX_LENGTH = 24  # windows come soon: a text of 30 words takes three of them
TEXTS = [
    "Angela Merkel met Emmanuel Macron in Paris on Tuesday.",
    "José Müller from São Paulo visited Zürich and Kraków.",
    "東京タワー is in 東京都 and 北京 is far away.",
    "We ❤️ New York 🗽 and the 🍕 in Napoli!",
    "naïve café owners in Île-de-France",
    "ok",
    "The  spaces   and\ttabs stay, with ünïcödé words.",
]
LONG = (
    "In 1999 Jean-Pierre Rampal played in Montréal, then Wolfgang Schüssler flew to 北京 "
    "with Åsa Lindqvist 😀 before the Rolling Stones came to Buenos Aires, where "
    "Gabriel García Márquez met Frida Kahlo at the Café Tortoni on a rainy day. "
)
# name -> (transformers' name prefix, tokenizer kind)
FAMILIES: dict[str, tuple[str, str]] = {
    "bert": ("Bert", "wordpiece"),
    "distilbert": ("DistilBert", "wordpiece"),
    "roberta": ("Roberta", "bpe"),
    "xlmr": ("XLMRoberta", "bpe"),
    "electra": ("Electra", "wordpiece"),
    "deberta-v3": ("DebertaV2", "unigram"),
    "modernbert": ("ModernBert", "bpe"),
    "mpnet": ("MPNet", "wordpiece"),
}
SPECIALS = {  # the fast tokenizer's special tokens, by tokenizer kind
    "wordpiece": {"unk_token": "[UNK]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                  "sep_token": "[SEP]", "mask_token": "[MASK]"},
    "unigram": {"unk_token": "[UNK]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                "sep_token": "[SEP]"},
    "bpe": {"unk_token": "<unk>", "pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>",
            "cls_token": "<s>", "sep_token": "</s>"},
}  # fmt: skip


def tokenizer(kind: str) -> Tokenizer:
    if kind == "wordpiece":
        from ringserve.factory.build import default_encoder_dir

        return Tokenizer.from_file(str(default_encoder_dir() / "tokenizer.json"))
    if kind == "unigram":
        return fam.unigram_tokenizer()
    return bpe_tokenizer()


def config(name: str, vocab: int) -> Any:
    import transformers

    prefix, kind = FAMILIES[name]
    labels = {"id2label": dict(enumerate(LABELS)), "label2id": {x: i for i, x in enumerate(LABELS)}}
    if name == "deberta-v3":
        fields: dict[str, Any] = fam.SIZE | fam.DEBERTA_V3
    elif name == "modernbert":
        fields = fam.SIZE | fam.MODERNBERT | {"pad_token_id": 1, "bos_token_id": 0}
        fields |= {"eos_token_id": 2, "cls_token_id": 0, "sep_token_id": 2}
    elif name == "distilbert":
        fields = {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 37}
        fields |= {"max_position_embeddings": 40}
    else:
        fields = dict(SIZE) | {"max_position_embeddings": 40}
        if kind == "bpe":  # RoBERTa's positions start after padding_idx
            fields |= {"pad_token_id": 1, "type_vocab_size": 1, "max_position_embeddings": 42}
        if name == "mpnet":
            fields |= {"max_position_embeddings": 42}
        if name == "electra":
            fields |= {"embedding_size": 16}
    return getattr(transformers, prefix + "Config")(vocab_size=vocab, **fields | labels)


def sharpen(model: Any, fast: Any, seed: int) -> None:
    """Set the classifier so each token's top label is clear: random directions over the token
    states as they vary from their mean on TEXTS (a random encoder's states share a large
    common part, which alone would pick one label everywhere), logits spread about 4, and `O`
    favoured a little, so entities begin and end."""
    linear = model.classifier
    seen: list[torch.Tensor] = []
    hook = linear.register_forward_hook(lambda mod, args, out: seen.append(args[0].detach()))
    with torch.no_grad():
        for text in [*TEXTS, LONG]:
            model(**fast(text, return_tensors="pt", truncation=True))
    hook.remove()
    states = torch.cat([s.reshape(-1, s.shape[-1]) for s in seen])
    mean, spread = states.mean(0), (states - states.mean(0)).std()
    width = linear.weight.shape[1]
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(linear.weight.shape, generator=gen) * 4 / (math.sqrt(width) * spread)
    with torch.no_grad():
        linear.weight.copy_(weight)
        linear.bias.copy_(-weight @ mean)
        linear.bias[0] += 1.0


def save_token_classifier(name: str, root: Path, max_length: int = MAX_LENGTH) -> Path:
    """A tiny random *ForTokenClassification with its fast tokenizer (model_max_length set, so
    transformers' pipeline cuts and windows where the artifact does), saved in root/name."""
    import transformers

    prefix, kind = FAMILIES[name]
    tok = tokenizer(kind)
    if name == "modernbert":
        tok.post_processor = fam._template(tok, "<s>", "</s>")
    model_config = config(name, tok.get_vocab_size())
    torch.manual_seed(len(name))
    model = getattr(transformers, prefix + "ForTokenClassification")(model_config).eval()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, model_max_length=max_length, **SPECIALS[kind]
    )
    sharpen(model, fast, len(name) + 1)
    out = root / name
    model.save_pretrained(out)
    fast.save_pretrained(out)
    tok.save(str(out / "tokenizer.json"))  # the library's own file, as the model was trained on
    return out


def pipeline(source: Path, **kwargs: Any) -> Any:
    """transformers' token-classification pipeline of a saved checkpoint, on the CPU, as a
    function of its inputs (and call options). Its notice that a tokenizer without a subword
    prefix falls back on its heuristic (first, average and max on SentencePiece or byte-level
    BPE) is what the heuristic's users get; it is muted here."""
    import transformers

    model = transformers.AutoModelForTokenClassification.from_pretrained(source).eval()
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(source)
    pipe = transformers.pipeline("token-classification", model=model, tokenizer=tok, device=-1,
                                 **kwargs)  # fmt: skip

    def run(inputs: Any, **options: Any) -> Any:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Tokenizer does not support real words")
            return pipe(inputs, **options)

    return run


def as_entities(found: list[dict[str, Any]]) -> list[tuple[str, float, int, int]]:
    """The pipeline's entities as ours: (label, score, start, end)."""
    return [
        (e.get("entity_group", e.get("entity")), float(e["score"]), e["start"], e["end"])
        for e in found
    ]
