"""The ceiling's batch plans (benchmarks/serving.py): every text runs once, within its window,
in batches that respect the limit; the least-cost cut with no per-batch cost pads nothing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from ringserve.workers.batcher import row_limit

from benchmarks.serving import RUNTIMES, options, plan


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 200), min_size=1, max_size=60),
    window=st.integers(1, 64),
    max_batch=st.integers(1, 64),
    max_tokens=st.sampled_from([64, 256, 512]),
    overhead=st.sampled_from([None, 0, 4, 11, 32]),
)
def test_a_plan_runs_every_text_once_within_its_window_and_the_limit(
    lengths: list[int], window: int, max_batch: int, max_tokens: int, overhead: int | None
) -> None:
    texts = [[n] * length for n, length in enumerate(lengths)]  # each text knows its index
    batches = plan(texts, window, max_batch, max_tokens, overhead)
    assert sorted(t[0] for b in batches for t in b) == list(range(len(texts)))
    for b in batches:
        longest = max(map(len, b))
        assert len(b) <= row_limit(longest, max_batch, max_tokens)
        assert len({t[0] // window for t in b}) == 1  # never across windows
    if overhead == 0:  # padding is all a batch costs: equal lengths only
        assert all(len(set(map(len, b))) == 1 for b in batches)


def test_the_greedy_cut_fills_each_batch_to_the_limit() -> None:
    texts = [[1] * n for n in [3, 5, 9, 9, 10, 20, 21, 40]]
    greedy = plan(texts, 8, 3, 60)
    assert [[len(t) for t in b] for b in greedy] == [[3, 5, 9], [9, 10, 20], [21], [40]]
    cheapest = plan(texts, 8, 3, 60, overhead=5)
    assert [[len(t) for t in b] for b in cheapest] == [[3, 5], [9, 9, 10], [20, 21], [40]]


def test_a_baseline_run_serves_the_defaults_alone_at_the_levels_asked() -> None:
    args, configs = options(["--levels", "32,64", "--baseline", "/elsewhere", "--rounds", "2"])
    assert args.levels == [32, 64] and args.rounds == 2
    assert configs == [RUNTIMES[0]] and args.peers == []  # each against its own ceilings
    args, configs = options(["--configs", "int8", "--mixes", "short"])
    assert args.levels == [1, 32, 64] and args.baseline is None and args.mixes == ["short"]
    assert configs == [RUNTIMES[0], RUNTIMES[3]]  # the peers are measured against the defaults
