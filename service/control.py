"""The Unix control socket: one JSON object a line in, one a line out, always with `ok`."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from typing import TYPE_CHECKING, Any

from service.auth import DENIED, control_ok
from service.handover import listening_fds, send_listeners

if TYPE_CHECKING:
    from service.app import Server


class ControlProtocol(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.limit = server.settings.max_control_line

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\n")
            if end < 0:
                break
            line = bytes(self.buffer[:end])
            del self.buffer[: end + 1]
            self.answer(self.handle(line))
        if len(self.buffer) > self.limit:
            self.answer({"ok": False, "error": f"line longer than {self.limit} bytes"})
            assert self.transport is not None
            self.transport.close()

    def answer(self, reply: dict[str, Any]) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        fds = reply.pop(FDS, None)
        line = json.dumps(reply).encode() + b"\n"
        if fds:
            send_listeners(self.transport, line, fds)
        else:
            self.transport.write(line)
            self.server.count("control", answer_code(reply))

    def handle(self, line: bytes) -> dict[str, Any]:
        if not line.strip():
            return {"ok": False, "error": "empty line"}
        try:
            doc = json.loads(line)
        except (ValueError, RecursionError):  # bad JSON or UTF-8, an integer over 4300 digits
            return {"ok": False, "error": "not a JSON object"}
        if not isinstance(doc, dict):
            return {"ok": False, "error": "not a JSON object"}
        if not control_ok(self.server.api_key, doc):
            return {"ok": False, "error": DENIED}
        cmd = doc.get("cmd")
        handler = COMMANDS.get(cmd) if isinstance(cmd, str) else None
        if handler is None:
            return {
                "ok": False,
                "error": f"unknown command: {str(cmd)[:100]!r}",
                "commands": sorted(COMMANDS),
            }
        try:
            return handler(self.server, doc)
        except (TypeError, ValueError) as exc:
            return {"ok": False, "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - the contract keeps the connection usable
            return {"ok": False, "error": f"internal error: {type(exc).__name__}"}


def answer_code(reply: dict[str, Any]) -> int:
    """The HTTP-like code a control answer is counted under in requests_total."""
    if reply.get("ok"):
        return 200
    return 401 if reply.get("error") == DENIED else 400


def _int_arg(doc: dict[str, Any], name: str) -> int:
    value = doc.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f'"{name}" must be an integer')
    return value


def cmd_status(server: Server, doc: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, **server.status()}


def cmd_restart(server: Server, doc: dict[str, Any]) -> dict[str, Any]:
    slot = _int_arg(doc, "worker")
    if server.draining:
        return {"ok": False, "error": "server is draining"}
    if not server.supervisor.restart(slot):
        return {"ok": False, "error": f"no serving worker with id {slot}"}
    return {"ok": True, "worker": slot}


def cmd_scale(server: Server, doc: dict[str, Any]) -> dict[str, Any]:
    n = _int_arg(doc, "workers")
    if not 1 <= n <= 256:
        return {"ok": False, "error": "workers must be between 1 and 256"}
    if server.draining:
        return {"ok": False, "error": "server is draining"}
    server.supervisor.scale(n)
    return {"ok": True, "workers": n}


def cmd_drain(server: Server, doc: dict[str, Any]) -> dict[str, Any]:
    server.request_stop("control")
    return {"ok": True, "draining": True}


def cmd_reload(server: Server, doc: dict[str, Any]) -> dict[str, Any]:
    error = server.reload("control")
    if error:
        return {"ok": False, "error": error}
    return {"ok": True, "generation": server.supervisor.generation}


def cmd_listeners(server: Server, doc: dict[str, Any]) -> dict[str, Any]:
    """Hand the listening sockets to a server upgrading beside this one (service.handover)."""
    if server.draining:
        return {"ok": False, "error": "server is draining: its listeners are closed"}
    names, fds = listening_fds(server)
    return {"ok": True, "listeners": names, FDS: fds}


COMMANDS = {
    "status": cmd_status,
    "restart": cmd_restart,
    "scale": cmd_scale,
    "drain": cmd_drain,
    "reload": cmd_reload,
    "listeners": cmd_listeners,
}
FDS = "_fds"  # a reply's descriptors, sent beside its line (never part of the JSON)


def socket_is_live(path: str) -> bool:
    """True when a server answers on this Unix socket (a killed one's leaves a dead file)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2.0)
        try:
            probe.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            return False
        except OSError:  # not a socket, no permission, a full backlog: leave it alone
            return True
    return True


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


async def start_control(server: Server, path: str) -> asyncio.AbstractServer:
    try:
        os.unlink(path)  # a socket left by a killed server (a live one was refused above)
    except FileNotFoundError:
        pass
    old = os.umask(0o177)
    try:
        srv = await asyncio.get_running_loop().create_unix_server(
            lambda: ControlProtocol(server), path
        )
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    return srv
