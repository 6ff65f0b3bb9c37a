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

import re
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType
from ringserve.service.protocols.http import Exchange
from ringserve.service.request.errors import RequestError
from ringserve.shm import layout as L

__all__ = ["UNSET", "Struct", "UnsetType"]

S = TypeVar("S")


def _not_blank() -> str:
    """A regex for "has a character that is not whitespace", whitespace as str.strip() counts
    it: spelled out, since a JSON Schema pattern's \\s (ECMA 262) counts otherwise (it has
    U+FEFF, and not U+001C to U+001F or U+0085). msgspec runs it with Python's re.search."""
    spaces = "".join(f"\\u{c:04x}" for c in range(0x10000) if chr(c).isspace())
    return f"[^{spaces}]"


NOT_BLANK = _not_blank()
Text = Annotated[str, Meta(pattern=NOT_BLANK, description="not only whitespace")]
Texts = Annotated[list[Text], Meta(min_length=1)]  # narrowed to --max-texts at start
# A JSON integer, 3.0 included as JSON Schema counts it: msgspec's int refuses any float, and
# a float that is a multiple of 1 is the same set of numbers.
Count = Annotated[float, Meta(ge=0, multiple_of=1)]
Positive = Annotated[float, Meta(ge=1, multiple_of=1)]
TokenIds = Annotated[list[Count], Meta(min_length=1)]
NonNegative = Annotated[int, Meta(ge=0)]  # an answer's count or index (msgspec writes an int)


ModelName = Annotated[str, Meta(description="a loaded model's name (else 404)")]
ModelVersion = Annotated[str | int, Meta(description="the model's version (else 404)")]


class Named(Struct, kw_only=True):
    """A body's optional `model` and `version` (request/lookup.py request_model): null is as if left
    out."""

    model: ModelName | None = None
    version: ModelVersion | None = None


class Truncation(Struct, kw_only=True):
    """A text over max_length: `truncate` true cuts it, false refuses it (413); right keeps
    its start. Neither: the server's --long-text."""

    truncate: Annotated[bool, Meta(description="true: cut; false: refuse (413)")] | None = None
    truncation_direction: (
        Annotated[Literal["left", "right"], Meta(description="right keeps the start")] | None
    ) = None

    def options(self) -> int:
        """The options byte (shm/layout.py) of `truncate` and `truncation_direction`; 0 when
        neither is set."""
        opts = 0
        if self.truncate is not None:
            opts |= L.OPT_CUT if self.truncate else L.OPT_REFUSE
        if self.truncation_direction == "left":
            opts |= L.OPT_LEFT
        return opts


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


def convert(value: Any, kind: type[S], where: str) -> S:
    """Plain values (gRPC's parameters, built from protobuf) as `kind`, checked as a JSON body
    is; the 400's path starts at `where`."""
    try:
        return msgspec.convert(value, type=kind)
    except msgspec.ValidationError as exc:
        problem = str(exc).replace("`$.", f"`$.{where}.").replace("`$`", f"`$.{where}`")
        raise RequestError(400, message(problem)) from None


_BLANK = re.compile(r"^Expected `str` matching regex '.*' - at `\$\.(.*)`$")
_BOUND = re.compile(r"`int`( that's a multiple of 1\.0|( [<>]=? -?\d+)\.0)?")
_FLOAT = re.compile(r"\bfloat\b")


def message(text: str, subject: str = "body") -> str:
    """msgspec's message in our words where it would puzzle: a blank text is "PATH is empty"
    (as every protocol says it: texts.require), and a field it reads as a float that is a
    multiple of 1 is an integer."""
    if text.startswith("Expected `object`, got") and " - at " not in text:
        return f"{subject} must be a JSON object"
    blank = _BLANK.match(text)
    if blank:
        return f"{blank.group(1)} is empty"
    # A request's only numbers are integers (Count, Positive): msgspec reads them as floats.
    head, at, path = text.partition(" - at ")
    expected, got, given = head.partition(", got ")  # the value's own type stays as it is
    return _BOUND.sub(_integer, _FLOAT.sub("int", expected)) + got + given + at + path


def _integer(found: re.Match[str]) -> str:
    if found.group(2):
        return "`int`" + found.group(2)
    return "`int`, got a fraction" if found.group(1) else "`int`"


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
