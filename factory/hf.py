"""Hand-written BERT, DistilBERT, RoBERTa, XLM-R and ELECTRA sequence classifiers (HF checkpoints).

A `save_pretrained` directory (config.json, model.safetensors or pytorch_model.bin) loads strictly
into one TorchScript-able module: every tensor is used or named as a known buffer, and every
shape is checked. The serving path needs only torch; `transformers` is never imported here.

The model takes (input_ids, attention_mask), as the default model does. For a pair on a model
with token types (BERT, ELECTRA) the mask carries them: 0 padding, 1 first segment, 2 second
segment. So every runner (TorchScript, CUDA graphs, ONNX) feeds two buffers, and a 0/1 mask from
any other caller still means "one segment".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from ringserve.factory.model import MASK_VALUE, Layer, WeightError, activate
from torch import Tensor, nn

# Architecture (config.json "architectures") -> family; XLM-R has RoBERTa's layout and prefix.
ARCHITECTURES: dict[str, str] = {
    "BertForSequenceClassification": "bert",
    "DistilBertForSequenceClassification": "distilbert",
    "RobertaForSequenceClassification": "roberta",
    "XLMRobertaForSequenceClassification": "roberta",
    "ElectraForSequenceClassification": "electra",
}
_PREFIX = {
    "bert": "bert.",
    "distilbert": "distilbert.",
    "roberta": "roberta.",
    "electra": "electra.",
}
# HF activation names -> ours ("gelu" is the exact erf form, "gelu_new" the tanh approximation).
_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}
# Each family's head: dense -> activation -> output, on the first token.
_HEAD_ACT = {"bert": "tanh", "roberta": "tanh", "electra": "gelu", "distilbert": "relu"}


def supported() -> str:
    return ", ".join(ARCHITECTURES)


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

    @property
    def token_types(self) -> bool:
        """Whether a pair's second segment gets token type 1: BERT and ELECTRA. RoBERTa's
        tokenizers give no token types (HF feeds zeros), whatever type_vocab_size says."""
        return self.family in ("bert", "electra") and self.type_vocab_size >= 2

    @property
    def activation(self) -> str:
        multi = self.problem_type == "multi_label_classification"
        return "sigmoid" if multi or len(self.labels) == 1 else "softmax"

    @property
    def max_length(self) -> int:
        """The longest input the position table holds (RoBERTa's starts after padding_idx)."""
        if self.family == "roberta":
            return self.max_positions - self.pad_token_id - 1
        return self.max_positions


def _labels(raw: dict, path: Path) -> tuple[str, ...]:
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


def read_config(path: Path, architectures: dict[str, str] = ARCHITECTURES) -> HfConfig:
    """The parts of a HF config.json the model needs; refuses what it cannot serve exactly.
    `architectures`: the ones accepted, each with its family (factory/embedder.py passes the
    base models')."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(raw, dict):
        raise WeightError(f"{path}: not a JSON object")
    archs = raw.get("architectures") or []
    arch = next((a for a in archs if a in architectures), None)
    if arch is None:
        raise WeightError(
            f"{path}: architecture {archs or raw.get('model_type')!r} is not supported; "
            f"supported: {', '.join(architectures)}"
        )
    family = architectures[arch]
    distil = family == "distilbert"
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise WeightError(f"{path}: only absolute position embeddings are supported")
    act = raw.get("activation" if distil else "hidden_act", "gelu")
    if act not in _ACTIVATIONS:
        raise WeightError(
            f"{path}: activation {act!r} is not supported ({', '.join(_ACTIVATIONS)})"
        )
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
            act=_ACTIVATIONS[act],
            pad_token_id=int(pad) if pad is not None else int(family == "roberta"),
            labels=_labels(raw, path),
            problem_type=raw.get("problem_type"),
        )
    except KeyError as exc:
        raise WeightError(f"{path}: missing field {exc.args[0]!r}") from None
    if config.hidden_size % config.num_heads:
        raise WeightError(f"{path}: the hidden size is not a multiple of the head count")
    return config


class Embeddings(nn.Module):
    def __init__(self, c: HfConfig) -> None:
        super().__init__()
        e = c.embedding_size
        self.word = nn.Embedding(c.vocab_size, e)
        self.position = nn.Embedding(c.max_positions, e)
        self.token_type = nn.Embedding(c.type_vocab_size, e) if c.type_vocab_size else None
        self.norm = nn.LayerNorm(e, eps=c.layer_norm_eps)
        self.project = nn.Linear(e, c.hidden_size) if e != c.hidden_size else None
        self.offset_positions = c.family == "roberta"
        self.padding_idx = c.pad_token_id
        self.token_types = c.token_types

    def forward(self, input_ids: Tensor, mask: Tensor) -> Tensor:
        if self.offset_positions:
            # As HF derives them from the ids, but from the mask: padding here is id 0, not <pad>.
            keep = (mask > 0).to(input_ids.dtype)
            positions = torch.cumsum(keep, dim=1) * keep + self.padding_idx
        else:
            positions = torch.arange(input_ids.size(1), device=input_ids.device).unsqueeze(0)
        x = self.word(input_ids) + self.position(positions)
        if self.token_type is not None:
            types = (mask - 1).clamp(min=0) if self.token_types else torch.zeros_like(input_ids)
            x = x + self.token_type(types)
        x = self.norm(x)
        if self.project is not None:
            x = self.project(x)
        return x


class SequenceClassifier(nn.Module):
    """Encoder, then the family's head on the first token ([CLS] or <s>): logits [B, C]."""

    def __init__(self, c: HfConfig) -> None:
        super().__init__()
        self.mask_value = MASK_VALUE
        self.embeddings = Embeddings(c)
        layer = (c.hidden_size, c.num_heads, c.intermediate_size, c.layer_norm_eps, c.act)
        self.layers = nn.ModuleList([Layer(*layer) for _ in range(c.num_layers)])
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)
        self.out = nn.Linear(c.hidden_size, len(c.labels))
        self.head_act = _HEAD_ACT[c.family]

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        x = self.embeddings(input_ids, attention_mask)
        keep = (attention_mask > 0).to(x.dtype).unsqueeze(1).unsqueeze(2)  # [B, 1, 1, L]
        mask_bias = (1.0 - keep) * self.mask_value
        for layer in self.layers:
            x = layer(x, mask_bias)
        return self.out(activate(self.dense(x[:, 0]), self.head_act))


