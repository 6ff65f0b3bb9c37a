"""Hand-written DeBERTa-v2/v3, ModernBERT and MPNet encoders (HF checkpoints), TorchScript-able
and exportable to ONNX; `transformers` is never imported here.

Each module keeps the checkpoint's own parameter names under `base.` (the encoder) and `head.`
(the classifier's head), so one strict copy loads any of them (load_family). Every position-
dependent tensor (DeBERTa's relative buckets, ModernBERT's rotary angles and local window, MPNet's
relative bias) is computed from the runtime length, so each batch shape the batcher makes holds
in both runtimes. A pair needs no token types in these families: the mask is 0/1 (or 2, read as 1).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from ringserve.factory.encoder import (
    ACTIVATIONS,
    MASK_VALUE,
    WeightError,
    activate,
    head_activation,
)
from torch import Tensor, nn

# Sequence classifiers and base models (config.json "architectures") -> family.
ARCHITECTURES = {
    "DebertaV2ForSequenceClassification": "deberta-v2",
    "ModernBertForSequenceClassification": "modernbert",
    "MPNetForSequenceClassification": "mpnet",
}
BASE_ARCHITECTURES = {
    "DebertaV2Model": "deberta-v2",
    "ModernBertModel": "modernbert",
    "MPNetModel": "mpnet",
}
# The base model's name prefix inside a classifier checkpoint.
_PREFIX = {"deberta-v2": "deberta.", "modernbert": "model.", "mpnet": "mpnet."}
# Tensors a checkpoint may hold that no forward pass uses (MPNetModel's pooler, index buffers).
_UNUSED = ("pooler.dense.weight", "pooler.dense.bias", "embeddings.position_ids")


@dataclass(frozen=True)
class FamilyConfig:
    """What build.py reads of a config (the names HfConfig uses) and the family's own fields."""

    architecture: str
    family: str
    vocab_size: int
    hidden_size: int
    max_positions: int
    labels: tuple[str, ...]
    problem_type: str | None
    raw: dict[str, Any] = field(compare=False)
    token_types: bool = False

    @property
    def activation(self) -> str:
        return head_activation(self.problem_type, self.labels)

    @property
    def max_length(self) -> int:
        """MPNet's positions start after padding_idx 1, as RoBERTa's do."""
        return self.max_positions - 2 if self.family == "mpnet" else self.max_positions

    def act(self, key: str, default: str = "gelu") -> str:
        name = str(self.raw.get(key, default))
        if name not in ACTIVATIONS:
            raise WeightError(f"{self.family}: activation {name!r} is not supported")
        return ACTIVATIONS[name]


