"""The clients users switching from a peer already run, unchanged, against one real server of
the default model (it classifies and embeds): the `openai` SDK (models.list, models.retrieve,
embeddings from text and token ids, error messages), LangChain's OpenAIEmbeddings (its default
path and check_embedding_ctx_length=False), LlamaIndex's OpenAILikeEmbedding, huggingface_hub's
InferenceClient on TEI's root route, and the `cohere` SDK's ClientV2 embed (its rerank needs a
rerank model: tests/system/test_rerank.py)."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from ringserve.workers.artifact import load_tokenizer

from devkit.server import ServerProc, serving

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.timeout(180)
TEXTS = ["a charming and often affecting journey", "a dull, plodding mess of a film"]
TOL = 1e-5


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    args = ["--workers", "1", "--spares", "0", "--grpc-port", "0", "--binary-port", "0"]
    with serving(ServerProc(tmp_path_factory.mktemp("clients"), args), 1) as server:
        yield server


@pytest.fixture(scope="module")
def base(srv: ServerProc) -> str:
    return f"http://127.0.0.1:{srv.port}"


@pytest.fixture(scope="module")
def name(srv: ServerProc) -> str:
    return str(json.loads(srv.request("GET", "/v1/model")[2])["name"])


@pytest.fixture(scope="module")
def reference(srv: ServerProc) -> np.ndarray:
    """The server's own /embed vectors of TEXTS (normalized), what every client must get."""
    status, _, data = srv.request("POST", "/embed", {"inputs": TEXTS})
    assert status == 200, data
    return np.array(json.loads(data), dtype=np.float64)


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    """The HTTP client each SDK is given, closed after the test (unclosed sockets would fail
    the run: warnings are errors)."""
    with httpx.Client() as c:
        yield c


@pytest.fixture
def client(base: str, http: httpx.Client) -> Any:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, http_client=http)


# -- OpenAI --------------------------------------------------------------------------------------
def test_openai_lists_and_retrieves_models(client: Any, name: str) -> None:
    listed = client.models.list()
    ids = [m.id for m in listed.data]
    assert ids == [name], ids
    model = listed.data[0]
    assert model.object == "model" and model.owned_by == "ringserve" and model.created > 0
    assert model.model_extra["task"] == ["classify", "embed"]  # ringserve's fields stay
    one = client.models.retrieve(name)
    assert (one.id, one.object, one.created) == (name, "model", model.created)
    assert one.model_extra["labels"] == ["negative", "positive"]


def test_openai_error_messages(client: Any) -> None:
    c = client
    with pytest.raises(openai.NotFoundError) as missing:
        c.models.retrieve("no-such-model")
    assert "unknown model" in missing.value.message, missing.value.message
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        c.embeddings.create(model="m", input=[""])
    # the SDK's message is "Error code: 400 - " and the server's, read from OpenAI's shape
    assert bad.value.message.endswith(" - input[0] is empty"), bad.value.message
    assert bad.value.param == "input" and bad.value.type == "invalid_request_error"


def test_openai_embeddings_from_text_and_token_ids(
    client: Any, default_model: str, reference: np.ndarray
) -> None:
    c = client
    got = c.embeddings.create(model="text-embedding-3-small", input=TEXTS)
    np.testing.assert_allclose([d.embedding for d in got.data], reference, atol=TOL)
    tokenizer = load_tokenizer(default_model, 128)
    ids = [tokenizer.encode(t).ids for t in TEXTS]  # with [CLS] and [SEP], as it gives them
    by_ids = c.embeddings.create(model="m", input=ids)
    np.testing.assert_allclose([d.embedding for d in by_ids.data], reference, atol=TOL)
    one = c.embeddings.create(model="m", input=ids[0])  # one list of ids is one input
    np.testing.assert_allclose(one.data[0].embedding, reference[0], atol=TOL)
    with pytest.raises(openai.BadRequestError) as outside:
        c.embeddings.create(model="m", input=[[15339, 99999]])
    assert "not in model" in outside.value.message, outside.value.message
    for unframed in ([15339, 1917], ids[0][1:-1]):  # cl100k's "hello world"; no [CLS], [SEP]
        with pytest.raises(openai.BadRequestError) as refused:
            c.embeddings.create(model="m", input=[unframed])
        assert "must start with [101] and end with [102]" in refused.value.message
        assert "check_embedding_ctx_length=False" in refused.value.message


