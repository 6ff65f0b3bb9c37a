"""Embed models exported from sentence-transformers and plain base-model directories.

Tiny random models of every supported architecture are built at test time with `transformers`
(nothing is downloaded) and exported with `ringserve export --from`, with every pooling. Each
artifact runs through the worker's own runners (TorchScript and ONNX Runtime, one padded batch of
mixed lengths) in-process and is compared with sentence-transformers' own `encode`, normalized
and not. One of them, an XLM-R of hidden size 1024 (the largest D the contract names), is served
end to end: HTTP, KServe and the binary protocol.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from ringserve.factory import export
from ringserve.factory.build import default_encoder_dir
from ringserve.factory.embedder import POOLINGS
from ringserve.wire.client import BinaryClient
from ringserve.wire.frames import OK
from ringserve.workers.artifact import (
    load_manifest,
    load_model,
    load_tokenizer,
)
from ringserve.workers.batches import Item
from ringserve.workers.runtimes.cpu import CpuRunner, joined, ort_runner, softmax
from ringserve.workers.runtimes.joined import Joined
from tokenizers import Tokenizer

from devkit.builds import BARE_BUILDS, cheap_builds
from devkit.hfmodels import NEWS, SST2, bpe_tokenizer
from devkit.server import ServerProc, serving

transformers = pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")

pytestmark = pytest.mark.timeout(300)
MAX_LENGTH = 24  # short, so that the news texts are truncated
TOL = 1e-4
SIZE = {"num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 37}
SIZE |= {"initializer_range": 0.4}  # wide: HF's default makes every vector about the same
# Mixed lengths in one padded batch: a word, accents, sentences, news texts past MAX_LENGTH.
TEXTS = ["ok", "Crème brûlée in Zürich — naïve café", *SST2[:4], *NEWS[:2]]
ROBERTA = {"pad_token_id": 1, "type_vocab_size": 1}
WIDE_1024 = SIZE["initializer_range"] * (32 / 1024) ** 0.5
# name -> (base model class, config class, config fields, tokenizer kind)
ARCHS: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "bert": ("BertModel", "BertConfig", SIZE | {"hidden_size": 32}, "wordpiece"),
    "distilbert": (
        "DistilBertModel",
        "DistilBertConfig",
        {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 37, "initializer_range": 0.4},
        "wordpiece",
    ),
    "roberta": (
        "RobertaModel",
        "RobertaConfig",
        SIZE | {"hidden_size": 32} | ROBERTA,
        "bpe",
    ),
    # D = 1024, the contract's largest: the rings carry 1,024 floats a text (the served model).
    # Its weights are drawn narrower by sqrt(32 / 1024), so its activations are as large as the
    # 32-wide models': unscaled (5.7x larger), eager torch and the traced graph differed by up
    # to 1.7e-4 with max pooling on one Intel CPU (6.6e-6 scaled), fp32 rounding, not a bug.
    "xlmr": (
        "XLMRobertaModel",
        "XLMRobertaConfig",
        SIZE
        | {"hidden_size": 1024, "num_hidden_layers": 1}
        | ROBERTA
        | {"initializer_range": WIDE_1024},
        "bpe",
    ),
    "electra": (
        "ElectraModel",
        "ElectraConfig",
        SIZE | {"hidden_size": 32, "embedding_size": 16},
        "wordpiece",
    ),
}
# sentence-transformers' name of each of our poolings.
ST_MODE = {"mean": "mean", "cls": "cls", "max": "max", "last": "lasttoken",
           "mean_sqrt_len": "mean_sqrt_len_tokens", "weightedmean": "weightedmean"}  # fmt: skip
# BERT is exported with every pooling; each other architecture with two: one over every token
# (mean, max) and one of a single token (cls, last), each of the four on two architectures, one
# of them its sentence-transformers directory's (ST_DIRS, whose vectors these give). The pooling
# is one function on the encoder's token states for every body (factory/embedder.py pool): its
# every mode is BERT's to test, each body's states (all of them, the first, the last real one)
# the others'. (All four on each: 8 more exports, 3-4 s of the module's setup.)
BASIC = {
    "distilbert": ("cls", "mean"),
    "roberta": ("last", "mean"),
    "xlmr": ("max", "cls"),
    "electra": ("last", "max"),
}


def poolings(name: str) -> tuple[str, ...]:
    return POOLINGS if name == "bert" else BASIC[name]


# The sentence-transformers directories: each architecture with one pooling, normalized or not,
# so that every pooling and both normalizations come through modules.json.
ST_DIRS = {
    "bert": ("mean", True),
    "distilbert": ("cls", False),
    "roberta": ("last", True),
    "xlmr": ("max", True),
    "electra": ("last", False),
}
SERVED = "xlmr"


def save_base(name: str, root: Path) -> Path:
    """A tiny random base model and its fast tokenizer, saved as `save_pretrained` does."""
    model_cls, config_cls, fields, kind = ARCHS[name]
    if kind == "wordpiece":
        tok = Tokenizer.from_file(str(default_encoder_dir() / "tokenizer.json"))
        specials = {"unk_token": "[UNK]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                    "sep_token": "[SEP]", "mask_token": "[MASK]"}  # fmt: skip
    else:
        tok = bpe_tokenizer()
        specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                    "pad_token": "<pad>", "cls_token": "<s>", "sep_token": "</s>"}  # fmt: skip
    positions = 40 + (2 if kind == "bpe" else 0)  # RoBERTa's positions start after padding_idx
    config = getattr(transformers, config_cls)(
        vocab_size=tok.get_vocab_size(), max_position_embeddings=positions, **fields
    )
    torch.manual_seed(len(name))
    model = getattr(transformers, model_cls)(config).eval()
    out = root / name
    model.save_pretrained(out)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **specials)
    fast.save_pretrained(out)
    tok.save(str(out / "tokenizer.json"))  # the tokenizers library's own file, as HF writes it
    return out


def pipeline(base: Path, pooling: str, normalize: bool) -> Any:
    """sentence-transformers' own pipeline on the base model: Transformer, Pooling[, Normalize]."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    body = Transformer(str(base), max_seq_length=MAX_LENGTH)
    pool = Pooling(body.get_embedding_dimension(), pooling_mode=ST_MODE[pooling])
    modules = [body, pool, *([Normalize()] if normalize else [])]
    return SentenceTransformer(modules=modules, device="cpu")


