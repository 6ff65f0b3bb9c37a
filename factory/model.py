"""A small hand-written BERT encoder with sentence-transformers pooling and a linear head.

Weights come from a BERT-family `model.safetensors` (HF names) and are loaded strictly: every
tensor is used or explicitly listed as unused, and every shape is checked. The module is
TorchScript-able, so a built artifact needs only torch to run.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import Tensor, nn

# Added to the scores of padded keys. exp(MASK_VALUE - max) underflows to exactly 0.0, so padded
# keys get exactly zero attention weight and padding cannot change a text's output.
MASK_VALUE: float = float(torch.finfo(torch.float32).min)

# Checkpoint tensors that sentence-transformers never uses: the [CLS] pooler feeds BERT's NSP
# head, while all-MiniLM-L6-v2 mean-pools. Anything else left over is an error.
UNUSED_KEYS: frozenset[str] = frozenset({"pooler.dense.weight", "pooler.dense.bias"})
# A buffer (0..max_position-1) that some exports carry; checked, not loaded.
POSITION_IDS_KEY = "embeddings.position_ids"


class WeightError(ValueError):
    """The checkpoint does not match the architecture described by its config."""


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float

    @classmethod
    def from_file(cls, path: Path) -> BertConfig:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if raw.get("hidden_act", "gelu") != "gelu":
            raise WeightError(f"{path}: hidden_act {raw['hidden_act']!r} is not supported")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise WeightError(f"{path}: only absolute position embeddings are supported")
        try:
            config = cls(
                vocab_size=int(raw["vocab_size"]),
                hidden_size=int(raw["hidden_size"]),
                num_hidden_layers=int(raw["num_hidden_layers"]),
                num_attention_heads=int(raw["num_attention_heads"]),
                intermediate_size=int(raw["intermediate_size"]),
                max_position_embeddings=int(raw["max_position_embeddings"]),
                type_vocab_size=int(raw["type_vocab_size"]),
                layer_norm_eps=float(raw["layer_norm_eps"]),
            )
        except KeyError as exc:
            raise WeightError(f"{path}: missing field {exc.args[0]!r}") from None
        if config.hidden_size % config.num_attention_heads:
            raise WeightError(f"{path}: hidden_size is not a multiple of num_attention_heads")
        return config


class Embeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids: Tensor) -> Tensor:
        positions = torch.arange(input_ids.size(1), device=input_ids.device)
        # Single-segment input: every token has token type 0.
        token_types = torch.zeros_like(input_ids)
        x = self.word(input_ids) + self.token_type(token_types) + self.position(positions)
        return self.norm(x)


def activate(x: Tensor, kind: str) -> Tensor:
    """The activations the supported families use, by their config names."""
    if kind == "gelu":
        return F.gelu(x)
    if kind == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if kind == "tanh":
        return torch.tanh(x)
    return F.relu(x)


class Layer(nn.Module):
    """One post-LN transformer layer: self-attention, then a feed-forward block (GELU for BERT;
    the Hugging Face families of factory/hf.py name theirs)."""

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
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.mask_value = MASK_VALUE
        self.embeddings = Embeddings(config)
        layer = (
            config.hidden_size,
            config.num_attention_heads,
            config.intermediate_size,
            config.layer_norm_eps,
        )
        self.layers = nn.ModuleList([Layer(*layer) for _ in range(config.num_hidden_layers)])

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Token states [B, L, H] for int64 ids and a 0/1 mask, both [B, L]."""
        x = self.embeddings(input_ids)
        keep = attention_mask.to(x.dtype).unsqueeze(1).unsqueeze(2)  # [B, 1, 1, L]
        mask_bias = (1.0 - keep) * self.mask_value
        for layer in self.layers:
            x = layer(x, mask_bias)
        return x


