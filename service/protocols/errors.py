"""The error body each family of routes answers with, in the shape its clients parse: ours
`{"error": message}`; OpenAI's `{"error": {"message", "type", "param", "code"}}` on its routes
(the `openai` SDK reads `e.message` from it); TEI's `{"error", "error_type"}`; Cohere's
`{"message"}` beside our `error`. Chosen by the request's path, so every answer a route can
give (a parser's 400, admission's 503, the key's 401) comes in its family's shape."""

from __future__ import annotations

import json
import re
from typing import Any

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


def error_doc(url: bytes, status: int, message: str, **fields: Any) -> dict[str, Any]:
    """The error body for this path, as a dict; `fields` go beside the message (a too-long
    text's token counts)."""
    kind = family(url)
    if kind == "openai":
        model = "model" if status == 404 and message.startswith("unknown model") else None
        found = _PARAM.search(message)
        body = {
            "message": message,
            "type": OPENAI_TYPES.get(
                status, "server_error" if status >= 500 else "invalid_request_error"
            ),
            "param": found.group(1) if found else model,
            "code": "model_not_found" if model else OPENAI_CODES.get(status),
            **fields,
        }
        return {"error": body}
    if kind == "tei":
        return {"error": message, "error_type": TEI_TYPES.get(status, "Validation"), **fields}
    if kind == "cohere":
        return {"error": message, "message": message, **fields}
    return {"error": message, **fields}


def error_body(url: bytes, status: int, message: str, **fields: Any) -> bytes:
    return json.dumps(error_doc(url, status, message, **fields)).encode()