def read_family_config(path: Path, architectures: dict[str, str]) -> FamilyConfig | None:
    """The config of one of these families, or None for another architecture."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    archs = raw.get("architectures") or [] if isinstance(raw, dict) else []
    arch = next((a for a in archs if a in architectures), None)
    if arch is None:
        return None
    from ringserve.factory.encoder import _labels

    family = architectures[arch]
    config = FamilyConfig(
        arch, family, int(raw["vocab_size"]), int(raw["hidden_size"]),
        int(raw.get("max_position_embeddings", 8192 if family == "modernbert" else 512)),
        _labels(raw, path), raw.get("problem_type"), raw,
    )  # fmt: skip
    if family == "deberta-v2" and int(raw.get("type_vocab_size", 0)) > 0:
        raise WeightError(
            f"{path}: DeBERTa with token types (type_vocab_size > 0) is not supported"
        )
    if family == "deberta-v2" and int(raw.get("conv_kernel_size", 0)) > 0:
        raise WeightError(
            f"{path}: DeBERTa's convolution layer (conv_kernel_size) is not supported"
        )
    return config


def _heads(x: Tensor, heads: int) -> Tensor:
    """[B, L, H*D] -> [B, H, L, D]."""
    return x.view(x.size(0), x.size(1), heads, -1).transpose(1, 2)


def _merge(x: Tensor) -> Tensor:
    """[B, H, L, D] -> [B, L, H*D]."""
    return x.transpose(1, 2).reshape(x.size(0), x.size(2), -1)


def _key_bias(mask: Tensor) -> Tensor:
    keep = (mask > 0).to(torch.float32).unsqueeze(1).unsqueeze(2)  # [B, 1, 1, L]
    return (1.0 - keep) * -3.4028234663852886e38  # MASK_VALUE (TorchScript reads no globals)


class _Linear(nn.Module):
    """A module holding one `dense` (HF's intermediate blocks)."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.dense = nn.Linear(n_in, n_out)


class _DenseNorm(nn.Module):
    """dense, then LayerNorm of it plus the residual (HF's *Output blocks)."""

    def __init__(self, n_in: int, n_out: int, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(n_in, n_out)
        self.LayerNorm = nn.LayerNorm(n_out, eps=eps)

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dense(x) + residual)


# ---- MPNet -------------------------------------------------------------------------------------


class _MPNetEmbeddings(nn.Module):
    def __init__(self, c: FamilyConfig, eps: float) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_positions, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=eps)

    def forward(self, input_ids: Tensor, mask: Tensor) -> Tensor:
        keep = (mask > 0).to(input_ids.dtype)
        positions = torch.cumsum(keep, dim=1) * keep + 1  # padding_idx 1, as HF derives them
        return self.LayerNorm(self.word_embeddings(input_ids) + self.position_embeddings(positions))


