"""Compact vectors: an embedding answered as int8, uint8, binary or ubinary (Cohere's
`embedding_types`; `encoding_format` on /v1/embeddings and /embed), cut from the float32 vector
the model serves, in the front-end, exactly as sentence-transformers' `quantize_embeddings` cuts
it. int8 and uint8 take each dimension's range from the calibration stored in the artifact at
build (factory/compact.py), never from the request's own batch, so a vector's bytes do not
depend on what it was sent with; binary is the sign bit, packed as numpy's packbits (ubinary),
and binary that minus 128 as int8."""

from __future__ import annotations

from typing import Any

import numpy as np
from ringserve.service.models.info import ModelInfo
from ringserve.service.request.errors import RequestError, Rule

CALIBRATED = ("int8", "uint8")  # need the artifact's calibration
COMPACT = (*CALIBRATED, "binary", "ubinary")
# What `check` refuses int8 and uint8 for: an artifact without their calibration, or vectors
# other than those calibrated (tasks.COMPACT_RULES lists them for the document)
NO_CALIBRATION = Rule(
    "{kind} is not served by model {model}: its artifact has no calibration (build it again "
    "with this version's `ringserve export`); binary and ubinary need none"
)
WHOLE_VECTORS = Rule(
    "{kind} ranges are calibrated on the model's whole vectors: ask without dimensions "
    "(output_dimension), or for binary or ubinary"
)
OWN_VECTORS = Rule("{kind} ranges are calibrated on the model's own vectors: normalize {normalize}")
_RANGES: dict[str, np.ndarray] = {}  # fingerprint -> [2, D] float32, read once a manifest


def calibration(info: ModelInfo) -> np.ndarray | None:
    """The model's [2, D] ranges (each dimension's minimum, then maximum), or None for an
    artifact built before they were stored (ARTIFACT_FORMAT 7)."""
    fingerprint = info.manifest.fingerprint
    found = _RANGES.get(fingerprint)
    if found is None:
        stored = info.manifest.extra.get("compact", {}).get("calibration")
        if not isinstance(stored, dict):
            return None
        found = np.array([stored["min"], stored["max"]], dtype=np.float32)
        _RANGES[fingerprint] = found
    return found


def check(info: ModelInfo, kinds: list[str], cut: bool, normalize: bool | None = None) -> Any:
    """The ranges int8/uint8 need, when `kinds` asks for them; a 400 when the model has none, or
    when the vectors asked for are not those the ranges were measured on (`cut`: fewer
    dimensions, renormalized; `normalize`: TEI's, when it is not the model's own)."""
    asked = [k for k in kinds if k in CALIBRATED]
    if not asked:
        return None
    ranges = calibration(info)
    if ranges is None:
        raise RequestError(400, NO_CALIBRATION.say(kind=asked[0], model=info.name))
    if cut:
        raise RequestError(400, WHOLE_VECTORS.say(kind=asked[0]))
    own = info.manifest.normalize
    if normalize is not None and normalize != own:
        said = "true" if own else "false"
        raise RequestError(400, OWN_VECTORS.say(kind=asked[0], normalize=said))
    return ranges


def quantize(vectors: np.ndarray, kind: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """float32 vectors [N, D] as `kind`: int8 or uint8 [N, D] by the ranges, ubinary uint8
    [N, ceil(D / 8)] (the sign bits packed, first dimension in the high bit), binary int8
    (ubinary - 128)."""
    if kind in CALIBRATED:
        assert ranges is not None
        starts = ranges[0]
        steps = (ranges[1] - starts) / 255
        steps = np.where(steps == 0, 1, steps)
        buckets = np.clip(np.floor((vectors - starts) / steps), 0, 255)
        return buckets.astype(np.uint8) if kind == "uint8" else (buckets - 128).astype(np.int8)
    packed = np.packbits(vectors > 0, axis=-1)
    return packed if kind == "ubinary" else (packed.astype(np.int16) - 128).astype(np.int8)


def width(kind: str, dimension: int) -> int:
    """The length of one vector of `kind` for a model of `dimension`."""
    return (dimension + 7) // 8 if kind in ("binary", "ubinary") else dimension


def as_lists(vectors: np.ndarray, kind: str, ranges: np.ndarray | None) -> Any:
    """The vectors of `kind` as JSON-ready lists of ints."""
    return quantize(vectors, kind, ranges).tolist()
