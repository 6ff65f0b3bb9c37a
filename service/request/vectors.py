"""A group's embeddings from its answers, as every route that answers vectors reads them
(/v1 and OpenAI's embeddings, TEI's and Cohere's, KServe's `embedding` output)."""

from __future__ import annotations

import numpy as np
from ringserve.service.engine.requests import Result


def vectors(results: list[Result], normalize: bool, keep: int = 0, skip: int = 0) -> np.ndarray:
    """The answers' embeddings [N, D] (or their first `keep` components), normalized when asked,
    in float64 until the end so that a cut vector's norm is 1 to float32 precision. `skip`:
    the floats before each vector (a one-pass KServe answer's C scores)."""
    out = np.stack([np.asarray(r.scores[skip:], dtype=np.float64) for r in results])  # type: ignore[index]
    if keep:
        out = out[:, :keep]
    if normalize:
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return out.astype(np.float32)
