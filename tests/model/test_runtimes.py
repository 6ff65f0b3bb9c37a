"""The CPU runtimes: ONNX files in the artifact, TorchScript and ONNX Runtime (plain and fused
graphs) giving the same scores (per runtime and across), the graph chosen at start, an artifact
from before ONNX still serving, and int8's recipe and cost."""

from __future__ import annotations

import json
import os
import random
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ringserve.factory import int8
from ringserve.workers.artifact import (
    ArtifactError,
    Manifest,
    load_manifest,
    load_model,
    load_tokenizer,
    reference_logits,
)
from ringserve.workers.batches import Item
from ringserve.workers.runtimes import graphpick
from ringserve.workers.runtimes.cpu import CpuRunner, OrtRunner, softmax
from ringserve.workers.runtimes.onnx_model import choose_runtime, open_session

from devkit.models import old_artifact
from devkit.server import ServerProc

pytest.importorskip("onnxruntime")  # a dependency (pyproject); absent only in a stale venv


def texts_of_every_length(sst2: list[str], agnews: list[str]) -> list[str]:
    rng = random.Random(11)
    pool = sst2[:100] + agnews[:100]
    return [" ".join(rng.sample(pool, k)) for k in (1, 1, 1, 2, 3, 5, 8, 12)]


def make_items(model_dir: str, texts: list[str]) -> list[Item]:
    tok = load_tokenizer(model_dir, load_manifest(model_dir).max_length)
    return [Item(i, 0, 0, e.ids) for i, e in enumerate(tok.encode_batch(texts))]


def run(runner: CpuRunner, batch: list[Item]) -> np.ndarray:
    length = max(len(it.ids) for it in batch)
    runner.fill(length, batch)
    return runner.forward(length, len(batch))


