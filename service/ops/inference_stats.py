"""Triton's per-model inference statistics (KServe `/v2/models/.../stats`, gRPC
ModelStatistics), counted once per request when the dispatcher has answered all its texts.

A request here is one dispatcher group, whatever protocol sent it. Its times come from what is
already measured: the request's whole time in the server is admission to its answer written;
`queue` the longest wait of its texts in a worker (ring, tokenizing and batching), `compute_infer`
the longest forward pass its texts ran in, `compute_output` the front-end's time from reading the
last answer off the ring to writing the reply, and `compute_input` the rest (the hand-off through
the request ring). A batch is counted once (execution_count) however many requests shared it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ringserve.service.ops.stats import ModelStats

if TYPE_CHECKING:
    from ringserve.service.engine.requests import Group

PHASES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


@dataclass(slots=True)
class Counters:
    """One model's totals: each phase as [count, ns], as Triton's StatisticDuration."""

    phases: dict[str, list[int]] = field(default_factory=lambda: {p: [0, 0] for p in PHASES})
    inference_count: int = 0  # texts answered
    last_inference_ms: int = 0  # wall clock, ms since the epoch
    batches: ModelStats = field(default_factory=lambda: ModelStats(1))  # seen batches, once

    def add(self, phase: str, ns: int) -> None:
        row = self.phases[phase]
        row[0] += 1
        row[1] += max(0, ns)

    @property
    def execution_count(self) -> int:
        return sum(self.batches.batch_hist)


class InferenceStats:
    """Every model's counters, by its wire index (ModelInfo.index); on the loop's thread."""

    def __init__(self) -> None:
        self.models: dict[int, Counters] = {}

    def record(self, group: Group, answered_ns: int) -> None:
        """A group whose reply was just written (the dispatcher's on_group hook)."""
        c = self.models.get(group.model)
        if c is None:
            c = self.models[group.model] = Counters()
        total = answered_ns - group.admitted_ns
        results = [r for r in group.results if r is not None]
        c.last_inference_ms = time.time_ns() // 1_000_000
        if not results or any(r.status for r in results):
            c.add("fail", total)
            return
        c.add("success", total)
        c.inference_count += len(results)
        queue = max(r.queued_us for r in results) * 1000
        infer = max(r.model_us for r in results) * 1000
        last_read = max(r.read_ns for r in results)
        output = answered_ns - last_read if last_read else 0
        c.add("queue", queue)
        c.add("compute_infer", infer)
        c.add("compute_output", output)
        c.add("compute_input", total - queue - infer - output)
        for r in results:
            if r.batch:
                c.batches.batch(r)

    def doc(self, name: str, version: str, index: int) -> dict[str, Any]:
        """One model's entry of Triton's `model_stats` list."""
        c = self.models.get(index) or Counters()
        return {
            "name": name,
            "version": version,
            "last_inference": c.last_inference_ms,
            "inference_count": c.inference_count,
            "execution_count": c.execution_count,
            "inference_stats": {p: {"count": n, "ns": ns} for p, (n, ns) in c.phases.items()},
            "batch_stats": [],
        }
