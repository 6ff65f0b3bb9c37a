"""Sparse (SPLADE) models served: a tiny random BertForMaskedLM exported with `--pooling splade`
and a sentence-transformers SparseEncoder directory, both on one real server, answer TEI's
/embed_sparse and ringserve's /v1/embeddings/sparse equal to `SparseEncoder.encode` of the same
directory (1e-4, the terms exactly), to a plain POST as TEI's users send it (huggingface_hub's
InferenceClient has no sparse call), and give KServe's sparse outputs to tritonclient over HTTP
and gRPC."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from ringserve.wire.client import BinaryClient
from ringserve.wire.frames import BAD_REQUEST

from devkit.builds import plain_builds
from devkit.hfmodels import NEWS, SST2
from devkit.openapi_checks import fuzz, summary
from devkit.server import ServerProc, serving
from devkit.sparse_models import encode, reference, save_mlm, save_sparse_encoder

pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")
pytestmark = pytest.mark.timeout(400)
TOL = 1e-4
# accents, CJK and emoji; a text past max_length (cut, as SparseEncoder cuts it); a batch of
# mixed lengths
TEXTS = ["ok", "Crème brûlée in Zürich — naïve café 東京 🎬", SST2[7], NEWS[4] * 3, SST2[9]]
MODELS = ("mlm", "st")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sparse-src")
    mlm = save_mlm("bert", root, seed=5)
    return {"mlm": mlm, "st": save_sparse_encoder(save_mlm("bert", root / "b", seed=9), root)}


@pytest.fixture(scope="module")
def artifacts(
    tmp_path_factory: pytest.TempPathFactory, sources: dict[str, Path]
) -> dict[str, Path]:
    from ringserve.factory import export

    root = tmp_path_factory.mktemp("sparse-art")
    for name, source in sources.items():
        extra = ["--pooling", "splade"] if name == "mlm" else []
        with plain_builds():
            assert export.main(["--from", str(source), "--out", str(root / name), *extra]) == 0
    return {name: root / name for name in sources}


@pytest.fixture(scope="module")
def srv(
    tmp_path_factory: pytest.TempPathFactory, artifacts: dict[str, Path]
) -> Iterator[ServerProc]:
    args = [a for name, art in artifacts.items() for a in ("--model", f"{name}={art}")]
    args += ["--workers", "1", "--spares", "0"]
    server = ServerProc(tmp_path_factory.mktemp("sparse-srv"), args, grpc=True)
    with serving(server, 1) as s:
        yield s


@pytest.fixture(scope="module")
def want(sources: dict[str, Path]) -> dict[str, np.ndarray]:
    return {name: encode(reference(source), TEXTS) for name, source in sources.items()}


def post(server: ServerProc, path: str, body: Any) -> tuple[int, Any]:
    status, _, data = server.request("POST", path, json.dumps(body))
    return status, json.loads(data)


def dense(pairs: list[tuple[list[int], list[float]]], width: int) -> np.ndarray:
    out = np.zeros((len(pairs), width))
    for row, (ids, values) in enumerate(pairs):
        assert ids == sorted(ids) and len(set(ids)) == len(ids)  # ids ascending, once each
        out[row, ids] = values
    return out


def assert_equal(got: np.ndarray, want: np.ndarray) -> None:
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(np.flatnonzero(g), np.flatnonzero(w))
    assert np.abs(got - want).max() < TOL


@pytest.mark.parametrize("model", MODELS)
def test_embed_sparse_equals_sparse_encoder(
    srv: ServerProc, want: dict[str, np.ndarray], model: str
) -> None:
    status, doc = post(srv, "/embed_sparse", {"inputs": TEXTS, "model": model})
    assert status == 200, doc
    pairs = [([t["index"] for t in row], [t["value"] for t in row]) for row in doc]
    assert_equal(dense(pairs, want[model].shape[1]), want[model])
    status, one = post(srv, "/embed_sparse", {"inputs": TEXTS[1], "model": model})
    assert status == 200 and one == [doc[1]]  # one text: still a list of lists, as TEI's


@pytest.mark.parametrize("model", MODELS)
def test_ours_equals_sparse_encoder_and_prunes(
    srv: ServerProc, want: dict[str, np.ndarray], artifacts: dict[str, Path], model: str
) -> None:
    status, doc = post(srv, "/v1/embeddings/sparse", {"input": TEXTS, "model": model})
    assert status == 200, doc
    assert doc["object"] == "list" and doc["model"] == model
    assert [d["index"] for d in doc["data"]] == list(range(len(TEXTS)))
    assert doc["usage"]["prompt_tokens"] > len(TEXTS)
    width = want[model].shape[1]
    assert_equal(dense([(d["indices"], d["values"]) for d in doc["data"]], width), want[model])
    body = {"input": TEXTS, "model": model, "top_k": 5, "threshold": 0.05, "return_tokens": True}
    status, cut = post(srv, "/v1/embeddings/sparse", body)
    assert status == 200, cut
    for d, row in zip(cut["data"], want[model], strict=True):
        kept = row[row > 0.05]
        heaviest = np.sort(kept)[::-1][:5]
        assert np.allclose(sorted(d["values"], reverse=True), heaviest, atol=TOL)
        assert d["indices"] == sorted(d["indices"]) and len(d["tokens"]) == len(d["indices"])
    vocab = json.loads((artifacts[model] / "tokenizer.json").read_text())["model"]["vocab"]
    by_id = {i: t for t, i in vocab.items()}
    for d in cut["data"]:
        assert [by_id[i] for i in d["indices"]] == d["tokens"]


def test_a_plain_post_as_tei_users_send_it(srv: ServerProc, want: dict[str, np.ndarray]) -> None:
    """TEI's clients post `{"inputs": ...}` to /embed_sparse (huggingface_hub 0.3x-2.x has no
    sparse method on InferenceClient); `truncate` and `truncation_direction` as TEI takes them."""
    url = f"http://127.0.0.1:{srv.port}/embed_sparse"
    body = {"inputs": TEXTS[:2], "truncate": True, "truncation_direction": "right", "model": "st"}
    answer = httpx.post(url, json=body, timeout=30)
    assert answer.status_code == 200
    rows = answer.json()
    got = dense([([t["index"] for t in r], [t["value"] for t in r]) for r in rows], 30522)
    assert_equal(got, want["st"][:2])
    refused = httpx.post(url, json={"inputs": NEWS[4] * 3, "truncate": False, "model": "st"})
    assert refused.status_code == 413


def test_info_and_models_say_sparse(srv: ServerProc) -> None:
    _, _, data = srv.request("GET", "/v1/models")
    rows = {m["name"]: m for m in json.loads(data)["models"]}
    assert rows["mlm"]["task"] == ["sparse"] == rows["st"]["task"]
    _, _, data = srv.request("GET", "/info")  # TEI's: the first model
    info = json.loads(data)
    assert info["model_type"] == {"embedding": {"pooling": "splade"}}
    assert info["tasks"] == ["sparse"]


def test_other_tasks_are_refused_by_name(srv: ServerProc) -> None:
    status, doc = post(srv, "/v1/embeddings", {"input": "a film", "model": "st"})
    assert status == 400 and "does not embed" in json.dumps(doc)
    status, doc = post(srv, "/v1/classify", {"text": "a film", "model": "st"})
    assert status == 400


def kserve_rows(indices: Any, values: Any, lengths: Any) -> list[tuple[list[int], list[float]]]:
    ends = np.cumsum(lengths)
    starts = ends - lengths
    return [
        (indices[a:b].tolist(), values[a:b].tolist()) for a, b in zip(starts, ends, strict=True)
    ]


@pytest.mark.parametrize("binary", [True, False])
def test_kserve_http_gives_tritonclient_the_sparse_outputs(
    srv: ServerProc, want: dict[str, np.ndarray], binary: bool
) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{srv.port}")
    meta = client.get_model_metadata("st")
    assert [o["name"] for o in meta["outputs"]] == [
        "sparse_indices", "sparse_values", "sparse_lengths",
    ]  # fmt: skip
    text = httpclient.InferInput("text", [len(TEXTS)], "BYTES")
    text.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=object), binary)
    outputs = [
        httpclient.InferRequestedOutput(n, binary_data=binary)
        for n in ("sparse_indices", "sparse_values", "sparse_lengths")
    ]
    result = client.infer("st", [text], outputs=outputs)
    lengths = result.as_numpy("sparse_lengths")
    assert lengths.dtype == np.int32 and lengths.shape == (len(TEXTS),)
    rows = kserve_rows(result.as_numpy("sparse_indices"), result.as_numpy("sparse_values"), lengths)
    assert_equal(dense(rows, want["st"].shape[1]), want["st"])


def test_kserve_grpc_gives_tritonclient_the_sparse_outputs(
    srv: ServerProc, want: dict[str, np.ndarray]
) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
    try:
        text = grpcclient.InferInput("text", [len(TEXTS)], "BYTES")
        text.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=object))
        result = client.infer("mlm", [text])  # no outputs named: all three
        rows = kserve_rows(
            result.as_numpy("sparse_indices"),
            result.as_numpy("sparse_values"),
            result.as_numpy("sparse_lengths"),
        )
        assert_equal(dense(rows, want["mlm"].shape[1]), want["mlm"])
    finally:
        client.close()


def test_schemathesis_on_the_sparse_routes(srv: ServerProc, tmp_path: Path) -> None:
    """The OpenAPI document's sparse routes and KServe's infer on a sparse model, fuzzed by
    Schemathesis from the document (tests/system/test_openapi.py's checks, and its default
    12 examples an operation beside the coverage phase's cases)."""
    base = f"http://127.0.0.1:{srv.port}"
    run = fuzz(f"{base}/openapi.json", 12, tmp_path, "--include-path-regex",
               r"^/(embed_sparse|v1/embeddings/sparse|v2/models/\{model\}/infer)$")  # fmt: skip
    assert run.returncode == 0, summary(run)
    assert srv.request("GET", "/health")[0] == 200


def test_binary_frames_are_refused_with_status_1(srv: ServerProc) -> None:
    """A frame's answer carries floats, not terms: a sparse model answers it status 1, and the
    server serves on."""
    with BinaryClient("127.0.0.1", srv.binary_port, timeout=30) as client:
        answers = client.classify_many(["a film", "a cat"])
    assert [a.status for a in answers] == [BAD_REQUEST, BAD_REQUEST]
    assert post(srv, "/embed_sparse", {"inputs": "a film", "model": "mlm"})[0] == 200
