"""TEI's (text-embeddings-inference) HTTP routes beside /embed and /rerank (tasks.py), in TEI's
shapes: /info, /health, /predict, /tokenize, /decode, /embed_all (token vectors),
/similarity, and the root `POST /` that serves the model's task, as huggingface_hub's
InferenceClient calls a TEI endpoint. Errors on these paths carry TEI's `error_type`
(service/protocols/errors.py)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import numpy as np
from ringserve.service.engine.requests import Ask, Result
from ringserve.service.models.info import ModelInfo
from ringserve.service.protocols import tasks
from ringserve.service.protocols.endpoint import LATENCY, Endpoint, Lookup, Schema, error, ok
from ringserve.service.protocols.http import Exchange, HttpProtocol
from ringserve.service.protocols.routes import Router, ViewHandler, inferred, task_route, viewed
from ringserve.service.protocols.schemas import Named, decode
from ringserve.service.protocols.schemas import server as bodies
from ringserve.service.protocols.schemas import tei as tei_schemas
from ringserve.service.protocols.schemas.tei import Info, Prediction, Token
from ringserve.service.protocols.vocab import tokenizer_for
from ringserve.service.request import prompts
from ringserve.service.request.errors import RequestError, Rule, Rules
from ringserve.service.request.lookup import needs_task, request_model
from ringserve.service.request.vectors import vectors
from ringserve.service.version import version
from ringserve.service.views import FrontView
from ringserve.shm import layout as L

PREDICT_SHAPE = "a string, a pair [string, string] or a batch [[string], [string, string], ...]"
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}  # TEI's names


# -- /info and /health ---------------------------------------------------------------------------
def model_type(info: ModelInfo) -> dict[str, Any]:
    """TEI's `model_type`: one of classifier, embedding, reranker (TEI's are exclusive). A
    model that both classifies and embeds is given by its first task; `tasks` lists all."""
    tasks_ = info.manifest.task
    labels = info.labels
    if tasks_[0] in ("embed", "sparse"):  # a sparse model: TEI's embedding with splade pooling
        pooling = str(info.manifest.extra.get("pooling", "mean"))
        return {"embedding": {"pooling": pooling}}
    kind = "reranker" if tasks_[0] in ("rerank", "multivector") else "classifier"
    id2label = {str(i): name for i, name in enumerate(labels)}
    return {kind: {"id2label": id2label, "label2id": {n: i for i, n in enumerate(labels)}}}


def info_doc(server: FrontView, info: ModelInfo) -> Info:
    s = server.settings
    return Info(
        model_id=info.name,
        model_sha=info.manifest.fingerprint,
        model_dtype=DTYPES.get(s.precision, s.precision),
        model_type=model_type(info),
        max_concurrent_requests=s.max_queue,
        max_input_length=info.manifest.max_length,
        max_batch_tokens=s.batch_tokens(info.device),
        max_batch_requests=s.batch_rows(info.device),
        max_client_batch_size=s.max_texts,
        auto_truncate=s.long_text == "truncate",
        tokenization_workers=s.serving_workers(),
        version=version(),
        sha=None,
        docker_label=None,
        tasks=info.manifest.task,
    )


def tei_info(server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
    conn.respond(ex, 200, msgspec.json.encode(info_doc(server, server.model)))


def tei_health(server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
    """200 with an empty body while a worker serves; else 503 (TEI's Unhealthy)."""
    if not server.ready():
        raise RequestError(503, "no worker is ready")
    conn.respond(ex, 200, b"", content_type=b"text/plain")


# What a body the schema allows can still be refused for (the document lists each: ROUTES)
INPUTS_SHAPE = Rule("inputs must be " + PREDICT_SHAPE)  # a list of texts is one sequence
SEQUENCE = Rule("{where} must be [string] or [string, string]")
FUNCTION = Rule("parameters.function_to_apply may be {own} or none for {model}")
PREDICT_RULES = (INPUTS_SHAPE, SEQUENCE, FUNCTION)
IDS_COUNT = Rule("ids must hold 1 to {limit} lists")
IDS_SHAPE = Rule("ids must be a list of token ids, or a list of such lists")
IDS_RANGE = Rule("{where} must be a list of token ids from 0 to {top}")
NO_TOKEN_VECTORS = Rule(
    "/embed_all is not served by model {model}: its artifact has no token vectors (an embed "
    "model built by this version of `ringserve export` has them)"
)
RUNTIMES = Rule(
    "/embed_all is served on ONNX Runtime and OpenVINO only; model {model} runs on {runtime} "
    "(--runtime onnx)"
)
EMBED_ALL = (NO_TOKEN_VECTORS, RUNTIMES)


# -- /predict ------------------------------------------------------------------------------------
def predict_inputs(value: str | list[Any], limit: int) -> tuple[list[bytes], bool]:
    """TEI's PredictInput, decoded: (payloads, whether it is a batch). A list of texts is one
    sequence (a text and its pair), a list of lists a batch of them."""
    if isinstance(value, str):
        return [value.encode()], False
    if all(isinstance(v, str) for v in value):
        return [sequence(value, "inputs")], False
    if not all(isinstance(v, list) for v in value):
        raise RequestError(400, INPUTS_SHAPE.say())
    return [sequence(v, f"inputs[{i}]") for i, v in enumerate(value)], True


def sequence(items: list[str], where: str) -> bytes:
    """[text] or [text, pair] as one worker payload."""
    if len(items) > 2:
        raise RequestError(400, SEQUENCE.say(where=where))
    return L.PAIR_SEPARATOR.join(t.encode() for t in items)


def predictions(info: ModelInfo, r: Result, raw: bool, top: int = 0) -> list[Prediction]:
    """[{score, label}] highest first. `raw`: the scores before the model's activation, as far
    as they can be had from its probabilities: a sigmoid's logit exactly, a softmax's log
    probability (the logits less their log-sum-exp: same order, same differences)."""
    p = np.asarray(r.scores, dtype=np.float64)
    if raw:
        q = np.clip(p, 1e-45, 1.0)
        p = np.log(q) - np.log1p(-np.minimum(q, 1 - 1e-7)) if sigmoid(info) else np.log(q)
    order = sorted(range(len(p)), key=lambda i: -p[i])
    items = [Prediction(float(p[i]), info.labels[i]) for i in order]
    return items[:top] if top else items


def sigmoid(info: ModelInfo) -> bool:
    return info.manifest.activation == "sigmoid"


def tei_predict(
    server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]
) -> None:
    body = decode(ex, bodies.of(server.settings).predict)
    info = request_model(server, body)
    needs_task(info, "classify")
    payloads, batch = predict_inputs(body.inputs, server.settings.max_texts)
    raw = body.raw_scores

    def answer(results: list[Result]) -> bytes:
        out = [predictions(info, r, raw) for r in results]
        return msgspec.json.encode(out if batch else out[0])

    tasks.submit_texts(server, conn, ex, tasks.ask(body, payloads, "classify", info), answer)


