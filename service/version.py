"""ringserve's version: the installed package's, as pip recorded it (one place reads it)."""

from __future__ import annotations

from functools import cache
from importlib import metadata

UNINSTALLED = "0+unknown"  # run from a tree that pip never installed


@cache
def version() -> str:
    try:
        return metadata.version("ringserve")
    except metadata.PackageNotFoundError:
        return UNINSTALLED
