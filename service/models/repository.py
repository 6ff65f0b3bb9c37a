"""The model repository while the server runs (`Repository`, on Front.repository): its index,
and loading and unloading models (--model-control explicit), and the per-model reload.

A load is verified off the loop (fingerprint and tokenizer), checked against --memory-budget,
added to the ModelSet as LOADING under a new index, opened on the dispatcher, and the pool is
rolled onto the new list (Supervisor.set_models: a new zygote, then worker by worker, dropping
nothing); then it is READY. An unload turns UNLOADING (requests for it get 404), answers what
was admitted for it, is removed, and the pool is rolled again, which frees its memory. One
operation at a time (a lock), so rolls never overlap; a failed load changes nothing else and
leaves its reason in the index.

Every roll is tentative (pool/roll.py): the new list is served only once a worker has loaded
it and answered a warm-up. One that verifies but that workers cannot load (or serve) fails the
roll, never the server: the pool rolls back onto the workers that hold the list before it
(Supervisor.roll_back), which served throughout, and the load, unload or reload answers why.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ringserve.service.config.settings import Config, ModelTableError
from ringserve.service.engine.dispatcher import Dispatcher
from ringserve.service.logs import EventLog
from ringserve.service.models import modelset as M
from ringserve.service.models.info import (
    Candidate,
    ModelInfo,
    Wanted,
    describe,
    scan_repository,
)
from ringserve.service.pool.handle import pid_rss
from ringserve.service.pool.supervisor import Supervisor
from ringserve.shm import layout as L
from ringserve.shm.control import ControlBlock, model_rss
from ringserve.workers.artifact import ArtifactError, Manifest, load_manifest, load_tokenizer
from ringserve.workers.spec import ModelRef

Error = tuple[int, str]  # (HTTP-like code, message)
DRAINING: Error = (503, "server is draining")
ROLLED_BACK = "reload failed, the models served before keep serving"


def measured_rss(ctls: Iterable[ControlBlock], index: int) -> int | None:
    """A model's memory in one worker, as the workers measured it when they loaded it (the
    largest of theirs); None when no worker says."""
    seen = []
    for ctl in ctls:
        value = model_rss(ctl, index) if 0 <= index < L.MAX_MODELS else 0
        if value > 0:
            seen.append(int(value))
    return max(seen) if seen else None


# -- memory ----------------------------------------------------------------------------------------
def weights_bytes(
    model_dir: str, manifest: Manifest, runtime: str, precision: str, graph: str = "plain"
) -> int:
    """The size of the weight files a worker loads for this model on `runtime`: TorchScript's
    file, or the ONNX graphs it runs (int8-checked: its int8 graph and the plain fp32 one) and
    those graphs' own .data files."""
    names = [manifest.model_file]
    if runtime in ("onnx", "openvino"):  # OpenVINO compiles the plain graph, at any precision
        graphs = [manifest.onnx_for(precision, graph) if runtime == "onnx" else manifest.onnx_file]
        if runtime == "onnx" and precision == "int8-checked":
            graphs.append(manifest.onnx_file)
        names = [
            f for g in graphs for f in (g, *manifest.data_files) if f == g or f.startswith(g + ".")
        ]
    total = 0
    for name in names:
        with contextlib.suppress(OSError):
            total += os.path.getsize(Path(model_dir) / name) if name else 0
    return total


def per_worker_estimate(weights: int, known: list[tuple[int, int]]) -> int:
    """A new model's memory in each worker: its weights' size, times what the loaded models
    measured against their own weights (`known`: (measured RSS, weights) pairs); the size
    alone when nothing was measured."""
    measured = sum(r for r, _ in known)
    sized = sum(w for _, w in known)
    if measured <= 0 or sized <= 0:
        return weights
    return int(weights * measured / sized)


def memory_refusal(budget: int, used: int, per_worker: int, processes: int) -> str | None:
    """Why a load needing `per_worker` bytes in each of `processes` processes does not fit in
    `budget` beside the `used` bytes the server's processes hold now; None when it fits."""
    need = used + per_worker * processes
    if need <= budget:
        return None
    mib = 1 << 20
    return (
        f"over --memory-budget: it would take about {per_worker // mib} MiB in each of "
        f"{processes} processes, {need // mib} MiB in all with the {used // mib} MiB held "
        f"now, and the budget is {budget // mib} MiB"
    )


