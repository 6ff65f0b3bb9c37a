"""--precision auto on the default model, served: it resolves at start to a concrete precision
from int8's and bf16's published costs, says which and why on stderr and in /v1/model, and
serves it; --precision bf16 on a CPU with AVX512_BF16 or AMX served on OpenVINO (a config
file's per-model precision) beside fp32, with its published cost, the same decisions,
embeddings, both outputs and token vectors; and on a CPU without them refused at start, naming
the flags."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ringserve.service.models.precision import MIN_AGREEMENT, MIN_MEAN_COSINE, auto_precision
from ringserve.workers.artifact import load_manifest
from ringserve.workers.cpu import BF16_FLAGS, cpu_flags

from devkit.server import ServerProc, serving

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def auto(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    args = ["--precision", "auto", "--workers", "1", "--spares", "0"]
    with serving(ServerProc(tmp_path_factory.mktemp("auto"), args)) as srv:
        yield srv


def test_auto_names_what_it_serves_and_why(auto: ServerProc, default_model: str) -> None:
    manifest = load_manifest(default_model)
    cost, bf16, checked = manifest.int8, manifest.bf16, manifest.int8_checked
    doc = json.loads(auto.request("GET", "/v1/model")[2])
    why = doc["precision_chosen_by"]
    said = [x for x in auto.logs().splitlines() if x.startswith("ringserve: --precision auto")]
    assert said == [f"ringserve: --precision auto: serving {doc['precision']} ({why})"]
    assert auto.classify("a warm and funny film")["label"] in ("negative", "positive")
    cpu_bf16 = bool(cpu_flags() & set(BF16_FLAGS))
    assert (doc["precision"], why) == auto_precision(
        cost, bool(manifest.int8_file), bf16, cpu_bf16, checked
    )
    if doc["precision"] == "bf16":  # faithful and its published speed the highest
        assert bf16["argmax_agreement"] >= 0.99 and bf16["accuracy_cost"] <= 0.005
        assert doc["runtime"] == "openvino" and doc["bf16"] == bf16
        assert why.startswith(f"auto: bf16 agrees on {bf16['argmax_agreement']} of ")
        assert f"{bf16['speedup']}x fp32's speed" in why and "; int8 " in why
        assert not checked or bf16["speedup"] > checked["speedup"]
        return
    if doc["precision"] == "int8-checked":  # faithful, and faster than bf16 where bf16 runs
        assert checked["argmax_agreement"] >= 0.99 and checked["accuracy_cost"] <= 0.005
        assert doc["runtime"] == "onnx" and why.startswith("auto: int8-checked agrees on ")
        assert f"{checked['speedup']}x fp32's speed" in why
        if cpu_bf16 and bf16:
            assert checked["speedup"] >= bf16["speedup"] and "; bf16 " in why
        return
    if cost["argmax_agreement"] >= 0.99 and cost["accuracy_cost"] <= 0.005:
        pytest.skip("this artifact's int8 is faithful: auto serves it (tests/unit covers the rule)")
    # no candidate is faithful and faster: fp32 serves, and the reason is each one's figure
    assert doc["precision"] == "fp32" and doc["runtime"] == "onnx"
    assert why.startswith("auto: int8 ") and f"of {cost['texts']} texts" in why
    assert "int8" not in doc  # int8's cost is shown when int8 serves


# The positive side, on a CPU with bf16: one server (a config file) serves the default artifact
# twice, `bf16` by its table's precision and `fp32` beside it, so the two are compared through
# the same server, protocols and batching.
CPU_BF16 = bool(cpu_flags() & set(BF16_FLAGS))
needs_bf16 = pytest.mark.skipif(
    not CPU_BF16, reason="this CPU has neither avx512_bf16 nor amx_bf16: bf16 is refused here"
)
TABLES = """spares = 0
[models.bf16]
path = "{model}"
precision = "bf16"

