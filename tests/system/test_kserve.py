"""KServe v2 over HTTP, driven by the official tritonclient and by hand-built requests."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from devkit.server import ServerProc

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def model(server: ServerProc) -> str:
    status, _, body = server.request("GET", "/v1/model")
    assert status == 200
    name: str = json.loads(body)["name"]
    return name


@pytest.fixture
def client(server: ServerProc) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=120)
    yield c
    c.close()


def text_input(texts: list[str], shape: list[int], binary: bool) -> httpclient.InferInput:
    arr = np.array([t.encode() for t in texts], dtype=np.object_).reshape(shape)
    inp = httpclient.InferInput("text", shape, "BYTES")
    inp.set_data_from_numpy(arr, binary_data=binary)
    return inp


def v1_scores(server: ServerProc, texts: list[str]) -> tuple[np.ndarray, list[str]]:
    results = server.classify(texts)["results"]
    return np.array([r["scores"] for r in results]), [r["label"] for r in results]


# -- health and metadata ------------------------------------------------------------------------
def test_health(client: httpclient.InferenceServerClient, model: str) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready(model)
    assert client.is_model_ready(model, model_version="1")
    assert not client.is_model_ready("no-such-model")
    assert not client.is_model_ready(model, model_version="2")


def test_server_metadata(client: httpclient.InferenceServerClient) -> None:
    meta = client.get_server_metadata()
    assert meta["name"] == "ringserve"
    assert meta["version"]
    assert "binary_tensor_data" in meta["extensions"]


def test_model_metadata(
    client: httpclient.InferenceServerClient, model: str, server: ServerProc
) -> None:
    runtime = json.loads(server.request("GET", "/v1/model")[2])["runtime"]
    platform = {"onnx": "onnxruntime_onnx", "torch": "pytorch_libtorch"}[runtime]  # Triton's
    for meta in (client.get_model_metadata(model), client.get_model_metadata(model, "1")):
        assert meta["name"] == model
        assert meta["versions"] == ["1"]
        assert meta["platform"] == platform
        assert meta["inputs"][0] == {"name": "text", "datatype": "BYTES", "shape": [-1, 1]}
        pair = {"name": "text_pair", "datatype": "BYTES", "shape": [-1, 1], "optional": True}
        assert meta["inputs"][1:] == [pair]
        # The contract's "Embeddings and reranking": metadata states the task and dimension.
        want = {"activation": "softmax", "task": "classify,embed", "dimension": 384}
        assert meta["parameters"] == want
        outputs = {o["name"]: o for o in meta["outputs"]}
        assert outputs["scores"]["datatype"] == "FP32"
        assert outputs["scores"]["shape"] == [-1, 2]
        assert outputs["label"] == {"name": "label", "datatype": "BYTES", "shape": [-1]}
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("no-such-model")
    assert err.value.status() == "404"
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata(model, "7")
    assert err.value.status() == "404"


# -- infer with tritonclient ----------------------------------------------------------------------
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("column", [False, True], ids=["N", "Nx1"])
def test_infer_matches_v1(
    client: httpclient.InferenceServerClient,
    server: ServerProc,
    model: str,
    sst2_texts: list[str],
    binary: bool,
    column: bool,
) -> None:
    texts = sst2_texts[:6]
    shape = [len(texts), 1] if column else [len(texts)]
    outputs = [
        httpclient.InferRequestedOutput("scores", binary_data=binary),
        httpclient.InferRequestedOutput("label", binary_data=binary),
    ]
    result = client.infer(
        model, [text_input(texts, shape, binary)], outputs=outputs, request_id="req-42"
    )
    scores, labels = v1_scores(server, texts)
    got = result.as_numpy("scores")
    assert got.dtype == np.float32 and got.shape == (len(texts), 2)
    np.testing.assert_allclose(got, scores, atol=1e-5, rtol=0)
    assert [x.decode() if isinstance(x, bytes) else x for x in result.as_numpy("label")] == labels
    response = result.get_response()
    assert response["id"] == "req-42"
    assert response["model_name"] == model and response["model_version"] == "1"


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_only_label(
    client: httpclient.InferenceServerClient, server: ServerProc, model: str, binary: bool
) -> None:
    texts = ["a wonderful, moving film", "dull and far too long"]
    outputs = [httpclient.InferRequestedOutput("label", binary_data=binary)]
    result = client.infer(model, [text_input(texts, [2], binary)], outputs=outputs)
    assert result.as_numpy("scores") is None
    labels = [x.decode() if isinstance(x, bytes) else x for x in result.as_numpy("label")]
    assert labels == v1_scores(server, texts)[1]
    assert [o["name"] for o in result.get_response()["outputs"]] == ["label"]


def test_only_scores_and_default_outputs(
    client: httpclient.InferenceServerClient, model: str
) -> None:
    inp = text_input(["fine"], [1], True)
    only = client.infer(model, [inp], outputs=[httpclient.InferRequestedOutput("scores")])
    assert only.as_numpy("label") is None
    assert only.as_numpy("scores").shape == (1, 2)
    before = answered(client, model)
    every = client.infer(model, [inp])  # no outputs named: all of them, as binary data
    names = [o["name"] for o in client.get_model_metadata(model)["outputs"]]
    assert [o["name"] for o in every.get_response()["outputs"]] == names  # metadata's order
    assert answered(client, model) == before + 1  # one task for the text, not one an output
    assert every.as_numpy("label").shape == (1,)
    np.testing.assert_allclose(every.as_numpy("scores"), only.as_numpy("scores"), atol=1e-5)
    if "embedding" in names:
        asked = [httpclient.InferRequestedOutput(n) for n in ("embedding", "scores")]
        both = client.infer(model, [inp], outputs=asked)
        assert answered(client, model) == before + 2
        np.testing.assert_allclose(
            both.as_numpy("embedding"), every.as_numpy("embedding"), atol=1e-6
        )
        np.testing.assert_allclose(both.as_numpy("scores"), only.as_numpy("scores"), atol=1e-5)


def answered(client: httpclient.InferenceServerClient, model: str) -> int:
    """The texts the model answered (the statistics' inference_count)."""
    return int(client.get_inference_statistics(model)["model_stats"][0]["inference_count"])


def test_compressed_request(client: httpclient.InferenceServerClient, model: str) -> None:
    inp = text_input(["a gem of a movie", "awful"], [2], True)
    plain = client.infer(model, [inp])
    for algorithm in ("gzip", "deflate"):
        packed = client.infer(model, [inp], request_compression_algorithm=algorithm)
        np.testing.assert_allclose(packed.as_numpy("scores"), plain.as_numpy("scores"), atol=1e-5)


# -- hand-built requests --------------------------------------------------------------------------
def bytes_tensor(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def post_infer(
    server: ServerProc, path: str, doc: dict[str, Any], blob: bytes = b"", **headers: str
) -> tuple[int, dict[str, str], bytes]:
    head = json.dumps(doc).encode()
    hdrs = dict(headers)
    if blob:
        hdrs["Inference-Header-Content-Length"] = str(len(head))
    return server.request("POST", path, head + blob, headers=hdrs)


def test_binary_both_ways_by_hand(server: ServerProc, model: str) -> None:
    items = [b"an utterly charming film", "caf\u00e9 au lait".encode()]
    blob = bytes_tensor(items)
    doc = {
        "id": "hand",
        "inputs": [
            {"name": "text", "datatype": "BYTES", "shape": [2, 1]}
            | {"parameters": {"binary_data_size": len(blob)}}
        ],
        "outputs": [
            {"name": "label", "parameters": {"binary_data": True}},
            {"name": "scores", "parameters": {"binary_data": True}},
        ],
    }
    status, headers, body = post_infer(
        server, f"/v2/models/{model}/versions/1/infer", doc, blob, **{"X-Request-Id": "rid-1"}
    )
    assert status == 200, body
    assert headers["content-type"] == "application/octet-stream"
    assert headers["x-request-id"] == "rid-1"
    assert float(headers["x-latency-ms"]) >= 0
    size = int(headers["inference-header-content-length"])
    answer = json.loads(body[:size])
    assert answer["id"] == "hand"
    label, scores = answer["outputs"]
    data = body[size:]
    label_bytes = data[: label["parameters"]["binary_data_size"]]
    score_bytes = data[label["parameters"]["binary_data_size"] :]
    assert len(score_bytes) == scores["parameters"]["binary_data_size"] == 2 * 2 * 4
    assert scores["shape"] == [2, 2] and label["shape"] == [2]
    got = np.frombuffer(score_bytes, dtype="<f4").reshape(2, 2)
    want, labels = v1_scores(server, [t.decode() for t in items])
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert label_bytes == bytes_tensor([x.encode() for x in labels])


def test_json_answer_headers(server: ServerProc, model: str) -> None:
    doc = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["nice"]}]}
    status, headers, body = post_infer(server, f"/v2/models/{model}/infer", doc)
    assert status == 200, body
    assert headers["content-type"] == "application/json"
    assert "inference-header-content-length" not in headers
    assert "x-latency-ms" in headers and "x-request-id" in headers
    outputs = {o["name"]: o for o in json.loads(body)["outputs"]}
    assert len(outputs["scores"]["data"]) == 2 and len(outputs["label"]["data"]) == 1


