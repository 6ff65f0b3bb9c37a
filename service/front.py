"""What the protocols read of this server: `Front` (the settings, the current model facts, the
admission, readiness, and where answers are counted) and `RunState`, the lifecycle's phase as
readiness and refusals see it. Neither starts or stops anything: service/lifecycle.py does."""

from __future__ import annotations

from collections.abc import Callable

from ringserve.service.engine.admission import Admission
from ringserve.service.engine.dispatcher import Dispatcher
from ringserve.service.engine.tenants import KeyRing
from ringserve.service.logs import EventLog
from ringserve.service.model_info import ModelInfo
from ringserve.service.pool.supervisor import Supervisor
from ringserve.service.settings import Config


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
    """The one object the protocols are handed (routes' ModelView, binary's BinaryHost, gRPC's
    GrpcHost). `model` is swapped whole by a reload; the rest never changes."""

    def __init__(
        self,
        settings: Config,
        log: EventLog,
        model: ModelInfo,
        admission: Admission,
        count: Callable[..., None],
        state: RunState,
    ) -> None:
        self.settings = settings
        self.log = log
        self.model = model
        self.admission = admission
        self.count = count  # every answer written: Stats.count(protocol, code, n, tenant)
        self.state = state

    @property
    def keys(self) -> KeyRing | None:
        return self.admission.keys

    @property
    def draining(self) -> bool:
        return self.state.draining

    def ready(self) -> bool:
        return self.state.ready()
