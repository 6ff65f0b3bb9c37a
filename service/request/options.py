"""What a request asks beside its texts, read from plain values (KServe's parameters, a
header): its long-text options and its priority; a JSON body's Struct says the same with
`Truncation.options()` (protocols/schemas)."""

from __future__ import annotations

from typing import Any

from ringserve.service.engine.tenants import PRIORITIES
from ringserve.service.request.errors import RequestError
from ringserve.shm import layout as L


def as_integer(value: Any) -> int | None:
    """A JSON integer, or None. 3.0 is one too, as JSON Schema counts (the OpenAPI document's
    `integer`); true and false are not."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def long_text_options(doc: dict[str, Any], where: str) -> int:
    """The options byte (shm/layout.py: OPT_*) of a request's `truncate` and
    `truncation_direction` in a plain dict (KServe's parameters); 0 when it sets neither, so
    the worker applies the server's --long-text."""
    truncate = doc.get("truncate")
    direction = doc.get("truncation_direction")
    opts = 0
    if truncate is not None:
        if not isinstance(truncate, bool):
            raise RequestError(400, f"{where}truncate must be true or false")
        opts |= L.OPT_CUT if truncate else L.OPT_REFUSE
    if direction is not None:
        if direction not in ("left", "right"):
            raise RequestError(400, f'{where}truncation_direction must be "left" or "right"')
        opts |= L.OPT_LEFT if direction == "left" else 0
    return opts


def asked_priority(value: object, where: str) -> int | None:
    """A request's own priority: `interactive` or `bulk` (X-Priority, KServe `priority`);
    KServe's integer levels as Triton reads them (1 the highest: interactive; 2 and more:
    bulk; 0: the key's own)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if isinstance(value, bool):
        raise RequestError(400, f"{where} must be interactive or bulk")
    if isinstance(value, int):
        if value < 0:
            raise RequestError(400, f"{where} must be interactive, bulk, or a level 0 and up")
        return None if value == 0 else min(value - 1, 1)
    if isinstance(value, str) and value.strip().lower() in PRIORITIES:
        return PRIORITIES[value.strip().lower()]
    raise RequestError(400, f"{where} must be interactive or bulk")
