"""TLS on the TCP ports (--tls-cert, --tls-key, --tls-client-ca): the server's contexts, built
and checked once before anything starts, one a port kind for its ALPN.

TLS wraps at the asyncio level: a TlsListener accepts on the port's listening socket, bound or
handed over across a --reuse-port upgrade alike, and gives each connection to the loop's
`connect_accepted_socket` with the port's context. The protocols above see plain bytes: every
limit of theirs holds as before, counted from the end of the handshake (connection_made). The
handshake has limits of its own: it must end within --read-timeout-s, and at most
--max-connections of a port's connections are in one at once (past that, a new connection is
closed as it is accepted), since the loop's own TLS server would hold any number of them (about
52 KiB each, measured) until their timeout.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ringserve.service.config.settings import Config
from ringserve.service.logs import EventLog

# What each listener offers in ALPN: HTTP/1.1 on the HTTP and operator ports (a client that
# offers h2 too, as curl does, is answered http/1.1), h2 alone on the gRPC port (grpc clients
# require it), nothing on the binary port (no registered name; the client offers none).
ALPN = {"http": ["http/1.1"], "operator": ["http/1.1"], "grpc": ["h2"], "binary": []}


class TlsError(ValueError):
    """A certificate, key or CA file that cannot serve: which option, which file, and why."""


@dataclass(frozen=True)
class Tls:
    """The contexts of one server's listeners, by listener name (handover.listen's)."""

    contexts: dict[str, ssl.SSLContext]
    mutual: bool  # client certificates are required

    def context(self, listener: str) -> ssl.SSLContext:
        return self.contexts[listener]


def load_tls(settings: Config) -> Tls | None:
    """The contexts --tls-cert, --tls-key and --tls-client-ca ask for; None when TLS is off.
    Raises TlsError naming the option and the file."""
    cert, key, ca = settings.tls_cert, settings.tls_key, settings.tls_client_ca
    if cert is None and key is None:
        if ca is not None:
            raise TlsError("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if cert is None or key is None:
        raise TlsError("--tls-cert and --tls-key go together: give both")
    read_pem("--tls-cert", cert, "CERTIFICATE")
    if "ENCRYPTED" in read_pem("--tls-key", key, "PRIVATE KEY"):
        raise TlsError(f"--tls-key {key}: the key is encrypted; give it unencrypted (mode 0600)")
    if ca is not None:
        read_pem("--tls-client-ca", ca, "CERTIFICATE")
    contexts = {name: server_context(cert, key, ca, alpn) for name, alpn in ALPN.items()}
    return Tls(contexts, mutual=ca is not None)


def read_pem(option: str, path: str, label: str) -> str:
    """The file's text, checked to hold a PEM block of `label` (open's own error otherwise)."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError as exc:
        raise TlsError(f"{option} {path}: cannot read it: {exc.strerror or exc}") from None
    if f"-----BEGIN {label}" not in text and not (
        label == "PRIVATE KEY" and "PRIVATE KEY-----" in text  # BEGIN EC/RSA PRIVATE KEY
    ):
        raise TlsError(f"{option} {path}: no PEM {label} in it")
    return text


def server_context(cert: str, key: str, ca: str | None, alpn: list[str]) -> ssl.SSLContext:
    """A server context of Python's defaults (TLS 1.2 and up, no compression, the default
    ciphers), the chain and key loaded, client certificates required when `ca` is given."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(cert, key, password=refuse_password)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise TlsError(f"--tls-key {key} is not the key of --tls-cert {cert}") from None
        raise TlsError(f"--tls-cert {cert} with --tls-key {key}: cannot load them: {exc}") from None
    if ca is not None:
        try:
            ctx.load_verify_locations(cafile=ca)
        except ssl.SSLError as exc:
            raise TlsError(f"--tls-client-ca {ca}: cannot load it: {exc}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    if alpn:
        ctx.set_alpn_protocols(alpn)
    return ctx


def refuse_password() -> bytes:
    """Never prompt on the terminal for a key's pass phrase (OpenSSL would)."""
    raise TlsError("the key is encrypted; give it unencrypted")


