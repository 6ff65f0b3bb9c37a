"""Hugging Face classifiers: tiny random models of every supported architecture, built with
`transformers` at test time (nothing is downloaded), exported with `ringserve export --from`,
served by a real server, and compared with the `transformers` model's own scores."""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from ringserve.factory import export
from ringserve.workers.artifact import load_manifest
from tokenizers import Tokenizer

from devkit.builds import cheap_builds
from devkit.exports import HfExports
from devkit.hfmodels import MAX_LENGTH, MODELS, NEWS, SIZE, SST2
from devkit.server import ServerProc

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.timeout(300)
TOL = 1e-4
# Mixed lengths: a word, sentences, and news texts past MAX_LENGTH tokens.
TEXTS = ["ok", "Crème brûlée in Zürich — naïve café", *SST2[:6], *NEWS[:4]]
PAIRS = [(SST2[10 + i], NEWS[5 + i] if i % 2 else SST2[30 + i]) for i in range(8)]


def hf_scores(name: str, source: Path, items: list[Any]) -> np.ndarray:
    """The transformers model's own scores, each input tokenized and run alone (no padding)."""
    model = transformers.AutoModelForSequenceClassification.from_pretrained(source).eval()
    tok = Tokenizer.from_file(str(source / "tokenizer.json"))
    tok.no_padding()  # the MiniLM tokenizer.json pads to 128
    tok.enable_truncation(MAX_LENGTH)
    types = MODELS[name][3]
    rows = []
    with torch.no_grad():
        for item in items:
            enc = tok.encode(*item) if isinstance(item, tuple) else tok.encode(item)
            kw = {"input_ids": torch.tensor([enc.ids])}
            kw["attention_mask"] = torch.ones_like(kw["input_ids"])
            if types:
                kw["token_type_ids"] = torch.tensor([enc.type_ids])
            logits = model(**kw).logits[0]
            multi = model.config.problem_type == "multi_label_classification"
            sigmoid = multi or model.config.num_labels == 1
            rows.append((logits.sigmoid() if sigmoid else logits.softmax(-1)).numpy())
    return np.stack(rows)


class Served:
    def __init__(self, name: str, source: Path, artifact: Path, server: ServerProc) -> None:
        self.name, self.source, self.artifact, self.server = name, source, artifact, server
        self.model = load_manifest(artifact).name
        self.expected: dict[str, np.ndarray] = {}

    def want(self, key: str, items: list[Any]) -> np.ndarray:
        if key not in self.expected:
            self.expected[key] = hf_scores(self.name, self.source, items)
        return self.expected[key]


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, hf_exports: HfExports
) -> Iterator[dict[str, Served]]:
    """Every model exported (once a session: devkit/exports.py, `ringserve export --from` with
    cheap_builds, as scores are tested here, not int8's choice or its cost) and served, one
    small server each, all started at once."""
    root = tmp_path_factory.mktemp("hf")
    out: dict[str, Served] = {}
    try:
        for name in MODELS:
            source, artifact = hf_exports.get(name)
            server = ServerProc(root, ["--model", str(artifact), "--workers", "1", "--spares", "0"])
            out[name] = Served(name, source, artifact, server)
        for s in out.values():
            s.server.wait_ready(1)
        yield out
    finally:
        for s in out.values():
            assert s.server.stop() == 0


NAMES = list(MODELS)


def classify(server: ServerProc, body: dict[str, Any]) -> tuple[int, Any]:
    status, _, data = server.request("POST", "/v1/classify", body)
    return status, json.loads(data)


def scores_of(answer: dict[str, Any]) -> np.ndarray:
    return np.array([r["scores"] for r in answer["results"]], dtype=np.float64)


@pytest.mark.parametrize("name", NAMES)
def test_single_texts_and_mixed_batches(served: dict[str, Served], name: str) -> None:
    s = served[name]
    want = s.want("texts", TEXTS)
    for i in (0, 1, len(TEXTS) - 1):  # a word, accents, a truncated news text: one at a time
        status, answer = classify(s.server, {"text": TEXTS[i]})
        assert status == 200, answer
        np.testing.assert_allclose(answer["scores"], want[i], atol=TOL, rtol=0)
        assert answer["label_id"] == int(np.argmax(want[i]))
    status, answer = classify(s.server, {"texts": TEXTS})  # one mixed-length batch
    assert status == 200, answer
    np.testing.assert_allclose(scores_of(answer), want, atol=TOL, rtol=0)
    labels = load_manifest(s.artifact).labels
    assert [r["label"] for r in answer["results"]] == [labels[int(i)] for i in want.argmax(1)]


