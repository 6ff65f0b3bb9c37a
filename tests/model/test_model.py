"""The model path: pinned token ids, padding invariance, fingerprints, strict weight loading."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from ringserve.factory import export
from ringserve.factory.build import default_artifact_dir
from ringserve.factory.encoder import Encoder, Layer, WeightError
from ringserve.factory.model import BertConfig, load_encoder_weights
from ringserve.workers.artifact import (
    ArtifactError,
    Manifest,
    compute_fingerprint,
    load_manifest,
    load_model,
    load_tokenizer,
    reference_logits,
)
from safetensors.torch import save_file

from devkit.builds import BARE_BUILDS, cheap_builds

LONG_TEXT = " ".join(["the movie was long and"] * 80)  # 400 tokens before truncation
# fmt: off
PINNED = {
    "a gripping, beautiful film": [101, 1037, 13940, 1010, 3376, 2143, 102],
    " hello ": [101, 7592, 102],
    "Crème brûlée in Zürich — naïve café ☕ 東京": [
        101, 13675, 21382, 7987, 9307, 2063, 1999, 10204, 1517, 15743, 7668, 100, 1879, 1755, 102,
    ],
    LONG_TEXT: [101, *([1996, 3185, 2001, 2146, 1998] * 51)[:254], 102],
}
# fmt: on
OTHERS = ["ok", "a dull, lifeless mess", "the plot twists are clever but the acting " * 12]


@pytest.fixture(scope="module", autouse=True)
def plain_graph_builds() -> Iterator[None]:
    """This module builds the default artifact twice to test the build itself (its lock, then
    export over it) and reads what it built on TorchScript alone; the fused graph, the int8
    recipe search and the published costs are tested in test_runtimes.py, on the artifact every
    other module serves, so here the build makes the plain ONNX graph alone (devkit/builds.py
    plain_builds: no fused graph, no int8, no bf16 cost; the two processes' first build
    took 15.6 s with them, 3.6 s without), its compact vectors calibrated on 10 texts
    (BARE_BUILDS: 1.4 s less a build)."""
    with cheap_builds(BARE_BUILDS):
        yield


@dataclass
class FirstBuilds:
    """Two processes asking at once for the default artifact in an empty cache directory."""

    cache: Path
    paths: set[str]
    returncodes: list[int | None]


@pytest.fixture(scope="module")
def first_builds(tmp_path_factory: pytest.TempPathFactory, plain_graph_builds: None) -> FirstBuilds:
    """The module's one build of the default artifact, made by two processes started at once
    (they must share it: test_concurrent_first_builds_share_one_artifact); every other test of
    the module reads or copies what they built."""
    cache = tmp_path_factory.mktemp("cache")
    code = (
        "import sys; from ringserve.factory.build import default_artifact_dir as d; "
        "print(d(sys.argv[1]))"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(cache)], stdout=subprocess.PIPE)
        for _ in range(2)
    ]
    paths = {proc.communicate(timeout=300)[0].decode().strip() for proc in procs}
    return FirstBuilds(cache, paths, [proc.returncode for proc in procs])


@pytest.fixture(scope="module")
def artifact(first_builds: FirstBuilds) -> Path:
    assert first_builds.returncodes == [0, 0]
    (path,) = first_builds.paths
    return Path(path)


@pytest.fixture(scope="module")
def manifest(artifact: Path) -> Manifest:
    return load_manifest(artifact)


@pytest.fixture(scope="module")
def model(artifact: Path) -> torch.jit.ScriptModule:
    return load_model(artifact)


def test_manifest_fields(manifest: Manifest) -> None:
    assert manifest.name == "sst2-minilm"
    assert manifest.labels == ["negative", "positive"]
    assert manifest.max_length == 256
    assert manifest.fingerprint.startswith("sha256:")
    assert manifest.extra["head"]["held_out_accuracy"] >= 0.80
    assert manifest.extra["compact"]["calibration"]["texts"] == 10  # BARE_BUILDS, in the child


def test_token_ids_are_pinned_and_unpadded(artifact: Path, manifest: Manifest) -> None:
    tokenizer = load_tokenizer(artifact, manifest.max_length)
    for text, ids in PINNED.items():
        encoding = tokenizer.encode(text)
        assert encoding.ids == ids, text
        assert encoding.attention_mask == [1] * len(ids)
    assert len(PINNED[LONG_TEXT]) == manifest.max_length
    assert tokenizer.padding is None


def _padded(rows: list[list[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.zeros((len(rows), width), dtype=torch.int64)
    mask = torch.zeros((len(rows), width), dtype=torch.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask


@pytest.mark.parametrize("text", list(PINNED)[:3])
def test_padding_and_batching_do_not_change_logits(
    artifact: Path, manifest: Manifest, model: torch.jit.ScriptModule, text: str
) -> None:
    tokenizer = load_tokenizer(artifact, manifest.max_length)
    alone = reference_logits(artifact, [text])[0]
    row = tokenizer.encode(text).ids
    others = [tokenizer.encode(t).ids for t in OTHERS]
    with torch.inference_mode():
        for bucket in (64, 128, 256):
            single = model(*_padded([row], bucket))[0].numpy()
            np.testing.assert_allclose(single, alone, rtol=0, atol=1e-5)
            fitting = [o for o in others if len(o) <= bucket]
            # first and last: a row between others adds nothing (up to four rows of 256 tokens
            # a forward, two fewer forwards a bucket)
            for position in (0, len(fitting)):
                batch = [*fitting[:position], row, *fitting[position:]]
                logits = model(*_padded(batch, bucket))[position].numpy()
                np.testing.assert_allclose(logits, alone, rtol=0, atol=1e-5)


def test_default_model_classifies_sentiment(artifact: Path) -> None:
    logits = reference_logits(artifact, ["a gripping, beautiful film", "a dull, lifeless mess"])
    assert logits.dtype == np.float32 and logits.shape == (2, 2)
    assert list(logits.argmax(axis=1)) == [1, 0]


def _copy(artifact: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "artifact"
    shutil.copytree(artifact, copy)
    return copy


def test_edited_model_byte_is_refused(artifact: Path, tmp_path: Path) -> None:
    copy = _copy(artifact, tmp_path)
    data = bytearray((copy / "model.pt").read_bytes())
    data[len(data) // 2] ^= 0x01
    (copy / "model.pt").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="fingerprint mismatch: manifest says sha256:"):
        load_manifest(copy)
    assert load_manifest(copy, verify=False).name == "sst2-minilm"
    assert compute_fingerprint(copy) != load_manifest(artifact).fingerprint


def test_edited_manifest_is_refused(artifact: Path, tmp_path: Path) -> None:
    copy = _copy(artifact, tmp_path)
    text = (copy / "manifest.json").read_text()
    (copy / "manifest.json").write_text(text.replace('"sst2-minilm"', '"sst2-minilm2"'))
    with pytest.raises(ArtifactError, match="fingerprint mismatch"):
        load_manifest(copy)


def test_missing_and_malformed_artifacts(artifact: Path, tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="not a directory"):
        load_manifest(tmp_path / "nope")
    with pytest.raises(ArtifactError, match=r"no manifest\.json"):
        load_manifest(tmp_path)
    copy = _copy(artifact, tmp_path)
    (copy / "tokenizer.json").unlink()
    with pytest.raises(ArtifactError, match=r"tokenizer file 'tokenizer\.json' is missing"):
        load_manifest(copy)
    text = (copy / "manifest.json").read_text()
    (copy / "manifest.json").write_text(text.replace('"max_length": 256', '"max_length": "256"'))
    with pytest.raises(ArtifactError, match="'max_length' must be an integer"):
        load_manifest(copy)


def test_default_artifact_is_reused(artifact: Path) -> None:
    assert default_artifact_dir(artifact.parent) == artifact


TINY = BertConfig(
    vocab_size=11,
    hidden_size=8,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=16,
    max_position_embeddings=16,
    type_vocab_size=2,
    layer_norm_eps=1e-12,
)


def _tiny_checkpoint() -> dict[str, torch.Tensor]:
    shapes = {
        "embeddings.word_embeddings.weight": [11, 8],
        "embeddings.position_embeddings.weight": [16, 8],
        "embeddings.token_type_embeddings.weight": [2, 8],
        "embeddings.LayerNorm.weight": [8],
        "embeddings.LayerNorm.bias": [8],
        "pooler.dense.weight": [8, 8],
        "pooler.dense.bias": [8],
    }
    layer = {
        "attention.self.query": [8, 8],
        "attention.self.key": [8, 8],
        "attention.self.value": [8, 8],
        "attention.output.dense": [8, 8],
        "attention.output.LayerNorm": [8],
        "intermediate.dense": [16, 8],
        "output.dense": [8, 16],
        "output.LayerNorm": [8],
    }
    for name, shape in layer.items():
        shapes[f"encoder.layer.0.{name}.weight"] = shape
        shapes[f"encoder.layer.0.{name}.bias"] = [shape[0]]
    generator = torch.Generator().manual_seed(0)
    return {k: torch.randn(v, generator=generator) for k, v in shapes.items()}


def test_weights_load_strictly(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    tensors = _tiny_checkpoint()
    save_file(tensors, str(path))
    encoder = Encoder(TINY)
    load_encoder_weights(encoder, TINY, path)
    layer = encoder.layers[0]
    assert isinstance(layer, Layer)
    assert torch.equal(layer.ffn_out.weight, tensors["encoder.layer.0.output.dense.weight"])

    save_file({**tensors, "encoder.layer.1.output.dense.bias": torch.zeros(8)}, str(path))
    with pytest.raises(WeightError, match=r"unexpected \['encoder.layer.1.output.dense.bias'\]"):
        load_encoder_weights(Encoder(TINY), TINY, path)
    save_file({k: v for k, v in tensors.items() if "key.bias" not in k}, str(path))
    with pytest.raises(WeightError, match="missing tensors"):
        load_encoder_weights(Encoder(TINY), TINY, path)
    save_file({**tensors, "embeddings.LayerNorm.bias": torch.zeros(9)}, str(path))
    with pytest.raises(WeightError, match="has shape"):
        load_encoder_weights(Encoder(TINY), TINY, path)


def test_concurrent_first_builds_share_one_artifact(first_builds: FirstBuilds) -> None:
    assert first_builds.returncodes == [0, 0]
    assert len(first_builds.paths) == 1
    built = Path(next(iter(first_builds.paths)))
    assert sorted(p.name for p in first_builds.cache.iterdir()) == [".build.lock", built.name]


def test_export_builds_a_loadable_artifact(
    default_model: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`export --head` over an artifact (the session's default one, built whole with every
    graph, max length 256, copied): the new one replaces it whole. This one builds the plain
    ONNX graph alone (devkit/builds.py BARE_BUILDS), so the replacement is seen to drop the
    old int8 and fused files. (The module's own build is plain too: the copy is the session's.)"""
    out = _copy(Path(default_model), tmp_path)
    assert load_manifest(out).max_length == 256 and load_manifest(out).int8_file
    head = Path(export.__file__).parent / "default_head" / "head.json"
    with cheap_builds(BARE_BUILDS):
        assert export.main(["--head", str(head), "--out", str(out), "--max-length", "128"]) == 0
    printed = capsys.readouterr().out.split()
    manifest = load_manifest(out)
    assert printed == [str(out), manifest.fingerprint]
    assert (manifest.name, manifest.max_length) == (out.name, 128)
    assert manifest.labels == ["negative", "positive"]
    assert not any(name.startswith(("model.int8", "model.fused")) for name in os.listdir(out))
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]  # nothing left beside it
    assert export.main(["--head", str(head), "--out", str(tmp_path)]) == 1  # not an artifact
    assert "refusing to replace" in capsys.readouterr().err
