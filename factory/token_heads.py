"""Token classifiers (`*ForTokenClassification`: named entities, PII, part of speech) of every
family ringserve serves: the family's encoder, then its classifier on every token, so the graph
answers logits [B, L, C], one row of label logits a token. The artifact's task is
`token-classify`, its labels the model's id2label.

The encoders are the sequence classifiers' (factory/encoder.py, factory/families.py), loaded by
the same strict copy (every tensor used, every shape checked); only the head differs: a linear
layer on each token's state (ModernBERT: its prediction head first, as transformers has it).
The ONNX graphs are written here too (token_graphs): the plain graph with a dynamic batch and
length on its output, the fused graph kept when its token logits stay within FUSED_DRIFT, int8
(dynamic, per channel) and bf16 (OpenVINO, on a CPU that has it), each with its cost published
from the publication split as the entity-level F1 against fp32's own entities.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ringserve.factory import encoder as enc
from ringserve.factory import families
from ringserve.factory.encoder import Encoder, HfConfig, activate
from ringserve.workers import token_entities as te
from ringserve.workers.artifact import ArtifactError, Manifest, check_fields
from ringserve.workers.artifact import open_tokenizer as _open_tokenizer
from torch import Tensor, nn

TASK = te.TASK  # "token-classify"
# The architectures (config.json "architectures") -> family: the encoder's, as the sequence
# classifiers' tables (factory/hf.py, factory/families.py); XLM-R has RoBERTa's layout.
ENCODER_ARCHITECTURES = {
    "BertForTokenClassification": "bert",
    "DistilBertForTokenClassification": "distilbert",
    "RobertaForTokenClassification": "roberta",
    "XLMRobertaForTokenClassification": "roberta",
    "ElectraForTokenClassification": "electra",
}
FAMILY_ARCHITECTURES = {
    "DebertaV2ForTokenClassification": "deberta-v2",
    "ModernBertForTokenClassification": "modernbert",
    "MPNetForTokenClassification": "mpnet",
}
ARCHITECTURES = {**ENCODER_ARCHITECTURES, **FAMILY_ARCHITECTURES}


def is_token_classifier(model_dir: Path) -> bool:
    """Whether config.json names a token-classification architecture."""
    try:
        raw = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    archs = raw.get("architectures") if isinstance(raw, dict) else None
    return any(a in ARCHITECTURES for a in archs or [])


# -- the models -----------------------------------------------------------------------------------
class TokenClassifier(Encoder):
    """BERT, DistilBERT, RoBERTa, XLM-R or ELECTRA, then a linear layer on every token."""

    def __init__(self, c: HfConfig) -> None:
        super().__init__(c)
        self.classifier = nn.Linear(c.hidden_size, len(c.labels))

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.classifier(self.encode(input_ids, attention_mask))


class LinearTokenHead(nn.Module):
    """DeBERTa's and MPNet's head: `classifier` on every token's state."""

    def __init__(self, c: families.FamilyConfig) -> None:
        super().__init__()
        self.classifier = nn.Linear(c.hidden_size, len(c.labels))

    def forward(self, states: Tensor) -> Tensor:
        return self.classifier(states)


class ModernBertTokenHead(nn.Module):
    """ModernBERT's: its prediction head (dense, activation, norm), then `classifier`."""

    def __init__(self, c: families.FamilyConfig) -> None:
        super().__init__()
        self.head = families._ModernBertPredictionHead(c)
        self.classifier = nn.Linear(c.hidden_size, len(c.labels))
        self.act = c.act("classifier_activation")

    def forward(self, states: Tensor) -> Tensor:
        return self.classifier(self.head.norm(activate(self.head.dense(states), self.act)))


class FamilyTokenClassifier(nn.Module):
    """A DeBERTa-v2/v3, ModernBERT or MPNet encoder (`base`), then its token head (`head`):
    the layout families.load_family copies a checkpoint into."""

    def __init__(self, c: families.FamilyConfig) -> None:
        super().__init__()
        self.base = families.new_base(c)
        self.head = ModernBertTokenHead(c) if c.family == "modernbert" else LinearTokenHead(c)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.head(self.base(input_ids, attention_mask))


