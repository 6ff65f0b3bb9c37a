"""The transformer encoder every model family is built on: one config reader and check (HF
config.json), one embedding module, one post-LN layer, one stack of them, and one strict copy of
a checkpoint's tensors into it. factory/model.py (the default model), factory/hf.py (sequence
classifiers) and factory/embedder.py (sentence encoders) add their heads and names.

The module is TorchScript-able; `transformers` is never imported here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Added to the scores of padded keys. exp(MASK_VALUE - max) underflows to exactly 0.0, so padded
# keys get exactly zero attention weight and padding cannot change a text's output.
MASK_VALUE: float = float(torch.finfo(torch.float32).min)
# HF activation names -> ours ("gelu" is the exact erf form, "gelu_new" the tanh approximation).
ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}


def head_activation(problem_type: str | None, labels: tuple[str, ...]) -> str:
    """What turns a classifier's logits into scores: sigmoid for multi-label and one-logit
    heads (a cross-encoder), softmax otherwise."""
    multi = problem_type == "multi_label_classification"
    return "sigmoid" if multi or len(labels) == 1 else "softmax"


class WeightError(ValueError):
    """The checkpoint does not match the architecture described by its config."""


@dataclass(frozen=True)
class HfConfig:
    architecture: str
    family: str
    vocab_size: int
    hidden_size: int
    embedding_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_positions: int
    type_vocab_size: int  # 0: no token-type embedding at all (DistilBERT)
    layer_norm_eps: float
    act: str
    pad_token_id: int
    labels: tuple[str, ...]
    problem_type: str | None

    @classmethod
    def bert(
        cls,
        *,
        vocab_size: int,
        hidden_size: int,
        num_hidden_layers: int,
        num_attention_heads: int,
        intermediate_size: int,
        max_position_embeddings: int,
        type_vocab_size: int,
        layer_norm_eps: float,
    ) -> HfConfig:
        """A BERT base model's config, in BERT's own field names (factory/model.py)."""
        return cls(
            "BertModel", "bert", vocab_size, hidden_size, hidden_size, num_hidden_layers,
            num_attention_heads, intermediate_size, max_position_embeddings, type_vocab_size,
            layer_norm_eps, "gelu", 0, (), None,
        )  # fmt: skip

    @property
    def token_types(self) -> bool:
        """Whether a pair's second segment gets token type 1: BERT and ELECTRA. RoBERTa's
        tokenizers give no token types (HF feeds zeros), whatever type_vocab_size says."""
        return self.family in ("bert", "electra") and self.type_vocab_size >= 2

    @property
    def activation(self) -> str:
        return head_activation(self.problem_type, self.labels)

    @property
    def max_length(self) -> int:
        """The longest input the position table holds (RoBERTa's starts after padding_idx)."""
        if self.family == "roberta":
            return self.max_positions - self.pad_token_id - 1
        return self.max_positions


def _labels(raw: dict[str, Any], path: Path) -> tuple[str, ...]:
    id2label = raw.get("id2label")
    if not isinstance(id2label, dict) or not id2label:
        n = int(raw.get("num_labels", 2))
        return tuple(f"LABEL_{i}" for i in range(n))
    try:
        by_id = {int(k): str(v) for k, v in id2label.items()}
    except ValueError:
        raise WeightError(f"{path}: id2label keys must be integers") from None
    if sorted(by_id) != list(range(len(by_id))):
        raise WeightError(f"{path}: id2label must number its labels 0..N-1")
    return tuple(by_id[i] for i in range(len(by_id)))


def _architecture(raw: dict[str, Any], path: Path, architectures: dict[str, str]) -> str:
    archs = raw.get("architectures") or []
    arch = next((a for a in archs if a in architectures), None)
    if arch is None:
        raise WeightError(
            f"{path}: architecture {archs or raw.get('model_type')!r} is not supported; "
            f"supported: {', '.join(architectures)}"
        )
    return arch


def read_config(path: Path, architectures: dict[str, str], family: str | None = None) -> HfConfig:
    """The parts of a HF config.json the model needs; refuses what it cannot serve exactly.
    `architectures`: the ones accepted, each with its family; with `family`, any config of that
    family is read (the default model's BERT encoder, whatever its architecture says)."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(raw, dict):
        raise WeightError(f"{path}: not a JSON object")
    if family is None:
        arch = _architecture(raw, path, architectures)
        family = architectures[arch]
    else:
        arch = next(iter(raw.get("architectures") or []), str(raw.get("model_type", family)))
    distil = family == "distilbert"
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise WeightError(f"{path}: only absolute position embeddings are supported")
    act = raw.get("activation" if distil else "hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise WeightError(f"{path}: activation {act!r} is not supported ({', '.join(ACTIVATIONS)})")
    # A field left out of config.json takes the transformers config class's default.
    pad = raw.get("pad_token_id")
    try:
        hidden = int(raw["dim" if distil else "hidden_size"])
        config = HfConfig(
            architecture=arch,
            family=family,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            embedding_size=int(raw.get("embedding_size", 128 if family == "electra" else hidden)),
            num_layers=int(raw["n_layers" if distil else "num_hidden_layers"]),
            num_heads=int(raw["n_heads" if distil else "num_attention_heads"]),
            intermediate_size=int(raw["hidden_dim" if distil else "intermediate_size"]),
            max_positions=int(raw["max_position_embeddings"]),
            type_vocab_size=0 if distil else int(raw.get("type_vocab_size", 2)),
            layer_norm_eps=1e-12 if distil else float(raw.get("layer_norm_eps", 1e-12)),
            act=ACTIVATIONS[act],
            pad_token_id=int(pad) if pad is not None else int(family == "roberta"),
            labels=_labels(raw, path),
            problem_type=raw.get("problem_type"),
        )
    except KeyError as exc:
        raise WeightError(f"{path}: missing field {exc.args[0]!r}") from None
    if config.hidden_size % config.num_heads:
        raise WeightError(f"{path}: the hidden size is not a multiple of the head count")
    return config


def activate(x: Tensor, kind: str) -> Tensor:
    """The activations the supported families use, by their config names."""
    if kind == "gelu":
        return F.gelu(x)
    if kind == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if kind == "tanh":
        return torch.tanh(x)
    return F.relu(x)


class Embeddings(nn.Module):
    """Word, position and token-type embeddings, then LayerNorm (and ELECTRA's projection to
    the hidden size).

    `one_segment`: the default model's form (factory/model.py), every token of type 0 and the
    types added before the positions. The HF families add the positions first and read a pair's
    segments from the mask. Each keeps the order its artifacts were built and measured with:
    ONNX Runtime fuses the two orders differently (an XLM-R embedding moved by 1.3e-4)."""

    def __init__(self, c: HfConfig, one_segment: bool = False) -> None:
        super().__init__()
        e = c.embedding_size
        self.word = nn.Embedding(c.vocab_size, e)
        self.position = nn.Embedding(c.max_positions, e)
        self.token_type = nn.Embedding(c.type_vocab_size, e) if c.type_vocab_size else None
        self.norm = nn.LayerNorm(e, eps=c.layer_norm_eps)
        self.project = nn.Linear(e, c.hidden_size) if e != c.hidden_size else None
        self.offset_positions = c.family == "roberta"
        self.padding_idx = c.pad_token_id
        self.token_types = c.token_types and not one_segment
        self.types_first = one_segment

    def forward(self, input_ids: Tensor, mask: Tensor) -> Tensor:
        if self.offset_positions:
            # As HF derives them from the ids, but from the mask: padding here is id 0, not <pad>.
            keep = (mask > 0).to(input_ids.dtype)
            positions = torch.cumsum(keep, dim=1) * keep + self.padding_idx
        else:
            positions = torch.arange(input_ids.size(1), device=input_ids.device).unsqueeze(0)
        x = self.word(input_ids)
        if self.types_first:
            x = self._add_types(x, input_ids, mask) + self.position(positions)
        else:
            x = self._add_types(x + self.position(positions), input_ids, mask)
        x = self.norm(x)
        if self.project is not None:
            x = self.project(x)
        return x

    def _add_types(self, x: Tensor, input_ids: Tensor, mask: Tensor) -> Tensor:
        if self.token_type is None:
            return x
        # A 0/1 mask is one segment (type 0); a pair's second segment is marked 2 (hf.py).
        types = (mask - 1).clamp(min=0) if self.token_types else torch.zeros_like(input_ids)
        return x + self.token_type(types)


class Layer(nn.Module):
    """One post-LN transformer layer: self-attention, then a feed-forward block (GELU for BERT;
    the other families name theirs)."""

    def __init__(
        self, hidden: int, heads: int, intermediate: int, eps: float, act: str = "gelu"
    ) -> None:
        super().__init__()
        self.num_heads = heads
        self.head_dim = hidden // heads
        self.scale = math.sqrt(self.head_dim)
        self.act = act
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=eps)
        self.ffn_in = nn.Linear(hidden, intermediate)
        self.ffn_out = nn.Linear(intermediate, hidden)
        self.ffn_norm = nn.LayerNorm(hidden, eps=eps)

    def _heads(self, x: Tensor) -> Tensor:
        return x.view(x.size(0), x.size(1), self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor, mask_bias: Tensor) -> Tensor:
        q = self._heads(self.query(x))
        k = self._heads(self.key(x))
        v = self._heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / self.scale + mask_bias
        context = torch.matmul(torch.softmax(scores, dim=-1), v)
        context = context.transpose(1, 2).reshape(x.size(0), x.size(1), -1)
        x = self.attn_norm(self.attn_out(context) + x)
        return self.ffn_norm(self.ffn_out(activate(self.ffn_in(x), self.act)) + x)


class Encoder(nn.Module):
    """Embeddings, then the layers: token states [B, L, H] for int64 ids and a mask [B, L]
    (0 padding; 1, or 2 for a pair's second segment, a real token). The families' models
    subclass it, so their parameter names stay `embeddings.*` and `layers.*`. `one_segment`:
    see Embeddings."""

    def __init__(self, c: HfConfig, one_segment: bool = False) -> None:
        super().__init__()
        self.mask_value = MASK_VALUE
        self.embeddings = Embeddings(c, one_segment)
        layer = (c.hidden_size, c.num_heads, c.intermediate_size, c.layer_norm_eps, c.act)
        self.layers = nn.ModuleList([Layer(*layer) for _ in range(c.num_layers)])

    def encode(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        x = self.embeddings(input_ids, attention_mask)
        keep = (attention_mask > 0).to(x.dtype).unsqueeze(1).unsqueeze(2)  # [B, 1, 1, L]
        mask_bias = (1.0 - keep) * self.mask_value
        for layer in self.layers:
            x = layer(x, mask_bias)
        return x

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.encode(input_ids, attention_mask)


def copy_weights(
    module: nn.Module,
    names: dict[str, str],
    tensors: dict[str, Tensor],
    where: Path,
    known: Set[str] = frozenset(),
    hint: str = "",
) -> None:
    """Copy `tensors` into `module`'s parameters by `names` (ours -> the checkpoint's), refusing
    any missing, unexpected (beyond the `known` buffers and unused tensors) or misshapen one."""
    params = dict(module.named_parameters())
    if set(params) != set(names):  # a bug in the caller's name map, not in the checkpoint
        raise AssertionError(f"parameter map out of date: {sorted(set(params) ^ set(names))}")
    missing = sorted(t for t in names.values() if t not in tensors)
    unexpected = sorted(set(tensors) - set(names.values()) - set(known))
    if missing or unexpected:
        raise WeightError(f"{where}: missing tensors {missing}, unexpected {unexpected}")
    with torch.no_grad():
        for ours, theirs in names.items():
            source, target = tensors[theirs], params[ours]
            if source.shape != target.shape:
                raise WeightError(
                    f"{where}: {theirs} has shape {list(source.shape)}, "
                    f"expected {list(target.shape)}{hint}"
                )
            target.copy_(source.to(torch.float32))


# A BERT layer's parts, by our names, under the checkpoint's (BERT, RoBERTa, XLM-R, ELECTRA and
# the default encoder share them; DistilBERT names its own, factory/hf.py).
BERT_LAYER_PARTS = {
    "query": "attention.self.query",
    "key": "attention.self.key",
    "value": "attention.self.value",
    "attn_out": "attention.output.dense",
    "attn_norm": "attention.output.LayerNorm",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
    "ffn_norm": "output.LayerNorm",
}