def text_doc(data: list[Any] | None, shape: Any = None, **fields: Any) -> dict[str, Any]:
    """A request for input `text`; data None leaves the data to the binary extension."""
    spec: dict[str, Any] = {"name": "text", "datatype": "BYTES"}
    spec["shape"] = shape if shape is not None else [len(data or [])]
    if data is not None:
        spec["data"] = data
    spec.update(fields)
    return {"inputs": [spec]}


BAD_REQUESTS: list[tuple[str, Callable[[], tuple[dict[str, Any], bytes]], str]] = [
    (
        "wrong input name",
        lambda: (text_doc(["x"], name="words"), b""),
        "value 'words' - at `$.inputs[0].name`",
    ),
    ("wrong datatype", lambda: (text_doc(["x"], datatype="FP32"), b""), "datatype"),
    ("shape mismatch", lambda: (text_doc(["x", "y"], shape=[3]), b""), "shape"),
    ("bad shape", lambda: (text_doc(["x", "y"], shape=[1, 2]), b""), "shape"),
    ("empty text", lambda: (text_doc(["ok", ""]), b""), "empty"),
    ("blank text", lambda: (text_doc([" \t\n"]), b""), "empty"),
    ("not a string", lambda: (text_doc([3]), b""), "got `int` - at `$.inputs[0].data[0]`"),
    ("no texts", lambda: (text_doc([], shape=[0]), b""), "1 to 256"),
    ("too many", lambda: (text_doc(["x"] * 257), b""), "1 to 256"),
    ("two inputs", lambda: ({"inputs": text_doc(["a"])["inputs"] * 2}, b""), "one input"),
    ("no inputs", lambda: ({"outputs": []}, b""), "missing required field `inputs`"),
    ("rows and texts", lambda: (text_doc([["a"], "b"], shape=[2, 1]), b""), "mixes rows and texts"),
    (
        "unknown output",
        lambda: (text_doc(["a"]) | {"outputs": [{"name": "logits"}]}, b""),
        "output",
    ),
    (
        "invalid UTF-8",
        lambda: (
            text_doc(None, shape=[1], parameters={"binary_data_size": 6}),
            bytes_tensor([b"\xff\xfe"]),
        ),
        "UTF-8",
    ),
    (
        "binary size mismatch",
        lambda: (
            text_doc(None, shape=[1], parameters={"binary_data_size": 99}),
            bytes_tensor([b"hello"]),
        ),
        "binary_data_size",
    ),
    (
        "element overruns",
        lambda: (
            text_doc(None, shape=[1], parameters={"binary_data_size": 6}),
            struct.pack("<I", 50) + b"ab",
        ),
        "past",
    ),
]


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS])
def test_bad_request(
    server: ServerProc,
    model: str,
    case: tuple[str, Callable[[], tuple[dict[str, Any], bytes]], str],
) -> None:
    _, build, words = case
    doc, blob = build()
    status, headers, body = post_infer(server, f"/v2/models/{model}/infer", doc, blob)
    assert status == 400, body
    assert headers["content-type"] == "application/json"
    assert "x-latency-ms" in headers and "x-request-id" in headers
    assert words in json.loads(body)["error"]