class Classifier(nn.Module):
    """Encoder, mean pooling over real tokens, L2 normalisation, then a linear head."""

    def __init__(self, config: BertConfig, num_labels: int) -> None:
        super().__init__()
        self.encoder = Encoder(config)
        self.head = nn.Linear(config.hidden_size, num_labels)

    @torch.jit.export
    def mean_pool(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """The mean of the real tokens' states [B, H] (sentence-transformers' mean pooling)."""
        states = self.encoder(input_ids, attention_mask)
        weights = attention_mask.to(states.dtype).unsqueeze(-1)
        summed = (states * weights).sum(dim=1)
        counts = weights.sum(dim=1).clamp(min=1e-9)
        return summed / counts

    @torch.jit.export
    def embed(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """The sentence embedding [B, H] exactly as all-MiniLM-L6-v2 computes it."""
        return F.normalize(self.mean_pool(input_ids, attention_mask), p=2.0, dim=1)

    @torch.jit.export
    def classify_embed(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """One forward, both answers: the head's logits [B, C] (of the normalized embedding)
        and the mean-pooled vector before normalization [B, H], side by side as [B, C + H]
        (workers/runtime.py splits them; the front-end normalizes unless asked not to)."""
        pooled = self.mean_pool(input_ids, attention_mask)
        return torch.cat([self.head(F.normalize(pooled, p=2.0, dim=1)), pooled], dim=1)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.head(self.embed(input_ids, attention_mask))


class OnnxBoth(nn.Module):
    """What model.onnx holds for an embed artifact: outputs `logits` and `embedding`."""

    def __init__(self, inner: Classifier) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        pooled = self.inner.mean_pool(input_ids, attention_mask)
        return self.inner.head(F.normalize(pooled, p=2.0, dim=1)), pooled


def _checkpoint_names(config: BertConfig) -> dict[str, str]:
    """Map each encoder parameter name (ours) to its HF checkpoint name."""
    names = {
        "embeddings.word.weight": "embeddings.word_embeddings.weight",
        "embeddings.position.weight": "embeddings.position_embeddings.weight",
        "embeddings.token_type.weight": "embeddings.token_type_embeddings.weight",
        "embeddings.norm.weight": "embeddings.LayerNorm.weight",
        "embeddings.norm.bias": "embeddings.LayerNorm.bias",
    }
    parts = {
        "query": "attention.self.query",
        "key": "attention.self.key",
        "value": "attention.self.value",
        "attn_out": "attention.output.dense",
        "attn_norm": "attention.output.LayerNorm",
        "ffn_in": "intermediate.dense",
        "ffn_out": "output.dense",
        "ffn_norm": "output.LayerNorm",
    }
    for i in range(config.num_hidden_layers):
        for ours, theirs in parts.items():
            for kind in ("weight", "bias"):
                names[f"layers.{i}.{ours}.{kind}"] = f"encoder.layer.{i}.{theirs}.{kind}"
    return names


def _strip_prefix(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    # Some exports prefix every name with "bert." (BertForX checkpoints); accept both.
    if tensors and all(k.startswith("bert.") for k in tensors):
        return {k[len("bert.") :]: v for k, v in tensors.items()}
    return tensors


def load_encoder_weights(encoder: Encoder, config: BertConfig, weights_path: Path) -> None:
    """Copy a safetensors checkpoint into `encoder`, refusing any missing, extra or odd tensor."""
    tensors = _strip_prefix(load_file(str(weights_path)))
    names = _checkpoint_names(config)
    params = dict(encoder.named_parameters())
    if set(params) != set(names):  # a bug in this module, not in the checkpoint
        raise AssertionError(f"parameter map out of date: {sorted(set(params) ^ set(names))}")
    missing = sorted(theirs for theirs in names.values() if theirs not in tensors)
    unexpected = sorted(set(tensors) - set(names.values()) - UNUSED_KEYS - {POSITION_IDS_KEY})
    if missing or unexpected:
        raise WeightError(f"{weights_path}: missing tensors {missing}, unexpected {unexpected}")
    if POSITION_IDS_KEY in tensors:
        expected = torch.arange(config.max_position_embeddings)
        if not torch.equal(tensors[POSITION_IDS_KEY].reshape(-1).long(), expected):
            raise WeightError(f"{weights_path}: {POSITION_IDS_KEY} is not 0..N-1")
    with torch.no_grad():
        for ours, theirs in names.items():
            source, target = tensors[theirs], params[ours]
            if source.shape != target.shape:
                raise WeightError(
                    f"{weights_path}: {theirs} has shape {list(source.shape)}, "
                    f"expected {list(target.shape)}"
                )
            target.copy_(source.to(torch.float32))


def build_classifier(
    encoder_dir: Path,
    head_weight: Tensor | None = None,
    head_bias: Tensor | None = None,
    num_labels: int = 2,
) -> Classifier:
    """A Classifier in eval mode with encoder weights from `encoder_dir`.

    Without a head the head is zeros (useful when only `embed` is wanted, as in training).
    """
    encoder_dir = Path(encoder_dir)
    config = BertConfig.from_file(encoder_dir / "config.json")
    if head_weight is not None:
        num_labels = head_weight.shape[0]
    model = Classifier(config, num_labels)
    load_encoder_weights(model.encoder, config, encoder_dir / "model.safetensors")
    with torch.no_grad():
        if head_weight is None or head_bias is None:
            model.head.weight.zero_()
            model.head.bias.zero_()
        else:
            expected = (num_labels, config.hidden_size)
            if tuple(head_weight.shape) != expected or tuple(head_bias.shape) != (num_labels,):
                raise WeightError(
                    f"head weight {list(head_weight.shape)} / bias {list(head_bias.shape)} "
                    f"do not fit an encoder of hidden size {config.hidden_size}"
                )
            model.head.weight.copy_(head_weight.to(torch.float32))
            model.head.bias.copy_(head_bias.to(torch.float32))
    return model.eval()
