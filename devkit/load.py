"""Load for tests and benchmarks.

`run_load` is the benchmarks' closed loop, lean on purpose: each of `concurrency` tasks owns one
keep-alive connection (a bare Protocol, `_Answers`) and sends its next prebuilt request as soon
as the last answer is in, so the client spends little CPU on a machine it shares with the
server. `Load` is the tests' steady background load: client threads on keep-alive connections
(or a new connection a request), every answer kept; `GrpcLoad` is the same over gRPC.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import cast

from devkit.http import HOST


@dataclass
class LoadResult:
    concurrency: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    codes: Counter[int] = field(default_factory=Counter)

    @property
    def ok(self) -> int:
        return self.codes.get(200, 0)

    @property
    def failed(self) -> int:
        return sum(v for c, v in self.codes.items() if c != 200)

    @property
    def rps(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    def pct(self, p: float) -> float:
        return percentile(self.latencies_ms, p)

    def row(self) -> str:
        return (
            f"c={self.concurrency:<4} ok={self.ok:<6} rps={self.rps:8.1f} "
            f"p50={self.pct(50):7.1f}ms p99={self.pct(99):7.1f}ms codes={dict(self.codes)}"
        )


def percentile(xs: list[float], p: float) -> float:
    """The p-th percentile (0-100) by rank; NaN for no samples."""
    if not xs:
        return float("nan")
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


class _Answers(asyncio.Protocol):
    """A keep-alive connection of run_load's: send() writes a prebuilt request and returns a
    future that data_received resolves with (status, closing) once the answer is whole. A bare
    Protocol costs the load generator about half the CPU a request that asyncio streams do
    (StreamReader's readuntil and readexactly), CPU it takes from the cores the server shares."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.need = -1  # bytes of the answer under way, head and body; -1: its head is not in
        self.status = 0
        self.closing = False
        self.waiter: asyncio.Future[tuple[int, bool]] | None = None

    @classmethod
    async def open(cls, port: int) -> _Answers:
        _, conn = await asyncio.get_running_loop().create_connection(cls, HOST, port)
        return conn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def send(self, request: bytes) -> asyncio.Future[tuple[int, bool]]:
        self.waiter = waiter = asyncio.get_running_loop().create_future()
        if self.transport is None:  # the server closed it while idle
            waiter.set_exception(ConnectionResetError("the server closed the connection"))
        else:
            self.transport.write(request)
        return waiter

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        if self.need < 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self.buf = buf
                return
            head = buf[:end].lower()
            at = head.find(b"content-length:")
            stop = head.find(b"\r\n", at)
            try:
                self.status = int(head[9:12])
                length = int(head[at + 15 : end if stop < 0 else stop]) if at >= 0 else 0
            except ValueError as exc:
                self.fail(exc)
                return
            self.closing = b"connection: close" in head
            self.need = end + 4 + length
        if len(buf) < self.need:
            self.buf = buf
            return
        self.buf, self.need = buf[self.need :], -1
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((self.status, self.closing))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.fail(exc or ConnectionResetError("the server closed the connection"))

    def fail(self, exc: Exception) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None


async def _client(
    port: int, requests: list[bytes], offset: int, stop_at: float, limit: list[int], out: LoadResult
) -> None:
    conn: _Answers | None = None  # opened when a request is to go: none is left open unused
    i = offset
    try:
        while time.monotonic() < stop_at and limit[0] > 0:
            limit[0] -= 1
            req = requests[i % len(requests)]
            i += 1
            conn = conn or await _Answers.open(port)
            t0 = time.perf_counter()
            try:
                status, closing = await conn.send(req)
            except (OSError, ValueError):
                out.codes[0] += 1  # a broken connection counts as a failed request
                closing = True
            else:
                out.codes[status] += 1
                if status == 200:
                    out.latencies_ms.append((time.perf_counter() - t0) * 1000)
            if closing:
                conn.close()
                conn = None
    finally:
        if conn is not None:
            conn.close()


async def run_load(
    port: int,
    requests: list[bytes],
    concurrency: int,
    seconds: float,
    max_requests: int = 1_000_000,
    warmup_s: float = 1.0,
) -> LoadResult:
    """Closed-loop load of prebuilt requests for `seconds`, after an uncounted warm-up."""
    if warmup_s > 0:
        await run_load(port, requests, concurrency, warmup_s, max_requests, 0)
    result = LoadResult(concurrency, seconds)
    limit = [max_requests]
    t0 = time.monotonic()
    stop_at = t0 + seconds
    await asyncio.gather(
        *(_client(port, requests, k * 7919, stop_at, limit, result) for k in range(concurrency))
    )
    result.seconds = time.monotonic() - t0
    return result


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


class Load:
    """`clients` threads post /v1/classify in a loop until stop(); records every outcome.
    `fresh`: a new connection for every request, which sees every refused or reset connection
    that a keep-alive client would hide behind its open one."""

    def __init__(
        self,
        port: int,
        texts: list[str],
        clients: int = 6,
        batch: int = 1,
        pause_s: float = 0.0,
        fresh: bool = False,
        model: str | None = None,
    ) -> None:
        self.port = port
        self.fresh = fresh
        self.model = model  # the request's "model" (a server holding many); None: leave it out
        self.texts = texts
        self.batch = batch
        self.pause_s = pause_s  # after each answer: a paced load rather than flat out
        self.started = time.monotonic()
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.outcomes: Counter[str] = Counter()
        self.errors: list[str] = []
        self.resent = 0  # requests written again after the keep-alive race (never read)
        self.threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)
        ]

    def __enter__(self) -> Load:
        self.started = time.monotonic()
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self, index: int) -> None:
        conn: http.client.HTTPConnection | None = None
        i = index
        while not self.stop_event.is_set():
            i += len(self.threads)
            body = self.body(i)
            try:
                reused = conn is not None
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                try:
                    conn.request("POST", "/v1/classify", body)
                except (BrokenPipeError, ConnectionResetError):
                    if not reused:
                        raise
                    # The keep-alive race (docs/api.md, "Signals"): the server had closed this
                    # idle connection before the request could even be written, so it was never
                    # read; the client's to send again, on a new connection, once. A failure
                    # after the request went out still counts as failed.
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                    with self.lock:
                        self.resent += 1
                    conn.request("POST", "/v1/classify", body)
                resp = conn.getresponse()
                data = resp.read()
                key = str(resp.status)
                if resp.status != 200:
                    with self.lock:
                        self.errors.append(f"{resp.status} {data[:200]!r}")
                elif json.loads(data).get("label" if self.batch == 1 else "results") is None:
                    key = "bad-body"
            except (OSError, http.client.HTTPException) as exc:
                key = f"exception:{type(exc).__name__}"
                with self.lock:
                    self.errors.append(repr(exc))
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.05)  # a refused connection must not spin
            if self.fresh and conn is not None:
                conn.close()
                conn = None
            with self.lock:
                self.outcomes[key] += 1
            if self.pause_s:
                self.stop_event.wait(self.pause_s)
        if conn is not None:
            conn.close()

    def body(self, i: int) -> str:
        doc: dict[str, object]
        if self.batch == 1:
            doc = {"text": self.texts[i % len(self.texts)]}
        else:
            doc = {"texts": [self.texts[(i + k) % len(self.texts)] for k in range(self.batch)]}
        if self.model is not None:
            doc["model"] = self.model
        return json.dumps(doc)

    def ok(self) -> int:
        with self.lock:
            return self.outcomes["200"]

    def failed(self) -> int:
        with self.lock:
            return sum(v for k, v in self.outcomes.items() if k != "200")

    def answered(self) -> Counter[str]:
        """The statuses of the requests that got an answer (not the connection errors)."""
        with self.lock:
            return Counter({k: v for k, v in self.outcomes.items() if not k.startswith("exc")})

    def unanswered(self) -> Counter[str]:
        """Requests that got no answer, by exception."""
        with self.lock:
            return Counter({k: v for k, v in self.outcomes.items() if k.startswith("exc")})

    def wait_ok(self, more: int, timeout: float = 60.0) -> None:
        """Wait until `more` further requests have succeeded (proof the load is flowing)."""
        target = self.ok() + more
        deadline = time.monotonic() + timeout
        while self.ok() < target:
            if time.monotonic() > deadline:
                raise AssertionError(f"load stalled: {dict(self.outcomes)} {self.errors[:5]}")
            time.sleep(0.01)

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(90)