@pytest.mark.parametrize("name", NAMES)
def test_pairs(served: dict[str, Served], name: str) -> None:
    """Pairs get the tokenizer's own special tokens and token types, truncated longest-first;
    DistilBERT and RoBERTa take pairs too (their tokenizers give no token types, as in HF)."""
    s = served[name]
    want = s.want("pairs", PAIRS)
    status, answer = classify(s.server, {"text": PAIRS[0][0], "text_pair": PAIRS[0][1]})
    assert status == 200, answer
    np.testing.assert_allclose(answer["scores"], want[0], atol=TOL, rtol=0)
    texts, pairs = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    status, answer = classify(s.server, {"texts": texts, "text_pairs": pairs})
    assert status == 200, answer
    np.testing.assert_allclose(scores_of(answer), want, atol=TOL, rtol=0)
    # A pair is not its first text alone: the second segment reached the model.
    alone = s.want("texts-of-pairs", texts)
    assert np.abs(alone - want).max() > 1e-3


def test_pairs_and_singles_mixed_in_one_batch(served: dict[str, Served]) -> None:
    s = served["bert"]
    body = {"texts": [PAIRS[1][0], TEXTS[3]], "text_pairs": [PAIRS[1][1], PAIRS[2][1]]}
    status, answer = classify(s.server, body)
    assert status == 200, answer
    want = s.want("pairs", PAIRS)[1]
    np.testing.assert_allclose(answer["results"][0]["scores"], want, atol=TOL, rtol=0)
    both = [(PAIRS[1][0], PAIRS[1][1]), (TEXTS[3], PAIRS[2][1])]
    np.testing.assert_allclose(scores_of(answer), hf_scores("bert", s.source, both), atol=TOL)


def test_concurrent_clients(served: dict[str, Served]) -> None:
    """Four threads per model, all models at once, singles and pairs interleaved."""
    errors: list[str] = []
    wanted = {n: (s.want("texts", TEXTS), s.want("pairs", PAIRS)) for n, s in served.items()}

    def client(name: str, seed: int) -> None:
        s, (want_t, want_p) = served[name], wanted[name]
        for k in range(6):
            i = (seed * 7 + k * 3) % len(PAIRS)
            if k % 2:
                body: dict[str, Any] = {"text": PAIRS[i][0], "text_pair": PAIRS[i][1]}
                want = want_p[i]
            else:
                body, want = {"text": TEXTS[i]}, want_t[i]
            status, answer = classify(s.server, body)
            if status != 200 or np.abs(np.array(answer["scores"]) - want).max() > TOL:
                errors.append(f"{name} {body}: {status} {answer}")

    threads = [threading.Thread(target=client, args=(n, k)) for n in served for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


@pytest.mark.parametrize("name", NAMES)
def test_model_info_says_labels_and_activation(served: dict[str, Served], name: str) -> None:
    s = served[name]
    status, _, body = s.server.request("GET", "/v1/model")
    info = json.loads(body)
    config = transformers.AutoConfig.from_pretrained(s.source)
    labels = [config.id2label[i] for i in range(config.num_labels)]
    sigmoid = name in ("xlmr-reranker", "electra-multilabel")
    assert status == 200 and info["labels"] == labels and info["max_length"] == MAX_LENGTH
    assert info["activation"] == ("sigmoid" if sigmoid else "softmax")
    assert info["architecture"] == config.architectures[0]
    # Every architecture exports to ONNX, so the CPU default (auto) serves it on ONNX Runtime:
    # no architecture falls back to TorchScript unnoticed.
    assert load_manifest(s.artifact).onnx_file and info["runtime"] == "onnx"
    client = httpclient.InferenceServerClient(f"127.0.0.1:{s.server.port}")
    try:
        meta = client.get_model_metadata(s.model)
        config_view = client.get_model_config(s.model)
    finally:
        client.close()
    assert meta["parameters"]["activation"] == info["activation"]
    assert config_view["parameters"]["activation"]["string_value"] == info["activation"]
    assert [i["name"] for i in meta["inputs"]] == ["text", "text_pair"]


def bytes_input(name: str, texts: list[str], binary: bool) -> httpclient.InferInput:
    inp = httpclient.InferInput(name, [len(texts)], "BYTES")
    inp.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_), binary)
    return inp


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("name", NAMES)
def test_tritonclient(served: dict[str, Served], name: str, binary: bool) -> None:
    s = served[name]
    client = httpclient.InferenceServerClient(f"127.0.0.1:{s.server.port}", network_timeout=60)
    texts, pairs = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    try:
        single = client.infer(s.model, [bytes_input("text", TEXTS, binary)])
        both = [bytes_input("text", texts, binary), bytes_input("text_pair", pairs, binary)]
        paired = client.infer(s.model, both)
    finally:
        client.close()
    np.testing.assert_allclose(single.as_numpy("scores"), s.want("texts", TEXTS), atol=TOL)
    np.testing.assert_allclose(paired.as_numpy("scores"), s.want("pairs", PAIRS), atol=TOL)


