"""A raw HTTP/1.1 client that sends exactly the bytes it is given and reads the answers as they
come (tests/system/test_hostile.py, test_http_edges.py, test_clients_left.py): byte-level tests
of what a server does with what no well-behaved client sends."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass


@dataclass
class Resp:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> object:
        return json.loads(self.body)


class Raw:
    def __init__(self, port: int, timeout: float = 20.0, source: str | None = None) -> None:
        """`source`: the client address to connect from (any of 127.0.0.0/8 on loopback)."""
        where = (source, 0) if source is not None else None
        self.sock = socket.create_connection(("127.0.0.1", port), timeout, where)
        self.buf = b""

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> bool:
        """Send all of data; False when the server already closed (its answer may be waiting)."""
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            return False
        return True

    def _fill(self) -> bool:
        try:
            chunk = self.sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        self.buf += chunk
        return bool(chunk)

    def response(self, head_only: bool = False) -> Resp:
        while b"\r\n\r\n" not in self.buf:
            assert self._fill(), f"connection closed before an answer; got {self.buf[:200]!r}"
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            assert name.lower() not in headers, f"duplicate header {name}"
            headers[name.lower()] = value.strip()
        length = 0 if head_only else int(headers.get("content-length", "0"))
        while len(self.buf) < length:
            assert self._fill(), "connection closed in the middle of an answer body"
        body, self.buf = self.buf[:length], self.buf[length:]
        return Resp(int(status_line.split(" ", 2)[1]), headers, body)

    def closed_by_server(self) -> bool:
        """True once the server closed the connection (EOF or reset) with nothing more sent."""
        try:
            while self._fill():
                pass
        except TimeoutError:
            return False
        return True
