"""A KServe infer, read: the `Infer` Struct (kserve/bodies.py: HTTP's decoded header, or the
one gRPC builds from its protobuf message) and the binary tensor data after it, to the job
admission takes. Every check is here, so HTTP and gRPC refuse the same things with the same
words; each transport keeps only what its framing adds (HTTP's Content-Encoding and header
length, gRPC's typed and raw contents).

Inputs: `text` (BYTES, shape [N] or [N, 1]) and the optional `text_pair` (as many texts, for
models that classify a pair), each given as data, as `binary_data_size` bytes of the tensor data
(in input order), or in a registered shared-memory region (kserve/regions.py). Outputs: any of
the model's (kserve/documents.py), those named, or all when none is: one forward pass answers
them all. A call's N texts are one dispatcher group: one admission, one callback, one answer.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from msgspec import UNSET
from ringserve.service.engine.requests import Ask, Options
from ringserve.service.kserve import multivector, tokens
from ringserve.service.kserve.bodies import Infer, InferInput, InferParameters
from ringserve.service.kserve.documents import EMBEDDING, OUTPUTS
from ringserve.service.kserve.regions import REGIONS, Placement, placement
from ringserve.service.models.info import ModelInfo
from ringserve.service.request import prompts, sparse_terms
from ringserve.service.request.errors import RequestError
from ringserve.service.request.options import as_integer, asked_priority
from ringserve.service.request.texts import require
from ringserve.service.views import FrontView
from ringserve.shm import layout as L

U32 = struct.Struct("<I")  # a BYTES element's length, before its bytes
INPUTS = ("text", "text_pair")
NO_PARAMETERS = InferParameters()  # what a call without parameters reads as
# A model's outputs: (embeds, embed_only, multivector, sparse, token classifier)
Kinds = tuple[bool, bool, bool, bool, bool]
PLAIN: Kinds = (False, False, False, False, False)  # a classifier's
# The outputs of an ask whose outputs have no parameters, by (names, binary default, kinds):
# the same for every call that asks alike, so each is read once and kept (bounded).
PLAIN_OUTPUTS: dict[tuple[tuple[str, ...], bool, Kinds], list[tuple[str, bool]]] = {}
PLAIN_KEPT = 256


@dataclass(slots=True)
class InferJob:
    """One infer, read: the core request for admission, and how to answer it."""

    info: ModelInfo  # the model it names, as found when it arrived
    ask: Ask  # what every protocol hands admission (service/engine/requests.py)
    wanted: list[tuple[str, bool]]  # (output, binary), in the order asked for
    request_id: str | None
    places: dict[str, Placement]  # outputs written to system shared memory


def read_job(
    server: FrontView,
    info: ModelInfo,
    header: Infer,
    blob: memoryview,
    deadline_of: Callable[[int | None], int],
    protocol: str,
) -> InferJob:
    """The job of an infer to `info`: its texts, outputs, priority and deadline (`deadline_of`
    Triton's `timeout` parameter in microseconds, None when unset; 0: admission's default)."""
    texts = read_texts(server, header, blob)
    wanted = read_outputs(header, kinds_of(info.manifest))
    params = header.parameters or NO_PARAMETERS
    level = params.priority  # a level is an integer, read as a float by its Struct
    priority = asked_priority(int(level) if isinstance(level, float) else level, "priority")
    timeout = params.timeout
    deadline = deadline_of(None if timeout is None else int(timeout))
    ask = request_ask(texts, params, wanted, info, deadline, priority, protocol)
    return InferJob(info, ask, wanted, header.id, output_places(header))


def kinds_of(m: Any) -> Kinds:
    """What decides a manifest's outputs (Kinds)."""
    return m.embeds, m.embed_only, bool(m.multivector), "sparse" in m.task, m.token_classifies


# -- inputs ---------------------------------------------------------------------------------------
def as_size(value: Any, where: str) -> int:
    size = as_integer(value)
    if size is None or size < 0:
        raise RequestError(400, f"{where} must be a non-negative integer")
    return size


def check_shape(shape: Any) -> int:
    """The number of texts that `shape` ([N] or [N, 1]) holds."""
    if not isinstance(shape, list) or not 1 <= len(shape) <= 2:
        raise RequestError(400, "input text must have shape [N] or [N, 1]")
    dims = [as_size(d, "input text shape") for d in shape]
    if len(dims) == 2 and dims[1] != 1:
        raise RequestError(400, f"input text must have shape [N] or [N, 1], got {dims}")
    return dims[0]


def bytes_elements(blob: memoryview) -> list[bytes]:
    """BYTES tensor data: each element a u32 little-endian length, then its bytes."""
    out: list[bytes] = []
    pos, end = 0, len(blob)
    while pos < end:
        if end - pos < 4:
            raise RequestError(400, "BYTES tensor data ends inside an element's length")
        (n,) = U32.unpack_from(blob, pos)
        pos += 4
        if n > end - pos:
            raise RequestError(400, "BYTES tensor element runs past its binary data")
        out.append(blob[pos : pos + n].tobytes())
        pos += n
    return out