[models.fp32]
path = "{model}"
precision = "fp32"
"""


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    if not CPU_BF16:
        pytest.skip("this CPU has neither avx512_bf16 nor amx_bf16")
    where = tmp_path_factory.mktemp("bf16")
    config = where / "ringserve.toml"
    config.write_text(TABLES.format(model=default_model))
    args = ["--config", str(config), "--workers", "1", "--max-queue-ms", "60000"]
    with serving(ServerProc(where, args), 1) as srv:
        yield srv


def scores_of(srv: ServerProc, texts: list[str], model: str) -> np.ndarray:
    status, _, data = srv.request("POST", "/v1/classify", {"texts": texts, "model": model})
    assert status == 200, data
    return np.array([r["scores"] for r in json.loads(data)["results"]])


def card(srv: ServerProc, name: str) -> dict[str, Any]:
    status, _, data = srv.request("GET", f"/v1/models/{name}")
    assert status == 200, data
    doc: dict[str, Any] = json.loads(data)
    return doc


@needs_bf16
def test_bf16_serves_on_openvino_with_its_published_cost(
    pair: ServerProc, default_model: str
) -> None:
    published = load_manifest(default_model).bf16
    assert published["runtime"] == "openvino" and published["texts"] > 0
    doc = card(pair, "bf16")
    assert doc["precision"] == "bf16" and doc["runtime"] == "openvino"
    assert doc["bf16"] == published and "int8" not in doc and "graph" not in doc
    other = card(pair, "fp32")
    assert other["precision"] == "fp32" and other["runtime"] == "onnx" and "bf16" not in other
    status, _, data = pair.request("GET", "/v2/models/bf16")  # KServe names what serves it
    assert status == 200 and json.loads(data)["platform"] == "openvino"
    logs = pair.logs()
    assert "ringserve: serving bf16 on OpenVINO: accuracy cost " in logs
    start = [json.loads(x) for x in logs.splitlines() if x.startswith("{") and '"start"' in x]
    assert start and start[0]["runtime"] == "openvino" and start[0]["precision"] == "bf16"


@needs_bf16
def test_bf16_decides_as_fp32_at_the_published_level(
    pair: ServerProc, default_model: str, sst2_texts: list[str]
) -> None:
    texts = sst2_texts[:256]
    got, want = scores_of(pair, texts, "bf16"), scores_of(pair, texts, "fp32")
    assert not np.array_equal(got, want)  # bf16 is served, not fp32 under its name
    agreement = float((got.argmax(1) == want.argmax(1)).mean())
    published = load_manifest(default_model).bf16
    assert agreement >= MIN_AGREEMENT and published["argmax_agreement"] >= MIN_AGREEMENT
    assert float(np.abs(got - want).max()) <= 0.05  # the published max diff is 0.0086 here


@needs_bf16
def test_bf16_embeddings_both_outputs_and_token_vectors(pair: ServerProc) -> None:
    texts = ["a warm and funny film", "dull, lifeless and far too long", "not bad at all"]

    def vectors(model: str) -> np.ndarray:
        status, _, data = pair.request("POST", "/v1/embeddings", {"input": texts, "model": model})
        assert status == 200, data
        return np.array([d["embedding"] for d in json.loads(data)["data"]])

    a, b = vectors("bf16"), vectors("fp32")
    cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cosine.min() >= MIN_MEAN_COSINE and not np.array_equal(a, b)
    # KServe's both outputs in one pass: the scores and the embedding of the same forward
    body = {
        "inputs": [{"name": "text", "shape": [3], "datatype": "BYTES", "data": texts}],
        "outputs": [{"name": "scores"}, {"name": "embedding"}],
    }
    status, _, data = pair.request("POST", "/v2/models/bf16/infer", body)
    assert status == 200, data
    outs = {o["name"]: np.reshape(o["data"], o["shape"]) for o in json.loads(data)["outputs"]}
    np.testing.assert_allclose(outs["embedding"], a, atol=1e-6)
    np.testing.assert_allclose(outs["scores"], scores_of(pair, texts, "bf16"), atol=1e-6)
    # TEI's /embed_all: every token's vector, from OpenVINO's pass as from ONNX Runtime's
    tokens = {}
    for model in ("bf16", "fp32"):
        status, _, data = pair.request("POST", "/embed_all", {"inputs": texts[0], "model": model})
        assert status == 200, data
        tokens[model] = np.array(json.loads(data)[0])
    assert tokens["bf16"].shape == tokens["fp32"].shape and tokens["bf16"].shape[1] == 384
    t, u = tokens["bf16"], tokens["fp32"]
    assert not np.array_equal(t, u)  # each model's own pass, the bf16 one on OpenVINO
    assert ((t * u).sum(1) / np.linalg.norm(t, axis=1) / np.linalg.norm(u, axis=1)).min() > 0.99


# int8-checked beside fp32 in one server (a config file's per-model precisions), as bf16 above.
CHECKED_TABLES = """spares = 0
[models.checked]
path = "{model}"
precision = "int8-checked"