def encode(model: Any, texts: list[str], normalize: bool = False) -> np.ndarray:
    """sentence-transformers' `encode`, each text alone, normalized by it when `normalize`."""
    with torch.no_grad():
        out = model.encode(
            texts, batch_size=1, convert_to_numpy=True, normalize_embeddings=normalize
        )
    return np.asarray(out, dtype=np.float64)


def exported(source: Path, out: Path, *extra: str) -> Path:
    """`ringserve export --from`, the plain ONNX graph alone (devkit/builds.py): the vectors are
    read here on TorchScript and that graph at fp32, never the fused graph or int8 (the
    embed-only int8 build runs in test_families.py, on the artifacts it serves), and no compact
    vector (BARE_BUILDS: calibrated on 10 texts; 1.4 s less for MiniLM's export)."""
    with cheap_builds(BARE_BUILDS):
        assert export.main(["--from", str(source), "--out", str(out), *extra]) == 0
    return out


class Built:
    """Every export of one module, and sentence-transformers' vectors of TEXTS for each."""

    def __init__(self, root: Path) -> None:
        self.bases = {name: save_base(name, root / "src") for name in ARCHS}
        self.plain: dict[tuple[str, str], Path] = {}
        self.st: dict[str, Path] = {}
        self.st_src: dict[str, Path] = {}  # the sentence-transformers directories themselves
        self.want: dict[tuple[str, str, bool], np.ndarray] = {}
        for name, base in self.bases.items():
            for pooling in poolings(name):
                art = root / "plain" / f"{name}-{pooling}"
                args = ("--pooling", pooling, "--max-length", str(MAX_LENGTH))
                self.plain[name, pooling] = exported(base, art, *args)
                model = pipeline(base, pooling, normalize=False)  # built once, encoded twice
                for normalize in (False, True):
                    self.want[name, pooling, normalize] = encode(model, TEXTS, normalize)
            pooling, normalize = ST_DIRS[name]
            st_dir = root / "st" / name
            pipeline(base, pooling, normalize).save(str(st_dir))
            self.st_src[name] = st_dir
            self.st[name] = exported(st_dir, root / "st-art" / name)  # max length: its own


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return Built(tmp_path_factory.mktemp("embed-models"))


def runner_vectors(artifact: Path, runtime: str, texts: list[str]) -> np.ndarray:
    """The vectors the worker's runner gives for `texts` in one padded batch, normalized as the
    front-end does when the manifest says so (workers/process/ boot, protocols/tasks.py)."""
    manifest = load_manifest(artifact)
    tok = load_tokenizer(artifact, manifest.max_length)
    items = [Item(i, 0, 0, tok.encode(t).ids) for i, t in enumerate(texts)]
    length = max(len(it.ids) for it in items)
    activation = joined(softmax, len(manifest.labels))
    if runtime == "onnx":
        spec = SimpleNamespace(
            model_dir=artifact, precision="fp32", threads=1, max_batch=32, graph="plain",
            lanes=1, lone_cores=False,
        )  # fmt: skip
        runner: Any = ort_runner(spec, manifest, activation)
    else:
        runner = CpuRunner(Joined(load_model(artifact)), manifest.max_length, 32, activation)
    runner.fill(length, items)
    out = runner.forward(length, len(items)).astype(np.float64)
    assert out.shape == (len(texts), manifest.dimension)
    if manifest.normalize:
        out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out


