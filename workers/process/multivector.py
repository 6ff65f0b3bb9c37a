"""A multivector (ColBERT) model's texts, tokenized as PyLate's `ColBERT.tokenize` does: the text
stripped, cut at its length less the prefix, the prefix token put after the first ([CLS]) one,
and a query padded with the expansion token ([MASK]) to query_length, its expansion unattended
unless the model attends to it. Its answer keeps every token of a query, and a document's
tokens but those of the skiplist (punctuation). The settings are the manifest's
`extra.multivector` (factory/colbert.py).

A row's mask is 1 a token (workers/runtimes/cpu.py fill_rows); an unattended expansion token
is given type -1, so that its mask is 0: attended by no token, as transformers' attention mask
0 makes it, yet its own vector computed (and answered).
"""

from __future__ import annotations

from typing import Any

from ringserve.shm import layout as L
from ringserve.workers.process.longtext import LongText, Piece, Plan, Text, _copy
from tokenizers import Tokenizer


class MultiVectorText(LongText):
    """Served.longtext for a multivector model: plan() gives each text one row, a query's when
    its options have OPT_QUERY, else a document's. A text over its length is cut (PyLate's
    truncation), or refused with `truncate: false` (OPT_REFUSE); never windowed."""

    def __init__(self, tokenizer: Tokenizer, max_length: int, settings: dict[str, Any]) -> None:
        super().__init__(tokenizer, max_length, "truncate", 0, 1, False)
        s = settings
        self.prefix = {True: s.get("query_prefix_id"), False: s.get("document_prefix_id")}
        self.length = {
            True: min(int(s["query_length"]), max_length),
            False: min(int(s["document_length"]), max_length),
        }
        self.expand = bool(s.get("do_query_expansion", True))
        self.attend = bool(s.get("attend_to_expansion_tokens", False))
        self.expansion_id = int(s["expansion_id"])
        self.skip = frozenset(int(i) for i in s.get("skiplist_ids", []))
        # Each kind's cut, before its prefix token goes in.
        self.cut = {
            query: _copy(tokenizer, {"max_length": self.length[query] - self.has_prefix(query)})
            for query in (True, False)
        }

    def has_prefix(self, query: bool) -> int:
        return int(self.prefix[query] is not None)

    def plan(self, texts: list[Text], options: list[int]) -> list[Plan]:
        """One plan a text, in order (a pair is not a multivector text: refused)."""
        out: list[Plan] = []
        strips = [t.strip() if isinstance(t, str) else "" for t in texts]
        encodings = self.encode_batch(strips)
        for text, opts, enc in zip(strips, options, encodings, strict=True):
            query = bool(opts & L.OPT_QUERY)
            if not text:
                out.append(Plan([], 0, 0, (0, 0)))
                continue
            limit = self.length[query] - self.has_prefix(query)
            n, ids, flags = len(enc.ids), enc.ids, 0
            if n > limit:
                if opts & L.OPT_MODE == L.OPT_REFUSE:
                    out.append(Plan([], n + self.has_prefix(query), 0, (0, self.length[query])))
                    continue
                ids, flags = self.cut[query].encode(text).ids, L.RSP_TRUNCATED
            out.append(Plan([self.row(ids, query)], n + self.has_prefix(query), flags))
        return out

    def row(self, ids: list[int], query: bool) -> Piece:
        """The text's row: the prefix token after the first, a query's expansion; the token
        rows its answer keeps."""
        prefix = self.prefix[query]
        if prefix is not None:
            ids = [ids[0], prefix, *ids[1:]]
        if not query:
            keep = [i for i, t in enumerate(ids) if t not in self.skip]
            return Piece(ids, None, None if len(keep) == len(ids) else keep)
        extra = self.length[True] - len(ids) if self.expand else 0
        if extra <= 0:
            return Piece(ids, None)
        types = None if self.attend else [0] * len(ids) + [-1] * extra
        return Piece(ids + [self.expansion_id] * extra, types)
