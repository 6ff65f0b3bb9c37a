"""KServe v2 / Open Inference Protocol routes (stub until the protocols issue lands)."""

from __future__ import annotations

from service.routes import Router


def register(router: Router) -> None:
    pass