@pytest.mark.parametrize("runtime", ["torch", "onnx"])
@pytest.mark.parametrize("name", list(ARCHS))
def test_every_architecture_and_pooling_matches_sentence_transformers(
    built: Built, name: str, runtime: str
) -> None:
    """A plain base model with --pooling: the raw vector is sentence-transformers' encode
    without Normalize, and its L2 normalisation the encode with it, within 1e-4."""
    for pooling in poolings(name):
        art = built.plain[name, pooling]
        m = load_manifest(art)
        assert (m.task, m.labels, m.normalize) == (["embed"], [], False)
        assert m.dimension == built.want[name, pooling, False].shape[1]
        assert m.extra["pooling"] == pooling and m.onnx_file
        assert (m.int8_file, m.fused_file, m.int8) == ("", "", {})  # BARE_BUILDS: nothing else
        got = runner_vectors(art, runtime, TEXTS)
        np.testing.assert_allclose(got, built.want[name, pooling, False], atol=TOL, rtol=0)
        unit = got / np.linalg.norm(got, axis=1, keepdims=True)
        np.testing.assert_allclose(unit, built.want[name, pooling, True], atol=TOL, rtol=0)


def test_poolings_differ(built: Built) -> None:
    """The six poolings of one model give six different vectors (none is a silent default)."""
    vecs = [built.want["bert", p, False] for p in POOLINGS]
    for i in range(len(vecs)):
        for j in range(i):
            assert np.abs(vecs[i] - vecs[j]).max() > 1e-2, (POOLINGS[i], POOLINGS[j])


@pytest.mark.parametrize("name", list(ARCHS))
def test_sentence_transformers_directories(built: Built, name: str) -> None:
    """modules.json, 1_Pooling/config.json and 2_Normalize are read: the artifact normalizes
    when the pipeline does, pools as its config says, and keeps its max_seq_length."""
    pooling, normalize = ST_DIRS[name]
    art = built.st[name]
    m = load_manifest(art)
    assert (m.task, m.normalize, m.max_length) == (["embed"], normalize, MAX_LENGTH)
    assert m.extra["format"] == "sentence-transformers" and m.extra["pooling"] == pooling
    for runtime in ("torch", "onnx"):
        got = runner_vectors(art, runtime, TEXTS)
        np.testing.assert_allclose(got, built.want[name, pooling, normalize], atol=TOL, rtol=0)


def test_export_refuses_what_it_cannot_serve(built: Built, tmp_path: Path, capsys: Any) -> None:
    base = built.bases["bert"]
    out = str(tmp_path / "x")
    assert export.main(["--from", str(base), "--out", out]) == 1
    assert "needs --pooling (mean, cls, max, last, mean_sqrt_len, weightedmean)" in (
        capsys.readouterr().err
    )
    st_dir = tmp_path / "st"
    pipeline(base, "mean", False).save(str(st_dir))
    assert export.main(["--from", str(st_dir), "--out", out, "--pooling", "cls"]) == 1
    assert "names its own pooling" in capsys.readouterr().err
    config = st_dir / "1_Pooling" / "config.json"
    config.write_text(json.dumps({"embedding_dimension": 32, "pooling_mode": ["mean", "max"]}))
    assert export.main(["--from", str(st_dir), "--out", out]) == 1
    assert "pooling ['mean', 'max'] is not supported" in capsys.readouterr().err
    modules = json.loads((st_dir / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_CNN",
                       "type": "sentence_transformers.models.CNN"})  # fmt: skip
    (st_dir / "modules.json").write_text(json.dumps(modules))
    assert export.main(["--from", str(st_dir), "--out", out]) == 1
    err = capsys.readouterr().err
    assert "modules ['Transformer', 'Pooling', 'CNN'] are not supported" in err
    assert not (tmp_path / "x").exists()


