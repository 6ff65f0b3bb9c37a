"""The JSON Schemas the OpenAPI document reads: each request body's and each answer's, made from
their msgspec Structs (service/protocols/schemas) narrowed to the running server's model and
limits, the error bodies of each route family (errors.py), and the components they refer to.

A route's declaration (protocols/endpoint.py) names its schemas; `Schemas` resolves those names
for one set of facts. An answer is added to the table in `_answers`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from ringserve.service.kserve import tokens as kserve_tokens
from ringserve.service.kserve.documents import VERSION
from ringserve.service.protocols import errors, schemas
from ringserve.service.protocols.endpoint import ERROR_BODY, TOO_LONG_BODY, Facts, Schema, SchemaOf
from ringserve.service.protocols.schemas import cohere as cohere_structs
from ringserve.service.protocols.schemas import kserve as kserve_structs
from ringserve.service.protocols.schemas import multivector as multivector_schemas
from ringserve.service.protocols.schemas import operator as operator_structs
from ringserve.service.protocols.schemas import server as server_bodies
from ringserve.service.protocols.schemas import sparse as sparse_structs
from ringserve.service.protocols.schemas import tasks as task_schemas
from ringserve.service.protocols.schemas import tei as tei_structs
from ringserve.service.protocols.schemas import tokens as token_structs
from ringserve.service.protocols.schemas import v1 as v1_schemas
from ringserve.service.request import sparse_terms
from ringserve.service.request import tokens as request_tokens

# Each family's error body, and with a too-long text's counts: errors.py's Structs.
_ERROR_KINDS = [kind for pair in errors.BODIES.values() for kind in pair]
_ERROR_REFS, ERROR_COMPONENTS = schemas.components(_ERROR_KINDS)
ERROR_SCHEMAS = {
    (name, counted): _ERROR_REFS[2 * i + counted]
    for i, name in enumerate(errors.BODIES)
    for counted in (False, True)
}


def error_schema(family: str, too_long: bool) -> Schema:
    """The error body of a family of routes (errors.error_doc), with a too-long text's counts."""
    return ERROR_SCHEMAS[family, too_long]


class Schemas:
    """The schemas of one set of facts, by the names the declarations give them."""

    def __init__(self, facts: Facts) -> None:
        self.facts = facts

    def body(self, name: str) -> Schema:
        return generated(self.facts.max_texts, self.facts.max_documents)[0][name]

    def answer(self, name: str) -> Schema:
        return generated_answers(self.facts)[0][name]

    def of(self, spec: SchemaOf, family: str = "", request: bool = False) -> Schema | None:
        """A declaration's schema: a body's (`request`) or an answer's, an error in the
        route family's shape."""
        if spec is None:
            return None
        if callable(spec):
            return spec(self)
        if spec in (ERROR_BODY, TOO_LONG_BODY):
            return error_schema(family, spec == TOO_LONG_BODY)
        return self.body(spec) if request else self.answer(spec)


# -- the request bodies: generated from their Structs (service/protocols/schemas) --------------
@functools.lru_cache(maxsize=8)
def generated(max_texts: int, max_documents: int) -> tuple[dict[str, Schema], Schema]:
    """Each body Struct's schema (a $ref) by its name in schemas.server.Bodies, and the
    components they refer to."""
    kinds = server_bodies.bodies(max_texts, max_documents)
    names = [field.name for field in dataclasses.fields(kinds)]
    refs, defs = schemas.components([getattr(kinds, name) for name in names])
    return dict(zip(names, refs, strict=True)), defs


def generated_answers(f: Facts) -> tuple[dict[str, Schema], Schema]:
    """The answers' Structs, narrowed to the model's facts and the server's limits: each one's
    schema by name, and their components (made once a set of facts)."""
    key = (tuple(f.names), tuple(f.labels), tuple(f.tasks), f.dimension)
    return _answers(*key, f.max_texts, f.max_documents)


@functools.lru_cache(maxsize=8)
def _answers(
    names: tuple[str, ...],
    labels: tuple[str, ...],
    tasks: tuple[str, ...],
    dimension: int,
    max_texts: int,
    max_documents: int,
) -> tuple[dict[str, Schema], Schema]:
    one, batch = v1_schemas.answers(labels, max_texts)
    outputs = ("scores", "label", *(("embedding",) if "embed" in tasks else ()))
    ranks = task_schemas.rank_answers(max_documents)
    if "multivector" in tasks:  # KServe's scores alone (MaxSim); Cohere's scores unbounded
        outputs = ("scores",)
        ranks |= multivector_schemas.rank_answers(max_documents)
    outputs = sparse_terms.OUTPUTS if "sparse" in tasks else outputs
    if request_tokens.TASK in tasks:  # a token classifier's per-token outputs
        outputs = kserve_tokens.OUTPUTS
    kserve_answers = kserve_structs.answers(names, VERSION, outputs, max_texts)
    parts = [
        {"classify": one, "classify_batch": batch},
        v1_schemas.model_answers(names, list(labels), list(tasks), dimension),
        ranks,
        multivector_schemas.multi_answers(names, dimension, max_texts),
        tei_structs.answers(labels, max_texts),
        {"info": tei_structs.info_answer(names)},
        task_schemas.embed_answers(names, dimension, max_texts),
        {"cohere_embed": cohere_structs.embed_answer(dimension)},
        {f"kserve_{k}": v for k, v in kserve_answers.items()},
        operator_structs.health_answers(),
        sparse_structs.answers(max_texts),
    ]
    kinds: dict[str, Any] = {}
    for part in parts:
        if kinds.keys() & part.keys():  # one name, two answers: the second would win
            raise ValueError(f"answers named twice: {sorted(kinds.keys() & part.keys())}")
        kinds |= part
    refs, defs = schemas.components(list(kinds.values()))
    return dict(zip(kinds, refs, strict=True)), defs


def components(f: Facts) -> Schema:
    """Every Struct's schema that the document may refer to."""
    parts = [generated(f.max_texts, f.max_documents)[1], generated_answers(f)[1]]
    parts.append(token_structs.schemas(f.max_texts)[2])
    return merged([*parts, ERROR_COMPONENTS])


def merged(parts: list[Schema]) -> Schema:
    """Components from several calls of schemas.components in one: two different schemas of
    one name (two Structs of one name) are refused rather than one overwriting the other."""
    out: Schema = {}
    for part in parts:
        for name, schema in part.items():
            if out.setdefault(name, schema) != schema:
                raise ValueError(f"two different schemas are named {name}")
    return out


REF_PREFIX = "#/components/schemas/"


def referred(tree: Any, defs: Schema) -> Schema:
    """The components that `tree` refers to, and those they refer to: a port's document holds
    only the Structs of its own routes."""
    out: Schema = {}
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith(REF_PREFIX):
                name = ref[len(REF_PREFIX) :]
                if name not in out:
                    out[name] = defs[name]
                    todo.append(defs[name])
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return dict(sorted(out.items()))