def test_malformed_bodies(server: ServerProc, model: str) -> None:
    path = f"/v2/models/{model}/infer"
    for body in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        status, _, data = server.request("POST", path, body)
        assert status == 400 and "error" in json.loads(data)
    head = json.dumps(text_doc(["x"])).encode()
    status, _, data = server.request(
        "POST", path, head, headers={"Inference-Header-Content-Length": str(len(head) + 5)}
    )
    assert status == 400 and "outside" in json.loads(data)["error"]


def test_unknown_paths(server: ServerProc, model: str) -> None:
    doc = json.dumps(text_doc(["fine"]))
    assert server.request("POST", f"/v2/models/{model}/versions/1/infer", doc)[0] == 200
    for path in (f"/v2/models/{model}/versions/2/infer", "/v2/models/nope/infer"):
        status, _, body = server.request("POST", path, doc)
        assert status == 404 and "error" in json.loads(body)
    assert server.request("GET", "/v2/models/nope/ready")[0] == 404
    status, headers, _ = server.request("GET", f"/v2/models/{model}/infer")
    assert status == 405 and "POST" in headers["allow"]


# -- models by name (CONTRACT "Many models"), on a one-model server -----------------------------
def test_v1_names_the_model(server: ServerProc, model: str) -> None:
    """ "model" (and "version") naming the only model works, as leaving it out does; another
    name or version is 404; /v1/models lists the one model and /v1/models/{name} is /v1/model."""
    plain = server.classify("a fine film")
    for extra in (
        {"model": model},
        {"model": model, "version": "1"},
        {"model": model, "version": 1},
    ):
        status, _, body = server.request("POST", "/v1/classify", {"text": "a fine film", **extra})
        assert status == 200 and json.loads(body)["scores"] == plain["scores"], (extra, body)
    for extra in ({"model": "nope"}, {"model": model, "version": "2"}, {"version": "2"}):
        status, headers, body = server.request("POST", "/v1/classify", {"text": "x", **extra})
        assert status == 404 and "x-latency-ms" in headers, (extra, body)
        assert "unknown" in json.loads(body)["error"]
    assert server.request("POST", "/v1/classify", {"text": "x", "model": 3})[0] == 400
    status, _, body = server.request("GET", "/v1/models")
    assert status == 200
    (row,) = json.loads(body)["models"]
    labels = json.loads(server.request("GET", "/v1/model")[2])["labels"]
    assert row == {
        "name": model, "version": "1", "state": "READY", "task": ["classify", "embed"],
        "labels": labels,
    }  # fmt: skip
    one = server.request("GET", f"/v1/models/{model}")
    assert one[0] == 200
    named = json.loads(one[2])
    openai = {k: named.pop(k) for k in ("id", "object", "created", "owned_by")}  # OpenAI's fields
    assert openai["id"] == model and openai["object"] == "model", openai
    assert named == json.loads(server.request("GET", "/v1/model")[2])
    assert server.request("GET", "/v1/models/nope")[0] == 404


