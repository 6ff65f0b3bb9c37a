"""The tests' cheap builds: what a test module's own artifact builds may skip."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import contextmanager

# What a test module's own builds may skip (cheap_builds): the int8 recipe search, all but the
# first rows of the publication split, and all but 100 texts of each of an embedder's compact
# vector sets (calibration, held-out documents; factory/compact.py). The artifact every server
# serves is built whole.
CHEAP_BUILDS = {
    "RINGSERVE_INT8_SEARCH": "dynamic",
    "RINGSERVE_INT8_PUBLICATION_ROWS": "400",
    "RINGSERVE_COMPACT_ROWS": "100",
}
# What a module whose artifacts are read on TorchScript and the plain ONNX graph alone may skip
# too: the fused graph and int8, with their checks on the held-out rows (factory/build.py).
PLAIN_BUILDS = CHEAP_BUILDS | {"RINGSERVE_BUILD_GRAPHS": "plain"}
# What a module that reads no compact-vector figure either may cut too: 10 calibration texts
# and 10 documents (the 100 queries stay). On MiniLM the compact passes are then 0.5 s of a
# plain build, not 1.9 (factory/compact.py).
BARE_BUILDS = PLAIN_BUILDS | {"RINGSERVE_COMPACT_ROWS": "10"}


@contextmanager
def cheap_builds(settings: dict[str, str] = CHEAP_BUILDS) -> Iterator[None]:
    """For a module whose artifacts are built to test the build or the export, not int8's
    choice or its published cost (test_runtimes.py and test_int8*.py test those)."""
    old = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def plain_builds() -> contextlib.AbstractContextManager[None]:
    """cheap_builds with the plain ONNX graph alone: for a module that reads its artifacts on
    TorchScript and the plain graph (fp32) only, never the fused graph or int8."""
    return cheap_builds(PLAIN_BUILDS)
