"""Embeddings on the default model: /v1/embeddings (OpenAI), /embed (TEI) and KServe's
`embedding` output, against sentence-transformers' own `encode` of the installed encoder,
through real servers and the official clients."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from ringserve.factory.build import DEFAULT_HEAD, default_encoder_dir, read_head
from ringserve.workers.artifact import open_tokenizer

from devkit.launcher import DATA
from devkit.server import ServerProc

transformers = pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")

pytestmark = pytest.mark.timeout(300)
TOL = 1e-4
MAX_LENGTH = 256  # the default artifact's, and sentence-transformers' max_seq_length for MiniLM
_NEWS = (DATA / "ag_news" / "sample.tsv").read_text(encoding="utf-8").splitlines()[1:6]
LONG = " ".join(r.split("\t")[0] for r in _NEWS) * 3  # past 256 tokens: truncated
TEXTS = ["ok", "Crème brûlée in Zürich — naïve café", "a gripping, beautiful film", LONG]


def reference(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(pooled, L2-normalized) embeddings of each text alone: sentence-transformers' own `encode`
    on the installed all-MiniLM-L6-v2 directory that the default artifact is built from (its
    modules.json: Transformer, Pooling(mean), Normalize), and the same pipeline without its
    Normalize for the raw vectors."""
    from sentence_transformers import SentenceTransformer

    full = SentenceTransformer(str(default_encoder_dir()), device="cpu")
    assert full.max_seq_length == MAX_LENGTH
    raw = SentenceTransformer(modules=[full[0], full[1]], device="cpu")
    with torch.no_grad():
        unit = full.encode(texts, batch_size=1, convert_to_numpy=True)
        pooled = raw.encode(texts, batch_size=1, convert_to_numpy=True)
    return np.asarray(pooled, dtype=np.float64), np.asarray(unit, dtype=np.float64)


def mean_pooled(rows: list[list[int]]) -> np.ndarray:
    """transformers' BertModel on each row of token ids alone, mean-pooled [N, 384]."""
    model = transformers.BertModel.from_pretrained(default_encoder_dir()).eval()
    out = []
    with torch.no_grad():
        for row in rows:
            ids = torch.tensor([row])
            states = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
            out.append(states[0].mean(dim=0).numpy())
    return np.stack(out).astype(np.float64)


@pytest.fixture(scope="module")
def want() -> tuple[np.ndarray, np.ndarray]:
    return reference(TEXTS)


def post(server: ServerProc, path: str, body: Any) -> tuple[int, Any]:
    status, _, data = server.request(
        "POST", path, body if isinstance(body, dict) else json.dumps(body)
    )
    return status, json.loads(data)


