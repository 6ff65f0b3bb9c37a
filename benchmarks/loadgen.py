"""A lean closed-loop HTTP load generator on asyncio/uvloop for /v1/classify.

Each of `concurrency` tasks owns one keep-alive connection and sends its next request as soon as
the answer to the last one is in. Requests are prebuilt bytes and answers are framed by
Content-Length alone, so the client spends little CPU on a machine it shares with the server.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field


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
    def rps(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    def pct(self, p: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        xs = sorted(self.latencies_ms)
        return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]

    def row(self) -> str:
        return (
            f"c={self.concurrency:<4} ok={self.ok:<6} rps={self.rps:8.1f} "
            f"p50={self.pct(50):7.1f}ms p99={self.pct(99):7.1f}ms codes={dict(self.codes)}"
        )


def classify_request(text: str, path: str = "/v1/classify") -> bytes:
    body = json.dumps({"text": text}).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    body = await reader.readexactly(length) if length else b""
    return status, body


async def _client(
    host: str,
    port: int,
    requests: list[bytes],
    offset: int,
    stop_at: float,
    limit: list[int],
    result: LoadResult,
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    i = offset
    try:
        while time.monotonic() < stop_at and limit[0] > 0:
            limit[0] -= 1
            req = requests[i % len(requests)]
            i += 1
            t0 = time.perf_counter()
            try:
                writer.write(req)
                status, _ = await read_response(reader)
            except (OSError, asyncio.IncompleteReadError, ValueError):
                result.codes[0] += 1  # a broken connection counts as a failed request
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
                continue
            result.codes[status] += 1
            if status == 200:
                result.latencies_ms.append((time.perf_counter() - t0) * 1000)
    finally:
        writer.close()


async def run_load(
    host: str,
    port: int,
    requests: list[bytes],
    concurrency: int,
    seconds: float,
    max_requests: int = 1_000_000,
    warmup_s: float = 1.0,
) -> LoadResult:
    """Closed-loop load for `seconds` (after a warm-up that is not counted)."""
    if warmup_s > 0:
        await run_load(host, port, requests, concurrency, warmup_s, max_requests, 0)
    result = LoadResult(concurrency, seconds)
    limit = [max_requests]
    t0 = time.monotonic()
    stop_at = t0 + seconds
    await asyncio.gather(
        *(
            _client(host, port, requests, k * 7919, stop_at, limit, result)
            for k in range(concurrency)
        )
    )
    result.seconds = time.monotonic() - t0
    return result


def summary(results: list[LoadResult]) -> str:
    return "\n".join(r.row() for r in results)


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")
