"""Runs batches through the TorchScript model from buffers allocated once per bucket."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from workers.batcher import Item, batch_limits


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    out: np.ndarray = e / e.sum(axis=1, keepdims=True)
    return out.astype(np.float32, copy=False)


def fill_rows(ids: np.ndarray, mask: np.ndarray, batch: list[Item]) -> int:
    """Write a batch's token ids and mask into the first rows of preallocated buffers; returns
    the real token count. Rows are cleared first so padding is always id 0, mask 0."""
    n = len(batch)
    ids[:n] = 0
    mask[:n] = 0
    tokens = 0
    for row, item in enumerate(batch):
        k = len(item.ids)
        ids[row, :k] = item.ids
        mask[row, :k] = 1
        tokens += k
    return tokens


class CpuRunner:
    """Eager TorchScript on the CPU. Input buffers are numpy arrays shared with torch tensors,
    one pair per bucket, sized for the largest batch: the steady state allocates no input."""

    device = "cpu"

    def __init__(self, model: Any, buckets: tuple[int, ...], max_batch: int) -> None:
        self.model = model
        self.buckets = buckets
        self.max_batch = max_batch
        rows = batch_limits(buckets, max_batch)
        self.ids = [np.zeros((n, b), dtype=np.int64) for n, b in zip(rows, buckets, strict=True)]
        self.mask = [np.zeros_like(a) for a in self.ids]
        self.ids_t = [torch.from_numpy(a) for a in self.ids]
        self.mask_t = [torch.from_numpy(a) for a in self.mask]
        self.allocations = 0  # buffers allocated after start-up (tests assert it stays 0)

    def fill(self, bucket: int, batch: list[Item]) -> int:
        """Copy token ids into the bucket's buffers; returns the real token count."""
        return fill_rows(self.ids[bucket], self.mask[bucket], batch)

    def forward(self, bucket: int, n: int) -> np.ndarray:
        with torch.inference_mode():
            logits = self.model(self.ids_t[bucket][:n], self.mask_t[bucket][:n])
        return softmax(logits.float().numpy())

    def warm(self) -> float:
        """Run every bucket at a few batch sizes: a fresh TorchScript model's first calls are
        several times slower (DESIGN.md), and a worker warms before it says ready."""
        t0 = time.perf_counter()
        sizes = sorted({1, min(2, self.max_batch)})  # the slow first calls are per bucket
        for _ in range(2):
            for b in range(len(self.buckets)):
                for n in sizes:
                    self.ids[b][:n, 0] = 101
                    self.mask[b][:n, :] = 1
                    self.forward(b, n)
        return time.perf_counter() - t0
