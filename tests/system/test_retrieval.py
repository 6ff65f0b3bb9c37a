"""What a retrieval stack asks of an embedder (issue 59, items 2-4), on a real server of a tiny
sentence-transformers embedder exported at test time (devkit/embedders.py): compact vectors
through Cohere's own ClientV2 and against sentence-transformers' `quantize_embeddings`, late
chunking against transformers' own token states, and the answer cache across a reload."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from devkit.embedders import export_tiny_embedder
from devkit.launcher import DATA
from devkit.server import ServerProc, serving, wait_for

transformers = pytest.importorskip("transformers")
st_util = pytest.importorskip("sentence_transformers.util")

pytestmark = pytest.mark.timeout(300)
TOL = 1e-4
_NEWS = (DATA / "ag_news" / "sample.tsv").read_text(encoding="utf-8").splitlines()[1:40]
NEWS = [r.split("\t")[0] for r in _NEWS]
TEXTS = ["a gripping, beautiful film", "Crème brûlée in Zürich — naïve café", NEWS[0]]
CHUNKS = ["The match was delayed by rain.", "Fans waited for hours,", "then went home."]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the sentence-transformers directory, its artifact)."""
    return export_tiny_embedder(tmp_path_factory.mktemp("tiny-embed"))


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, tiny: tuple[Path, Path]) -> Iterator[ServerProc]:
    args = ["--model", str(tiny[1]), "--runtime", "onnx", "--workers", "1", "--spares", "0"]
    args += ["--grpc-port", "0", "--binary-port", "0"]
    with serving(ServerProc(tmp_path_factory.mktemp("retrieval"), args), 1) as server:
        yield server


