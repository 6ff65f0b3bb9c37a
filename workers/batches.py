"""What a batch is made of and what one costs, shared by the batcher that makes batches
(workers/process/batcher.py) and the runtimes that run them (workers/runtimes/): one text as
the worker holds it (`Item`), the rows a batch may hold under a token budget (`row_limit`), and
each runtime's fixed cost of a batch in tokens of work (`BATCH_OVERHEAD`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# A batch's fixed cost in tokens of work, per CPU runtime and precision. A batch of n texts
# padded to L tokens takes about a + b * n * L on one thread (per-call set-up, the classifier,
# Python, then each token); the batcher splits what waits at the least total cost in tokens, so
# it needs a / b. `python -m benchmarks.batch_cost` on MiniLM, one pinned thread, 2-vCPU EPYC,
# 2026-11-30 (fit within 3-6% over batches up to 512 tokens): TorchScript a 2.65 ms, b 207 us,
# 12.8 tokens; ONNX Runtime fp32 1.11 ms, 99 us, 11.2; ONNX Runtime int8 0.17 ms, 48 us, 3.6.
# OpenVINO bf16 (2026-12-06, the Xeon with AMX, `--runtimes onnx:fp32,openvino:bf16`, load
# average 2.7 from other agents, so worst fit errors 34-64%): 1.17 ms, 45.3 us, 25.8 tokens
# (ONNX Runtime fp32 in the same run: 2.45 ms, 147 us, 16.7).
BATCH_OVERHEAD = {
    ("torch", "fp32"): 13,
    ("onnx", "fp32"): 11,
    ("onnx", "int8"): 4,
    ("onnx", "int8-checked"): 4,  # int8's; a close call's fp32 pass is the rows it re-runs
    ("openvino", "bf16"): 26,
}
BATCH_OVERHEAD_TOKENS = 32  # for a runner that has not measured its own (CUDA)


@dataclass(slots=True)
class Item:
    msg_id: int
    deadline_ns: int  # CLOCK_MONOTONIC; 0 = none
    arrived_ns: int
    ids: list[int]
    seq: int = 0  # arrival order, set by Batcher.add: items read in one pass share arrived_ns
    taken: bool = False  # left the batcher (run or expired); the arrival queue drops it lazily
    types: list[int] | None = None  # token types of a pair, on models that take them
    tokens: int = 0  # the text's own token count, before any cut (workers/process/longtext.py)
    flags: int = 0  # shm.layout.RSP_TRUNCATED when the text was cut
    whole: Any = (
        None  # a window's workers.process.longtext.Whole; None for a text scored as one row
    )
    window: int = 0  # a window's index among its text's windows
    embed: bool = False  # answer the embedding (shm.layout.OPT_EMBED), not the scores
    both: bool = False  # answer the scores, then the embedding (shm.layout.OPT_BOTH)
    token_vectors: bool = False  # answer the token states (shm.layout.OPT_TOKENS)
    bulk: bool = False  # a bulk text (shm.layout.OPT_BULK): interactive texts go first
    rows: list[int] | None = None  # token rows its token vectors keep (None: all its tokens)


def row_limit(length: int, max_batch: int, max_tokens: int) -> int:
    """Rows a batch padded to `length` may hold: at most `max_batch`, at most `max_tokens`
    padded tokens, never below one (a text longer than the budget still runs, alone)."""
    return max(1, min(max_batch, max_tokens // max(1, length)))
