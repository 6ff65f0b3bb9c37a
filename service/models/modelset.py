"""The models this server holds (`ModelSet`): by name and version, each a frozen ModelInfo with
its state. Every protocol resolves a request's model here, once, before it admits the texts;
the lifecycle alone adds, replaces and removes entries (load, unload, reload)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ringserve.service.models.info import ModelInfo

# A model's states, as the KServe repository index and `ctl models` name them.
LOADING = "LOADING"  # verified, its workers are being rolled onto it: not routable yet
READY = "READY"  # serving
UNLOADING = "UNLOADING"  # refusing new requests (404), answering what was admitted
UNAVAILABLE = "UNAVAILABLE"  # known to the repository, not loaded (or its load failed)


class UnknownModel(LookupError):
    """No such model or version is loaded: HTTP 404, binary status 5. str() is the message."""


class ModelRequired(ValueError):
    """A request named no model while several are loaded: HTTP 400, naming them."""


@dataclass
class Entry:
    info: ModelInfo
    state: str = READY
    reason: str = ""  # why the last load failed, or why it is unavailable


class ModelSet:
    """Loaded models by name; each name serves one version (the highest loaded) unless a
    request names another. Indexes are unique while an entry lives and are never reused by a
    later model, so a late answer can never be read as another model's."""

    def __init__(
        self, first: ModelInfo, *more: ModelInfo, changed: Callable[[int], None] | None = None
    ) -> None:
        self.entries: dict[tuple[str, int], Entry] = {}
        self.next_index = 0
        # told a model's wire index when its artifact is replaced (a reload) or it is removed
        # (an unload): the answer cache drops its entries (service/engine/cache.py)
        self.changed = changed
        for info in (first, *more):
            self.add(info, READY)

    # -- changes (the lifecycle only) -----------------------------------------------------------
    def new_index(self) -> int:
        """An index no model of this server has had: a late answer can never be misread."""
        return self.next_index

    def add(self, info: ModelInfo, state: str = LOADING) -> Entry:
        key = (info.name, info.version)
        if key in self.entries:
            raise ValueError(f"model {info.name} version {info.version} is already loaded")
        if info.index < self.next_index:
            raise ValueError(f"model index {info.index} was used before")
        self.next_index = info.index + 1
        entry = self.entries[key] = Entry(info, state)
        return entry

    def set_state(self, info: ModelInfo, state: str, reason: str = "") -> None:
        entry = self.entries[(info.name, info.version)]
        entry.state, entry.reason = state, reason

    def remove(self, info: ModelInfo) -> None:
        self.entries.pop((info.name, info.version), None)
        if self.changed is not None:
            self.changed(info.index)

    def state_of(self, name: str) -> Entry | None:
        """The entry of `name` (its highest version) in any state, or None."""
        found = [e for (n, _), e in self.entries.items() if n == name]
        return max(found, key=lambda e: e.info.version) if found else None

    def infos(self) -> tuple[ModelInfo, ...]:
        """Every model the workers hold (LOADING and UNLOADING too), by index."""
        return tuple(sorted((e.info for e in self.entries.values()), key=lambda m: m.index))

    # -- lookups (every protocol) ---------------------------------------------------------------
    def find(self, name: str | None = None, version: int | str | None = None) -> ModelInfo:
        """The model a request names (None: the only one loaded). Raises UnknownModel (404) or
        ModelRequired (400); only a READY model is found."""
        if name is None or name == "":
            ready = self.ready()
            if len(ready) == 1:
                return ready[0]
            if not ready:
                raise UnknownModel("no model is loaded")
            names = ", ".join(sorted({m.name for m in ready}))
            raise ModelRequired(f'several models are loaded ({names}): name one in "model"')
        if version is None or version == "":
            best: Entry | None = None  # the highest READY version, in one pass (every request)
            for (n, _), e in self.entries.items():
                newer = best is None or e.info.version > best.info.version
                if n == name and e.state == READY and newer:
                    best = e
            if best is None:
                raise UnknownModel(f"unknown model: {name}")
            return best.info
        try:
            v = int(version)
        except (TypeError, ValueError):
            raise UnknownModel(f"unknown version {version!r} of model {name}") from None
        entry = self.entries.get((name, v))
        if entry is None or entry.state != READY:
            raise UnknownModel(f"unknown model or version: {name} version {v}")
        return entry.info

    def ready(self) -> list[ModelInfo]:
        return [e.info for e in self.entries.values() if e.state == READY]

    def __iter__(self) -> Iterator[Entry]:
        return iter(list(self.entries.values()))

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def first(self) -> ModelInfo:
        """The first loaded model: what /v1/model and the one-model paths read."""
        ready = self.ready()
        return ready[0] if ready else next(iter(self.entries.values())).info

    def replace(self, info: ModelInfo) -> None:
        """A reload's new facts for a loaded (name, version); its state stays."""
        self.entries[(info.name, info.version)].info = info
        if self.changed is not None:
            self.changed(info.index)

    def listing(self) -> list[dict[str, object]]:
        """/v1/models and the repository index: one row a (name, version)."""
        return [
            {
                "name": e.info.name,
                "version": str(e.info.version),
                "state": e.state,
                "task": e.info.manifest.task,
                "labels": e.info.labels,
                "reason": e.reason,
            }
            for e in self.entries.values()
        ]
