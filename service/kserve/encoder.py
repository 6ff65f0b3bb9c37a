"""A KServe infer's answer, before any transport writes it: each output asked for as a tensor
(its head, and its data as JSON values or raw bytes, or written to the client's shared memory),
and the long-text parameters. protocols/kserve.py writes them as JSON (and the binary tensor
extension), protocols/rpc/infer.py as a ModelInferResponse."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from ringserve.service.engine.requests import Result
from ringserve.service.kserve import multivector, tokens
from ringserve.service.kserve.documents import EMBEDDING
from ringserve.service.kserve.reading import U32, InferJob, one_pass, passes
from ringserve.service.kserve.regions import REGIONS, Placement
from ringserve.service.request import sparse_terms
from ringserve.service.request.vectors import vectors
from ringserve.shm import layout as L


def first_pass(
    results: list[Result], wanted: list[tuple[str, bool]], joined: bool = False
) -> list[Result]:
    """One result a text (a group of two passes has two)."""
    scored, embedded = split_results(results, wanted, joined)
    return scored or embedded


def split_results(
    results: list[Result], wanted: list[tuple[str, bool]], joined: bool = False
) -> tuple[list[Result], list[Result]]:
    """(scores' results, vectors' results) of a group made by request_ask. One pass's answers
    (`joined`, OPT_BOTH: each holds C scores, then the vector) are both, read in place: the
    scores and the vectors are cut from them where they are written (OutputEncoder.tensor)."""
    classify, embed = passes(wanted)
    if classify and embed:
        if joined:
            return results, results
        n = len(results) // 2
        return results[:n], results[n:]
    return (results, []) if classify else ([], results)


# -- infer: answer --------------------------------------------------------------------------------
class OutputEncoder:
    """Turns one group's results into the outputs asked for; label encodings made once."""

    def __init__(self, labels: list[str], normalize: bool = False) -> None:
        self.labels = labels
        self.normalize = normalize  # embeddings: as the model's own pipeline does
        encoded = [label.encode() for label in labels]
        self.label_blobs = [U32.pack(len(b)) + b for b in encoded]

    def tensors(
        self,
        results: list[Result],
        wanted: list[tuple[str, bool]],
        places: dict[str, Placement] | None = None,
        joined: bool = False,
    ) -> tuple[list[dict[str, Any]], list[bytes]]:
        """The outputs' tensors (JSON data, or binary with its bytes in the blobs, in order);
        an output with a place in `places` is written there, answered without data. `joined`:
        one pass's answers, each its C scores then its vector (split_results)."""
        scored, embedded = split_results(results, wanted, joined)
        tensors: list[dict[str, Any]] = []
        blobs: list[bytes] = []
        for name, binary in wanted:
            where = places.get(name) if places else None
            part = embedded if name == EMBEDDING else scored
            tensor, data = self.tensor(name, part, binary or where is not None, joined)
            if where is not None:  # the raw bytes, as the binary extension has them; the
                REGIONS.write(where, data)  # tensor says no more (as Triton's: clients read
                # parameters as the binary extension's)
            elif binary:
                tensor["parameters"] = {"binary_data_size": len(data)}
                blobs.append(data)
            else:
                tensor["data"] = data
            tensors.append(tensor)
        return tensors, blobs

    def tensor(
        self, name: str, results: list[Result], binary: bool, joined: bool = False
    ) -> tuple[dict[str, Any], Any]:
        """One output: its tensor's head, and its data (raw bytes when `binary`). `joined`: each
        answer holds C scores then the vector, cut here (the scores' columns or the rest)."""
        n, c = len(results), len(self.labels)
        if name in sparse_terms.OUTPUTS:
            return sparse_terms.kserve_tensor(name, results, binary)
        if name == EMBEDDING:
            vecs = vectors(results, self.normalize, skip=c if joined else 0)
            head = {"name": name, "datatype": "FP32", "shape": list(vecs.shape)}
            return head, vecs.tobytes() if binary else vecs.ravel().tolist()
        if name == "scores":
            head = {"name": name, "datatype": "FP32", "shape": [n, c]}
            rows = [r.scores[:c] if joined else r.scores for r in results]  # type: ignore[index]
            # one text's row as a [1, C] view: np.stack's own checks cost more than the copy
            stacked = np.asarray(rows[0])[None] if n == 1 else np.stack(rows)  # type: ignore[arg-type]
            scores = stacked.astype("<f4", copy=False)
            return head, scores.tobytes() if binary else scores.ravel().tolist()
        head = {"name": name, "datatype": "BYTES", "shape": [n]}
        if binary:
            return head, b"".join([self.label_blobs[r.label_id] for r in results])
        return head, [self.labels[r.label_id] for r in results]


_encoders: dict[tuple[str, ...], OutputEncoder] = {}


def encoder_for(labels: list[str], normalize: bool = False) -> OutputEncoder:
    key = (*labels, str(normalize))
    encoder = _encoders.get(key)
    if encoder is None:
        if len(_encoders) >= L.MAX_MODELS:  # bounded: reloads with new labels come and go
            _encoders.clear()
        encoder = _encoders[key] = OutputEncoder(labels, normalize)
    return encoder


def long_text_parameters(results: list[Result]) -> dict[str, Any]:
    """Response parameters when a text was cut or windowed. KServe parameters are scalars, so
    the per-text counts are comma lists, one entry a text in input order."""
    params: dict[str, Any] = {
        "truncated": any(r.flags & L.RSP_TRUNCATED for r in results),
        "tokens": ",".join(str(r.tokens) for r in results),
    }
    if any(r.flags & L.RSP_WINDOWED for r in results):
        params["windows"] = ",".join(str(r.windows) for r in results)
    return params


@dataclass(slots=True)
class Outputs:
    """An answer's outputs: their tensors (as OutputEncoder.tensors gives them), the raw bytes
    of the binary ones in order, and the long-text parameters (None: no text was cut)."""

    tensors: list[dict[str, Any]]
    blobs: list[bytes]
    parameters: dict[str, Any] | None


def outputs(job: InferJob, results: list[Result]) -> Outputs:
    """A job's answer from its group's results (a multivector model's: each pair's MaxSim as
    its one score)."""
    info = job.info
    m = info.manifest
    encoder: Any
    if m.token_classifies:
        encoder = tokens.encoder(info)
    elif m.multivector:
        encoder = encoder_for(multivector.KSERVE_LABELS, m.normalize)
        results = multivector.kserve_results(results)
    else:
        encoder = encoder_for(info.labels, m.normalize)
    joined = one_pass(job.ask.options)
    tensors, blobs = encoder.tensors(results, job.wanted, job.places, joined)
    texts = first_pass(results, job.wanted, joined)
    parameters = long_text_parameters(texts) if any(r.flags for r in texts) else None
    return Outputs(tensors, blobs, parameters)
