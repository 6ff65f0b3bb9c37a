"""`ringserve export --from` a `*ForTokenClassification` of every family (factory/token_heads.py):
the artifact's TorchScript and ONNX graphs give transformers' own token logits, its manifest
says `token-classify` with the model's labels, and the full build publishes int8's (and, on a
CPU with bf16, bf16's) cost as the entity-level F1 against fp32 on the publication split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from ringserve.factory import export
from ringserve.workers.artifact import load_manifest, load_model, load_tokenizer

from devkit.builds import cheap_builds, plain_builds
from devkit.token_models import FAMILIES, LABELS, TEXTS
from devkit.token_models import save_token_classifier as save

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.timeout(600)
TOL = 1e-4


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_exports_its_token_logits(tmp_path: Path, name: str) -> None:
    import onnxruntime as ort

    source = save(name, tmp_path / "src")
    out = tmp_path / "art"
    with plain_builds():
        assert export.main(["--from", str(source), "--out", str(out)]) == 0
    m = load_manifest(out)
    assert m.task == ["token-classify"] and m.labels == LABELS and m.activation == "softmax"
    assert m.extra["architecture"].endswith("ForTokenClassification")
    assert m.extra["special_tokens"] == 2 and m.extra["unk_token_id"] is not None
    hf = transformers.AutoModelForTokenClassification.from_pretrained(source).eval()
    scripted = load_model(out)
    session = ort.InferenceSession(str(out / m.onnx_file), providers=["CPUExecutionProvider"])
    tok = load_tokenizer(out, m.max_length)
    encodings = tok.encode_batch(TEXTS)
    width = max(len(e.ids) for e in encodings)
    ids = np.zeros((len(TEXTS), width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, e in enumerate(encodings):
        ids[i, : len(e.ids)], mask[i, : len(e.ids)] = e.ids, 1
    with torch.no_grad():
        want = hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits
        ours = scripted(torch.from_numpy(ids), torch.from_numpy(mask))
    graph = session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    assert graph.shape == (len(TEXTS), width, len(LABELS))
    real = mask.astype(bool)  # padding's logits are nobody's
    # The sharpened heads give logits up to about 7 in size, where fp32's own rounding through
    # a different kernel order is about 1e-5 of the value (DeBERTa-v3's ONNX graph: 1.006e-4 at
    # -6.53): 1e-4 and 1e-5 of the logit's size, and the probabilities within 1e-4 outright.
    for got in (ours.numpy(), graph):
        np.testing.assert_allclose(got[real], want.numpy()[real], atol=TOL, rtol=1e-5)
        probs, want_probs = torch.from_numpy(got[real]).softmax(-1), want[real].softmax(-1)
        np.testing.assert_allclose(probs.numpy(), want_probs.numpy(), atol=TOL, rtol=0)


def test_the_full_build_publishes_int8s_entity_f1(tmp_path: Path) -> None:
    source = save("bert", tmp_path / "src")
    out = tmp_path / "art"
    with cheap_builds():  # int8's publication on the split's first 400 rows
        assert export.main(["--from", str(source), "--out", str(out)]) == 0
    m = load_manifest(out)
    assert m.int8_file and m.int8["recipe"] == "dynamic" and m.int8["texts"] == 400
    assert "publication split" in m.int8["split"] and m.int8["aggregation"] == "simple"
    low, high = m.int8["entity_f1_ci95"]
    assert 0 < low <= m.int8["entity_f1"] <= high <= 1 and m.int8["entities_fp32"] > 0
    assert 0 < m.int8["argmax_agreement"] <= 1
    if m.bf16:  # a building CPU with bf16 (OpenVINO)
        assert m.bf16["runtime"] == "openvino" and 0 < m.bf16["entity_f1"] <= 1


def test_a_mismatched_tokenizer_is_refused(tmp_path: Path) -> None:
    source = save("deberta-v3", tmp_path / "src")
    other = save("bert", tmp_path / "other")  # MiniLM's 30,522 tokens, DeBERTa's 300 rows
    (source / "tokenizer.json").write_bytes((other / "tokenizer.json").read_bytes())
    with plain_builds():
        assert export.main(["--from", str(source), "--out", str(tmp_path / "art")]) == 1
    assert not (tmp_path / "art").exists()