class _MPNetSelf(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.o = nn.Linear(hidden, hidden)


class _MPNetAttention(nn.Module):
    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.attn = _MPNetSelf(hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)


class _MPNetLayer(nn.Module):
    def __init__(self, c: FamilyConfig, eps: float) -> None:
        super().__init__()
        h, i = c.hidden_size, int(c.raw["intermediate_size"])
        self.heads = int(c.raw["num_attention_heads"])
        self.scale = math.sqrt(h // self.heads)
        self.act = c.act("hidden_act")
        self.attention = _MPNetAttention(h, eps)
        self.intermediate = _Linear(h, i)
        self.output = _DenseNorm(i, h, eps)

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        a = self.attention.attn
        q, k, v = _heads(a.q(x), self.heads), _heads(a.k(x), self.heads), _heads(a.v(x), self.heads)
        scores = torch.matmul(q, k.transpose(-1, -2)) / self.scale + bias
        context = _merge(torch.matmul(torch.softmax(scores, dim=-1), v))
        x = self.attention.LayerNorm(a.o(context) + x)
        return self.output(activate(self.intermediate.dense(x), self.act), x)


def mpnet_buckets(length: int, device: torch.device) -> Tensor:
    """MPNet's (T5's) relative position bucket of key j for query i: 32 buckets, distance 128."""
    pos = torch.arange(length, dtype=torch.long, device=device)
    n = -(pos[None, :] - pos[:, None])
    half, max_exact = 16, 8
    ret = (n < 0).to(torch.long) * half
    n = torch.abs(n)
    scaled = torch.log(n.clamp(min=1).float() / max_exact) / math.log(128 / max_exact)
    large = max_exact + (scaled * (half - max_exact)).to(torch.long)
    large = torch.clamp(large, max=half - 1)
    return ret + torch.where(n < max_exact, n, large)


class _MPNetEncoder(nn.Module):
    def __init__(self, c: FamilyConfig, eps: float) -> None:
        super().__init__()
        self.layer = nn.ModuleList(
            [_MPNetLayer(c, eps) for _ in range(int(c.raw["num_hidden_layers"]))]
        )
        buckets = int(c.raw.get("relative_attention_num_buckets", 32))
        self.relative_attention_bias = nn.Embedding(buckets, int(c.raw["num_attention_heads"]))


class MPNetBase(nn.Module):
    def __init__(self, c: FamilyConfig) -> None:
        super().__init__()
        eps = float(c.raw.get("layer_norm_eps", 1e-12))
        self.embeddings = _MPNetEmbeddings(c, eps)
        self.encoder = _MPNetEncoder(c, eps)

    def forward(self, input_ids: Tensor, mask: Tensor) -> Tensor:
        x = self.embeddings(input_ids, mask)
        rel = self.encoder.relative_attention_bias(mpnet_buckets(x.size(1), x.device))
        bias = rel.permute(2, 0, 1).unsqueeze(0) + _key_bias(mask)  # [B, H, L, L]
        for layer in self.encoder.layer:
            x = layer(x, bias)
        return x


class _RobertaStyleHead(nn.Module):
    def __init__(self, hidden: int, n_labels: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.out_proj = nn.Linear(hidden, n_labels)


class MPNetHead(nn.Module):
    def __init__(self, c: FamilyConfig) -> None:
        super().__init__()
        self.classifier = _RobertaStyleHead(c.hidden_size, len(c.labels))

    def forward(self, states: Tensor, mask: Tensor) -> Tensor:
        return self.classifier.out_proj(torch.tanh(self.classifier.dense(states[:, 0])))


# ---- DeBERTa-v2/v3 ------------------------------------------------------------------------------


class _DebertaEmbeddings(nn.Module):
    def __init__(self, c: FamilyConfig, eps: float) -> None:
        super().__init__()
        e = int(c.raw.get("embedding_size") or c.hidden_size)
        self.word_embeddings = nn.Embedding(c.vocab_size, e)
        biased = bool(c.raw.get("position_biased_input", True))
        self.position_embeddings = nn.Embedding(c.max_positions, e) if biased else None
        self.embed_proj = nn.Linear(e, c.hidden_size, bias=False) if e != c.hidden_size else None
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=eps)

    def forward(self, input_ids: Tensor, mask: Tensor) -> Tensor:
        x = self.word_embeddings(input_ids)
        if self.position_embeddings is not None:
            positions = torch.arange(input_ids.size(1), device=input_ids.device).unsqueeze(0)
            x = x + self.position_embeddings(positions)
        if self.embed_proj is not None:
            x = self.embed_proj(x)
        return self.LayerNorm(x) * (mask > 0).to(x.dtype).unsqueeze(-1)


class _DebertaSelf(nn.Module):
    def __init__(self, c: FamilyConfig, types: list[str], share: bool) -> None:
        super().__init__()
        h = c.hidden_size
        self.query_proj = nn.Linear(h, h)
        self.key_proj = nn.Linear(h, h)
        self.value_proj = nn.Linear(h, h)
        own = bool(c.raw.get("relative_attention")) and not share
        self.pos_key_proj = nn.Linear(h, h) if own and "c2p" in types else None
        self.pos_query_proj = nn.Linear(h, h) if own and "p2c" in types else None


class _DebertaAttention(nn.Module):
    def __init__(self, c: FamilyConfig, types: list[str], share: bool, eps: float) -> None:
        super().__init__()
        self.selfattn = _DebertaSelf(c, types, share)
        self.output = _DenseNorm(c.hidden_size, c.hidden_size, eps)


class _DebertaLayer(nn.Module):
    def __init__(self, c: FamilyConfig, span: int, eps: float) -> None:
        super().__init__()
        types = _pos_att_type(c)
        self.share = bool(c.raw.get("share_att_key", False))
        self.c2p, self.p2c = "c2p" in types, "p2c" in types
        self.relative = bool(c.raw.get("relative_attention", False))
        self.heads = int(c.raw["num_attention_heads"])
        factor = 1 + (int(self.c2p) + int(self.p2c) if self.relative else 0)
        self.scale = math.sqrt((c.hidden_size // self.heads) * factor)
        self.span = span
        self.act = c.act("hidden_act")
        i = int(c.raw["intermediate_size"])
        self.attention = _DebertaAttention(c, types, self.share, eps)
        self.intermediate = _Linear(c.hidden_size, i)
        self.output = _DenseNorm(i, c.hidden_size, eps)

    def _relative(self, q: Tensor, k: Tensor, rel: Tensor, rel_emb: Tensor) -> Tensor:
        """c2p and p2c scores [B, H, L, L] from the bucketed relative positions rel [L, L]."""
        a = self.attention.selfattn
        shape = [q.size(0), q.size(1), q.size(2), q.size(2)]
        score = torch.zeros(shape, dtype=q.dtype, device=q.device)
        emb = rel_emb.unsqueeze(0)  # [1, 2span, H]
        if self.c2p:
            pk = a.pos_key_proj
            pos_k = _heads(a.key_proj(emb) if pk is None else pk(emb), self.heads)  # [1,H,2S,D]
            c2p = torch.matmul(q, pos_k.transpose(-1, -2))
            index = torch.clamp(rel + self.span, 0, 2 * self.span - 1).expand(shape)
            score = score + torch.gather(c2p, -1, index) / self.scale
        if self.p2c:
            pq = a.pos_query_proj
            pos_q = _heads(a.query_proj(emb) if pq is None else pq(emb), self.heads)
            p2c = torch.matmul(k, pos_q.transpose(-1, -2))  # [B, H, L(key), 2span]
            index = torch.clamp(-rel + self.span, 0, 2 * self.span - 1).expand(shape)
            score = score + torch.gather(p2c, -1, index).transpose(-1, -2) / self.scale
        return score

    def forward(self, x: Tensor, bias: Tensor, rel: Tensor, rel_emb: Tensor) -> Tensor:
        a = self.attention.selfattn
        q = _heads(a.query_proj(x), self.heads)
        k = _heads(a.key_proj(x), self.heads)
        v = _heads(a.value_proj(x), self.heads)
        scores = torch.matmul(q, k.transpose(-1, -2) / self.scale)
        if self.relative:
            scores = scores + self._relative(q, k, rel, rel_emb)
        context = _merge(torch.matmul(torch.softmax(scores + bias, dim=-1), v))
        x = self.attention.output(context, x)
        return self.output(activate(self.intermediate.dense(x), self.act), x)


def _pos_att_type(c: FamilyConfig) -> list[str]:
    raw = c.raw.get("pos_att_type") or []
    types = [t.strip() for t in raw.lower().split("|")] if isinstance(raw, str) else list(raw)
    unknown = set(types) - {"c2p", "p2c"}
    if unknown:
        raise WeightError(f"DeBERTa pos_att_type {sorted(unknown)} is not supported")
    return types


def deberta_buckets(length: int, buckets: int, max_position: int, device: torch.device) -> Tensor:
    """DeBERTa's relative position of key j from query i (i - j), log-bucketed past buckets/2."""
    pos = torch.arange(length, dtype=torch.long, device=device)
    rel = pos[:, None] - pos[None, :]
    if buckets <= 0 or max_position <= 0:
        return rel
    mid = buckets // 2
    sign = torch.sign(rel)
    inner = (rel < mid) & (rel > -mid)
    abs_pos = torch.where(inner, torch.full_like(rel, mid - 1), torch.abs(rel))
    denom = torch.log(torch.tensor((max_position - 1) / mid, dtype=torch.float32))
    log_pos = torch.ceil(torch.log(abs_pos / mid) / denom * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, rel.to(log_pos.dtype), log_pos * sign).to(torch.long)


class _DebertaEncoder(nn.Module):
    def __init__(self, c: FamilyConfig, eps: float) -> None:
        super().__init__()
        self.relative = bool(c.raw.get("relative_attention", False))
        max_rel = int(c.raw.get("max_relative_positions", -1))
        self.max_relative = max_rel if max_rel >= 1 else c.max_positions
        self.buckets = int(c.raw.get("position_buckets", -1))
        span = self.buckets if self.buckets > 0 else self.max_relative
        layers = int(c.raw["num_hidden_layers"])
        self.layer = nn.ModuleList([_DebertaLayer(c, span, eps) for _ in range(layers)])
        self.rel_embeddings = nn.Embedding(span * 2, c.hidden_size) if self.relative else None
        norms = str(c.raw.get("norm_rel_ebd", "none")).lower().split("|")
        norm = self.relative and "layer_norm" in [n.strip() for n in norms]
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=eps) if norm else None


class DebertaBase(nn.Module):
    def __init__(self, c: FamilyConfig) -> None:
        super().__init__()
        eps = float(c.raw.get("layer_norm_eps", 1e-7))
        self.embeddings = _DebertaEmbeddings(c, eps)
        self.encoder = _DebertaEncoder(c, eps)

    def forward(self, input_ids: Tensor, mask: Tensor) -> Tensor:
        x = self.embeddings(input_ids, mask)
        enc = self.encoder
        rel = deberta_buckets(x.size(1), enc.buckets, enc.max_relative, x.device)
        rel_emb = torch.zeros(1, 1, dtype=x.dtype, device=x.device)
        if enc.rel_embeddings is not None:
            rel_emb = enc.rel_embeddings.weight
            if enc.LayerNorm is not None:
                rel_emb = enc.LayerNorm(rel_emb)
        bias = _key_bias(mask)
        for layer in enc.layer:
            x = layer(x, bias, rel, rel_emb)
        return x


class _DebertaPooler(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)


class DebertaHead(nn.Module):
    def __init__(self, c: FamilyConfig) -> None:
        super().__init__()
        size = int(c.raw.get("pooler_hidden_size", c.hidden_size))
        self.pooler = _DebertaPooler(size)
        self.classifier = nn.Linear(size, len(c.labels))
        self.act = c.act("pooler_hidden_act")

    def forward(self, states: Tensor, mask: Tensor) -> Tensor:
        return self.classifier(activate(self.pooler.dense(states[:, 0]), self.act))


# ---- ModernBERT ---------------------------------------------------------------------------------


def _norm(c: FamilyConfig) -> nn.LayerNorm:
    eps = float(c.raw.get("norm_eps", 1e-5))
    return nn.LayerNorm(c.hidden_size, eps=eps, bias=bool(c.raw.get("norm_bias", False)))


def _modernbert_layout(c: FamilyConfig) -> tuple[list[bool], float, float]:
    """Which layers attend locally, and the global and local rotary bases, from either form of
    config.json (transformers 5's layer_types and rope_parameters, or the original fields)."""
    n = int(c.raw["num_hidden_layers"])
    types = c.raw.get("layer_types")
    if types:
        local = [t == "sliding_attention" for t in types]
    else:
        every = int(c.raw.get("global_attn_every_n_layers", 3))
        local = [bool(i % every) for i in range(n)]
    rope = c.raw.get("rope_parameters") or {}
    full = float((rope.get("full_attention") or {}).get("rope_theta", 0)) or float(
        c.raw.get("global_rope_theta", 160000.0)
    )
    near = float((rope.get("sliding_attention") or {}).get("rope_theta", 0)) or float(
        c.raw.get("local_rope_theta", 10000.0)
    )
    for params in rope.values():
        if isinstance(params, dict) and params.get("rope_type", "default") != "default":
            raise WeightError(f"ModernBERT rope_type {params['rope_type']!r} is not supported")
    return local, full, near


class _ModernBertEmbeddings(nn.Module):
    def __init__(self, c: FamilyConfig) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.norm = _norm(c)


class _ModernBertAttention(nn.Module):
    def __init__(self, c: FamilyConfig) -> None:
        super().__init__()
        bias = bool(c.raw.get("attention_bias", False))
        self.Wqkv = nn.Linear(c.hidden_size, 3 * c.hidden_size, bias=bias)
        self.Wo = nn.Linear(c.hidden_size, c.hidden_size, bias=bias)


class _ModernBertMLP(nn.Module):
    def __init__(self, c: FamilyConfig) -> None:
        super().__init__()
        bias, i = bool(c.raw.get("mlp_bias", False)), int(c.raw["intermediate_size"])
        self.Wi = nn.Linear(c.hidden_size, 2 * i, bias=bias)
        self.Wo = nn.Linear(i, c.hidden_size, bias=bias)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.size(-1) // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + turned * sin


class _ModernBertLayer(nn.Module):
    def __init__(self, c: FamilyConfig, index: int, local: bool) -> None:
        super().__init__()
        self.heads = int(c.raw["num_attention_heads"])
        self.head_dim = c.hidden_size // self.heads
        self.local = local
        self.act = c.act("hidden_activation")
        self.attn_norm = _norm(c) if index else None
        self.attn = _ModernBertAttention(c)
        self.mlp_norm = _norm(c)
        self.mlp = _ModernBertMLP(c)

    def forward(self, x: Tensor, bias: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        h = x if self.attn_norm is None else self.attn_norm(x)
        qkv = self.attn.Wqkv(h).view(x.size(0), x.size(1), 3, self.heads, self.head_dim)
        q, k, v = qkv.unbind(dim=2)
        q = _rotate(q.transpose(1, 2), cos, sin)
        k = _rotate(k.transpose(1, 2), cos, sin)
        scores = torch.matmul(q, k.transpose(-1, -2)) * (self.head_dim**-0.5) + bias
        context = _merge(torch.matmul(torch.softmax(scores, dim=-1), v.transpose(1, 2)))
        x = x + self.attn.Wo(context)
        gate_in, gate = self.mlp.Wi(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.mlp.Wo(activate(gate_in, self.act) * gate)


class ModernBertBase(nn.Module):
    def __init__(self, c: FamilyConfig) -> None:
        super().__init__()
        local, full_theta, local_theta = _modernbert_layout(c)
        self.head_dim = c.hidden_size // int(c.raw["num_attention_heads"])
        self.full_theta, self.local_theta = full_theta, local_theta
        self.window = int(c.raw.get("local_attention", 128)) // 2
        self.mask_value = MASK_VALUE
        self.embeddings = _ModernBertEmbeddings(c)
        self.layers = nn.ModuleList([_ModernBertLayer(c, i, loc) for i, loc in enumerate(local)])
        self.final_norm = _norm(c)

    def _angles(self, length: int, theta: float, device: torch.device) -> tuple[Tensor, Tensor]:
        """The rotary cos and sin [L, D] for positions 0..L-1, as transformers computes them."""
        steps = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device)
        freq = 1.0 / (theta ** (steps / self.head_dim))
        angles = torch.arange(length, device=device).float().unsqueeze(-1) * freq
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos(), angles.sin()

    def forward(self, input_ids: Tensor, mask: Tensor) -> Tensor:
        x = self.embeddings.norm(self.embeddings.tok_embeddings(input_ids))
        length = x.size(1)
        keep = (mask > 0).unsqueeze(1).unsqueeze(2)  # [B, 1, 1, L]
        pos = torch.arange(length, device=x.device)
        near = torch.abs(pos[:, None] - pos[None, :]) <= self.window  # the local window, [L, L]
        full_bias = (~keep).to(x.dtype) * self.mask_value
        local_bias = (~(keep & near)).to(x.dtype) * self.mask_value
        full_cos, full_sin = self._angles(length, self.full_theta, x.device)
        local_cos, local_sin = self._angles(length, self.local_theta, x.device)
        for layer in self.layers:
            if layer.local:
                x = layer(x, local_bias, local_cos, local_sin)
            else:
                x = layer(x, full_bias, full_cos, full_sin)
        return self.final_norm(x)


class _ModernBertPredictionHead(nn.Module):
    def __init__(self, c: FamilyConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(
            c.hidden_size, c.hidden_size, bias=bool(c.raw.get("classifier_bias", False))
        )
        self.norm = _norm(c)


class ModernBertHead(nn.Module):
    def __init__(self, c: FamilyConfig) -> None:
        super().__init__()
        self.head = _ModernBertPredictionHead(c)
        self.classifier = nn.Linear(c.hidden_size, len(c.labels))
        self.act = c.act("classifier_activation")
        self.mean = c.raw.get("classifier_pooling", "cls") == "mean"
        if c.raw.get("classifier_pooling", "cls") not in ("cls", "mean"):
            raise WeightError(f"ModernBERT classifier_pooling {c.raw['classifier_pooling']!r}")

    def forward(self, states: Tensor, mask: Tensor) -> Tensor:
        if self.mean:
            keep = (mask > 0).to(states.dtype).unsqueeze(-1)
            pooled = (states * keep).sum(dim=1) / keep.sum(dim=1)
        else:
            pooled = states[:, 0]
        h = self.head.norm(activate(self.head.dense(pooled), self.act))
        return self.classifier(h)


# ---- the models and their loading ---------------------------------------------------------------

_BASES: dict[str, type[nn.Module]] = {
    "deberta-v2": DebertaBase,
    "modernbert": ModernBertBase,
    "mpnet": MPNetBase,
}
_HEADS: dict[str, type[nn.Module]] = {
    "deberta-v2": DebertaHead,
    "modernbert": ModernBertHead,
    "mpnet": MPNetHead,
}


class FamilyClassifier(nn.Module):
    """The family's encoder, then its own head: logits [B, C]."""

    def __init__(self, c: FamilyConfig) -> None:
        super().__init__()
        self.base = _BASES[c.family](c)
        self.head = _HEADS[c.family](c)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.head(self.base(input_ids, attention_mask), attention_mask)


def _our_name(family: str, name: str, base_only: bool) -> str | None:
    """A checkpoint tensor's name in our module, or None for a tensor no forward pass uses."""
    prefix = _PREFIX[family]
    if name.startswith(prefix):
        bare, inside = name[len(prefix) :], True
    else:
        bare, inside = name, base_only
    if bare in _UNUSED and (inside or base_only):
        return None
    bare = bare.replace(".attention.self.", ".attention.selfattn.")
    return ("base." if inside else "head.") + bare


def load_family(module: nn.Module, family: str, tensors: dict[str, Tensor], where: Path) -> None:
    """Copy a checkpoint into `module` (a FamilyClassifier, or with base_only a base wrapped as
    `base`), refusing any missing, unexpected or misshapen tensor."""
    base_only = not hasattr(module, "head")
    ours = dict(module.named_parameters())
    mapped: dict[str, Tensor] = {}
    unexpected: list[str] = []
    for name, tensor in tensors.items():
        target = _our_name(family, name, base_only)
        if target is None:
            continue
        if target not in ours:
            unexpected.append(name)
            continue
        mapped[target] = tensor
    missing = sorted(set(ours) - set(mapped))
    if missing or unexpected:
        raise WeightError(f"{where}: missing tensors {missing}, unexpected {sorted(unexpected)}")
    with torch.no_grad():
        for name, tensor in mapped.items():
            if tensor.shape != ours[name].shape:
                raise WeightError(
                    f"{where}: {name} has shape {list(tensor.shape)}, "
                    f"expected {list(ours[name].shape)} from config.json"
                )
            ours[name].copy_(tensor.to(torch.float32))


def build_classifier(model_dir: Path, config: FamilyConfig) -> FamilyClassifier:
    from ringserve.factory.hf import read_weights

    model = FamilyClassifier(config)
    where, tensors = read_weights(model_dir)
    load_family(model, config.family, tensors, where)
    return model.eval()


def new_base(config: FamilyConfig) -> nn.Module:
    return _BASES[config.family](config)
