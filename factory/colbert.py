"""ColBERT checkpoints (late interaction): an encoder, its `colbert_linear` projection and L2
normalization, exported as a `multivector` artifact that answers one vector a token.

Two layouts are read, as PyLate loads them (its `models.ColBERT` is the reference the tests
compare with):

- PyLate's: a sentence-transformers directory (modules.json: Transformer, then one or more
  Dense modules), whose config_sentence_transformers.json names the query and document prefixes
  (`[Q] ` and `[D] `: tokens PyLate added to the tokenizer), `query_length`, `document_length`,
  `do_query_expansion`, `attend_to_expansion_tokens` and `skiplist_words`.
- Stanford ColBERT's: config.json of architecture `HF_ColBERT` (a BERT), the projection as the
  checkpoint's `linear.weight`, and artifact.metadata for `query_token_id`, `doc_token_id`,
  `query_maxlen`, `doc_maxlen` and `attend_to_mask_tokens` (its `[unused0]` and `[unused1]`
  markers are in the vocabulary already).

The graph computes the normalized projected token vectors [B, L, D] (output `tokens`); the
worker reads the rest from the manifest's `extra.multivector` (workers/process/multivector.py):
the prefix token after [CLS], the query's [MASK] expansion to query_length, the cut at each
length, and the document's skiplist (punctuation) tokens, which its answer leaves out.
"""

from __future__ import annotations

import json
import shutil
import string
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from ringserve.factory.embedder import EmbedSource, Step, _dense_step
from ringserve.factory.embedder import _plain_encoder as plain_encoder
from ringserve.factory.encoder import WeightError
from ringserve.factory.hf import read_weights
from ringserve.workers.artifact import (
    MANIFEST_FILE,
    ArtifactError,
    Manifest,
    check_fields,
    fingerprint_files,
    open_tokenizer,
    quiet_torchscript,
)
from torch import Tensor, nn

# The artifact's tasks: its token vectors (/v1/embeddings/multi) and MaxSim rerank.
TASKS = ["multivector", "rerank"]
# PyLate's defaults, for what config_sentence_transformers.json leaves out (models.ColBERT).
QUERY_PREFIX, DOCUMENT_PREFIX = "[Q] ", "[D] "
QUERY_LENGTH, DOCUMENT_LENGTH = 32, 180
# Stanford ColBERT's markers when artifact.metadata names none (PyLate's fallback too).
STANFORD_QUERY, STANFORD_DOCUMENT = "[unused0]", "[unused1]"
# Families whose positions come from the attention mask (factory/encoder.py, families.py): a
# query's expansion tokens, unattended, would get the padding position where transformers gives
# them their own.
MASK_POSITIONS = ("roberta", "mpnet")


@dataclass(frozen=True)
class ColbertSource:
    """A ColBERT directory as PyLate reads it: where the encoder is, its projections, and the
    settings of its two encodings."""

    root: Path
    layout: str  # "pylate" or "stanford"
    dense: tuple[Path, ...] = ()  # PyLate's Dense module directories, in order
    query_prefix: str = QUERY_PREFIX  # "" : none
    document_prefix: str = DOCUMENT_PREFIX
    query_length: int = QUERY_LENGTH
    document_length: int = DOCUMENT_LENGTH
    do_query_expansion: bool = True
    attend_to_expansion_tokens: bool = False
    skiplist_words: tuple[str, ...] = tuple(string.punctuation)
    prompts: dict[str, str] = field(default_factory=dict)


def _json(path: Path) -> dict[str, Any]:
    raw = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    if not isinstance(raw, dict):
        raise WeightError(f"{path}: not a JSON object")
    return raw


def is_colbert(root: Path) -> bool:
    """Whether `root` holds a ColBERT checkpoint in PyLate's or Stanford's layout."""
    if (root / "modules.json").is_file():
        st = _json(root / "config_sentence_transformers.json")
        modules = json.loads((root / "modules.json").read_text(encoding="utf-8"))
        types = [str(m.get("type", "")) for m in modules if isinstance(m, dict)]
        return st.get("model_type") == "ColBERT" or any(t.startswith("pylate.") for t in types)
    archs = _json(root / "config.json").get("architectures") or []
    return "HF_ColBERT" in archs


def _length(raw: dict[str, Any], key: str, default: int, where: Path) -> int:
    value = raw.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 3:
        raise WeightError(f"{where}: {key} must be an integer of at least 3, not {value!r}")
    return value


def _flag(raw: dict[str, Any], key: str, default: bool, where: Path) -> bool:
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise WeightError(f"{where}: {key} must be true or false, not {value!r}")
    return value


