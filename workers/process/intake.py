"""Intake: the request ring read into the models' batchers. Each record's meta word names its
model and its options (shm/layout.py request_meta), read in one step; its payload is the text
alone. A text is tokenized and planned (cut, refused or windowed by
workers/process/longtext.py) and its rows added to its model's Batcher. What cannot be served
(an unknown model, a text that is not UTF-8, one too long to serve) is answered at once."""

from __future__ import annotations

import time
from collections.abc import Mapping

from ringserve.shm import layout as L
from ringserve.shm.control import ControlBlock
from ringserve.shm.ring import Ring
from ringserve.workers.batches import Item
from ringserve.workers.process.answers import Answer, Answers, pack
from ringserve.workers.process.longtext import Plan, Whole
from ringserve.workers.process.served import Served
from ringserve.workers.process.tokens import decode as decode_tokens
from ringserve.workers.spec import WorkerSpec

IDLE_WAIT_S = 0.1  # longest sleep on the doorbell: bounds heartbeat gaps and exit latency
READ_LIMIT = 1024  # messages taken from the ring per pass
Kept = tuple[int, int, int]  # msg id, deadline, options: a request admitted to a model


class Intake:
    """Reads the request ring and its doorbell; `models` is the worker's model set, by index."""

    def __init__(
        self,
        spec: WorkerSpec,
        requests: Ring,
        ctl: ControlBlock,
        models: Mapping[int, Served],
        answers: Answers,
    ) -> None:
        self.doorbell = spec.doorbell
        self.requests = requests
        self.ctl = ctl
        self.models = models
        self.answers = answers

    def take_posted(self) -> int:
        """take_requests, then one doorbell post consumed for each request read (each was
        posted once: the count stays honest for the next sleep)."""
        took = self.take_requests()
        for _ in range(took):
            if not self.doorbell.acquire(False):
                break
        return took

    def wait(self, wait_ns: int) -> None:
        """Sleep until a request is posted, the next text is due (`wait_ns`; < 0: none), or
        IDLE_WAIT_S, whichever is first."""
        timeout = IDLE_WAIT_S if wait_ns < 0 else min(IDLE_WAIT_S, wait_ns / 1e9)
        self.doorbell.acquire(True, timeout)

    def take_requests(self) -> int:
        """Read what the ring holds and hand each text to its model's batcher."""
        msgs = self.requests.read(READ_LIMIT)
        if not msgs:
            return 0
        now = time.monotonic_ns()
        texts: dict[int, list[str | tuple[str, str]]] = {}
        keep: dict[int, list[Kept]] = {}
        bad: list[Answer] = []
        unknown = 0
        for msg_id, deadline, meta, payload in msgs:
            opts, index = L.split_meta(meta)
            served = self.models.get(index)
            if served is None:  # never loaded here, or unloaded: the front-end answers 404
                bad.append(pack(msg_id, L.STATUS_UNKNOWN_MODEL))
                unknown += 1
                continue
            if served.tokens is None:
                text = decode_payload(payload)
            else:  # a token classifier's: a request's stride may precede it (process/tokens.py)
                text, opts = decode_tokens(payload, opts)
            asks = bool(opts & L.OPT_EMBED), bool(opts & L.OPT_BOTH), bool(opts & L.OPT_TOKENS)
            if text is None or served.refuses(*asks):
                bad.append(pack(msg_id, L.STATUS_BAD_REQUEST))
                continue
            texts.setdefault(index, []).append(text)
            keep.setdefault(index, []).append((msg_id, deadline, opts))
        for index, some in texts.items():
            served = self.models[index]
            # A pair goes through the tokenizer's own post-processor (special tokens, type
            # ids); a text over max_length is cut, refused or windowed (process/longtext.py).
            plans = served.longtext.plan(some, [opts for _, _, opts in keep[index]])
            bad.extend(admit(served, keep[index], plans, now))
        if bad:
            self.ctl.add("bad_requests", len(bad) - unknown)
            self.ctl.add("unknown_model", unknown)
            self.answers.send(bad)
        return len(msgs)


def admit(served: Served, keep: list[Kept], plans: list[Plan], now: int) -> list[Answer]:
    """Each plan's rows into the model's batcher; returns the refusals of texts too long."""
    if served.tokens is not None:  # a token classifier: every text answered with its offsets
        return served.tokens.admit(served.batcher.add, keep, plans, now)
    refused: list[Answer] = []
    add = served.batcher.add
    for (msg_id, deadline, opts), plan in zip(keep, plans, strict=True):
        embed, bulk = bool(opts & L.OPT_EMBED), bool(opts & L.OPT_BULK)
        both, tokens = bool(opts & L.OPT_BOTH), bool(opts & L.OPT_TOKENS)
        if tokens and plan.refusal is None and too_many_tokens(served, plan):
            refused.append(token_refusal(msg_id, served, plan))
        elif plan.refusal is not None:
            windows, limit = plan.refusal
            head = L.pack_response(
                L.STATUS_TOO_LONG, flags=plan.flags, windows=windows, tokens=plan.tokens,
                limit=limit,
            )  # fmt: skip
            refused.append((msg_id, head, 0, 0))
        elif len(plan.pieces) == 1:
            p = plan.pieces[0]
            add(Item(msg_id, deadline, now, p.ids, types=p.types, tokens=plan.tokens,
                     flags=plan.flags, embed=embed, bulk=bulk, both=both,
                     token_vectors=tokens, rows=p.rows))  # fmt: skip
        else:  # windows: one Whole answers once, when its last window is scored
            whole = Whole(msg_id, plan.tokens, now, left=len(plan.pieces), embed=embed, both=both)
            whole.scores = [None] * len(plan.pieces)
            for i, p in enumerate(plan.pieces):
                add(Item(msg_id, deadline, now, p.ids, types=p.types, whole=whole, window=i,
                         bulk=bulk))  # fmt: skip
    return refused


def too_many_tokens(served: Served, plan: Plan) -> bool:
    """Token vectors are of one window (the front-end asks for a cut or a refusal, never
    windows), at most served.token_limit tokens of them."""
    return len(plan.pieces) != 1 or len(plan.pieces[0].ids) > served.token_limit


def token_refusal(msg_id: int, served: Served, plan: Plan) -> Answer:
    """STATUS_TOO_LONG for token vectors that would not fit one answer: `limit` the tokens that
    do (the front-end answers 413)."""
    head = L.pack_response(
        L.STATUS_TOO_LONG,
        flags=plan.flags | L.RSP_TOKENS,
        tokens=plan.tokens,
        limit=served.token_limit,
    )
    return (msg_id, head, 0, 0)


def decode_payload(payload: bytes) -> str | tuple[str, str] | None:
    """A request's text, or its (text, text_pair) (L.PAIR_SEPARATOR between the two); None when
    a part is not UTF-8 or is blank (the front-end checks first; this is the last guard)."""
    parts = payload.split(L.PAIR_SEPARATOR)
    if len(parts) > 2:
        return None
    try:
        texts = [p.decode("utf-8") for p in parts]
    except UnicodeDecodeError:
        return None
    if not all(t.strip() for t in texts):
        return None
    return texts[0] if len(texts) == 1 else (texts[0], texts[1])
