"""The model's tokenizer in the front-end, for the routes that speak in token ids: TEI's
/tokenize and /decode, and OpenAI's token-id `input` to /v1/embeddings. The workers still
tokenize every text they serve; this copy only turns ids into text and text into tokens for
an answer. One tokenizer a (model directory, fingerprint), loaded at its first use (tens of
milliseconds for a BERT vocabulary) and kept."""

from __future__ import annotations

import functools

from ringserve.service.models.info import ModelInfo
from ringserve.service.request.errors import RequestError, Rule
from ringserve.service.request.texts import require
from ringserve.workers.artifact import ArtifactError, load_tokenizer
from tokenizers import Tokenizer

# What a 400 about token ids adds: where the ids most often come from, and the way out.
HINT = (
    "token ids are read as the model's own tokenizer gives them, special tokens included "
    "(POST /tokenize gives them); "
    "LangChain's OpenAIEmbeddings sends tiktoken (cl100k) ids by default: set "
    "check_embedding_ctx_length=False to send text"
)
# Ids the model's tokenizer refuses (tasks.TOKEN_ID_RULES lists them for the document)
OUTSIDE = Rule("{where}: token id {id} is not in model {model}'s vocabulary (0 to {top}); " + HINT)
UNFRAMED = Rule(
    "{where}: token ids must start with {head} and end with {tail}, model {model}'s special "
    "tokens; " + HINT
)
RETOKENIZED = Rule(
    "{where}: these token ids are not a tokenization by model {model}'s tokenizer (decoded and "
    "encoded again, they change); " + HINT
)


@functools.lru_cache(maxsize=16)
def _load(model_dir: str, fingerprint: str, max_length: int) -> Tokenizer:
    tokenizer = load_tokenizer(model_dir, max_length)
    tokenizer.no_truncation()  # the answer shows every token; the worker applies max_length
    return tokenizer


def tokenizer_for(info: ModelInfo) -> Tokenizer:
    m = info.manifest
    try:
        return _load(info.model_dir, m.fingerprint, m.max_length)
    except ArtifactError as exc:
        raise RequestError(500, f"model {info.name}: {exc}") from None


def framing(tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """The special ids the tokenizer puts before and after one text ([CLS] and [SEP])."""
    bare = tokenizer.encode("a", add_special_tokens=False).ids
    whole = tokenizer.encode("a", add_special_tokens=True).ids
    at = next((i for i in range(len(whole)) if whole[i : i + len(bare)] == bare), 0)
    return whole[:at], whole[at + len(bare) :]


def text_of_ids(info: ModelInfo, ids: list[int], where: str) -> bytes:
    """The text that `ids` spell, for a worker to tokenize again. The ids must be a whole
    tokenization by the model's own tokenizer, as it gives them with its special tokens
    (`tokenizer(text)`, TEI's /tokenize): in its vocabulary, framed by its special tokens
    ([CLS] ... [SEP]), and unchanged when decoded and encoded again. Ids from another tokenizer
    (tiktoken's cl100k, which LangChain sends by default) fail these tests, and would
    otherwise embed a meaningless text without a word of warning: an id in range and a
    round trip alone let short texts through ("hello world" in cl100k ids spells "denise 皇"
    in BERT's vocabulary, and spells it again)."""
    tokenizer = tokenizer_for(info)
    size = tokenizer.get_vocab_size()
    outside = next((i for i in ids if not 0 <= i < size), None)
    if outside is not None:
        raise RequestError(400, OUTSIDE.say(where=where, id=outside, model=info.name, top=size - 1))
    head, tail = framing(tokenizer)
    framed = ids[: len(head)] == head and (not tail or ids[-len(tail) :] == tail)
    inner = ids[len(head) : len(ids) - len(tail)]
    if not framed or len(ids) < len(head) + len(tail):
        raise RequestError(400, UNFRAMED.say(where=where, head=head, tail=tail, model=info.name))
    spelled = tokenizer.decode(inner, skip_special_tokens=False)
    if tokenizer.encode(spelled, add_special_tokens=False).ids != inner:
        raise RequestError(400, RETOKENIZED.say(where=where, model=info.name))
    return require(tokenizer.decode(inner, skip_special_tokens=True), where)
