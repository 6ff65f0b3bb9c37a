"""KServe's infer to a multivector (ColBERT) model: each `text` (a query) against its
`text_pair` (a document), answered as one score a pair, its MaxSim (request/maxsim.py)."""

from __future__ import annotations

import numpy as np
from ringserve.service.engine.requests import Ask, Result
from ringserve.service.models.info import ModelInfo
from ringserve.service.request.errors import RequestError
from ringserve.service.request.maxsim import matrix, maxsim
from ringserve.shm import layout as L

# The label of a KServe answer's one score column (its `scores` [N, 1]: MaxSim).
KSERVE_LABELS = ["maxsim"]


def kserve_ask(
    payloads: list[bytes],
    opts: int,
    info: ModelInfo,
    deadline: int,
    priority: int | None,
    protocol: str,
) -> Ask:
    """KServe's rerank: each `text` (a query) with its `text_pair` (a document), as
    kserve/reading.py join_pairs joined them; each pair's query then its document, in order."""
    split = [p.split(L.PAIR_SEPARATOR, 1) for p in payloads]
    if any(len(parts) != 2 for parts in split):
        raise RequestError(
            400,
            f"model {info.name} scores a query (text) against a document (text_pair) by "
            "MaxSim: give input text_pair",
        )
    texts = [part for parts in split for part in parts]
    opts |= L.OPT_TOKENS
    options = [opts | L.OPT_QUERY, opts] * len(split)
    return Ask(texts, options, "rerank", info.index, deadline, priority, protocol)


def kserve_results(results: list[Result]) -> list[Result]:
    """A kserve_ask group's answers as one result a pair: its MaxSim as the one score, the
    document's token count, and both texts' long-text flags."""
    out = []
    for q, d in zip(results[::2], results[1::2], strict=True):
        score = maxsim(matrix(q), [matrix(d)]).astype(np.float32)
        out.append(Result(L.STATUS_OK, 0, score, flags=(q.flags | d.flags) & ~L.RSP_TOKENS,
                          tokens=d.tokens))  # fmt: skip
    return out
