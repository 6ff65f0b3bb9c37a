"""Sentence encoders: a Hugging Face base model (BERT, DistilBERT, RoBERTa, XLM-R, ELECTRA) and
sentence-transformers' pooling, in one TorchScript-able module that answers the pooled vector.

Two sources: a sentence-transformers directory (modules.json: Transformer, Pooling, an optional
Normalize) or a plain base-model directory with the pooling named on the command line. The
pooling runs inside the graph, so TorchScript and ONNX Runtime answer the same vector; the L2
normalisation of 2_Normalize is the front-end's (manifest `normalize`), as for the default model,
so that TEI's `"normalize": false` can still have the raw vector.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from ringserve.factory.encoder import Encoder, HfConfig, WeightError, copy_weights, read_config
from ringserve.factory.hf import _PREFIX, _check_buffers, checkpoint_names, read_weights
from torch import Tensor

# The base models' architectures (config.json "architectures") -> family, as in factory/hf.py.
BASE_ARCHITECTURES: dict[str, str] = {
    "BertModel": "bert",
    "DistilBertModel": "distilbert",
    "RobertaModel": "roberta",
    "XLMRobertaModel": "roberta",
    "ElectraModel": "electra",
}
POOLINGS = ("mean", "cls", "max", "last")
# sentence-transformers' names for them: its pooling_mode values and the older boolean keys.
_ST_MODES = {"mean": "mean", "cls": "cls", "max": "max", "lasttoken": "last"}
_ST_KEYS = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_lasttoken": "last",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
}
# The modules of a sentence-transformers pipeline, by the last part of their type name.
_ST_TRANSFORMER, _ST_POOLING, _ST_NORMALIZE = "Transformer", "Pooling", "Normalize"
# The base models' pooler (BERT's and RoBERTa's [CLS] dense layer) is not part of any pooling.
_UNUSED = ("pooler.dense.weight", "pooler.dense.bias")


def pool(states: Tensor, keep: Tensor, pooling: str) -> Tensor:
    """sentence-transformers' pooling of token states [B, L, H] over the real tokens (keep: 0/1
    [B, L], right padded): mean, the first token, the component-wise max, or the last real
    token."""
    if pooling == "cls":
        return states[:, 0]
    weights = keep.unsqueeze(-1)
    if pooling == "max":
        return states.masked_fill(weights == 0, float("-inf")).max(dim=1).values
    if pooling == "last":
        last = keep.sum(dim=1).to(torch.int64) - 1
        index = last.view(-1, 1, 1).expand(states.size(0), 1, states.size(2))
        return torch.gather(states, 1, index).squeeze(1)
    return (states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)


class SentenceEncoder(Encoder):
    """The encoder (factory/encoder.py), then pooling: the sentence vector [B, H]."""

    def __init__(self, c: HfConfig, pooling: str) -> None:
        if pooling not in POOLINGS:
            raise WeightError(f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
        super().__init__(c)
        self.pooling = pooling

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        x = self.encode(input_ids, attention_mask)
        return pool(x, (attention_mask > 0).to(x.dtype), self.pooling)

    @torch.jit.export
    def classify_embed(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """What workers.runtimes.joined.Joined calls: no labels, so the row is the vector alone."""
        return self.forward(input_ids, attention_mask)


@dataclass(frozen=True)
class EmbedSource:
    """A directory to export as an embed model: where the weights are, and how to pool."""

    model_dir: Path  # config.json, the weights and tokenizer.json
    pooling: str
    normalize: bool
    max_length: int | None  # sentence-transformers' max_seq_length, when it says one
    kind: str  # "sentence-transformers" or the base architecture


def _st_pooling(path: Path) -> str:
    raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    mode = raw.get("pooling_mode")
    if mode is None:  # the boolean keys of sentence-transformers before 5
        mode = [name for key, name in _ST_KEYS.items() if raw.get(key)]
    modes = [mode] if isinstance(mode, str) else list(mode)
    if raw.get("include_prompt", True) is not True:
        raise WeightError(f"{path}: include_prompt false is not supported")
    if len(modes) != 1 or modes[0] not in _ST_MODES:
        raise WeightError(
            f"{path}: pooling {modes} is not supported; one of mean, cls, max, lasttoken"
        )
    return _ST_MODES[modes[0]]


def _st_max_length(root: Path) -> int | None:
    """sentence-transformers' max_seq_length: in sentence_bert_config.json, or (from version 5)
    the tokenizer's model_max_length."""
    for name, key in (("sentence_bert_config.json", "max_seq_length"),
                      ("tokenizer_config.json", "model_max_length")):  # fmt: skip
        path = root / name
        if path.is_file():
            value = json.loads(path.read_text(encoding="utf-8")).get(key)
            if isinstance(value, int) and 0 < value < 1 << 20:  # HF writes 1e30 for "none"
                return value
    return None