def _prefix(raw: dict[str, Any], key: str, default: str, where: Path) -> str:
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise WeightError(f"{where}: {key} must be a string, not {value!r}")
    return value


def read_pylate(root: Path) -> ColbertSource:
    """PyLate's directory: Transformer at the root (or its path), then Dense modules."""
    modules = json.loads((root / "modules.json").read_text(encoding="utf-8"))
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise WeightError(f"{root}/modules.json: not a list of modules")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if len(kinds) < 2 or kinds[0] != "Transformer" or set(kinds[1:]) != {"Dense"}:
        raise WeightError(
            f"{root}/modules.json: modules {kinds} are not supported for ColBERT; "
            "Transformer, then Dense modules"
        )
    if str(modules[0].get("path", "")) not in ("", "."):
        raise WeightError(f"{root}/modules.json: the Transformer must be at the root")
    bert = _json(root / "sentence_bert_config.json")
    if bert.get("do_lower_case"):
        raise WeightError(f"{root}/sentence_bert_config.json: do_lower_case is not supported")
    where = root / "config_sentence_transformers.json"
    raw = _json(where)
    prompts = raw.get("prompts") or {}
    default = raw.get("default_prompt_name")
    if default is not None and (prompts.get(default) or ""):
        raise WeightError(f"{where}: a default prompt ({default!r}) is not supported")
    words = raw.get("skiplist_words")
    if words is not None and not (
        isinstance(words, list) and all(isinstance(w, str) for w in words)
    ):
        raise WeightError(f"{where}: skiplist_words must be a list of strings")
    for m in modules[1:]:
        dense = _json(root / str(m.get("path", "")) / "config.json")
        if dense.get("use_residual"):
            raise WeightError(f"{root}/{m.get('path')}: a Dense with use_residual is not supported")
    return ColbertSource(
        root=root,
        layout="pylate",
        dense=tuple(root / str(m.get("path", "")) for m in modules[1:]),
        query_prefix=_prefix(raw, "query_prefix", QUERY_PREFIX, where),
        document_prefix=_prefix(raw, "document_prefix", DOCUMENT_PREFIX, where),
        query_length=_length(raw, "query_length", QUERY_LENGTH, where),
        document_length=_length(raw, "document_length", DOCUMENT_LENGTH, where),
        do_query_expansion=_flag(raw, "do_query_expansion", True, where),
        attend_to_expansion_tokens=_flag(raw, "attend_to_expansion_tokens", False, where),
        skiplist_words=tuple(string.punctuation if words is None else words),
        prompts={str(k): str(v) for k, v in prompts.items()} if isinstance(prompts, dict) else {},
    )


def read_stanford(root: Path) -> ColbertSource:
    """Stanford ColBERT's directory (HF_ColBERT): the markers and lengths from
    artifact.metadata, as PyLate reads them; its defaults (or Stanford's markers) otherwise."""
    where = root / "artifact.metadata"
    raw = _json(where)
    return ColbertSource(
        root=root,
        layout="stanford",
        query_prefix=_prefix(raw, "query_token_id", STANFORD_QUERY, where),
        document_prefix=_prefix(raw, "doc_token_id", STANFORD_DOCUMENT, where),
        query_length=_length(raw, "query_maxlen", QUERY_LENGTH, where),
        document_length=_length(raw, "doc_maxlen", DOCUMENT_LENGTH, where),
        attend_to_expansion_tokens=_flag(raw, "attend_to_mask_tokens", False, where),
    )


