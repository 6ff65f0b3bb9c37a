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

from pathlib import Path

import torch
from ringserve.factory import encoder
from ringserve.factory.encoder import (
    BERT_LAYER_PARTS,
    Encoder,
    HfConfig,
    WeightError,
    activate,
    copy_weights,
)
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
# Each family's head: dense -> activation -> output, on the first token.
_HEAD_ACT = {"bert": "tanh", "roberta": "tanh", "electra": "gelu", "distilbert": "relu"}


def supported() -> str:
    return ", ".join(ARCHITECTURES)


def read_config(path: Path, architectures: dict[str, str] = ARCHITECTURES) -> HfConfig:
    """The parts of a HF config.json the model needs (factory/encoder.py), for the sequence
    classifiers unless `architectures` says others."""
    return encoder.read_config(path, architectures)


class SequenceClassifier(Encoder):
    """Encoder, then the family's head on the first token ([CLS] or <s>): logits [B, C]."""

    def __init__(self, c: HfConfig) -> None:
        super().__init__(c)
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)
        self.out = nn.Linear(c.hidden_size, len(c.labels))
        self.head_act = _HEAD_ACT[c.family]

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        x = self.encode(input_ids, attention_mask)
        return self.out(activate(self.dense(x[:, 0]), self.head_act))


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
        for ours, theirs in (_DISTIL_PARTS if distil else BERT_LAYER_PARTS).items():
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
    known = _check_buffers(c, tensors, where)
    copy_weights(model, checkpoint_names(c), tensors, where, known, " from config.json")


def build(model_dir: Path) -> tuple[SequenceClassifier, HfConfig]:
    """The classifier in a HF model directory, in eval mode, with its config."""
    config = read_config(model_dir / "config.json")
    model = SequenceClassifier(config)
    where, tensors = read_weights(model_dir)
    load_weights(model, config, where, tensors)
    return model.eval(), config
