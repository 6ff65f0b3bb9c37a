"""A token classifier in the worker: its texts tokenized with character offsets, cut, refused or
read in windows (a request's own `stride`), and each text answered once its last window is in,
with every real token's label probabilities, offsets and subword mark (workers/token_entities.py
packs them; the front-end makes the entities).

The graph answers [rows, length, C] logits; the runner's activation is the softmax over the
labels (token_softmax), as the pipeline computes it. Every text is a TokenText (a Whole, so that
the loop's expiry settles it as any windowed text), a one-window text too, since its answer needs
its encoding's offsets. A request's stride rides in front of its text: STRIDE_MARK (0xFE, never
in UTF-8) and the stride as u16, written by the front-end only when the request sets one; the
intake moves it into the options word's high bits (STRIDE_SHIFT), which only this module reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ringserve.shm import layout as L
from ringserve.workers import token_entities as te
from ringserve.workers.batches import Item
from ringserve.workers.process.batcher import bucket_index
from ringserve.workers.process.longtext import LongText, Plan, Text, Whole, _copy, _encode
from tokenizers import Encoding, Tokenizer

STRIDE_MARK, STRIDE = te.STRIDE_MARK, te.STRIDE
STRIDE_SHIFT = 16  # options' bits from 16 up: the request's stride + 1 (0: none given)
STRIDE_TOKENIZERS = 16  # window tokenizers kept for requests' own strides
MARK = bytes((STRIDE_MARK,))
Answer = tuple[int, bytes, int, int]


def token_softmax(logits: np.ndarray) -> np.ndarray:
    """The runner's activation for a token classifier: [n, L, C] logits -> probabilities."""
    return te.softmax(logits)


def decode(payload: bytes, opts: int) -> tuple[str | None, int]:
    """A token request's text (None: not UTF-8, blank, or a pair, which a token classifier
    does not take) and its options, the stride moved into their high bits."""
    if payload[:1] == MARK:
        if len(payload) < 3:
            return None, opts
        opts |= (STRIDE.unpack_from(payload, 1)[0] + 1) << STRIDE_SHIFT
        payload = payload[3:]
    if L.PAIR_SEPARATOR in payload:
        return None, opts
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return None, opts
    return (text if text.strip() else None), opts


@dataclass(slots=True)
class TokenPlan(Plan):
    """A plan with what the answer needs: the text and each window's encoding (offsets)."""

    text: str = ""
    encodings: list[Encoding] = field(default_factory=list)
    step: int = 0  # windows: the text tokens from one window's first to the next one's


@dataclass(slots=True)
class TokenText(Whole):
    """A text in flight: its windows' probabilities, filled as their batches run."""

    text: str = ""
    encodings: list[Encoding] = field(default_factory=list)
    flags: int = 0
    step: int = 0


class TokenLongText(LongText):
    """LongText with character offsets, and windows at a request's own stride: a stride in
    the options (decode()) reads a text over max_length in windows overlapping by it, as the
    pipeline's `stride` does, unless the request says `truncate`."""

    def __init__(self, tokenizer: Tokenizer, max_length: int, mode: str, stride: int,
                 max_windows: int) -> None:  # fmt: skip
        super().__init__(tokenizer, max_length, mode, stride, max_windows, False)
        self.encode_batch = self.full.encode_batch  # with offsets: the answer's spans
        self.room = max_length - tokenizer.num_special_tokens_to_add(False)
        self.strided: dict[int, Tokenizer] = {}

    def plan(self, texts: list[Text], options: list[int]) -> list[Plan]:
        encodings = self.encode_batch(texts)
        out: list[Plan] = []
        for text, opts, enc in zip(texts, options, encodings, strict=True):
            n = len(enc.ids)
            if n <= self.max_length:
                out.append(TokenPlan([self.piece(text, enc)], n, text=str(text), encodings=[enc]))
            else:
                out.append(self.plan_token_long(str(text), opts, n))
        return out

    def plan_token_long(self, text: str, opts: int, n: int) -> Plan:
        choice = opts & L.OPT_MODE
        stride = (opts >> STRIDE_SHIFT) - 1
        if choice == L.OPT_REFUSE or (not choice and stride < 0 and self.mode == "refuse"):
            return Plan([], n, 0, (0, self.max_length))
        if choice == L.OPT_CUT or (stride < 0 and self.mode == "truncate"):
            enc = _encode(self.left if opts & L.OPT_LEFT else self.right, text)
            return TokenPlan([self.piece(text, enc)], n, L.RSP_TRUNCATED, text=text,
                             encodings=[enc])  # fmt: skip
        tokenizer = self.windows if stride < 0 else self.strided_tokenizer(stride)
        if tokenizer is None:  # a stride that leaves a window no room (the front-end checks)
            return Plan([], n, L.RSP_WINDOWED, (0, self.max_windows))
        head = _encode(tokenizer, text)
        encodings = [head, *head.overflowing]
        if len(encodings) > self.max_windows:
            return Plan([], n, L.RSP_WINDOWED, (len(encodings), self.max_windows))
        pieces = [self.piece(text, e) for e in encodings]
        step = self.room - (self.stride if stride < 0 else stride)  # the library's windows
        return TokenPlan(pieces, n, L.RSP_WINDOWED, text=text, encodings=encodings, step=step)

    def strided_tokenizer(self, stride: int) -> Tokenizer | None:
        """The window tokenizer of a request's stride (None for one the library refuses: it
        must be below max_length less the special tokens), made once and kept."""
        if not 0 <= stride < self.room:
            return None
        if stride == self.stride and self.mode == "window":
            return self.windows
        found = self.strided.get(stride)
        if found is None:
            if len(self.strided) >= STRIDE_TOKENIZERS:
                self.strided.clear()
            found = _copy(self.full, {"max_length": self.max_length, "stride": stride})
            self.strided[stride] = found
        return found


