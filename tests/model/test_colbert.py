"""ColBERT (multivector) models against PyLate, end to end: a tiny random ColBERT saved by PyLate
(and the same weights in Stanford ColBERT's layout), exported with `ringserve export --from` and
served. /v1/embeddings/multi must equal PyLate's `encode` of the queries and of the documents
within 1e-4, and the rerank routes (TEI's /rerank, Cohere's /v1/rerank and /v2/rerank, KServe's
infer over HTTP and gRPC) PyLate's `rank.rerank`: the same order, the same MaxSim scores.

PyLate runs in the venv `make install-test` builds for it (.venv-pylate: its pins are not the
test extra's), through devkit/pylate_colbert.py; this module never imports it.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ringserve.factory import export
from ringserve.factory.build import default_encoder_dir
from ringserve.workers.artifact import ArtifactError, load_manifest

from devkit.server import ServerProc, serving

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / os.environ.get("PYLATE_VENV", ".venv-pylate")
PYLATE = VENV / "bin" / "python"
TOL = 1e-4
QUERY_LENGTH, DOCUMENT_LENGTH = 16, 32
QUERIES = [
    "what is a film?",
    "cats",
    "a query that is much longer than the sixteen tokens a query may hold, so it is cut",
]
DOCUMENTS = [
    "a film is a movie, shown in a cinema.",
    "a cat sleeps!",
    "the quick brown fox jumps over the lazy dog; and keeps running (far away) into the woods, "
    "where nobody ever finds it again, not even the hunters",  # over document_length: cut
    "ok",
]
SPEC = {
    "seed": 0,
    "config": {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 37,
        "max_position_embeddings": 64,
        "initializer_range": 0.4,  # wide: HF's default makes every token's vector about the same
    },
    "embedding_size": 24,
    "query_length": QUERY_LENGTH,
    "document_length": DOCUMENT_LENGTH,
    "queries": QUERIES,
    "documents": DOCUMENTS,
}
LAYOUTS = ("pylate", "stanford")


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PyLate's checkpoints and its answers (devkit/pylate_colbert.py), in its own venv."""
    if not (VENV / ".installed").is_file():
        pytest.skip(f"{VENV} is not built: `make install-test` builds it")
    root = tmp_path_factory.mktemp("colbert")
    spec = root / "spec.json"
    spec.write_text(json.dumps(SPEC | {"tokenizer": str(default_encoder_dir())}))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    script = ROOT / "devkit" / "pylate_colbert.py"
    # -P: devkit/ is not put first on the path (its http.py would hide the standard library's)
    done = subprocess.run(
        [str(PYLATE), "-P", str(script), str(spec), str(root)],
        capture_output=True, text=True, timeout=240, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return root


@pytest.fixture(scope="module")
def artifacts(made: Path) -> dict[str, Path]:
    """Each layout exported with `ringserve export --from`."""
    out = {}
    for layout in LAYOUTS:
        art = made / f"{layout}-art"
        argv = ["--from", str(made / layout), "--out", str(art), "--name", f"colbert-{layout}"]
        assert export.main(argv) == 0
        out[layout] = art
    return out


@pytest.fixture(scope="module")
def srv(
    tmp_path_factory: pytest.TempPathFactory, artifacts: dict[str, Path]
) -> Iterator[ServerProc]:
    models = [a for k in LAYOUTS for a in ("--model", f"colbert-{k}={artifacts[k]}")]
    with serving(
        ServerProc(tmp_path_factory.mktemp("srv"), [*models, "--workers", "1"], grpc=True), 1
    ) as server:
        yield server


def reference(made: Path, layout: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((made / f"{layout}.json").read_text())
    return loaded


def post(server: ServerProc, path: str, body: Any) -> tuple[int, Any]:
    status, _, data = server.request("POST", path, json.dumps(body))
    return status, json.loads(data)


def close(got: Any, want: Any) -> float:
    """The largest difference of two matrices of one shape (an AssertionError otherwise)."""
    a, b = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a - b).max())


