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
        c.last_inference_ms = time.time_ns() // 1_000_000
        # one pass over the answers (this runs for every request): their count, whether any
        # failed, and the longest queue and forward pass and the last read off the ring
        n = queued_us = model_us = last_read = 0
        failed = False
        for r in group.results:
            if r is None:
                continue
            n += 1
            failed = failed or bool(r.status)
            queued_us = max(queued_us, r.queued_us)
            model_us = max(model_us, r.model_us)
            last_read = max(last_read, r.read_ns)
        if not n or failed:
            c.add("fail", total)
            return
        c.add("success", total)
        c.inference_count += n
        queue, infer = queued_us * 1000, model_us * 1000
        output = answered_ns - last_read if last_read else 0
        c.add("queue", queue)
        c.add("compute_infer", infer)
        c.add("compute_output", output)
        c.add("compute_input", total - queue - infer - output)
        for r in group.results:
            if r is not None and r.batch:
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
