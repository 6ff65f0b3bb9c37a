"""Token classification: tiny random BERT (WordPiece), DeBERTa-v3 (Unigram) and XLM-R (byte-level
BPE) `*ForTokenClassification` checkpoints built with `transformers` at test time, exported with
`ringserve export --from`, served by one real server, and compared with transformers' own
`pipeline("token-classification")` on the same directories: every aggregation, texts with
accents, CJK and emoji, alone and in a batch of mixed lengths, a long text in windows with the
pipeline's `stride`, and KServe's per-token outputs over HTTP and gRPC through tritonclient."""

from __future__ import annotations

import functools
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ringserve.wire import frames
from ringserve.workers.artifact import load_manifest

from devkit.builds import plain_builds
from devkit.server import ServerProc, serving
from devkit.token_models import LABELS, LONG, MAX_LENGTH, TEXTS, as_entities, pipeline
from devkit.token_models import save_token_classifier as save

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.timeout(600)

NAMES = ("bert", "deberta-v3", "xlmr")
AGGREGATIONS = ("none", "simple", "first", "average", "max")
TOL = 1e-4
PATH = "/v1/token-classify"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """name -> (the HF directory, its artifact), built on the plain graph (fp32 is compared)."""
    from ringserve.factory import export

    root = tmp_path_factory.mktemp("token-models")
    out = {}
    for name in NAMES:
        source = save(name, root / "src")
        artifact = root / "art" / name
        with plain_builds():
            assert export.main(["--from", str(source), "--out", str(artifact)]) == 0
        out[name] = (source, artifact)
    return out


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, models: dict[str, tuple[Path, Path]]
) -> Iterator[ServerProc]:
    args = [a for name, (_, art) in models.items() for a in ("--model", f"{name}={art}")]
    args += ["--workers", "1", "--max-windows", "64"]
    with serving(ServerProc(tmp_path_factory.mktemp("tsrv"), args, grpc=True), 1) as srv:
        yield srv


_PIPES: dict[tuple[Path, str], Any] = {}


def pipe(source: Path, aggregation: str) -> Any:
    key = (source, aggregation)
    if key not in _PIPES:
        _PIPES[key] = pipeline(source, aggregation_strategy=aggregation)
    return _PIPES[key]


def post(server: ServerProc, body: dict[str, Any]) -> tuple[int, Any]:
    status, _, data = server.request("POST", PATH, json.dumps(body))
    return status, json.loads(data)


def ours(found: list[dict[str, Any]], text: str) -> list[tuple[str, float, int, int]]:
    for e in found:
        assert e["text"] == text[e["start"] : e["end"]]
    return [(e["label"], e["score"], e["start"], e["end"]) for e in found]


def same(got: list[Any], want: list[Any]) -> None:
    """Labels, spans and offsets exactly; scores within TOL."""
    assert [(e[0], e[2], e[3]) for e in got] == [(e[0], e[2], e[3]) for e in want]
    np.testing.assert_allclose([e[1] for e in got], [e[1] for e in want], atol=TOL, rtol=0)


def test_the_artifacts(models: dict[str, tuple[Path, Path]], server: ServerProc) -> None:
    for name, (_, artifact) in models.items():
        m = load_manifest(artifact)
        assert m.task == ["token-classify"] and m.labels == LABELS
        assert m.max_length == MAX_LENGTH and m.extra["special_tokens"] == 2
        card = json.loads(server.request("GET", f"/v1/models/{name}")[2])
        assert card["task"] == ["token-classify"] and card["labels"] == LABELS


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_every_aggregation_as_the_pipeline(
    models: dict[str, tuple[Path, Path]], server: ServerProc, name: str, aggregation: str
) -> None:
    """Each text alone, then all of them (and a text over max_length, cut as the pipeline
    cuts it) in one batch: the pipeline's entities, its scores within 1e-4."""
    source = models[name][0]
    texts = [*TEXTS, LONG]
    wanted = [as_entities(pipe(source, aggregation)(t)) for t in texts]
    assert sum(map(len, wanted)) > 10  # the aggregation paths are exercised
    for text, want in zip(texts, wanted, strict=True):
        status, found = post(server, {"text": text, "aggregation": aggregation, "model": name})
        assert status == 200, found
        same(ours(found, text), want)
    status, doc = post(server, {"texts": texts, "aggregation": aggregation, "model": name})
    assert status == 200 and len(doc["results"]) == len(texts), doc
    for text, found, want in zip(texts, doc["results"], wanted, strict=True):
        same(ours(found, text), want)


