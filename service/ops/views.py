"""What operations (metrics, stats, the dashboard) read of the server, the engine and the pool:
read-only views. Operations only look: these Protocols name every member they read, so that
none of them can change what it watches, and the engine and the pool can be rebuilt behind
them. Today's MetricsHost (service/front.py), Dispatcher and Supervisor satisfy them as they
are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Sized
from typing import Any, Protocol

from ringserve.service.config.settings import Config
from ringserve.service.engine.cache import AnswerCache
from ringserve.service.engine.link import WorkerLink
from ringserve.service.engine.tenants import KeyRing
from ringserve.service.logs import EventLog
from ringserve.service.models.info import ModelInfo
from ringserve.service.pool.handle import WorkerHandle
from ringserve.service.protocols.auth import ApiKey
from ringserve.service.protocols.http import HttpServerState


class Waiting(Sized, Protocol):
    """Texts admitted but in no ring yet: how many, how many of them are bulk, and how many
    are one model's."""

    @property
    def bulk(self) -> Sized: ...
    def waiting_for(self, model: int) -> int: ...


class LaneView(Protocol):
    """One model as the dispatcher admits it (service.engine.lanes.Lane)."""

    @property
    def index(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def max_queue(self) -> int: ...  # 0: the total alone
    @property
    def open(self) -> bool: ...
    @property
    def depth(self) -> int: ...
    @property
    def rejected(self) -> int: ...
    @property
    def priority(self) -> int: ...  # the level its texts are batched at, at most
    @property
    def bulk_texts(self) -> int: ...  # admitted at bulk


class QueueView(Protocol):
    """What operations read of the dispatcher: its queue, its refusals and its pool's rate."""

    @property
    def depth(self) -> int: ...
    @property
    def max_queue(self) -> int: ...
    @property
    def max_queue_ms(self) -> float: ...
    @property
    def waiting(self) -> Waiting: ...
    @property
    def serving(self) -> Sequence[WorkerLink]: ...
    @property
    def rejected(self) -> int: ...
    @property
    def expired(self) -> int: ...
    @property
    def answered_by_task(self) -> Mapping[str, int]: ...
    @property
    def many(self) -> bool: ...  # more than one model was ever opened
    @property
    def models(self) -> Mapping[int, LaneView]: ...
    def wait_ms(self) -> float: ...
    def rate(self) -> float | None: ...


class PoolView(Protocol):
    """What operations read of the pool: its processes, slots and restarts."""

    @property
    def all(self) -> Mapping[int, WorkerHandle]: ...  # serial -> handle, every live process
    @property
    def retiring(self) -> Sequence[WorkerHandle]: ...  # draining or stopping
    @property
    def slots(self) -> Mapping[int, WorkerHandle | None]: ...
    @property
    def restarts(self) -> Mapping[int, int]: ...
    @property
    def restarts_total(self) -> int: ...
    @property
    def target(self) -> int: ...
    def status_rows(self) -> list[dict[str, Any]]: ...


class MetricsView(Protocol):
    """What the metrics read of the server."""

    @property
    def settings(self) -> Config: ...
    @property
    def log(self) -> EventLog: ...
    @property
    def started(self) -> float: ...
    @property
    def draining(self) -> bool: ...
    @property
    def api_key(self) -> ApiKey | None: ...
    @property
    def keys(self) -> KeyRing | None: ...
    @property
    def dispatcher(self) -> QueueView: ...
    @property
    def supervisor(self) -> PoolView: ...
    @property
    def http_state(self) -> HttpServerState | None: ...
    @property
    def requests_total(self) -> Mapping[tuple[str, int, str], int]: ...
    @property
    def model(self) -> ModelInfo: ...  # the first model (FrontView.model)
    @property
    def cache(self) -> AnswerCache: ...  # the answer cache (--cache-bytes)
    @property
    def dropped(self) -> int: ...  # texts dropped, never run: their client had gone