def json_elements(data: list[Any]) -> list[Any]:
    """Row-major data, flat or nested one level ([N, 1] written as [["a"], ["b"]])."""
    rows = sum(isinstance(d, list) for d in data)
    if rows and rows != len(data):
        raise RequestError(400, "input data mixes rows and texts")
    if rows:
        return [x for row in data for x in row]
    return data


def read_input(spec: InferInput, blob: memoryview, pos: int) -> tuple[list[bytes], int]:
    """One BYTES input's texts, and where the next input's binary data starts."""
    name = spec.name
    if spec.datatype != "BYTES":
        raise RequestError(400, f"input {name} must have datatype BYTES, not {spec.datatype!r}")
    n = check_shape(spec.shape)
    params = spec.parameters
    size = UNSET if params is None else params.binary_data_size
    where = placement(params, f"input {name}")
    if where is not None:
        if spec.data is not UNSET or size is not UNSET:
            raise RequestError(400, f"input {name} has shared memory and data both")
        texts = shm_texts(name, where)
    elif size is not UNSET:
        size = as_size(size, "binary_data_size")
        if size > len(blob) - pos:
            raise RequestError(400, f"binary_data_size {size} but {len(blob) - pos} bytes left")
        part = blob[pos : pos + size]
        texts = [require(t, f"{name}[{i}]") for i, t in enumerate(bytes_elements(part))]
        pos += size
    elif spec.data is not UNSET:
        items = json_elements(spec.data)
        texts = [require(t, f"{name}[{i}]") for i, t in enumerate(items)]
    else:
        raise RequestError(400, f"input {name} has neither data nor binary_data_size")
    if len(texts) != n:
        raise RequestError(400, f"input {name} has shape {spec.shape} but {len(texts)} elements")
    return texts, pos


def shm_texts(name: str, where: Placement) -> list[bytes]:
    """A BYTES input's texts from a registered shared-memory region (kserve/regions.py)."""
    items = bytes_elements(memoryview(REGIONS.read(where)))
    return [require(t, f"{name}[{i}]") for i, t in enumerate(items)]


def read_texts(server: FrontView, header: Infer, blob: memoryview) -> list[bytes]:
    """The request's texts; with the optional input `text_pair`, each text joined to its pair."""
    check_input_names([spec.name for spec in header.inputs])
    found: dict[str, list[bytes]] = {}
    pos = 0
    for spec in header.inputs:
        found[spec.name], pos = read_input(spec, blob, pos)
    if pos != len(blob):
        raise RequestError(400, "binary data given, but no input names it (binary_data_size)")
    return join_pairs(server, found)


def check_input_names(names: list[Any]) -> None:
    """`text`, and maybe `text_pair`, each once."""
    if not 1 <= len(names) <= 2:
        raise RequestError(400, 'inputs must be a list of one input, "text", and maybe "text_pair"')
    for name in names:
        if name not in INPUTS:
            raise RequestError(400, f'unknown input {name!r}: the model takes "text", "text_pair"')
    if "text" not in names or len(set(names)) != len(names):
        raise RequestError(400, 'inputs must be a list of one input, "text", and maybe "text_pair"')


def join_pairs(server: FrontView, found: dict[str, list[bytes]]) -> list[bytes]:
    """The payloads of checked inputs: each text, joined to its pair when `text_pair` is given."""
    texts = found["text"]
    if not 1 <= len(texts) <= server.settings.max_texts:
        raise RequestError(400, f"input text must hold 1 to {server.settings.max_texts} texts")
    pairs = found.get("text_pair")
    if pairs is None:
        return texts
    if len(pairs) != len(texts):
        raise RequestError(400, f"input text_pair has {len(pairs)} texts, text has {len(texts)}")
    return [t + L.PAIR_SEPARATOR + p for t, p in zip(texts, pairs, strict=True)]


# -- outputs --------------------------------------------------------------------------------------
def known_outputs(kinds: Kinds) -> tuple[str, ...]:
    """The outputs a model of these kinds gives, in metadata's order (Triton's rule for an ask
    that names none): `scores`, `label`, then `embedding` for a model that has it; a multivector
    model's `scores` alone; a sparse one's terms; a token classifier's per-token outputs."""
    embeds, embed_only, multi, sparse, token_classifies = kinds
    if token_classifies:
        return tokens.OUTPUTS
    if sparse:
        return sparse_terms.OUTPUTS
    if multi:
        return OUTPUTS[:1]
    return (EMBEDDING,) if embed_only else (*OUTPUTS, EMBEDDING) if embeds else OUTPUTS