# -- LangChain and LlamaIndex --------------------------------------------------------------------
def tiktoken_cache() -> str:
    """llama-index-core ships tiktoken's cl100k_base file; LangChain's default path needs it,
    and nothing may be downloaded here."""
    import llama_index.core

    return str(Path(llama_index.core.__file__).parent / "_static" / "tiktoken_cache")


def test_langchain_defaults_get_the_documented_error(
    base: str, http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """check_embedding_ctx_length=True (the default) sends tiktoken cl100k ids, which are not
    this model's vocabulary: refused with the way out, never embedded as nonsense."""
    lc = pytest.importorskip("langchain_openai")
    pytest.importorskip("llama_index.core")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", os.environ.get("TIKTOKEN_CACHE_DIR", tiktoken_cache()))
    emb = lc.OpenAIEmbeddings(base_url=f"{base}/v1", api_key="-", max_retries=0, http_client=http)
    for call in (lambda: emb.embed_documents(TEXTS), lambda: emb.embed_query("hello world")):
        with pytest.raises(openai.BadRequestError) as refused:
            call()
        assert "check_embedding_ctx_length=False" in refused.value.message


def test_langchain_and_llamaindex_embed(
    base: str, http: httpx.Client, reference: np.ndarray
) -> None:
    lc = pytest.importorskip("langchain_openai")
    like = pytest.importorskip("llama_index.embeddings.openai_like")
    emb = lc.OpenAIEmbeddings(
        base_url=f"{base}/v1",
        api_key="-",
        check_embedding_ctx_length=False,
        max_retries=0,
        http_client=http,
    )
    np.testing.assert_allclose(emb.embed_documents(TEXTS), reference, atol=TOL)
    np.testing.assert_allclose(emb.embed_query(TEXTS[1]), reference[1], atol=TOL)
    li = like.OpenAILikeEmbedding(
        model_name="any", api_base=f"{base}/v1", api_key="-", http_client=http
    )
    np.testing.assert_allclose(li.get_text_embedding_batch(TEXTS), reference, atol=TOL)
    np.testing.assert_allclose(li.get_query_embedding(TEXTS[0]), reference[0], atol=TOL)


# -- huggingface_hub -----------------------------------------------------------------------------
def test_inference_client_on_the_tei_root(
    base: str, srv: ServerProc, reference: np.ndarray
) -> None:
    hub = pytest.importorskip("huggingface_hub")
    c = hub.InferenceClient(model=base, token="unused")
    vec = c.feature_extraction(TEXTS[0])
    np.testing.assert_allclose(np.asarray(vec).reshape(-1), reference[0], atol=TOL)
    labels = c.text_classification(TEXTS[1])
    classified = json.loads(srv.request("POST", "/v1/classify", {"text": TEXTS[1]})[2])
    assert labels[0].label == classified["label"] == "negative"
    assert sorted(x.score for x in labels) == pytest.approx(sorted(classified["scores"]))
    sims = c.sentence_similarity(TEXTS[0], other_sentences=TEXTS)
    assert sims == pytest.approx([1.0, float(reference[0] @ reference[1])], abs=1e-4)


# -- Cohere --------------------------------------------------------------------------------------
def test_cohere_v2_embeds(base: str, http: httpx.Client, reference: np.ndarray) -> None:
    cohere = pytest.importorskip("cohere")
    co = cohere.ClientV2(api_key="unused", base_url=base, httpx_client=http)
    got = co.embed(
        texts=TEXTS, model="embed-v4.0", input_type="search_document",
        embedding_types=["float", "base64"],
    )  # fmt: skip
    np.testing.assert_allclose(got.embeddings.float_, reference, atol=TOL)
    raw = [np.frombuffer(base64.b64decode(b), "<f4") for b in got.embeddings.base64]
    np.testing.assert_allclose(raw, reference, atol=TOL)
    with pytest.raises(cohere.errors.BadRequestError) as refused:
        co.rerank(model="rerank-v3.5", query="q", documents=["a"])
    assert "does not rerank" in refused.value.body["message"]
