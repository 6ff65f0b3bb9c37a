"""What the fuzz tests of every protocol share: the campaign's size and settings, the reference
text, and the binary-frame mutator."""

from __future__ import annotations

import math
import os
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from ringserve.wire.frames import LENGTH

INPUTS = int(os.environ.get("RINGSERVE_FUZZ_EXAMPLES", "1200"))
BATCH = 8  # fewest inputs per hypothesis example (at most BATCH + 4)
EXAMPLES = max(1, math.ceil(INPUTS / BATCH))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # a long campaign must not replay a stored failure forever
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MAX_FRAME = 4096  # small, so oversize lengths are cheap to send
REFERENCE_TEXT = "an honest, moving and beautifully acted film"


def mutate_binary(data: bytes, draw: Any) -> bytes:
    kind = draw(st.sampled_from(["flip", "truncate", "insert", "oversize", "garbage"]))
    i = draw(st.integers(0, max(0, len(data) - 1)))
    if kind == "flip" and data:
        return data[:i] + bytes([data[i] ^ (1 << draw(st.integers(0, 7)))]) + data[i + 1 :]
    if kind == "truncate":
        return data[:i]
    if kind == "insert":
        return data[:i] + draw(st.binary(min_size=1, max_size=16)) + data[i:]
    if kind == "oversize":
        return data + LENGTH.pack(draw(st.integers(MAX_FRAME + 1, 2**32 - 1))) + b"xx"
    return bytes(draw(st.binary(max_size=200)))
