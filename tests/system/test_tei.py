"""TEI's routes beside /embed and /rerank, in TEI's shapes, on one real server of the default
model (it classifies and embeds): /info, /health, /predict (single, pair, batch, raw_scores,
truncate), /tokenize and /decode, /similarity, /embed_all, the root POST / by body,
and TEI's error body {"error", "error_type"}."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from ringserve.workers.artifact import load_tokenizer

from devkit.server import ServerProc, serving

pytestmark = pytest.mark.timeout(120)
GOOD, BAD = "a charming and often affecting journey", "a dull, plodding mess of a film"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    args = ["--workers", "1", "--spares", "0", "--grpc-port", "0", "--binary-port", "0"]
    with serving(ServerProc(tmp_path_factory.mktemp("tei"), args), 1) as server:
        yield server


def post(srv: ServerProc, path: str, body: Any) -> tuple[int, Any]:
    status, _, data = srv.request("POST", path, json.dumps(body))
    return status, json.loads(data)


def classify(srv: ServerProc, text: str, pair: str | None = None) -> dict[str, Any]:
    body = {"text": text} if pair is None else {"text": text, "text_pair": pair}
    status, doc = post(srv, "/v1/classify", body)
    assert status == 200, doc
    return dict(doc)


def test_info_and_health(srv: ServerProc, default_model: str) -> None:
    status, _, data = srv.request("GET", "/info")
    info = json.loads(data)
    model = json.loads(srv.request("GET", "/v1/model")[2])
    assert status == 200 and info["model_id"] == model["name"]
    assert info["model_type"] == {
        "classifier": {"id2label": {"0": "negative", "1": "positive"},
                       "label2id": {"negative": 0, "positive": 1}}
    }  # fmt: skip
    assert info["max_input_length"] == model["max_length"] and info["model_dtype"] == "float32"
    assert info["max_client_batch_size"] == 256 and info["tasks"] == ["classify", "embed"]
    assert info["max_batch_tokens"] > 0 and isinstance(info["version"], str)
    assert srv.request("GET", "/health")[:3:2] == (200, b"")


def test_predict_single_pair_and_batch(srv: ServerProc) -> None:
    status, one = post(srv, "/predict", {"inputs": GOOD})
    want = classify(srv, GOOD)
    assert status == 200 and [p["label"] for p in one] == ["positive", "negative"]
    assert one[0]["score"] == pytest.approx(max(want["scores"]), abs=1e-6)
    assert one[0]["score"] >= one[1]["score"]  # highest first
    status, pair = post(srv, "/predict", {"inputs": [GOOD, BAD]})  # one pair, not a batch
    assert status == 200 and pair[0]["label"] == classify(srv, GOOD, BAD)["label"]
    status, batch = post(srv, "/predict", {"inputs": [[GOOD], [BAD], [GOOD, BAD]]})
    assert status == 200 and [b[0]["label"] for b in batch] == ["positive", "negative",
                                                                pair[0]["label"]]  # fmt: skip
    status, raw = post(srv, "/predict", {"inputs": GOOD, "raw_scores": True})
    probs = {p["label"]: p["score"] for p in one}
    # softmax: the log probabilities, whose differences are the logits' differences
    assert status == 200 and {r["label"]: r["score"] for r in raw} == pytest.approx(
        {k: float(np.log(v)) for k, v in probs.items()}, abs=1e-5
    )
    status, refused = post(srv, "/predict", {"inputs": GOOD + " it" * 400, "truncate": False})
    assert status == 413 and refused["error_type"] == "Validation", refused
    status, cut = post(srv, "/predict", {"inputs": GOOD + " it" * 400, "truncate": True})
    assert status == 200 and len(cut) == 2


def test_tokenize_and_decode(srv: ServerProc, default_model: str) -> None:
    text = "Héllo wörld"
    status, tokens = post(srv, "/tokenize", {"inputs": text})
    ids = load_tokenizer(default_model, 128).encode(text).ids
    assert status == 200 and [t["id"] for t in tokens[0]] == ids
    first, word = tokens[0][0], tokens[0][1]
    assert first == {"id": ids[0], "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert word["special"] is False and word["text"] == "Héllo"
    assert text.encode()[word["start"] : word["stop"]] == "Héllo".encode()  # UTF-8 byte offsets
    status, bare = post(srv, "/tokenize", {"inputs": [text, "b"], "add_special_tokens": False})
    assert status == 200 and len(bare) == 2 and not any(t["special"] for t in bare[0])
    status, texts = post(srv, "/decode", {"ids": ids})
    assert status == 200 and texts == ["hello world"]  # the model is uncased
    status, texts = post(srv, "/decode", {"ids": [ids, ids], "skip_special_tokens": False})
    assert status == 200 and texts == ["[CLS] hello world [SEP]"] * 2
    status, refused = post(srv, "/decode", {"ids": [1, 10**9]})
    assert status == 400 and refused["error_type"] == "Validation"
    assert "token ids from 0 to 30521" in refused["error"]


def test_similarity(srv: ServerProc) -> None:
    body = {"inputs": {"source_sentence": GOOD, "sentences": [GOOD, BAD]}}
    status, sims = post(srv, "/similarity", body)
    status_e, vecs = post(srv, "/embed", {"inputs": [GOOD, BAD]})
    v = np.array(vecs, dtype=np.float64)
    assert status == status_e == 200
    assert sims == pytest.approx([1.0, float(v[0] @ v[1])], abs=1e-5)


def test_embed_all_gives_every_tokens_vector(srv: ServerProc, default_model: str) -> None:
    """TEI's shape (a list an input of a list a token of H floats), special tokens included:
    the encoder's last hidden state, as transformers' BertModel gives it, within 1e-4."""
    transformers = pytest.importorskip("transformers")
    import torch
    from ringserve.factory.build import default_encoder_dir

    texts = [GOOD, BAD, "ok"]
    status, got = post(srv, "/embed_all", {"inputs": texts})
    assert status == 200, got
    tok = load_tokenizer(default_model, 256)
    model = transformers.BertModel.from_pretrained(str(default_encoder_dir())).eval()
    for text, vectors in zip(texts, got, strict=True):
        ids = tok.encode(text).ids
        with torch.no_grad():
            want = model(torch.tensor([ids])).last_hidden_state[0].numpy()
        assert np.array(vectors).shape == want.shape == (len(ids), 384)
        np.testing.assert_allclose(np.array(vectors), want, atol=1e-4, rtol=0)
    status, one = post(srv, "/embed_all", {"inputs": GOOD})  # one string: a list of one
    assert status == 200 and np.allclose(one[0], got[0], atol=1e-6)


def test_embed_all_refuses_what_does_not_fit(srv: ServerProc) -> None:
    """A text whose vectors would pass half the response ring (242 tokens x 384 floats), and a
    request whose vectors pass the answer's bound: 413 each, and the next request is served."""
    long = " ".join(["word"] * 240)
    status, doc = post(srv, "/embed_all", {"inputs": long, "truncate": True})
    assert status == 413 and "fit one answer" in doc["error"], doc
    many = [" ".join(["word"] * 48)] * 256  # 256 x 50 tokens x 384 floats: over 2**22
    status, doc = post(srv, "/embed_all", {"inputs": many})
    assert status == 413 and "fewer texts" in doc["error"], doc
    status, doc = post(srv, "/embed_all", {"inputs": long[:100], "truncate": True})
    assert status == 200 and len(doc) == 1


