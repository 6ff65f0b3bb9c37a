"""Reranking: TEI's /rerank and Cohere's /v1/rerank on a tiny random XLM-R cross-encoder built
with `transformers` at test time, exported with `ringserve export --from`, served by a real
server, and compared with sentence-transformers' `CrossEncoder.predict` of the same directory."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ringserve.workers.artifact import load_manifest

from devkit.exports import HfExports
from devkit.hfmodels import MAX_LENGTH, NEWS, SST2
from devkit.server import ServerProc, serving, wait_for

transformers = pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")

pytestmark = pytest.mark.timeout(300)
TOL = 1e-4
NAME = "xlmr-reranker"
QUERY = "which film is worth seeing?"
DOCS = [*SST2[40:52], *NEWS[10:14]]


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory, hf_exports: HfExports) -> tuple[Path, Path]:
    """(the HF source directory, the exported artifact) of a one-output cross-encoder: exported
    once a session (devkit/exports.py, with cheap_builds: reranking is tested here, not int8's
    choice or its cost) from the source saved as devkit/hfmodels.py saves it."""
    shared, artifact = hf_exports.get(NAME)
    source = tmp_path_factory.mktemp("rerank") / "src"
    shutil.copytree(shared, source)  # the shared source stays as export read it
    # The tokenizer as `transformers` saves it too, so that CrossEncoder can load the directory.
    raw = (source / "tokenizer.json").read_bytes()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(source / "tokenizer.json"), bos_token="<s>", eos_token="</s>",
        unk_token="<unk>", pad_token="<pad>", cls_token="<s>", sep_token="</s>",
        model_max_length=MAX_LENGTH,
    )  # fmt: skip
    fast.save_pretrained(source)
    (source / "tokenizer.json").write_bytes(raw)  # as HF's own tokenizer file, unchanged
    return source, artifact


@pytest.fixture(scope="module")
def rserver(
    tmp_path_factory: pytest.TempPathFactory, reranker: tuple[Path, Path]
) -> Iterator[ServerProc]:
    with serving(
        ServerProc(
            tmp_path_factory.mktemp("rsrv"), ["--model", str(reranker[1]), "--workers", "1"]
        ),
        1,
    ) as srv:
        yield srv


def post(server: ServerProc, path: str, body: Any) -> tuple[int, Any]:
    status, _, data = server.request("POST", path, json.dumps(body))
    return status, json.loads(data)


_CROSS: dict[Path, Any] = {}


def expected(reranker: tuple[Path, Path], docs: list[str], query: str = QUERY) -> np.ndarray:
    """The cross-encoder's own scores (its sigmoid), each pair run alone."""
    from sentence_transformers import CrossEncoder

    model = _CROSS.get(reranker[0])
    if model is None:
        model = _CROSS[reranker[0]] = CrossEncoder(
            str(reranker[0]), device="cpu", max_length=MAX_LENGTH
        )
    scores = model.predict([(query, d) for d in docs], batch_size=1, convert_to_numpy=True)
    return np.asarray(scores, dtype=np.float64)


def test_the_artifact_is_a_rerank_model(reranker: tuple[Path, Path], rserver: ServerProc) -> None:
    assert load_manifest(reranker[1]).task == ["classify", "rerank"]
    _, _, data = rserver.request("GET", "/v1/model")
    assert json.loads(data)["task"] == ["classify", "rerank"]


def test_tei_rerank_scores_order_and_top_n(reranker: Any, rserver: ServerProc) -> None:
    want = expected(reranker, DOCS)
    status, doc = post(rserver, "/rerank", {"query": QUERY, "texts": DOCS})
    assert status == 200, doc
    assert sorted(r["index"] for r in doc) == list(range(len(DOCS)))
    got = np.array([r["score"] for r in doc])
    np.testing.assert_allclose(got, want[[r["index"] for r in doc]], atol=TOL, rtol=0)
    assert list(got) == sorted(got, reverse=True)  # highest first
    # the model's own order, up to near-ties (scores within the tolerance may swap)
    assert np.all(np.diff(want[[r["index"] for r in doc]]) <= TOL)
    status, top = post(rserver, "/rerank", {"query": QUERY, "texts": DOCS, "top_n": 3,
                                            "return_text": True})  # fmt: skip
    assert status == 200 and top == [r | {"text": DOCS[r["index"]]} for r in doc[:3]]
    status, raw = post(rserver, "/rerank", {"query": QUERY, "texts": DOCS, "raw_scores": True})
    assert status == 200 and [r["index"] for r in raw] == [r["index"] for r in doc]
    logits = np.log(want) - np.log1p(-want)
    np.testing.assert_allclose([r["score"] for r in raw], logits[[r["index"] for r in raw]],
                               atol=1e-3, rtol=0)  # fmt: skip