def verify(model_dir: str) -> Manifest:
    """Everything a worker would refuse, checked first (in a thread: it hashes the files)."""
    manifest = load_manifest(model_dir)
    try:
        load_tokenizer(model_dir, manifest.max_length)
    except Exception as exc:  # noqa: BLE001 - the tokenizers library raises its own kinds
        raise ArtifactError(f"model artifact {model_dir}: unreadable tokenizer: {exc}") from None
    return manifest


class Refused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.error: Error = (code, message)


class Repository:
    def __init__(
        self,
        settings: Config,
        log: EventLog,
        front: Any,  # service.front.Front (which imports this module)
        dispatcher: Dispatcher,
        supervisor: Supervisor,
    ) -> None:
        self.settings = settings
        self.log = log
        self.front = front
        self.models: M.ModelSet = front.models
        self.dispatcher = dispatcher
        self.supervisor = supervisor
        self.root = settings.model_repository
        self.problems: dict[str, str] = {}  # name -> why its last load failed
        self.lock = asyncio.Lock()  # one load, unload or reload (one roll) at a time

    def scan(self) -> dict[str, Candidate]:
        """The repository's models now (none when it is gone or unreadable: logged)."""
        if not self.root:
            return {}
        try:
            return scan_repository(self.root)
        except ArtifactError as exc:
            self.log.warning("repository_unreadable", reason=str(exc))
            return {}

    # -- views -------------------------------------------------------------------------------------
    def index(self) -> list[dict[str, str]]:
        """KServe's repository index (repository_index)."""
        return repository_index(self.scan(), self.models, self.problems)

    def status_rows(self) -> list[dict[str, Any]]:
        """`ctl status`'s models: each loaded one with its fingerprint and measured memory."""
        ctls = [h.ctl for h in self.supervisor.all.values() if h.loaded()]
        return [
            {
                "name": e.info.name,
                "version": str(e.info.version),
                "state": e.state,
                "fingerprint": e.info.manifest.fingerprint,
                "rss_bytes_per_worker": measured_rss(ctls, e.info.index),
            }
            for e in self.models
        ]

    # -- load --------------------------------------------------------------------------------------
    async def load(self, name: str, version: int | str | None = None) -> Error | None:
        """Load `name` (its highest version, or `version`) from the repository; the error as
        (code, message), or None once its workers serve it."""
        if self.settings.model_control != "explicit":
            return 400, "models load and unload on request only with --model-control explicit"
        if self.front.draining:
            return DRAINING
        async with self.lock:
            if self.front.draining:
                return DRAINING
            try:
                v, where = find(self.scan().get(name), name, version)
                error = await self.load_verified(name, v, where)
            except Refused as exc:
                error = exc.error
        if error is not None and error[0] != 404:
            self.problems[name] = error[1]
            self.log.warning("model_load_refused", model=name, code=error[0], reason=error[1])
        return error

    async def load_verified(self, name: str, version: int, where: str) -> Error | None:
        entry = self.models.entries.get((name, version))
        if entry is not None and entry.state == M.READY:
            return await self.load_again(entry.info, where)
        if len(self.models) >= L.MAX_MODELS or self.models.new_index() >= L.MAX_MODELS:
            return 409, f"no model index left ({L.MAX_MODELS} loads per server run)"
        try:
            manifest = await asyncio.to_thread(verify, where)
        except ArtifactError as exc:
            return 400, str(exc)
        first = self.models.first
        wanted = Wanted(name, where, version, True)
        try:
            info = describe(
                self.settings, self.log, manifest, wanted, self.models.new_index(),
                first.device, first,
            )  # fmt: skip
        except SystemExit as exc:  # --runtime cannot serve it (describe is the start's too)
            return 400, str(exc.code).removeprefix("ringserve: ")
        except ModelTableError as exc:  # its config file table asks what it cannot give
            return 400, str(exc)
        refusal = memory_check(self.settings, self.supervisor, self.models, info)
        if refusal is not None:
            return 409, refusal
        if self.front.draining:
            return DRAINING
        return await self.admit(info)

    async def admit(self, info: ModelInfo) -> Error | None:
        """Add it as LOADING, open it on the dispatcher, roll, and mark it READY."""
        before = self.refs()
        self.models.add(info, M.LOADING)
        self.problems.pop(info.name, None)
        table, s = self.dispatcher.table, self.settings
        table.open(info.index, info.name, s.max_queue, info.priority, info.shape, info.warm_options)
        error = await self.roll(before)
        if error is not None:  # take it back out (the pool rolled back): nothing else changes
            self.dispatcher.table.close(info.index)
            self.models.remove(info)
            return (503, error) if error == DRAINING[1] else (500, error)
        self.models.set_state(info, M.READY)
        self.log.info("model_loaded", model=info.name, version=info.version, index=info.index,
                      fingerprint=info.manifest.fingerprint)  # fmt: skip
        return None

    async def load_again(self, info: ModelInfo, where: str) -> Error | None:
        """A load of a model it serves (as Triton's): its artifact read again, and rolled in,
        tentatively, when it changed; when its workers cannot load or serve it, the one served
        before keeps serving and the reason is answered."""
        try:
            manifest = await asyncio.to_thread(verify, where)
        except ArtifactError as exc:
            return 400, str(exc)
        if manifest.fingerprint == info.manifest.fingerprint:
            return None  # the same artifact: loading it again changes nothing
        if shape(manifest) != shape(info.manifest):
            return 400, "its labels, tasks or dimension differ (unload it, then load it)"
        try:
            fresh = info.reloaded(manifest)
        except ModelTableError as exc:
            return 400, str(exc)
        error = await self.roll(self.refs())
        if error is None:
            self.models.replace(fresh)
            self.log.info("model_reloaded", model=info.name, version=info.version,
                          fingerprint=manifest.fingerprint)  # fmt: skip
            return None
        if error == DRAINING[1]:
            return DRAINING
        return 500, f"{ROLLED_BACK}: {error}"

    # -- unload ------------------------------------------------------------------------------------
    async def unload(
        self, name: str, by_file: bool = False, keep: int | None = None
    ) -> Error | None:
        """Stop serving `name` (every version, but `keep`): new requests for it get 404 at
        once, what was admitted is answered, then the pool rolls onto the others (its memory is
        freed). `by_file`: a config file's table went (service/models/reload.py)."""
        if self.settings.model_control != "explicit" and not by_file:
            return 400, "models load and unload on request only with --model-control explicit"
        if self.front.draining:
            return DRAINING
        async with self.lock:
            going = [e.info for e in self.models if e.info.name == name and e.info.version != keep]
            if not going:
                return 404, f"unknown model: {name} (not loaded)"
            if len(going) == len(self.models):
                return 409, f"{name} is the only model loaded: a server serves at least one"
            for info in going:
                self.models.set_state(info, M.UNLOADING)
                self.dispatcher.table.close(info.index)
            await self.answered([info.index for info in going])
            before = self.refs()
            for info in going:
                self.models.remove(info)
            self.log.info("model_unloaded", model=name, versions=[i.version for i in going])
            error = await self.roll(before)  # failed: the old workers, which hold it, serve on
        return None if error is None else ((503, error) if error == DRAINING[1] else (500, error))

    async def answered(self, indexes: list[int]) -> None:
        """What was admitted for these models is answered (or the drain timeout passed)."""
        waits = [self.dispatcher.table.when_empty(i) for i in indexes]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), self.settings.drain_timeout_s)
        except TimeoutError:
            self.log.warning(
                "unload_timeout", models=indexes, waited_s=self.settings.drain_timeout_s
            )

    def refs(self) -> list[ModelRef]:
        """What the workers are told to load for the set as it is now."""
        return [m.ref for m in self.models.infos()]

    async def roll(self, before: list[ModelRef]) -> str | None:
        """The pool onto every model the set holds now, tentatively; the reason when it did
        not finish, once the pool has rolled back onto `before` (the list its workers held)."""
        generation = self.supervisor.set_models(self.refs(), tentative=True)
        error = await self.supervisor.rolls.wait(generation)
        if error is not None and error != DRAINING[1]:
            self.supervisor.roll_back(before, generation)
        return error

    # -- reload (SIGHUP, ctl reload) ---------------------------------------------------------------
    async def reload(self, reason: str) -> str | None:
        """Re-read and verify every model (off the loop); refused whole when one fails or
        changes its labels, task or dimension; else one tentative roll onto them all, answered
        once it ended: the new artifacts are served (and described) only once every worker
        holds them; when a worker cannot load or serve them, the pool keeps the old ones and
        the reason is answered."""
        async with self.lock:
            fresh = await reverified(self.models.infos())
            if isinstance(fresh, str):
                return fresh
            if self.front.draining:  # began while the artifacts were being read
                return DRAINING[1]
            error = await self.roll(self.refs())  # the cache's entries go with replace
            if error is None:
                for info in fresh:
                    self.models.replace(info)
                return None
        if error == DRAINING[1]:
            return error
        self.log.warning("reload_rolled_back", by=reason, reason=error)
        return f"{ROLLED_BACK}: {error}"


