"""One check of a text for every protocol: it is a string (or UTF-8 bytes), and not empty or
whitespace only. HTTP's JSON, KServe's tensors and binary frames all call it; the worker's
`decode_payload` stays behind it as the last guard."""

from __future__ import annotations

from ringserve.service.request.errors import RequestError


def checked(value: object) -> tuple[bytes, str]:
    """The text as UTF-8 bytes and "", or b"" and what is wrong with it (to follow its name)."""
    if isinstance(value, bytes):
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            return b"", "is not valid UTF-8"
        return (value, "") if text.strip() else (b"", "is empty")
    if not isinstance(value, str):
        return b"", "must be a string"
    if not value.strip():
        return b"", "is empty"
    try:
        return value.encode("utf-8"), ""
    except UnicodeEncodeError:
        return b"", "is not valid UTF-8 (lone surrogate)"


def require(value: object, where: str) -> bytes:
    """The text as UTF-8 bytes, or a 400 naming `where`."""
    payload, problem = checked(value)
    if problem:
        raise RequestError(400, f"{where} {problem}")
    return payload
