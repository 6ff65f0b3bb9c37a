"""What the protocols read of this server: `Front` (the settings, the current model facts, the
admission, readiness, and where answers are counted) and `RunState`, the lifecycle's phase as
readiness and refusals see it; and `MetricsHost`, what ops/metrics.py reads. None of them starts
or stops anything: service/lifecycle.py does."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ringserve.service.config.settings import Config
from ringserve.service.engine.admission import Admission
from ringserve.service.engine.cache import AnswerCache
from ringserve.service.engine.dispatcher import Dispatcher
from ringserve.service.engine.tenants import KeyRing
from ringserve.service.logs import EventLog
from ringserve.service.models.info import ModelInfo
from ringserve.service.models.modelset import ModelSet
from ringserve.service.ops.inference_stats import InferenceStats
from ringserve.service.ops.stats import Stats
from ringserve.service.pool.supervisor import Supervisor
from ringserve.service.ports import Ports
from ringserve.service.protocols.auth import ApiKey
from ringserve.service.protocols.http import HttpServerState

if TYPE_CHECKING:
    from ringserve.service.models.repository import Repository


class RunState:
    """Where the server is in its life; written by the lifecycle only."""

    def __init__(self, dispatcher: Dispatcher, supervisor: Supervisor, started: float) -> None:
        self.dispatcher = dispatcher
        self.supervisor = supervisor
        self.stopping = False  # SIGTERM seen: readiness answers 503 (the shutdown delay)
        self.draining = False  # listeners closed: answering what is owed, then exiting
        self.hurry = False  # a second SIGINT/SIGTERM: stop at once, still cleaning up
        self.started = started  # monotonic seconds: when this server began

    def ready(self) -> bool:
        return not self.stopping and not self.draining and self.supervisor.ready_count() > 0

    def refusal(self) -> str:
        """Why the dispatcher refuses a request now (the message of its 503)."""
        if self.supervisor.fatal:
            return "no worker can serve"
        return "server is draining" if self.draining else self.dispatcher.why


class Front:
    """The one object the protocols are handed, read through service/views.py's FrontView.
    `models` holds every model (service/models/modelset.py); `model` is the first, swapped
    whole by a reload; `repository` is set by app.py right after (it needs this Front); the
    rest never changes."""

    def __init__(
        self,
        settings: Config,
        log: EventLog,
        models: ModelInfo | Sequence[ModelInfo],
        admission: Admission,
        count: Callable[..., None],
        state: RunState,
    ) -> None:
        self.settings = settings
        self.log = log
        every = (models,) if isinstance(models, ModelInfo) else tuple(models)
        self.cache = AnswerCache(settings.cache_bytes)  # embeddings answered before
        # every model; the lifecycle alone changes it, and a change drops its cached answers
        self.models = ModelSet(*every, changed=self.cache.forget)
        self.repository: Repository | None = None  # load, unload, index (models/repository.py)
        self.admission = admission
        self.count = count  # every answer written: Stats.count(protocol, code, n, tenant)
        self.inference_stats = InferenceStats()  # Triton's per-model statistics (KServe)
        self.state = state

    @property
    def model(self) -> ModelInfo:
        """The first model (the only one, in a one-model server)."""
        return self.models.first

    @model.setter
    def model(self, info: ModelInfo) -> None:
        self.models.replace(info)

    @property
    def keys(self) -> KeyRing | None:
        return self.admission.keys

    @property
    def draining(self) -> bool:
        return self.state.draining

    def ready(self) -> bool:
        return self.state.ready()


class MetricsHost:
    """What ops/metrics.py reads (ops/views.py's MetricsView), from the parts that hold it."""

    def __init__(
        self,
        settings: Config,
        log: EventLog,
        stats: Stats,
        dispatcher: Dispatcher,
        supervisor: Supervisor,
        keys: KeyRing | None,
        api_key: ApiKey | None,
        front: Front,
        ports: Ports,
    ) -> None:
        self.settings, self.log, self.stats = settings, log, stats
        self.dispatcher, self.supervisor = dispatcher, supervisor
        self.keys, self.api_key = keys, api_key
        self.front, self.ports = front, ports

    @property
    def started(self) -> float:
        return self.front.state.started

    @property
    def draining(self) -> bool:
        return self.front.state.draining

    @property
    def http_state(self) -> HttpServerState | None:
        return self.ports.http_state

    @property
    def requests_total(self) -> dict[tuple[str, int, str], int]:
        return self.stats.requests_total

    @property
    def model(self) -> ModelInfo:
        return self.front.model

    @property
    def cache(self) -> AnswerCache:
        return self.front.cache

    @property
    def dropped(self) -> int:
        return self.front.admission.dropped
