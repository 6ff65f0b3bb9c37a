"""One declaration per HTTP route: an `Endpoint` holds its method, path, handler, request body,
answers (status, schema, headers) and the 400s a schema-valid request can still get. Each
module declares its routes in a list beside its handlers; the router mounts that list
(routes.Router.mount) and the OpenAPI document is written from the same list
(protocols/openapi.py), so neither can name a route the other lacks.

A schema is written by name where a Struct gives it (`"classify"`: the body Struct of that
name in schemas/server.py's Bodies, or the answer of that name in openapi_schemas.py's table),
or as a function of a `Lookup` where the document composes them; both are read when the
document is made, from the running server's model and limits (`Facts`).

A check beyond the schema raises a `Rule`'s message; the document lists the same Rule's
pattern under `x-ringserve-400-beyond-schema`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ringserve.service.protocols.http import Exchange, HttpProtocol
from ringserve.service.request.errors import Rules

Handler = Callable[[HttpProtocol, Exchange, dict[str, str]], None]
Schema = dict[str, Any]


@dataclass(frozen=True)
class Facts:
    """What the schemas read of the running server: its model and its limits."""

    model: str
    labels: list[str]
    tasks: list[str]
    dimension: int
    max_texts: int
    max_documents: int
    max_body: int
    version: str  # the model's one KServe version
    server_version: str
    key: bool  # --api-key is set: every route but the probes needs it
    models: tuple[str, ...] = ()  # every loaded model's name (empty: `model` alone)
    activation: str = "softmax"  # the model's: softmax or sigmoid

    @property
    def embeds(self) -> bool:
        return "embed" in self.tasks

    @property
    def names(self) -> list[str]:
        return list(self.models) or [self.model]


class Lookup(Protocol):
    """What a declaration's schema function reads when the document is made."""

    facts: Facts

    def body(self, name: str) -> Schema: ...

    def answer(self, name: str) -> Schema: ...


# A schema: a Struct's name, a function of the document's lookup, or None (no JSON body).
SchemaOf = str | Callable[[Lookup], Schema] | None


@dataclass(frozen=True)
class Answer:
    """One status of one route: its body's schema (None: not JSON), media type and headers."""

    description: str
    schema: SchemaOf = None
    media: str = "application/json"
    headers: tuple[str, ...] = ()  # names in openapi.HEADERS, always sent (NAME? when sometimes)
    binary: bool = False  # may also come as application/octet-stream (KServe binary outputs)


@dataclass(frozen=True)
class Endpoint:
    """One method on one path: what serves it, what it takes and what it answers."""

    method: str
    path: str
    handler: Callable[[Any], Handler]  # made from the mount's context (the router's server)
    summary: str
    tag: str
    answers: dict[int, Answer]
    body: SchemaOf = None  # the JSON request body; None: no body is read
    inference: bool = False  # admitted for a worker: deadlines, 503 and 504, x-latency-ms
    model_path: bool = False  # has {model} (and maybe {version}): 404 for another
    model_body: bool = False  # "model" and "version" in its body: 404 another, 400 none of many
    repository_path: bool = False  # {model} is any name: the repository's, loaded or not
    body_optional: bool = False  # an empty body is taken as {} (tritonclient sends none)
    needs: tuple[str, ...] = ()  # the model tasks it serves: a 400 for a model with none
    rules: Rules = ()  # the 400s the schema cannot rule out
    more_rules: Callable[[Facts], Rules] | None = None  # those that depend on the model
    description: str = ""
    examples: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return self.method, self.path


LATENCY = ("x-latency-ms",)
ERROR_BODY = "error"  # an error answer's schema: the document writes the family's shape
TOO_LONG_BODY = "error_too_long"  # the same, with a too-long text's counts


def ok(
    description: str,
    schema: SchemaOf,
    media: str = "application/json",
    *headers: str,
    binary: bool = False,
) -> dict[int, Answer]:
    return {200: Answer(description, schema, media, headers, binary)}


def error(description: str, *headers: str) -> Answer:
    """An error answer: the route family's error body (openapi.py writes each family's)."""
    return Answer(description, ERROR_BODY, headers=headers)
