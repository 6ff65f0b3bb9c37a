"""KServe v2 over gRPC, as tritonclient.grpc (unchanged) and the standard health and reflection
clients speak it, against one real keyed server: probes, metadata, infer over raw and typed
contents, async_infer, requested outputs, every error with its status on a channel that stays
usable, and the metrics. Then a drain, a worker killed and a --reuse-port upgrade, each under
gRPC calls, on servers of their own.

This process imports tritonclient's own compiled KServe messages, never protocols/rpc's: both
define the `inference` package, and the comparison of the two is the point of the first test.
"""

from __future__ import annotations

import ast
import json
import os
import queue
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_tools import protoc
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from devkit.launcher import ROOT
from devkit.load import GrpcLoad
from devkit.server import ServerProc, listening, refused, serving, wait_for

KEY = "grpc-test-key"
AUTH = {"authorization": f"Bearer {KEY}"}
HTTP_AUTH = {"Authorization": f"Bearer {KEY}"}
RPC = ROOT / "service" / "protocols" / "rpc"
TEXTS = ["a gripping, beautifully acted film", "dull and far too long", "it was fine", "ok"]
PAIRS = ["the film is good", "I hated it", "a fine way to spend an evening", "bad"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    with serving(
        ServerProc(
            tmp_path_factory.mktemp("grpc"),
            ["--workers", "1", "--spares", "0"],
            env={"RINGSERVE_API_KEY": KEY},
            grpc=True,
        )
    ) as server:
        yield server


@pytest.fixture(scope="module")
def client(srv: ServerProc) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
    yield c
    c.close()


@pytest.fixture(scope="module")
def model(srv: ServerProc) -> str:
    status, _, body = srv.request("GET", "/v1/model", headers=HTTP_AUTH)
    assert status == 200, body
    name: str = json.loads(body)["name"]
    return name


def text_input(texts: list[str] | list[bytes], name: str = "text") -> grpcclient.InferInput:
    data = np.array([t.encode() if isinstance(t, str) else t for t in texts], dtype=object)
    inp = grpcclient.InferInput(name, [len(texts)], "BYTES")
    inp.set_data_from_numpy(data)
    return inp


def typed_input(texts: list[str], name: str = "text") -> grpcclient.InferInput:
    """An input in typed contents (`bytes_contents`): tritonclient itself only sends raw
    contents, so its tensor message is filled by hand and no raw content is set."""
    inp = grpcclient.InferInput(name, [len(texts)], "BYTES")
    inp._get_tensor().contents.bytes_contents.extend([t.encode() for t in texts])
    return inp


def v1(srv: ServerProc, texts: list[str], pairs: list[str] | None = None) -> list[dict[str, Any]]:
    body: dict[str, Any] = {"texts": texts, **({"text_pairs": pairs} if pairs else {})}
    status, _, data = srv.request("POST", "/v1/classify", body, headers=HTTP_AUTH)
    assert status == 200, data
    results: list[dict[str, Any]] = json.loads(data)["results"]
    return results


def assert_same(result: Any, reference: list[dict[str, Any]]) -> None:
    scores = result.as_numpy("scores")
    labels = [b.decode() for b in result.as_numpy("label")]
    want = np.array([r["scores"] for r in reference])
    assert scores.shape == want.shape and scores.dtype == np.float32
    assert float(np.abs(scores - want).max()) < 1e-5
    assert labels == [r["label"] for r in reference]


# -- the interface ---------------------------------------------------------------------------------
def serialized_descriptor(path: Path) -> descriptor_pb2.FileDescriptorProto:
    """The descriptor a generated _pb2.py registers, read from its source (never imported)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "AddSerializedFile":
            arg = node.args[0]
            assert isinstance(arg, ast.Constant)
            return descriptor_pb2.FileDescriptorProto.FromString(arg.value)
    raise AssertionError(f"no serialized descriptor in {path}")


def without_json_names(
    file: descriptor_pb2.FileDescriptorProto,
) -> descriptor_pb2.FileDescriptorProto:
    """protoc's descriptor set states each field's JSON name; generated code leaves it out."""

    def strip(message: descriptor_pb2.DescriptorProto) -> None:
        for field in message.field:
            field.ClearField("json_name")
        for nested in message.nested_type:
            strip(nested)

    for message in file.message_type:
        strip(message)
    return file


# The messages of the KServe v2 protocol itself, declared whole.
KSERVE_V2 = {
    f"{name}{kind}"
    for name in ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
                 "ModelInfer")
    for kind in ("Request", "Response")
} | {"InferParameter", "InferTensorContents"}  # fmt: skip


def test_stubs_match_the_proto_and_the_published_protocol(tmp_path: Path) -> None:
    """The committed kserve_pb2.py is what protoc makes of kserve.proto (`make proto`), and every
    message and method it declares has the names, numbers and types of tritonclient's own
    compiled copy of the published protocol: the KServe v2 messages whole, and Triton's
    extensions (statistics, shared memory, the model configuration of model_config.proto), of
    which ours declares the fields it answers, field by field."""
    out = tmp_path / "set.pb"
    args = ["protoc", f"-I{RPC}", f"--descriptor_set_out={out}", str(RPC / "kserve.proto")]
    assert protoc.main(args) == 0
    fresh = without_json_names(
        descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    )
    ours = serialized_descriptor(RPC / "kserve_pb2.py")
    assert ours == fresh, "service/protocols/rpc/kserve_pb2.py is stale: run `make proto`"
    theirs = descriptor_pb2.FileDescriptorProto()
    service_pb2.DESCRIPTOR.CopyToProto(theirs)
    without_json_names(theirs)
    assert ours.package == theirs.package == "inference"
    published = {m.name: m for m in theirs.message_type}
    config = descriptor_pb2.FileDescriptorProto()
    model_config_pb2.DESCRIPTOR.CopyToProto(config)
    configs = {m.name: m for m in without_json_names(config).message_type}
    for message in ours.message_type:
        if message.name in KSERVE_V2:
            assert message == published[message.name], message.name
            continue
        fields = {f.number: f for f in {**published, **configs}[message.name].field}
        for field in message.field:
            assert field == fields[field.number], (message.name, field.name)
    assert {m.name for m in ours.message_type} >= KSERVE_V2
    (service,) = ours.service
    their_methods = {m.name: m for m in theirs.service[0].method}
    assert service.name == theirs.service[0].name == "GRPCInferenceService"
    for method in service.method:
        want = their_methods[method.name]
        assert (method.input_type, method.output_type) == (want.input_type, want.output_type)


def test_probes_and_metadata(client: grpcclient.InferenceServerClient, model: str) -> None:
    assert client.is_server_live() and client.is_server_ready()  # open: no key needed
    assert client.is_model_ready(model) and client.is_model_ready(model, "1")
    meta = client.get_server_metadata(headers=AUTH)
    assert meta.name == "ringserve" and "binary_tensor_data" in meta.extensions
    m = client.get_model_metadata(model, headers=AUTH)
    assert m.name == model and list(m.versions) == ["1"]
    assert [(t.name, t.datatype, list(t.shape)) for t in m.inputs] == [
        ("text", "BYTES", [-1, 1]),  # a batching model's: [batch, 1 text]
        ("text_pair", "BYTES", [-1, 1]),
    ]
    outputs = {t.name: (t.datatype, list(t.shape)) for t in m.outputs}
    assert outputs["scores"] == ("FP32", [-1, 2]) and outputs["label"] == ("BYTES", [-1])
    assert outputs["embedding"] == ("FP32", [-1, 384])


def test_health_and_reflection(srv: ServerProc) -> None:
    serving = health_pb2.HealthCheckResponse.SERVING  # told at the next sweep tick after ready
    wait_for(lambda: health_status(srv.grpc_port) == serving, 5, "health SERVING")
    with grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as unknown:
            health.Check(health_pb2.HealthCheckRequest(service="no.Such"), timeout=10)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
        asks = [
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(
                file_containing_symbol="inference.GRPCInferenceService"
            ),
        ]
        listed, found = list(reflect.ServerReflectionInfo(iter(asks), timeout=10))
    names = {s.name for s in listed.list_services_response.service}
    assert {"inference.GRPCInferenceService", "grpc.health.v1.Health"} <= names
    (raw,) = found.file_descriptor_response.file_descriptor_proto
    methods = {m.name for m in descriptor_pb2.FileDescriptorProto.FromString(raw).service[0].method}
    assert {"ModelInfer", "ModelMetadata", "ServerLive"} <= methods


# -- infer -----------------------------------------------------------------------------------------
def test_infer_raw_and_typed_equal_v1(
    srv: ServerProc, client: grpcclient.InferenceServerClient, model: str
) -> None:
    reference = v1(srv, TEXTS)
    assert_same(client.infer(model, [text_input(TEXTS)], headers=AUTH), reference)
    typed = client.infer(model, [typed_input(TEXTS)], headers=AUTH)
    assert_same(typed, reference)
    column = text_input(TEXTS)
    column.set_shape([len(TEXTS), 1])
    assert_same(client.infer(model, [column], model_version="1", headers=AUTH), reference)
    pairs = v1(srv, TEXTS, PAIRS)
    raw_pairs = client.infer(
        model, [text_input(TEXTS), text_input(PAIRS, "text_pair")], headers=AUTH
    )
    assert_same(raw_pairs, pairs)
    typed_pairs = [typed_input(TEXTS), typed_input(PAIRS, "text_pair")]
    assert_same(client.infer(model, typed_pairs, headers=AUTH), pairs)


def test_typed_contents_answered_typed(srv: ServerProc, model: str) -> None:
    """A plain KServe client (the published stubs, no tritonclient logic) that asks for typed
    outputs (`binary_data_output: false`) gets `fp32_contents` and `bytes_contents` back, no
    raw outputs; without the parameter, raw ones with the same scores."""
    reference = v1(srv, TEXTS)
    request = service_pb2.ModelInferRequest(model_name=model, id="req-7")
    request.parameters["binary_data_output"].bool_param = False
    tensor = request.inputs.add(name="text", datatype="BYTES", shape=[len(TEXTS)])
    tensor.contents.bytes_contents.extend([t.encode() for t in TEXTS])
    with grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        answer = stub.ModelInfer(request, metadata=tuple(AUTH.items()), timeout=30)
    assert answer.id == "req-7" and answer.model_version == "1" and not answer.raw_output_contents
    scores, label, vectors = answer.outputs  # none named: all of them, in metadata's order
    assert (vectors.name, list(vectors.shape)) == ("embedding", [len(TEXTS), 384])
    assert (scores.name, list(scores.shape), label.name) == ("scores", [len(TEXTS), 2], "label")
    got = np.array(scores.contents.fp32_contents).reshape(len(TEXTS), 2)
    assert float(np.abs(got - np.array([r["scores"] for r in reference])).max()) < 1e-5
    assert [b.decode() for b in label.contents.bytes_contents] == [r["label"] for r in reference]
    del request.parameters["binary_data_output"]  # the default: raw outputs
    with grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        raw = stub.ModelInfer(request, metadata=tuple(AUTH.items()), timeout=30)
    assert len(raw.raw_output_contents) == 3 and not raw.outputs[0].contents.fp32_contents
    raw_scores = np.frombuffer(raw.raw_output_contents[0], "<f4").reshape(len(TEXTS), 2)
    assert float(np.abs(raw_scores - got).max()) == 0.0


def test_requested_outputs_and_the_embedding(
    srv: ServerProc, client: grpcclient.InferenceServerClient, model: str
) -> None:
    inp = [text_input(TEXTS)]
    only_label = client.infer(
        model, inp, outputs=[grpcclient.InferRequestedOutput("label")], headers=AUTH
    )
    assert only_label.as_numpy("scores") is None
    assert [b.decode() for b in only_label.as_numpy("label")] == [
        r["label"] for r in v1(srv, TEXTS)
    ]
    only_scores = client.infer(
        model, inp, outputs=[grpcclient.InferRequestedOutput("scores")], headers=AUTH
    )
    assert only_scores.as_numpy("label") is None and only_scores.as_numpy("scores").shape == (4, 2)
    embedded = client.infer(
        model, inp, outputs=[grpcclient.InferRequestedOutput("embedding")], headers=AUTH
    )
    vectors = embedded.as_numpy("embedding")
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [4], "data": TEXTS}],
            "outputs": [{"name": "embedding"}]}  # fmt: skip
    status, _, data = srv.request("POST", f"/v2/models/{model}/infer", body, headers=HTTP_AUTH)
    assert status == 200, data
    (http_out,) = json.loads(data)["outputs"]
    want = np.array(http_out["data"], dtype=np.float32).reshape(http_out["shape"])
    assert vectors.shape == want.shape == (4, 384)
    assert float(np.abs(vectors - want).max()) < 1e-5


def test_async_infer(srv: ServerProc, client: grpcclient.InferenceServerClient, model: str) -> None:
    answers: queue.Queue[tuple[int, Any, Any]] = queue.Queue()
    for i, text in enumerate(TEXTS * 2):
        client.async_infer(
            model,
            [text_input([text])],
            callback=lambda result, error, i=i: answers.put((i, result, error)),
            headers=AUTH,
        )
    reference = v1(srv, TEXTS * 2)
    for _ in range(len(TEXTS) * 2):
        i, result, error = answers.get(timeout=60)
        assert error is None, error
        assert_same(result, [reference[i]])


# -- errors ----------------------------------------------------------------------------------------
def status_of(call: Any) -> str:
    with pytest.raises(InferenceServerException) as err:
        call()
    status: str = err.value.status()
    return status


def test_errors_have_their_status_and_the_channel_stays_usable(
    srv: ServerProc, client: grpcclient.InferenceServerClient, model: str
) -> None:
    wrong_type = grpcclient.InferInput("text", [1], "FP32")
    wrong_type.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    bad_shape = text_input(["one", "two"])
    bad_shape.set_shape([3])
    cases = {
        "unknown model": (lambda: client.infer("no-such-model", [text_input(["x"])], headers=AUTH),
                          "StatusCode.NOT_FOUND"),
        "unknown version": (lambda: client.infer(model, [text_input(["x"])], model_version="9",
                                                 headers=AUTH), "StatusCode.NOT_FOUND"),
        "wrong datatype": (lambda: client.infer(model, [wrong_type], headers=AUTH),
                           "StatusCode.INVALID_ARGUMENT"),
        "shape mismatch": (lambda: client.infer(model, [bad_shape], headers=AUTH),
                           "StatusCode.INVALID_ARGUMENT"),
        "empty text": (lambda: client.infer(model, [text_input(["  "])], headers=AUTH),
                       "StatusCode.INVALID_ARGUMENT"),
        "invalid UTF-8": (lambda: client.infer(model, [text_input([b"\xff\xfe ok"])], headers=AUTH),
                          "StatusCode.INVALID_ARGUMENT"),
        "unknown output": (lambda: client.infer(model, [text_input(["x"])], headers=AUTH,
                                                outputs=[grpcclient.InferRequestedOutput("nope")]),
                           "StatusCode.INVALID_ARGUMENT"),
        "over --max-body (413)": (lambda: client.infer(model, [text_input(["x" * 1_100_000])],
                                                       headers=AUTH),
                                  "StatusCode.INVALID_ARGUMENT"),
        "missing key": (lambda: client.infer(model, [text_input(["x"])]),
                        "StatusCode.UNAUTHENTICATED"),
        "wrong key": (lambda: client.get_server_metadata(headers={"authorization": "Bearer no"}),
                      "StatusCode.UNAUTHENTICATED"),
        "expired deadline": (lambda: client.infer(model, [text_input(TEXTS * 64)], headers=AUTH,
                                                  client_timeout=0.002),
                             "StatusCode.DEADLINE_EXCEEDED"),
        "load with --model-control none": (lambda: client.load_model(model, headers=AUTH),
                                           "StatusCode.INVALID_ARGUMENT"),
        "unload with --model-control none": (lambda: client.unload_model(model, headers=AUTH),
                                             "StatusCode.INVALID_ARGUMENT"),
        "metadata of an unknown model": (lambda: client.get_model_metadata("no-such-model",
                                                                           headers=AUTH),
                                         "StatusCode.NOT_FOUND"),
    }  # fmt: skip
    reference = v1(srv, TEXTS[:1])
    seen = {}
    for what, (call, _) in cases.items():
        seen[what] = status_of(call)
        # The same channel serves the next call at once.
        assert_same(client.infer(model, [text_input(TEXTS[:1])], headers=AUTH), reference)
    print(f"\ngrpc errors: {seen}")
    assert seen == {what: want for what, (_, want) in cases.items()}


def test_the_repository_of_a_one_model_server(
    client: grpcclient.InferenceServerClient, model: str
) -> None:
    """tritonclient.grpc's repository index lists the one model, READY (loads and unloads are
    refused above: --model-control none); readiness and metadata by name and version."""
    index = client.get_model_repository_index(headers=AUTH, as_json=True)
    assert index == {"models": [{"name": model, "version": "1", "state": "READY"}]}
    assert [m.name for m in client.get_model_repository_index(headers=AUTH).models] == [model]
    assert client.is_model_ready(model, headers=AUTH)
    assert client.is_model_ready(model, "1", headers=AUTH)
    assert client.get_model_metadata(model, "1", headers=AUTH).versions == ["1"]
    assert "model_repository" in client.get_server_metadata(headers=AUTH).extensions
    for call in (
        lambda: client.is_model_ready("no-such-model", headers=AUTH),
        lambda: client.is_model_ready(model, "2", headers=AUTH),
    ):
        assert status_of(call) == "StatusCode.NOT_FOUND"


def grpc_counts(srv: ServerProc) -> dict[str, float]:
    status, _, body = srv.request("GET", "/metrics", headers=HTTP_AUTH)
    assert status == 200
    pattern = r'^ringserve_requests_total\{(?=[^}]*protocol="grpc")[^}]*code="(\d+)"[^}]*\} (\S+)$'
    return {code: float(v) for code, v in re.findall(pattern, body.decode(), re.M)}


def test_calls_are_counted_as_grpc(
    srv: ServerProc, client: grpcclient.InferenceServerClient, model: str
) -> None:
    before = grpc_counts(srv)
    client.infer(model, [text_input(TEXTS[:1])], headers=AUTH)
    status_of(lambda: client.infer("no-such-model", [text_input(["x"])], headers=AUTH))
    status_of(lambda: client.infer(model, [text_input(["x"])]))
    after = grpc_counts(srv)
    grew = {c: after.get(c, 0) - before.get(c, 0) for c in ("200", "404", "401")}
    assert grew == {"200": 1, "404": 1, "401": 1}, (before, after)


# -- lifecycle -------------------------------------------------------------------------------------
def health_status(port: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
    status: int = answer.status
    return status


def test_drain_finishes_calls_and_idle_channels_do_not_hold_the_exit(start_server) -> None:
    """While readiness is 503 (the shutdown delay) health says NOT_SERVING; a call in flight at
    the drain is answered, three idle channels and a health
    Watch stream do not hold the exit, and nothing is left behind."""
    srv = start_server("--workers", "1", "--spares", "0", "--shutdown-delay-s", "1", grpc=True)
    name = json.loads(srv.request("GET", "/v1/model")[2])["name"]
    address = f"127.0.0.1:{srv.grpc_port}"
    idle = [grpcclient.InferenceServerClient(address) for _ in range(3)]
    for c in idle:
        assert c.infer(name, [text_input(["warm"])]).as_numpy("label") is not None
    serving = health_pb2.HealthCheckResponse.SERVING
    wait_for(lambda: health_status(srv.grpc_port) == serving, 5, "health SERVING")
    watch_channel = grpc.insecure_channel(address)
    watch = health_pb2_grpc.HealthStub(watch_channel).Watch(health_pb2.HealthCheckRequest())
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    (pid,) = srv.worker_pids().values()
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    os.kill(pid, signal.SIGSTOP)  # so the call is still in flight when the drain begins
    try:
        idle[1].async_infer(
            name,
            [text_input(["in flight at the drain"])],
            lambda result, error: answers.put((result, error)),
        )
        wait_for(lambda: srv.status()["queue_depth"] == 1, 10, "the call in flight")
        srv.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: srv.request("GET", "/v2/health/ready")[0] == 503, 5, "readiness 503")
        assert health_status(srv.grpc_port) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert not idle[0].is_server_ready()
        wait_for(lambda: refused(srv.port), 5, "the drain: listeners closed")
        t0 = time.monotonic()
    finally:
        os.kill(pid, signal.SIGCONT)
    result, error = answers.get(timeout=30)
    assert error is None, error
    assert result.as_numpy("label") is not None
    code = srv.proc.wait(10)
    took = time.monotonic() - t0
    print(f"grpc drain: 3 idle channels + a Watch + 1 in flight: exit {code} after {took:.2f} s")
    assert code == 0 and took < 2.0, (code, took)
    for c in idle:
        c.close()
    watch_channel.close()
    assert srv.stop() == 0


def test_worker_kill_and_reuse_port_upgrade_under_grpc_load(start_server, sst2_texts) -> None:
    """gRPC clients on long-lived channels and one that opens a channel per call: a worker
    SIGKILLed, then a --reuse-port upgrade (a second server, SIGTERM to the first). Not one
    call fails, none is refused."""
    args = ["--reuse-port", "--workers", "2", "--spares", "1", "--drain-timeout-s", "10"]
    old = start_server(*args, workers=2, grpc=True)
    old.wait_spares()
    name = json.loads(old.request("GET", "/v1/model")[2])["name"]
    with (
        GrpcLoad(old.grpc_port, name, sst2_texts, clients=3) as load,
        GrpcLoad(old.grpc_port, name, sst2_texts, clients=1, fresh=True) as fresh,
    ):
        load.wait_ok(20)
        pid = old.worker_pids()[0]
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: old.worker_pids().get(0) not in (None, pid), 30, "a replacement")
        load.wait_ok(30)
        killed = dict(load.outcomes)
        new = start_server(*args, beside=old, wait=False, grpc=True)
        wait_for(lambda: listening(new), 120, "the new server listening")
        before = fresh.ok()
        old.proc.send_signal(signal.SIGTERM)
        assert old.proc.wait(60) == 0
        assert old.stop() == 0
        load.wait_ok(20)  # the new server alone now serves every channel
        fresh.wait_ok(before - fresh.ok() + 10)
    print(f"\ngrpc kill: {killed}; after the upgrade: long-lived {dict(load.outcomes)}, "
          f"channel per call {dict(fresh.outcomes)}")  # fmt: skip
    assert load.failed() == 0, (load.outcomes, load.errors[:5])
    assert fresh.failed() == 0, (fresh.outcomes, fresh.errors[:5])
    assert new.stop() == 0