def test_choose_runtime() -> None:
    new = Manifest("m", ["a", "b"], 128, "", onnx_file="model.onnx", int8_file="model.int8.onnx")
    old = Manifest("m", ["a", "b"], 128, "")
    assert choose_runtime("auto", "fp32", False, new) == ("onnx", "")
    assert choose_runtime("torch", "fp32", False, new) == ("torch", "")
    assert choose_runtime("onnx", "int8", False, new) == ("onnx", "")
    assert choose_runtime("auto", "fp32", True, new) == ("torch", "")  # CUDA graphs
    runtime, note = choose_runtime("auto", "fp32", False, old)
    assert runtime == "torch" and "no model.onnx" in note
    for args in (("onnx", "fp32", False, old), ("auto", "int8", False, old)):
        with pytest.raises(ValueError, match="rebuild it"):
            choose_runtime(*args)
    with pytest.raises(ValueError, match="ONNX Runtime"):
        choose_runtime("torch", "int8", False, new)
    with pytest.raises(ValueError, match="CPU only"):
        choose_runtime("onnx", "fp32", True, new)
    # bf16 on the CPU is OpenVINO's, on the plain graph; it also serves fp32 when asked for
    assert choose_runtime("auto", "bf16", False, new) == ("openvino", "")
    assert choose_runtime("openvino", "bf16", False, new) == ("openvino", "")
    assert choose_runtime("openvino", "fp32", False, new) == ("openvino", "")
    assert choose_runtime("auto", "bf16", True, new) == ("torch", "")  # CUDA's autocast
    for requested in ("torch", "onnx"):
        with pytest.raises(ValueError, match="runs on OpenVINO"):
            choose_runtime(requested, "bf16", False, new)
    with pytest.raises(ValueError, match="int8 runs on ONNX Runtime"):
        choose_runtime("openvino", "int8", False, new)
    with pytest.raises(ValueError, match="CPU only"):
        choose_runtime("openvino", "fp32", True, new)
    for args in (("auto", "bf16", False, old), ("openvino", "fp32", False, old)):
        with pytest.raises(ValueError, match="rebuild it"):
            choose_runtime(*args)


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link where both are on one file system (no copy of every file each round)."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def test_the_onnx_files_are_fingerprinted(default_model: str, tmp_path: Path) -> None:
    manifest = load_manifest(default_model)
    graphs = ["model.onnx", "model.int8.onnx", "model.fused.onnx"]
    if manifest.checked_file:  # int8-checked's own graph, where its recipe is not int8's
        graphs.append("model.int8-checked.onnx")
    files = manifest.files()
    assert files[: 1 + len(graphs)] == ["model.pt", *graphs]
    assert sorted(files[1 + len(graphs) :]) == sorted(g + ".data" for g in graphs)
    cost = manifest.int8
    assert cost["texts"] == 3793 and 0.5 < cost["argmax_agreement"] <= 1
    assert "publication split" in cost["split"]
    assert cost["accuracy_cost"] == pytest.approx(
        cost["accuracy_fp32"] - cost["accuracy_int8"], abs=2e-4
    )
    low, high = cost["accuracy_cost_ci95"]
    assert low <= cost["accuracy_cost"] <= high and high - low < 0.02
    low, high = cost["argmax_agreement_ci95"]
    assert low <= cost["argmax_agreement"] <= high
    for name in manifest.files()[1:]:
        copy = tmp_path / name
        shutil.copytree(default_model, copy, copy_function=_link_or_copy)
        data = bytearray((copy / name).read_bytes())
        data[len(data) // 2] ^= 0x01
        (copy / name).unlink()  # a new file: never write through a link to the served artifact
        (copy / name).write_bytes(bytes(data))
        with pytest.raises(ArtifactError, match="fingerprint mismatch"):
            load_manifest(copy)
        shutil.rmtree(copy)


def test_runtimes_give_the_same_scores_alone_and_in_mixed_batches(
    default_model: str, sst2_texts: list[str], agnews_texts: list[str]
) -> None:
    texts = texts_of_every_length(sst2_texts, agnews_texts)
    items = make_items(default_model, texts)
    manifest = load_manifest(default_model)
    runners = {
        "torch": CpuRunner(load_model(default_model), manifest.max_length, 32),
        "onnx": OrtRunner(
            open_session(Path(default_model) / manifest.onnx_file), manifest.max_length, 32
        ),
        "fused": OrtRunner(
            open_session(Path(default_model) / manifest.fused_file), manifest.max_length, 32
        ),
    }
    expected = softmax(reference_logits(default_model, texts))  # TorchScript, each text alone
    for runner in runners.values():
        runner.warm()
        alone = np.concatenate([run(runner, [it]) for it in items])
        np.testing.assert_allclose(alone, expected, atol=1e-5, rtol=0)
        shuffled = random.Random(5).sample(items, len(items))
        mixed = run(runner, shuffled)  # every length in one batch, padded to the longest
        np.testing.assert_allclose(mixed, expected[[it.msg_id for it in shuffled]], atol=1e-5)


def test_openvino_scores_as_fp32_and_bf16_within_its_drift(
    default_model: str, sst2_texts: list[str], agnews_texts: list[str]
) -> None:
    """OpenVINO's runner on the plain graph: at f32 the same scores as TorchScript (1e-4: its
    kernels sum in another order), alone and in a mixed batch; at bf16, on a CPU that has it,
    the same decisions within bf16's drift; its token states are those of the same pass."""
    from ringserve.workers.cpu import BF16_FLAGS, cpu_flags
    from ringserve.workers.runtimes.openvino import OvRunner, compile_model

    texts = texts_of_every_length(sst2_texts, agnews_texts)
    items = make_items(default_model, texts)
    manifest = load_manifest(default_model)
    plain = Path(default_model) / manifest.onnx_file
    expected = softmax(reference_logits(default_model, texts))
    f32 = OvRunner(compile_model(plain, "fp32", 1), manifest.max_length, 32, precision="fp32")
    f32.warm()
    alone = np.concatenate([run(f32, [it]) for it in items])
    np.testing.assert_allclose(alone, expected, atol=1e-4, rtol=0)
    shuffled = random.Random(5).sample(items, len(items))
    np.testing.assert_allclose(run(f32, shuffled), expected[[it.msg_id for it in shuffled]],
                               atol=1e-4)  # fmt: skip
    length = max(len(it.ids) for it in items[:3])
    f32.fill(length, items[:3])
    rows, tokens = f32.forward_tokens(length, 3)
    assert tokens.shape == (3, length, f32.token_width) and f32.token_width == 384
    np.testing.assert_allclose(rows, expected[:3], atol=1e-4)
    if not cpu_flags() & set(BF16_FLAGS):
        pytest.skip("bf16: this CPU has neither avx512_bf16 nor amx_bf16")
    bf16 = OvRunner(compile_model(plain, "bf16", 1), manifest.max_length, 32)
    got = np.concatenate([run(bf16, [it]) for it in items])
    assert (got.argmax(1) == expected.argmax(1)).all()
    drift = float(np.abs(got - expected).max())
    assert 0 < drift < 0.05, drift  # bf16 does move the scores, a little


# check_served_scores sends 12 texts of every length at once (up to 512 tokens) to one or two
# workers: on a loaded machine their estimated wait can pass the default 1 s --max-queue-ms, and
# the server would rightly shed them. These tests are about scores: the bound is out of reach.
NO_SHEDDING = ("--max-queue-ms", "60000")


def check_served_scores(srv: ServerProc, texts: list[str], expected: np.ndarray) -> None:
    alone = [srv.classify(t)["scores"] for t in texts]
    np.testing.assert_allclose(np.array(alone), expected, atol=1e-5, rtol=0)
    order = random.Random(3).sample(range(len(texts)), len(texts))
    mixed = srv.classify([texts[i] for i in order])["results"]
    np.testing.assert_allclose([r["scores"] for r in mixed], expected[order], atol=1e-5, rtol=0)
    with ThreadPoolExecutor(12) as pool:
        concurrent = list(pool.map(lambda t: srv.classify(t)["scores"], texts * 3))
    np.testing.assert_allclose(np.array(concurrent), np.tile(expected, (3, 1)), atol=1e-5, rtol=0)


def test_an_artifact_from_before_onnx_serves_on_torchscript(
    start_server: Any,
    default_model: str,
    tmp_path: Path,
    sst2_texts: list[str],
    agnews_texts: list[str],
) -> None:
    old = old_artifact(default_model, tmp_path)
    assert load_manifest(old).files() == ["model.pt"]
    refused = start_server("--model", str(old), "--runtime", "onnx", wait=False)
    assert refused.wait_exit(60) != 0 and "has no model.onnx" in refused.logs()
    srv = start_server("--model", str(old), "--workers", "2", "--spares", "0", *NO_SHEDDING)
    doc = json.loads(srv.request("GET", "/v1/model")[2])
    assert doc["runtime"] == "torch" and doc["precision"] == "fp32"
    texts = texts_of_every_length(sst2_texts, agnews_texts)
    check_served_scores(srv, texts, softmax(reference_logits(default_model, texts)))
    assert srv.logs().count('"runtime_fallback"') == 1  # said once, by the front-end


def test_int8_cost_is_printed_at_start_and_shown_in_v1_model(
    start_server: Any, default_model: str, sst2_texts: list[str]
) -> None:
    srv = start_server("--precision", "int8", "--workers", "1", "--spares", "0")
    doc = json.loads(srv.request("GET", "/v1/model")[2])
    assert doc["runtime"] == "onnx" and doc["precision"] == "int8"
    cost = doc["int8"]
    assert cost == load_manifest(default_model).int8
    printed = [x for x in srv.logs().splitlines() if x.startswith("ringserve: --precision int8")]
    assert len(printed) == 1
    assert f"accuracy cost {cost['accuracy_cost']}, 95% interval " in printed[0]
    assert (
        f"on {cost['argmax_agreement']} of {cost['texts']} texts of the publication" in printed[0]
    )
    texts = sst2_texts[:40]
    got = np.array([r["scores"] for r in srv.classify(texts)["results"]])
    fp32 = softmax(reference_logits(default_model, texts))
    assert np.abs(got - fp32).max() <= cost["max_score_diff"] + 0.05  # int8 publishes its drift
    assert (got.argmax(1) == fp32.argmax(1)).mean() >= 0.85


def test_each_graph_serves_the_same_scores_and_auto_says_what_it_timed(
    start_server: Any,
    default_model: str,
    tmp_path: Path,
    sst2_texts: list[str],
    agnews_texts: list[str],
) -> None:
    manifest = load_manifest(default_model)
    assert manifest.fused_file and manifest.graphs["fused"]["max_logit_drift"] <= 1e-5
    cache = tmp_path / "cache"  # a fresh one: auto must time, not find an earlier answer
    common = ["--model", default_model, "--cache-dir", str(cache), "--workers", "1", *NO_SHEDDING]
    servers = {
        g: start_server(*common, "--spares", "0", "--graph", g, wait=False)
        for g in ("plain", "fused", "auto")
    }
    texts = texts_of_every_length(sst2_texts, agnews_texts)
    expected = softmax(reference_logits(default_model, texts))
    docs = {}
    for graph, srv in servers.items():
        srv.wait_ready(1)
        docs[graph] = json.loads(srv.request("GET", "/v1/model")[2])
        assert docs[graph]["runtime"] == "onnx"
        check_served_scores(srv, texts, expected)
    assert docs["plain"]["graph"] == {"graph": "plain", "chosen_by": "--graph"}
    assert docs["fused"]["graph"] == {"graph": "fused", "chosen_by": "--graph"}
    auto = docs["auto"]["graph"]
    assert auto["chosen_by"] == "timing at start" and set(auto["ms"]) == {"plain", "fused"}
    assert auto["graph"] == min(auto["ms"], key=auto["ms"].__getitem__)
    line = f"ringserve: serving the {auto['graph']} fp32 graph (timing at start: plain "
    assert sum(x.startswith(line) for x in servers["auto"].logs().splitlines()) == 1
    # The answer is kept for this artifact on this CPU: the next start does not time again.
    again = graphpick.choose(default_model, manifest, "auto", cache)
    assert again["ms"] == auto["ms"] and "kept for this artifact" in again["chosen_by"]


def test_the_int8_recipe_is_the_most_faithful_fast_enough_one(default_model: str) -> None:
    manifest = load_manifest(default_model)
    cost, record = manifest.int8, manifest.graphs["int8_selection"]
    rows = {r["recipe"]: r for r in record["frontier"]}
    assert {"dynamic", "static QDQ (plain graph)", "static QDQ (fused graph)"} <= set(rows)
    assert any(r.startswith("dynamic, fp32 ") for r in rows)  # the sensitive groups kept
    assert record["recipe"] == cost["recipe"] and record["texts"] == 1000
    chosen = rows[cost["recipe"]]
    assert cost["speedup"] == chosen["speedup"]
    fast = [r for r in rows.values() if r["speedup"] >= record["min_speedup"]]
    if fast:  # else the rule's fallbacks (factory/int8.py best)
        assert chosen["argmax_agreement"] == max(r["argmax_agreement"] for r in fast)
    # The published figures come from the publication split, not the selection's frontier.
    assert "frontier" not in cost and "publication split" in cost["split"]


def test_int8_checked_runs_the_recipe_whose_second_look_promised_most(default_model: str) -> None:
    """int8-checked's graph is the frontier's recipe with the highest estimated speed under its
    own second look (the selection split), stored apart where it is not int8's recipe; its
    threshold is that recipe's, and its cost is read on the publication split."""
    manifest = load_manifest(default_model)
    record = manifest.graphs["int8_selection"]
    rows = {r["recipe"]: r for r in record["frontier"]}
    look, published = record["second_look"], manifest.int8_checked
    best = max(rows.values(), key=lambda r: r["checked"]["speedup_estimate"])
    assert look["recipe"] == published["recipe"] == best["recipe"]
    assert look["threshold"] == published["threshold"] == best["checked"]["threshold"]
    assert "publication split" in published["split"] and "selection split" in look["split"]
    own = look["recipe"] != manifest.int8["recipe"]
    assert bool(manifest.checked_file) == own
    if own:
        assert manifest.onnx_for("int8-checked") == manifest.checked_file != manifest.int8_file


def test_sigmoid_models_agree_label_by_label() -> None:
    base = np.array([[2.0, -1.0, 0.5], [-3.0, 0.2, 1.0]])
    moved = np.array([[1.0, -2.0, -0.1], [-3.0, 0.3, 2.0]])  # one of six decisions flips
    row = int8._row("r", moved, base, 1.0, "sigmoid")
    assert row["argmax_agreement"] == pytest.approx(5 / 6, abs=1e-4)
    one = int8._row("r", np.array([[0.5], [-0.2]]), np.array([[0.4], [0.1]]), 1.0, "sigmoid")
    assert one["argmax_agreement"] == 0.5  # a reranker's one output still has a decision


def test_a_text_alone_scores_the_same_on_every_core_and_lone_cores_0_keeps_one_session(
    default_model: str, sst2_texts: list[str], agnews_texts: list[str]
) -> None:
    from types import SimpleNamespace

    from ringserve.workers.runtimes.cpu import ort_runner

    manifest = load_manifest(default_model)
    spec = SimpleNamespace(
        model_dir=default_model, precision="fp32", graph="plain", threads=1, lanes=2,
        max_batch=32, lone_cores=True,
    )  # fmt: skip
    runner = ort_runner(spec, manifest)
    assert runner.duo is not None and runner.duo is not runner.session
    assert runner.duo.get_session_options().intra_op_num_threads == 2  # threads x lanes
    other = ort_runner(spec, manifest, like=runner)  # the second lane shares both sessions
    assert other.session is runner.session and other.duo is runner.duo
    items = make_items(default_model, texts_of_every_length(sst2_texts, agnews_texts)[:12])
    for it in items:
        runner.alone = False
        one = run(runner, [it])
        runner.alone = True
        both = run(runner, [it])
        np.testing.assert_allclose(both, one, atol=1e-5, rtol=0)
    assert ort_runner(SimpleNamespace(**{**vars(spec), "lone_cores": False}), manifest).duo is None
    assert ort_runner(SimpleNamespace(**{**vars(spec), "lanes": 1}), manifest).duo is None