def test_repository_extension(client: httpclient.InferenceServerClient, model: str) -> None:
    """tritonclient's get_model_repository_index, load_model and unload_model on a server
    without --model-repository: its one model is listed READY; with --model-control none a load
    or an unload is refused (400), and the model serves on."""
    assert "model_repository" in client.get_server_metadata()["extensions"]
    index = client.get_model_repository_index()
    assert index == [{"name": model, "version": "1", "state": "READY", "reason": ""}]
    for call in (lambda: client.load_model(model), lambda: client.unload_model(model)):
        with pytest.raises(InferenceServerException) as err:
            call()
        assert err.value.status() == "400" and "--model-control" in err.value.message()
    assert client.is_model_ready(model)


def test_repository_bodies(server: ServerProc, model: str) -> None:
    """The bodies Triton's protocol allows are read and checked before the repository: `ready`
    on the index; a load's `version`, not Triton's config or file overrides."""
    status, _, body = server.request("POST", "/v2/repository/index", {"ready": True})
    assert status == 200 and [r["name"] for r in json.loads(body)] == [model]
    assert server.request("POST", "/v2/repository/index", "")[0] == 200  # tritonclient's
    for bad in ({"ready": "yes"}, [1], {"repository_name": 3}):
        assert server.request("POST", "/v2/repository/index", json.dumps(bad))[0] == 400
    load, unload = (f"/v2/repository/models/{model}/{op}" for op in ("load", "unload"))
    for bad in ({"config": "{}"}, {"file:1/model.pt": "AA=="}, {"version": 1.5}):
        status, _, body = server.request("POST", load, {"parameters": bad})
        assert status == 400 and "--model-control" not in json.loads(body)["error"], bad
    assert server.request("POST", unload, {"parameters": {"unload_dependents": 1}})[0] == 400
    status, headers, _ = server.request("GET", "/v2/repository/index")
    assert status == 405 and "POST" in headers["allow"]


def test_deadline(server: ServerProc, model: str) -> None:
    status, headers, body = server.request(
        "POST",
        f"/v2/models/{model}/infer",
        json.dumps(text_doc(["too late"])),
        headers={"X-Request-Timeout-Ms": "0.001"},
    )
    assert status == 504 and "error" in json.loads(body)
    assert "x-latency-ms" in headers


def test_overload_answers_503(start_server: Callable[..., ServerProc]) -> None:
    srv = start_server("--workers", "1", "--spares", "0", "--max-queue", "1")
    name = json.loads(srv.request("GET", "/v1/model")[2])["name"]
    status, headers, body = srv.request(
        "POST", f"/v2/models/{name}/infer", json.dumps(text_doc(["one", "two"]))
    )
    assert status == 503 and headers["retry-after"] and "error" in json.loads(body)
    ok = srv.request("POST", f"/v2/models/{name}/infer", json.dumps(text_doc(["one"])))
    assert ok[0] == 200
