"""The default model: a BERT encoder (factory/encoder.py) with sentence-transformers pooling and a
linear head.

Weights come from a BERT-family `model.safetensors` (HF names) and are loaded strictly: every
tensor is used or explicitly listed as unused, and every shape is checked. The module is
TorchScript-able, so a built artifact needs only torch to run.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from ringserve.factory.encoder import (
    BERT_LAYER_PARTS,
    Encoder,
    HfConfig,
    WeightError,
    copy_weights,
    read_config,
)
from safetensors.torch import load_file
from torch import Tensor, nn

# Checkpoint tensors that sentence-transformers never uses: the [CLS] pooler feeds BERT's NSP
# head, while all-MiniLM-L6-v2 mean-pools. Anything else left over is an error.
UNUSED_KEYS: frozenset[str] = frozenset({"pooler.dense.weight", "pooler.dense.bias"})
# A buffer (0..max_position-1) that some exports carry; checked, not loaded.
POSITION_IDS_KEY = "embeddings.position_ids"
# The hand-written encoder's config, in BERT's field names (HF's config.json is read by
# factory/encoder.py read_config, one check for every family).
BertConfig = HfConfig.bert


class Classifier(nn.Module):
    """Encoder, mean pooling over real tokens, L2 normalisation, then a linear head."""

    def __init__(self, config: HfConfig, num_labels: int) -> None:
        super().__init__()
        self.encoder = Encoder(config, one_segment=True)
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
        (workers/runtimes/cpu.py splits them; the front-end normalizes unless asked not to)."""
        pooled = self.mean_pool(input_ids, attention_mask)
        return torch.cat([self.head(F.normalize(pooled, p=2.0, dim=1)), pooled], dim=1)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.head(self.embed(input_ids, attention_mask))


class OnnxBoth(nn.Module):
    """What model.onnx holds for an embed artifact: outputs `logits`, `embedding` and `tokens`
    (the last hidden state [B, L, H], TEI's /embed_all: fetched only by a batch that asks)."""

    def __init__(self, inner: Classifier) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        states = self.inner.encoder(input_ids, attention_mask)
        weights = attention_mask.to(states.dtype).unsqueeze(-1)  # as mean_pool, on these states
        pooled = (states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        return self.inner.head(F.normalize(pooled, p=2.0, dim=1)), pooled, states


def _checkpoint_names(config: HfConfig) -> dict[str, str]:
    """Map each encoder parameter name (ours) to its HF checkpoint name."""
    names = {
        "embeddings.word.weight": "embeddings.word_embeddings.weight",
        "embeddings.position.weight": "embeddings.position_embeddings.weight",
        "embeddings.token_type.weight": "embeddings.token_type_embeddings.weight",
        "embeddings.norm.weight": "embeddings.LayerNorm.weight",
        "embeddings.norm.bias": "embeddings.LayerNorm.bias",
    }
    for i in range(config.num_layers):
        for ours, theirs in BERT_LAYER_PARTS.items():
            for kind in ("weight", "bias"):
                names[f"layers.{i}.{ours}.{kind}"] = f"encoder.layer.{i}.{theirs}.{kind}"
    return names


def _strip_prefix(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    # Some exports prefix every name with "bert." (BertForX checkpoints); accept both.
    if tensors and all(k.startswith("bert.") for k in tensors):
        return {k[len("bert.") :]: v for k, v in tensors.items()}
    return tensors


def load_encoder_weights(encoder: Encoder, config: HfConfig, weights_path: Path) -> None:
    """Copy a safetensors checkpoint into `encoder`, refusing any missing, extra or odd tensor."""
    tensors = _strip_prefix(load_file(str(weights_path)))
    if POSITION_IDS_KEY in tensors:
        expected = torch.arange(config.max_positions)
        if not torch.equal(tensors[POSITION_IDS_KEY].reshape(-1).long(), expected):
            raise WeightError(f"{weights_path}: {POSITION_IDS_KEY} is not 0..N-1")
    known = UNUSED_KEYS | {POSITION_IDS_KEY}
    copy_weights(encoder, _checkpoint_names(config), tensors, weights_path, known)


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
    config = read_config(encoder_dir / "config.json", {}, family="bert")
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