# -- one model served end to end ------------------------------------------------------------------
@pytest.fixture(scope="module")
def served(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Any:
    with serving(
        ServerProc(
            tmp_path_factory.mktemp("embed-served"),
            ["--model", str(built.st[SERVED]), "--workers", "1", "--spares", "0"],
        ),
        1,
    ) as srv:
        yield srv


def post(server: ServerProc, path: str, body: Any) -> tuple[int, Any]:
    status, _, data = server.request("POST", path, body)
    return status, json.loads(data)


def test_served_http_answers_match(built: Built, served: ServerProc) -> None:
    pooling, _ = ST_DIRS[SERVED]
    unit, raw = built.want[SERVED, pooling, True], built.want[SERVED, pooling, False]
    status, doc = post(served, "/v1/embeddings", {"input": TEXTS})
    assert status == 200, doc
    got = np.array([d["embedding"] for d in doc["data"]])
    assert got.shape == (len(TEXTS), 1024)
    np.testing.assert_allclose(got, unit, atol=TOL, rtol=0)
    status, doc = post(served, "/embed", {"inputs": TEXTS, "normalize": False})
    assert status == 200, doc
    np.testing.assert_allclose(np.array(doc), raw, atol=TOL, rtol=0)
    status, _, data = served.request("GET", "/v1/model")
    info = json.loads(data)
    assert status == 200 and info["task"] == ["embed"] and info["dimension"] == 1024
    assert info["labels"] == [] and info["runtime"] == "onnx"


def embedded(server: ServerProc) -> int:
    _, _, data = server.request("GET", "/v1/stats")
    n: int = json.loads(data)["totals"]["tasks"]["embed"]
    return n


def test_served_binary_protocol_answers_d_floats(built: Built, served: ServerProc) -> None:
    """The contract: an embed model answers n = D floats, normalized as its pipeline does."""
    pooling, _ = ST_DIRS[SERVED]
    before = embedded(served)
    with BinaryClient("127.0.0.1", served.binary_port, timeout=120) as client:
        answers = client.classify_many(TEXTS)
    assert embedded(served) - before == len(TEXTS)  # counted as embeddings
    assert all(a.status == OK and a.label_id == 0 for a in answers)
    got = np.array([a.scores for a in answers], dtype=np.float64)
    assert got.shape == (len(TEXTS), 1024)
    np.testing.assert_allclose(got, built.want[SERVED, pooling, True], atol=TOL, rtol=0)


def test_served_kserve_and_tasks_it_does_not_do(built: Built, served: ServerProc) -> None:
    pooling, _ = ST_DIRS[SERVED]
    model = load_manifest(built.st[SERVED]).name
    client = httpclient.InferenceServerClient(f"127.0.0.1:{served.port}")
    try:
        meta = client.get_model_metadata(model)
        text = httpclient.InferInput("text", [3], "BYTES")
        text.set_data_from_numpy(np.array([t.encode() for t in TEXTS[:3]], dtype=object))
        result = client.infer(model, [text])  # no output named: the embedding, its only one
    finally:
        client.close()
    assert meta["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 1024]}]
    got = result.as_numpy("embedding")
    np.testing.assert_allclose(got, built.want[SERVED, pooling, True][:3], atol=TOL, rtol=0)
    for path, body, task in [
        ("/v1/classify", {"text": "x"}, "classify"),
        ("/rerank", {"query": "q", "texts": ["a"]}, "rerank"),
    ]:
        status, doc = post(served, path, body)
        assert status == 400 and f"does not {task}; its tasks: embed" in doc["error"], doc
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["x"]}],
            "outputs": [{"name": "scores"}]}  # fmt: skip
    status, doc = post(served, f"/v2/models/{model}/infer", body)
    assert status == 400 and "the model gives embedding" in doc["error"], doc


def test_served_token_vectors_match_sentence_transformers(built: Built, served: ServerProc) -> None:
    """TEI's /embed_all on an embed-only artifact: each text's token vectors (the states before
    pooling, special tokens included) are sentence-transformers' `token_embeddings`."""
    from sentence_transformers import SentenceTransformer

    st_model = SentenceTransformer(str(built.st_src[SERVED]), device="cpu")
    with torch.no_grad():
        want = st_model.encode(TEXTS, output_value="token_embeddings", batch_size=1)
    status, got = post(served, "/embed_all", {"inputs": TEXTS, "truncate": True})
    assert status == 200, got
    for vectors, expected in zip(got, want, strict=True):
        expected = np.asarray(expected, dtype=np.float64)
        assert np.array(vectors).shape == expected.shape and expected.shape[1] == 1024
        np.testing.assert_allclose(np.array(vectors), expected, atol=TOL, rtol=0)


def test_the_default_encoders_own_directory(tmp_path: Path) -> None:
    """The installed all-MiniLM-L6-v2 is a real sentence-transformers directory (the older
    pooling_mode_* keys, max_seq_length in sentence_bert_config.json, no 2_Normalize folder):
    exported as it is, it answers what its own `encode` does."""
    from sentence_transformers import SentenceTransformer

    art = exported(default_encoder_dir(), tmp_path / "minilm")
    m = load_manifest(art)
    assert (m.task, m.dimension, m.normalize, m.max_length) == (["embed"], 384, True, 256)
    assert m.extra["compact"]["calibration"]["texts"] == 10  # BARE_BUILDS
    with torch.no_grad():
        want = SentenceTransformer(str(default_encoder_dir()), device="cpu").encode(
            TEXTS, batch_size=1, convert_to_numpy=True
        )
    for runtime in ("torch", "onnx"):
        got = runner_vectors(art, runtime, TEXTS)
        np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
