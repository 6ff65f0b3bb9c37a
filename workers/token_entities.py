"""A token classifier's answer, token by token, and the entities in it, exactly as transformers'
`pipeline("token-classification", aggregation_strategy=...)` makes them (its
gather_pre_entities, aggregate, group_entities and aggregate_overlapping_entities, in numpy).

Shared by the three sides that read a token classifier: the worker (workers/process/tokens.py)
turns each window's logits into a Window (its real tokens' probabilities, character offsets and
subword marks) and packs the windows into its answer; the front-end unpacks them and makes the
entities of the aggregation a request asks for (service/protocols/token_classify.py); the
factory makes fp32's and int8's entities to publish int8's cost (factory/token_heads.py).

An entity is (label, score, start, end): start and end are character offsets into the text (a
Python string's indices, as the tokenizers library gives them), so text[start:end] is what it
covers.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

TASK = "token-classify"
# A request's stride rides in front of its text in the ring: this byte (never in UTF-8), then
# the stride as u16; written by the front-end only when the request sets one
# (workers/process/tokens.py reads it).
STRIDE_MARK = 0xFE
STRIDE = struct.Struct("<H")
AGGREGATIONS = ("none", "simple", "first", "average", "max")
WORD_AGGREGATIONS = ("first", "average", "max")
Entity = tuple[str, float, int, int]  # label, score, start, end
_U32 = struct.Struct("<I")


def stride_prefix(stride: int) -> bytes:
    """What the front-end writes before a text whose request sets `stride`."""
    return bytes((STRIDE_MARK,)) + STRIDE.pack(stride)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Over the last axis, in float32, as the pipeline computes its scores."""
    logits = np.asarray(logits, dtype=np.float32)
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    out: np.ndarray = shifted / shifted.sum(axis=-1, keepdims=True)
    return out


@dataclass(slots=True)
class Window:
    """One window's real tokens (special tokens left out, as the pipeline leaves them)."""

    probs: np.ndarray  # [k, C] float32: each token's label probabilities
    starts: np.ndarray  # [k] int32: character offsets into the text
    ends: np.ndarray  # [k] int32
    subword: np.ndarray  # [k] bool: continues the word before it (the pipeline's is_subword)
    # [k] int32: each token's place among the text's tokens (a windowed text's: the windows
    # overlap); None for a text read in one window
    positions: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.starts)


class Words:
    """What the pipeline reads of a tokenizer to tell a word's first token from the rest: a
    word-aware tokenizer (WordPiece's `##`, a BPE with a continuing-subword prefix) marks a
    token whose string is not as long as the text it covers; any other (SentencePiece,
    byte-level BPE) uses the pipeline's fallback, a token whose start has no space on either
    side. The unknown token is never a subword."""

    def __init__(self, tokenizer: Any, unk_id: int | None) -> None:
        self.prefix = bool(getattr(tokenizer.model, "continuing_subword_prefix", None))
        self.unk = unk_id
        self.lengths = np.zeros(0, dtype=np.int32)
        if self.prefix:  # each token's length in characters, by id
            size = tokenizer.get_vocab_size(with_added_tokens=True)
            self.lengths = np.array(
                [len(tokenizer.id_to_token(i) or "") for i in range(size)], dtype=np.int32
            )

    def window(
        self, encoding: Any, probs: np.ndarray, text: str | None, first: int | None = None
    ) -> Window:
        """The window of one encoding (its ids, offsets and special-token mask) and its
        probabilities [len(ids), C]; `text`: the text it encodes (None: no subword marks);
        `first`: where the window's first text token is among the text's (one of several
        windows; its tokens' positions count the text's tokens from there)."""
        keep = np.flatnonzero(np.asarray(encoding.special_tokens_mask, dtype=np.int8) == 0)
        ids = np.asarray(encoding.ids, dtype=np.int64)[keep]
        offsets = np.asarray(encoding.offsets, dtype=np.int32).reshape(-1, 2)[keep]
        starts, ends = offsets[:, 0].copy(), offsets[:, 1].copy()
        if text is None:
            sub = np.zeros(len(ids), dtype=bool)
        elif self.prefix:
            sub = self.lengths[ids] != ends - starts
        else:
            sub = np.array([s > 0 and " " not in text[s - 1 : s + 1] for s in starts.tolist()],
                           dtype=bool)  # fmt: skip
        if self.unk is not None and len(ids):
            sub &= ids != self.unk
        positions = None
        if first is not None:  # the post-processor's own tokens have no sequence
            content = np.array([s is not None for s in encoding.sequence_ids], dtype=np.int32)
            positions = (first + np.cumsum(content) - 1)[keep].astype(np.int32)
        probs = np.ascontiguousarray(probs[keep], dtype=np.float32)
        return Window(probs, starts, ends, sub, positions)


