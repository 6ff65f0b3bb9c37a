"""Sparse lexical vectors (SPLADE): a masked-language model's head over the vocabulary, turned
into one weight a vocabulary term, log(1 + ReLU(logit)), pooled over the text's tokens (max, or
sum as the first SPLADE). Two sources: a `*ForMaskedLM` directory with `--pooling splade`, or a
sentence-transformers `SparseEncoder` directory (its MLM module, then SpladePooling).

The head over the vocabulary is the cost (for a MiniLM-size encoder as large as the encoder),
so the graph runs it on the real tokens only: the token states are gathered by the mask, the
head maps them to the vocabulary, and the pooling scatters each token's row back onto its
text's row, all in the graph. What leaves the graph is one pooled row a text [B, V]; the worker
ships only its nonzero terms (workers/process/sparse.py). The pooling keeps every real token,
[CLS] and [SEP] included, and no padding: sentence-transformers' SpladePooling and TEI's splade
pooling do the same, so the vectors equal theirs. `transformers` is never imported here.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from ringserve.factory.encoder import Encoder, HfConfig, WeightError, activate, copy_weights
from ringserve.factory.encoder import read_config as read_hf_config
from ringserve.factory.hf import _check_buffers, checkpoint_names, read_weights
from torch import Tensor, nn

# The masked-language models (config.json "architectures") -> family (factory/hf.py's).
MLM_ARCHITECTURES = {
    "BertForMaskedLM": "bert",
    "DistilBertForMaskedLM": "distilbert",
    "RobertaForMaskedLM": "roberta",
    "XLMRobertaForMaskedLM": "roberta",
}
SPLADE = "splade"  # --pooling's name for it, as TEI's
SPARSE_OUTPUT = "sparse"  # the graph's output: the pooled weights [B, V]
OPSET = 18  # ScatterElements' max reduction (the pooling onto each text's row)
# Each family's MLM head: transform dense, its norm, the decoder (tied to the word embeddings
# when the checkpoint leaves it out) and the decoder's bias.
_HEAD = {
    "bert": (
        "cls.predictions.transform.dense",
        "cls.predictions.transform.LayerNorm",
        "cls.predictions.decoder.weight",
        "cls.predictions.bias",
    ),
    "distilbert": (
        "vocab_transform",
        "vocab_layer_norm",
        "vocab_projector.weight",
        "vocab_projector.bias",
    ),
    "roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head.decoder.weight", "lm_head.bias"),
}
_WORDS = {
    "bert": "bert.embeddings.word_embeddings.weight",
    "distilbert": "distilbert.embeddings.word_embeddings.weight",
    "roberta": "roberta.embeddings.word_embeddings.weight",
}
# The decoder's bias saved twice by some exports (tied to the head's own `bias`).
_DUPLICATE_BIAS = ("cls.predictions.decoder.bias", "lm_head.decoder.bias")
# sentence-transformers' modules of a SparseEncoder, by the last part of their type name
_ST_MLM = ("MLMTransformer", "Transformer")
_ST_POOLING = "SpladePooling"
_ST_STATIC = "SparseStaticEmbedding"


@dataclass(frozen=True)
class SparseSource:
    """A directory to export as a sparse model: where the MLM is, and how it pools."""

    model_dir: Path
    pooling: str  # "max" or "sum" over the tokens
    activation: str  # "relu": log(1 + ReLU(x)); "log1p_relu": log(1 + log(1 + ReLU(x)))
    max_length: int | None
    kind: str  # "sentence-transformers" or the MLM's architecture


class Splade(Encoder):
    """The encoder, its MLM head on the real tokens only, and SPLADE's pooling: [B, V]."""

    def __init__(self, c: HfConfig, pooling: str = "max", activation: str = "relu") -> None:
        super().__init__(c)
        if pooling not in ("max", "sum") or activation not in ("relu", "log1p_relu"):
            raise WeightError(f"SPLADE pooling {pooling!r} with {activation!r} is not supported")
        h = c.hidden_size
        self.transform = nn.Linear(h, h)
        self.transform_norm = nn.LayerNorm(h, eps=c.layer_norm_eps)
        self.decoder = nn.Linear(h, c.vocab_size)
        self.head_act = "gelu" if c.family == "roberta" else c.act  # RoBERTa's head: gelu
        self.reduce = "sum" if pooling == "sum" else "amax"
        self.twice = activation == "log1p_relu"

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        states = self.encode(input_ids, attention_mask)
        length, width = states.size(1), states.size(2)
        real = torch.nonzero(attention_mask.reshape(-1) > 0).squeeze(1)  # flat token indexes
        x = states.reshape(-1, width).index_select(0, real)  # [N, H]: no padding
        x = self.transform_norm(activate(self.transform(x), self.head_act))
        weights = torch.log1p(torch.relu(self.decoder(x)))  # [N, V]
        if self.twice:
            weights = torch.log1p(weights)
        rows = torch.div(real, length, rounding_mode="floor").unsqueeze(1).expand_as(weights)
        pooled = torch.zeros(
            states.size(0), weights.size(1), dtype=weights.dtype, device=weights.device
        )
        return pooled.scatter_reduce(0, rows, weights, self.reduce)  # weights >= 0: 0 is neutral


