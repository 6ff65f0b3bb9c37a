"""Decides which waiting texts run together: texts of similar length under a token budget,
padded only to the batch's own longest (or up to an opt-in grid), the oldest text always first.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence

from ringserve.workers.batches import BATCH_OVERHEAD_TOKENS, Item, row_limit

# The sequence lengths a CUDA graph is captured for when --buckets is not given (CONTRACT.md).
CUDA_BUCKETS = (16, 32, 48, 64, 96, 128, 192, 256)
# Past 256 tokens (a model of longer max_length: BERT's 512, ModernBERT's 8,192) the default
# grid goes on in the same steps, x1.5 then x4/3, so a long text is padded by under half its
# length and a 300-token text is never padded to a model's whole 8,192.
LONG_STEPS = tuple(n for p in (256, 512, 1024, 2048, 4096) for n in (p * 3 // 2, p * 2))
# Priority: while an interactive text arrived in the last second, a batch of bulk texts takes a
# sixteenth of the token budget (32 of 512 tokens: one or two short texts), so an interactive
# text that comes while bulk work runs waits behind about one text's forward pass; and a batch
# holds texts of one class, so an interactive text's own batch is never filled with bulk texts
# and runs as on an idle server. benchmarks/tenants.py priority, 2 shared CPUs, one session:
# interactive P99 3.84x idle with quarter batches filled with bulk, 2.29x with bulk an eighth,
# 1.80x a sixteenth, with as many bulk requests answered. With no interactive traffic in the
# last second bulk batches are whole, so a bulk-only server loses nothing.
BULK_SHARE_WHILE_INTERACTIVE = 16
INTERACTIVE_RECENT_NS = 1_000_000_000
# Recent work (Batcher.work): texts arrived, each counted down by half every this long.
WORK_HALF_LIFE_NS = 1_000_000_000


def bucket_index(buckets: tuple[int, ...], length: int) -> int:
    """The smallest bucket that holds `length` tokens (lengths are already truncated)."""
    i = bisect.bisect_left(buckets, length)
    return min(i, len(buckets) - 1)


def length_grid(buckets: tuple[int, ...], max_len: int) -> tuple[int, ...]:
    """A grid of lengths cut at the model's max length, which always ends it."""
    return (*tuple(b for b in buckets if b < max_len), max_len)


def default_grid(max_len: int) -> tuple[int, ...]:
    """The CUDA grid, and past 256 tokens LONG_STEPS, cut at the model's max length: the GPU's
    default padding grid, and the length classes latency is reported in without a grid."""
    return length_grid(CUDA_BUCKETS + LONG_STEPS, max_len)


# OpenVINO's default grid on the CPU: it builds kernels for each new input shape and keeps them,
# so batches padded each to its own longest (a new shape for most batches) ran slower and grew
# its memory. benchmarks.serving bf16 at c=32 (AMX Xeon, 2026-12-06, 3 s draws, one run each,
# in turns): no grid 1267 short / 561 long texts/s, served/ceiling 0.69 / 0.74, tree PSS 474 ->
# 966 MiB after the load; this grid 1410 / 718, 0.78 / 0.93, 472 -> 574 MiB.
OPENVINO_BUCKETS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def pad_grid(
    buckets: tuple[int, ...], on_gpu: bool, max_len: int, runtime: str = ""
) -> tuple[int, ...]:
    """The lengths batches are padded up to: --buckets when given; else the CUDA grid (on past
    256 tokens for a longer model) on a GPU (graphs need fixed shapes), OPENVINO_BUCKETS (on in
    the same steps past 256) on OpenVINO, and none on the CPU otherwise (each batch padded to
    its own longest)."""
    if buckets:
        return length_grid(buckets, max_len)
    if runtime == "openvino" and not on_gpu:
        return length_grid(OPENVINO_BUCKETS + LONG_STEPS, max_len)
    return default_grid(max_len) if on_gpu else ()


def batch_limits(buckets: tuple[int, ...], max_batch: int) -> list[int]:
    """Rows per batch for each bucket of a CUDA grid: `max_batch` for the shortest, then a
    constant token budget, so a long bucket's batch costs about as long as a short one's and
    heartbeats stay fresh (measured here: 32 x 256 tokens took 3.4 s on one core)."""
    return [row_limit(b, max_batch, max_batch * buckets[0]) for b in buckets]


