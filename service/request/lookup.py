"""Which model a request names, and whether it does the task asked: the same answer (404 for
an unknown model or version, 400 when several are loaded and none is named, 400 for a task the
model lacks) on every route and every transport."""

from __future__ import annotations

from typing import Protocol

from ringserve.service.models.info import ModelInfo
from ringserve.service.models.modelset import ModelRequired, UnknownModel
from ringserve.service.request.errors import RequestError, Rule
from ringserve.service.views import FrontView

NEEDS_TASK = Rule("model {model} does not {task}; its tasks: {tasks}")
MODEL_REQUIRED = Rule(regex=r"^several models are loaded \(")  # ModelRequired's (modelset.py)


class NamesModel(Protocol):
    """A decoded body's optional `model` and `version` (protocols/schemas Named, LongText)."""

    @property
    def model(self) -> str | None: ...
    @property
    def version(self) -> str | int | None: ...


def find_model(server: FrontView, name: str | None, version: int | str | None = None) -> ModelInfo:
    """The loaded model a request names (service/models/modelset.py): 404 unknown, 400 when it
    names none while several are loaded."""
    try:
        return server.models.find(name, canonical(version))
    except UnknownModel as exc:
        raise RequestError(404, str(exc)) from None
    except ModelRequired as exc:
        raise RequestError(400, str(exc)) from None


def canonical(version: int | str | None) -> int | str | None:
    """A version as the server writes them ("1", 1), else 404: not " 1" or "01", which int()
    would take for the same version."""
    if isinstance(version, str) and version:
        written = version.isascii() and version.isdigit() and str(int(version)) == version
        if not written:
            raise RequestError(404, f"unknown version {version!r}")
    return version


def request_model(server: FrontView, body: NamesModel, vendor: bool = False) -> ModelInfo:
    """The model of a decoded body's optional "model" and "version". With `vendor` (OpenAI's
    and Cohere's routes, whose clients always send their own service's model name), a name this
    server has never held, without a "version", means the only loaded model, as before many
    models; a name it holds or held (an unloaded one: 404) is resolved as on every route."""
    name, version = body.model, body.version
    try:
        if not name and version is not None:  # a version of the only model
            name = server.models.find().name
        return server.models.find(name, canonical(version))
    except UnknownModel as exc:
        if vendor and version is None and name and not known_name(server, name):
            ready = server.models.ready()
            if len(ready) == 1:
                return ready[0]
        raise RequestError(404, str(exc)) from None
    except ModelRequired as exc:
        raise RequestError(400, str(exc)) from None


def known_name(server: FrontView, name: str) -> bool:
    """Whether the server holds `name` in any state, or its repository lists it."""
    if any(e.info.name == name for e in server.models):
        return True
    if server.repository is None:
        return False
    return any(row.get("name") == name for row in server.repository.index())


def needs_task(info: ModelInfo, task: str) -> None:
    """400 naming the model's tasks when it does not do `task`."""
    tasks = info.manifest.task
    if task not in tasks:
        raise RequestError(400, NEEDS_TASK.say(model=info.name, task=task, tasks=", ".join(tasks)))
