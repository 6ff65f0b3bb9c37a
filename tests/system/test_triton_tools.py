"""Triton's own tools against one real server, unchanged: tritonclient's model configuration,
statistics and system shared-memory calls over HTTP and gRPC, requested-output subsets, and
perf_analyzer 2.45 (installed by tests/install_browser.py under .venv/opt) over HTTP, gRPC and
system shared memory, its server-side statistics read back from our statistics."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from devkit.server import ServerProc, serving

pytestmark = pytest.mark.timeout(240)

MODEL = "sst2-minilm"
TEXTS = ["a gripping, beautifully acted film", "dull and far too long", "it was fine"]
PERF_DIR = Path(sys.prefix) / "opt" / "perf_analyzer"  # tests/install_browser.py puts it there
OUTPUTS = ("scores", "label", "embedding")
OUT_SIZE = 8192  # the output region: scores at 64, the 3 x 384 floats of embedding at 128


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    args = ["--workers", "1", "--spares", "0"]
    with serving(ServerProc(tmp_path_factory.mktemp("triton"), args, grpc=True)) as server:
        yield server


@pytest.fixture(scope="module")
def http(srv: ServerProc) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{srv.port}", network_timeout=120)
    yield client
    client.close()


@pytest.fixture(scope="module")
def rpc(srv: ServerProc) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
    yield client
    client.close()


def texts_array(texts: list[str]) -> np.ndarray:
    return np.array([t.encode() for t in texts], dtype=np.object_).reshape(len(texts), 1)


def http_input(texts: list[str]) -> httpclient.InferInput:
    inp = httpclient.InferInput("text", [len(texts), 1], "BYTES")
    inp.set_data_from_numpy(texts_array(texts))
    return inp


# -- configuration and metadata -------------------------------------------------------------------
def test_config_names_the_runtime_and_agrees_with_metadata(
    srv: ServerProc, http: httpclient.InferenceServerClient, rpc: grpcclient.InferenceServerClient
) -> None:
    runtime = json.loads(srv.request("GET", "/v1/model")[2])["runtime"]
    platform = {"onnx": "onnxruntime_onnx", "torch": "pytorch_libtorch"}[runtime]
    config = http.get_model_config(MODEL)
    assert config == http.get_model_config(MODEL, "1")
    meta = http.get_model_metadata(MODEL)
    assert config["platform"] == meta["platform"] == platform
    assert config["max_batch_size"] > 0 and "dynamic_batching" in config
    for spec in meta["inputs"]:  # metadata's shape is the batch, then the config's dims
        (conf,) = [c for c in config["input"] if c["name"] == spec["name"]]
        assert spec["shape"] == [-1, *conf["dims"]] == [-1, 1]
        assert (spec["datatype"], conf["data_type"]) == ("BYTES", "TYPE_STRING")
    dims = {c["name"]: (c["data_type"], c["dims"]) for c in config["output"]}
    assert dims == {
        "scores": ("TYPE_FP32", [2]),
        "label": ("TYPE_STRING", [1]),
        "embedding": ("TYPE_FP32", [384]),
    }
    grpc_config = rpc.get_model_config(MODEL, as_json=True)["config"]
    assert grpc_config["platform"] == platform
    assert int(grpc_config["max_batch_size"]) == config["max_batch_size"]
    assert [(i["name"], i["data_type"], i["dims"]) for i in grpc_config["input"]] == [
        ("text", "TYPE_STRING", ["1"]),
        ("text_pair", "TYPE_STRING", ["1"]),
    ]
    assert rpc.get_model_metadata(MODEL).platform == platform
    with pytest.raises(InferenceServerException, match="unknown"):
        rpc.get_model_config("no-such-model")


# -- requested outputs ----------------------------------------------------------------------------
def test_every_subset_of_outputs_gets_exactly_those(
    srv: ServerProc, http: httpclient.InferenceServerClient, rpc: grpcclient.InferenceServerClient
) -> None:
    every = [httpclient.InferRequestedOutput(n) for n in OUTPUTS]
    full = http.infer(MODEL, [http_input(TEXTS)], outputs=every)
    want = {name: full.as_numpy(name) for name in OUTPUTS}
    before = inference_count(http)
    plain = http.infer(MODEL, [http_input(TEXTS)])  # none named: all, in metadata's order
    assert [o["name"] for o in plain.get_response()["outputs"]] == list(OUTPUTS)
    assert inference_count(http) == before + len(TEXTS)  # one task a text, not two
    for name in ("scores", "embedding"):
        np.testing.assert_allclose(plain.as_numpy(name), want[name], atol=1e-5)
    assert list(plain.as_numpy("label")) == list(want["label"])
    assert want["scores"].shape == (3, 2) and want["embedding"].shape == (3, 384)
    for k in (1, 2, 3):
        for names in itertools.permutations(OUTPUTS, k):
            asked = [httpclient.InferRequestedOutput(n) for n in names]
            result = http.infer(MODEL, [http_input(TEXTS)], outputs=asked)
            got = [o["name"] for o in result.get_response()["outputs"]]
            assert got == list(names), names
            for name in names:
                if name == "label":
                    assert list(result.as_numpy(name)) == list(want[name])
                else:
                    np.testing.assert_allclose(result.as_numpy(name), want[name], atol=1e-5)
    inp = grpcclient.InferInput("text", [len(TEXTS), 1], "BYTES")
    inp.set_data_from_numpy(texts_array(TEXTS))
    asked_rpc = [grpcclient.InferRequestedOutput(n) for n in ("embedding", "label")]
    result = rpc.infer(MODEL, [inp], outputs=asked_rpc)
    assert [o.name for o in result.get_response().outputs] == ["embedding", "label"]
    np.testing.assert_allclose(result.as_numpy("embedding"), want["embedding"], atol=1e-5)
    before = inference_count(http)
    result = rpc.infer(MODEL, [inp])  # gRPC too: none named is all, one task a text
    assert [o.name for o in result.get_response().outputs] == list(OUTPUTS)
    np.testing.assert_allclose(result.as_numpy("embedding"), want["embedding"], atol=1e-5)
    assert inference_count(http) == before + len(TEXTS)


def inference_count(http: httpclient.InferenceServerClient) -> int:
    """The texts the model answered (Triton's inference_count): one a text however many of
    its outputs an infer call asks for."""
    return int(http.get_inference_statistics(MODEL)["model_stats"][0]["inference_count"])


# -- statistics -----------------------------------------------------------------------------------
def test_statistics_count_requests_on_both_protocols(
    http: httpclient.InferenceServerClient, rpc: grpcclient.InferenceServerClient
) -> None:
    before = http.get_inference_statistics(MODEL)["model_stats"][0]
    only = [httpclient.InferRequestedOutput("scores")]
    for _ in range(3):
        http.infer(MODEL, [http_input(TEXTS)], outputs=only)
    after = http.get_inference_statistics(MODEL, "1")["model_stats"][0]
    assert (after["name"], after["version"]) == (MODEL, "1")
    stats, was = after["inference_stats"], before["inference_stats"]
    assert stats["success"]["count"] == was["success"]["count"] + 3
    assert after["inference_count"] == before["inference_count"] + 9
    assert after["execution_count"] > before["execution_count"]
    for phase in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert stats[phase]["ns"] > was[phase]["ns"], phase
    took = stats["success"]["ns"] - was["success"]["ns"]
    parts = sum(stats[p]["ns"] - was[p]["ns"] for p in ("queue", "compute_infer"))
    assert parts <= took  # the phases are parts of the request's time
    assert after["last_inference"] > 0
    every = http.get_inference_statistics()["model_stats"]
    assert [(m["name"], m["version"]) for m in every] == [(MODEL, "1")]
    grpc_stats = rpc.get_inference_statistics(MODEL, as_json=True)["model_stats"][0]
    assert int(grpc_stats["inference_stats"]["success"]["count"]) >= stats["success"]["count"]
    with pytest.raises(InferenceServerException, match="unknown"):
        http.get_inference_statistics("no-such-model")
    with pytest.raises(InferenceServerException, match="unknown"):
        rpc.get_inference_statistics(MODEL, "7")


# -- system shared memory -------------------------------------------------------------------------
def test_system_shared_memory_in_and_out(
    srv: ServerProc, http: httpclient.InferenceServerClient, rpc: grpcclient.InferenceServerClient
) -> None:
    data = serialize_byte_tensor(texts_array(TEXTS))
    size = len(data.item())  # tritonclient serializes BYTES into one bytes object
    key_in, key_out = f"/rs-test-in-{srv.port}", f"/rs-test-out-{srv.port}"
    region_in = shm.create_shared_memory_region("in", key_in, size)
    region_out = shm.create_shared_memory_region("out", key_out, OUT_SIZE)
    try:
        shm.set_shared_memory_region(region_in, [data])
        plain = http.infer(MODEL, [http_input(TEXTS)])
        want, want_vectors = plain.as_numpy("scores"), plain.as_numpy("embedding")
        for client, mod in ((http, httpclient), (rpc, grpcclient)):
            client.register_system_shared_memory("in", key_in, size)
            client.register_system_shared_memory("out", key_out, OUT_SIZE, offset=0)
            inp = mod.InferInput("text", [len(TEXTS), 1], "BYTES")
            inp.set_shared_memory("in", size)
            out = mod.InferRequestedOutput("scores")
            out.set_shared_memory("out", 64, offset=64)
            vectors = mod.InferRequestedOutput("embedding")  # both outputs: one task a text
            vectors.set_shared_memory("out", OUT_SIZE - 128, offset=128)
            before = inference_count(http)
            result = client.infer(MODEL, [inp], outputs=[out, vectors])
            assert inference_count(http) == before + len(TEXTS)
            # the answer is in the region; the output entry has neither data nor parameters
            # (tritonclient 2.73's gRPC get_output(as_json=True) returns None: read the message)
            tensor = result.get_output("scores")
            assert tensor is not None, result.get_response()
            if mod is httpclient:
                assert not {"data", "parameters"} & set(tensor), tensor
            else:
                assert not tensor.HasField("contents") and not tensor.parameters, tensor
            got = shm.get_contents_as_numpy(region_out, np.float32, [len(TEXTS), 2], offset=64)
            np.testing.assert_allclose(got, want, atol=1e-5)
            got = shm.get_contents_as_numpy(region_out, np.float32, [len(TEXTS), 384], offset=128)
            np.testing.assert_allclose(got, want_vectors, atol=1e-5)
            refused_without_harm(srv, client, mod, size)
            status = client.get_system_shared_memory_status()
            names = (
                sorted(r["name"] for r in status) if mod is httpclient else sorted(status.regions)
            )
            assert names == ["in", "out"]
            client.unregister_system_shared_memory("in")
            client.unregister_system_shared_memory()  # all that are left
            status = client.get_system_shared_memory_status()
            assert not (status if mod is httpclient else status.regions)
    finally:
        shm.destroy_shared_memory_region(region_in)
        shm.destroy_shared_memory_region(region_out)


def refused_without_harm(srv: ServerProc, client: object, mod: object, size: int) -> None:
    """A region that is not there, a range past its end, a too-small output: 400 (gRPC
    INVALID_ARGUMENT) each, and the server answers the next request as before."""
    infer = client.infer  # type: ignore[attr-defined]
    cases = [("nowhere", size, 0, "no shared-memory region"), ("in", size, 8, "runs past region")]
    for region, byte_size, offset, why in cases:
        inp = mod.InferInput("text", [len(TEXTS), 1], "BYTES")  # type: ignore[attr-defined]
        inp.set_shared_memory(region, byte_size, offset=offset)
        with pytest.raises(InferenceServerException, match=why) as err:
            infer(MODEL, [inp])
        assert err.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    inp = mod.InferInput("text", [len(TEXTS), 1], "BYTES")  # type: ignore[attr-defined]
    inp.set_shared_memory("in", size)
    small = mod.InferRequestedOutput("embedding")  # type: ignore[attr-defined]
    small.set_shared_memory("out", 64)
    with pytest.raises(InferenceServerException, match=r"needs \d+ bytes"):
        infer(MODEL, [inp], outputs=[small])
    with pytest.raises(InferenceServerException, match="cannot open shared memory"):
        client.register_system_shared_memory("ghost", "/rs-no-such-key", 64)  # type: ignore[attr-defined]
    assert srv.classify(TEXTS[0])["label"]


# -- perf_analyzer --------------------------------------------------------------------------------
def perf_analyzer() -> tuple[Path, dict[str, str]]:
    binary = PERF_DIR / "bin" / "perf_analyzer"
    if not binary.exists():
        pytest.fail(
            f"{binary} is missing: `make install-test` installs it (tests/install_browser.py)"
        )
    lib = PERF_DIR / "nvidia" / "cuda_runtime" / "lib"
    return binary, dict(os.environ, LD_LIBRARY_PATH=str(lib))


@pytest.mark.parametrize(
    "protocol,memory", [("http", "none"), ("grpc", "none"), ("http", "system"), ("grpc", "system")]
)
def test_perf_analyzer(srv: ServerProc, protocol: str, memory: str) -> None:
    """perf_analyzer as a Triton user runs it, at concurrency 8; short windows keep it to
    seconds. Its server-side section is read from our statistics."""
    binary, env = perf_analyzer()
    port = srv.grpc_port if protocol == "grpc" else srv.port
    run = subprocess.run(
        [
            str(binary), "-m", MODEL, "-u", f"127.0.0.1:{port}", "-i", protocol,
            "--shared-memory", memory, "--concurrency-range", "8",
            "--measurement-mode", "count_windows", "--measurement-request-count", "8",
            "--max-trials", "3", "-s", "80",
        ],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "error" not in out.lower() and "Request concurrency: 8" in out, out
    server = out.split("Server:", 1)[1]
    succeeded = int(re.search(r"Successful request count: (\d+)", server).group(1))  # type: ignore[union-attr]
    assert succeeded > 0, out
    assert int(re.search(r"Execution count: (\d+)", server).group(1)) > 0  # type: ignore[union-attr]
    line = re.search(r"Avg request latency: .*", server).group(0)  # type: ignore[union-attr]
    assert re.search(r"compute infer [1-9]\d* usec", line), line
    assert re.search(r"queue \d+ usec", line), line