[models.fp32]
path = "{model}"
precision = "fp32"
"""


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    where = tmp_path_factory.mktemp("checked")
    config = where / "ringserve.toml"
    config.write_text(CHECKED_TABLES.format(model=default_model))
    args = ["--config", str(config), "--workers", "1", "--max-queue-ms", "60000"]
    with serving(ServerProc(where, args), 1) as srv:
        yield srv


def results_of(srv: ServerProc, texts: list[str], model: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for k in range(0, len(texts), 256):  # a request holds at most 256 texts
        body = {"texts": texts[k : k + 256], "model": model}
        status, _, data = srv.request("POST", "/v1/classify", body)
        assert status == 200, data
        out += json.loads(data)["results"]
    return out


def test_int8_checked_answers_close_calls_with_fp32_and_says_which(
    checked: ServerProc, default_model: str, sst2_texts: list[str]
) -> None:
    """Every answer names the precision that scored it: fp32's exact scores for a close call
    (int8's margin under the published threshold), int8's for the rest, each of those at least
    the threshold sure; decisions agree with fp32 at the published level."""
    from ringserve.workers.runtimes.checked import margins

    published = load_manifest(default_model).int8_checked
    threshold = published["threshold"]
    assert 0 < threshold < 1 and published["argmax_agreement"] >= 0.995
    doc = card(checked, "checked")
    assert doc["precision"] == "int8-checked" and doc["int8_checked"] == published
    texts = sst2_texts[:400]
    got, want = results_of(checked, texts, "checked"), results_of(checked, texts, "fp32")
    assert {r["precision"] for r in got} == {"int8", "fp32"}
    assert all("precision" not in r for r in want)
    looked = [i for i, r in enumerate(got) if r["precision"] == "fp32"]
    kept = [i for i, r in enumerate(got) if r["precision"] == "int8"]
    a = np.array([r["scores"] for r in got])
    b = np.array([r["scores"] for r in want])
    np.testing.assert_allclose(a[looked], b[looked], atol=1e-5, rtol=0)
    assert (margins(a[kept], "softmax") >= threshold).all()
    assert not np.allclose(a[kept], b[kept], atol=1e-5)  # int8 answers them, not fp32
    agreement = float((a.argmax(1) == b.argmax(1)).mean())
    assert agreement >= MIN_AGREEMENT, agreement
    assert 0 < len(looked) < 0.4 * len(texts)  # a few close calls, not every text
    logs = checked.logs()
    assert "ringserve: --precision int8-checked: a text whose int8 margin is under " in logs


AVX2_EPYC = (  # the flags line of the AVX2-only AMD EPYC these tests were first run on
    "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B12\n"
    "flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush "
    "mmx fxsr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl "
    "nonstop_tsc cpuid extd_apicid tsc_known_freq pni pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 "
    "x2apic movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy cr8_legacy abm "
    "sse4a misalignsse 3dnowprefetch osvw topoext ssbd ibrs ibpb stibp vmmcall fsgsbase bmi1 "
    "avx2 smep bmi2 rdseed adx smap clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 clzero "
    "xsaveerptr arat npt nrip_save umip rdpid\n"
)


def test_auto_on_a_recorded_avx2_cpu_weighs_int8_checked(
    tmp_path: Path, default_model: str
) -> None:
    """On a CPU without bf16 (a recorded AVX2-only EPYC), auto chooses among fp32, int8 and
    int8-checked by their published costs: int8-checked where it is faithful and faster, as it
    is for the default model when its build measured it faster than fp32."""
    from ringserve.service.models.precision import auto_precision
    from ringserve.workers.cpu import CPUINFO_ENV

    info = tmp_path / "cpuinfo"
    info.write_text(AVX2_EPYC)
    m = load_manifest(default_model)
    want, why = auto_precision(m.int8, bool(m.int8_file), m.bf16, False, m.int8_checked)
    args = ["--model", default_model, "--precision", "auto", "--workers", "1", "--spares", "0"]
    (tmp_path / "auto").mkdir()
    with serving(ServerProc(tmp_path / "auto", args, {CPUINFO_ENV: str(info)})) as srv:
        doc = json.loads(srv.request("GET", "/v1/model")[2])
        assert doc["precision"] == want and doc["precision_chosen_by"] == why
        assert "bf16" not in doc  # not a candidate on this CPU, whatever the artifact says
        if m.int8_checked.get("speedup", 0) > 1:
            assert want == "int8-checked"
            assert srv.classify("a warm and funny film")["precision"] in ("int8", "fp32")
    # and bf16 asked for outright is refused at start, naming the flags (as on such a CPU)
    (tmp_path / "bf16").mkdir()
    srv = ServerProc(tmp_path / "bf16", ["--model", default_model, "--precision", "bf16"],
                     {CPUINFO_ENV: str(info)})  # fmt: skip
    assert srv.wait_exit(60) != 0
    assert "--precision bf16 needs a CPU with avx512_bf16 or amx_bf16" in srv.logs()
