"""Long texts and their windows cut by hand, for the tests of --long-text (classification and
embeddings): what the server's windowing must agree with."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

MAX_LEN = 256
STRIDE = 32
HAPPY = "This film is a joy from start to finish, warm, funny and beautifully acted. "
GRIM = "The plot is a dull mess, the acting is wooden and every scene drags on forever. "


def raw(model_dir: str) -> Tokenizer:
    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def windows_of(
    tok: Tokenizer,
    text: str,
    query: str | None = None,
    max_len: int = MAX_LEN,
    stride: int = STRIDE,
) -> list[tuple[list[int], list[int]]]:
    """(ids, token types) of each window, by hand: [CLS] (query [SEP]) part [SEP], where the
    parts are the text's tokens in slices of the room left, each starting `stride` tokens
    before the last one ended."""
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    body = tok.encode(text, add_special_tokens=False).ids
    head = [] if query is None else [*tok.encode(query, add_special_tokens=False).ids, sep]
    room = max_len - 2 - len(head)
    out = []
    start = 0
    while True:
        part = body[start : start + room]
        ids = [cls, *head, *part, sep]
        types = [0] * (1 + len(head)) + [1] * (len(part) + 1) if head else [0] * len(ids)
        out.append((ids, types))
        if start + room >= len(body):
            return out
        start += room - STRIDE


def long_text(tokens_over: int, tok: Tokenizer, first: str = HAPPY, then: str = GRIM) -> str:
    """A text of one sentiment for its first max_length tokens, the other after, about
    `tokens_over` x max_length tokens in all."""
    text = first * 12
    while len(tok.encode(text).ids) < MAX_LEN * tokens_over:
        text += then
    return text