def test_cohere_rerank(reranker: Any, rserver: ServerProc) -> None:
    want = expected(reranker, DOCS)
    body = {"query": QUERY, "documents": DOCS, "top_n": 4, "return_documents": True}
    status, doc = post(rserver, "/v1/rerank", body)
    assert status == 200, doc
    results = doc["results"]
    order = [r["index"] for r in results]
    assert len(order) == 4 and np.all(np.diff(want[order]) <= TOL)
    assert np.sort(want)[::-1][4] <= want[order[-1]] + TOL  # none better left out
    np.testing.assert_allclose([r["relevance_score"] for r in results], want[order], atol=TOL)
    assert [r["document"] for r in results] == [{"text": DOCS[i]} for i in order]
    status, doc = post(rserver, "/v1/rerank", {"query": QUERY, "documents": DOCS[:2]})
    assert status == 200 and all(set(r) == {"index", "relevance_score"} for r in doc["results"])


def test_cohere_v2_client_reranks(reranker: Any, rserver: ServerProc) -> None:
    """The `cohere` SDK's ClientV2, unchanged, against /v2/rerank (its own model name)."""
    cohere = pytest.importorskip("cohere")
    import httpx

    with httpx.Client() as http:  # closed here, not left to the collector (warnings are errors)
        url = f"http://127.0.0.1:{rserver.port}"
        cohere_v2_rerank(cohere, cohere.ClientV2(api_key="-", base_url=url, httpx_client=http),
                         reranker)  # fmt: skip


def cohere_v2_rerank(cohere: Any, co: Any, reranker: Any) -> None:
    got = co.rerank(model="rerank-v3.5", query=QUERY, documents=DOCS, top_n=4)
    want = expected(reranker, DOCS)
    order = [r.index for r in got.results]
    assert len(order) == 4 and np.all(np.diff(want[order]) <= TOL), order
    assert np.sort(want)[::-1][4] <= want[order[-1]] + TOL  # none better left out
    np.testing.assert_allclose([r.relevance_score for r in got.results], want[order], atol=TOL)
    with pytest.raises(cohere.errors.BadRequestError) as refused:
        co.rerank(model="m", query=QUERY, documents=DOCS[:1], max_tokens_per_doc=10)
    assert "max_tokens_per_doc" in refused.value.body["message"]


def test_the_model_field(rserver: ServerProc) -> None:
    """TEI's /rerank: "model" names a loaded model or is 404; Cohere's /v1/rerank takes any
    name it never held (its clients send theirs) as its only model, and a loaded one's name."""
    name = json.loads(rserver.request("GET", "/v1/model")[2])["name"]
    body = {"query": QUERY, "texts": DOCS[:2]}
    assert post(rserver, "/rerank", {**body, "model": name})[0] == 200
    status, doc = post(rserver, "/rerank", {**body, "model": "nope"})
    assert status == 404 and "unknown model" in doc["error"], doc
    cohere = {"query": QUERY, "documents": DOCS[:2]}
    for model in (name, "rerank-v3.5"):
        assert post(rserver, "/v1/rerank", {**cohere, "model": model})[0] == 200
    assert post(rserver, "/v1/rerank", {**cohere, "model": name, "version": "7"})[0] == 404


def test_the_docs_bodies(reranker: Any, rserver: ServerProc) -> None:
    """The request bodies that TEI's README and Cohere's API reference show, as written."""
    tei = '{"query":"What is Deep Learning?", "texts": ["Deep Learning is not...", "Deep learning is..."]}'  # noqa: E501
    status, _, data = rserver.request("POST", "/rerank", tei)
    assert status == 200, data
    want = expected(reranker, ["Deep Learning is not...", "Deep learning is..."],
                    "What is Deep Learning?")  # fmt: skip
    got = {r["index"]: r["score"] for r in json.loads(data)}
    np.testing.assert_allclose([got[0], got[1]], want, atol=TOL)
    cohere = """{
  "model": "rerank-v3.5",
  "query": "What is the capital of the United States?",
  "top_n": 3,
  "documents": [
    "Carson City is the capital city of the American state of Nevada.",
    "The Commonwealth of the Northern Mariana Islands is a group of islands in the Pacific Ocean. Its capital is Saipan.",
    "Washington, D.C. (also known as simply Washington or D.C., and officially as the District of Columbia) is the capital of the United States. It is a federal district.",
    "Capitalization or capitalisation in English grammar is the use of a capital letter at the start of a word. English usage varies from capitalization in other languages.",
    "Capital punishment has existed in the United States since beforethe United States was a country. As of 2017, capital punishment is legal in 30 of the 50 states."
  ]
}"""  # noqa: E501
    status, _, data = rserver.request("POST", "/v1/rerank", cohere)
    assert status == 200, data
    results = json.loads(data)["results"]
    docs = json.loads(cohere)["documents"]
    want = expected(reranker, docs, "What is the capital of the United States?")
    order = [r["index"] for r in results]
    assert len(order) == 3 and np.all(np.diff(want[order]) <= TOL)
    np.testing.assert_allclose([r["relevance_score"] for r in results], want[order], atol=TOL)


