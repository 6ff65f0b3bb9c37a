"""A client for ringserve's framed binary protocol: send many frames, gather answers by tag.

with BinaryClient("127.0.0.1", 8001) as client:          # key: RINGSERVE_API_KEY, or api_key=
    answer = client.classify("a gripping film")        # Answer(tag, status, label_id, scores)
    answers = client.classify_many(texts)               # pipelined, in the order of `texts`
    client.select_model("nli")                          # the frames after it are for model nli

async with await AsyncBinaryClient.connect("127.0.0.1", 8001) as client:
    answers = await asyncio.gather(*(client.classify(t) for t in texts))  # one connection

A server started with --tls-cert speaks TLS on the port: pass `ssl=` an SSLContext that trusts
its CA (`ssl.create_default_context(cafile=...)`, with `load_cert_chain` for mutual TLS), or
True for the system's CAs, to either client.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import selectors
import socket
import time
from collections.abc import Iterable
from ssl import SSLContext, SSLSocket, SSLWantReadError, SSLWantWriteError, create_default_context
from types import TracebackType

from ringserve.wire.frames import OK, Answer, AnswerParser, auth_frame, encode_frame, model_frame

__all__ = [
    "Answer",
    "AsyncBinaryClient",
    "AuthError",
    "BinaryClient",
    "ProtocolError",
    "UnknownModelError",
]
API_KEY_ENV = "RINGSERVE_API_KEY"
# Bytes handed to one send: a TLS record's worth over TLS (a write OpenSSL could not finish must be
# retried with the same bytes, so smaller is simpler), more in the clear.
SEND_CHUNK, TLS_SEND_CHUNK = 1 << 20, 1 << 14


class ProtocolError(ConnectionError):
    """The server sent something the protocol does not allow (an unknown or repeated tag)."""


class AuthError(ConnectionError):
    """The server closed the connection on our `AUTH KEY` frame: no key, or the wrong one."""


class UnknownModelError(LookupError):
    """The server holds no such model (its answer to `MODEL name[:version]` was status 5); the
    connection's frames answer status 5 until another model is selected."""


def selected(answer: Answer, name: str, version: int | str | None) -> Answer:
    if answer.tag != 0:
        raise ProtocolError(f"unexpected answer to MODEL: {answer}")
    if not answer.ok:
        which = name if version is None else f"{name} version {version}"
        raise UnknownModelError(f"the server holds no model {which} ({answer.status_name})")
    return answer


def resolve_key(given: str | None) -> str | None:
    """The key to present: the one given, else RINGSERVE_API_KEY, else none."""
    return given if given is not None else os.environ.get(API_KEY_ENV) or None


def tls_context(given: SSLContext | bool | None) -> SSLContext | None:
    """`ssl=`: a context as given, True for the system's CAs, None or False for plain TCP."""
    if given is True:
        return create_default_context()
    return given or None