def test_the_aggregations_differ(server: ServerProc) -> None:
    """The models' words disagree inside, so first, average and max each take their path."""
    answers = {
        agg: post(server, {"texts": TEXTS, "aggregation": agg, "model": "deberta-v3"})[1]
        for agg in AGGREGATIONS
    }
    assert answers["none"] != answers["simple"] != answers["first"]
    assert len({json.dumps(answers[a]) for a in ("first", "average", "max")}) > 1


@pytest.mark.parametrize("name", NAMES)
def test_a_long_text_in_windows_as_the_pipeline_with_stride(
    models: dict[str, tuple[Path, Path]], server: ServerProc, name: str
) -> None:
    source = models[name][0]
    for stride in (0, 8, 15):
        for aggregation in AGGREGATIONS[1:]:  # the pipeline refuses a stride with "none"
            body = {"text": LONG, "aggregation": aggregation, "stride": stride, "model": name}
            status, found = post(server, body)
            assert status == 200, found
            want = as_entities(pipe(source, aggregation)(LONG, stride=stride))
            same(ours(found, LONG), want)
        status, tokens = post(server, {"text": LONG, "aggregation": "none", "stride": stride,
                                       "model": name, "ignore_labels": []})  # fmt: skip
        assert status == 200  # each token once (the text's own tokens), none cut at a seam
        assert [(e["start"], e["end"]) for e in tokens] == offsets(source, LONG)


