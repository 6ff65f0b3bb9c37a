"""DeBERTa-v2 (v3 config, Unigram tokenizer with Metaspace), ModernBERT (a local window shorter
than the texts) and MPNet: tiny random checkpoints built with `transformers` and
sentence-transformers at test time (nothing downloaded), exported with `ringserve export --from`,
served by one real server, and compared with the originals' own scores and vectors within 1e-4:
classify alone, in one mixed-length batch and as pairs, rerank order and scores, embeddings
with a Dense layer, Normalize and prompts. Both runtimes' files are checked in-process too."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
from ringserve.factory import export
from ringserve.workers.artifact import load_manifest, quiet_torchscript
from tokenizers import Tokenizer

from devkit.builds import cheap_builds, plain_builds
from devkit.families import FAMILIES, save_classifier, save_sentence_transformers
from devkit.hfmodels import NEWS, SST2
from devkit.server import ServerProc, serving

transformers = pytest.importorskip("transformers")
sentence_transformers = pytest.importorskip("sentence_transformers")

pytestmark = pytest.mark.timeout(300)
TOL = 1e-4
MAX_LENGTH = 40  # the classifiers' --max-length: the news texts and pairs are truncated
TEXTS = ["ok", "Crème brûlée in Zürich — naïve café", *SST2[:5], *NEWS[:3]]
PAIRS = [(SST2[10 + i], NEWS[5 + i] if i % 2 else SST2[30 + i]) for i in range(5)]
QUERY = SST2[40]
# ModernBERT's sentence-transformers directory has a default prompt: every path applies it.
DEFAULT_PROMPT = {"modernbert": "document"}
# Each family's classifier: DeBERTa 3 labels (softmax), ModernBERT multi-label with mean
# pooling, MPNet 2 labels; and each family's one-output cross-encoder.
HEADS: dict[str, dict[str, Any]] = {
    "deberta-v2": {"id2label": {0: "entailment", 1: "neutral", 2: "contradiction"}},
    "modernbert": {
        "problem_type": "multi_label_classification",
        "classifier_pooling": "mean",
        "id2label": {0: "a", 1: "b", 2: "c", 3: "d"},
    },
    "mpnet": {},
}
# The artifacts built with their fused and int8 graphs (cheap_builds); the others plain.
FULL = {*(f"{family}-cls" for family in FAMILIES), "mpnet-st"}


def _encode(tok: Tokenizer, item: Any) -> list[int]:
    enc = tok.encode(*item) if isinstance(item, tuple) else tok.encode(item)
    return list(enc.ids)


def hf_scores(source: Path, items: list[Any], max_length: int = MAX_LENGTH) -> np.ndarray:
    """The transformers model's own scores, each input alone (no padding)."""
    model = transformers.AutoModelForSequenceClassification.from_pretrained(source).eval()
    tok = Tokenizer.from_file(str(source / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length)
    multi = model.config.problem_type == "multi_label_classification"
    rows = []
    with torch.no_grad():
        for item in items:
            logits = model(input_ids=torch.tensor([_encode(tok, item)])).logits[0]
            sigmoid = multi or model.config.num_labels == 1
            rows.append((logits.sigmoid() if sigmoid else logits.softmax(-1)).numpy())
    return np.stack(rows)


class Built:
    """Every checkpoint, its artifact and the references, made once for the module."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sources: dict[str, Path] = {}
        self.artifacts: dict[str, Path] = {}
        for family in FAMILIES:
            self._export(
                f"{family}-cls", save_classifier(family, root / f"{family}-cls", **HEADS[family])
            )
            self._export(
                f"{family}-rerank", save_classifier(family, root / f"{family}-rr", num_labels=1)
            )
            default = DEFAULT_PROMPT.get(family)
            st_dir = save_sentence_transformers(
                family, root / f"{family}-st", default_prompt=default
            )
            self._export(f"{family}-st", st_dir)

    def _export(self, name: str, source: Path) -> None:
        out = self.root / "art" / name
        args = ["--from", str(source), "--out", str(out)]
        if name.endswith("-cls"):  # the rerankers and embedders keep their models' own length
            args += ["--max-length", str(MAX_LENGTH)]
        # Scores are tested here, not int8's choice or its cost. Each family's fused and int8
        # graphs are built from its classifier, and an embedder's (dynamic int8, its cosine to
        # fp32: the same for every body) from one of them (FULL); the rest, the same bodies
        # with another head, are read on the plain graph alone (a one-label head's int8 build
        # is test_hf.py's xlmr-reranker). A full build is 2.3 s of a core, a plain one 0.5.
        builds = cheap_builds if name in FULL else plain_builds
        with builds():
            assert export.main(args) == 0
        assert bool(load_manifest(out).int8_file) == (name in FULL)
        self.sources[name], self.artifacts[name] = source, out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return Built(tmp_path_factory.mktemp("families"))


@pytest.fixture(scope="module")
def server(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    args = [a for name, art in built.artifacts.items() for a in ("--model", f"{name}={art}")]
    srv = ServerProc(tmp_path_factory.mktemp("srv"), [*args, "--workers", "1", "--spares", "0"])
    with serving(srv) as running:
        yield running


def post(server: ServerProc, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    status, _, data = server.request("POST", path, body)
    return status, json.loads(data)


def scores_of(answer: dict[str, Any]) -> np.ndarray:
    return np.array([r["scores"] for r in answer["results"]], dtype=np.float64)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_classify_alone_batched_and_pairs(built: Built, server: ServerProc, family: str) -> None:
    name = f"{family}-cls"
    want = hf_scores(built.sources[name], TEXTS)
    for i in (0, 1, len(TEXTS) - 1):  # a word, accents, a truncated news text
        status, answer = post(server, "/v1/classify", {"text": TEXTS[i], "model": name})
        assert status == 200, answer
        np.testing.assert_allclose(answer["scores"], want[i], atol=TOL, rtol=0)
    status, answer = post(server, "/v1/classify", {"texts": TEXTS, "model": name})
    assert status == 200, answer
    np.testing.assert_allclose(scores_of(answer), want, atol=TOL, rtol=0)
    pairs = hf_scores(built.sources[name], PAIRS)
    body = {"texts": [a for a, _ in PAIRS], "text_pairs": [b for _, b in PAIRS], "model": name}
    status, answer = post(server, "/v1/classify", body)
    assert status == 200, answer
    np.testing.assert_allclose(scores_of(answer), pairs, atol=TOL, rtol=0)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_rerank_in_the_models_order(built: Built, server: ServerProc, family: str) -> None:
    name = f"{family}-rerank"
    docs = TEXTS[1:]
    length = load_manifest(built.artifacts[name]).max_length
    want = hf_scores(built.sources[name], [(QUERY, d) for d in docs], length)[:, 0]
    status, ranked = post(server, "/rerank", {"query": QUERY, "texts": docs, "model": name})
    assert status == 200, ranked
    assert [r["index"] for r in ranked] == list(np.argsort(-want, kind="stable"))
    got = np.array([r["score"] for r in sorted(ranked, key=lambda r: r["index"])])
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)


def stats_totals(server: ServerProc) -> dict[str, Any]:
    status, _, data = server.request("GET", "/v1/stats")
    assert status == 200
    totals: dict[str, Any] = json.loads(data)["totals"]
    return totals


def test_max_length_is_the_models_own(built: Built, server: ServerProc) -> None:
    """Exported without --max-length, a model keeps its own length: DeBERTa's and MPNet's small
    position tables (64; MPNet's start after the padding index) and ModernBERT's 8,192, at
    which a document of about 1,400 tokens is scored whole, as transformers scores it, and run
    beside short ones without padding them to its length."""
    lengths = {f: load_manifest(built.artifacts[f"{f}-rerank"]).max_length for f in FAMILIES}
    assert lengths == {"deberta-v2": 64, "modernbert": 8192, "mpnet": 64}
    name = "modernbert-rerank"
    docs = [*TEXTS[1:6], " ".join(NEWS[:12]), *TEXTS[6:]]
    tok = Tokenizer.from_file(str(built.artifacts[name] / "tokenizer.json"))
    sizes = [len(tok.encode(QUERY, d).ids) for d in docs]
    assert 1200 < max(sizes) < 8192 and sorted(sizes)[-2] < 200
    want = hf_scores(built.sources[name], [(QUERY, d) for d in docs], 8192)[:, 0]
    before = stats_totals(server)
    status, ranked = post(server, "/rerank", {"query": QUERY, "texts": docs, "model": name})
    assert status == 200, ranked
    got = np.array([r["score"] for r in sorted(ranked, key=lambda r: r["index"])])
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    deadline = time.monotonic() + 10
    while (now := stats_totals(server))["tokens"] - before["tokens"] < sum(sizes):
        assert time.monotonic() < deadline, (now, before, sum(sizes))
        time.sleep(0.05)
    padding = (now["padded_tokens"] - before["padded_tokens"]) - (now["tokens"] - before["tokens"])
    assert 0 <= padding < max(sizes) // 2, (padding, sizes)  # never the short ones to 1,400


def test_max_length_can_lower_the_models_own_not_raise_it(
    built: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--max-length over the model's positions is refused, naming them; a tokenizer_config.json
    limit under them is the default ("none", transformers' 1e30, is not)."""
    source = built.sources["mpnet-rerank"]
    args = ["--from", str(source), "--out", str(tmp_path / "over"), "--max-length", "65"]
    assert export.main(args) == 1
    assert "over the 64 tokens the model's positions hold" in capsys.readouterr().err
    assert not (tmp_path / "over").exists()
    shutil.copytree(source, tmp_path / "src")
    out = tmp_path / "art"
    for stated, length in ((int(1e30), 64), (32, 32)):
        (tmp_path / "src" / "tokenizer_config.json").write_text(
            json.dumps({"model_max_length": stated}), encoding="utf-8"
        )
        with plain_builds():  # its max length is tested here, not its fused or int8 graphs
            assert export.main(["--from", str(tmp_path / "src"), "--out", str(out)]) == 0
        assert load_manifest(out).max_length == length


@pytest.mark.parametrize("family", list(FAMILIES))
def test_embeddings_with_dense_normalize_and_prompts(
    built: Built, server: ServerProc, family: str
) -> None:
    name = f"{family}-st"
    model = sentence_transformers.SentenceTransformer(str(built.sources[name]), device="cpu")
    plain = model.encode(TEXTS, convert_to_numpy=True)
    query = model.encode(TEXTS, prompt_name="query", convert_to_numpy=True)
    assert plain.shape[1] == 24 and load_manifest(built.artifacts[name]).dimension == 24
    status, doc = post(server, "/v1/embeddings", {"input": TEXTS, "model": name})
    assert status == 200, doc
    np.testing.assert_allclose([d["embedding"] for d in doc["data"]], plain, atol=TOL, rtol=0)
    status, one = post(server, "/embed", {"inputs": TEXTS[2], "model": name})
    assert status == 200, one
    np.testing.assert_allclose(one[0], plain[2], atol=TOL, rtol=0)
    body = {"input": TEXTS, "model": name, "prompt_name": "query"}
    status, doc = post(server, "/v1/embeddings", body)
    assert status == 200, doc
    np.testing.assert_allclose([d["embedding"] for d in doc["data"]], query, atol=TOL, rtol=0)
    body = {"inputs": TEXTS, "model": name, "prompt_name": "query"}
    status, vecs = post(server, "/embed", body)
    assert status == 200, vecs
    np.testing.assert_allclose(vecs, query, atol=TOL, rtol=0)
    assert not np.allclose(query, plain, atol=1e-3)  # the prompt changed the vectors


def test_kserve_prompt_name_parameter(built: Built, server: ServerProc) -> None:
    """KServe's `prompt_name` parameter with output `embedding`, and the default prompt without
    one (ModernBERT's directory names `document`)."""
    for name, prompt in (("mpnet-st", "query"), ("modernbert-st", None)):
        model = sentence_transformers.SentenceTransformer(str(built.sources[name]), device="cpu")
        want = model.encode(TEXTS[:3], prompt_name=prompt, convert_to_numpy=True)
        body: dict[str, Any] = {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [3], "data": TEXTS[:3]}],
            "outputs": [{"name": "embedding"}],
        }
        if prompt is not None:
            body["parameters"] = {"prompt_name": prompt}
        status, doc = post(server, f"/v2/models/{name}/infer", body)
        assert status == 200, doc
        got = np.array(doc["outputs"][0]["data"], dtype=np.float64).reshape(3, -1)
        np.testing.assert_allclose(got, want, atol=TOL, rtol=0)


