"""A sparse (SPLADE) model's answers: the graph gives each text's pooled weights over the
vocabulary [n, V]; only their nonzero terms go through the response ring (shm/layout.py
RSP_SPARSE: k term ids as u32, then their k weights as f32, in the order of the ids), at most
`Served.sparse_limit` terms an answer, the heaviest kept when a text has more (`limit` in the
header then says the bound). A text in windows is pooled over its windows as over its tokens:
the max (or the sum) of its windows' rows."""

from __future__ import annotations

from typing import Any

import numpy as np
from ringserve.shm import layout as L
from ringserve.workers.batches import Item
from ringserve.workers.process.batcher import bucket_index

Answer = tuple[int, bytes, int, int]  # workers/process/answers.py's ring message


def sparse_limit(max_payload: int, vocabulary: int) -> int:
    """The most terms one answer carries: what half the response ring holds (room to wrap),
    and never more than the header's count can say."""
    room = (max_payload // 2 - L.RESPONSE_SIZE) // 8
    return max(1, min(vocabulary, room, 0xFFFF))


def pack_terms(
    msg_id: int,
    ids: np.ndarray,
    weights: np.ndarray,
    limit: int,
    head: dict[str, int],
    aux: int,
) -> Answer:
    """One text's answer from its nonzero term ids (ascending) and weights; `head`: the rest of
    the response header (bucket, queued_us, model_us, flags, windows, tokens)."""
    cut = len(ids) > limit
    if cut:  # the heaviest `limit` terms, still in the order of their ids
        keep = np.sort(np.argpartition(-weights, limit - 1)[:limit])
        ids, weights = ids[keep], weights[keep]
    header = L.pack_response(
        L.STATUS_OK, head["bucket"], 0, len(ids), head["queued_us"], head["model_us"],
        head["flags"] | L.RSP_SPARSE, head["windows"], head["tokens"], limit if cut else 0,
    )  # fmt: skip
    body = np.ascontiguousarray(ids, dtype="<u4").tobytes()
    return (msg_id, header + body + np.ascontiguousarray(weights, dtype="<f4").tobytes(), aux, 0)


def batch_answers(
    served: Any, batch: list[Item], rows: np.ndarray, t0: int, model_us: int, aux: int
) -> list[Answer]:
    """A batch's answers: every row's nonzero terms found in one pass over the batch."""
    n = len(batch)
    which, ids = np.nonzero(rows[:n])  # row-major: by row, then by term id
    weights = rows[which, ids]
    starts = np.searchsorted(which, np.arange(n + 1))
    out = []
    for row, it in enumerate(batch):
        a, b = starts[row], starts[row + 1]
        if it.whole is not None:
            answer = window_done(served, it, rows[row], t0, model_us, aux)
            if answer is not None:
                out.append(answer)
            continue
        head = {
            "bucket": bucket_index(served.report_grid, len(it.ids)),
            "queued_us": (t0 - it.arrived_ns) // 1000,
            "model_us": model_us,
            "flags": it.flags,
            "windows": 0,
            "tokens": it.tokens,
        }
        out.append(pack_terms(it.msg_id, ids[a:b], weights[a:b], served.sparse_limit, head, aux))
    return out


def window_done(
    served: Any, it: Item, row: np.ndarray, t0: int, model_us: int, aux: int
) -> Answer | None:
    """Keep one window's row (a copy); the text's answer once its last window is in."""
    whole = it.whole
    if whole.done:
        return None
    whole.scores[it.window] = np.array(row, dtype=np.float32)
    whole.left -= 1
    whole.model_us += model_us
    if whole.left:
        return None
    whole.done = True
    stacked = np.stack(whole.scores)
    pooled = stacked.sum(axis=0) if served.sparse_sum else stacked.max(axis=0)
    ids = np.flatnonzero(pooled)
    head = {
        "bucket": bucket_index(served.report_grid, served.longtext.max_length),
        "queued_us": max(0, (t0 - whole.arrived_ns) // 1000 - whole.model_us + model_us),
        "model_us": whole.model_us,
        "flags": L.RSP_WINDOWED,
        "windows": len(whole.scores),
        "tokens": whole.tokens,
    }
    return pack_terms(whole.msg_id, ids, pooled[ids], served.sparse_limit, head, aux)
