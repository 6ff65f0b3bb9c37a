"""Late chunking (`late_chunking: true` on /v1/embeddings and /embed, as Jina's API takes it):
the inputs are the chunks of one document. They are joined with one space and encoded once, and
each chunk's tokens are pooled into its own vector with the model's pooling, so a chunk's vector
has read the whole document around it.

The front-end tokenizes the joined text (the model's tokenizer, with offsets): a token belongs
to the chunk whose characters its first character falls in, so the spans are the tokenizer's
own. The token states come from the workers (shm/layout.py OPT_TOKENS, as TEI's /embed_all):
the whole document as one text when it fits max_length; else in windows of max_length tokens,
each starting and ending on a word boundary and overlapping its neighbours by half, and each
token takes its state from the window where it sits furthest from an edge (the most context
on both sides). The pooling, then the model's normalization, run here; the route answers the
chunk vectors as it answers texts (dimensions, compact encodings)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from ringserve.service.engine.requests import Ask, Result
from ringserve.service.models.info import ModelInfo
from ringserve.service.protocols.vocab import framing, tokenizer_for
from ringserve.service.request.errors import RequestError, Rule
from ringserve.shm import layout as L

# What a late-chunked body the schema allows can still be refused for (tasks.LATE_RULES)
TEXTS_ONLY = Rule("late_chunking takes texts, not token ids")
POOLING = Rule("late_chunking cannot pool by {pooling} (model {model})")
NO_TOKENS = Rule("input[{i}] has no tokens of its own")
NO_STATES = Rule(
    "late_chunking is not served by model {model}: it needs the token states, which an artifact "
    "built by this version's `ringserve export` gives on ONNX Runtime or OpenVINO"
)
DENSE = Rule("late_chunking is not served by model {model}: a Dense module follows its pooling")
UNWINDOWED = Rule("this document cannot be windowed on its tokens' boundaries")
POOLINGS = ("mean", "max", "cls", "last", "mean_sqrt_len", "weightedmean")
Span = tuple[int, int]  # a token's characters in the joined text: [start, end)


def check_model(info: ModelInfo) -> str:
    """The model's pooling, or the 400 that says why it cannot late-chunk: it needs the token
    states (an ONNX Runtime or OpenVINO artifact built with them) and a pooling with no
    learned step after it (a Dense works on the pooled vector, which a span does not have)."""
    extra = info.manifest.extra
    width = extra.get("token_vectors", 0)
    if not isinstance(width, int) or width <= 0 or info.runtime not in ("onnx", "openvino"):
        raise RequestError(400, NO_STATES.say(model=info.name))
    if extra.get("dense") or width != info.manifest.dimension:
        raise RequestError(400, DENSE.say(model=info.name))
    pooling = str(extra.get("pooling", "mean"))
    if pooling not in POOLINGS:
        raise RequestError(400, POOLING.say(pooling=pooling, model=info.name))
    return pooling


def chunk_bounds(chunks: list[str], start: int) -> list[Span]:
    """Each chunk's characters in the joined text (one space between chunks), from `start`."""
    bounds, at = [], start
    for chunk in chunks:
        bounds.append((at, at + len(chunk)))
        at += len(chunk) + 1
    return bounds


def owners(offsets: list[Span], bounds: list[Span]) -> list[list[int]]:
    """The tokens of each chunk: those whose first character is in it (a prompt's are none's)."""
    spans: list[list[int]] = [[] for _ in bounds]
    c = 0
    for i, (start, end) in enumerate(offsets):
        if end <= start:
            continue  # a token of no characters
        while c < len(bounds) and start >= bounds[c][1]:
            c += 1
        if c < len(bounds) and start >= bounds[c][0]:
            spans[c].append(i)
    return spans


def windows(word_starts: list[bool], room: int) -> list[Span]:
    """Token ranges [a, b) of at most `room` tokens, each starting on a word's first token and
    ending before one, the next starting at the word start nearest half way into the last
    (after the last's start, so they always advance); one when all fit."""
    n = len(word_starts)
    if n <= room:
        return [(0, n)]
    out: list[Span] = []
    a = 0
    while True:
        b = min(a + room, n)
        while b < n and b > a + 1 and not word_starts[b]:
            b -= 1  # end before a word that would not fit whole
        out.append((a, b))
        if b >= n:
            return out
        half = a + (b - a) // 2  # the next starts at the word start inside this one nearest it
        inside = [i for i in range(a + 1, b) if word_starts[i]]
        a = min(inside, key=lambda i: abs(i - half)) if inside else b


def best_window(wins: list[Span], n: int) -> list[int]:
    """For each token, the window where it is furthest from an edge."""
    best = [0] * n
    margin = [-1] * n
    for w, (a, b) in enumerate(wins):
        for i in range(a, b):
            m = min(i - a, b - 1 - i)
            if m > margin[i]:
                margin[i], best[i] = m, w
    return best