def read_sentence_transformers(root: Path) -> EmbedSource:
    """A sentence-transformers directory: modules.json must be Transformer, Pooling and an
    optional Normalize, in that order; anything else (Dense, a router) is refused by name."""
    modules = json.loads((root / "modules.json").read_text(encoding="utf-8"))
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise WeightError(f"{root}/modules.json: not a list of modules")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if kinds not in ([_ST_TRANSFORMER, _ST_POOLING], [_ST_TRANSFORMER, _ST_POOLING, _ST_NORMALIZE]):
        raise WeightError(
            f"{root}/modules.json: modules {kinds} are not supported; "
            "Transformer, Pooling and an optional Normalize"
        )
    model_dir = root / str(modules[0].get("path", ""))
    config = root / "sentence_bert_config.json"
    if config.is_file() and json.loads(config.read_text(encoding="utf-8")).get("do_lower_case"):
        raise WeightError(f"{config}: do_lower_case is not supported (lowercase in the tokenizer)")
    return EmbedSource(
        model_dir=model_dir,
        pooling=_st_pooling(root / str(modules[1].get("path", ""))),
        normalize=len(kinds) == 3,
        max_length=_st_max_length(model_dir),
        kind="sentence-transformers",
    )


def _base_weights(c: HfConfig, tensors: dict[str, Tensor], where: Path) -> dict[str, Tensor]:
    """The checkpoint's tensors under the classifier's names (factory/hf.py checkpoint_names),
    less the head: a base model saves them without the family prefix, and its pooler is unused."""
    prefix = _PREFIX[c.family]
    out: dict[str, Tensor] = {}
    for name, tensor in tensors.items():
        bare = name[len(prefix) :] if name.startswith(prefix) else name
        if bare in _UNUSED:
            continue
        out[prefix + bare] = tensor
    return out


def build_encoder(source: EmbedSource) -> tuple[SentenceEncoder, HfConfig]:
    """The encoder of `source` in eval mode, every tensor used or named unused, every shape
    checked (as factory/hf.py loads a classifier)."""
    config = read_config(source.model_dir / "config.json", BASE_ARCHITECTURES)
    model = SentenceEncoder(config, source.pooling)
    where, raw = read_weights(source.model_dir)
    tensors = _base_weights(config, raw, where)
    names = {
        ours: theirs
        for ours, theirs in checkpoint_names(config).items()
        if not ours.startswith(("dense.", "out."))  # the classifier's head: none here
    }
    known = _check_buffers(config, tensors, where)
    copy_weights(model, names, tensors, where, known, " from config.json")
    return model.eval(), replace(config, labels=())


def embed_source(root: Path, pooling: str | None) -> EmbedSource | None:
    """The embed model that `root` holds, or None when it is a classifier directory (the
    caller's case). A base model needs `pooling`; a sentence-transformers one says its own."""
    if (root / "modules.json").is_file():
        if pooling is not None:
            raise WeightError(f"{root}: a sentence-transformers directory names its own pooling")
        return read_sentence_transformers(root)
    raw: Any = json.loads((root / "config.json").read_text(encoding="utf-8"))
    archs = raw.get("architectures") or [] if isinstance(raw, dict) else []
    base = next((a for a in archs if a in BASE_ARCHITECTURES), None)
    if base is None:
        if pooling is not None:
            raise WeightError(
                f"{root}: --pooling goes with a base model ({', '.join(BASE_ARCHITECTURES)}), "
                f"not {archs}"
            )
        return None
    if pooling is None:
        raise WeightError(f"{root}: a {base} directory needs --pooling ({', '.join(POOLINGS)})")
    return EmbedSource(root, pooling, normalize=False, max_length=None, kind=base)