def offsets(source: Path, text: str) -> list[tuple[int, int]]:
    """The offsets of every real token of `text`, none cut."""
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(source)
    enc = tok(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    pairs = zip(enc["offset_mapping"], enc["special_tokens_mask"], strict=True)
    return [(a, b) for (a, b), special in pairs if not special]


def test_ignore_labels_and_threshold(
    models: dict[str, tuple[Path, Path]], server: ServerProc
) -> None:
    source = models["xlmr"][0]
    text = TEXTS[1]
    everything = as_entities(pipe(source, "simple")(text, ignore_labels=[]))
    status, found = post(server, {"text": text, "model": "xlmr", "ignore_labels": []})
    assert status == 200
    same(ours(found, text), everything)
    assert any(e[0] == "O" for e in everything)
    no_per = as_entities(pipe(source, "simple")(text, ignore_labels=["O", "PER"]))
    status, found = post(server, {"text": text, "model": "xlmr", "ignore_labels": ["O", "PER"]})
    assert status == 200
    same(ours(found, text), no_per)
    status, found = post(server, {"text": text, "model": "xlmr", "threshold": 0.8})
    assert status == 200
    want = [e for e in as_entities(pipe(source, "simple")(text)) if e[1] >= 0.8]
    same(ours(found, text), want)


@functools.cache
def hf_model(source: Path) -> tuple[Any, Any]:
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(source)
    return tok, transformers.AutoModelForTokenClassification.from_pretrained(source).eval()


def per_token(source: Path, text: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The model's own top label, probabilities and offsets of each real token of `text`."""
    import torch

    tok, model = hf_model(source)
    enc = tok(text, return_tensors="pt", truncation=True, return_offsets_mapping=True,
              return_special_tokens_mask=True)  # fmt: skip
    keep = enc.pop("special_tokens_mask")[0] == 0
    offsets = enc.pop("offset_mapping")[0][keep].numpy()
    with torch.no_grad():
        probs = torch.softmax(model(**enc).logits[0], -1)[keep].numpy()
    return [LABELS[i] for i in probs.argmax(1)], probs, offsets


def check_tokens(models: dict[str, tuple[Path, Path]], name: str, result: Any) -> None:
    labels, scores = result.as_numpy("token_labels"), result.as_numpy("token_scores")
    offsets, counts = result.as_numpy("token_offsets"), result.as_numpy("token_counts")
    assert scores.shape == (len(TEXTS), max(counts), len(LABELS))
    for i, text in enumerate(TEXTS):
        want_labels, want_probs, want_offsets = per_token(models[name][0], text)
        k = counts[i]
        assert k == len(want_labels)
        strings = [x.decode() if isinstance(x, bytes) else x for x in labels[i]]
        assert strings[:k] == want_labels
        assert all(x == "" for x in strings[k:]) and (offsets[i, k:] == -1).all()
        np.testing.assert_allclose(scores[i, :k], want_probs, atol=TOL, rtol=0)
        assert offsets[i, :k].tolist() == want_offsets.tolist()


@pytest.mark.parametrize("name", NAMES)
def test_kserve_http_gives_the_tokens_to_tritonclient(
    models: dict[str, tuple[Path, Path]], server: ServerProc, name: str
) -> None:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    meta = client.get_model_metadata(name)
    assert [i["name"] for i in meta["inputs"]] == ["text"]  # no pair
    assert [o["name"] for o in meta["outputs"]] == [
        "token_labels", "token_scores", "token_offsets", "token_counts"
    ]  # fmt: skip
    for binary in (True, False):
        text = httpclient.InferInput("text", [len(TEXTS), 1], "BYTES")
        data = np.array([[t.encode()] for t in TEXTS], dtype=object)
        text.set_data_from_numpy(data, binary_data=binary)
        outputs = [
            httpclient.InferRequestedOutput(o["name"], binary_data=binary) for o in meta["outputs"]
        ]
        check_tokens(models, name, client.infer(name, [text], outputs=outputs))
    client.close()


@pytest.mark.parametrize("name", NAMES)
def test_kserve_grpc_gives_the_tokens_to_tritonclient(
    models: dict[str, tuple[Path, Path]], server: ServerProc, name: str
) -> None:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    text = grpcclient.InferInput("text", [len(TEXTS), 1], "BYTES")
    text.set_data_from_numpy(np.array([[t.encode()] for t in TEXTS], dtype=object))
    check_tokens(models, name, client.infer(name, [text]))
    # a long text in windows: each token once, in order, its count the text's real tokens
    long = grpcclient.InferInput("text", [1], "BYTES")
    long.set_data_from_numpy(np.array([LONG.encode()], dtype=object))
    result = client.infer(name, [long], parameters={"stride": 8})
    k = int(result.as_numpy("token_counts")[0])
    spans = result.as_numpy("token_offsets")[0, :k].tolist()
    assert [tuple(s) for s in spans] == offsets(models[name][0], LONG)
    assert result.get_response().parameters["windows"].string_param != "1"
    client.close()


def test_the_openapi_document_describes_the_answers(server: ServerProc) -> None:
    """This server's /openapi.json: the route's body and answers, and KServe's per-token
    outputs, as the answers are written (jsonschema, 2020-12)."""
    from jsonschema import Draft202012Validator

    doc = json.loads(server.request("GET", "/openapi.json")[2])
    components = {"components": doc["components"]}
    op = doc["paths"]["/v1/token-classify"]["post"]
    answer = op["responses"]["200"]["content"]["application/json"]["schema"]
    check = Draft202012Validator({**answer, **components})
    for body in ({"text": TEXTS[2], "model": "xlmr"}, {"texts": TEXTS[:3], "model": "bert"}):
        status, found = post(server, body)
        assert status == 200 and check.is_valid(found), list(check.iter_errors(found))[:2]
    request = op["requestBody"]["content"]["application/json"]["schema"]
    assert Draft202012Validator({**request, **components}).is_valid({"text": "a", "stride": 3})
    infer = doc["paths"]["/v2/models/{model}/infer"]["post"]["responses"]["200"]
    schema = infer["content"]["application/json"]["schema"]
    tensor = {"name": "text", "datatype": "BYTES", "shape": [2], "data": TEXTS[:2]}
    status, _, data = server.request("POST", "/v2/models/bert/infer", {"inputs": [tensor]})
    answered = json.loads(data)
    assert status == 200 and Draft202012Validator({**schema, **components}).is_valid(answered)


def test_long_texts_cut_refused_or_windowed(server: ServerProc) -> None:
    status, doc = post(server, {"text": LONG, "model": "bert", "truncate": False})
    assert status == 413 and doc["max_length"] == MAX_LENGTH, doc
    status, left = post(server, {"text": LONG, "model": "bert", "truncation_direction": "left"})
    assert status == 200 and all(e["start"] > len(LONG) // 2 for e in left), left
    status, doc = post(server, {"text": LONG, "model": "bert", "stride": 2, "truncate": True})
    assert status == 400 and "stride" in doc["error"]


BAD = [
    ({"text": "x", "stride": 22}, "stride must be an integer from 0 to 21"),
    ({"text": "x", "stride": -1}, "Expected `int` >= 0 - at `$.stride`"),
    ({"text": "x", "aggregation": "mean"}, "Invalid enum value 'mean' - at `$.aggregation`"),
    ({"text": "x", "threshold": 2}, "threshold must be a number from 0 to 1"),
    ({"text": "x", "texts": ["y"]}, 'exactly one of "text" or "texts"'),
    ({"text": " "}, "text is empty"),
]


@pytest.mark.parametrize(("body", "message"), BAD)
def test_bad_requests(server: ServerProc, body: dict[str, Any], message: str) -> None:
    status, doc = post(server, {**body, "model": "bert"})
    assert status == 400 and message in doc["error"], doc


def test_other_routes_and_protocols_refuse_a_token_classifier(server: ServerProc) -> None:
    status, _, data = server.request("POST", "/v1/classify", {"text": "x", "model": "bert"})
    assert status == 400 and "does not classify; its tasks: token-classify" in data.decode()
    body = {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}
    pair = {"inputs": [body, {**body, "name": "text_pair"}]}
    status, _, data = server.request("POST", "/v2/models/bert/infer", pair)
    assert status == 400 and b"no text_pair" in data
    wrong = {"inputs": [body], "outputs": [{"name": "scores"}]}
    status, _, data = server.request("POST", "/v2/models/bert/infer", wrong)
    assert status == 400 and b"unknown output 'scores'" in data
    # the binary protocol has no frame for per-token answers: status 1, as for a bad text
    with socket.create_connection(("127.0.0.1", server.binary_port), timeout=10) as sock:
        sock.sendall(frames.model_frame("bert") + frames.encode_frame("Paris", 7))
        buf = b""
        answers: list[Any] = []
        while len(answers) < 2:
            chunk = sock.recv(4096)
            assert chunk, answers
            buf += chunk
            answers, _ = frames.parse_answers(buf)
    assert [(a.tag, a.status) for a in answers] == [(0, frames.OK), (7, frames.BAD_REQUEST)]


def test_a_classifier_refuses_token_classify(tmp_path: Path, default_model: str) -> None:
    srv = ServerProc(tmp_path, ["--model", default_model, "--workers", "1"])
    with serving(srv, 1):
        status, doc = post(srv, {"text": "a fine film"})
        assert status == 400, doc
        assert "does not token-classify; its tasks: classify, embed" in doc["error"]