def pool(states: np.ndarray, pooling: str) -> np.ndarray:
    """One span's token states [k, H] pooled as sentence-transformers pools a text's
    (factory/embedder.py pool): cls and last take the span's first and last token."""
    if pooling == "cls":
        return states[0]
    if pooling == "last":
        return states[-1]
    if pooling == "max":
        return states.max(axis=0)
    if pooling == "mean_sqrt_len":
        return states.sum(axis=0) / np.sqrt(len(states))
    if pooling == "weightedmean":
        w = np.arange(1, len(states) + 1, dtype=np.float64)[:, None]
        return (states * w).sum(axis=0) / w.sum()
    return states.mean(axis=0)


class Plan:
    """One document's late chunking: its text, the windows sent, and which token of which
    window answers each chunk's tokens."""

    def __init__(self, info: ModelInfo, chunks: list[str], prompt: str, max_windows: int):
        self.pooling = check_model(info)
        tokenizer = tokenizer_for(info)
        self.text = prompt + " ".join(chunks)
        enc = tokenizer.encode(self.text, add_special_tokens=False)
        self.offsets = [(int(a), int(b)) for a, b in enc.offsets]
        self.spans = owners(self.offsets, chunk_bounds(chunks, len(prompt)))
        empty = next((c for c, s in enumerate(self.spans) if not s), None)
        if empty is not None:
            raise RequestError(400, NO_TOKENS.say(i=empty))
        before, after = framing(tokenizer)
        self.lead = len(before)
        self.tokens = len(self.offsets) + len(before) + len(after)
        room = info.manifest.max_length - len(before) - len(after)
        words = enc.word_ids
        starts = [i == 0 or words[i] is None or words[i] != words[i - 1] for i in range(len(words))]
        self.windows = windows(starts, room)
        if len(self.windows) > max_windows:
            raise RequestError(
                413,
                f"the document's {len(self.offsets)} tokens need {len(self.windows)} windows "
                f"of {room}; at most {max_windows} (--max-windows)",
            )
        self.texts = [self.window_text(a, b) for a, b in self.windows]
        if len(self.windows) > 1:  # each window's own tokens must be the document's
            again = tokenizer.encode_batch(
                [t.decode() for t in self.texts], add_special_tokens=False
            )
            for (a, b), e in zip(self.windows, again, strict=True):
                if e.ids != enc.ids[a:b]:
                    raise RequestError(400, UNWINDOWED.say())
        self.best = best_window(self.windows, len(self.offsets))

    def window_text(self, a: int, b: int) -> bytes:
        """A window's characters: from the end of the token before it (the space that makes
        its first token a word's start, for byte-level BPE), to its last token's end; the
        first from the text's start and the last to its end, so a document of one window is
        sent as it was tokenized here."""
        start = self.offsets[a - 1][1] if a else 0
        end = self.offsets[b - 1][1] if b < len(self.offsets) else len(self.text)
        return self.text[start:end].encode()

    def ask(self, model: int) -> Ask:
        """The windows as one request for their token states (each fits: never cut)."""
        return Ask(self.texts, L.OPT_CUT | L.OPT_TOKENS, "embed", model)

    def states(self, results: list[Result]) -> np.ndarray:
        """Each document token's state [n, H], from the window that gives it the most context
        (a window's answer is its tokens framed by the special ones: its row lead + j is the
        document's token a + j, as the Plan checked when it made the windows)."""
        best = np.asarray(self.best)
        out: np.ndarray | None = None
        for w, ((a, _), r) in enumerate(zip(self.windows, results, strict=True)):
            rows = np.asarray(r.scores, dtype=np.float32).reshape(r.windows, -1)
            if out is None:
                out = np.empty((len(self.offsets), rows.shape[1]), dtype=np.float64)
            mine = np.flatnonzero(best == w)
            out[mine] = rows[self.lead + mine - a]
        assert out is not None
        return out

    def chunk_results(self, results: list[Result]) -> list[Result]:
        """One Result a chunk: its pooled vector (float32, as a worker answers it), its tokens."""
        states = self.states(results)
        return [
            Result(L.STATUS_OK, 0, pool(states[span], self.pooling).astype(np.float32),
                   tokens=len(span))
            for span in self.spans
        ]  # fmt: skip


def chunks_of(value: str | list[Any]) -> list[str]:
    """The chunks of a late-chunked `input` (`inputs`): a text, or a list of texts."""
    if isinstance(value, str):
        return [value]
    if not all(isinstance(v, str) for v in value):
        raise RequestError(400, TEXTS_ONLY.say())
    return list(value)


def answered(plan: Plan, answer: Callable[[list[Result]], Any]) -> Callable[[list[Result]], Any]:
    """The route's answer, given the chunks' vectors pooled from the windows' token states."""
    return lambda results: answer(plan.chunk_results(results))