def cheapest_split(
    lengths: Sequence[int], max_batch: int, max_tokens: int, overhead: int
) -> list[int]:
    """Split texts sorted by (padded) length into runs, each run one batch padded to its last,
    at the least total cost: a batch costs its padded tokens plus `overhead`, its fixed cost in
    tokens of work, and holds at most row_limit() rows. Returns `cut`: the cheapest split of
    the first j texts ends with the run lengths[cut[j]:j]; runs() lists the whole split.
    Dynamic programming, O(len(lengths) x rows a batch)."""
    cost = [0] * (len(lengths) + 1)
    cut = [0] * (len(lengths) + 1)
    for j, length in enumerate(lengths, 1):
        rows = row_limit(length, max_batch, max_tokens)
        best_i = j - 1
        best = cost[best_i] + overhead + length
        for i in range(max(0, j - rows), j - 1):
            c = cost[i] + overhead + (j - i) * length
            if c < best:
                best, best_i = c, i
        cost[j], cut[j] = best, best_i
    return cut


def runs(cut: list[int]) -> list[tuple[int, int]]:
    """The runs [start, end) of a split from cheapest_split(), shortest texts first."""
    out = []
    j = len(cut) - 1
    while j > 0:
        out.append((cut[j], j))
        j = cut[j]
    return out[::-1]