BAD = [
    ("/rerank", {"query": QUERY, "texts": []}, "Expected `array` of length >= 1 - at `$.texts`"),
    ("/rerank", {"query": QUERY, "texts": ["x"] * 1025}, "of length <= 1024 - at `$.texts`"),
    ("/rerank", {"query": " ", "texts": ["x"]}, "query is empty"),
    ("/rerank", {"texts": ["x"]}, "Object missing required field `query`"),
    ("/rerank", {"query": QUERY, "texts": [{"txt": "x"}]}, "field `text` - at `$.texts[0]`"),
    ("/rerank", {"query": QUERY, "texts": ["x", ""]}, "texts[1] is empty"),
    ("/rerank", {"query": QUERY, "texts": ["x"], "top_n": 0}, "Expected `int` >= 1 - at `$.top_n`"),
    ("/v1/rerank", {"query": QUERY, "documents": "x"}, "Expected `array`, got `str`"),
    ("/v1/embeddings", {"input": "x"}, "does not embed; its tasks: classify, rerank"),
    ("/embed", {"inputs": "x"}, "does not embed"),
]


@pytest.mark.parametrize(("path", "body", "message"), BAD)
def test_bad_input_is_400(rserver: ServerProc, path: str, body: Any, message: str) -> None:
    status, doc = post(rserver, path, body)
    assert status == 400, doc
    error = doc["error"]  # OpenAI's routes: {"error": {"message", ...}}
    assert message in (error["message"] if isinstance(error, dict) else error), doc
    status, doc = post(rserver, "/rerank", {"query": QUERY, "texts": DOCS[:1]})
    assert status == 200 and len(doc) == 1


def test_a_worker_killed_during_a_256_document_rerank(reranker: Any, start_server: Any) -> None:
    """A worker is held (SIGSTOP) while it holds some of the pairs, then killed: the pairs it
    held are re-sent to the other worker and the answer comes whole and correct."""
    docs = [SST2[i % len(SST2)] for i in range(256)]
    want = expected(reranker, docs)
    srv = start_server("--model", str(reranker[1]), "--workers", "2", "--spares", "0",
                       env={"RINGSERVE_TEST_BATCH_DELAY_MS": "100"}, workers=2)  # fmt: skip
    answer: list[tuple[int, Any]] = []
    post_it = threading.Thread(
        target=lambda: answer.append(post(srv, "/rerank", {"query": QUERY, "texts": docs}))
    )
    post_it.start()
    try:
        victim = wait_for(lambda: hold_a_busy_worker(srv), 30, "a worker holding pairs")
        os.kill(victim, signal.SIGKILL)
        post_it.join(120)
    finally:
        if post_it.is_alive():
            post_it.join(60)
    ((status, doc),) = answer
    assert status == 200, doc
    assert len(doc) == 256 and sorted(r["index"] for r in doc) == list(range(256))
    got = {r["index"]: r["score"] for r in doc}
    np.testing.assert_allclose([got[i] for i in range(256)], want, atol=TOL, rtol=0)
    assert victim not in srv.worker_pids().values()


def hold_a_busy_worker(srv: ServerProc) -> int | None:
    """Stop a worker that has pairs in flight; its pid, or None (resumed) when it had none left."""
    for w in srv.status()["workers"]:
        if w["state"] == "ready" and w["inflight"] > 0:
            os.kill(w["pid"], signal.SIGSTOP)
            if any(x["pid"] == w["pid"] and x["inflight"] > 0 for x in srv.status()["workers"]):
                return int(w["pid"])
            os.kill(w["pid"], signal.SIGCONT)
    return None


def test_stats_and_metrics_count_reranked_documents(rserver: ServerProc) -> None:
    def counts() -> dict[str, int]:
        _, _, data = rserver.request("GET", "/v1/stats")
        tasks: dict[str, int] = json.loads(data)["totals"]["tasks"]
        return tasks

    before = counts()
    status, _ = post(rserver, "/rerank", {"query": QUERY, "texts": DOCS[:5]})
    assert status == 200
    status, _ = post(rserver, "/v1/classify", {"text": QUERY, "text_pair": DOCS[0]})
    assert status == 200
    after = counts()
    assert after["rerank"] - before["rerank"] == 5 and after["classify"] - before["classify"] == 1
    _, _, data = rserver.request("GET", "/metrics")
    line = f'ringserve_task_texts_total{{task="rerank"}} {after["rerank"]}'
    assert line in data.decode(), data.decode()[:2000]


def test_a_rerank_of_the_most_documents(reranker: Any, rserver: ServerProc) -> None:
    """1,024 documents (the limit, and all of --max-queue): admitted whole and answered whole."""
    docs = [SST2[i % len(SST2)] + f" #{i}" for i in range(1024)]
    status, doc = post(rserver, "/v1/rerank", {"query": QUERY, "documents": docs, "top_n": 10})
    assert status == 200, doc
    want = expected(reranker, docs)
    got = [(r["index"], r["relevance_score"]) for r in doc["results"]]
    assert len(got) == 10 and [s for _, s in got] == sorted((s for _, s in got), reverse=True)
    np.testing.assert_allclose([s for _, s in got], want[[i for i, _ in got]], atol=TOL)
    # the ten best, up to near-ties: nothing left out scores above the tenth
    assert np.sort(want)[::-1][10] <= got[-1][1] + TOL