def test_unknown_prompt_is_a_400_naming_the_prompts(server: ServerProc) -> None:
    body = {"input": "hello", "model": "mpnet-st", "prompt_name": "passage"}
    status, doc = post(server, "/v1/embeddings", body)
    assert status == 400, doc
    assert "document" in json.dumps(doc) and "query" in json.dumps(doc)
    status, doc = post(server, "/embed", {"inputs": "hello", "model": "mpnet-st", "prompt_name": 3})
    assert status == 400, doc
    status, _, data = server.request("GET", "/v1/models")
    rows = {r["name"]: r for r in json.loads(data)["models"]}
    assert rows["mpnet-st"]["prompts"] == {"query": "query: ", "document": "search_document: "}
    assert "prompts" not in rows["mpnet-cls"]
    assert rows["modernbert-st"]["default_prompt_name"] == "document"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_both_runtimes_files_match_transformers(built: Built, family: str) -> None:
    """The artifact's TorchScript and ONNX graphs on one padded mixed-length batch of texts
    and pairs (a length the export never saw), against the transformers logits."""
    name = f"{family}-cls"
    source, artifact = built.sources[name], built.artifacts[name]
    ref = transformers.AutoModelForSequenceClassification.from_pretrained(source).eval()
    tok = Tokenizer.from_file(str(source / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(MAX_LENGTH)
    rows = [_encode(tok, item) for item in [*TEXTS, *PAIRS]]
    width = max(map(len, rows))
    ids = np.zeros((len(rows), width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = r, 1
    with torch.no_grad():
        want = np.concatenate([ref(input_ids=torch.tensor([r])).logits.numpy() for r in rows])
        with quiet_torchscript():
            scripted = torch.jit.load(str(artifact / "model.pt"))
        got = scripted(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    session = ort.InferenceSession(str(artifact / "model.onnx"), providers=["CPUExecutionProvider"])
    out = session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    np.testing.assert_allclose(out, want, atol=TOL, rtol=0)
