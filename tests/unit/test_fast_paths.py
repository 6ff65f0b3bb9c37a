"""The request path's fast paths (issue 47's front-end CPU) answer what the slow ones did: the
router's remembered matches, an output without parameters, one text's scores, gRPC calls
without parameters, Triton's statistics read in one pass, and a model found by name alone."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import msgspec
import numpy as np
import pytest
from ringserve.service.engine.requests import Group, Result
from ringserve.service.kserve import reading
from ringserve.service.kserve.bodies import Infer
from ringserve.service.kserve.encoder import OutputEncoder
from ringserve.service.models.modelset import READY, UNLOADING, Entry, ModelSet, UnknownModel
from ringserve.service.ops.inference_stats import InferenceStats
from ringserve.service.protocols.routes import SEEN_PATHS, Router
from ringserve.service.request.errors import RequestError
from ringserve.shm import layout as L

SST2 = ("sst2", ["negative", "positive"], ["classify"])


def model(name: str, labels: list[str], task: list[str], index: int) -> Any:
    """What ModelSet and the KServe readers read of a model (its ModelInfo)."""
    manifest = SimpleNamespace(
        task=task,
        labels=labels,
        embeds=False,
        embed_only=False,
        normalize=False,
        dimension=0,
        multivector={},
        token_classifies=False,
    )
    return SimpleNamespace(name=name, labels=labels, manifest=manifest, index=index, version=1)


def test_the_router_remembers_matches_as_it_found_them() -> None:
    router = Router(SimpleNamespace())
    infer_a, infer_b = object(), object()
    router.add("POST", "/v2/models/{model}/infer", infer_a)  # type: ignore[arg-type]
    first = router.match(b"/v2/models/sst2/infer")
    again = router.match(b"/v2/models/sst2/infer")
    assert first is not None and again is not None
    assert first[0] is again[0] and first[1] == again[1] == {"model": "sst2"}
    first[1]["model"] = "changed by a handler"  # each match is its own copy
    assert router.match(b"/v2/models/sst2/infer") == (again[0], {"model": "sst2"})
    assert router.match(b"/v2/models/x/y/infer") is None
    assert router.match(b"/v2/models/x/y/infer") is None  # a miss is remembered too
    # a route added later is found, though the path was matched (or missed) before
    router.add("POST", "/v2/models/{model}/{version}/infer", infer_b)  # type: ignore[arg-type]
    found = router.match(b"/v2/models/x/y/infer")
    assert found is not None and found[0][b"POST"] is infer_b
    assert found[1] == {"model": "x", "version": "y"}
    for i in range(SEEN_PATHS + 5):  # bounded: many paths do not grow it past the limit
        router.match(b"/v2/models/m%d/infer" % i)
    assert len(router.seen) <= SEEN_PATHS


def header(doc: dict[str, Any]) -> Infer:
    """An inference header as HTTP decodes it (one text; `doc`'s outputs and parameters)."""
    text = {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}
    return msgspec.json.decode(msgspec.json.encode({"inputs": [text], **doc}), type=Infer)


def test_an_output_without_parameters_reads_as_one_with_none() -> None:
    bare = {"outputs": [{"name": "scores"}, {"name": "label", "parameters": None}]}
    empty = {"outputs": [{"name": "scores", "parameters": {}}, {"name": "label"}]}
    for doc in (bare, empty):
        assert reading.read_outputs(header(doc)) == [("scores", False), ("label", False)]
        assert reading.read_outputs(header(doc)) == [("scores", False), ("label", False)]  # kept
        assert reading.output_places(header(doc)) == {}
        doc["parameters"] = {"binary_data_output": True}
        assert reading.read_outputs(header(doc)) == [("scores", True), ("label", True)]
    with pytest.raises(RequestError, match="asked for twice"):
        reading.read_outputs(header({"outputs": [{"name": "label"}, {"name": "label"}]}))
    with pytest.raises(RequestError, match="unknown output"):
        reading.read_outputs(header({"outputs": [{"name": "embedding"}]}))
    assert reading.passes([("scores", True), ("embedding", False)]) == (True, True)
    assert reading.passes([("embedding", False)]) == (False, True)
    assert reading.passes([("label", False)]) == (True, False)


@pytest.mark.parametrize("joined", [False, True])
def test_one_texts_scores_are_the_stacked_row(joined: bool) -> None:
    encoder = OutputEncoder(["negative", "positive"])
    rows = [np.array([0.25, 0.75, 9.0, 9.0], np.float32), np.array([0.5, 0.5, 9.0], np.float32)]
    for n in (1, 2):
        results = [Result(L.STATUS_OK, label_id=1, scores=r if joined else r[:2]) for r in rows]
        head, data = encoder.tensor("scores", results[:n], True, joined)
        stacked = np.stack([r[:2] for r in rows[:n]]).astype("<f4")
        assert head["shape"] == [n, 2] and data == stacked.tobytes()
        head, data = encoder.tensor("scores", results[:n], False, joined)
        assert data == stacked.ravel().tolist()


# ringserve's kserve_pb2 and tritonclient's protos both declare the package `inference`: one
# process cannot load both (protobuf's default pool refuses the duplicate symbols), and the
# system tests load tritonclient's in this process. The gRPC reader is checked in a fresh
# interpreter, on the real module.
GRPC_CHECK = """
from types import SimpleNamespace

from ringserve.service.models.modelset import ModelSet
from ringserve.service.request.errors import RequestError
from ringserve.service.protocols.rpc import infer
from ringserve.service.protocols.rpc import kserve_pb2 as pb
from ringserve.service.config.settings import Config

manifest = SimpleNamespace(task=["classify"], labels=["negative", "positive"], embeds=False,
                           embed_only=False, normalize=False, dimension=0, multivector={},
                           token_classifies=False)
info = SimpleNamespace(name="sst2", labels=["negative", "positive"], manifest=manifest, index=0,
                       version=1)
host = SimpleNamespace(settings=Config(), models=ModelSet(info))


def call(outputs=("label",), **params):
    req = pb.ModelInferRequest(model_name="sst2")
    req.inputs.add(name="text", datatype="BYTES", shape=[1])
    for name in outputs:
        req.outputs.add(name=name)
    req.raw_input_contents.append(b"\\x02\\x00\\x00\\x00hi")
    for key, value in params.items():
        infer.set_param(req.parameters[key], value)
    return req


def refused(req, said):
    try:
        infer.read_request(host, req, lambda t: 0)
    except RequestError as exc:
        assert said in str(exc), exc
    else:
        raise AssertionError(f"not refused: {said}")


job = infer.read_request(host, call(), lambda timeout_us: 7 if timeout_us is None else 0)
assert job.ask.payloads == [b"hi"] and job.ask.priority is None and job.ask.deadline == 7
assert job.wanted == [("label", True)] and job.places == {}
# parameters given are still converted and checked
job = infer.read_request(host, call(priority=2, timeout=5), lambda t: t or 0)
assert job.ask.priority == 1 and job.ask.deadline == 5
refused(call(priority="soon"), "priority")
# an input in shared memory takes no raw contents: counted from its parameters
req = call()
infer.set_param(req.inputs[0].parameters["shared_memory_region"], "r")
refused(req, "1 raw_input_contents for 1 inputs")
# outputs without parameters: each kind of ask read once and kept; every call still gets its
# own list, in its own order, and a refused ask is refused every time (never kept)
for _ in range(2):
    first = infer.read_request(host, call(("scores", "label")), lambda t: 0)
    again = infer.read_request(host, call(("scores", "label")), lambda t: 0)
    assert first.wanted == again.wanted == [("scores", True), ("label", True)]
    assert first.wanted is not again.wanted
    assert infer.read_request(host, call(("label", "scores")), lambda t: 0).wanted == [
        ("label", True), ("scores", True)]
    typed = infer.read_request(host, call(("label",), binary_data_output=False), lambda t: 0)
    assert typed.wanted == [("label", False)]
    assert infer.read_request(host, call(()), lambda t: 0).wanted == [
        ("scores", True), ("label", True)]
    refused(call(("embedding",)), "unknown output 'embedding'")
    refused(call(("label", "label")), "asked for twice")
# an output with parameters is read in full, as before
req = call(("label",))
infer.set_param(req.outputs[0].parameters["binary_data"], False)
assert infer.read_request(host, req, lambda t: 0).wanted == [("label", False)]
req = call(("label",))
infer.set_param(req.outputs[0].parameters["classification"], 2)
refused(req, "classification outputs are not supported")
print("ok")
"""


def test_a_grpc_call_without_parameters_is_read_as_with_the_defaults() -> None:
    done = subprocess.run(
        [sys.executable, "-c", GRPC_CHECK], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def answer(status: int = L.STATUS_OK, queued: int = 0, ran: int = 0, read: int = 0) -> Result:
    return Result(status, label_id=0, queued_us=queued, model_us=ran, read_ns=read)


def test_statistics_of_a_group_read_in_one_pass() -> None:
    stats = InferenceStats()
    ok = Group(3, lambda r: None, "kserve", admitted_ns=1_000_000)
    ok.results = [answer(queued=9, ran=40, read=900_000), None, answer(queued=5, ran=20, read=0)]
    stats.record(ok, 2_000_000)
    failed = Group(2, lambda r: None, "kserve", admitted_ns=0)
    failed.results = [answer(), answer(L.STATUS_DEADLINE)]
    stats.record(failed, 500)
    stats.record(Group(1, lambda r: None, "kserve", admitted_ns=0), 100)  # nothing answered
    doc = stats.doc("sst2", "1", 0)["inference_stats"]
    assert doc["success"] == {"count": 1, "ns": 1_000_000}
    assert doc["fail"] == {"count": 2, "ns": 600}
    assert doc["queue"] == {"count": 1, "ns": 9_000}  # the longest wait, in ns
    assert doc["compute_infer"] == {"count": 1, "ns": 40_000}  # the longest pass
    assert doc["compute_output"] == {"count": 1, "ns": 1_100_000}  # since the last read
    assert stats.doc("sst2", "1", 0)["inference_count"] == 2


def test_a_model_by_name_is_its_highest_ready_version() -> None:
    models = ModelSet(model(*SST2, 0))
    for version, state in ((3, READY), (2, READY), (4, UNLOADING)):
        info = model(*SST2, version)
        info.version = version
        models.entries[("sst2", version)] = Entry(info, state)
    assert models.find("sst2").version == 3
    assert models.find("sst2", 2).version == 2
    models.entries[("sst2", 3)].state = UNLOADING
    assert models.find("sst2").version == 2
    with pytest.raises(UnknownModel):
        models.find("nli")
