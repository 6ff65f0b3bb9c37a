"""The control socket's commands (service/protocols/control.py): one JSON object a line, its
`cmd` naming the command (a msgspec tagged union: one decode reads the command and its
arguments); `key` is the server's API key when it has one, read first."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta, Struct

Name = Annotated[str, Meta(min_length=1)]


class Keyed(Struct):
    key: Any = None  # checked before the command is read (auth.control_ok)


class Command(Struct, tag_field="cmd", kw_only=True):
    key: Any = None


class Status(Command, tag="status"):
    pass


class Restart(Command, tag="restart"):
    worker: Annotated[int, Meta(ge=0)]  # the slot


class Scale(Command, tag="scale"):
    workers: Annotated[int, Meta(ge=1, le=256)]


class Drain(Command, tag="drain"):
    pass


class Reload(Command, tag="reload"):
    pass


class Listeners(Command, tag="listeners"):
    pass


class Models(Command, tag="models"):
    pass


class Load(Command, tag="load"):
    model: Name
    version: int | str | None = None  # else the highest


class Unload(Command, tag="unload"):
    model: Name


Any_ = Status | Restart | Scale | Drain | Reload | Listeners | Models | Load | Unload