def test_openai_embeddings_match_the_reference(server: ServerProc, want: Any) -> None:
    status, doc = post(server, "/v1/embeddings", {"input": TEXTS, "model": "anything"})
    assert status == 200, doc
    assert doc["object"] == "list" and doc["model"] == "sst2-minilm"
    assert [d["index"] for d in doc["data"]] == list(range(len(TEXTS)))
    assert all(d["object"] == "embedding" for d in doc["data"])
    got = np.array([d["embedding"] for d in doc["data"]])
    assert got.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(got, want[1], atol=TOL, rtol=0)
    tok = open_tokenizer(default_encoder_dir() / "tokenizer.json", 10**6)
    tokens = sum(len(tok.encode(t).ids) for t in TEXTS)  # before the cut, as classify counts
    assert doc["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    status, one = post(server, "/v1/embeddings", {"input": TEXTS[2]})  # a string: one vector
    assert status == 200 and len(one["data"]) == 1
    np.testing.assert_allclose(one["data"][0]["embedding"], want[1][2], atol=TOL, rtol=0)


def test_base64_and_dimensions(server: ServerProc, want: Any) -> None:
    body = {"input": TEXTS[:3], "encoding_format": "base64", "dimensions": 64}
    status, doc = post(server, "/v1/embeddings", body)
    assert status == 200, doc
    got = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in doc["data"]])
    cut = want[1][:3, :64] / np.linalg.norm(want[1][:3, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(got, cut, atol=TOL, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


def test_tei_embed_normalized_and_not(server: ServerProc, want: Any) -> None:
    status, doc = post(server, "/embed", {"inputs": TEXTS})
    assert status == 200, doc
    np.testing.assert_allclose(np.array(doc), want[1], atol=TOL, rtol=0)
    status, doc = post(server, "/embed", {"inputs": TEXTS, "normalize": False})
    assert status == 200, doc
    np.testing.assert_allclose(np.array(doc), want[0], atol=TOL, rtol=0)
    status, doc = post(server, "/embed", {"inputs": TEXTS[3], "truncate": True})
    assert status == 200 and len(doc) == 1
    np.testing.assert_allclose(doc[0], want[1][3], atol=TOL, rtol=0)


def test_classifier_is_the_head_of_the_returned_embedding(server: ServerProc) -> None:
    """One forward, both answers: the graph gives the pooled vector and the head's logits of it
    side by side (factory/model.py classify_embed), so /v1/classify's probabilities are the
    head applied to what /v1/embeddings returns."""
    head, _ = read_head(DEFAULT_HEAD)
    texts = [*TEXTS, "a dull, lifeless mess", "the plot holds together until the last act"]
    status, doc = post(server, "/v1/embeddings", {"input": texts})
    assert status == 200, doc
    emb = np.array([d["embedding"] for d in doc["data"]], dtype=np.float64)
    logits = emb @ head["weight"].double().numpy().T + head["bias"].double().numpy()
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    answer = server.classify(texts)
    scores = np.array([r["scores"] for r in answer["results"]])
    np.testing.assert_allclose(scores, probs, atol=TOL, rtol=0)
    assert [r["label_id"] for r in answer["results"]] == list(probs.argmax(1))


def test_the_openai_client(server: ServerProc, want: Any) -> None:
    """The official client, unchanged: it asks for base64 and decodes it itself."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused")
    answer = client.embeddings.create(model="sst2-minilm", input=TEXTS)
    got = np.array([d.embedding for d in answer.data])
    np.testing.assert_allclose(got, want[1], atol=TOL, rtol=0)
    assert answer.model == "sst2-minilm" and answer.usage.prompt_tokens > 0
    cut = client.embeddings.create(model="sst2-minilm", input="ok", dimensions=8)
    assert len(cut.data[0].embedding) == 8


def test_the_openai_docs_body(server: ServerProc) -> None:
    """The request body of OpenAI's API reference, as written there."""
    body = """{
    "input": "The food was delicious and the waiter...",
    "model": "text-embedding-ada-002",
    "encoding_format": "float"
  }"""
    status, doc = post(server, "/v1/embeddings", json.loads(body))
    assert status == 200 and len(doc["data"][0]["embedding"]) == 384


def test_the_tei_docs_body(server: ServerProc) -> None:
    """TEI's README: curl 127.0.0.1:8080/embed -X POST -d '{"inputs":"What is Deep Learning?"}'."""
    status, _, data = server.request("POST", "/embed", '{"inputs":"What is Deep Learning?"}')
    assert status == 200
    (vec,) = json.loads(data)
    np.testing.assert_allclose(vec, reference(["What is Deep Learning?"])[1][0], atol=TOL)


def test_tritonclient_reads_the_embedding(server: ServerProc, want: Any) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    meta = client.get_model_metadata("sst2-minilm")
    assert {"name": "embedding", "datatype": "FP32", "shape": [-1, 384]} in meta["outputs"]
    assert meta["parameters"]["task"] == "classify,embed"
    texts = TEXTS[:3]
    text = httpclient.InferInput("text", [len(texts)], "BYTES")
    text.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
    for binary in (True, False):
        out = httpclient.InferRequestedOutput("embedding", binary_data=binary)
        result = client.infer("sst2-minilm", [text], outputs=[out])
        got = result.as_numpy("embedding")
        assert got.shape == (3, 384) and got.dtype == np.float32
        np.testing.assert_allclose(got, want[1][:3], atol=TOL, rtol=0)
    scores = [r["scores"] for r in server.classify(texts)["results"]]
    result = client.infer("sst2-minilm", [text])  # no outputs named: all, from one pass
    assert [o["name"] for o in result.get_response()["outputs"]] == [
        o["name"] for o in meta["outputs"]
    ]
    np.testing.assert_allclose(result.as_numpy("embedding"), want[1][:3], atol=TOL, rtol=0)
    np.testing.assert_allclose(result.as_numpy("scores"), scores, atol=1e-5, rtol=0)
    assert result.as_numpy("label").shape == (3,)
    both = [httpclient.InferRequestedOutput(n) for n in ("embedding", "scores")]
    result = client.infer("sst2-minilm", [text], outputs=both)  # one pass, one request
    np.testing.assert_allclose(result.as_numpy("embedding"), want[1][:3], atol=TOL, rtol=0)
    np.testing.assert_allclose(result.as_numpy("scores"), scores, atol=1e-5, rtol=0)
    assert result.as_numpy("label") is None


def test_model_states_task_and_dimension(server: ServerProc) -> None:
    status, _, data = server.request("GET", "/v1/model")
    doc = json.loads(data)
    assert status == 200 and doc["task"] == ["classify", "embed"] and doc["dimension"] == 384
    assert doc["runtime"] == "onnx"  # `auto` on the CPU: the ONNX half of every_runtime_embeds


def test_the_model_field(server: ServerProc, want: Any) -> None:
    """ "model" names a loaded model (404 otherwise) on TEI's route; on OpenAI's, where every
    client sends its own service's model name, a name the server never held means its only
    model (as before many models), and a "version" makes the name count."""
    for path, key in (("/v1/embeddings", "input"), ("/embed", "inputs")):
        status, doc = post(server, path, {key: TEXTS[0], "model": "sst2-minilm", "version": 1})
        assert status == 200, doc
        status, doc = post(server, path, {key: TEXTS[0], "model": "sst2-minilm", "version": "2"})
        assert status == 404 and "unknown" in error_message(doc), doc
    status, doc = post(server, "/embed", {"inputs": TEXTS[0], "model": "text-embedding-3-small"})
    assert status == 404 and "unknown model" in doc["error"], doc
    status, doc = post(
        server, "/v1/embeddings", {"input": TEXTS[0], "model": "other", "version": 1}
    )
    assert status == 404, doc
    status, doc = post(server, "/v1/embeddings", {"input": TEXTS[0], "model": "other"})
    assert status == 200 and doc["model"] == "sst2-minilm", doc
    np.testing.assert_allclose(doc["data"][0]["embedding"], want[1][0], atol=TOL, rtol=0)


def error_message(doc: dict[str, Any]) -> str:
    """The message of an error body: OpenAI's {"error": {"message"}} on its routes, else ours."""
    error = doc["error"]
    return str(error["message"] if isinstance(error, dict) else error)


BAD = [
    ("/v1/embeddings", {"input": []}, "Expected `array` of length >= 1 - at `$.input`"),
    ("/v1/embeddings", {"input": ["x"] * 257}, "input must hold 1 to 256 items, not 257"),
    ("/v1/embeddings", {"input": "x", "dimensions": 385}, "dimensions"),
    ("/v1/embeddings", {"input": "x", "dimensions": 0}, "dimensions"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "int4"}, "encoding_format"),
    ("/v1/embeddings", {"input": ["fine", "  "]}, "input[1] is empty"),
    ("/v1/embeddings", {"input": [1, 2, 3]}, "token ids must start with [101]"),
    ("/v1/embeddings", {"input": [True]}, "got `bool` - at `$.input[0]`"),
    ("/v1/embeddings", {"input": ["x", 1]}, "input mixes texts, token ids and lists of token ids"),
    ("/v1/embeddings", {"text": "x"}, "missing required field `input`"),
    (
        "/v1/embeddings",
        {"input": "x", "dimensions": 8.5},
        "Expected `int`, got a fraction - at `$.dimensions`",
    ),
    ("/embed", {"inputs": []}, "Expected `array` of length >= 1 - at `$.inputs`"),
    ("/embed", {"inputs": "x", "normalize": "yes"}, "normalize"),
    ("/rerank", {"query": "q", "texts": ["a"]}, "does not rerank; its tasks: classify, embed"),
    ("/v1/rerank", {"query": "q", "documents": ["a"]}, "does not rerank"),
]


@pytest.mark.parametrize(("path", "body", "message"), BAD)
def test_bad_input_is_400(server: ServerProc, path: str, body: Any, message: str) -> None:
    status, doc = post(server, path, body)
    assert status == 400, doc
    assert message in error_message(doc), doc
    assert server.classify("still serving")["label"] in ("negative", "positive")


def test_every_runtime_embeds(start_server: Any, want: Any) -> None:
    """TorchScript (factory/model.py Joined) and ONNX Runtime (the graph's `embedding` output)
    give the same vectors: the shared server above runs `auto`, which is ONNX on the CPU
    (test_model_states_task_and_dimension checks it; its vectors are checked by the tests
    above), so a server of its own is started here for TorchScript alone."""
    srv = start_server("--workers", "1", "--spares", "0", "--runtime", "torch", workers=1)
    assert json.loads(srv.request("GET", "/v1/model")[2])["runtime"] == "torch"
    status, doc = post(srv, "/embed", {"inputs": TEXTS})
    assert status == 200, doc
    np.testing.assert_allclose(np.array(doc), want[1], atol=TOL, rtol=0)
    assert len(srv.classify(TEXTS)["results"]) == len(TEXTS)


def test_windowed_embedding_is_the_mean_of_its_windows(start_server: Any) -> None:
    """--long-text window: a long text's embedding is the mean of its windows' pooled vectors
    (then normalized as the model does); the windows are cut by hand in test_longtext.py."""
    from ringserve.factory.build import default_artifact_dir

    from devkit.longtext import long_text, raw, windows_of

    tok = raw(str(default_artifact_dir()))
    text = long_text(3, tok)
    windows = [ids for ids, _ in windows_of(tok, text)]
    assert len(windows) >= 3
    pooled = mean_pooled(windows).mean(axis=0)
    srv = start_server("--workers", "1", "--spares", "0", "--long-text", "window", workers=1)
    status, doc = post(srv, "/embed", {"inputs": [text, "ok"], "normalize": False})
    assert status == 200, doc
    np.testing.assert_allclose(doc[0], pooled, atol=TOL, rtol=0)
    status, doc = post(srv, "/v1/embeddings", {"input": text})
    assert status == 200, doc
    unit = pooled / np.linalg.norm(pooled)
    np.testing.assert_allclose(doc["data"][0]["embedding"], unit, atol=TOL, rtol=0)


def taskless_artifact(default_model: str, tmp_path: Path) -> Path:
    """The default artifact with the manifest of format 2 (no task, dimension, normalize)."""
    from ringserve.workers.artifact import compute_fingerprint

    from devkit.models import old_artifact

    old = old_artifact(default_model, tmp_path)
    raw = json.loads((old / "manifest.json").read_text())
    assert "task" in raw  # the helper copies today's manifest: take the new fields out
    for key in ("task", "dimension", "normalize"):
        del raw[key]
    (old / "manifest.json").write_text(json.dumps(raw))
    raw["fingerprint"] = compute_fingerprint(old)
    (old / "manifest.json").write_text(json.dumps(raw))
    return old


def test_an_artifact_without_a_task_classifies_only(
    start_server: Any, default_model: str, tmp_path: Path
) -> None:
    """An artifact built before format 3 (no `task` in its manifest) serves as before, and an
    embedding request is told what the model does."""
    old = taskless_artifact(default_model, tmp_path)
    srv = start_server("--model", str(old), "--workers", "1", "--spares", "0", workers=1)
    status, doc = post(srv, "/v1/embeddings", {"input": "ok"})
    assert status == 400 and "does not embed; its tasks: classify" in error_message(doc), doc
    assert srv.classify("a fine film")["label"] in ("negative", "positive")
    _, _, data = srv.request("GET", "/v1/model")
    assert json.loads(data)["task"] == ["classify"] and json.loads(data)["dimension"] == 0


def test_batch_task_embed_writes_the_vectors_in_order(
    tmp_path: Path, server: ServerProc, default_model: str
) -> None:
    """`ringserve batch --task embed`: one {"embedding": [...]} a line in input order, the same
    vectors as /v1/embeddings; a bad line is an error line; a model that does not embed is
    refused before any work."""
    import subprocess
    import sys

    from devkit.launcher import ROOT

    texts = [*TEXTS, "", "a dull, lifeless mess"]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "ringserve.service.cli", "batch", "--input", str(src), "--output",
           str(out), "--workers", "1", "--task", "embed"]  # fmt: skip
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == len(texts) and "error" in lines[4]
    good = [t for t in texts if t]
    status, doc = post(server, "/v1/embeddings", {"input": good})
    assert status == 200, doc
    want = [d["embedding"] for d in doc["data"]]
    got = [x["embedding"] for i, x in enumerate(lines) if i != 4]
    np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-6, rtol=0)
    matrix = tmp_path / "out.npy"  # the same vectors as one [N, D] matrix, NaN for a bad line
    run = subprocess.run([*cmd[:-5], str(matrix), *cmd[-4:]], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    m = np.load(matrix)
    assert m.shape == (len(texts), 384) and m.dtype == np.float32
    assert np.isnan(m[4]).all() and json.loads(run.stderr.strip().splitlines()[-1])["errors"] == 1
    np.testing.assert_allclose(np.delete(m, 4, axis=0), np.array(want), atol=1e-6, rtol=0)
    old = taskless_artifact(default_model, tmp_path)
    run = subprocess.run([*cmd, "--model", str(old)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert run.returncode == 2 and "does not embed; its tasks: classify" in run.stderr, run.stderr


def test_the_cuda_code_path_embeds(start_server: Any, want: Any) -> None:
    """The CUDA runner (graphs, buckets, the CPU fallback) on the test-only fake GPU, which runs
    the same code on the CPU: it is handed the joined module, so its one output carries both."""
    srv = start_server("--device", "fake-gpu", "--workers", "1", "--spares", "0",
                       env={"RINGSERVE_TEST_FAKE_GPU": "1"}, workers=1)  # fmt: skip
    status, doc = post(srv, "/embed", {"inputs": TEXTS})
    assert status == 200, doc
    np.testing.assert_allclose(np.array(doc), want[1], atol=TOL, rtol=0)
    answer = srv.classify(TEXTS)
    assert len(answer["results"]) == len(TEXTS)


def test_stats_and_metrics_count_embeddings(server: ServerProc) -> None:
    """Every route that embeds counts its texts under task embed, in /v1/stats and /metrics;
    a classification on the same model counts under classify."""

    def counts() -> dict[str, int]:
        _, _, data = server.request("GET", "/v1/stats")
        tasks: dict[str, int] = json.loads(data)["totals"]["tasks"]
        return tasks

    before = counts()
    assert post(server, "/v1/embeddings", {"input": ["a", "b", "c"]})[0] == 200
    assert post(server, "/embed", {"inputs": "d"})[0] == 200
    infer = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["e", "f"]}],
             "outputs": [{"name": "embedding"}]}  # fmt: skip
    assert post(server, "/v2/models/sst2-minilm/infer", infer)[0] == 200
    server.classify(["g", "h", "i", "j"])
    after = counts()
    assert after["embed"] - before["embed"] == 6
    assert after["classify"] - before["classify"] == 4
    _, _, data = server.request("GET", "/metrics")
    line = f'ringserve_task_texts_total{{task="embed"}} {after["embed"]}'
    assert line in data.decode(), data.decode()[:2000]


def test_a_worker_refuses_a_response_ring_too_small_for_its_embeddings() -> None:
    from ringserve.workers.process.served import check_answer_room

    check_answer_room(8192 * 64 - 32, 1024)  # the default ring holds 1,024 floats easily
    with pytest.raises(RuntimeError, match="1024-float embeddings need 4120 bytes"):
        check_answer_room(8000, 1024)