class ColbertModel(nn.Module):
    """The encoder's token states, each projected by the Dense steps and L2-normalized: the
    token vectors [B, L, D] (`tokens`). `forward` is the first token's vector [B, D] (the rows
    every runner warms with); the ONNX graph has both outputs (OnnxTokens)."""

    def __init__(self, encoder: nn.Module, steps: list[Step]) -> None:
        super().__init__()
        self.encoder = encoder
        self.steps = nn.ModuleList(steps)

    @torch.jit.export
    def tokens(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        x = self.encoder.states(input_ids, attention_mask)  # type: ignore[operator]
        for step in self.steps:
            x = step(x)
        return F.normalize(x, p=2.0, dim=-1)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.tokens(input_ids, attention_mask)[:, 0]


class OnnxTokens(nn.Module):
    """What model.onnx holds: outputs `embedding` (the first token's vector) and `tokens`."""

    def __init__(self, inner: ColbertModel) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        x = self.inner.tokens(input_ids, attention_mask)
        return x[:, 0], x


def _weights(root: Path) -> tuple[Path, dict[str, Tensor]]:
    """The checkpoint's tensors, a LayerNorm's legacy `gamma` and `beta` under today's names
    (`weight`, `bias`), as transformers loads them: transformers 5.3, which PyLate 1.6 pins,
    writes a model it loaded and saved again with the legacy names."""
    where, tensors = read_weights(root)
    legacy = {".gamma": ".weight", ".beta": ".bias"}
    out = {}
    for name, tensor in tensors.items():
        stem, dot, last = name.rpartition(".")
        if "LayerNorm" in stem and dot + last in legacy:
            name = stem + legacy[dot + last]
        out[name] = tensor
    return where, out


def _stanford_weights(source: ColbertSource) -> tuple[Path, dict[str, Tensor], Step]:
    """The encoder's tensors (its `bert.` names as a base model's) and the projection."""
    where, tensors = _weights(source.root)
    linear = tensors.pop("linear.weight", None)
    if linear is None:
        raise WeightError(f"{where}: no linear.weight (the ColBERT projection)")
    if linear.dim() != 2 or any(n.startswith("linear.") for n in tensors):
        raise WeightError(f"{where}: linear.* is not one weight [D, H] without a bias")
    layer = nn.Linear(linear.shape[1], linear.shape[0], bias=False)
    with torch.no_grad():
        layer.weight.copy_(linear.to(torch.float32))
    return where, tensors, Step(layer, "identity")


def build_model(source: ColbertSource) -> tuple[ColbertModel, Any, int]:
    """The ColBERT model of `source` in eval mode, its encoder's config and its dimension D;
    every tensor used (or named unused), every shape checked."""
    embed = EmbedSource(source.root, "cls", False, None, source.layout)
    if source.layout == "stanford":
        where, tensors, step = _stanford_weights(source)
        encoder, config = plain_encoder(embed, (where, tensors), {"HF_ColBERT": "bert"})
        steps = [step]
    else:
        encoder, config = plain_encoder(embed, _weights(source.root))
        steps = [_dense_step(p) for p in source.dense]
    dimension = config.hidden_size
    for step in steps:
        assert step.linear is not None
        if step.linear.in_features != dimension:
            raise WeightError(
                f"a Dense module takes {step.linear.in_features} features, "
                f"the vector before it has {dimension}"
            )
        dimension = step.linear.out_features
    return ColbertModel(encoder, steps).eval(), config, dimension


def _token_config(root: Path) -> dict[str, Any]:
    """tokenizer_config.json with special_tokens_map.json's names under it."""
    out = _json(root / "special_tokens_map.json") | _json(root / "tokenizer_config.json")
    return {k: (v.get("content") if isinstance(v, dict) else v) for k, v in out.items()}


def token_ids(source: ColbertSource, tokenizer: Path) -> dict[str, Any]:
    """The ids the worker needs, found as PyLate finds them (transformers'
    convert_tokens_to_ids: a token the vocabulary lacks is the unknown token's id): the two
    prefixes, the expansion token ([MASK], else the end token, else padding) and the skiplist's."""
    tok = open_tokenizer(tokenizer, 8)
    names = _token_config(source.root)
    unk = tok.token_to_id(str(names["unk_token"])) if names.get("unk_token") else None

    def find(token: str) -> int | None:
        found = tok.token_to_id(token)
        return unk if found is None else found

    expansion = None
    for key in ("mask_token", "eos_token", "pad_token"):
        if isinstance(names.get(key), str) and tok.token_to_id(names[key]) is not None:
            expansion = tok.token_to_id(names[key])
            break
    if expansion is None:
        raise WeightError(
            f"{source.root}: the tokenizer has no [MASK], end or padding token to expand queries"
        )
    skip = sorted({i for i in (find(w) for w in source.skiplist_words) if i is not None})
    prefix = {}
    for kind, text in (("query", source.query_prefix), ("document", source.document_prefix)):
        found = find(text) if text else None
        if text and found is None:
            raise WeightError(f"{source.root}: the tokenizer has no {kind} prefix token {text!r}")
        prefix[kind] = found
    return {
        "query_prefix_id": prefix["query"],
        "document_prefix_id": prefix["document"],
        "expansion_id": expansion,
        "skiplist_ids": skip,
    }


def multivector_extra(
    source: ColbertSource, tokenizer: Path, dimension: int, max_length: int
) -> dict[str, Any]:
    """The manifest's `extra.multivector`: everything the worker's ColBERT tokenization and the
    answers need (workers/process/multivector.py)."""
    query_length = min(source.query_length, max_length)
    return {
        "format": source.layout,
        "similarity": "MaxSim",
        "dimension": dimension,
        "query_length": query_length,
        "document_length": min(source.document_length, max_length),
        "query_prefix": source.query_prefix,
        "document_prefix": source.document_prefix,
        "do_query_expansion": source.do_query_expansion,
        "attend_to_expansion_tokens": source.attend_to_expansion_tokens
        and source.do_query_expansion,
        "skiplist_words": list(source.skiplist_words),
        **token_ids(source, tokenizer),
    }


def _save(target: Path, model: ColbertModel, tokenizer: Path, manifest: dict[str, Any]) -> None:
    """model.pt (TorchScript), the tokenizer, model.onnx with its `tokens` output, and the
    fingerprinted manifest. No fused or int8 graph: both are chosen on a classifier's logits,
    which a ColBERT model has none of; it serves at fp32 (or bf16 on OpenVINO)."""
    from ringserve.factory import onnx as ox

    with quiet_torchscript():
        torch.jit.save(torch.jit.script(model), str(target / manifest["model_file"]))
    shutil.copyfile(tokenizer, target / manifest["tokenizer_file"])
    work = target / ".onnx-build"
    work.mkdir()
    try:
        plain = work / ox.ONNX_FILE
        ids = torch.full((2, 8), 101, dtype=torch.int64)
        outputs = ["embedding", ox.TOKENS_OUTPUT]
        axes = {name: {0: "batch", 1: "length"} for name in (*ox.INPUTS, ox.TOKENS_OUTPUT)}
        with ox.quiet(), torch.no_grad():
            torch.onnx.export(
                OnnxTokens(model), (ids, torch.ones_like(ids)), str(plain), dynamo=False,
                input_names=list(ox.INPUTS), output_names=outputs,
                dynamic_axes=axes | {"embedding": {0: "batch"}}, opset_version=ox.OPSET,
            )  # fmt: skip
        data = ox.store(plain, target / ox.ONNX_FILE)[1:]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    manifest |= {"onnx_file": ox.ONNX_FILE, "data_files": data}
    manifest["graphs"] = {"fused": {"kept": False, "why": "not built for a multivector model"}}
    manifest["extra"]["token_vectors"] = manifest["extra"]["multivector"]["dimension"]
    others = tuple(target / n for n in (ox.ONNX_FILE, *data))
    manifest["fingerprint"] = fingerprint_files(
        target / manifest["model_file"], target / manifest["tokenizer_file"], manifest, others
    )
    (target / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def build_colbert_artifact(
    out: Path, root: Path, name: str, max_length: int | None, publish: Any
) -> Path:
    """A `multivector` artifact of the ColBERT directory `root`. `max_length` (--max-length)
    lowers document_length and query_length, never raises them; each must fit the positions.
    `publish` is factory/build.py's (the directory put in place whole)."""
    try:
        source = read_stanford(root) if not (root / "modules.json").is_file() else read_pylate(root)
        if max_length is not None:
            if max_length < 3:
                raise ArtifactError(f"--max-length {max_length}: at least 3")
            source = replace(
                source,
                query_length=min(source.query_length, max_length),
                document_length=min(source.document_length, max_length),
            )
        tokenizer = root / "tokenizer.json"
        if not tokenizer.is_file():
            raise ArtifactError(
                f"{root}: no tokenizer.json (save the fast tokenizer with save_pretrained)"
            )
        model, config, dimension = build_model(source)
        longest = max(source.query_length, source.document_length)
        if longest > config.max_length:
            raise ArtifactError(
                f"{root}: query_length and document_length must fit the {config.max_length} "
                f"positions the model holds, not {longest} (--max-length lowers them)"
            )
        unattended = source.do_query_expansion and not source.attend_to_expansion_tokens
        if unattended and config.family in MASK_POSITIONS:
            raise ArtifactError(
                f"{root}: a {config.family} ColBERT whose query expansion is not attended to "
                "is not supported (its positions come from the mask here)"
            )
        vocab = open_tokenizer(tokenizer, 8).get_vocab_size(with_added_tokens=True)
        if vocab > config.vocab_size:
            raise ArtifactError(
                f"{root}: tokenizer.json has {vocab} tokens but the embeddings have "
                f"{config.vocab_size} rows: they do not belong together"
            )
        extra = {
            "source": str(root.absolute()),
            "architecture": config.architecture,
            "format": f"colbert ({source.layout})",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "multivector": multivector_extra(source, tokenizer, dimension, longest),
        }
    except (OSError, ValueError) as exc:  # WeightError is a ValueError
        raise ArtifactError(f"cannot build model from {root}: {exc}") from None
    manifest = asdict(Manifest(name, [], longest, "", extra=extra))
    manifest["task"] = list(TASKS)
    check_fields(out, manifest | {"fingerprint": "-"})
    result: Path = publish(out, lambda tmp: _save(tmp, model, tokenizer, manifest))
    return result