def test_manifest_says_what_the_worker_needs(artifacts: dict[str, Path]) -> None:
    m = load_manifest(artifacts["pylate"])
    assert m.task == ["multivector", "rerank"] and m.labels == [] and m.dimension == 0
    mv = m.multivector
    assert (mv["query_length"], mv["document_length"], mv["dimension"]) == (16, 32, 24)
    assert (mv["query_prefix"], mv["document_prefix"]) == ("[Q] ", "[D] ")
    assert mv["do_query_expansion"] and not mv["attend_to_expansion_tokens"]
    assert mv["expansion_id"] == 103 and len(mv["skiplist_ids"]) == 32  # [MASK]; punctuation
    stanford = load_manifest(artifacts["stanford"]).multivector
    assert stanford["format"] == "stanford"
    assert (stanford["query_prefix_id"], stanford["document_prefix_id"]) == (1, 2)  # [unused0/1]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_multi_embeddings_equal_pylate_encode(srv: ServerProc, made: Path, layout: str) -> None:
    """Queries (prefix, [MASK] expansion to query_length, one cut) and documents (prefix,
    punctuation left out, one cut at document_length) equal PyLate's encode within 1e-4."""
    ref = reference(made, layout)
    for kind, texts, want in (("query", QUERIES, ref["queries"]), ("document", DOCUMENTS,
                                                                   ref["documents"])):  # fmt: skip
        body = {"input": texts, "input_type": kind, "model": f"colbert-{layout}"}
        status, got = post(srv, "/v1/embeddings/multi", body)
        assert status == 200, got
        assert [d["index"] for d in got["data"]] == list(range(len(texts)))
        for item, expected in zip(got["data"], want, strict=True):
            assert close(item["embedding"], expected) < TOL
    assert [len(q) for q in ref["queries"]] == [QUERY_LENGTH] * 3  # expanded, or cut to it
    assert len(ref["documents"][2]) < DOCUMENT_LENGTH  # cut, then its punctuation left out


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rerank_equals_pylate_rank(srv: ServerProc, made: Path, layout: str) -> None:
    """TEI's /rerank, Cohere's /v1/rerank and /v2/rerank: PyLate's rank.rerank order and scores
    (here every query token's best match is positive, so PyLate's zero padding, which floors a
    shorter document's maxima at 0, changes nothing: rank equals each pair scored alone)."""
    ref = reference(made, layout)
    model = f"colbert-{layout}"
    for q, query in enumerate(QUERIES):
        want = ref["rank"][q]
        assert close([h["score"] for h in want], sorted(ref["alone"][q], reverse=True)) < TOL
        order = [h["id"] for h in want]
        scores = [h["score"] for h in want]
        status, tei = post(srv, "/rerank", {"query": query, "texts": DOCUMENTS, "model": model})
        assert status == 200, tei
        assert [h["index"] for h in tei] == order
        assert close([h["score"] for h in tei], scores) < TOL
        for path in ("/v1/rerank", "/v2/rerank"):
            body = {"query": query, "documents": DOCUMENTS, "model": model, "top_n": 3}
            status, doc = post(srv, path, body)
            assert status == 200, doc
            assert [h["index"] for h in doc["results"]] == order[:3]
            assert close([h["relevance_score"] for h in doc["results"]], scores[:3]) < TOL


