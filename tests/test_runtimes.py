"""The CPU runtimes: ONNX files in the artifact, TorchScript and ONNX Runtime giving the same
scores (per runtime and across), an artifact from before ONNX still serving, and int8's cost."""

from __future__ import annotations

import json
import random
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import ServerProc
from workers.artifact import (
    ArtifactError,
    Manifest,
    compute_fingerprint,
    load_manifest,
    load_model,
    load_tokenizer,
    reference_logits,
)
from workers.batcher import Item
from workers.onnx_model import choose_runtime, open_session
from workers.runtime import CpuRunner, OrtRunner, softmax

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


def test_the_onnx_files_are_fingerprinted(default_model: str, tmp_path: Path) -> None:
    manifest = load_manifest(default_model)
    assert manifest.files() == ["model.pt", "model.onnx", "model.int8.onnx"]
    cost = manifest.int8
    assert cost["texts"] == 1000 and 0.5 < cost["argmax_agreement"] <= 1
    assert cost["accuracy_cost"] == pytest.approx(cost["accuracy_fp32"] - cost["accuracy_int8"])
    for name in ("model.onnx", "model.int8.onnx"):
        copy = tmp_path / name
        shutil.copytree(default_model, copy)
        data = bytearray((copy / name).read_bytes())
        data[len(data) // 2] ^= 0x01
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
    }
    expected = softmax(reference_logits(default_model, texts))  # TorchScript, each text alone
    for runner in runners.values():
        runner.warm()
        alone = np.concatenate([run(runner, [it]) for it in items])
        np.testing.assert_allclose(alone, expected, atol=1e-5, rtol=0)
        shuffled = random.Random(5).sample(items, len(items))
        mixed = run(runner, shuffled)  # every length in one batch, padded to the longest
        np.testing.assert_allclose(mixed, expected[[it.msg_id for it in shuffled]], atol=1e-5)


def old_artifact(default_model: str, tmp_path: Path) -> Path:
    """The default artifact as format 1 wrote it: TorchScript, tokenizer and manifest only."""
    old = tmp_path / "old"
    old.mkdir()
    for name in ("model.pt", "tokenizer.json"):
        shutil.copyfile(Path(default_model) / name, old / name)
    raw = json.loads((Path(default_model) / "manifest.json").read_text())
    for key in ("onnx_file", "int8_file", "int8"):
        del raw[key]
    (old / "manifest.json").write_text(json.dumps(raw))
    raw["fingerprint"] = compute_fingerprint(old)
    (old / "manifest.json").write_text(json.dumps(raw))
    return old


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
    srv = start_server("--model", str(old), "--workers", "2", "--spares", "0")
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
    assert f"accuracy cost {cost['accuracy_cost']} " in printed[0]
    assert f"on {cost['argmax_agreement']} of {cost['texts']} held-out" in printed[0]
    texts = sst2_texts[:40]
    got = np.array([r["scores"] for r in srv.classify(texts)["results"]])
    fp32 = softmax(reference_logits(default_model, texts))
    assert np.abs(got - fp32).max() <= cost["max_score_diff"] + 0.05  # int8 publishes its drift
    assert (got.argmax(1) == fp32.argmax(1)).mean() >= 0.85
