"""A sparse model's answers (workers/process/sparse.py) as the front-end reads them
(Result.from_ring, service/request/sparse_terms.py): every row's nonzero terms, ids ascending,
the heaviest kept past the bound; windows pooled as tokens are; pruning by top_k and threshold."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from ringserve.service.engine.requests import Result
from ringserve.service.request.sparse_terms import kserve_tensor, pruned, terms
from ringserve.shm import layout as L
from ringserve.workers.batches import Item
from ringserve.workers.process.longtext import Whole
from ringserve.workers.process.sparse import batch_answers, sparse_limit


def served(limit: int, summed: bool = False) -> SimpleNamespace:
    return SimpleNamespace(sparse_limit=limit, sparse_sum=summed, report_grid=(16, 64),
                           longtext=SimpleNamespace(max_length=64))  # fmt: skip


def read(answer: tuple[int, bytes, int, int]) -> Result:
    return Result.from_ring(answer[2], answer[1], 0)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 6), width=st.integers(1, 40), limit=st.integers(1, 50),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_each_row_answers_its_nonzero_terms(rows: int, width: int, limit: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    weights = np.where(rng.random((rows + 1, width)) < 0.3, rng.random((rows + 1, width)), 0.0)
    weights = weights.astype(np.float32)
    batch = [Item(i, 0, 0, [1, 2, 3], tokens=3) for i in range(rows)]
    answers = batch_answers(served(limit), batch, weights, 0, 5, 0)
    assert [a[0] for a in answers] == list(range(rows))
    for row, answer in zip(weights, answers, strict=False):
        r = read(answer)
        assert r.status == L.STATUS_OK and r.flags & L.RSP_SPARSE and r.tokens == 3
        ids, values = terms(r)
        want = np.flatnonzero(row)
        if len(want) > limit:  # the heaviest `limit`, still ascending
            assert r.limit == limit and len(ids) == limit
            assert values.min() >= np.sort(row[want])[::-1][limit - 1]
        else:
            assert r.limit == 0 and np.array_equal(ids, want)
        assert np.array_equal(np.sort(ids), ids) and np.array_equal(values, row[ids])


def test_windows_pool_as_tokens_do() -> None:
    rows = np.array([[0.0, 1.0, 0.0, 2.0], [0.5, 3.0, 0.0, 0.0]], dtype=np.float32)
    for summed, want in ((False, [0.5, 3.0, 0.0, 2.0]), (True, [0.5, 4.0, 0.0, 2.0])):
        whole = Whole(7, 90, 0, left=2)
        whole.scores = [None, None]
        batch = [Item(7, 0, 0, [1], whole=whole, window=i) for i in range(2)]
        (answer,) = batch_answers(served(10, summed), batch, rows, 0, 5, 0)
        r = read(answer)
        assert r.flags & L.RSP_WINDOWED and r.windows == 2 and r.tokens == 90
        ids, values = terms(r)
        assert ids.tolist() == np.flatnonzero(want).tolist()
        assert np.allclose(values, np.array(want)[ids])


def test_the_bound_is_half_the_ring_and_the_header() -> None:
    assert sparse_limit(1 << 20, 30522) == 30522
    assert sparse_limit(1 << 16, 30522) == ((1 << 15) - L.RESPONSE_SIZE) // 8
    assert sparse_limit(1 << 30, 250002) == 0xFFFF


def test_pruning_keeps_the_heaviest_above_the_threshold() -> None:
    ids = np.array([3, 8, 9, 20, 31], dtype=np.uint32)
    values = np.array([0.2, 0.9, 0.9, 0.1, 0.5], dtype=np.float32)
    assert pruned(ids, values, None, None)[0].tolist() == [3, 8, 9, 20, 31]
    assert pruned(ids, values, 2, None)[0].tolist() == [8, 9]  # ties: the lower id first
    assert pruned(ids, values, None, 0.2)[0].tolist() == [8, 9, 31]  # strictly above
    assert pruned(ids, values, 1, 0.5)[0].tolist() == [8]


def test_kserve_outputs_are_the_terms_one_text_after_another() -> None:
    weights = np.array([[0, 1.5, 0, 2.5], [0, 0, 0, 0], [4.0, 0, 0, 0]], dtype=np.float32)
    batch = [Item(i, 0, 0, [1]) for i in range(3)]
    results = [read(a) for a in batch_answers(served(10), batch, weights, 0, 0, 0)]
    head, lengths = kserve_tensor("sparse_lengths", results, False)
    assert head == {"name": "sparse_lengths", "datatype": "INT32", "shape": [3]}
    assert lengths == [2, 0, 1]
    assert kserve_tensor("sparse_indices", results, False)[1] == [1, 3, 0]
    _, raw = kserve_tensor("sparse_values", results, True)
    assert np.frombuffer(raw, "<f4").tolist() == [1.5, 2.5, 4.0]


def test_auto_precision_reads_a_sparse_models_published_cost() -> None:
    from ringserve.service.models.precision import auto_precision

    cost = {"texts": 512, "rank_overlap_at_10": 0.995, "term_overlap_at_32": 0.98}
    chosen, why = auto_precision(cost | {"speedup": 1.8}, True)
    assert chosen == "int8" and "0.995 of fp32's top 10 documents" in why
    chosen, why = auto_precision(cost | {"rank_overlap_at_10": 0.94}, True)
    assert chosen == "fp32" and "below 0.99" in why
