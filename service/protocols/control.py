"""The Unix control socket: one JSON object a line in, one a line out, always with `ok`."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, cast

import msgspec
from ringserve.service.protocols.auth import DENIED, ApiKey, control_ok
from ringserve.service.protocols.handover import send_listeners, socket_is_live
from ringserve.service.protocols.readgate import LOST, PIPELINE_FULL, ReadGate
from ringserve.service.protocols.schemas import control as commands
from ringserve.service.protocols.schemas import message

Reply = dict[str, Any]


class Admin(Protocol):
    """What the control socket may do to the server (service/lifecycle.py's Admin): each method
    answers the error, if any."""

    def status(self) -> dict[str, Any]: ...
    def restart(self, slot: int) -> str | None: ...
    def scale(self, workers: int) -> str | None: ...
    def stop(self, reason: str) -> None: ...  # drain, as SIGTERM
    async def reload(self, reason: str) -> str | None: ...
    def generation(self) -> int: ...
    def handover_sockets(self) -> tuple[list[str], list[int]] | str: ...
    def models(self) -> list[dict[str, str]]: ...  # the repository index
    async def load(self, name: str, version: int | str | None) -> tuple[int, str] | None: ...
    async def unload(self, name: str) -> tuple[int, str] | None: ...


class ControlProtocol(asyncio.Protocol):
    def __init__(
        self,
        admin: Admin,
        key: ApiKey | None,
        count: Callable[[str, int], None],
        limit: int,
    ) -> None:
        self.admin = admin
        self.key = key
        self.count = count  # requests_total, as every protocol counts its answers
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.limit = limit
        self.waiting: asyncio.Future[Reply] | None = None  # a command still working (reload)
        self.gate = ReadGate()  # paused while a command works: one answer owed at a time

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self.gate.attach(self.transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self.serve_lines()

    def serve_lines(self) -> None:
        """Answer each whole line, in order. A command that works off the loop holds the lines
        after it (reading pauses meanwhile), so answers keep the order of their requests."""
        while self.waiting is None:
            end = self.buffer.find(b"\n")
            if end < 0:
                break
            line = bytes(self.buffer[:end])
            del self.buffer[: end + 1]
            reply = self.handle(line)
            if isinstance(reply, dict):
                self.answer(reply)
            else:
                self.waiting = asyncio.ensure_future(reply)
                self.waiting.add_done_callback(self.answer_later)
                self.gate.pause(PIPELINE_FULL)
        if self.waiting is None and len(self.buffer) > self.limit:
            self.answer({"ok": False, "error": f"line longer than {self.limit} bytes"})
            assert self.transport is not None
            self.gate.pause(LOST)
            self.transport.close()

    def answer_later(self, done: asyncio.Future[Reply]) -> None:
        self.waiting = None
        if done.cancelled():
            self.answer({"ok": False, "error": "cancelled: the server is stopping"})
            return
        self.answer(done.result())
        if self.transport is not None and not self.transport.is_closing():
            self.gate.resume(PIPELINE_FULL)
            self.serve_lines()

    def connection_lost(self, exc: Exception | None) -> None:
        self.gate.pause(LOST)
        self.transport = None

    def answer(self, reply: dict[str, Any]) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        fds = reply.pop(FDS, None)
        line = json.dumps(reply).encode() + b"\n"
        if fds:
            send_listeners(self.transport, line, fds)
        else:
            self.transport.write(line)
        self.count("control", answer_code(reply))

    def handle(self, line: bytes) -> Reply | Awaitable[Reply]:
        if not line.strip():
            return {"ok": False, "error": "empty line"}
        try:
            keyed = msgspec.json.decode(line, type=commands.Keyed)
        except msgspec.MsgspecError:  # bad JSON or UTF-8, not an object
            return {"ok": False, "error": "not a JSON object"}
        if not control_ok(self.key, {"key": keyed.key}):
            return {"ok": False, "error": DENIED}
        try:
            command = msgspec.json.decode(line, type=commands.Any_)
        except msgspec.ValidationError as exc:
            return refusal(str(exc))
        handler = COMMANDS[type(command).__struct_config__.tag]  # type: ignore[index]
        try:
            reply = handler(self.admin, command)
        except Exception as exc:  # noqa: BLE001 - the contract keeps the connection usable
            return failure(exc)
        return reply if isinstance(reply, dict) else guarded(reply)


def refusal(problem: str) -> Reply:
    """A command its Struct refuses: an unknown one lists those there are."""
    if "`$.cmd`" in problem or "field `cmd`" in problem:
        return {"ok": False, "error": f"unknown command: {problem}", "commands": sorted(COMMANDS)}
    return {"ok": False, "error": message(problem)}


def failure(exc: Exception) -> Reply:
    if isinstance(exc, TypeError | ValueError):
        return {"ok": False, "error": str(exc)}
    return {"ok": False, "error": f"internal error: {type(exc).__name__}"}


async def guarded(work: Awaitable[Reply]) -> Reply:
    try:
        return await work
    except Exception as exc:  # noqa: BLE001 - as handle(): every failure is an answer
        return failure(exc)


def answer_code(reply: dict[str, Any]) -> int:
    """The HTTP-like code a control answer is counted under in requests_total."""
    if reply.get("ok"):
        return 200
    code = reply.get("code")
    if isinstance(code, int):
        return code
    return 401 if reply.get("error") == DENIED else 400


def cmd_status(admin: Admin, c: commands.Status) -> Reply:
    """The server, its model and each worker process (docs/api.md, Control socket)."""
    return {"ok": True, **admin.status()}


def cmd_restart(admin: Admin, c: commands.Restart) -> Reply:
    """Replace the worker in slot `worker` by a new process; nothing in flight is lost."""
    error = admin.restart(c.worker)
    return {"ok": False, "error": error} if error else {"ok": True, "worker": c.worker}


def cmd_scale(admin: Admin, c: commands.Scale) -> Reply:
    """Grow or shrink the pool to `workers` serving workers."""
    n = c.workers
    error = admin.scale(n)
    return {"ok": False, "error": error} if error else {"ok": True, "workers": n}


def cmd_drain(admin: Admin, c: commands.Drain) -> Reply:
    """Drain and stop, as SIGTERM."""
    admin.stop("control")
    return {"ok": True, "draining": True}


async def cmd_reload(admin: Admin, c: commands.Reload) -> Reply:
    """Reload the artifact, as SIGHUP; answered once it is verified, with the new `generation`."""
    error = await admin.reload("control")
    if error:
        return {"ok": False, "error": error}
    return {"ok": True, "generation": admin.generation()}


def cmd_models(admin: Admin, c: commands.Models) -> Reply:
    """The model repository's index, as `POST /v2/repository/index` answers it."""
    return {"ok": True, "models": admin.models()}


def refused(error: tuple[int, str]) -> Reply:
    return {"ok": False, "code": error[0], "error": error[1]}


async def cmd_load(admin: Admin, c: commands.Load) -> Reply:
    """Load `model` (`version`, else the highest) from the repository (`--model-control explicit`);
    answered once its workers serve."""
    name = c.model
    error = await admin.load(name, c.version)
    return refused(error) if error else {"ok": True, "model": name, "models": admin.models()}


async def cmd_unload(admin: Admin, c: commands.Unload) -> Reply:
    """Unload `model` (`--model-control explicit`): new requests for it get 404, what was
    admitted is answered, then the workers roll onto the other models."""
    name = c.model
    error = await admin.unload(name)
    return refused(error) if error else {"ok": True, "model": name, "models": admin.models()}


def cmd_listeners(admin: Admin, c: commands.Listeners) -> Reply:
    """Hand the listening sockets to a server upgrading beside this one on a --reuse-port
    upgrade (service/protocols/handover.py)."""
    found = admin.handover_sockets()
    if isinstance(found, str):
        return {"ok": False, "error": found}
    names, fds = found
    return {"ok": True, "listeners": names, FDS: fds}


Command = Callable[[Admin, Any], Reply | Awaitable[Reply]]
COMMANDS: dict[str, Command] = {
    "status": cmd_status,
    "restart": cmd_restart,
    "scale": cmd_scale,
    "drain": cmd_drain,
    "reload": cmd_reload,
    "listeners": cmd_listeners,
    "models": cmd_models,
    "load": cmd_load,
    "unload": cmd_unload,
}
FDS = "_fds"  # a reply's descriptors, sent beside its line (never part of the JSON)


def choose_control_path(path: str, reuse_port: bool) -> str:
    """Never take over a live server's socket: with --reuse-port (an upgrade beside it) use
    PATH.<pid>, else refuse to start. A dead server's socket is taken over."""
    if not socket_is_live(path):
        return path
    if reuse_port:
        return f"{path}.{os.getpid()}"
    raise SystemExit(
        f"ringserve: control socket {path} belongs to a running server; stop it first, "
        "choose another --control, or start beside it with --reuse-port"
    )


async def start_control(path: str, make: Callable[[], ControlProtocol]) -> asyncio.AbstractServer:
    try:
        os.unlink(path)  # a socket left by a killed server (a live one was refused above)
    except FileNotFoundError:
        pass
    old = os.umask(0o177)
    try:
        srv = await asyncio.get_running_loop().create_unix_server(make, path)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    return srv
