"""The batcher in a closed loop, simulated: what each way of pooling and placing texts would give.

A served run cannot tell batch shape from the rest (the front-end, the load generator and the
worker's own Python share the same cores), and on a shared machine one run's ratio moves by
0.05. This replays the serving benchmark's closed loop on a clock instead: C clients, each
sending its next text (the mix's own texts, in turn) as soon as its answer comes back, W
workers, and a batch of n texts padded to L tokens taking A + n * L units of time (one unit is
one token's forward cost, A the fixed cost of a batch in tokens: BATCH_OVERHEAD, measured by
benchmarks.batch_cost). Batches are chosen by the real workers/process/batcher.py. Nothing but the
model is costed, so the figures are the batch shape's share of served/ceiling alone.

Rules compared with today's (each worker its own Batcher, a text to the least-held worker):
  one shared pool        every worker takes its next batch from one Batcher of all waiting texts
  front-end runs, H      the front-end keeps the texts and hands a worker the run holding the
                         oldest (the same split, on lengths estimated from bytes, as the front-end
                         knows them; or exact) whenever it holds under H token-units
  partner                a text goes to the worker holding a text of the nearest (estimated)
                         length, unless that worker holds 100 units more than the least held
Printed: throughput over today's, P50 and P99 in units, rows a batch, padded tokens a text,
and the ceiling's own plan (benchmarks/serving.py: sorted windows of C, 2C and 256 texts, the
server's cheapest split) in units a text beside the simulated cost a text.

  python -m benchmarks.batch_sim [--mix short|long] [--c 32] [--workers 2] [--overhead 11]
"""

from __future__ import annotations

import argparse
import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ringserve.service.config.settings import CPU_MAX_BATCH, CPU_MAX_BATCH_TOKENS
from ringserve.workers.batches import BATCH_OVERHEAD, Item
from ringserve.workers.process.batcher import Batcher

from benchmarks.serving import LIMITS, MIXES, plan
from devkit.launcher import load_texts
from devkit.load import percentile

ROW_COST = 8  # a text's fixed share of held cost, as the front-end counts it (engine/requests.py)
TRANSIT = 1.0  # units from an answer to its client's next text reaching a worker
BALANCE = 100  # partner placement: the most a worker may hold above the least held
WARMUP = 2000  # texts answered before latencies count


@dataclass
class Outcome:
    clock: float  # units until N texts were answered
    latencies: list[float]
    shapes: list[tuple[int, int]] = field(default_factory=list)  # (rows, padded length)

    def pct(self, p: float) -> float:
        return percentile(self.latencies, p)

    def rows(self) -> float:
        return sum(r for r, _ in self.shapes) / len(self.shapes)

    def padded(self) -> float:
        return sum(r * n for r, n in self.shapes) / sum(r for r, _ in self.shapes)


class Loop:
    """One simulated run: clients, front-end placement, workers, on an event clock."""

    def __init__(
        self, lengths: list[int], estimates: list[int], c: int, workers: int, overhead: int
    ) -> None:
        self.lengths, self.estimates = lengths, estimates
        self.c, self.w, self.a = c, workers, overhead
        self.batchers = [self.batcher() for _ in range(workers)]
        self.held = [0] * workers  # token-units a worker holds (estimated, as placed)
        self.busy = [False] * workers
        self.events: list[tuple[float, int, int, object]] = []
        self.sent = 0
        self.estimate: dict[int, int] = {}
        self.true: dict[int, int] = {}
        self.out = Outcome(0.0, [])

    def batcher(self) -> Batcher:
        return Batcher(CPU_MAX_BATCH, CPU_MAX_BATCH_TOKENS, 0, (), self.a)

    def send(self, now: float) -> None:
        k = self.sent % len(self.lengths)
        self.sent += 1
        self.true[self.sent] = self.lengths[k]
        self.estimate[self.sent] = self.estimates[k]
        heapq.heappush(self.events, (now + TRANSIT, 0, self.sent, None))

    def give(self, w: int, msg: int, arrived: float, now: float) -> None:
        self.batchers[w].add(Item(msg, 0, arrived, [0] * self.true[msg]))
        self.held[w] += self.estimate[msg] + ROW_COST
        if not self.busy[w]:
            self.start(w, now)

    def start(self, w: int, now: float) -> None:
        batch, length = self.batchers[w].take()
        self.busy[w] = bool(batch)
        if batch:
            self.out.shapes.append((len(batch), length))
            heapq.heappush(self.events, (now + self.a + len(batch) * length, 1, w, batch))

    def arrive(self, msg: int, now: float) -> None:
        w = min(range(self.w), key=self.held.__getitem__)
        self.give(w, msg, now, now)

    def answered(self, w: int, batch: list[Item], now: float) -> None:
        for it in batch:
            self.out.latencies.append(now - it.arrived_ns)
            self.held[w] -= self.estimate[it.msg_id] + ROW_COST
            self.send(now)
        self.start(w, now)

    def run(self, texts: int) -> Outcome:
        for _ in range(self.c):
            self.send(0.0)
        done = 0
        while done < texts:
            now, kind, key, batch = heapq.heappop(self.events)
            if kind == 0:
                self.arrive(key, now)
            else:
                assert isinstance(batch, list)
                done += len(batch)
                self.answered(key, batch, now)
        self.out.clock = now
        self.out.latencies = self.out.latencies[WARMUP:]
        return self.out


