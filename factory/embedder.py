"""Sentence encoders: a Hugging Face base model (BERT, DistilBERT, RoBERTa, XLM-R, ELECTRA,
DeBERTa-v2/v3, ModernBERT, MPNet) and sentence-transformers' pooling and Dense layers, in one
TorchScript-able module that answers the pooled (and projected) vector.

Two sources: a sentence-transformers directory (modules.json: Transformer, Pooling, then Dense
and Normalize modules in the order it saved them) or a plain base-model directory with the
pooling named on the command line. Pooling and Dense run inside the graph, so TorchScript and
ONNX Runtime answer the same vector; a Normalize that comes last is the front-end's (manifest
`normalize`), as for the default model, so that TEI's `"normalize": false` can still have the raw
vector; a Normalize before a Dense runs in the graph.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from ringserve.factory import families
from ringserve.factory.encoder import Encoder, HfConfig, WeightError, copy_weights, read_config
from ringserve.factory.hf import _PREFIX, _check_buffers, checkpoint_names, read_weights
from torch import Tensor, nn

# The base models' architectures (config.json "architectures") -> family, as in factory/hf.py.
BASE_ARCHITECTURES: dict[str, str] = {
    "BertModel": "bert",
    "DistilBertModel": "distilbert",
    "RobertaModel": "roberta",
    "XLMRobertaModel": "roberta",
    "ElectraModel": "electra",
} | families.BASE_ARCHITECTURES
POOLINGS = ("mean", "cls", "max", "last", "mean_sqrt_len", "weightedmean")
# sentence-transformers' names for them: its pooling_mode values and the older boolean keys.
_ST_MODES = {
    "mean": "mean",
    "cls": "cls",
    "max": "max",
    "lasttoken": "last",
    "mean_sqrt_len_tokens": "mean_sqrt_len",
    "weightedmean": "weightedmean",
}
_ST_KEYS = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
}
# The modules of a sentence-transformers pipeline, by the last part of their type name.
_ST_TRANSFORMER, _ST_POOLING, _ST_NORMALIZE = "Transformer", "Pooling", "Normalize"
_ST_DENSE = "Dense"
# Dense's activation_function (a torch.nn class path) -> ours (encoder.activate's names).
_DENSE_ACTS = {
    "Identity": "identity",
    "Tanh": "tanh",
    "ReLU": "relu",
    "GELU": "gelu",
    "Sigmoid": "sigmoid",
}
# The base models' pooler (BERT's and RoBERTa's [CLS] dense layer) is not part of any pooling.
_UNUSED = ("pooler.dense.weight", "pooler.dense.bias")


def pool(states: Tensor, keep: Tensor, pooling: str) -> Tensor:
    """sentence-transformers' pooling of token states [B, L, H] over the real tokens (keep: 0/1
    [B, L], right padded): mean, the first token, the component-wise max, the last real token,
    the sum over the square root of the count, or the mean weighted by position (1, 2, ...)."""
    if pooling == "cls":
        return states[:, 0]
    weights = keep.unsqueeze(-1)
    if pooling == "mean_sqrt_len":
        return (states * weights).sum(dim=1) / torch.sqrt(weights.sum(dim=1))
    if pooling == "weightedmean":
        positions = torch.arange(1, keep.size(1) + 1, device=keep.device, dtype=keep.dtype)
        weights = weights * positions.view(1, -1, 1)
    if pooling == "max":
        return states.masked_fill(weights == 0, float("-inf")).max(dim=1).values
    if pooling == "last":
        last = keep.sum(dim=1).to(torch.int64) - 1
        index = last.view(-1, 1, 1).expand(states.size(0), 1, states.size(2))
        return torch.gather(states, 1, index).squeeze(1)
    return (states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)


class SentenceEncoder(Encoder):
    """The encoder (factory/encoder.py), then pooling: the sentence vector [B, H]."""

    def __init__(self, c: HfConfig, pooling: str) -> None:
        if pooling not in POOLINGS:
            raise WeightError(f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
        super().__init__(c)
        self.pooling = pooling

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        x = self.encode(input_ids, attention_mask)
        return pool(x, (attention_mask > 0).to(x.dtype), self.pooling)

    def states(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """The token states [B, L, H] before pooling."""
        return self.encode(input_ids, attention_mask)


class FamilyEncoder(nn.Module):
    """A DeBERTa, ModernBERT or MPNet encoder (factory/families.py), then pooling."""

    def __init__(self, c: families.FamilyConfig, pooling: str) -> None:
        if pooling not in POOLINGS:
            raise WeightError(f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
        super().__init__()
        self.base = families.new_base(c)
        self.pooling = pooling

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        x = self.base(input_ids, attention_mask)
        return pool(x, (attention_mask > 0).to(x.dtype), self.pooling)

    def states(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """The token states [B, L, H] before pooling."""
        return self.base(input_ids, attention_mask)


class Step(nn.Module):
    """One module after pooling: sentence-transformers' Dense (a linear layer and its
    activation) or, with `linear` None, a Normalize that is not the last module."""

    def __init__(self, linear: nn.Linear | None, act: str) -> None:
        super().__init__()
        self.linear = linear
        self.act = act

    def forward(self, x: Tensor) -> Tensor:
        if self.linear is None:
            return F.normalize(x, p=2.0, dim=1)
        x = self.linear(x)
        if self.act == "tanh":
            return torch.tanh(x)
        if self.act == "relu":
            return F.relu(x)
        if self.act == "gelu":
            return F.gelu(x)
        if self.act == "sigmoid":
            return torch.sigmoid(x)
        return x


class Pipeline(nn.Module):
    """The pooled encoder, then its Dense and inner Normalize steps: the vector [B, D]."""

    def __init__(self, encoder: nn.Module, steps: list[Step]) -> None:
        super().__init__()
        self.encoder = encoder
        self.steps = nn.ModuleList(steps)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        x = self.encoder(input_ids, attention_mask)
        for step in self.steps:
            x = step(x)
        return x

    @torch.jit.export
    def classify_embed(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """What workers.runtimes.joined.Joined calls: no labels, so the row is the vector alone."""
        return self.forward(input_ids, attention_mask)


class OnnxAlone(nn.Module):
    """What model.onnx holds for an embed-only artifact: outputs `embedding` and `tokens` (the
    token states [B, L, H] before pooling, TEI's /embed_all: fetched only by a batch that asks),
    from one pass of the encoder."""

    def __init__(self, inner: Pipeline) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        encoder: Any = self.inner.encoder  # a SentenceEncoder or a FamilyEncoder
        states = encoder.states(input_ids, attention_mask)
        x = pool(states, (attention_mask > 0).to(states.dtype), encoder.pooling)
        for step in self.inner.steps:
            x = step(x)
        return x, states


@dataclass(frozen=True)
class EmbedSource:
    """A directory to export as an embed model: where the weights are, how to pool, and what
    comes after pooling."""

    model_dir: Path  # config.json, the weights and tokenizer.json
    pooling: str
    normalize: bool  # a Normalize as the last module: the front-end's
    max_length: int | None  # max_seq_length or the tokenizer's model_max_length, when stated
    kind: str  # "sentence-transformers" or the base architecture
    steps: tuple[Path | None, ...] = ()  # each Dense module's directory; None: a Normalize
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt: str | None = None


def _st_pooling(path: Path) -> str:
    raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    mode = raw.get("pooling_mode")
    if mode is None:  # the boolean keys of sentence-transformers before 5
        mode = [name for key, name in _ST_KEYS.items() if raw.get(key)]
    modes = [mode] if isinstance(mode, str) else list(mode)
    if raw.get("include_prompt", True) is not True:
        raise WeightError(f"{path}: include_prompt false is not supported")
    if len(modes) != 1 or modes[0] not in _ST_MODES:
        raise WeightError(
            f"{path}: pooling {modes} is not supported; one of {', '.join(_ST_MODES)}"
        )
    return _ST_MODES[modes[0]]


def _json_length(path: Path, key: str) -> int | None:
    """A token count `key` in the JSON file at `path`, when the file states a real one
    (transformers writes 1e30 for "no limit")."""
    if path.is_file():
        value = json.loads(path.read_text(encoding="utf-8")).get(key)
        if isinstance(value, int) and 0 < value < 1 << 20:
            return value
    return None


def tokenizer_max_length(model_dir: Path) -> int | None:
    """The tokenizer's own limit: tokenizer_config.json's model_max_length, when it says one."""
    return _json_length(model_dir / "tokenizer_config.json", "model_max_length")


def _st_max_length(root: Path) -> int | None:
    """sentence-transformers' max_seq_length: in sentence_bert_config.json, or (from version 5,
    and as it falls back when none is set) the tokenizer's model_max_length."""
    own = _json_length(root / "sentence_bert_config.json", "max_seq_length")
    return own or tokenizer_max_length(root)