ACCEPT_PAUSE_S = 0.1  # after an accept error such as EMFILE, before the next try
ACCEPTS_PER_TURN = 64  # then the loop's other work goes first (a flood of connects waits)


class TlsListener(asyncio.AbstractServer):
    """A listener whose connections speak TLS, with at most `settings.max_connections` of them
    in a handshake at once. `inner` is the loop's server holding the bound (or handed-over)
    sockets, not serving: this one accepts on them."""

    def __init__(
        self,
        name: str,
        inner: asyncio.AbstractServer,
        factory: Callable[[], asyncio.Protocol],
        context: ssl.SSLContext,
        settings: Config,
        backlog: int,
        log: EventLog,
    ) -> None:
        self.name, self.inner, self.factory, self.log = name, inner, factory, log
        self.cap = settings.max_connections
        self.wrap: dict[str, Any] = {
            "ssl": context,
            "ssl_handshake_timeout": settings.read_timeout_s,
            # a closing connection's last answers and close_notify, as a plain one's writes
            "ssl_shutdown_timeout": settings.write_timeout_s,
        }
        self.pending = 0  # connections in their handshake
        self.refused = 0  # closed at accept: the handshakes were at the cap
        self.full = False  # logged once a time the cap is reached
        self.handshakes: set[asyncio.Task[None]] = set()
        self.loop = asyncio.get_running_loop()
        self.accepting: list[tuple[socket.socket, asyncio.Task[None]]] = []
        for held in getattr(inner, "sockets", ()):
            sock = socket.socket(fileno=os.dup(held.fileno()))
            sock.setblocking(False)
            sock.listen(backlog)  # the loop's server bound it without listening
            self.accepting.append((sock, self.loop.create_task(self.accept(sock))))

    @property
    def sockets(self) -> Any:
        """The listening sockets (handover.listening_fds hands them over)."""
        return self.inner.sockets  # type: ignore[attr-defined]  # uvloop's and asyncio's alike

    async def accept(self, sock: socket.socket) -> None:
        accepted = 0
        while True:
            accepted += 1
            if accepted % ACCEPTS_PER_TURN == 0:
                await asyncio.sleep(0)
            try:
                conn, _ = await self.loop.sock_accept(sock)
            except OSError as exc:  # out of descriptors, or a connection reset while queued
                if exc.errno not in (errno.ECONNABORTED, errno.EPROTO):
                    self.log.warning("accept_failed", listener=self.name, error=repr(exc))
                    await asyncio.sleep(ACCEPT_PAUSE_S)
                continue
            if self.pending >= self.cap:
                self.refused += 1
                if not self.full:
                    self.full = True
                    self.log.warning("tls_handshakes_full", listener=self.name, limit=self.cap)
                conn.close()
                continue
            self.pending += 1
            task = self.loop.create_task(self.handshake(conn))
            self.handshakes.add(task)
            task.add_done_callback(self.handshakes.discard)

    async def handshake(self, conn: socket.socket) -> None:
        """The loop wraps the connection and, once the handshake is done, calls the protocol's
        connection_made; a failed or slow handshake closes the connection (the loop's log
        says why at debug level)."""
        try:
            await self.loop.connect_accepted_socket(self.factory, conn, **self.wrap)
        except OSError:  # ssl.SSLError, ConnectionAbortedError (the timeout), a reset
            conn.close()  # the loop detached it already: nothing to close twice
        finally:
            self.pending -= 1
            if self.pending < self.cap // 2:
                self.full = False

    def close(self) -> None:
        """Stop accepting; connections in a handshake finish it (as the loop's own server
        leaves its accepted connections be)."""
        for sock, task in self.accepting:
            task.cancel()
            sock.close()
        self.accepting = []
        self.inner.close()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self.loop

    def is_serving(self) -> bool:
        return bool(self.accepting)

    async def start_serving(self) -> None:
        return None  # serving from construction

    async def serve_forever(self) -> None:
        raise NotImplementedError("a TlsListener serves from its construction")

    async def wait_closed(self) -> None:
        await self.inner.wait_closed()
