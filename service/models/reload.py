"""SIGHUP (and `ctl reload`) with --config: the file's [models.NAME] tables read again and the
models they name brought into line, through the repository's own load and unload (each a
rolling restart of the pool that drops nothing, service/models/repository.py).

A table added is loaded; a table removed is unloaded (what was admitted for it is answered
first); a table changed (its path, version or per-model settings) is swapped in place when its
version stays (the same index, one roll), or loaded as the new version before the old one is
unloaded, so the name serves throughout. A file that no longer checks refuses the whole reload
and changes nothing. The other options of the file are read at start only.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from ringserve.service.config import file as config_file
from ringserve.service.config.settings import ModelTableError
from ringserve.service.logs import EventLog
from ringserve.service.models.info import Wanted, artifact_versions, describe
from ringserve.service.models.repository import Repository, shape, verify
from ringserve.workers.artifact import ArtifactError

Table = tuple[str, dict[str, Any]]  # (path, per-model settings)


@dataclass
class Changes:
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)


def diff(old: dict[str, Table], new: dict[str, Table]) -> Changes:
    """What moved between two sets of model tables (name -> (path, settings))."""
    return Changes(
        added=[n for n in new if n not in old],
        removed=[n for n in old if n not in new],
        changed=[n for n in new if n in old and new[n] != old[n]],
    )


class ModelTables:
    """The config file's model tables as served now, and their re-reading."""

    def __init__(self, repository: Repository, log: EventLog) -> None:
        self.repo = repository
        self.settings = repository.settings
        self.log = log
        paths = dict(self.settings.named_models)
        self.tables: dict[str, Table] = {
            name: (paths[name], dict(self.settings.model_options.get(name, {})))
            for name in self.settings.file_models
        }

    async def reload(self, reason: str) -> str | None:
        """Re-read the file and apply what its tables changed; the errors, if any."""
        path = self.settings.config
        assert path is not None
        try:
            file = await asyncio.to_thread(config_file.read, path)
        except config_file.ConfigError as exc:
            return f"reload refused: {exc}"
        flagged = {n for n, _ in self.settings.named_models} - set(self.tables)
        new = {n: (t.path, t.options) for n, t in file.models.items() if n not in flagged}
        for name, t in file.models.items():  # where a refusal of its settings points
            if name not in flagged:
                self.settings.model_lines[name] = t.where()
        changes = diff(self.tables, new)
        if not changes:
            return None
        self.log.info("config_models_changed", by=reason, added=changes.added,
                      removed=changes.removed, changed=changes.changed)  # fmt: skip
        errors: list[str] = []
        for name in changes.removed:
            error = await self.repo.unload(name, by_file=True)
            if error is None:
                self.tables.pop(name)
                self.settings.model_options.pop(name, None)
            else:
                errors.append(f"{name}: {error[1]}")
        for name in [*changes.added, *changes.changed]:
            error_text = await self.put(name, new[name])
            if error_text is None:
                self.tables[name] = new[name]
            else:
                errors.append(f"{name}: {error_text}")
        if errors:
            self.log.error("config_models_refused", by=reason, errors=errors)
        return "; ".join(errors) or None

    async def put(self, name: str, table: Table) -> str | None:
        """Serve `name` as `table` says: a load, an in-place swap, or a new version."""
        where, options = table
        versions, problem = artifact_versions(where)
        pinned = options.get("version")
        version = pinned if isinstance(pinned, int) else max(versions, default=0)
        if version not in versions:
            return problem or f"{where} has no version {version}"
        serving = {e.info.name for e in self.repo.models}
        if name not in serving and self.settings.lane_count() > 1:
            return (
                f"the workers run {self.settings.lane_count()} lanes, which serve one model: "
                "restart the server to serve more (--lanes 1)"
            )
        before = self.settings.model_options.get(name)
        self.settings.model_options[name] = dict(options)
        if (name, version) in self.repo.models.entries:
            error = await self.swap(name, version, versions[version])
        else:
            async with self.repo.lock:
                failed = await self.repo.load_verified(name, version, versions[version])
            error = failed[1] if failed else None
            if error is None:  # the older version goes once the new one serves
                failed = await self.repo.unload(name, by_file=True, keep=version)
                error = failed[1] if failed and failed[0] != 404 else None
        if error is not None:
            if before is None:
                self.settings.model_options.pop(name, None)
            else:
                self.settings.model_options[name] = before
        return error

    async def swap(self, name: str, version: int, where: str) -> str | None:
        """A loaded (name, version) served from `where` with its new settings: the same
        index, one roll (its answers' shape may not change)."""
        repo = self.repo
        async with repo.lock:
            old = repo.models.entries[(name, version)].info
            try:
                manifest = await asyncio.to_thread(verify, where)
            except ArtifactError as exc:
                return str(exc)
            if shape(manifest) != shape(old.manifest):
                return "its labels, tasks or dimension differ (remove the table, then add it)"
            wanted = Wanted(name, where, version, True)
            try:
                info = describe(self.settings, self.log, manifest, wanted, old.index,
                                old.device, repo.models.first)  # fmt: skip
            except SystemExit as exc:
                return str(exc.code).removeprefix("ringserve: ")
            except ModelTableError as exc:
                return str(exc)
            before = repo.refs()
            repo.models.replace(info)
            repo.dispatcher.table.open(
                info.index,
                name,
                self.settings.max_queue,
                info.priority,
                info.shape,
                info.warm_options,
            )
            try:
                error = await repo.roll(before)
            finally:  # what old workers answered during the roll
                repo.front.cache.forget(info.index)
            if error is not None:  # the pool rolled back: so does the set
                repo.models.replace(old)
            return error