def _st_prompts(root: Path) -> tuple[dict[str, str], str | None]:
    """config_sentence_transformers.json's `prompts` and `default_prompt_name`."""
    path = root / "config_sentence_transformers.json"
    if not path.is_file():
        return {}, None
    raw = json.loads(path.read_text(encoding="utf-8"))
    prompts = raw.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise WeightError(f"{path}: prompts must map names to strings")
    default = raw.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise WeightError(f"{path}: default_prompt_name {default!r} is not one of the prompts")
    return {str(k): v for k, v in prompts.items()}, default


def read_sentence_transformers(root: Path) -> EmbedSource:
    """A sentence-transformers directory: modules.json must be Transformer and Pooling, then
    any Dense and Normalize modules; anything else (a router, a CNN) is refused by name."""
    modules = json.loads((root / "modules.json").read_text(encoding="utf-8"))
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise WeightError(f"{root}/modules.json: not a list of modules")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    after = kinds[2:]
    if kinds[:2] != [_ST_TRANSFORMER, _ST_POOLING] or set(after) - {_ST_DENSE, _ST_NORMALIZE}:
        raise WeightError(
            f"{root}/modules.json: modules {kinds} are not supported; "
            "Transformer, Pooling, then Dense and Normalize"
        )
    model_dir = root / str(modules[0].get("path", ""))
    config = root / "sentence_bert_config.json"
    if config.is_file() and json.loads(config.read_text(encoding="utf-8")).get("do_lower_case"):
        raise WeightError(f"{config}: do_lower_case is not supported (lowercase in the tokenizer)")
    last_normalize = bool(after) and after[-1] == _ST_NORMALIZE
    inner = modules[2 : len(modules) - int(last_normalize)]
    steps = tuple(
        root / str(m.get("path", "")) if m["type"].endswith(_ST_DENSE) else None for m in inner
    )
    prompts, default = _st_prompts(root)
    return EmbedSource(
        model_dir=model_dir,
        pooling=_st_pooling(root / str(modules[1].get("path", ""))),
        normalize=last_normalize,
        max_length=_st_max_length(model_dir),
        kind="sentence-transformers",
        steps=steps,
        prompts=prompts,
        default_prompt=default,
    )