def checkpoint_names(c: HfConfig) -> dict[str, str]:
    """Our parameter names -> the checkpoint's: the encoder's, as the sequence classifiers'
    (factory/hf.py), and the token head's `classifier`."""
    from ringserve.factory.hf import checkpoint_names as encoder_names

    names = {k: v for k, v in encoder_names(c).items() if not k.startswith(("dense.", "out."))}
    return names | {"classifier.weight": "classifier.weight", "classifier.bias": "classifier.bias"}


def build_model(model_dir: Path) -> tuple[nn.Module, Any]:
    """The token classifier in a HF directory, in eval mode, with its config."""
    from ringserve.factory.hf import _check_buffers, read_weights

    path = model_dir / "config.json"
    family = families.read_family_config(path, FAMILY_ARCHITECTURES)
    where, tensors = read_weights(model_dir)
    if family is not None:
        model: nn.Module = FamilyTokenClassifier(family)
        families.load_family(model, family.family, tensors, where)
        return model.eval(), family
    config = enc.read_config(path, ENCODER_ARCHITECTURES)
    model = TokenClassifier(config)
    known = _check_buffers(config, tensors, where)
    enc.copy_weights(model, checkpoint_names(config), tensors, where, known, " from config.json")
    return model.eval(), config


# -- the artifact ---------------------------------------------------------------------------------
def tokenizer_facts(model_dir: Path, tokenizer_file: Path) -> dict[str, Any]:
    """What the front-end and the worker read of the tokenizer beside the manifest: the special
    tokens a text gets (a request's `stride` must leave a window room to move on) and the
    unknown token's id (transformers' pipeline never marks it a subword): tokenizer_config's
    `unk_token` where it names one, else the tokenizer model's own."""
    tokenizer = _open_tokenizer(tokenizer_file, 8)
    unk: int | None = None
    config = model_dir / "tokenizer_config.json"
    if config.is_file():
        raw = json.loads(config.read_text(encoding="utf-8"))
        named = raw.get("unk_token")
        if isinstance(named, dict):  # an AddedToken written out
            named = named.get("content")
        if isinstance(named, str):
            unk = tokenizer.token_to_id(named)
    if unk is None:
        model = json.loads(tokenizer.to_str()).get("model", {})
        if isinstance(model.get("unk_id"), int):  # Unigram
            unk = int(model["unk_id"])
        elif isinstance(model.get("unk_token"), str):  # WordPiece, BPE
            unk = tokenizer.token_to_id(model["unk_token"])
    return {"special_tokens": tokenizer.num_special_tokens_to_add(False), "unk_token_id": unk}


def build_artifact(out: Path, source: Path, name: str, max_length: int | None) -> Path:
    """The token-classify artifact of a HF `*ForTokenClassification` directory."""
    from ringserve.factory import build
    from ringserve.factory.embedder import tokenizer_max_length

    tokenizer = build._tokenizer_in(source)
    with build._building(source):
        model, config = build_model(source)
    vocab = _open_tokenizer(tokenizer, 8).get_vocab_size(with_added_tokens=True)
    if vocab > config.vocab_size:
        raise ArtifactError(
            f"{source}: tokenizer.json has {vocab} tokens but the embeddings have "
            f"{config.vocab_size} rows: they do not belong together"
        )
    length = build._max_length(max_length, tokenizer_max_length(source), config.max_length)
    extra = {
        "source": str(source.absolute()),
        "architecture": config.architecture,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **tokenizer_facts(source, tokenizer),
    }
    manifest = asdict(Manifest(name, list(config.labels), length, "", extra=extra))
    manifest |= {"task": [TASK], "activation": "softmax", "token_types": False}
    check_fields(out, manifest | {"fingerprint": "-"})
    save = build._save
    return build._publish(out, lambda tmp: save(tmp, model, tokenizer, manifest, token_graphs))


# -- the graphs -----------------------------------------------------------------------------------
def export_onnx(model: nn.Module, path: Path) -> None:
    """`model` as ONNX: ids and mask in, `logits` [batch, length, C] out."""
    from ringserve.factory import onnx as ox

    ids = torch.full((2, 8), 5, dtype=torch.int64)
    mask = torch.ones_like(ids)
    axes = {name: {0: "batch", 1: "length"} for name in (*ox.INPUTS, "logits")}
    with ox.quiet(), torch.no_grad():
        torch.onnx.export(
            model, (ids, mask), str(path), dynamo=False, input_names=list(ox.INPUTS),
            output_names=["logits"], dynamic_axes=axes, opset_version=ox.OPSET,
        )  # fmt: skip