def read_outputs(header: Infer, kinds: Kinds = PLAIN) -> list[tuple[str, bool]]:
    """(name, binary) for each output to answer, in the order asked for: any of the model's
    outputs (known_outputs), all of them when none is named; one forward pass answers them all.
    An output without parameters takes the request's `binary_data_output`."""
    params = header.parameters
    default = params.binary_data_output if params is not None else False
    asked = header.outputs
    known = known_outputs(kinds)
    if not asked:
        return [(name, default) for name in known]
    names = []
    for spec in asked:  # a loop, not a generator: read for every request
        if spec.parameters is not None:
            return checked_outputs(header, known, default)
        names.append(spec.name)
    key = (tuple(names), default, kinds)  # the usual ask: read once, then kept
    found = PLAIN_OUTPUTS.get(key)
    if found is None:
        found = checked_outputs(header, known, default)
        if len(PLAIN_OUTPUTS) >= PLAIN_KEPT:
            PLAIN_OUTPUTS.clear()
        PLAIN_OUTPUTS[key] = found
    return list(found)


def checked_outputs(header: Infer, known: tuple[str, ...], default: bool) -> list[tuple[str, bool]]:
    wanted: list[tuple[str, bool]] = []
    for spec in header.outputs or ():
        if spec.name not in known:
            raise RequestError(
                400, f"unknown output {spec.name!r}: the model gives {', '.join(known)}"
            )
        if any(spec.name == w for w, _ in wanted):
            raise RequestError(400, f"output {spec.name!r} asked for twice")
        out = spec.parameters
        if out is None:  # the usual output: no place, the default encoding
            wanted.append((spec.name, default))
            continue
        if out.classification is not None:
            raise RequestError(400, "classification outputs are not supported")
        placement(out, f"output {spec.name}")  # checked here, used by output_places
        binary = default if out.binary_data is UNSET else out.binary_data
        if not isinstance(binary, bool):
            raise RequestError(400, "output parameters.binary_data must be true or false")
        wanted.append((spec.name, binary))
    return wanted


def output_places(header: Infer) -> dict[str, Placement]:
    """The outputs a request (checked by read_outputs) has written into shared memory."""
    found: dict[str, Placement] = {}
    for spec in header.outputs or ():
        if spec.parameters is not None:  # no parameters: no place
            where = placement(spec.parameters, spec.name)
            if where is not None:
                found[spec.name] = where
    return found


# -- the ask --------------------------------------------------------------------------------------
def passes(wanted: list[tuple[str, bool]]) -> tuple[bool, bool]:
    """(classify, embed): which answers the outputs asked for need. Both: one pass answers
    each text's scores and vector (OPT_BOTH), unless a prompt makes the two inputs differ."""
    classify = embed = False
    for name, _ in wanted:  # a loop, not sets: called a few times for every request
        if name == EMBEDDING:
            embed = True
        else:
            classify = True
    return classify, embed


def request_ask(
    texts: list[bytes],
    params: InferParameters,
    wanted: list[tuple[str, bool]],
    info: ModelInfo,
    deadline: int,
    priority: int | None,
    protocol: str,
) -> Ask:
    """The core request of a KServe call: the payloads and their options byte (the request's
    long-text options), and the task they count under: the texts to classify; for output
    `embedding` alone, the texts with the ask for a vector (layout OPT_EMBED); for both, the
    texts once with the ask for both (OPT_BOTH: one forward pass), or, when the model's prompt
    goes before a text to embed, the texts to classify then the prompted texts with OPT_EMBED
    (two passes, one group). A token classifier's: kserve/tokens.py; a multivector model's:
    kserve/multivector.py."""
    if info.manifest.token_classifies:
        return tokens.kserve_ask(texts, params, info, deadline, priority, protocol)
    opts = params.options()
    if info.manifest.multivector:  # a rerank: each pair's MaxSim
        return multivector.kserve_ask(texts, opts, info, deadline, priority, protocol)
    model = info.index
    if "sparse" in info.manifest.task:  # one answer a text: its terms, whatever outputs are asked
        return Ask(texts, opts, "sparse", model, deadline, priority, protocol)
    classify, embed = passes(wanted)
    if not embed:
        return Ask(texts, opts, "classify", model, deadline, priority, protocol)
    # the worker answers each text's vector, the prompt before it (request/prompts.py)
    vectors = prompts.with_prompt(info.manifest, params.prompt_name, texts)
    if not classify:
        return Ask(vectors, opts | L.OPT_EMBED, "embed", model, deadline, priority, protocol)
    if vectors is texts:  # no prompt: the forward pass that scores a text also embeds it
        return Ask(texts, opts | L.OPT_BOTH, "classify", model, deadline, priority, protocol)
    both = [opts] * len(texts) + [opts | L.OPT_EMBED] * len(vectors)
    return Ask(texts + vectors, both, "classify", model, deadline, priority, protocol)


def one_pass(options: Options) -> bool:
    """Whether request_ask asked for each text's scores and vector in one answer."""
    return isinstance(options, int) and bool(options & L.OPT_BOTH)
