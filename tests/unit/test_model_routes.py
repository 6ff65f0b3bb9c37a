"""The /v1 and KServe HTTP routes with two models loaded, in process: each request resolves its
model by name through a real ModelSet and answers with THAT model's labels and name; no name
with two models is a 400 naming them, an unknown one a 404. The production router, protocol
and admission, on a fake transport, with a dispatcher that answers every text label 0 at once
(so the label in the answer says whose labels were read). No process, no model, no socket."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from ringserve.service.config.settings import Config
from ringserve.service.engine.admission import Admission
from ringserve.service.engine.cache import AnswerCache
from ringserve.service.engine.dispatcher import Result
from ringserve.service.kserve import documents
from ringserve.service.models.modelset import UNLOADING, Entry, ModelSet
from ringserve.service.protocols import kserve, tasks
from ringserve.service.protocols.http import HttpProtocol, HttpServerState
from ringserve.service.protocols.routes import Router, v1_routes
from ringserve.shm import layout as L

from devkit.fakes import Transport

SST2 = ("sst2", ["negative", "positive"], ["classify", "embed"])
NLI = ("nli", ["entailment", "neutral", "contradiction"], ["classify"])


class Dispatcher:
    """Answers each group at once: label 0, as many scores as the text's first byte says."""

    max_tokens = 512
    names = {0: "sst2", 1: "nli"}  # the engine's open models, by wire index

    def __init__(self) -> None:
        self.groups: list[list[bytes]] = []
        self.table = self  # the models' lanes, as the engine's Dispatcher.table answers

    def is_open(self, model: int) -> bool:
        return model in self.names

    def priority(self, model: int) -> int:  # every model interactive, as without a table's
        return 0

    def name(self, model: int) -> str:
        return self.names.get(model, str(model))

    def clock(self) -> int:
        return 0

    def delay_ns(self, model: int = 0, priority: int = 0, now: int = 0) -> int:
        return 0  # every group is answered at once: nothing waits

    def submit(self, texts: list[bytes], deadline: int, done: Any, *_: Any) -> bool:
        self.groups.append(texts)
        done([Result(L.STATUS_OK, label_id=0, scores=np.zeros(3, np.float32)) for _ in texts])
        return True


def model(name: str, labels: list[str], task: list[str], index: int) -> Any:
    manifest = SimpleNamespace(
        task=task,
        labels=labels,
        embeds="embed" in task,
        embed_only=task == ["embed"],
        token_classifies="token-classify" in task,
        normalize=True,
        dimension=384 if "embed" in task else 0,
        activation="softmax",
        max_length=128,
        fingerprint=f"fp-{name}",
        extra={},
        int8={},
        multivector={},
    )
    return SimpleNamespace(
        name=name,
        labels=labels,
        manifest=manifest,
        index=index,
        version=1,
        device="cpu",
        pad_grid=(),
        buckets=(128,),
        runtime="torch",
        graph={},
        model_dir=f"/nonexistent/{name}",  # GET /v1/models' `created` reads its manifest's time
        precision_chosen_by="",
    )


@pytest.fixture
def host() -> SimpleNamespace:
    models = ModelSet(model(*SST2, 0))
    models.entries[("nli", 1)] = Entry(model(*NLI, 1))
    return SimpleNamespace(
        settings=Config(),
        admission=Admission(Dispatcher(), lambda: "queue is full", 30.0),
        models=models,
        model=models.first,
        repository=None,  # a server without one: documents.FixedModels lists its models
        ready=lambda: True,
        cache=AnswerCache(0),  # off: every text reaches the dispatcher
    )


def ask(host: Any, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    router = Router(host)
    v1_routes(router)
    tasks.task_routes(router)
    kserve.register(router)
    conn, transport = HttpProtocol(HttpServerState(Config(), router, lambda *_: None)), Transport()
    conn.connection_made(transport)
    data = b"" if body is None else json.dumps(body).encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(data)}\r\n\r\n"
    conn.data_received(head.encode() + data)
    status_line, rest = transport.written.split(b"\r\n", 1)
    return int(status_line.split()[1]), json.loads(rest.split(b"\r\n\r\n", 1)[1])


