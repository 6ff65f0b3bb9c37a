"""The fields every transport's request shares, declared once as msgspec types (a text that
is not blank, a JSON integer, the long-text options), and `convert`, which checks plain values
(gRPC's parameters, built from protobuf) against a Struct as a JSON body is checked, with the
same words (`message`). protocols/schemas/ declares each HTTP body from them; service/kserve/
the inference header that HTTP decodes and gRPC converts into."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta, Struct
from ringserve.service.request.errors import RequestError
from ringserve.shm import layout as L

S = TypeVar("S")


def _not_blank() -> str:
    """A regex for "has a character that is not whitespace", whitespace as str.strip() counts
    it: spelled out, since a JSON Schema pattern's \\s (ECMA 262) counts otherwise (it has
    U+FEFF, and not U+001C to U+001F or U+0085). msgspec runs it with Python's re.search."""
    spaces = "".join(f"\\u{c:04x}" for c in range(0x10000) if chr(c).isspace())
    return f"[^{spaces}]"


NOT_BLANK = _not_blank()
Text = Annotated[str, Meta(pattern=NOT_BLANK, description="not only whitespace")]
# A JSON integer, 3.0 included as JSON Schema counts it: msgspec's int refuses any float, and
# a float that is a multiple of 1 is the same set of numbers.
Count = Annotated[float, Meta(ge=0, multiple_of=1)]
Positive = Annotated[float, Meta(ge=1, multiple_of=1)]


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