# -- bad input ------------------------------------------------------------------------------------
BAD_BODIES = [
    ({"texts": ["a", "b"], "text_pairs": ["x"]}, "as long as texts"),
    ({"texts": ["a"], "text_pairs": "x"}, "Expected `array`, got `str` - at `$.text_pairs`"),
    ({"text": "a", "text_pair": ""}, "empty"),
    ({"text": "a", "text_pair": 3}, "Expected `str`, got `int` - at `$.text_pair`"),
    ({"texts": ["a"], "text_pairs": ["  "]}, "empty"),
    ({"text": "a", "text_pairs": ["x"]}, "goes with"),
    ({"texts": ["a"], "text_pair": "x"}, "goes with"),
]


@pytest.mark.parametrize("body", BAD_BODIES, ids=[str(i) for i in range(len(BAD_BODIES))])
def test_bad_pairs_get_400(served: dict[str, Served], body: tuple[dict[str, Any], str]) -> None:
    status, answer = classify(served["bert"].server, body[0])
    assert status == 400 and body[1] in answer["error"], answer


def test_kserve_pair_of_other_length_gets_400(served: dict[str, Served]) -> None:
    s = served["bert"]
    doc = {
        "inputs": [
            {"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]},
            {"name": "text_pair", "datatype": "BYTES", "shape": [1], "data": ["x"]},
        ]
    }
    status, _, body = s.server.request("POST", f"/v2/models/{s.model}/infer", doc)
    assert status == 400 and "text_pair has 1 texts" in json.loads(body)["error"]
    doc["inputs"] = doc["inputs"][1:]
    status, _, body = s.server.request("POST", f"/v2/models/{s.model}/infer", doc)
    assert status == 400 and "text" in json.loads(body)["error"]


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


def refused(source: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Export must fail with exit 1, write nothing at `out` and leave no temp dir behind."""
    before = sorted(os.listdir(out.parent)) if out.parent.exists() else []
    assert export.main(["--from", str(source), "--out", str(out)]) == 1
    assert not out.exists()
    assert (sorted(os.listdir(out.parent)) if out.parent.exists() else []) == before
    return capsys.readouterr().err


def test_export_refuses_bad_checkpoints(
    served: dict[str, Served], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = served["distilbert"].source
    out = tmp_path / "out" / "art"

    def copy(name: str) -> Path:
        dst = tmp_path / name
        dst.mkdir()
        for f in good.iterdir():
            (dst / f.name).write_bytes(f.read_bytes())
        return dst

    unsupported = copy("gpt2")
    config = json.loads((unsupported / "config.json").read_text())
    config["architectures"] = ["GPT2ForSequenceClassification"]
    (unsupported / "config.json").write_text(json.dumps(config))
    err = refused(unsupported, out, capsys)
    assert "GPT2ForSequenceClassification" in err and "not supported" in err
    assert "BertForSequenceClassification" in err and "ElectraForSequenceClassification" in err

    no_tokenizer = copy("no-tok")
    (no_tokenizer / "tokenizer.json").unlink()
    assert "no tokenizer.json" in refused(no_tokenizer, out, capsys)

    # config.json's vocab_size disagrees with the weights' embedding rows.
    big_tok = copy("big-tok")
    (big_tok / "tokenizer.json").write_bytes((good / "tokenizer.json").read_bytes())
    config = json.loads((big_tok / "config.json").read_text())
    config["vocab_size"] = 400
    (big_tok / "config.json").write_text(json.dumps(config))
    err = refused(big_tok, out, capsys)
    assert "word_embeddings.weight has shape [30522, 32], expected [400, 32]" in err

    # A tokenizer that is not the model's: 30,522 WordPiece ids against 400 embedding rows.
    mismatched = served["roberta"].source
    wrong = copy("wrong-tok")
    (wrong / "tokenizer.json").write_bytes((good / "tokenizer.json").read_bytes())
    for f in ("config.json", "model.safetensors"):
        (wrong / f).write_bytes((mismatched / f).read_bytes())
    err = refused(wrong, out, capsys)
    assert "tokenizer.json has 30522 tokens but the embeddings have" in err

    extra = copy("extra-tensor")
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(extra / "model.safetensors"))
    tensors["lm_head.bias"] = torch.zeros(3)
    save_file(tensors, str(extra / "model.safetensors"))
    assert "unexpected ['lm_head.bias']" in refused(extra, out, capsys)

    missing = copy("missing-tensor")
    tensors = load_file(str(missing / "model.safetensors"))
    del tensors["pre_classifier.bias"]
    save_file(tensors, str(missing / "model.safetensors"))
    assert "missing tensors ['pre_classifier.bias']" in refused(missing, out, capsys)


def test_failed_export_keeps_the_old_artifact(
    served: dict[str, Served], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "art"
    shutil.copytree(served["bert"].artifact, out)  # an artifact export made (the module's)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    broken = tmp_path / "broken"
    broken.mkdir()
    t5 = {"architectures": ["T5ForConditionalGeneration"]}
    (broken / "config.json").write_text(json.dumps(t5))
    (broken / "tokenizer.json").write_text("{}")
    assert export.main(["--from", str(broken), "--out", str(out)]) == 1
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert leftovers(tmp_path) == []
    assert "T5ForConditionalGeneration" in capsys.readouterr().err


@pytest.mark.parametrize("name", NAMES)
def test_torchscript_and_cuda_runners_match(served: dict[str, Served], name: str) -> None:
    """The artifact's TorchScript model through the CPU runner and the CUDA runner's static-shape
    path (on the test-only fake GPU: there is no GPU here), singles and pairs in one batch."""
    from ringserve.workers.artifact import load_model, load_tokenizer
    from ringserve.workers.batches import Item
    from ringserve.workers.runtimes.cpu import ACTIVATIONS, CpuRunner
    from ringserve.workers.runtimes.cuda import CudaRunner
    from ringserve.workers.spec import FAKE_GPU

    s = served[name]
    manifest = load_manifest(s.artifact)
    items: list[Any] = [*TEXTS[:5], *PAIRS[:5]]
    encodings = load_tokenizer(s.artifact, MAX_LENGTH).encode_batch(items)
    batch = []
    for i, (item, enc) in enumerate(zip(items, encodings, strict=True)):
        types = enc.type_ids if manifest.token_types and isinstance(item, tuple) else None
        batch.append(Item(i, 0, 0, enc.ids, types=types))
    model = load_model(s.artifact)
    activation = ACTIVATIONS[manifest.activation]
    want = np.concatenate([s.want("texts", TEXTS)[:5], s.want("pairs", PAIRS)[:5]])
    cpu = CpuRunner(model, MAX_LENGTH, 16, activation)
    cpu.warm()  # as a worker does before it says ready
    longest = max(len(it.ids) for it in batch)
    cpu.fill(longest, batch)
    np.testing.assert_allclose(cpu.forward(longest, len(batch)), want, atol=TOL, rtol=0)
    gpu = CudaRunner(model, (16, MAX_LENGTH), 16, FAKE_GPU, activation=activation)
    gpu.warm()
    gpu.fill(MAX_LENGTH, batch)
    np.testing.assert_allclose(gpu.forward(MAX_LENGTH, len(batch)), want, atol=TOL, rtol=0)


def test_ringserve_batch_scores_pairs(served: dict[str, Served], tmp_path: Path) -> None:
    """`ringserve batch` sends a JSON line's text_pair with its text, as /v1/classify does."""
    import subprocess
    import sys

    from devkit.launcher import ROOT

    s = served["bert"]
    lines = [{"text": a, "text_pair": b} for a, b in PAIRS[:4]] + [{"text": t} for t in TEXTS[:3]]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    cmd = [sys.executable, "-m", "ringserve.service.cli", "batch", "--input", str(src), "--output"]
    cmd += [str(out), "--model", str(s.artifact), "--workers", "1"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    got = np.array([json.loads(line)["scores"] for line in out.read_text().splitlines()])
    want = np.concatenate([s.want("pairs", PAIRS)[:4], s.want("texts", TEXTS)[:3]])
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)


def test_export_and_serving_code_never_import_transformers(
    served: dict[str, Served], tmp_path: Path
) -> None:
    """Export and the serving modules run with `transformers` made unimportable."""
    import subprocess
    import sys

    from devkit.launcher import ROOT

    source, out = served["electra-multilabel"].source, tmp_path / "art"
    script = f"""
import sys
sys.modules["transformers"] = None  # any import of it now raises ImportError
import ringserve.service.app, ringserve.service.cli
import ringserve.workers.process.worker, ringserve.workers.runtimes.cpu
import ringserve.workers.runtimes.cuda
from ringserve.factory.export import main
assert main(["--from", {str(source)!r}, "--out", {str(out)!r}]) == 0
from ringserve.workers.artifact import load_model
import torch
ids = torch.tensor([[101, 2000, 102]])
print(load_model({str(out)!r})(ids, torch.ones_like(ids)))
"""
    with cheap_builds():  # the child's export: the imports are tested here, not int8's choice
        run = subprocess.run(
            [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=240
        )
    assert run.returncode == 0, run.stderr
    assert load_manifest(out).activation == "sigmoid"


def test_fields_missing_from_config_take_the_transformers_defaults(tmp_path: Path) -> None:
    from ringserve.factory.hf import read_config

    path = tmp_path / "config.json"
    for arch, pad, embed in (
        ("RobertaForSequenceClassification", 1, 32),
        ("ElectraForSequenceClassification", 0, 128),
    ):
        raw = {"architectures": [arch], "vocab_size": 9, "max_position_embeddings": 8} | SIZE
        path.write_text(json.dumps(raw))
        config = read_config(path)
        assert (config.pad_token_id, config.embedding_size) == (pad, embed)
        assert config.labels == ("LABEL_0", "LABEL_1") and config.activation == "softmax"
        assert config.type_vocab_size == 2 and config.layer_norm_eps == 1e-12


def hf_window_scores(source: Path, windows: list[list[int]]) -> np.ndarray:
    """The transformers model's sigmoids on each window's ids, run alone."""
    model = transformers.AutoModelForSequenceClassification.from_pretrained(source).eval()
    rows = []
    with torch.no_grad():
        for ids in windows:
            t = torch.tensor([ids])
            kw = {"input_ids": t, "attention_mask": torch.ones_like(t)}
            kw["token_type_ids"] = torch.zeros_like(t)
            rows.append(model(**kw).logits[0].sigmoid().numpy())
    return np.stack(rows)


def test_a_multi_label_model_takes_the_maximum_over_windows(
    served: dict[str, Served], tmp_path: Path
) -> None:
    """Sigmoid scores of a windowed text are each label's maximum over its windows, the windows
    built here by hand: [CLS] 22 tokens [SEP], each starting 4 tokens before the last ended."""
    s = served["electra-multilabel"]
    srv = ServerProc(
        tmp_path,
        ["--model", str(s.artifact), "--workers", "1", "--spares", "0",
         "--long-text", "window", "--window-stride", "4"],
    )  # fmt: skip
    try:
        srv.wait_ready(1)
        text = " ".join(TEXTS[-3:])
        tok = Tokenizer.from_file(str(s.source / "tokenizer.json"))
        tok.no_padding()
        tok.no_truncation()
        body = tok.encode(text, add_special_tokens=False).ids
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        room = MAX_LENGTH - 2
        windows, start = [], 0
        while True:
            windows.append([cls, *body[start : start + room], sep])
            if start + room >= len(body):
                break
            start += room - 4
        assert 3 <= len(windows) <= 16, len(windows)
        per_window = hf_window_scores(s.source, windows)
        status, answer = classify(srv, {"text": text})
        assert status == 200, answer
        assert answer["windows"] == len(windows) and answer["tokens"] == len(body) + 2
        np.testing.assert_allclose(answer["scores"], per_window.max(axis=0), atol=TOL, rtol=0)
        # Not the mean: the two combinations differ on these windows, so the test can tell.
        assert np.abs(per_window.max(axis=0) - per_window.mean(axis=0)).max() > 10 * TOL
    finally:
        assert srv.stop() == 0