def test_the_root_serves_by_body(srv: ServerProc) -> None:
    status, vecs = post(srv, "/", {"inputs": [GOOD]})  # feature-extraction: the embedding
    _, want = post(srv, "/embed", {"inputs": [GOOD]})
    assert status == 200 and np.allclose(vecs, want, atol=1e-6)
    status, labels = post(srv, "/", {"inputs": BAD, "parameters": {"top_k": 1}})
    assert status == 200 and labels == [[{"score": pytest.approx(max(
        classify(srv, BAD)["scores"]), abs=1e-6), "label": "negative"}]]  # fmt: skip
    status, sims = post(srv, "/", {"inputs": {"source_sentence": GOOD, "sentences": [GOOD]}})
    assert status == 200 and sims == pytest.approx([1.0], abs=1e-5)
    status, doc = post(srv, "/", {"query": "q", "texts": ["a"]})
    assert status == 400 and "does not rerank" in doc["error"] and doc["error_type"]


def test_errors_in_tei_shape(srv: ServerProc) -> None:
    for path in ("/predict", "/similarity", "/tokenize", "/embed"):
        status, doc = post(srv, path, {"inputs": ""})
        assert status == 400 and set(doc) == {"error", "error_type"}, (path, doc)
    status, _, data = srv.request("GET", "/v1/nothing")
    assert status == 404 and set(json.loads(data)) == {"error"}  # ours stays as it was