def token_graphs(target: Path, model: Any, manifest: dict[str, Any]) -> None:
    """build._save's ONNX step for a token classifier: the plain graph, the fused one when its
    token logits match, int8 and bf16 with their costs; without the ONNX packages (or for a
    graph the exporter cannot take) a TorchScript-only artifact, said once."""
    from ringserve.factory import build
    from ringserve.factory import onnx as ox

    plain_only = build._plain_only()
    work = target / ".onnx-build"
    work.mkdir()
    try:
        plain = work / ox.ONNX_FILE
        export_onnx(model, plain)
        tokenizer = _open_tokenizer(target / manifest["tokenizer_file"], manifest["max_length"])
        files = {"onnx_file": (plain, ox.ONNX_FILE)}
        graphs: dict[str, Any] = {"fused": {"kept": False, "why": "not built (plain graphs)"}}
        cost: dict[str, Any] = {}
        if not plain_only:
            fused, graphs = build._fused(plain, work / ox.FUSED_FILE, tokenizer, token_drift)
            if fused is not None:
                files["fused_file"] = (fused, ox.FUSED_FILE)
            files["int8_file"], cost = int8_graph(plain, work, tokenizer, manifest)
            bf16 = bf16_cost(plain, tokenizer, manifest)
            if bf16:
                manifest["bf16"] = bf16
        data = build.store_graphs(target, files, manifest)
    except Exception as exc:  # noqa: BLE001 - any exporter failure leaves a TorchScript artifact
        build.drop_graphs(target, manifest, exc)
        return
    finally:
        shutil.rmtree(work, ignore_errors=True)
    manifest.update(int8=cost, data_files=data, graphs=graphs)


def token_logits(session: Any, encodings: list[Any]) -> list[np.ndarray]:
    """Each text's token logits [k, C] (its k tokens, special ones included), in input order,
    from batches of similar length padded to their longest (as factory/onnx.py runs them)."""
    from ringserve.factory import onnx as ox

    out: list[np.ndarray] = [np.zeros(0)] * len(encodings)
    for rows, feed in ox.length_batches(encodings):
        logits = np.asarray(session.run(None, feed)[0], dtype=np.float32)
        for r, i in enumerate(rows):
            out[i] = logits[r, : len(encodings[i].ids)].copy()
    return out


def token_drift(plain: Path, dst: Path, encodings: list[Any]) -> float:
    """The largest difference between two graphs' logits of any token of the encodings."""
    from ringserve.factory import onnx as ox

    a = token_logits(ox.open_session(plain), encodings)
    b = token_logits(ox.open_session(dst), encodings)
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


def int8_graph(
    plain: Path, work: Path, tokenizer: Any, manifest: dict[str, Any]
) -> tuple[tuple[Path, str], dict[str, Any]]:
    """Dynamic int8 (per channel, every weight MatMul: factory/int8.py's first recipe) and its
    cost. No recipe is searched, so no split chooses anything; the cost is read once on the
    publication split, timed against fp32 on one thread each."""
    from ringserve.factory import int8
    from ringserve.factory import onnx as ox

    chosen = work / ox.INT8_FILE
    int8.dynamic(plain, chosen)
    encodings, _ = int8.publication_rows(tokenizer)
    a, fp32_speed = timed(ox.open_session(plain), encodings)
    b, speed = timed(ox.open_session(chosen), encodings)
    cost = publish(a, b, encodings, tokenizer, manifest)
    cost |= {"recipe": "dynamic", "search": "none", "speedup": round(speed / fp32_speed, 3)}
    return (chosen, ox.INT8_FILE), cost