# -- the answer's body: the worker packs it, the front-end unpacks it ------------------------------
def pack(windows: list[Window]) -> bytes:
    """Each window's token count (u32), with several windows every token's position (i32),
    then every token's start and end (i32), its subword mark (u8, padded to 4 bytes) and its C
    probabilities (f32), window after window."""
    counts = b"".join(_U32.pack(len(w)) for w in windows)
    if len(windows) > 1:
        places = [w.positions if w.positions is not None else np.arange(len(w)) for w in windows]
        counts += np.concatenate(places).astype("<i4").tobytes()
    starts = np.concatenate([w.starts for w in windows]).astype("<i4")
    ends = np.concatenate([w.ends for w in windows]).astype("<i4")
    sub = np.concatenate([w.subword for w in windows]).astype(np.uint8)
    pad = b"\0" * (-len(sub) % 4)
    probs = np.concatenate([w.probs for w in windows]).astype("<f4")
    return b"".join([counts, starts.tobytes(), ends.tobytes(), sub.tobytes(), pad, probs.tobytes()])


def body_size(tokens: int, windows: int, n_labels: int) -> int:
    """The bytes pack() writes for `tokens` tokens in `windows` windows."""
    places = 4 * tokens if windows > 1 else 0
    return 4 * windows + places + 8 * tokens + tokens + (-tokens % 4) + 4 * n_labels * tokens


def unpack(body: bytes | memoryview, windows: int, n_labels: int, offset: int = 0) -> list[Window]:
    """pack()'s windows from `body` at `offset`."""
    counts = np.frombuffer(body, dtype="<u4", count=windows, offset=offset).tolist()
    k = sum(counts)
    pos = offset + 4 * windows
    places = None
    if windows > 1:
        places = np.frombuffer(body, dtype="<i4", count=k, offset=pos)
        pos += 4 * k
    starts = np.frombuffer(body, dtype="<i4", count=k, offset=pos)
    ends = np.frombuffer(body, dtype="<i4", count=k, offset=pos + 4 * k)
    sub = np.frombuffer(body, dtype=np.uint8, count=k, offset=pos + 8 * k).astype(bool)
    pos += 9 * k + (-k % 4)
    probs = np.frombuffer(body, dtype="<f4", count=k * n_labels, offset=pos).reshape(k, n_labels)
    out, at = [], 0
    for n in counts:
        part = slice(at, at + n)
        where = None if places is None else places[part]
        out.append(Window(probs[part], starts[part], ends[part], sub[part], where))
        at += n
    return out


# -- entities, as the pipeline makes them ---------------------------------------------------------
def tag_of(label: str) -> tuple[bool, str]:
    """(begins, tag) of a label, as the pipeline's get_tag: `B-X` begins X, `I-X` continues
    it, any other label continues itself."""
    if label.startswith("B-"):
        return True, label[2:]
    if label.startswith("I-"):
        return False, label[2:]
    return False, label


def entities(
    windows: list[Window], labels: list[str], aggregation: str, ignore: Any = ("O",)
) -> list[Entity]:
    """The entities of a text's windows: each window's, those of an ignored label left out,
    then (more than one window) those that overlap merged as the pipeline merges them: of two
    overlapping entities the longer stays, of two as long the higher score. Aggregation `none`
    (which the pipeline refuses with a stride) answers each token once: merged_tokens."""
    if aggregation == "none" and len(windows) > 1:
        windows = [merged_tokens(windows)]
    found: list[Entity] = []
    for w in windows:
        found += window_entities(w, labels, aggregation, ignore)
    if len(windows) > 1:
        found = merge_overlapping(found)
    return found


def window_entities(w: Window, labels: list[str], aggregation: str, ignore: Any) -> list[Entity]:
    if not len(w):
        return []
    if aggregation in ("none", "simple"):
        ids = w.probs.argmax(axis=1)
        scores = w.probs[np.arange(len(ids)), ids]
        starts, ends = w.starts, w.ends
    else:
        ids, scores, starts, ends = words(w, aggregation)
    if aggregation == "none":
        rows = zip(ids.tolist(), scores.tolist(), starts.tolist(), ends.tolist(), strict=True)
        return [(labels[i], s, a, b) for i, s, a, b in rows if labels[i] not in ignore]
    label_tags = tags(tuple(labels))
    return grouped(ids.tolist(), scores, starts.tolist(), ends.tolist(), label_tags, ignore)


