"""Answers: a batch's runner output packed into response records and published on the response
ring, then the front-end's doorbell rung once. Also the refusals and expiries the intake and
the loop decide on: every record the worker writes is packed here."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
from ringserve.shm import layout as L
from ringserve.shm.control import ControlBlock
from ringserve.shm.ring import Ring
from ringserve.workers.batches import Item
from ringserve.workers.process.batcher import bucket_index
from ringserve.workers.process.lies import Lie
from ringserve.workers.process.longtext import Whole, combine
from ringserve.workers.process.served import Served
from ringserve.workers.process.sparse import batch_answers
from ringserve.workers.spec import EXIT_PARENT_GONE, WorkerSpec

Answer = tuple[int, bytes, int, int]  # (msg id, response payload, aux, meta 0): a ring message


@dataclass(slots=True)
class Running:
    """A batch whose forward pass started at t0: what answering it needs once its scores are
    in, and, for one run on the background thread, the future that brings them."""

    served: Served
    batch: list[Item]
    length: int
    tokens: int = 0
    t0: int = 0
    future: Future[tuple[Any, int]] | None = None
    states: Any = None  # the token states [rows, length, H], when a text asked (OPT_TOKENS)
    # int8-checked: the rows fp32 scored again (workers/runtimes/checked.py); None: no check
    checked: Any = None


def forward_batch(runner: Any, run: Running) -> Any:
    """A filled batch's forward pass: its rows, and (run.states) the token states of the same
    pass when one of its texts asked for its token vectors; no other batch copies them out."""
    if any(it.token_vectors for it in run.batch):
        probs, run.states = runner.forward_tokens(run.length, len(run.batch))
    else:
        probs = runner.forward(run.length, len(run.batch))
    run.checked = getattr(runner, "checked", None)  # read on the thread that ran it
    return probs


class Answers:
    """Writes the worker's answers: the response ring, the answer doorbell, and the counters
    the front-end reads with them. `beat` stamps the heartbeat while a full ring waits."""

    def __init__(
        self, spec: WorkerSpec, responses: Ring, ctl: ControlBlock, beat: Callable[[], None]
    ) -> None:
        self.spec = spec
        self.responses = responses
        self.ctl = ctl
        self.beat = beat
        self.lie = Lie.from_hook(spec)  # test-only: None unless a test asks for one

    def batch(self, run: Running, t1: int, probs: Any) -> None:
        """Answer a batch whose forward pass ran from run.t0 to t1."""
        served, batch, length, t0 = run.served, run.batch, run.length, run.t0
        model_us = (t1 - t0) // 1000
        aux = L.pack_batch(len(batch), length, t0)  # the batch, for the front-end's traces
        if served.tokens is not None:  # a token classifier (workers/process/tokens.py)
            done = served.tokens.answers(batch, probs, t0, model_us, aux)
            self.count(run, t1, len(done))
            self.send(done)
            return
        if served.sparse_limit:  # only the nonzero terms go through the ring
            out = batch_answers(served, batch, probs, t0, model_us, aux)
            self.count(run, t1, len(out))
            self.send(out)
            return
        scores = Scores(probs, len(batch), served.n_labels)
        looked = precision_flags(run.checked, len(batch))
        out = []
        for row, it in enumerate(batch):
            flags = it.flags | looked[row]
            if it.whole is not None:
                answer = window_done(served, it, probs[row], t0, model_us, aux, looked[row])
                if answer is not None:
                    out.append(answer)
                continue
            queued_us = (t0 - it.arrived_ns) // 1000
            cls = bucket_index(served.report_grid, len(it.ids))  # by the text's own length
            if it.token_vectors:
                out.append(token_answer(it, run.states[row], cls, queued_us, model_us, aux))
                continue
            if it.embed or it.both:
                out.append(
                    pack(it.msg_id, L.STATUS_OK, cls, served.part(probs[row], True, it.both),
                         queued_us, model_us, flags, it.tokens, embed=it.embed, aux=aux,
                         scored=served.n_labels if it.both else 0)
                )  # fmt: skip
                continue
            head = L.pack_response(
                L.STATUS_OK, cls, scores.labels[row], served.n_labels, queued_us, model_us,
                flags, 0, it.tokens,
            )  # fmt: skip
            out.append((it.msg_id, head + scores.row(row), aux, 0))
        self.count(run, t1, len(out))  # first: whoever sees an answer sees its batch counted
        self.send(out)

    def count(self, run: Running, t1: int, answered: int) -> None:
        ctl, rows = self.ctl, len(run.batch)
        ctl.add("requests", answered)
        ctl.add("rows", rows)
        ctl.add("batches", 1)
        ctl.add("tokens", run.tokens)
        ctl.add("padded_tokens", rows * run.length)
        ctl.add("busy_ns", t1 - run.t0)
        ctl.count_batch(rows)

    def expired(self, late: list[Item]) -> None:
        """Answer 504 for texts whose deadline passed before they ran (a windowed text once)."""
        late = [it for it in late if it.whole is None or settle(it.whole)]
        if late:
            self.ctl.add("expired", len(late))
            self.send([pack(it.msg_id, L.STATUS_DEADLINE) for it in late])

    def send(self, msgs: list[Answer]) -> None:
        """Publish answers, then ring the front-end's doorbell once."""
        if self.lie is not None and msgs and self.lie.due(len(msgs)):
            self.lie.tell(self.responses, msgs[0][0])  # test-only (workers/process/lies.py)
            self.spec.eventfd.ring()
            return
        while msgs:
            n = self.responses.write_many(msgs)
            msgs = msgs[n:]
            if msgs:  # the front-end is behind: let it catch up, still beating
                self.spec.eventfd.ring()
                self.beat()
                time.sleep(0.0005)
                if os.getppid() != self.spec.parent_pid:
                    raise SystemExit(EXIT_PARENT_GONE)
        self.spec.eventfd.ring()