class Batcher:
    """Waiting items kept twice: in arrival order (who is oldest) and sorted by length (who fits
    with it), each per class (interactive, bulk). The next batch is the run of similar lengths
    around the oldest item that the cheapest split of what waits of its class would run it in,
    under `max_batch` rows and `max_tokens` padded tokens."""

    def __init__(
        self,
        max_batch: int,
        max_tokens: int,
        max_delay_ns: int,
        grid: tuple[int, ...] = (),
        overhead_tokens: int = BATCH_OVERHEAD_TOKENS,
    ) -> None:
        self.max_batch = max(1, max_batch)
        self.max_tokens = max_tokens
        self.planned_tokens = max_tokens  # the budget of the last plan (budget())
        self.max_delay_ns = max_delay_ns
        self.grid = grid  # empty: pad to the batch's own longest
        self.overhead = overhead_tokens
        self.fifo: deque[Item] = deque()  # interactive texts, oldest first
        self.fifo_bulk: deque[Item] = deque()  # bulk texts, oldest first
        self.bulk_wait_ns = 2_000_000_000  # --bulk-max-wait-ms: then a bulk text goes first
        self.last_interactive_ns = 0  # arrival of the newest interactive text
        self.newest_ns = 0  # arrival of the newest text
        self.by_length: list[tuple[int, int, Item]] = []  # interactive (length, seq, item), sorted
        self.by_length_bulk: list[tuple[int, int, Item]] = []  # bulk texts, the same way
        self.size = 0
        self.seq = 0
        self.next_expiry = 0  # earliest deadline queued (a lower bound; 0 = none)
        self.cap_tokens = 0  # a budget set from outside (workers.process.served.Turns); 0: none
        self.recent = 0.0  # texts arrived, decayed (work()), as of recent_ns
        self.recent_ns = 0

    def work(self, now_ns: int) -> float:
        """How much arrived lately: each text counts 1, halved every WORK_HALF_LIFE_NS."""
        age = now_ns - self.recent_ns
        if age <= 0 or not self.recent:
            return self.recent
        return self.recent * 0.5 ** (age / WORK_HALF_LIFE_NS)

    def padded(self, length: int) -> int:
        return self.grid[bucket_index(self.grid, length)] if self.grid else length

    def add(self, item: Item) -> None:
        item.seq = self.seq
        self.seq += 1
        self.newest_ns = max(self.newest_ns, item.arrived_ns)
        self.recent = self.work(self.newest_ns) + 1
        self.recent_ns = self.newest_ns
        if item.bulk:
            self.fifo_bulk.append(item)
        else:
            self.fifo.append(item)
            self.last_interactive_ns = self.newest_ns
        bisect.insort(self.lengths(item), (len(item.ids), item.seq, item))
        self.size += 1
        if item.deadline_ns and (not self.next_expiry or item.deadline_ns < self.next_expiry):
            self.next_expiry = item.deadline_ns

    def lengths(self, item: Item) -> list[tuple[int, int, Item]]:
        """The sorted list `item`'s class waits in: a batch holds texts of one class."""
        return self.by_length_bulk if item.bulk else self.by_length

    def oldest(self) -> Item | None:
        """The text the next batch is built around: the oldest interactive one, unless the
        oldest bulk one has waited --bulk-max-wait-ms (or no interactive text waits)."""
        fifo, bulk = self.fifo, self.fifo_bulk
        while fifo and fifo[0].taken:
            fifo.popleft()
        while bulk and bulk[0].taken:
            bulk.popleft()
        if bulk and (not fifo or self.newest_ns - bulk[0].arrived_ns >= self.bulk_wait_ns):
            return bulk[0]
        return fifo[0] if fifo else None

    def budget(self, first: Item) -> int:
        """Padded tokens for the next batch (see BULK_SHARE_WHILE_INTERACTIVE): a sixteenth
        for a batch of bulk texts while interactive ones came in the last second; never more than
        `cap_tokens` when that is set (another model of the worker is owed short batches,
        workers.process.served.Turns)."""
        budget = self.max_tokens
        recent = self.newest_ns - self.last_interactive_ns < INTERACTIVE_RECENT_NS
        if first.bulk and self.last_interactive_ns and recent:
            budget = max(1, self.max_tokens // BULK_SHARE_WHILE_INTERACTIVE)
        return min(budget, self.cap_tokens) if self.cap_tokens else budget

    def plan(self) -> tuple[list[tuple[int, int, Item]], int, int, int] | None:
        """(the list, first, last, padded length) of the next batch, or None when empty: the
        run holding the oldest in the cheapest split of the texts of its class near it in
        length."""
        first = self.oldest()
        if first is None:
            return None
        order = self.lengths(first)
        p = bisect.bisect_left(order, (len(first.ids), first.seq))
        lo = max(0, p - self.max_batch)
        hi = min(len(order), p + self.max_batch)
        lengths = [self.padded(entry[0]) for entry in order[lo:hi]]
        self.planned_tokens = self.budget(first)
        cut = cheapest_split(lengths, self.max_batch, self.planned_tokens, self.overhead)
        j = len(lengths)
        while cut[j] > p - lo:
            j = cut[j]
        return order, lo + cut[j], lo + j - 1, lengths[j - 1]

    def full(self, plan: tuple[list[tuple[int, int, Item]], int, int, int]) -> bool:
        _, first, last, length = plan
        return last - first + 1 >= row_limit(length, self.max_batch, self.planned_tokens)

    def wait_ns(self, now_ns: int) -> int:
        """0 when a batch should run now, -1 when nothing waits, else how long to wait for
        more texts: until the oldest has waited `max_delay_ns`, or at once when full."""
        first = self.oldest()
        if first is None:
            return -1
        left = first.arrived_ns + self.max_delay_ns - now_ns
        if left <= 0 or not self.max_delay_ns:
            return 0
        plan = self.plan()
        return 0 if plan is not None and self.full(plan) else left

    def take(self) -> tuple[list[Item], int]:
        """The next batch (in length order) and the length it is padded to; ([], 0) if empty."""
        plan = self.plan()
        if plan is None:
            return [], 0
        order, first, last, length = plan
        batch = [entry[2] for entry in order[first : last + 1]]
        del order[first : last + 1]
        for item in batch:
            item.taken = True
        self.size -= len(batch)
        return batch, length

    def expire(self, now_ns: int) -> list[Item]:
        """Remove and return every item whose deadline has passed (they must not run)."""
        if not self.next_expiry or self.next_expiry > now_ns:
            return []
        late: list[Item] = []
        for order in (self.by_length, self.by_length_bulk):
            keep = []
            for entry in order:
                deadline = entry[2].deadline_ns
                if deadline and deadline <= now_ns:
                    late.append(entry[2])
                else:
                    keep.append(entry)
            order[:] = keep
        for item in late:
            item.taken = True
        self.size -= len(late)
        waiting = (*self.by_length, *self.by_length_bulk)
        self.next_expiry = min((e[2].deadline_ns for e in waiting if e[2].deadline_ns), default=0)
        return late

    def drain_all(self) -> list[Item]:
        items = [entry[2] for entry in (*self.by_length, *self.by_length_bulk)]
        for item in items:
            item.taken = True
        self.by_length.clear()
        self.by_length_bulk.clear()
        self.fifo.clear()
        self.fifo_bulk.clear()
        self.size = 0
        self.next_expiry = 0
        return items
