"""`ringserve export --from` of sparse (SPLADE) models, in process: a tiny random BERT,
DistilBERT and RoBERTa `*ForMaskedLM` with `--pooling splade` and a sentence-transformers
SparseEncoder directory, their TorchScript and ONNX graphs against sentence-transformers'
`SparseEncoder.encode` of the same directory (1e-4, the nonzero terms exactly), int8's and bf16's
published cost, and what is refused, by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from ringserve.factory import export, int8, sparse
from ringserve.workers.artifact import load_manifest, load_model, open_tokenizer
from ringserve.workers.runtimes.onnx_model import open_session

from devkit.builds import CHEAP_BUILDS, cheap_builds, plain_builds
from devkit.hfmodels import MAX_LENGTH, NEWS, SST2
from devkit.sparse_models import encode, reference, save_mlm, save_sparse_encoder

pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")
pytestmark = pytest.mark.timeout(600)
TOL = 1e-4
TEXTS = ["ok", "Crème brûlée in Zürich — naïve café 東京 🎬", SST2[3], NEWS[2] * 3]
# The int8 build's published cost is read on this many publication rows (10 queries ranking 30
# documents), not cheap_builds' 400: its fields are tested here, not its figures, and each row
# is a 30,522-term vector for fp32, int8 and bf16 alike (400 rows: 10 s of the export, 40: 2 s).
PUBLICATION_ROWS = 40


def exported(source: Path, out: Path, *extra: str, plain: bool = True) -> Path:
    rows = {int8.PUBLICATION_ROWS_ENV: str(PUBLICATION_ROWS)}
    with plain_builds() if plain else cheap_builds(CHEAP_BUILDS | rows):
        assert export.main(["--from", str(source), "--out", str(out), *extra]) == 0
    return out


def served_rows(artifact: Path, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(TorchScript, ONNX) pooled weights [N, V], the texts padded into one batch."""
    manifest = load_manifest(artifact)
    tok = open_tokenizer(artifact / manifest.tokenizer_file, manifest.max_length)
    enc = tok.encode_batch(texts)
    width = max(len(e.ids) for e in enc)
    ids = np.zeros((len(texts), width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, e in enumerate(enc):
        ids[i, : len(e.ids)], mask[i, : len(e.ids)] = e.ids, 1
    with torch.no_grad():
        script = load_model(artifact)(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    session = open_session(artifact / manifest.onnx_file)
    graph = session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    return script, graph


def assert_equal_vectors(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(np.flatnonzero(g), np.flatnonzero(w))  # the terms, exactly
    assert np.abs(got - want).max() < TOL


@pytest.mark.parametrize("family", ["bert", "distilbert", "roberta"])
def test_a_masked_lm_with_splade_pooling_equals_sparse_encoder(family: str, tmp_path: Path) -> None:
    source = save_mlm(family, tmp_path)
    artifact = exported(source, tmp_path / "art", "--pooling", "splade")
    manifest = load_manifest(artifact)
    assert manifest.task == ["sparse"] and manifest.labels == [] and manifest.sparse
    assert manifest.extra["pooling"] == "splade" and manifest.max_length == MAX_LENGTH
    want = encode(reference(source), TEXTS)
    script, graph = served_rows(artifact, TEXTS)
    assert_equal_vectors(script, want)
    assert_equal_vectors(graph, want)
    counts = (want > 0).sum(axis=1)
    assert counts.min() > 5 and counts.max() < want.shape[1] // 4  # sparse, as SPLADE's are


def test_a_sparse_encoder_directory_equals_its_encode_and_publishes_int8(tmp_path: Path) -> None:
    source = save_sparse_encoder(save_mlm("bert", tmp_path, seed=11), tmp_path)
    artifact = exported(source, tmp_path / "art", plain=False)
    manifest = load_manifest(artifact)
    assert manifest.extra["format"] == "sentence-transformers"
    want = encode(reference(source), TEXTS)
    for got in served_rows(artifact, TEXTS):
        assert_equal_vectors(got, want)
    cost = manifest.int8
    assert manifest.int8_file and cost["recipe"] == "dynamic"
    for key in ("term_overlap_at_32", "rank_overlap_at_10", "top1_agreement"):
        assert 0.0 <= cost[key] <= 1.0 and len(cost[f"{key}_ci95"]) == 2
    assert cost["queries"] + cost["documents"] == cost["texts"] == PUBLICATION_ROWS
    assert "publication" in cost["split"]


def test_sum_pooling_and_log1p_relu_are_read_from_the_directory(tmp_path: Path) -> None:
    source = save_sparse_encoder(save_mlm("bert", tmp_path, seed=3), tmp_path)
    config = source / "1_SpladePooling" / "config.json"
    raw = json.loads(config.read_text())
    config.write_text(json.dumps(raw | {"pooling_strategy": "sum",
                                        "activation_function": "log1p_relu"}))  # fmt: skip
    artifact = exported(source, tmp_path / "art")
    assert load_manifest(artifact).extra["splade"] == {"pooling": "sum", "activation": "log1p_relu"}
    want = encode(reference(source), TEXTS)
    for got in served_rows(artifact, TEXTS):
        assert_equal_vectors(got, want)


def test_what_is_refused_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mlm = save_mlm("bert", tmp_path)
    out = str(tmp_path / "out")
    assert export.main(["--from", str(mlm), "--out", out]) == 1
    assert "--pooling splade" in capsys.readouterr().err
    assert export.main(["--from", str(mlm), "--out", out, "--pooling", "mean"]) == 1
    assert "--pooling splade" in capsys.readouterr().err
    base = tmp_path / "base"
    shutil.copytree(mlm, base)
    config = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps(config | {"architectures": ["BertModel"]}))
    assert export.main(["--from", str(base), "--out", out, "--pooling", "splade"]) == 1
    assert "masked-language model" in capsys.readouterr().err
    st = save_sparse_encoder(mlm, tmp_path)
    modules = json.loads((st / "modules.json").read_text())
    modules[0]["type"] = "sentence_transformers.base.modules.router.Router"
    (st / "modules.json").write_text(json.dumps(modules))
    assert export.main(["--from", str(st), "--out", out]) == 1
    assert "inference-free SPLADE layout" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_head_runs_on_real_tokens_only() -> None:
    """Padding changes nothing and costs no row of the head: a text alone and padded into a
    batch beside a longer one give the same row."""
    from ringserve.factory.encoder import HfConfig

    c = HfConfig.bert(vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=12, max_position_embeddings=16, type_vocab_size=2,
                      layer_norm_eps=1e-12)  # fmt: skip
    torch.manual_seed(0)
    model = sparse.Splade(c).eval()
    ids = torch.tensor([[1, 5, 7, 2, 0, 0], [1, 9, 9, 9, 9, 2]])
    mask = (ids > 0).long()
    with torch.no_grad():
        both = model(ids, mask)
        alone = model(ids[:1, :4], mask[:1, :4])
    assert torch.allclose(both[0], alone[0], atol=1e-6)
