"""The error body each family of routes answers with, in the shape its clients parse: ours
`{"error": message}`; OpenAI's `{"error": {"message", "type", "param", "code"}}` on its routes
(the `openai` SDK reads `e.message` from it); TEI's `{"error", "error_type"}`; Cohere's
`{"message"}` beside our `error`. Chosen by the request's path, so every answer a route can
give (a parser's 400, admission's 503, the key's 401) comes in its family's shape."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

OPENAI_PATHS = (b"/v1/embeddings", b"/v1/models")
TEI_PATHS = frozenset(
    (b"/", b"/info", b"/health", b"/predict", b"/tokenize", b"/decode", b"/embed_all",
     b"/similarity", b"/embed", b"/rerank")
)  # fmt: skip
COHERE_PATHS = frozenset((b"/v1/rerank", b"/v2/rerank", b"/v2/embed"))

# OpenAI's `type` by status (its API reference's error codes); `code` where OpenAI has one.
OPENAI_TYPES = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}
OPENAI_CODES = {401: "invalid_api_key", 429: "rate_limit_exceeded", 413: "context_length_exceeded"}
# TEI's ErrorType: a refusal of the queue is Overloaded, a server that cannot serve Unhealthy.
TEI_TYPES = {429: "Overloaded", 500: "Backend", 503: "Overloaded", 504: "Backend"}
# The request fields an OpenAI error can name as its `param`: the message starts with it, or
# names it as a decoding error does ("- at `$.input[0]`", "missing required field `input`").
_PARAM = re.compile(
    r"(?:^|at `\$\.|field `)(input|model|encoding_format|dimensions|version|user|prompt_name)\b"
)


def family(url: bytes) -> str:
    """ "openai", "tei", "cohere" or "" (ours) for a request's path."""
    path = url.split(b"?", 1)[0]
    if path in OPENAI_PATHS or path.startswith(b"/v1/models/"):
        return "openai"
    if path in TEI_PATHS:
        return "tei"
    if path in COHERE_PATHS:
        return "cohere"
    return ""


# -- the bodies, declared once: encoded here, and generated into /openapi.json (openapi.py) -------
class Error(Struct, forbid_unknown_fields=True):
    """Ours: `{"error": message}`."""

    error: str


TeiErrorType = Literal["Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty"]


class TeiError(Struct, forbid_unknown_fields=True):
    """TEI's ErrorResponse."""

    error: str
    error_type: TeiErrorType


class CohereError(Struct, forbid_unknown_fields=True):
    """Cohere's `message`, beside our `error`."""

    error: str
    message: str


class OpenAIErrorDetail(Struct, forbid_unknown_fields=True):
    """OpenAI's error object (its SDK reads `message`)."""

    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(Struct, forbid_unknown_fields=True):
    error: OpenAIErrorDetail


Count = Annotated[int, Meta(ge=0)]
# A text over max_length refused (413, admit.respond_failure): its counts beside the message.
TOO_LONG_FIELDS = [
    (name, Count | UnsetType, UNSET)
    for name in ("tokens", "max_length", "windows", "max_windows", "max_tokens")
]


def too_long(kind: type[Struct]) -> Any:
    """`kind` with a too-long text's counts (each left out when not given)."""
    name = kind.__name__ + "TooLong"
    return msgspec.defstruct(name, TOO_LONG_FIELDS, bases=(kind,), kw_only=True, omit_defaults=True)


ErrorTooLong = too_long(Error)
TeiErrorTooLong = too_long(TeiError)
CohereErrorTooLong = too_long(CohereError)
OpenAIErrorDetailTooLong = too_long(OpenAIErrorDetail)


class OpenAIErrorTooLong(Struct, forbid_unknown_fields=True):
    error: OpenAIErrorDetailTooLong  # type: ignore[valid-type]


# The error body of each family ("" ours), and with a too-long text's counts.
BODIES: dict[str, tuple[Any, Any]] = {
    "": (Error, ErrorTooLong),
    "openai": (OpenAIError, OpenAIErrorTooLong),
    "tei": (TeiError, TeiErrorTooLong),
    "cohere": (CohereError, CohereErrorTooLong),
}


def error_doc(url: bytes, status: int, message: str, **fields: Any) -> Struct:
    """The error body for this path, as its Struct; `fields` go beside the message (a too-long
    text's token counts)."""
    kind = family(url)
    if kind == "openai":
        model = "model" if status == 404 and message.startswith("unknown model") else None
        found = _PARAM.search(message)
        detail = OpenAIErrorDetailTooLong if fields else OpenAIErrorDetail
        body = detail(
            message=message,
            type=OPENAI_TYPES.get(
                status, "server_error" if status >= 500 else "invalid_request_error"
            ),
            param=found.group(1) if found else model,
            code="model_not_found" if model else OPENAI_CODES.get(status),
            **fields,
        )
        return (OpenAIErrorTooLong if fields else OpenAIError)(body)
    plain, counted = BODIES[kind]
    kind_type = counted if fields else plain
    if kind == "tei":
        return kind_type(error=message, error_type=TEI_TYPES.get(status, "Validation"), **fields)
    if kind == "cohere":
        return kind_type(error=message, message=message, **fields)
    return kind_type(error=message, **fields)


def error_body(url: bytes, status: int, message: str, **fields: Any) -> bytes:
    return msgspec.json.encode(error_doc(url, status, message, **fields))