def test_classify_reads_the_named_models_labels(host: Any) -> None:
    assert ask(host, "POST", "/v1/classify", {"text": "a", "model": "nli"}) == (
        200,
        {"label": "entailment", "label_id": 0, "scores": [0.0, 0.0, 0.0]},
    )
    status, doc = ask(host, "POST", "/v1/classify", {"texts": ["a"], "model": "sst2"})
    assert status == 200 and doc["results"][0]["label"] == "negative"
    status, doc = ask(host, "POST", "/v1/classify", {"text": "a"})
    assert status == 400 and "nli, sst2" in doc["error"], doc
    status, doc = ask(host, "POST", "/v1/classify", {"text": "a", "model": "nope"})
    assert status == 404 and doc["error"] == "unknown model: nope"
    status, doc = ask(host, "POST", "/v1/classify", {"text": "a", "model": "nli", "version": 2})
    assert status == 404, doc


def test_task_routes_resolve_their_model(host: Any) -> None:
    status, doc = ask(host, "POST", "/v1/embeddings", {"input": "a", "model": "nli"})
    message = doc["error"]["message"]  # OpenAI's error shape on its routes
    assert status == 400 and message.startswith("model nli does not embed"), doc
    status, doc = ask(host, "POST", "/v1/embeddings", {"input": "a", "model": "sst2"})
    assert status == 200 and doc["model"] == "sst2"
    # With two models an OpenAI client's own model name no longer means "the only one".
    status, doc = ask(host, "POST", "/v1/embeddings", {"input": "a", "model": "ada-002"})
    assert status == 404, doc
    host.models.entries[("nli", 1)].state = UNLOADING  # one model serves: as before
    status, doc = ask(host, "POST", "/v1/embeddings", {"input": "a", "model": "ada-002"})
    assert status == 200 and doc["model"] == "sst2"
    status, doc = ask(host, "POST", "/v1/classify", {"text": "a", "model": "nli"})
    assert status == 404, "an unloading model is not found"
    # ...but a name the server holds is never taken for another model's.
    status, doc = ask(
        host, "POST", "/v1/rerank", {"query": "q", "documents": ["d"], "model": "nli"}
    )
    assert status == 404, doc


def test_listing_and_one_model(host: Any) -> None:
    status, doc = ask(host, "GET", "/v1/models")
    assert status == 200 and [(m["name"], m["state"], m["labels"]) for m in doc["models"]] == [
        ("sst2", "READY", SST2[1]),
        ("nli", "READY", NLI[1]),
    ]
    status, doc = ask(host, "GET", "/v1/models/nli")
    assert status == 200 and doc["name"] == "nli" and doc["labels"] == NLI[1]
    assert ask(host, "GET", "/v1/model")[1]["name"] == "sst2"  # the first, as before
    assert ask(host, "GET", "/v1/models/nope")[0] == 404


def test_kserve_routes_every_model(host: Any) -> None:
    status, meta = ask(host, "GET", "/v2/models/nli")
    assert status == 200 and meta["name"] == "nli"
    assert {"name": "scores", "datatype": "FP32", "shape": [-1, 3]} in meta["outputs"]
    assert ask(host, "GET", "/v2/models/nli/versions/1/ready") == (
        200,
        {"name": "nli", "ready": True},
    )
    assert ask(host, "GET", "/v2/models/nli/versions/2/ready")[0] == 404
    assert ask(host, "GET", "/v2/models/nope")[0] == 404
    infer = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}
    status, doc = ask(host, "POST", "/v2/models/nli/infer", infer)
    assert status == 200 and doc["model_name"] == "nli" and doc["model_version"] == "1"
    label = next(o for o in doc["outputs"] if o["name"] == "label")
    assert label["data"] == ["entailment"]
    status, index = ask(host, "POST", "/v2/repository/index")
    assert status == 200 and [(r["name"], r["version"], r["state"]) for r in index] == [
        ("sst2", "1", "READY"),
        ("nli", "1", "READY"),
    ]


def test_the_repository_without_one(host: Any) -> None:
    """FixedModels: a server with no repository loads and unloads nothing (400, as
    --model-control none answers)."""
    fixed = documents.FixedModels(host.models)
    for call in (fixed.load("nli"), fixed.load("nope", "2"), fixed.unload("nli")):
        code, message = asyncio.run(call) or (200, "")
        assert code == 400 and "--model-control" in message