_LAYER_PARTS = {
    "query": "attention.self.query",
    "key": "attention.self.key",
    "value": "attention.self.value",
    "attn_out": "attention.output.dense",
    "attn_norm": "attention.output.LayerNorm",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
    "ffn_norm": "output.LayerNorm",
}
_DISTIL_PARTS = {
    "query": "attention.q_lin",
    "key": "attention.k_lin",
    "value": "attention.v_lin",
    "attn_out": "attention.out_lin",
    "attn_norm": "sa_layer_norm",
    "ffn_in": "ffn.lin1",
    "ffn_out": "ffn.lin2",
    "ffn_norm": "output_layer_norm",
}
_HEAD_NAMES = {
    "bert": ("bert.pooler.dense", "classifier"),
    "distilbert": ("pre_classifier", "classifier"),
    "roberta": ("classifier.dense", "classifier.out_proj"),
    "electra": ("classifier.dense", "classifier.out_proj"),
}


def checkpoint_names(c: HfConfig) -> dict[str, str]:
    """Each of our parameter names -> its name in the HF checkpoint."""
    p = _PREFIX[c.family]
    modules = {
        "embeddings.word": p + "embeddings.word_embeddings",
        "embeddings.position": p + "embeddings.position_embeddings",
        "embeddings.norm": p + "embeddings.LayerNorm",
    }
    if c.type_vocab_size:
        modules["embeddings.token_type"] = p + "embeddings.token_type_embeddings"
    if c.embedding_size != c.hidden_size:
        modules["embeddings.project"] = p + "embeddings_project"
    distil = c.family == "distilbert"
    layer_base = p + ("transformer.layer" if distil else "encoder.layer")
    for i in range(c.num_layers):
        for ours, theirs in (_DISTIL_PARTS if distil else _LAYER_PARTS).items():
            modules[f"layers.{i}.{ours}"] = f"{layer_base}.{i}.{theirs}"
    modules["dense"], modules["out"] = _HEAD_NAMES[c.family]
    names: dict[str, str] = {}
    for ours, theirs in modules.items():
        table = ours in ("embeddings.word", "embeddings.position", "embeddings.token_type")
        for kind in ("weight",) if table else ("weight", "bias"):
            names[f"{ours}.{kind}"] = f"{theirs}.{kind}"
    return names


def read_weights(model_dir: Path) -> tuple[Path, dict[str, Tensor]]:
    """The checkpoint's tensors, from model.safetensors or else pytorch_model.bin."""
    safe = model_dir / "model.safetensors"
    if safe.is_file():
        from safetensors.torch import load_file

        return safe, load_file(str(safe))
    legacy = model_dir / "pytorch_model.bin"
    if legacy.is_file():
        return legacy, torch.load(str(legacy), map_location="cpu", weights_only=True)
    raise WeightError(f"{model_dir}: neither model.safetensors nor pytorch_model.bin is there")


def _check_buffers(c: HfConfig, tensors: dict[str, Tensor], where: Path) -> set[str]:
    """Index buffers some exports save; they must hold what the model computes itself."""
    p = _PREFIX[c.family] + "embeddings."
    found: set[str] = set()
    positions = tensors.get(p + "position_ids")
    if positions is not None:
        found.add(p + "position_ids")
        if not torch.equal(positions.reshape(-1).long(), torch.arange(positions.numel())):
            raise WeightError(f"{where}: {p}position_ids is not 0..N-1")
    types = tensors.get(p + "token_type_ids")
    if types is not None:
        found.add(p + "token_type_ids")
        if bool(types.any()):
            raise WeightError(f"{where}: {p}token_type_ids is not all zeros")
    return found


def load_weights(model: SequenceClassifier, c: HfConfig, where: Path, tensors: dict) -> None:
    """Copy a checkpoint into `model`, refusing any missing, extra or misshapen tensor."""
    names = checkpoint_names(c)
    params = dict(model.named_parameters())
    if set(params) != set(names):  # a bug in this module, not in the checkpoint
        raise AssertionError(f"parameter map out of date: {sorted(set(params) ^ set(names))}")
    missing = sorted(t for t in names.values() if t not in tensors)
    unexpected = sorted(set(tensors) - set(names.values()) - _check_buffers(c, tensors, where))
    if missing or unexpected:
        raise WeightError(f"{where}: missing tensors {missing}, unexpected {unexpected}")
    with torch.no_grad():
        for ours, theirs in names.items():
            source, target = tensors[theirs], params[ours]
            if source.shape != target.shape:
                raise WeightError(
                    f"{where}: {theirs} has shape {list(source.shape)}, "
                    f"expected {list(target.shape)} from config.json"
                )
            target.copy_(source.to(torch.float32))


def build(model_dir: Path) -> tuple[SequenceClassifier, HfConfig]:
    """The classifier in a HF model directory, in eval mode, with its config."""
    config = read_config(model_dir / "config.json")
    model = SequenceClassifier(config)
    where, tensors = read_weights(model_dir)
    load_weights(model, config, where, tensors)
    return model.eval(), config