def hf_classify(
    server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]
) -> None:
    """The Inference API's text-classification (`inputs`, `parameters`: top_k,
    function_to_apply), answered as it is: a list of [{label, score}] a text."""
    body = decode(ex, bodies.of(server.settings).hf_classify)
    info = request_model(server, body)
    needs_task(info, "classify")
    options = body.parameters or tei_schemas.ClassifyParameters()
    k = int(options.top_k or 0)
    apply = options.function_to_apply
    own = info.manifest.activation
    if apply not in (None, own, "none"):
        raise RequestError(400, FUNCTION.say(own=own, model=info.name))
    payloads, _ = predict_inputs(body.inputs, server.settings.max_texts)

    def answer(results: list[Result]) -> bytes:
        return msgspec.json.encode([predictions(info, r, apply == "none", k) for r in results])

    tasks.submit_texts(server, conn, ex, Ask(payloads, 0, "classify", info.index), answer)


# -- /similarity ---------------------------------------------------------------------------------
def tei_similarity(
    server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]
) -> None:
    """Cosine similarity of `source_sentence` to each of `sentences`, one embedding request."""
    body = decode(ex, bodies.of(server.settings).similarity)
    info = request_model(server, body)
    needs_task(info, "embed")
    texts = [body.inputs.source_sentence, *body.inputs.sentences]
    options = body.parameters or tei_schemas.SimilarityParameters()

    def answer(results: list[Result]) -> list[float]:
        vecs = vectors(results, normalize=True).astype(np.float64)
        return [float(x) for x in vecs[1:] @ vecs[0]]

    payloads = tasks.ask(options, [t.encode() for t in texts], "embed", info)
    tasks.submit_texts(server, conn, ex, payloads, answer)


# -- /tokenize, /decode, /embed_all --------------------------------------------------------------
def tokens_of(info: ModelInfo, text: str, special: bool) -> list[Token]:
    """TEI's tokens: id, the text it covers, whether it is special, and its UTF-8 byte offsets
    in the input (null for a special token, which covers none)."""
    enc = tokenizer_for(info).encode(text, add_special_tokens=special)
    out = []
    for tid, token, (a, b), is_special in zip(
        enc.ids, enc.tokens, enc.offsets, enc.special_tokens_mask, strict=True
    ):
        if is_special:
            out.append(Token(tid, token, True, None, None))
            continue
        start = len(text[:a].encode())
        piece = text[a:b]
        stop = start + len(piece.encode())
        out.append(Token(tid, piece, False, start, stop))
    return out