class SharedPool(Loop):
    """Every worker takes its next batch from one Batcher holding every waiting text."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        one = self.batcher()
        self.batchers = [one] * self.w

    def arrive(self, msg: int, now: float) -> None:
        self.batchers[0].add(Item(msg, 0, now, [0] * self.true[msg]))
        idle = [k for k in range(self.w) if not self.busy[k]]
        if idle:
            self.start(idle[0], now)


class FrontEndRuns(Loop):
    """The front-end keeps the texts, split on the lengths it knows; a worker under `hold`
    units gets the run holding the oldest."""

    hold = 100
    exact = False

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.front = self.batcher()

    def arrive(self, msg: int, now: float) -> None:
        known = self.true[msg] if self.exact else self.estimate[msg]
        self.front.add(Item(msg, 0, now, [0] * known))
        self.feed(now)

    def answered(self, w: int, batch: list[Item], now: float) -> None:
        super().answered(w, batch, now)
        self.feed(now)

    def feed(self, now: float) -> None:
        while self.front.size:
            w = min(range(self.w), key=self.held.__getitem__)
            if self.held[w] >= self.hold:
                return
            run, _ = self.front.take()
            for it in run:
                self.give(w, it.msg_id, it.arrived_ns, now)


class Partner(Loop):
    """A text goes where a text of the nearest estimated length waits, within BALANCE."""

    def arrive(self, msg: int, now: float) -> None:
        mine = self.estimate[msg]

        def gap(k: int) -> int:
            held = [self.estimate[e[2].msg_id] for e in self.batchers[k].by_length]
            return min((abs(x - mine) for x in held), default=1 << 30)

        least = min(range(self.w), key=self.held.__getitem__)
        w = min(range(self.w), key=lambda k: (gap(k), self.held[k]))
        if self.held[w] - self.held[least] > BALANCE:
            w = least
        self.give(w, msg, now, now)


def window_cost(lengths: list[int], window: int, overhead: int) -> float:
    """Units a text in the ceiling's own least-cost plan (benchmarks/serving.py plan) at
    `window`, under the cheapest of its batch limits."""
    texts = [[0] * n for n in lengths]
    costs = []
    for rows, tokens in LIMITS:
        batches = plan(texts, window, rows, tokens, overhead)
        costs.append(sum(overhead + len(b) * max(map(len, b)) for b in batches) / len(lengths))
    return min(costs)


def variant(base: type[Loop], **fields: object) -> type[Loop]:
    return type(base.__name__, (base,), fields)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mix", choices=sorted(MIXES), default="short")
    p.add_argument("--texts", type=int, default=300, help="distinct texts, sent in turn")
    p.add_argument("--c", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--overhead", type=int, default=BATCH_OVERHEAD["onnx", "fp32"])
    p.add_argument("--answered", type=int, default=20000, help="texts a run answers")
    args = p.parse_args(argv)
    from ringserve.factory.build import default_artifact_dir
    from ringserve.workers.artifact import load_manifest, load_tokenizer

    model_dir = str(default_artifact_dir())
    tok = load_tokenizer(model_dir, load_manifest(model_dir).max_length)
    texts = load_texts(MIXES[args.mix], args.texts)
    lengths = [len(e.ids) for e in tok.encode_batch(texts)]
    estimates = [len(t.encode()) // 4 for t in texts]  # the front-end's BYTES_PER_TOKEN
    mean = sum(lengths) / len(lengths)
    print(f"{args.mix}: {len(texts)} texts, {mean:.1f} tokens on average; c={args.c}, "
          f"{args.workers} workers, a batch's fixed cost {args.overhead} tokens")  # fmt: skip
    rules: list[tuple[str, Callable[..., Loop]]] = [
        ("today: a Batcher a worker", Loop),
        ("one shared pool", SharedPool),
    ]
    for exact in (False, True):
        for hold in (100, 300):
            name = f"front-end runs, hold {hold}{', exact' if exact else ''}"
            rules.append((name, variant(FrontEndRuns, hold=hold, exact=exact)))
    rules.append((f"partner, within {BALANCE}", Partner))
    base: Outcome | None = None
    ceiling = window_cost(lengths, args.c, args.overhead)
    print("| rule | throughput / today's | P50 units | P99 units | rows a batch | padded tokens "
          "a text | units a text | ceiling (window c) / it |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, rule in rules:
        out = rule(lengths, estimates, args.c, args.workers, args.overhead).run(args.answered)
        base = base or out
        per_text = out.clock * args.workers / args.answered
        print(f"| {name} | {base.clock / out.clock:.3f} | {out.pct(50):.0f} | {out.pct(99):.0f} "
              f"| {out.rows():.2f} | {out.padded():.2f} | {per_text:.2f} "
              f"| {ceiling / per_text:.3f} |")  # fmt: skip
    for window in (args.c, 2 * args.c, 256):
        cost = window_cost(lengths, window, args.overhead)
        print(f"the ceiling's plan at window {window}: {cost:.2f} units a text")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
