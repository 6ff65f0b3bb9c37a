"""Texts longer than the model's max_length: cut (at either end), refuse, or score in windows.

The worker tokenizes every text once without truncation, so it knows each text's real token
count. A text that fits is used as it is: its ids are the ones a truncating tokenizer gives,
so it scores the same in every mode. Only a text that does not fit is encoded again, by the
tokenizers library's own truncation (right or left, or with a stride for windows), so cuts and
windows keep the model's special tokens and a pair's token types exactly as the library makes
them. Windows of one text are batched like any other rows; a Whole gathers their scores and
combines them once the last window is scored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ringserve.shm import layout as L
from tokenizers import Encoding, Tokenizer

Text = str | tuple[str, str]
MODES = ("truncate", "refuse", "window")


@dataclass(slots=True)
class Piece:
    """One row for the batcher: the whole text (cut or not) or one of its windows."""

    ids: list[int]
    types: list[int] | None
    rows: list[int] | None = None  # the token rows a multivector answer keeps (None: all)


@dataclass(slots=True)
class Plan:
    """What the worker does with one text: rows to run, or a refusal (no rows)."""

    pieces: list[Piece]
    tokens: int  # the text's (a pair's together) token count, special tokens included
    flags: int = 0  # L.RSP_TRUNCATED, L.RSP_WINDOWED
    refusal: tuple[int, int] | None = None  # (windows needed, limit) for STATUS_TOO_LONG


@dataclass(slots=True)
class Whole:
    """A windowed text in flight: the scores of its windows, combined when the last is in."""

    msg_id: int
    tokens: int
    arrived_ns: int
    scores: list[Any] = field(default_factory=list)
    left: int = 0
    model_us: int = 0
    done: bool = False  # answered (combined, or expired): later windows are dropped
    embed: bool = False  # answered with the mean of its windows' embeddings
    both: bool = False  # answered with its combined scores, then that mean (OPT_BOTH)
    looked: int = 0  # int8-checked: its windows' RSP_INT8 / RSP_SECOND_LOOK, or-ed together


def combine(scores: list[Any], activation: str) -> np.ndarray:
    """Softmax probabilities: their mean (still a distribution); independent sigmoids: the
    maximum, so a label any window finds stays found (Elasticsearch's span does the same)."""
    stacked = np.stack(scores).astype(np.float64)
    out = stacked.max(axis=0) if activation == "sigmoid" else stacked.mean(axis=0)
    return out.astype(np.float32)


class LongText:
    """The worker's tokenizers and the server's --long-text policy."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        max_length: int,
        mode: str,
        stride: int,
        max_windows: int,
        token_types: bool,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"--long-text must be one of {', '.join(MODES)}, got {mode!r}")
        self.pair_specials = tokenizer.num_special_tokens_to_add(True)
        room = max_length - self.pair_specials
        # Checked only where windows are made: the stride's default need not fit a model with
        # a short max_length that is never windowed (no request can ask for windows itself).
        if mode == "window" and not 0 <= stride < room - 1:  # a pair's window must move on
            raise ValueError(
                f"--window-stride {stride} must be at least 0 and below {room - 1} "
                f"(max_length {max_length} less a pair's special tokens, less one)"
            )
        if max_windows < 1:
            raise ValueError(f"--max-windows must be at least 1, got {max_windows}")
        self.max_length = max_length
        self.mode = mode
        self.stride = stride
        self.max_windows = max_windows
        self.token_types = token_types
        self.full = _copy(tokenizer, None)
        # Without character offsets (nothing here reads them): the same ids and type ids, about
        # a sixth less time on short texts (tokenizers 0.20 and later; before, the plain call).
        self.encode_batch = getattr(self.full, "encode_batch_fast", self.full.encode_batch)
        self.right = _copy(tokenizer, {"max_length": max_length})
        self.left = _copy(tokenizer, {"max_length": max_length, "direction": "left"})
        self.windows = self.pair_windows = self.right  # only "window" mode ever uses these
        if mode == "window":
            self.windows = _copy(tokenizer, {"max_length": max_length, "stride": stride})
            self.pair_windows = _copy(
                tokenizer, {"max_length": max_length, "stride": stride, "strategy": "only_second"}
            )

    def plan(self, texts: list[Text], options: list[int]) -> list[Plan]:
        """One plan a text, in order."""
        encodings = self.encode_batch(texts)
        out: list[Plan] = []
        for text, opts, enc in zip(texts, options, encodings, strict=True):
            n = len(enc.ids)
            if n <= self.max_length:
                out.append(Plan([self.piece(text, enc)], n))
            else:
                out.append(self.plan_long(text, opts, n))
        return out

    def piece(self, text: Text, enc: Encoding) -> Piece:
        types = enc.type_ids if self.token_types and isinstance(text, tuple) else None
        return Piece(enc.ids, types)

    def plan_long(self, text: Text, opts: int, n: int) -> Plan:
        choice = opts & L.OPT_MODE
        mode = "truncate" if choice == L.OPT_CUT else "refuse" if choice == L.OPT_REFUSE else None
        mode = mode or self.mode
        if mode == "refuse":
            return Plan([], n, 0, (0, self.max_length))
        if mode == "truncate":
            cutter = self.left if opts & L.OPT_LEFT else self.right
            return Plan([self.piece(text, _encode(cutter, text))], n, L.RSP_TRUNCATED)
        return self.plan_windows(text, n)

    def plan_windows(self, text: Text, n: int) -> Plan:
        """Windows of max_length tokens overlapping by the stride; a pair keeps its first text
        whole in each window and slides over the second."""
        tokenizer = self.windows
        if isinstance(text, tuple):
            # Checked here, not left to the library: a window of the second text with no more
            # room than the stride makes the Rust code panic, which would end the worker.
            first = len(self.full.encode(text[0], add_special_tokens=False).ids)
            if self.max_length - self.pair_specials - first <= self.stride:
                return Plan([], n, L.RSP_WINDOWED, (0, self.max_windows))
            tokenizer = self.pair_windows
        head = _encode(tokenizer, text)
        encodings = [head, *head.overflowing]
        if len(encodings) > self.max_windows:
            return Plan([], n, L.RSP_WINDOWED, (len(encodings), self.max_windows))
        return Plan([self.piece(text, e) for e in encodings], n, L.RSP_WINDOWED)


def _encode(tokenizer: Tokenizer, text: Text) -> Encoding:
    if isinstance(text, tuple):
        return tokenizer.encode(text[0], text[1])
    return tokenizer.encode(text)


def _copy(tokenizer: Tokenizer, truncation: dict[str, Any] | None) -> Tokenizer:
    """A copy of the artifact's tokenizer (no padding, as loaded) with its own truncation."""
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.no_padding()
    if truncation is None:
        copy.no_truncation()
    else:
        copy.enable_truncation(**truncation)
    return copy