def read_config(path: Path) -> HfConfig:
    return read_hf_config(path, MLM_ARCHITECTURES)


def head_names(c: HfConfig, tensors: dict[str, Tensor]) -> dict[str, str]:
    """Each of our parameter names -> the checkpoint's: the encoder's as the classifiers name
    them (factory/hf.py, less its head), then the MLM head's."""
    names = {
        ours: theirs
        for ours, theirs in checkpoint_names(c).items()
        if not ours.startswith(("dense.", "out."))
    }
    dense, norm, decoder, bias = _HEAD[c.family]
    names |= {
        "transform.weight": f"{dense}.weight",
        "transform.bias": f"{dense}.bias",
        "transform_norm.weight": f"{norm}.weight",
        "transform_norm.bias": f"{norm}.bias",
        "decoder.weight": decoder if decoder in tensors else _WORDS[c.family],
        "decoder.bias": bias,
    }
    return names


def build_splade(source: SparseSource) -> tuple[Splade, HfConfig]:
    """The sparse model of `source` in eval mode: every tensor used or named, every shape
    checked."""
    config = read_config(source.model_dir / "config.json")
    model = Splade(config, source.pooling, source.activation)
    where, tensors = read_weights(source.model_dir)
    known = _check_buffers(config, tensors, where) | {n for n in _DUPLICATE_BIAS if n in tensors}
    copy_weights(model, head_names(config, tensors), tensors, where, known, " from config.json")
    return model.eval(), config


def _st_splade(path: Path) -> tuple[str, str]:
    raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    pooling = str(raw.get("pooling_strategy", "max"))
    activation = str(raw.get("activation_function", "relu"))
    if pooling not in ("max", "sum") or activation not in ("relu", "log1p_relu"):
        raise WeightError(f"{path}: SpladePooling {pooling!r} with {activation!r} is not supported")
    return pooling, activation


def read_sparse_encoder(
    root: Path, kinds: list[str], modules: list[dict[str, Any]]
) -> SparseSource:
    """A SparseEncoder directory: its MLM module, then SpladePooling; the inference-free layout
    (a Router with a SparseStaticEmbedding for queries) is refused by name."""
    if _ST_STATIC in kinds or "Router" in kinds:
        raise WeightError(
            f"{root}/modules.json: the inference-free SPLADE layout (Router, "
            "SparseStaticEmbedding) is not supported yet; an MLM and SpladePooling are"
        )
    if len(kinds) != 2 or kinds[0] not in _ST_MLM or kinds[1] != _ST_POOLING:
        raise WeightError(
            f"{root}/modules.json: sparse modules {kinds} are not supported; "
            "MLMTransformer (or a fill-mask Transformer), then SpladePooling"
        )
    from ringserve.factory.embedder import _st_max_length

    model_dir = root / str(modules[0].get("path", ""))
    config = root / "sentence_bert_config.json"
    if config.is_file() and json.loads(config.read_text(encoding="utf-8")).get("do_lower_case"):
        raise WeightError(f"{config}: do_lower_case is not supported (lowercase in the tokenizer)")
    pooling, activation = _st_splade(root / str(modules[1].get("path", "")))
    return SparseSource(model_dir, pooling, activation, _st_max_length(model_dir),
                        "sentence-transformers")  # fmt: skip


def sparse_source(root: Path, pooling: str | None) -> SparseSource | None:
    """The sparse model `root` holds: a SparseEncoder directory, or a `*ForMaskedLM` with
    --pooling splade; None for anything else (the embed and classify exports' cases)."""
    from ringserve.factory.embedder import tokenizer_max_length

    modules_file = root / "modules.json"
    if modules_file.is_file():
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
        if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
            raise WeightError(f"{modules_file}: not a list of modules")
        kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
        if not ({_ST_POOLING, _ST_STATIC, "MLMTransformer"} & set(kinds)):
            return None
        if pooling is not None:
            raise WeightError(f"{root}: a sentence-transformers directory names its own pooling")
        return read_sparse_encoder(root, kinds, modules)
    raw: Any = json.loads((root / "config.json").read_text(encoding="utf-8"))
    archs = raw.get("architectures") or [] if isinstance(raw, dict) else []
    mlm = next((a for a in archs if a in MLM_ARCHITECTURES), None)
    if pooling == SPLADE and mlm is None:
        raise WeightError(
            f"{root}: --pooling splade goes with a masked-language model "
            f"({', '.join(MLM_ARCHITECTURES)}), not {archs}"
        )
    if mlm is None:
        return None
    if pooling != SPLADE:
        raise WeightError(f"{root}: a {mlm} directory is served with --pooling splade")
    return SparseSource(root, "max", "relu", tokenizer_max_length(root), mlm)


