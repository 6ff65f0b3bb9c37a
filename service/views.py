"""What the protocols read of the server: a read-only view.

Every protocol is handed one object, service/front.py's `Front`, and reads it through
`FrontView`, which names every member they read, so that the engine and the pool can be rebuilt
behind it. What operations read (metrics, stats, the dashboard) is service/ops/views.py's.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol

from ringserve.service.config.settings import Config
from ringserve.service.engine.admission import Admission
from ringserve.service.engine.cache import AnswerCache
from ringserve.service.engine.tenants import KeyRing, Tenant
from ringserve.service.logs import EventLog
from ringserve.service.models.info import ModelInfo
from ringserve.service.models.modelset import ModelSet

Failure = tuple[int, str] | None  # a repository call's error: the HTTP code and its message


class Repository(Protocol):
    """What the repository extension calls (service/models/repository.py's Repository)."""

    def index(self) -> list[dict[str, Any]]: ...
    def load(self, name: str, version: str | None = None) -> Awaitable[Failure]: ...
    def unload(self, name: str) -> Awaitable[Failure]: ...


class Statistics(Protocol):
    """Triton's per-model inference statistics (service/ops/inference_stats.py's
    InferenceStats): one model's entry of the `model_stats` list."""

    def doc(self, name: str, version: str, index: int) -> dict[str, Any]: ...


class FrontView(Protocol):
    """What every protocol reads of the server (service/front.py's Front): the HTTP routes
    (/v1, KServe, TEI, Cohere, OpenAI), the binary protocol and the gRPC port. `models` holds
    every model, each one frozen value a request resolves once (`find`); `model` is the first,
    what /v1/model gives; `repository` loads and unloads (None: a server without one)."""

    @property
    def settings(self) -> Config: ...
    @property
    def log(self) -> EventLog: ...
    @property
    def admission(self) -> Admission: ...
    @property
    def model(self) -> ModelInfo: ...
    @property
    def models(self) -> ModelSet: ...
    @property
    def repository(self) -> Repository | None: ...
    @property
    def keys(self) -> KeyRing | None: ...
    @property
    def cache(self) -> AnswerCache: ...
    @property
    def inference_stats(self) -> Statistics: ...
    @property
    def draining(self) -> bool: ...
    def ready(self) -> bool: ...
    def count(self, protocol: str, code: int, n: int = 1, tenant: Tenant | None = None) -> None: ...