def tei_tokenize(
    server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]
) -> None:
    body = decode(ex, bodies.of(server.settings).tokenize)
    info = request_model(server, body)
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    answer = [tokens_of(info, t, body.add_special_tokens) for t in texts]
    conn.respond(ex, 200, msgspec.json.encode(answer))


def tei_decode(server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
    body = decode(ex, bodies.of(server.settings).decode)
    info = request_model(server, body)
    numbers = [v for v in body.ids if isinstance(v, float)]
    lists = [v for v in body.ids if isinstance(v, list)]
    if len(numbers) == len(body.ids):
        batch, where = [numbers], "ids"
    elif len(lists) == len(body.ids):
        batch, where = lists, "ids[{}]"
        if len(lists) > server.settings.max_texts:
            raise RequestError(400, IDS_COUNT.say(limit=server.settings.max_texts))
    else:
        raise RequestError(400, IDS_SHAPE.say())
    tokenizer = tokenizer_for(info)
    size = tokenizer.get_vocab_size()
    out = []
    for i, ids in enumerate(batch):
        got = [int(t) for t in ids]
        if not all(t < size for t in got):
            raise RequestError(400, IDS_RANGE.say(where=where.format(i), top=size - 1))
        out.append(tokenizer.decode(got, skip_special_tokens=body.skip_special_tokens))
    conn.respond(ex, 200, json.dumps(out).encode())


# An /embed_all answer's bound: its token vectors' floats over all its texts (16 MiB of float32,
# about 40 MB of JSON). One text's are bounded by the response ring (the worker refuses more).
MAX_TOKEN_FLOATS = 1 << 22


def tei_embed_all(
    server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]
) -> None:
    """TEI's token vectors: for each input, a list a token (special tokens included) of the
    encoder's last hidden state, before pooling and unnormalized. The worker's graph gives them
    from the same forward pass as the embedding (an ONNX Runtime artifact built with them)."""
    body = decode(ex, bodies.of(server.settings).embed_all)
    info = request_model(server, body)
    needs_task(info, "embed")  # a multivector model's token vectors: /v1/embeddings/multi
    width = token_vectors_width(info)
    inputs = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    texts = prompts.with_prompt(info.manifest, body.prompt_name, [t.encode() for t in inputs])
    opts = body.options()
    if not opts & L.OPT_MODE:  # never windows: a cut as the server's --long-text, else refused
        opts |= L.OPT_CUT if server.settings.long_text == "truncate" else L.OPT_REFUSE
    check_token_floats(info, texts, width)

    def answer(results: list[Result]) -> bytes:
        parts = [tasks.float_json(token_matrix(r)) for r in results]
        return b"[" + b",".join(parts) + b"]"

    ask = Ask(texts, opts | L.OPT_TOKENS, "embed", info.index)
    tasks.submit_texts(server, conn, ex, ask, answer)


def token_vectors_width(info: ModelInfo) -> int:
    """The width of the model's token vectors, else the 400 that says why there are none."""
    width = info.manifest.extra.get("token_vectors", 0)
    if not isinstance(width, int) or width <= 0:
        raise RequestError(400, NO_TOKEN_VECTORS.say(model=info.name))
    if info.runtime not in ("onnx", "openvino"):
        raise RequestError(400, RUNTIMES.say(model=info.name, runtime=info.runtime))
    return width


def check_token_floats(info: ModelInfo, texts: list[bytes], width: int) -> None:
    """413 when the texts' token vectors (their tokens, cut at max_length) would pass
    MAX_TOKEN_FLOATS; a text too long for one answer is the worker's to refuse. No text gives
    more than max_length vectors, so texts that could not pass the bound at that many are not
    tokenized here (the worker tokenizes them anyway): at 384 floats and 256 tokens, up to 42
    texts. Only a larger request is, so that its 413 says its exact count."""
    cap = info.manifest.max_length
    if len(texts) * cap * width <= MAX_TOKEN_FLOATS:
        return
    encoded = tokenizer_for(info).encode_batch([t.decode() for t in texts])
    tokens = sum(min(len(e.ids), cap) for e in encoded)
    if tokens * width > MAX_TOKEN_FLOATS:
        raise RequestError(
            413,
            f"the token vectors of these inputs ({tokens} tokens x {width} floats) pass the "
            f"limit of {MAX_TOKEN_FLOATS} floats a request: send fewer texts at a time",
        )


def token_matrix(r: Result) -> np.ndarray:
    """A text's token vectors [k, H] from its answer (shm/layout.py RSP_TOKENS)."""
    return np.asarray(r.scores, dtype=np.float32).reshape(r.windows, -1)