@functools.lru_cache(maxsize=64)
def tags(labels: tuple[str, ...]) -> tuple[tuple[bool, str, str], ...]:
    """Each label's (begins, tag, group label): what group_entities reads of it, once a model."""
    return tuple((*tag_of(label), label.split("-", 1)[-1]) for label in labels)


def words(w: Window, aggregation: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One (label id, score, start, end) a word: a word is a token and the subwords after it;
    its label and score are its first token's (first), its most confident token's (max), or
    the top of its tokens' mean probabilities (average)."""
    heads = np.flatnonzero(~w.subword)
    if not len(heads) or heads[0] != 0:  # the first token begins a word, subword or not
        heads = np.concatenate([[0], heads])
    tails = np.append(heads[1:], len(w)) - 1
    probs = w.probs
    if aggregation == "first":
        chosen = probs[heads]
    elif aggregation == "max":
        top = probs.max(axis=1)
        best = [a + int(top[a : b + 1].argmax()) for a, b in zip(heads, tails, strict=True)]
        chosen = probs[best]
    elif aggregation == "average":
        counts = (tails - heads + 1).astype(np.float32)[:, None]
        chosen = np.add.reduceat(probs, heads, axis=0) / counts
    else:
        raise ValueError(f"aggregation must be one of {', '.join(AGGREGATIONS)}")
    ids = chosen.argmax(axis=1)
    return ids, chosen[np.arange(len(ids)), ids], w.starts[heads], w.ends[tails]


def grouped(
    ids: list[int],
    scores: np.ndarray,
    starts: list[int],
    ends: list[int],
    label_tags: tuple[tuple[bool, str, str], ...],
    ignore: Any,
) -> list[Entity]:
    """The pipeline's group_entities: adjacent items of one tag join unless the later begins
    (`B-`); a group's label is its first item's without the `B-`/`I-` part (split at its first
    `-`), its score the mean of its items', its span from its first item's start to its last's
    end."""
    out: list[Entity] = []
    first = 0
    last_tag = label_tags[ids[0]][1]
    n = len(ids)
    for i in range(1, n + 1):
        if i < n:
            begins, tag, _ = label_tags[ids[i]]
            if tag == last_tag and not begins:
                continue
            last_tag = tag
        label = label_tags[ids[first]][2]
        if label not in ignore:
            score = float(scores[first]) if i - first == 1 else float(np.mean(scores[first:i]))
            out.append((label, score, starts[first], ends[i - 1]))
        first = i
    return out


def merge_overlapping(found: list[Entity]) -> list[Entity]:
    """The pipeline's aggregate_overlapping_entities: sorted by start (stably), an entity that
    starts inside the one kept before it replaces it when longer, or as long and more sure."""
    if not found:
        return found
    ordered = sorted(found, key=lambda e: e[2])
    out: list[Entity] = []
    previous = ordered[0]
    for e in ordered:
        if previous[2] <= e[2] < previous[3]:
            length, previous_length = e[3] - e[2], previous[3] - previous[2]
            if length > previous_length or (length == previous_length and e[1] > previous[1]):
                previous = e
        else:
            out.append(previous)
            previous = e
    out.append(previous)
    return out


def merged_tokens(windows: list[Window]) -> Window:
    """A windowed text's tokens, each once, in order: a token in several windows (its
    position, which the worker sends with a windowed answer) is answered from the one where it
    has the most context on both sides, the earlier window on a tie (aggregation `none`, and
    KServe's per-token outputs)."""
    if len(windows) == 1:
        return windows[0]
    places = np.concatenate([_positions(w) for w in windows])
    context = np.concatenate([np.minimum(np.arange(len(w)), np.arange(len(w))[::-1])
                              for w in windows])  # fmt: skip
    order = np.lexsort((np.arange(len(places)), -context, places))  # by place, most context
    first = np.ones(len(order), dtype=bool)
    first[1:] = places[order][1:] != places[order][:-1]
    chosen = order[first]
    merged = Window(
        np.concatenate([w.probs for w in windows])[chosen],
        np.concatenate([w.starts for w in windows])[chosen],
        np.concatenate([w.ends for w in windows])[chosen],
        np.concatenate([w.subword for w in windows])[chosen],
    )
    return merged


def _positions(w: Window) -> np.ndarray:
    if w.positions is None:
        raise ValueError("a window of several has no token positions")
    return w.positions
