"""The tests' cheap builds: what a test module's own artifact builds may skip."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

# What a test module's own builds may skip (cheap_builds): the int8 recipe search, and all but
# the first rows of the publication split. The artifact every server serves is built whole.
CHEAP_BUILDS = {"RINGSERVE_INT8_SEARCH": "dynamic", "RINGSERVE_INT8_PUBLICATION_ROWS": "400"}


@contextmanager
def cheap_builds() -> Iterator[None]:
    """For a module whose artifacts are built to test the build or the export, not int8's
    choice or its published cost (test_runtimes.py and test_int8*.py test those)."""
    old = {k: os.environ.get(k) for k in CHEAP_BUILDS}
    os.environ.update(CHEAP_BUILDS)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
