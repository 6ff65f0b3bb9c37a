"""The serving path end to end: a real server process, the real default model, real sockets."""

from __future__ import annotations

import json
import random
import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from ringserve.workers.artifact import load_tokenizer, onnx_available, reference_logits

from devkit.server import ServerProc, segments_of


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def bucket_texts(default_model: str, agnews_texts: list[str], sst2_texts: list[str]) -> dict:
    """Real texts whose token counts fall in each bucket (64, 128, 256 and truncated)."""
    tok = load_tokenizer(default_model, 100_000)
    by_bucket: dict[str, list[str]] = {"64": [], "128": [], "256": [], "long": []}
    pool = sst2_texts[:200] + agnews_texts[:200]
    rng = random.Random(7)
    for _ in range(400):
        k = rng.choice([1, 1, 2, 3, 5, 8])
        text = " ".join(rng.sample(pool, k))
        n = len(tok.encode(text).ids)
        key = "64" if n <= 64 else "128" if n <= 128 else "256" if n <= 256 else "long"
        if len(by_bucket[key]) < 6:
            by_bucket[key].append(text)
    assert all(len(v) >= 3 for v in by_bucket.values()), {k: len(v) for k, v in by_bucket.items()}
    return by_bucket


def test_default_model_answers_the_readme_example(shared_server: ServerProc) -> None:
    status, headers, body = shared_server.request(
        "POST", "/v1/classify", '{"text":"a gripping, beautiful film"}'
    )
    assert status == 200
    doc = json.loads(body)
    assert doc["label"] == "positive" and doc["label_id"] == 1
    assert len(doc["scores"]) == 2 and abs(sum(doc["scores"]) - 1) < 1e-5
    assert headers["x-request-id"]
    latency = headers["x-latency-ms"]
    assert float(latency) >= 0 and "." in latency and len(latency.split(".")[1]) == 1


def test_request_id_is_echoed_and_checked(shared_server: ServerProc) -> None:
    _, headers, _ = shared_server.request(
        "POST", "/v1/classify", {"text": "fine"}, headers={"X-Request-Id": "abc-123.x"}
    )
    assert headers["x-request-id"] == "abc-123.x"
    _, headers, _ = shared_server.request(
        "POST", "/v1/classify", {"text": "fine"}, headers={"X-Request-Id": "bad id\x7f<script>"}
    )
    assert headers["x-request-id"] != "bad id\x7f<script>" and "<" not in headers["x-request-id"]


def test_model_endpoint(shared_server: ServerProc, default_model: str) -> None:
    status, _, body = shared_server.request("GET", "/v1/model")
    assert status == 200
    doc = json.loads(body)
    manifest = json.loads((__import__("pathlib").Path(default_model) / "manifest.json").read_text())
    assert doc["name"] == manifest["name"]
    assert doc["labels"] == ["negative", "positive"]
    assert doc["fingerprint"] == manifest["fingerprint"]
    assert doc["max_length"] == 256 and doc["buckets"] == []  # CPU: padded to own longest
    assert doc["length_classes"] == [16, 32, 48, 64, 96, 128, 192, 256]
    # auto: ONNX Runtime on the CPU (measured faster) when the artifact has it
    assert doc["device"] == "cpu" and doc["runtime"] == ("onnx" if onnx_available() else "torch")


def test_served_scores_equal_reference_alone_and_mixed(
    shared_server: ServerProc, default_model: str, bucket_texts: dict
) -> None:
    texts = [t for group in bucket_texts.values() for t in group]
    expected = softmax(reference_logits(default_model, texts))
    # Alone: one request per text.
    alone = [shared_server.classify(t)["scores"] for t in texts]
    np.testing.assert_allclose(np.array(alone), expected, atol=1e-5, rtol=0)
    # Mixed: one batch request holding every length, shuffled, and concurrent singles so the
    # workers batch texts of other lengths and other clients together.
    order = list(range(len(texts)))
    random.Random(3).shuffle(order)
    mixed = shared_server.classify([texts[i] for i in order])["results"]
    for pos, i in enumerate(order):
        np.testing.assert_allclose(mixed[pos]["scores"], expected[i], atol=1e-5, rtol=0)
    with ThreadPoolExecutor(16) as pool:
        concurrent = list(pool.map(lambda t: shared_server.classify(t)["scores"], texts * 3))
    np.testing.assert_allclose(np.array(concurrent), np.tile(expected, (3, 1)), atol=1e-5, rtol=0)


def test_batch_keeps_order_and_labels(shared_server: ServerProc, sst2_texts: list[str]) -> None:
    texts = sst2_texts[:256]
    results = shared_server.classify(texts)["results"]
    assert len(results) == 256
    singles = [shared_server.classify(t) for t in texts[:20]]
    for a, b in zip(results[:20], singles, strict=True):
        assert a["label"] == b["label"]
        np.testing.assert_allclose(a["scores"], b["scores"], atol=1e-5, rtol=0)


def test_keep_alive_and_pipelining(shared_server: ServerProc) -> None:
    import socket

    body = b'{"text": "a gripping, beautiful film"}'
    req = (
        b"POST /v1/classify HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n" % len(body)
    ) + body
    with socket.create_connection(("127.0.0.1", shared_server.port), timeout=30) as s:
        s.sendall(req * 5 + b"GET /v1/model HTTP/1.1\r\nHost: localhost\r\n\r\n")
        data = b""
        while data.count(b"HTTP/1.1 200") < 6 or not data.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
    labels = [m.start() for m in re.finditer(rb'"label":\s*"positive"', data)]  # any spacing
    assert len(labels) == 5
    assert data.rfind(b'"fingerprint"') > labels[-1]  # order kept


def test_server_exits_clean(start_server) -> None:
    srv = start_server("--workers", "1", "--spares", "1")
    srv.wait_spares(1)
    pid = srv.pid
    kids = srv.children()
    assert len(kids) >= 2 and segments_of(pid)
    assert srv.stop() == 0  # stop() also checks no child process and no segment is left
    assert not segments_of(pid)
    assert not any(k.is_running() and k.status() != "zombie" for k in kids)