def _dense_step(path: Path) -> Step:
    """A Dense module's directory (config.json and its weights) as one Step."""
    raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    act = str(raw.get("activation_function", "torch.nn.modules.linear.Identity")).rsplit(".", 1)[-1]
    if act not in _DENSE_ACTS:
        raise WeightError(
            f"{path}: Dense activation {act!r} is not supported ({', '.join(_DENSE_ACTS)})"
        )
    linear = nn.Linear(
        int(raw["in_features"]), int(raw["out_features"]), bias=bool(raw.get("bias", True))
    )
    where, tensors = read_weights(path)
    names = {f"linear.{n}": f"linear.{n}" for n, _ in linear.named_parameters(prefix="")}
    holder = nn.Module()
    holder.linear = linear
    copy_weights(holder, names, tensors, where)
    return Step(linear, _DENSE_ACTS[act])


def _base_weights(c: HfConfig, tensors: dict[str, Tensor], where: Path) -> dict[str, Tensor]:
    """The checkpoint's tensors under the classifier's names (factory/hf.py checkpoint_names),
    less the head: a base model saves them without the family prefix, and its pooler is unused."""
    prefix = _PREFIX[c.family]
    out: dict[str, Tensor] = {}
    for name, tensor in tensors.items():
        bare = name[len(prefix) :] if name.startswith(prefix) else name
        if bare in _UNUSED:
            continue
        out[prefix + bare] = tensor
    return out