class GrpcLoad(Load):
    """The same load over gRPC: each client thread has its own tritonclient.grpc channel and
    calls ModelInfer in a loop. `fresh`: a new channel (a new connection) for every call, which
    sees every refused or reset connection that a long-lived channel would hide."""

    def __init__(
        self, port: int, model: str, texts: list[str], clients: int = 4, fresh: bool = False
    ) -> None:
        super().__init__(port, texts, clients, fresh=fresh)
        self.model = model

    def _run(self, index: int) -> None:
        import numpy as np
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        address = f"127.0.0.1:{self.port}"
        client = None
        i = index
        while not self.stop_event.is_set():
            i += len(self.threads)
            text = np.array([self.texts[i % len(self.texts)].encode()], dtype=object)
            inp = grpcclient.InferInput("text", [1], "BYTES")
            inp.set_data_from_numpy(text)
            try:
                if client is None:
                    client = grpcclient.InferenceServerClient(address)
                result = client.infer(self.model, [inp], client_timeout=60)
                labels = result.as_numpy("label")
                key = "200" if labels is not None and len(labels) == 1 else "bad-body"
            except InferenceServerException as exc:
                key = f"grpc:{exc.status()}"
                with self.lock:
                    self.errors.append(f"{exc.status()} {exc.message()}")
                self.stop_event.wait(0.05)  # a refused call must not spin
            if self.fresh and client is not None:
                client.close()
                client = None
            with self.lock:
                self.outcomes[key] += 1
        if client is not None:
            client.close()
