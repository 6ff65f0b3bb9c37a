"""Plain HTTP clients for tests and benchmarks: one request on its own connection (blocking),
and one keep-alive connection on asyncio streams."""

from __future__ import annotations

import asyncio
import http.client
import json
import ssl
from dataclasses import dataclass
from typing import Any

HOST = "127.0.0.1"  # benchmarks and tests never send traffic anywhere else


def http_request(
    port: int,
    method: str,
    path: str,
    body: bytes | str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60.0,
    host: str = HOST,
    context: ssl.SSLContext | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One request on its own connection: (status, headers with lower-case names, body); over
    TLS with a client `context` (a server started with --tls-cert)."""
    conn = (
        http.client.HTTPConnection(host, port, timeout=timeout)
        if context is None
        else http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
    )
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def get_json(port: int, path: str, timeout: float = 10.0, host: str = HOST) -> dict[str, Any]:
    status, _, body = http_request(port, "GET", path, timeout=timeout, host=host)
    if status != 200:
        raise RuntimeError(f"GET {path}: {status} {body[:200]!r}")
    doc: dict[str, Any] = json.loads(body)
    return doc


@dataclass
class HttpAnswer:
    status: int
    headers: dict[bytes, bytes]
    body: bytes


class HttpConn:
    """One keep-alive HTTP/1.1 connection on asyncio streams; one request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.closed = False

    @classmethod
    async def open(cls, port: int, host: str = HOST) -> HttpConn:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def call(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> HttpAnswer:
        self.writer.write(http_message(method, path, body, headers))
        return await self.read_answer()

    async def send(self, request: bytes) -> HttpAnswer:
        """A prebuilt request (http_message), written as is."""
        self.writer.write(request)
        return await self.read_answer()

    async def read_answer(self) -> HttpAnswer:
        head = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head[:-4].split(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        body = await self.reader.readexactly(int(headers.get(b"content-length", b"0")))
        if headers.get(b"connection", b"").lower() == b"close":
            self.close()
        return HttpAnswer(status, headers, body)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.writer.close()


def http_message(
    method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def classify_request(text: str, path: str = "/v1/classify") -> bytes:
    body = json.dumps({"text": text}).encode()
    return http_message("POST", path, body, {"Content-Type": "application/json"})
