"""Each HTTP request body, declared once as a msgspec Struct: `decode` turns a body into its
Struct, checking every type and limit in one C pass, and its 400 names the field's path
(`- at $.texts[3]`); `components` gives the same Structs as the JSON Schemas that
/openapi.json serves (service/protocols/openapi.py).

The Structs of one API family live in a module of this package (v1, tasks, ...). A limit that
is the server's (--max-texts, --max-documents) is set at start: `narrowed` gives a Struct the
same name and fields, with those fields' types replaced, so the document states the running
server's limits. What a schema cannot say (a list as long as another, a model's own
dimension) stays a short check after decoding, listed per route in the document's
`x-ringserve-400-beyond-schema`.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType
from ringserve.service.protocols.http import Exchange
from ringserve.service.request.errors import RequestError
from ringserve.service.request.fields import (
    NOT_BLANK,
    Count,
    Positive,
    S,
    Text,
    Truncation,
    convert,
    message,
)

__all__ = [
    "NOT_BLANK", "UNSET", "Count", "Positive", "S", "Struct", "Text", "Truncation", "UnsetType",
    "convert", "message",
]  # fmt: skip


Texts = Annotated[list[Text], Meta(min_length=1)]  # narrowed to --max-texts at start
TokenIds = Annotated[list[Count], Meta(min_length=1)]
NonNegative = Annotated[int, Meta(ge=0)]  # an answer's count or index (msgspec writes an int)


ModelName = Annotated[str, Meta(description="a loaded model's name (else 404)")]
ModelVersion = Annotated[str | int, Meta(description="the model's version (else 404)")]


class Named(Struct, kw_only=True):
    """A body's optional `model` and `version` (request/lookup.py request_model): null is as if left
    out."""

    model: ModelName | None = None
    version: ModelVersion | None = None


class LongText(Truncation, kw_only=True):
    """A body with texts to serve: Truncation's fields and Named's (a Struct has one base)."""

    model: ModelName | None = None
    version: ModelVersion | None = None


def decode(ex: Exchange, kind: type[S]) -> S:
    """The request's body as `kind`, or a 400 that says what is wrong and where."""
    return decode_bytes(b"".join(ex.body), kind)


def decode_bytes(body: bytes | memoryview, kind: type[S], subject: str = "body") -> S:
    """`body` (JSON) as `kind`; `subject` names it in the 400 (KServe's "inference header")."""
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise RequestError(400, message(str(exc), subject)) from None
    except msgspec.DecodeError:
        try:
            bytes(body).decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError(400, f"{subject} is not valid UTF-8") from None
        where = "" if subject == "body" else f" in the {subject}"
        raise RequestError(400, f"malformed JSON{where}") from None


def narrowed(kind: type[S], **types: Any) -> type[S]:
    """`kind` with these fields' types replaced (a limit of this server's), under the same
    name; its instances are `kind`'s."""
    fields = []
    for f in msgspec.structs.fields(kind):  # type: ignore[arg-type]
        t = types.get(f.name, f.type)
        fields.append((f.name, t) if f.required else (f.name, t, f.default))
    made = msgspec.defstruct(kind.__name__, fields, bases=(kind,), kw_only=True)
    return made  # type: ignore[return-value]


def texts_of(limit: int) -> Any:
    """1 to `limit` texts."""
    return Annotated[list[Text], Meta(min_length=1, max_length=limit)]


REF = "#/components/schemas/{name}"


def components(kinds: list[Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The JSON Schema of each of `kinds` (a $ref into the document's components) and the
    components, as OpenAPI 3.1 takes them."""
    refs, defs = msgspec.json.schema_components(kinds, ref_template=REF)
    return list(refs), dict(defs)