async def reverified(infos: Iterable[ModelInfo]) -> list[ModelInfo] | str:
    """Every model re-read from its directory (off the loop), or why the reload is refused."""
    fresh: list[ModelInfo] = []
    for info in infos:
        try:
            manifest = await asyncio.to_thread(load_manifest, info.model_dir)
        except ArtifactError as exc:
            return str(exc)
        if shape(manifest) != shape(info.manifest):
            return (
                f"reload refused: {info.name}: the new artifact's labels, tasks or "
                "dimension differ (restart the server, or unload and load it)"
            )
        try:
            fresh.append(info.reloaded(manifest))
        except ModelTableError as exc:
            return f"reload refused: {exc}"
    return fresh


def repository_index(
    found: dict[str, Candidate], models: M.ModelSet, problems: dict[str, str]
) -> list[dict[str, str]]:
    """Every model of the repository (`found`), loaded or not, and every loaded one: name,
    version, state and reason (KServe's repository index)."""
    rows: list[dict[str, str]] = []
    names = list(found) + sorted({e.info.name for e in models} - set(found))
    for name in names:
        loaded = sorted((e for e in models if e.info.name == name), key=version_of)
        for e in loaded:
            row = {"name": name, "version": str(e.info.version), "state": e.state}
            rows.append({**row, "reason": e.reason or problems.get(name, "")})
        if not loaded:
            cand = found[name]
            version = str(max(cand.versions)) if cand.versions else ""
            reason = problems.get(name) or cand.problem
            rows.append({"name": name, "version": version, "state": M.UNAVAILABLE,
                         "reason": reason})  # fmt: skip
    return rows


