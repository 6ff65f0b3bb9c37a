"""A ColBERT model's rows as the worker makes them (workers/process/multivector.py), written into
a batch (fill_rows), and MaxSim as the front-end computes it (service/protocols/multivector.py):
in process, with the default model's tokenizer file; the model's own answers are compared with
PyLate's in tests/model/test_colbert.py."""

from __future__ import annotations

import numpy as np
from ringserve.factory.build import default_encoder_dir
from ringserve.service.engine.requests import Result
from ringserve.service.kserve.multivector import kserve_results
from ringserve.service.protocols import multivector as mv
from ringserve.service.request.maxsim import maxsim
from ringserve.shm import layout as L
from ringserve.workers.artifact import open_tokenizer
from ringserve.workers.batches import Item
from ringserve.workers.process.multivector import MultiVectorText
from ringserve.workers.runtimes.cpu import fill_rows

CLS, SEP, MASK, Q, D = 101, 102, 103, 1, 2
COMMA, PERIOD = 1010, 1012
SETTINGS = {
    "query_length": 8,
    "document_length": 10,
    "query_prefix_id": Q,
    "document_prefix_id": D,
    "do_query_expansion": True,
    "attend_to_expansion_tokens": False,
    "expansion_id": MASK,
    "skiplist_ids": [COMMA, PERIOD],
}


def planner(**changes: object) -> MultiVectorText:
    tokenizer = open_tokenizer(default_encoder_dir() / "tokenizer.json", 64)
    return MultiVectorText(tokenizer, 64, SETTINGS | changes)


def test_a_query_gets_its_prefix_and_unattended_mask_expansion() -> None:
    (plan,) = planner().plan(["  a film  "], [L.OPT_QUERY])  # stripped, as PyLate does
    (row,) = plan.pieces
    assert row.ids == [CLS, Q, 1037, 2143, SEP, MASK, MASK, MASK]
    assert row.types == [0] * 5 + [-1] * 3 and row.rows is None  # every row answered
    assert plan.tokens == 5 and plan.flags == 0
    ids = np.zeros((1, 8), dtype=np.int64)
    mask = np.zeros_like(ids)
    fill_rows(ids, mask, [Item(1, 0, 0, row.ids, types=row.types)])
    assert mask.tolist() == [[1, 1, 1, 1, 1, 0, 0, 0]]  # the expansion: attended by none


def test_a_query_that_attends_its_expansion_or_has_none() -> None:
    (attended,) = planner(attend_to_expansion_tokens=True).plan(["a film"], [L.OPT_QUERY])
    assert attended.pieces[0].types is None and len(attended.pieces[0].ids) == 8
    (plain,) = planner(do_query_expansion=False).plan(["a film"], [L.OPT_QUERY])
    assert plain.pieces[0].ids == [CLS, Q, 1037, 2143, SEP]


def test_a_long_query_is_cut_before_its_prefix_goes_in() -> None:
    text = "one two three four five six seven eight nine"
    (plan,) = planner().plan([text], [L.OPT_QUERY])
    (row,) = plan.pieces
    assert len(row.ids) == 8 and row.ids[:2] == [CLS, Q] and row.ids[-1] == SEP
    assert MASK not in row.ids and plan.flags == L.RSP_TRUNCATED and plan.tokens == 12


def test_a_document_leaves_out_its_skiplist_tokens() -> None:
    (plan,) = planner().plan(["a film, shown."], [0])
    (row,) = plan.pieces
    assert row.ids[:2] == [CLS, D] and row.types is None
    kept = [row.ids[i] for i in row.rows or []]
    assert COMMA in row.ids and PERIOD in row.ids
    assert COMMA not in kept and PERIOD not in kept and kept[0] == CLS and kept[-1] == SEP


def test_a_long_document_is_cut_or_refused() -> None:
    text = "one two three four five six seven eight nine ten eleven"
    cut, refused = planner().plan([text, text], [0, L.OPT_REFUSE])
    assert len(cut.pieces[0].ids) == 10 and cut.flags == L.RSP_TRUNCATED
    assert refused.pieces == [] and refused.refusal == (0, 10)


def test_no_prefix_means_none_inserted() -> None:
    (plan,) = planner(document_prefix_id=None).plan(["a film"], [0])
    assert plan.pieces[0].ids == [CLS, 1037, 2143, SEP]


def test_maxsim_sums_each_query_tokens_best_match() -> None:
    rng = np.random.default_rng(0)
    query = rng.standard_normal((5, 4)).astype(np.float32)
    docs = [rng.standard_normal((k, 4)).astype(np.float32) for k in (3, 1, 7)]
    want = [float((query @ d.T).max(axis=1).sum()) for d in docs]
    assert np.allclose(maxsim(query, docs), want, atol=1e-5)
    assert maxsim(query, [np.zeros((0, 4), np.float32), docs[0]])[0] == 0.0


def answer(vectors: np.ndarray, flags: int = 0) -> Result:
    flat = np.ascontiguousarray(vectors, dtype=np.float32).ravel()
    return Result(L.STATUS_OK, scores=flat, flags=flags | L.RSP_TOKENS, windows=len(vectors))


def test_kserve_pairs_become_one_score_each() -> None:
    q = np.eye(3, dtype=np.float32)
    d1, d2 = np.eye(3, dtype=np.float32)[:2], -np.eye(3, dtype=np.float32)
    pairs = kserve_results([answer(q), answer(d1, L.RSP_TRUNCATED), answer(q), answer(d2)])
    assert [float(p.scores[0]) for p in pairs] == [2.0, 0.0]
    assert pairs[0].flags == L.RSP_TRUNCATED and not pairs[1].flags
    assert mv.rerank_scores([answer(q), answer(d1), answer(d2)]).tolist() == [2.0, 0.0]