def post(srv: ServerProc, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    status, _, data = srv.request("POST", path, body)
    return status, json.loads(data)


def ranges_of(artifact: Path) -> np.ndarray:
    stored = json.loads((artifact / "manifest.json").read_text())["extra"]["compact"]
    return np.array([stored["calibration"]["min"], stored["calibration"]["max"]], np.float32)


# -- compact vectors ---------------------------------------------------------------------------
def test_cohere_client_gets_all_five_types_as_sentence_transformers_cuts_them(
    srv: ServerProc, tiny: tuple[Path, Path]
) -> None:
    cohere = pytest.importorskip("cohere")
    quantize = st_util.quantize_embeddings
    with httpx.Client() as http:
        base = f"http://127.0.0.1:{srv.port}"
        co = cohere.ClientV2(api_key="-", base_url=base, httpx_client=http)
        got = co.embed(
            texts=TEXTS, model="tiny-embed", input_type="search_document",
            embedding_types=["int8", "uint8", "binary", "ubinary", "float"],
        )  # fmt: skip
    e = got.embeddings
    floats = np.array(e.float_, dtype=np.float32)  # the served vectors, exact in JSON
    # the stored calibration, as sentence-transformers takes it: its ranges are their min, max
    calibration = ranges_of(tiny[1])
    for kind in ("int8", "uint8", "binary", "ubinary"):
        want = quantize(floats, kind, calibration_embeddings=calibration)
        np.testing.assert_array_equal(np.array(getattr(e, kind)), want, err_msg=kind)
    assert np.array(e.binary).shape == (3, 4) and np.array(e.int8).shape == (3, 32)


def test_openai_and_tei_encodings_are_the_same_vectors(srv: ServerProc) -> None:
    _, cohere = post(srv, "/v2/embed", {"texts": TEXTS, "embedding_types": ["int8", "ubinary"]})
    for fmt in ("int8", "ubinary"):
        status, doc = post(srv, "/v1/embeddings", {"input": TEXTS, "encoding_format": fmt})
        assert status == 200, doc
        assert [d["embedding"] for d in doc["data"]] == cohere["embeddings"][fmt]
        status, rows = post(srv, "/embed", {"inputs": TEXTS, "encoding_format": fmt})
        assert status == 200 and rows == cohere["embeddings"][fmt]


def test_calibrated_types_refuse_vectors_they_were_not_calibrated_on(srv: ServerProc) -> None:
    status, doc = post(srv, "/v1/embeddings", {"input": "a", "encoding_format": "int8",
                                               "dimensions": 8})  # fmt: skip
    assert status == 400 and "whole vectors" in doc["error"]["message"], doc
    raw = {"inputs": "a", "encoding_format": "uint8", "normalize": False}
    status, doc = post(srv, "/embed", raw)
    assert status == 400 and "normalize true" in doc["error"], doc
    status, doc = post(srv, "/v1/embeddings", {"input": "a", "encoding_format": "binary",
                                               "dimensions": 8})  # fmt: skip
    assert status == 200 and len(doc["data"][0]["embedding"]) == 1, doc


def test_the_manifest_publishes_recall(srv: ServerProc) -> None:
    _, _, data = srv.request("GET", "/v1/model")
    recall = json.loads(data).get("compact", {}).get("recall_at_10", {})
    assert set(recall) >= {"int8", "int8_rescored", "binary", "binary_rescored"}, recall


# -- late chunking ---------------------------------------------------------------------------
def token_states(source: Path, text: str) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """transformers' BertModel on the text: its last hidden states and each token's characters
    (the special tokens' are (0, 0))."""
    base = source.parent / "base"  # the Transformer module's model (devkit/embedders.py)
    tokenizer = transformers.AutoTokenizer.from_pretrained(base)
    model = transformers.BertModel.from_pretrained(base).eval()
    enc = tokenizer(text, return_offsets_mapping=True, return_tensors="pt")
    with torch.no_grad():
        states = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
    offsets = [(int(a), int(b)) for a, b in enc["offset_mapping"][0].tolist()]
    return states.last_hidden_state[0].numpy(), offsets


def test_late_chunks_pool_the_joined_texts_own_token_states(
    srv: ServerProc, tiny: tuple[Path, Path]
) -> None:
    text = " ".join(CHUNKS)
    states, offsets = token_states(tiny[0], text)
    want, at = [], 0
    for chunk in CHUNKS:
        rows = [i for i, (a, b) in enumerate(offsets) if b > a and at <= a < at + len(chunk)]
        v = states[rows].mean(axis=0)
        want.append(v / np.linalg.norm(v))
        at += len(chunk) + 1
    status, doc = post(srv, "/v1/embeddings", {"input": CHUNKS, "late_chunking": True})
    assert status == 200, doc
    got = np.array([d["embedding"] for d in doc["data"]])
    np.testing.assert_allclose(got, np.array(want), atol=TOL)
    status, rows = post(srv, "/embed", {"inputs": CHUNKS, "late_chunking": True})
    assert status == 200 and np.allclose(rows, got, atol=1e-6)
    # not the chunks embedded alone: each read the others
    _, alone = post(srv, "/embed", {"inputs": CHUNKS})
    assert not np.allclose(alone, got, atol=1e-3)


def test_a_document_over_max_length_is_windowed(srv: ServerProc) -> None:
    chunks = NEWS[:12]  # about 400 tokens against max_length 64
    status, doc = post(srv, "/v1/embeddings", {"input": chunks, "late_chunking": True})
    assert status == 200, doc
    got = np.array([d["embedding"] for d in doc["data"]])
    assert got.shape == (12, 32)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    status, doc = post(srv, "/v1/embeddings", {"input": NEWS, "late_chunking": True})
    assert status == 413 and "--max-windows" in doc["error"]["message"], doc


# -- the answer cache ---------------------------------------------------------------------------
def metric(srv: ServerProc, name: str) -> float:
    _, _, data = srv.request("GET", "/metrics")
    found = re.search(rf"^{name} (\S+)$", data.decode(), re.M)
    assert found is not None, name
    return float(found.group(1))


def test_a_text_seen_before_is_answered_from_the_cache_and_a_reload_drops_it(
    srv: ServerProc,
) -> None:
    body = {"input": ["cached once, then served again", NEWS[5]]}
    first = srv.request("POST", "/v1/embeddings", body)[2]
    hits = metric(srv, "ringserve_cache_hits_total")
    again = srv.request("POST", "/v1/embeddings", body)[2]
    assert again == first and metric(srv, "ringserve_cache_hits_total") == hits + 2
    # one seen, one new, in the request's order
    mixed = json.loads(srv.request("POST", "/v1/embeddings", {"input": ["new", NEWS[5]]})[2])
    assert mixed["data"][1]["embedding"] == json.loads(first)["data"][1]["embedding"]
    assert metric(srv, "ringserve_cache_bytes") > 0
    pids = set(srv.worker_pids().values())
    assert srv.ctl({"cmd": "reload"})["ok"]
    wait_for(lambda: srv.ready_workers() == 1 and not pids & set(srv.worker_pids().values())
             and metric(srv, "ringserve_cache_entries") == 0, 60, "the roll")  # fmt: skip
    assert metric(srv, "ringserve_cache_dropped_total") >= 3
    misses = metric(srv, "ringserve_cache_misses_total")
    after = srv.request("POST", "/v1/embeddings", body)[2]
    assert after == first and metric(srv, "ringserve_cache_misses_total") == misses + 2


FORMS = [
    ("/v1/embeddings", {}),
    ("/v1/embeddings", {"encoding_format": "base64"}),
    ("/v1/embeddings", {"encoding_format": "int8"}),
    ("/v1/embeddings", {"dimensions": 8}),
    ("/embed", {}),
    ("/embed", {"normalize": False}),
    ("/embed", {"encoding_format": "ubinary"}),
    ("/v2/embed", {"embedding_types": ["float", "binary"]}),
]


def rows_of(path: str, doc: Any) -> list[Any]:
    if path == "/embed":
        return list(doc)
    if path == "/v2/embed":
        return [list(pair) for pair in zip(*doc["embeddings"].values(), strict=True)]
    return [d["embedding"] for d in doc["data"]]


def test_a_hit_is_written_as_its_first_answer_in_every_form(srv: ServerProc) -> None:
    """The cache keeps each route's JSON row of a text (service/protocols/cached.py): asked
    again, alone or among other texts in another order, every form answers the same bytes."""
    texts = [f"kept in every form {i}: {NEWS[10 + i]}" for i in range(3)]
    for path, extra in FORMS:
        field = "texts" if path == "/v2/embed" else "inputs" if path == "/embed" else "input"
        hits = metric(srv, "ringserve_cache_hits_total")
        first = srv.request("POST", path, {field: texts, **extra})[2]
        again = srv.request("POST", path, {field: texts, **extra})[2]
        rows = rows_of(path, json.loads(first))
        if path == "/v2/embed":  # its `id` is new each answer
            first, again = (
                json.dumps(json.loads(d)["embeddings"]).encode() for d in (first, again)
            )
        assert again == first, (path, extra)
        shuffled = [f"new to {path} {extra}", texts[2], texts[0]]
        status, doc = post(srv, path, {field: shuffled, **extra})
        assert status == 200, doc
        assert rows_of(path, doc)[1:] == [rows[2], rows[0]], (path, extra)
        assert metric(srv, "ringserve_cache_hits_total") >= hits + 5