class TokenHead:
    """The worker's side of one token classifier: admitting its plans, and answering its
    texts once their windows are scored. `limit`: the most bytes an answer may take."""

    def __init__(self, longtext: TokenLongText, n_labels: int, unk_id: int | None, limit: int,
                 report_grid: tuple[int, ...]) -> None:  # fmt: skip
        self.longtext = longtext
        self.n_labels = n_labels
        self.words = te.Words(longtext.full, unk_id)
        self.limit = limit
        self.report_grid = report_grid

    def fits(self, tokens: int, windows: int) -> bool:
        size = L.RESPONSE_SIZE + te.body_size(tokens, windows, self.n_labels)
        return size <= self.limit

    def most_tokens(self, windows: int) -> int:
        """The most tokens an answer of `windows` windows carries."""
        per = 4 * self.n_labels + 9
        return max(0, (self.limit - L.RESPONSE_SIZE - 4 * windows - 3) // per)

    def admit(self, add: Any, keep: list[tuple[int, int, int]], plans: list[Plan],
              now: int) -> list[Answer]:  # fmt: skip
        """Each plan's rows into the batcher, every text a TokenText; returns the refusals."""
        refused: list[Answer] = []
        for (msg_id, deadline, opts), plan in zip(keep, plans, strict=True):
            if plan.refusal is not None or not isinstance(plan, TokenPlan):
                windows, limit = plan.refusal or (0, 0)
                head = L.pack_response(
                    L.STATUS_TOO_LONG, flags=plan.flags, windows=windows, tokens=plan.tokens,
                    limit=limit,
                )  # fmt: skip
                refused.append((msg_id, head, 0, 0))
                continue
            real = sum(len(e.ids) - sum(e.special_tokens_mask) for e in plan.encodings)
            if not self.fits(real, len(plan.encodings)):
                head = L.pack_response(
                    L.STATUS_TOO_LONG, flags=plan.flags | L.RSP_TOKEN_LABELS, tokens=real,
                    limit=self.most_tokens(len(plan.encodings)),
                )  # fmt: skip
                refused.append((msg_id, head, 0, 0))
                continue
            whole = TokenText(
                msg_id, plan.tokens, now, left=len(plan.pieces), text=plan.text,
                encodings=plan.encodings, flags=plan.flags, step=plan.step,
            )  # fmt: skip
            whole.scores = [None] * len(plan.pieces)
            bulk = bool(opts & L.OPT_BULK)
            for i, p in enumerate(plan.pieces):
                add(Item(msg_id, deadline, now, p.ids, tokens=plan.tokens, flags=plan.flags,
                         whole=whole, window=i, bulk=bulk))  # fmt: skip
        return refused

    def answers(self, batch: list[Item], probs: np.ndarray, t0: int, model_us: int,
                aux: int) -> list[Answer]:  # fmt: skip
        """The answers a batch completes: each text whose last window it ran."""
        out: list[Answer] = []
        for row, it in enumerate(batch):
            whole: TokenText = it.whole
            if whole.done:  # its deadline passed while it ran
                continue
            whole.scores[it.window] = probs[row, : len(it.ids)].copy()
            whole.left -= 1
            whole.model_us += model_us
            if not whole.left:
                whole.done = True
                out.append(self.answer(whole, it, t0, model_us, aux))
        return out

    def answer(self, whole: TokenText, it: Item, t0: int, model_us: int, aux: int) -> Answer:
        one = len(whole.encodings) == 1
        windows = [
            self.words.window(enc, probs, whole.text, None if one else i * whole.step)
            for i, (enc, probs) in enumerate(zip(whole.encodings, whole.scores, strict=True))
        ]
        length = len(it.ids) if one else self.longtext.max_length
        queued_us = (t0 - whole.arrived_ns) // 1000 - whole.model_us + model_us
        head = L.pack_response(
            L.STATUS_OK, bucket_index(self.report_grid, length), 0, self.n_labels,
            max(0, queued_us), whole.model_us, whole.flags | L.RSP_TOKEN_LABELS, len(windows),
            whole.tokens,
        )  # fmt: skip
        return (whole.msg_id, head + te.pack(windows), aux, 0)