def bf16_cost(plain: Path, tokenizer: Any, manifest: dict[str, Any]) -> dict[str, Any]:
    """bf16's cost on OpenVINO (the plain graph with the bf16 hint, as the worker serves it),
    where this CPU has bf16; {} otherwise or when OpenVINO cannot compile the graph."""
    from ringserve.factory import int8
    from ringserve.factory import onnx as ox
    from ringserve.workers.cpu import BF16_FLAGS, cpu_flags

    if not cpu_flags() & set(BF16_FLAGS):
        return {}
    try:
        from ringserve.workers.runtimes.openvino import compile_model

        encodings, _ = int8.publication_rows(tokenizer)
        a, fp32_speed = timed(ox.open_session(plain), encodings)
        b, speed = timed(int8._Compiled(compile_model(plain, "bf16", 1)), encodings)
    except Exception as exc:  # noqa: BLE001 - OpenVINO's errors have no common type
        print(f"ringserve: no bf16 cost in this artifact ({str(exc)[:200]})", file=sys.stderr)
        return {}
    cost = publish(a, b, encodings, tokenizer, manifest)
    return cost | {"runtime": "openvino", "speedup": round(speed / fp32_speed, 3)}


def timed(session: Any, encodings: list[Any]) -> tuple[list[np.ndarray], float]:
    """token_logits of every text and the texts/s of that pass, after one warm batch."""
    from ringserve.factory import onnx as ox

    token_logits(session, encodings[: ox.COST_BATCH])
    t0 = time.perf_counter()
    logits = token_logits(session, encodings)
    return logits, len(encodings) / (time.perf_counter() - t0)


def publish(
    a: list[np.ndarray],
    b: list[np.ndarray],
    encodings: list[Any],
    tokenizer: Any,
    manifest: dict[str, Any],
) -> dict[str, Any]:
    """What a precision's token logits `b` cost against fp32's `a` on the publication rows:
    the entity-level F1 of its entities (the default `simple` aggregation, ignoring `O`) against
    fp32's own as the reference, with precision, recall and a 95% bootstrap interval over
    texts; each real token's top label agreement; and the largest probability moved."""
    from ringserve.factory import onnx as ox

    labels = list(manifest["labels"])
    texts = ox.read_heldout(ox.PUBLICATION)[0][: len(encodings)]
    words = te.Words(tokenizer, manifest["extra"].get("unk_token_id"))
    gold, found, hits = [], [], []
    agree, diff = [], 0.0
    for x, y, e, text in zip(a, b, encodings, texts, strict=True):
        ref_window = words.window(e, te.softmax(x), text)
        got_window = words.window(e, te.softmax(y), text)
        agree.append(ref_window.probs.argmax(1) == got_window.probs.argmax(1))
        if len(ref_window):
            diff = max(diff, float(np.abs(ref_window.probs - got_window.probs).max()))
        ref = {en[:1] + en[2:] for en in te.entities([ref_window], labels, "simple")}
        got = {en[:1] + en[2:] for en in te.entities([got_window], labels, "simple")}
        gold.append(len(ref))
        found.append(len(got))
        hits.append(len(ref & got))
    tokens = np.concatenate(agree) if agree else np.zeros(0, dtype=bool)
    return {
        "texts": len(encodings),
        "split": ox.PUBLICATION_SPLIT,
        "aggregation": "simple",
        **f1_figures(np.array(gold), np.array(found), np.array(hits)),
        "argmax_agreement": round(float(tokens.mean()) if len(tokens) else 1.0, 4),
        "argmax_of": "tokens",
        "max_score_diff": round(diff, 4),
    }


def f1_figures(gold: np.ndarray, found: np.ndarray, hits: np.ndarray) -> dict[str, Any]:
    """Micro entity precision, recall and F1 over the texts, and F1's 95% interval (1,000
    bootstrap draws of the texts, seeded)."""

    def f1(g: float, f: float, h: float) -> float:
        return 1.0 if g + f == 0 else 2 * h / (g + f)

    rng = np.random.default_rng(0)
    n = len(gold)
    draws = [rng.integers(0, n, n) for _ in range(1000)] if n else []
    spread = sorted(f1(gold[d].sum(), found[d].sum(), hits[d].sum()) for d in draws)
    low, high = (spread[25], spread[974]) if spread else (1.0, 1.0)
    g, f, h = gold.sum(), found.sum(), hits.sum()
    return {
        "entity_f1": round(f1(g, f, h), 4),
        "entity_f1_ci95": [round(low, 4), round(high, 4)],
        "entity_precision": round(float(h / f) if f else 1.0, 4),
        "entity_recall": round(float(h / g) if g else 1.0, 4),
        "entities_fp32": int(g),
    }