# -- POST / --------------------------------------------------------------------------------------
def tei_root(server: FrontView, conn: HttpProtocol, ex: Exchange, params: dict[str, str]) -> None:
    """TEI's root route, by the body as the Inference API sends it: `inputs` with
    `source_sentence` is a similarity, `query` a rerank, a `parameters` object a
    text-classification; else the model's task: embed when it embeds (feature-extraction),
    else predict."""
    doc = decode(ex, dict[str, Any])  # which body it is: then decoded as that one
    if isinstance(doc.get("inputs"), dict):
        tei_similarity(server, conn, ex, params)
    elif "query" in doc:
        tasks.tei_rerank(server, conn, ex, params)
    elif "parameters" in doc:
        hf_classify(server, conn, ex, params)
    elif "embed" in request_model(server, decode(ex, Named)).manifest.task:
        tasks.tei_embed(server, conn, ex, params)
    else:
        tei_predict(server, conn, ex, params)


def root_schemas(d: Lookup) -> tuple[Schema, Schema]:
    """POST /: each body the route tells apart (tei_root), and each answer."""
    f = d.facts
    neither = {"not": {"anyOf": [{"required": ["parameters"]}, {"required": ["query"]}]}}
    bodies: list[Schema] = []
    answers: list[Schema] = []
    if f.embeds:
        bodies += [{"allOf": [d.body("tei_embed"), neither]}, d.body("similarity")]
        answers += [d.answer("tei_embed"), d.answer("similarity")]
    elif "classify" in f.tasks:
        bodies.append({"allOf": [d.body("predict"), neither]})
        answers.append(predict_answer(d))
    if "classify" in f.tasks:
        bodies.append(d.body("hf_classify"))
        answers.append(d.answer("hf_classify"))
    if "rerank" in f.tasks:
        bodies.append(d.body("tei_rerank"))
        answers.append(d.answer("tei_rerank"))
    nothing: Schema = {"type": "object"}  # a model with none of these tasks: refused (400)
    return {"anyOf": bodies or [nothing]}, {"anyOf": answers or [{"type": "array"}]}


def predict_answer(d: Lookup) -> Schema:
    return {"anyOf": [d.answer("prediction"), d.answer("predictions")]}


def tool_route(path: str, handler: ViewHandler, summary: str, rules: Rules = ()) -> Endpoint:
    """A TEI route that answers in the front-end (no worker): its refusals still carry
    x-latency-ms (routes.inference)."""
    name = path.strip("/")
    return Endpoint("POST", path, inferred(handler), summary, "tei", ok("the answer", name),
                    name, model_body=True, rules=rules)  # fmt: skip


ROUTES = [
    Endpoint("GET", "/info", viewed(tei_info), "TEI's model and server facts", "tei",
             ok("info", "info")),
    Endpoint("GET", "/health", viewed(tei_health),
             "TEI's health: 200 with an empty body while a worker serves", "health",
             {**ok("healthy", None, "text/plain"), 503: error("no worker is ready")}),
    Endpoint(
        "POST", "/", inferred(tei_root),
        "TEI's root: the model's task, as the Inference API calls a TEI endpoint", "tei",
        ok("the task's answer", lambda d: root_schemas(d)[1], "application/json", *LATENCY),
        lambda d: root_schemas(d)[0], inference=True, model_body=True,
        needs=("classify", "embed", "rerank"), rules=(*tasks.EMBED_RULES, *PREDICT_RULES),
        examples={"one": {"inputs": "a fine film"}},
    ),
    task_route(
        "/predict", tei_predict, "Classify a text, a pair or a batch, in TEI's shape", "classify",
        ("[{score, label}] highest first, a list a text for a batch", "predict", predict_answer),
        {"inputs": "a fine film"}, PREDICT_RULES,
    ),
    task_route(
        "/similarity", tei_similarity, "Cosine similarity of source_sentence to each of sentences",
        "embed", ("one similarity a sentence", "similarity", "similarity"),
        {"inputs": {"source_sentence": "a film", "sentences": ["a movie", "a cat"]}},
    ),
    tool_route("/tokenize", tei_tokenize, "The model's tokens of each text"),
    tool_route("/decode", tei_decode, "The text of token ids", (IDS_RANGE, IDS_SHAPE, IDS_COUNT)),
    task_route(  # TEI's token vectors: an embed route, refused (400) by an artifact or runtime
        # without them, 413 for vectors too many for one answer
        "/embed_all", tei_embed_all, "Token vectors of each text, in TEI's shape", "embed",
        ("a list a text of a vector a token", "embed_all", "embed_all"),
        {"inputs": "a fine film"}, (*EMBED_ALL, *tasks.EMBED_RULES),
    ),
]  # fmt: skip


def tei_routes(router: Router) -> None:
    router.mount(ROUTES)