def export_onnx(model: Splade, path: Path) -> None:
    """The sparse model as ONNX: ids and mask in, `sparse` [B, V] out, batch and length dynamic."""
    from ringserve.factory.onnx import INPUTS, quiet

    ids = torch.full((2, 8), 101, dtype=torch.int64)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # a padded row, so the export traces the gather of real tokens
    axes = {name: {0: "batch", 1: "length"} for name in INPUTS} | {SPARSE_OUTPUT: {0: "batch"}}
    with quiet(), torch.no_grad():
        torch.onnx.export(
            model, (ids, mask), str(path), dynamo=False, input_names=list(INPUTS),
            output_names=[SPARSE_OUTPUT], dynamic_axes=axes, opset_version=OPSET,
        )  # fmt: skip


def build_sparse_artifact(
    out: Path, root: Path, source: SparseSource, name: str, max_length: int | None
) -> Path:
    """A sparse artifact: task `sparse`, no labels, the vocabulary's size in extra, the pooled
    weights as the graph's one output (TorchScript and ONNX)."""
    from ringserve.factory import build

    tokenizer = build._tokenizer_in(source.model_dir)
    with build._building(root):
        model, config = build_splade(source)
    vocab = build.open_tokenizer(tokenizer, 8).get_vocab_size(with_added_tokens=True)
    if vocab > config.vocab_size:
        raise build.ArtifactError(
            f"{root}: tokenizer.json has {vocab} tokens but the MLM head has {config.vocab_size} "
            "rows: they do not belong together"
        )
    length = build._max_length(max_length, source.max_length, config.max_length)
    extra = {
        "source": str(root.absolute()),
        "architecture": config.architecture,
        "format": source.kind,
        "pooling": SPLADE,
        "splade": {"pooling": source.pooling, "activation": source.activation},
        "vocabulary": config.vocab_size,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    manifest = asdict(build.Manifest(name, [], length, "", extra=extra))
    manifest |= {"task": ["sparse"], "token_types": config.token_types}
    build.check_fields(out, manifest | {"fingerprint": "-"})
    return build._publish(out, lambda tmp: _save(tmp, model, tokenizer, manifest))


def _save(target: Path, model: Splade, tokenizer: Path, manifest: dict[str, Any]) -> None:
    """Script and save the model, copy the tokenizer, add the ONNX graph (and int8 when the
    build makes it: factory/sparse_cost.py), then write the fingerprinted manifest."""
    from ringserve.factory import build
    from ringserve.factory import onnx as ox

    with build.quiet_torchscript():
        torch.jit.save(torch.jit.script(model), str(target / manifest["model_file"]))
    shutil.copyfile(tokenizer, target / manifest["tokenizer_file"])
    if build.onnx_available():
        work = target / ".onnx-build"
        work.mkdir()
        try:
            plain = work / ox.ONNX_FILE
            export_onnx(model, plain)
            files = {"onnx_file": (plain, ox.ONNX_FILE)}
            files |= _precisions(plain, work, target, manifest)
            data: list[str] = []
            for key, (src, name) in files.items():
                data += ox.store(src, target / name)[1:]
                manifest[key] = name
            manifest["data_files"] = data
            manifest["graphs"] = {"fused": {"kept": False, "why": "not built for a sparse model"}}
        finally:
            shutil.rmtree(work, ignore_errors=True)
    others = tuple(target / manifest[k] for k in build.OTHER_FILES if manifest.get(k))
    others += tuple(target / n for n in manifest.get("data_files", []))
    manifest["fingerprint"] = build.fingerprint_files(
        target / manifest["model_file"], target / manifest["tokenizer_file"], manifest, others
    )
    (target / build.MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _precisions(
    plain: Path, work: Path, target: Path, manifest: dict[str, Any]
) -> dict[str, tuple[Path, str]]:
    """int8's graph with its published cost (and bf16's cost on a CPU with bf16), unless the
    build is plain-only; see factory/sparse_cost.py."""
    from ringserve.factory import build

    if build._plain_only():
        return {}
    from ringserve.factory import sparse_cost

    return sparse_cost.precisions(plain, work, target / manifest["tokenizer_file"], manifest)