def test_kserve_scores_each_pair_by_maxsim(srv: ServerProc, made: Path) -> None:
    """KServe's infer, HTTP and gRPC: `text` the queries, `text_pair` the documents, `scores`
    [N, 1] each pair's MaxSim, as PyLate scores the pair."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    ref = reference(made, "pylate")
    pairs = [(q, d) for q in range(len(QUERIES)) for d in range(len(DOCUMENTS))]
    want = np.array([[ref["alone"][q][d]] for q, d in pairs])
    texts = np.array([[QUERIES[q].encode()] for q, _ in pairs], dtype=object)
    docs = np.array([[DOCUMENTS[d].encode()] for _, d in pairs], dtype=object)
    for module, address in ((httpclient, srv.url[7:]), (grpcclient, f"127.0.0.1:{srv.grpc_port}")):
        client: Any = module.InferenceServerClient(address)
        inputs = [module.InferInput("text", [len(pairs), 1], "BYTES"),
                  module.InferInput("text_pair", [len(pairs), 1], "BYTES")]  # fmt: skip
        inputs[0].set_data_from_numpy(texts)
        inputs[1].set_data_from_numpy(docs)
        result = client.infer("colbert-pylate", inputs)
        assert close(result.as_numpy("scores"), want) < TOL
        meta = client.get_model_metadata("colbert-pylate")
        outputs = (
            meta["outputs"] if isinstance(meta, dict) else [{"name": o.name} for o in meta.outputs]
        )
        assert [o["name"] for o in outputs] == ["scores"]
        client.close()
    status, doc = post(srv, "/v2/models/colbert-pylate/infer", {"inputs": [
        {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["alone"]}]})  # fmt: skip
    assert status == 400 and "text_pair" in doc["error"]


def test_refusals(srv: ServerProc) -> None:
    """What a ColBERT model does not do, and a document over document_length with truncate
    false."""
    status, doc = post(srv, "/v1/embeddings", {"input": "a film", "model": "colbert-pylate"})
    assert status == 400 and "does not embed" in doc["error"]["message"]
    status, doc = post(srv, "/v1/classify", {"text": "a film", "model": "colbert-pylate"})
    assert status == 400 and "does not classify" in doc["error"]
    body = {"input": DOCUMENTS[2], "input_type": "document", "truncate": False,
            "model": "colbert-pylate"}  # fmt: skip
    status, doc = post(srv, "/v1/embeddings/multi", body)
    assert status == 413 and doc["max_length"] == DOCUMENT_LENGTH, doc
    status, doc = post(srv, "/v1/embeddings/multi", {"input": "x", "input_type": "passage",
                                                     "model": "colbert-pylate"})  # fmt: skip
    assert status == 400


def test_export_refuses_what_it_cannot_serve_exactly(made: Path, tmp_path: Path) -> None:
    """--pooling with a ColBERT, and --max-length under 3, are refused by name."""
    source = str(made / "pylate")
    assert export.main(["--from", source, "--out", str(tmp_path / "a"), "--pooling", "mean"]) == 1
    with pytest.raises(ArtifactError, match="at least 3"):
        from ringserve.factory.build import build_hf_artifact

        build_hf_artifact(tmp_path / "b", source, "b", max_length=2)


def test_answers_match_the_servers_document(srv: ServerProc) -> None:
    """/v1/embeddings/multi's answer and Cohere's unbounded MaxSim relevance_score, as the
    server's own /openapi.json states them (the Schemathesis fuzz is tests/system/test_openapi.py's,
    on the default model)."""
    import jsonschema

    status, _, data = srv.request("GET", "/openapi.json")
    assert status == 200
    doc = json.loads(data)

    def schema(path: str) -> Any:
        answer = doc["paths"][path]["post"]["responses"]["200"]["content"]["application/json"]
        return {**answer["schema"], "components": doc["components"]}

    body = {"input": QUERIES[:2], "input_type": "query", "model": "colbert-pylate"}
    status, got = post(srv, "/v1/embeddings/multi", body)
    assert status == 200
    jsonschema.validate(got, schema("/v1/embeddings/multi"))
    body = {"query": QUERIES[0], "documents": DOCUMENTS, "model": "colbert-pylate"}
    status, got = post(srv, "/v2/rerank", body)
    assert status == 200 and got["results"][0]["relevance_score"] > 1  # MaxSim, not a probability
    jsonschema.validate(got, schema("/v2/rerank"))
