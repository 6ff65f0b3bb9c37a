"""The TorchScript module an embed artifact's runners call: its forward is the scripted model's
classify_embed (factory/model.py, factory/embedder.py), so every runner's one output carries
the logits and the embedding side by side (workers/runtimes/cpu.py splits them)."""

from __future__ import annotations

from torch import Tensor, nn


class Joined(nn.Module):
    """A loaded embed artifact's module as the runners call it: forward is its
    classify_embed, so every runner's one output carries logits and embedding."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.inner.classify_embed(input_ids, attention_mask)  # type: ignore[operator]