def precision_flags(checked: Any, n: int) -> list[int]:
    """Each row's RSP_INT8 or RSP_SECOND_LOOK under int8-checked; 0s for any other runner."""
    if checked is None or len(checked) != n:
        return [0] * n
    return [L.RSP_SECOND_LOOK if c else L.RSP_INT8 for c in checked.tolist()]


def token_answer(
    it: Item, states: Any, bucket: int, queued_us: int, model_us: int, aux: int
) -> Answer:
    """A text's token vectors (its first k rows of the batch's states: rows are right padded),
    or the rows it keeps (a multivector document's, its skiplist tokens left out)."""
    rows = states[: len(it.ids)] if it.rows is None else states[it.rows]
    vectors = np.ascontiguousarray(rows, dtype=np.float32)
    head = L.pack_response(
        L.STATUS_OK, bucket, 0, vectors.shape[1], queued_us, model_us, it.flags | L.RSP_TOKENS,
        len(vectors), it.tokens,
    )  # fmt: skip
    return (it.msg_id, head + vectors.tobytes(), aux, 0)


def window_done(
    served: Served, it: Item, probs: Any, t0: int, model_us: int, aux: int = 0, looked: int = 0
) -> Answer | None:
    """Record one window's scores (a copy: the runner reuses its output buffer); the answer
    once the text's last window is in."""
    whole: Whole = it.whole
    if whole.done:  # its deadline passed while this window ran
        return None
    whole.scores[it.window] = probs.copy()
    whole.looked |= looked
    whole.left -= 1
    whole.model_us += model_us  # the model time the text cost, over all its windows
    if whole.left:
        return None
    whole.done = True
    combined = combine_windows(served, whole)
    cls = bucket_index(served.report_grid, served.longtext.max_length)
    queued_us = (t0 - whole.arrived_ns) // 1000 - whole.model_us + model_us
    return pack(
        whole.msg_id, L.STATUS_OK, cls, combined, max(0, queued_us), whole.model_us,
        L.RSP_WINDOWED | second_look(whole.looked), whole.tokens, len(whole.scores),
        embed=whole.embed, aux=aux,
        scored=served.n_labels if whole.both else 0,
    )  # fmt: skip


def second_look(looked: int) -> int:
    """A windowed text's precision flag: fp32's when any window was looked at again."""
    return L.RSP_SECOND_LOOK if looked & L.RSP_SECOND_LOOK else looked


def combine_windows(served: Served, whole: Whole) -> Any:
    """A windowed text's answer: its windows' scores combined by the model's activation, or
    the mean of their vectors (the contract's --long-text window); OPT_BOTH: the two, joined."""
    if whole.both:
        c = served.n_labels
        rows = [served.part(row, True, True) for row in whole.scores]
        scores = combine([r[:c] for r in rows], served.activation)
        return np.concatenate([scores, combine([r[c:] for r in rows], "softmax")])
    parts = [served.part(row, whole.embed) for row in whole.scores]
    return combine(parts, "softmax" if whole.embed else served.activation)


def pack(
    msg_id: int,
    status: int,
    bucket: int = 0,
    probs: Any = None,
    queued_us: int = 0,
    model_us: int = 0,
    flags: int = 0,
    tokens: int = 0,
    windows: int = 0,
    embed: bool = False,
    aux: int = 0,
    scored: int = 0,
) -> Answer:
    """One response record: a status alone, or a text's scores (or vector) and its figures;
    `scored` > 0: the first `scored` floats are scores, the vector after them (OPT_BOTH)."""
    if probs is None:
        return (msg_id, L.pack_response(status), 0, 0)
    probs = np.ascontiguousarray(probs, dtype=np.float32)
    label = 0 if embed else int(probs[: scored or len(probs)].argmax())
    head = L.pack_response(
        status, bucket, label, len(probs), queued_us, model_us, flags, windows, tokens
    )
    return (msg_id, head + probs.tobytes(), aux, 0)


class Scores:
    """A batch's scores (the first `n_labels` columns of the runner's rows) as its answers
    carry them: every row's label from one argmax, every row's float32 bytes from one copy,
    the same bytes and labels pack() gives a row alone."""

    __slots__ = ("blob", "labels", "width")

    def __init__(self, probs: Any, rows: int, n_labels: int) -> None:
        part = np.ascontiguousarray(probs[:rows, :n_labels], dtype=np.float32)
        self.labels: list[int] = part.argmax(axis=1).tolist() if n_labels else [0] * rows
        self.blob = part.tobytes()
        self.width = 4 * n_labels

    def row(self, i: int) -> bytes:
        return self.blob[i * self.width : (i + 1) * self.width]


def settle(whole: Whole) -> bool:
    """A windowed text's deadline passed: True for the first of its windows to see it (which
    answers), False for the rest."""
    if whole.done:
        return False
    whole.done = True
    return True