def _plain_encoder(
    source: EmbedSource,
    weights: tuple[Path, dict[str, Tensor]] | None = None,
    architectures: dict[str, str] | None = None,
) -> tuple[nn.Module, HfConfig | families.FamilyConfig]:
    """The pooled encoder of `source`, every tensor used or named unused, every shape checked.
    `weights`: the checkpoint's tensors, already read (a ColBERT's, less its projection);
    `architectures`: the BERT-like ones to take instead of the base models (factory/colbert.py)."""
    where, raw = weights or read_weights(source.model_dir)
    path = source.model_dir / "config.json"
    family = None
    if architectures is None:
        family = families.read_family_config(path, families.BASE_ARCHITECTURES)
    if family is not None:
        encoder = FamilyEncoder(family, source.pooling)
        families.load_family(encoder, family.family, raw, where)
        return encoder, family
    config = read_config(path, architectures or BASE_ARCHITECTURES)
    model = SentenceEncoder(config, source.pooling)
    tensors = _base_weights(config, raw, where)
    names = {
        ours: theirs
        for ours, theirs in checkpoint_names(config).items()
        if not ours.startswith(("dense.", "out."))  # the classifier's head: none here
    }
    known = _check_buffers(config, tensors, where)
    copy_weights(model, names, tensors, where, known, " from config.json")
    return model, config


def build_encoder(source: EmbedSource) -> tuple[Pipeline, Any, int]:
    """The embed model of `source` in eval mode, its config (no labels) and its dimension."""
    encoder, config = _plain_encoder(source)
    steps = [Step(None, "") if p is None else _dense_step(p) for p in source.steps]
    dimension = config.hidden_size
    for step in steps:
        if step.linear is not None:
            if step.linear.in_features != dimension:
                raise WeightError(
                    f"a Dense module takes {step.linear.in_features} features, "
                    f"the vector before it has {dimension}"
                )
            dimension = step.linear.out_features
    return Pipeline(encoder, steps).eval(), replace(config, labels=()), dimension


def embed_source(root: Path, pooling: str | None) -> EmbedSource | None:
    """The embed model that `root` holds, or None when it is a classifier directory (the
    caller's case). A base model needs `pooling`; a sentence-transformers one says its own."""
    if (root / "modules.json").is_file():
        if pooling is not None:
            raise WeightError(f"{root}: a sentence-transformers directory names its own pooling")
        return read_sentence_transformers(root)
    raw: Any = json.loads((root / "config.json").read_text(encoding="utf-8"))
    archs = raw.get("architectures") or [] if isinstance(raw, dict) else []
    base = next((a for a in archs if a in BASE_ARCHITECTURES), None)
    if base is None:
        if pooling is not None:
            raise WeightError(
                f"{root}: --pooling goes with a base model ({', '.join(BASE_ARCHITECTURES)}), "
                f"not {archs}"
            )
        return None
    if pooling is None:
        raise WeightError(f"{root}: a {base} directory needs --pooling ({', '.join(POOLINGS)})")
    return EmbedSource(root, pooling, False, tokenizer_max_length(root), kind=base)