def find(cand: Candidate | None, name: str, version: int | str | None) -> tuple[int, str]:
    """(version, directory) of the repository's model `name` (`cand`, as scanned); raises
    Refused."""
    if cand is None:
        raise Refused(404, f"unknown model: {name} (not in the model repository)")
    if not cand.versions:
        raise Refused(400, cand.problem)
    try:
        want = None if version is None or version == "" else int(str(version))
    except ValueError:
        raise Refused(400, f"version must be a number, got {version!r}") from None
    picked = cand.pick(want)
    if picked is None:
        raise Refused(404, f"unknown version {want} of model {name}")
    return picked


def memory_check(s: Config, sup: Supervisor, models: M.ModelSet, info: ModelInfo) -> str | None:
    """Why loading `info` would pass --memory-budget (None: it fits), from what the loaded
    models' workers measure."""
    ctls = [h.ctl for h in sup.all.values() if h.loaded()]
    known: list[tuple[int, int]] = []
    for m in models.infos():
        rss = measured_rss(ctls, m.index)
        if rss is not None:
            own = dict(m.options).get("precision", s.precision)
            sized = weights_bytes(m.model_dir, m.manifest, m.runtime, own, s.graph)
            known.append((rss, sized))
    own = dict(info.options).get("precision", s.precision)
    weights = weights_bytes(info.model_dir, info.manifest, info.runtime, own, s.graph)
    per_worker = per_worker_estimate(weights, known)
    # Every serving worker and spare, the one more a roll starts, and the zygote.
    processes = sup.target + max(1, sup.target_spares) + (1 if sup.forker.wanted else 0)
    used = pid_rss(os.getpid()) + sum(h.rss_bytes() for h in sup.all.values())
    zygote = sup.forker.zygote
    used += pid_rss(zygote.process.pid) if zygote is not None else 0
    budget = s.memory_budget if s.memory_budget is not None else 1 << 62
    return memory_refusal(budget, used, per_worker, processes)


def version_of(entry: M.Entry) -> int:
    return entry.info.version


def shape(m: Manifest) -> tuple[list[str], list[str], int]:
    """What a reload may not change (the protocols answer by it)."""
    return (m.labels, m.task, m.dimension)
