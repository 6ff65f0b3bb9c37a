"""Listening sockets: bound here, or handed over by the server being upgraded (SCM_RIGHTS).

With --reuse-port two servers share a port, each with its own listener and accept queue. When
the old one closes its listener, the connections waiting in that queue are reset unless
net.ipv4.tcp_migrate_req=1 (measured by benchmarks/reuseport_queue.py: 109 of 200 reset). So a
server started beside a live one first asks it, over the control socket, for its listening
sockets, as HAProxy's `expose-fd listeners` and Envoy's hot restart do. The socket then lives on
in the new server when the old one closes its copy; nothing queued is lost, whatever the sysctl.

With --tls-cert, `listen` serves TLS on the socket, bound or handed over alike: the listening
socket is plain TCP, and each accepted connection is wrapped by the loop (protocols/tls.py).
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import socket
from collections.abc import Callable
from typing import Protocol

from ringserve.service.config.settings import Config
from ringserve.service.logs import EventLog
from ringserve.service.protocols.tls import Tls, TlsListener


class Listeners(Protocol):
    """What opening and handing over listeners needs of the server (service/ports.py's Ports)."""

    @property
    def settings(self) -> Config: ...
    @property
    def log(self) -> EventLog: ...
    @property
    def bound(self) -> dict[str, asyncio.AbstractServer]: ...  # by name, to hand over
    @property
    def inherited(self) -> dict[str, socket.socket]: ...  # handed over to us
    @property
    def tls(self) -> Tls | None: ...  # --tls-cert: every listener speaks TLS


MAX_FDS = 8


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


def live_peer(path: str, own: str) -> str | None:
    """The control socket of a live server on our ports: PATH, or PATH.<pid> of one that was
    itself started beside another (blue/green upgrades alternate between the two)."""
    for candidate in [path, *sorted(glob.glob(glob.escape(path) + ".*"))]:
        if candidate != own and socket_is_live(candidate):
            return candidate
    return None


def fetch_listeners(
    path: str, key: str | None = None, timeout: float = 5.0
) -> dict[str, socket.socket]:
    """Ask the live server on `path` for its listening sockets; {} when it cannot give them.
    `key`: our --api-key, which a keyed server wants on its control socket too."""
    request = {"cmd": "listeners", **({"key": key} if key else {})}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as ctl:
        ctl.settimeout(timeout)
        try:
            ctl.connect(path)
            ctl.sendall(json.dumps(request).encode() + b"\n")
            data, fds, _, _ = socket.recv_fds(ctl, 65536, MAX_FDS)
        except OSError:
            return {}
    socks = [socket.socket(fileno=fd) for fd in fds]
    try:
        reply = json.loads(data.split(b"\n", 1)[0])
        names = reply.get("listeners", []) if reply.get("ok") else []
    except ValueError:
        names = []
    if len(names) != len(socks):  # an older server, or a garbled answer: bind our own
        for s in socks:
            s.close()
        return {}
    return dict(zip(names, socks, strict=True))


def send_listeners(transport: asyncio.BaseTransport, line: bytes, fds: list[int]) -> None:
    """Write one answer line with `fds` attached (asyncio transports cannot send ancillary data,
    so through a duplicate of the connection's descriptor; the peer waits for this one line)."""
    raw = transport.get_extra_info("socket")
    with socket.socket(fileno=os.dup(raw.fileno())) as dup:
        dup.setblocking(True)
        socket.send_fds(dup, [line], fds)


def listening_fds(server: Listeners) -> tuple[list[str], list[int]]:
    names, fds = [], []
    for name, listener in server.bound.items():
        for sock in getattr(listener, "sockets", ()):  # asyncio.Server and uvloop's alike
            names.append(name)
            fds.append(sock.fileno())
    return names, fds


async def listen(
    server: Listeners,
    name: str,
    factory: Callable[[], asyncio.Protocol],
    host: str,
    port: int,
    backlog: int,
) -> asyncio.AbstractServer:
    """Serve on the socket handed over for `name` when it is bound where we would bind; else bind
    (with SO_REUSEPORT under --reuse-port). With TLS the loop's server holds the socket and a
    TlsListener accepts on it (protocols/tls.py)."""
    loop = asyncio.get_running_loop()
    tls = server.tls
    sock = server.inherited.pop(name, None)
    listener: asyncio.AbstractServer
    if sock is not None and sock.getsockname()[1] == port:
        listener = await loop.create_server(
            factory, sock=sock, backlog=backlog, start_serving=tls is None
        )
        server.log.info("listener_handed_over", name=name, port=port)
    else:
        if sock is not None:
            sock.close()
        try:
            listener = await loop.create_server(
                factory,
                host,
                port,
                reuse_address=True,
                reuse_port=server.settings.reuse_port or None,
                backlog=backlog,
                start_serving=tls is None,
            )
        except OSError as exc:  # a port in use, an address not ours: said, not a traceback
            why = exc.strerror or str(exc)
            raise SystemExit(
                f"ringserve: cannot listen for {name} on {host}:{port}: {why}"
            ) from None
    if tls is not None:  # the loop's server holds the socket; this one accepts on it
        s, log = server.settings, server.log
        listener = TlsListener(name, listener, factory, tls.context(name), s, backlog, log)
    server.bound[name] = listener
    return listener
