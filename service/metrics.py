"""Prometheus metrics, /v1/stats and the dashboard route (stub until the operators issue)."""

from __future__ import annotations

from service.routes import Router


def register(router: Router) -> None:
    pass