class BinaryClient:
    """A blocking client on one connection. Not thread-safe: one per thread."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8001,
        timeout: float = 60.0,
        api_key: str | None = None,
        ssl: SSLContext | bool | None = None,
        server_hostname: str | None = None,
    ) -> None:
        """`ssl`: speak TLS (a server with --tls-cert); `server_hostname`: the name its
        certificate is checked against (default: `host`)."""
        self.timeout = timeout
        raw = socket.create_connection((host, port), timeout=timeout)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        context = tls_context(ssl)
        self.sock: socket.socket = raw
        if context is not None:
            try:  # the handshake, blocking, within `timeout`
                self.sock = context.wrap_socket(raw, server_hostname=server_hostname or host)
            except BaseException:
                raw.close()
                raise
        self.chunk = SEND_CHUNK if context is None else TLS_SEND_CHUNK
        self.parser = AnswerParser()
        self.tags = itertools.count(1)  # tag 0 is the AUTH frame's
        key = resolve_key(api_key)
        if key:
            self._authenticate(key)

    def _authenticate(self, key: str) -> None:
        self.sock.sendall(auth_frame(key))
        answers: list[Answer] = []
        while not answers:
            try:
                chunk = self.sock.recv(1 << 16)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self.sock.close()
                raise AuthError("the server refused the API key (connection closed)")
            answers = self.parser.feed(chunk)
        if answers[0].tag != 0 or answers[0].status != OK:
            raise ProtocolError(f"unexpected answer to AUTH: {answers[0]}")

    def select_model(self, name: str, version: int | str | None = None) -> Answer:
        """Send `MODEL name[:version]`: the frames after it are for that model (else the only
        one loaded). Raises UnknownModelError when the server holds no such model."""
        return selected(self._exchange(model_frame(name, version), {0})[0], name, version)

    def classify(self, text: str | bytes) -> Answer:
        return self.classify_many([text])[0]

    def classify_many(self, texts: Iterable[str | bytes]) -> list[Answer]:
        """Send every frame, pipelined, while reading answers; return them in text order."""
        tags = []
        frames = []
        for text in texts:
            tag = next(self.tags)
            tags.append(tag)
            frames.append(encode_frame(text, tag))
        got = self._exchange(b"".join(frames), set(tags))
        return [got[t] for t in tags]

    def _exchange(self, data: bytes, tags: set[int]) -> dict[int, Answer]:
        # Send and receive together: a server that pauses reading until its answers are read
        # would deadlock a client that sends everything first.
        got: dict[int, Answer] = {}
        view = memoryview(data)
        sent = 0
        deadline = time.monotonic() + self.timeout
        self.sock.setblocking(False)
        with selectors.DefaultSelector() as sel:
            sel.register(self.sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
            try:
                while len(got) < len(tags):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"{len(tags) - len(got)} answers still owed")
                    for _key, events in sel.select(left):
                        if events & selectors.EVENT_WRITE and sent < len(data):
                            sent += self._send(view[sent : sent + self.chunk])
                            if sent == len(data):
                                sel.modify(self.sock, selectors.EVENT_READ)
                        if events & selectors.EVENT_READ:
                            self._receive(tags, got)
            finally:
                self.sock.settimeout(self.timeout)
        return got

    def _send(self, data: memoryview) -> int:
        try:
            return self.sock.send(data)
        except (BlockingIOError, SSLWantWriteError, SSLWantReadError):
            return 0

    def _receive(self, tags: set[int], got: dict[int, Answer]) -> None:
        try:
            chunk = self.sock.recv(1 << 18)
            # TLS: what OpenSSL has decrypted already wakes no selector; read it now.
            while chunk and isinstance(self.sock, SSLSocket) and self.sock.pending():
                chunk += self.sock.recv(self.sock.pending())
        except (BlockingIOError, SSLWantReadError, SSLWantWriteError):
            return
        if not chunk:
            raise ConnectionError(f"connection closed with {len(tags) - len(got)} answers owed")
        for answer in self.parser.feed(chunk):
            if answer.tag not in tags or answer.tag in got:
                raise ProtocolError(f"unexpected answer for tag {answer.tag}")
            got[answer.tag] = answer

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> BinaryClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class _Connection(asyncio.Protocol):
    """The asyncio side: routes each answer to the future waiting on its tag."""

    def __init__(self) -> None:
        self.parser = AnswerParser()
        self.pending: dict[int, asyncio.Future[Answer]] = {}
        self.transport: asyncio.Transport | None = None
        self.writable = asyncio.Event()
        self.writable.set()
        self.lost: BaseException | None = None
        self.gone = asyncio.Event()  # connection_lost came: the socket is closed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        for answer in self.parser.feed(data):
            future = self.pending.pop(answer.tag, None)
            if future is None:
                self._fail(ProtocolError(f"unexpected answer for tag {answer.tag}"))
                return
            if not future.done():
                future.set_result(answer)

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionError("connection closed by the server"))
        self.writable.set()  # wake writers so that they see the loss
        self.gone.set()

    def _fail(self, exc: BaseException) -> None:
        self.lost = exc
        for future in self.pending.values():
            if not future.done():
                future.set_exception(exc)
        self.pending.clear()
        if self.transport is not None:
            self.transport.close()


class AsyncBinaryClient:
    """An asyncio client on one connection; classify() may be awaited from many tasks at once."""

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn
        self.tags = itertools.count(1)

    @classmethod
    async def connect(
        cls,
        host: str = "127.0.0.1",
        port: int = 8001,
        api_key: str | None = None,
        ssl: SSLContext | bool | None = None,
        server_hostname: str | None = None,
    ) -> AsyncBinaryClient:
        """Connect (over TLS with `ssl`, as BinaryClient), and present the key (given, else
        RINGSERVE_API_KEY) when there is one."""
        loop = asyncio.get_running_loop()
        context = tls_context(ssl)
        name = (server_hostname or host) if context is not None else None
        _, conn = await loop.create_connection(
            _Connection, host, port, ssl=context, server_hostname=name
        )
        key = resolve_key(api_key)
        if key and conn.transport is not None:
            future: asyncio.Future[Answer] = loop.create_future()
            conn.pending[0] = future
            conn.transport.write(auth_frame(key))
            try:
                answer = await future
            except ConnectionError:
                raise AuthError("the server refused the API key (connection closed)") from None
            if answer.status != OK:
                raise ProtocolError(f"unexpected answer to AUTH: {answer}")
        return cls(conn)

    async def select_model(self, name: str, version: int | str | None = None) -> Answer:
        """As BinaryClient.select_model: the frames written after it are for that model (the
        server reads the stream in order); one selection at a time."""
        conn = self.conn
        if conn.lost is not None or conn.transport is None:
            raise ConnectionError("connection is closed") from conn.lost
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        conn.pending[0] = future
        conn.transport.write(model_frame(name, version))
        return selected(await future, name, version)

    async def classify(self, text: str | bytes) -> Answer:
        conn = self.conn
        if not conn.writable.is_set():
            await conn.writable.wait()  # the server reads slower than we write: wait
        if conn.lost is not None or conn.transport is None:
            raise ConnectionError("connection is closed") from conn.lost
        tag = next(self.tags)
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        conn.pending[tag] = future
        conn.transport.write(encode_frame(text, tag))
        return await future

    async def classify_many(self, texts: Iterable[str | bytes]) -> list[Answer]:
        return list(await asyncio.gather(*(self.classify(t) for t in texts)))

    async def close(self, timeout: float = 5.0) -> None:
        """Close, and wait until the socket is (over TLS, after the close_notify exchange;
        aborted past `timeout`)."""
        transport = self.conn.transport
        if transport is None:
            return
        transport.close()
        try:
            await asyncio.wait_for(self.conn.gone.wait(), timeout)
        except TimeoutError:
            transport.abort()
            await asyncio.sleep(0)

    async def __aenter__(self) -> AsyncBinaryClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
