"""Requests per second and P50/P99 latency for the same texts over every protocol ringserve speaks.

One run measures /v1/classify, KServe v2 with JSON tensors, KServe v2 with binary tensors, the
framed binary protocol and KServe v2 over gRPC, each at concurrency 1, 32 and 64, one SST-2
sentence per request, against a server it starts itself (or --url/--binary-port/--grpc-port of
a running one), and prints a table.

The client is one asyncio (uvloop) process, closed loop: each of `concurrency` tasks sends its
next request when the last answer is in. Requests are encoded before the clock starts and
answers are framed (Content-Length, or the binary answer's length) but not decoded, so the client
costs little CPU on a machine it shares with the server; its CPU share is printed with each cell,
and so is the server front-end's CPU time per request (what the protocol itself costs there).
HTTP tasks each own a keep-alive connection; binary-protocol tasks share one connection, as that
protocol is meant to be used (pipelined, answers matched by tag); gRPC tasks share one channel
(grpc.aio, one HTTP/2 connection, calls multiplexed), as tritonclient.grpc users do, with each
ModelInferRequest built by tritonclient's own messages (raw contents, as tritonclient sends).
grpc.aio's client costs several times the HTTP client's CPU a call, on the cores the server
needs, so `grpc-lean` sends the same requests from a hand-written HTTP/2 client as lean as the
HTTP one (LeanGrpc: one connection, calls multiplexed, headers HPACK-indexed as grpc's clients
send them); the table says which is which.
The server's CPU per request is counted twice: the front-end alone (where the protocols differ)
and the whole server (front-end, zygote and workers).

    python -m benchmarks.protocols [--duration 10] [--max-requests 4000] [--concurrency 1,32,64]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import resource
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from statistics import median
from typing import Any
from urllib.parse import urlsplit

import psutil
from ringserve.wire.client import AsyncBinaryClient
from ringserve.wire.frames import LENGTH

from devkit.http import HttpConn, classify_request, get_json, http_message
from devkit.launcher import SST2, Launched, load_texts
from devkit.load import percentile

PROTOCOLS = ("http", "kserve-json", "kserve-binary", "binary", "grpc", "grpc-lean")
GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"
IDLE_S = 3.0  # how long the idle front-end's own CPU use is measured before the cells


# -- requests, encoded before the clock starts ----------------------------------------------------
def encode_requests(
    protocol: str, texts: list[str], model: str, outputs: tuple[str, ...] = ()
) -> list[bytes]:
    """Each text's request. KServe's and gRPC's name `outputs` when given; none named asks for
    all the model's outputs (Triton's rule), with `embedding` among them for a model that has
    it, so a like-for-like comparison with a tree from before that rule names them."""
    infer = f"/v2/models/{model}/infer"
    named = [{"name": name} for name in outputs]
    out = []
    for text in texts:
        data = text.encode()
        spec: dict[str, object] = {"name": "text", "datatype": "BYTES", "shape": [1]}
        if protocol == "http":
            out.append(classify_request(text))
        elif protocol == "kserve-json":
            spec["data"] = [text]
            body = {"inputs": [spec], **({"outputs": named} if named else {})}
            out.append(http_message("POST", infer, json.dumps(body).encode()))
        elif protocol == "kserve-binary":
            blob = LENGTH.pack(len(data)) + data  # KServe's BYTES element: the same u32 length
            spec["parameters"] = {"binary_data_size": len(blob)}
            doc = {"inputs": [spec], "parameters": {"binary_data_output": True}}
            if named:
                doc["outputs"] = named
            head = json.dumps(doc).encode()
            extra = {"Inference-Header-Content-Length": str(len(head))}
            out.append(http_message("POST", infer, head + blob, extra))
        elif protocol in ("grpc", "grpc-lean"):
            out.append(grpc_request(model, data, outputs))
        else:
            out.append(data)  # the client frames it with its own tag
    return out


def grpc_request(model: str, data: bytes, outputs: tuple[str, ...] = ()) -> bytes:
    """A serialized ModelInferRequest as tritonclient.grpc builds it (its own compiled
    messages, not ours): one BYTES input in raw_input_contents, and `outputs` named."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="text", datatype="BYTES", shape=[1])
    for name in outputs:
        request.outputs.add(name=name)
    request.raw_input_contents.append(LENGTH.pack(len(data)) + data)
    return request.SerializeToString()


# -- clients --------------------------------------------------------------------------------------
Sender = Callable[[bytes], Awaitable[int]]


async def http_sender(host: str, port: int) -> Sender:
    """One keep-alive connection, one request at a time: the HTTP status of each."""
    conn = await HttpConn.open(port, host)

    async def send(request: bytes) -> int:
        return (await conn.send(request)).status

    return send


def binary_sender(client: AsyncBinaryClient) -> Sender:
    """Requests share the one connection, answers matched by tag: 200 for status 0, else 500+."""

    async def send(text: bytes) -> int:
        answer = await client.classify(text)
        return 200 if answer.ok else 500 + answer.status

    return send


def grpc_sender(channel: Any) -> Sender:
    """Calls share the one channel; the answer's bytes are not decoded. 200 for OK, else 500."""
    import grpc

    call = channel.unary_unary(GRPC_INFER)

    async def send(request: bytes) -> int:
        try:
            await call(request, timeout=60)
        except grpc.RpcError:
            return 500
        return 200

    return send


class LeanGrpc(asyncio.Protocol):
    """A gRPC client as lean as the HTTP one (hand-written HTTP/2, one connection, calls
    multiplexed): each call is one HEADERS and one DATA frame, and its answer is framed but not
    decoded; OK is the trailers' `grpc-status: 0` as this server writes it (a literal). The
    headers are HPACK-indexed as grpc's own clients send them: the first call adds each field
    to the dynamic table, every later call names them by index. For our server only; grpc.aio's
    client is the general one."""

    FIELDS = (
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", GRPC_INFER.encode()),
        (b":authority", b"bench"), (b"content-type", b"application/grpc"), (b"te", b"trailers"),
    )  # fmt: skip
    FIRST = b"".join(b"\x40" + bytes([len(n)]) + n + bytes([len(v)]) + v for n, v in FIELDS)
    HEAD = bytes(0x80 | (67 - i) for i in range(6))  # the six fields, the newest at 62
    OK = b"\x00\x0bgrpc-status\x010"

    def __init__(self) -> None:
        self.transport: Any = None
        self.buf = bytearray()
        self.next_id = 1
        self.calls: dict[int, asyncio.Future[int]] = {}
        self.unacked = 0

    @classmethod
    async def connect(cls, host: str, port: int) -> LeanGrpc:
        _, proto = await asyncio.get_running_loop().create_connection(cls, host, port)
        return proto

    @staticmethod
    def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
        n = len(payload)
        return bytes([n >> 16, (n >> 8) & 255, n & 255, kind, flags]) + stream.to_bytes(4) + payload

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        settings = (4).to_bytes(2) + (2**31 - 1).to_bytes(4) + (2).to_bytes(2) + bytes(4)
        transport.write(
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
            + self.frame(4, 0, 0, settings)
            + self.frame(8, 0, 0, (2**30).to_bytes(4))
        )

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos, end = 0, len(buf)
        while end - pos >= 9:
            n = int.from_bytes(buf[pos : pos + 3])
            if end - pos < 9 + n:
                break
            kind, flags = buf[pos + 3], buf[pos + 4]
            sid = int.from_bytes(buf[pos + 5 : pos + 9])
            if kind == 1 and flags & 1:  # trailers: the call is over
                fut = self.calls.pop(sid, None)
                if fut is not None and not fut.done():
                    fut.set_result(200 if self.OK in buf[pos + 9 : pos + 9 + n] else 500)
            elif kind == 0:
                self.unacked += n
            elif kind == 4 and not flags & 1:
                self.transport.write(self.frame(4, 1, 0, b""))
            elif kind == 6 and not flags & 1:
                self.transport.write(self.frame(6, 1, 0, bytes(buf[pos + 9 : pos + 17])))
            elif kind == 3:
                fut = self.calls.pop(sid, None)
                if fut is not None and not fut.done():
                    fut.set_result(500)
            pos += 9 + n
        del buf[:pos]
        if self.unacked > 2**29:
            self.transport.write(self.frame(8, 0, 0, self.unacked.to_bytes(4)))
            self.unacked = 0

    def connection_lost(self, exc: Exception | None) -> None:
        for fut in self.calls.values():
            if not fut.done():
                fut.set_result(500)

    async def send(self, request: bytes) -> int:
        sid, self.next_id = self.next_id, self.next_id + 2
        fut = asyncio.get_running_loop().create_future()
        self.calls[sid] = fut
        message = b"\x00" + len(request).to_bytes(4) + request
        head = self.FIRST if sid == 1 else self.HEAD
        self.transport.write(self.frame(1, 4, sid, head) + self.frame(0, 1, sid, message))
        return await fut

    def close(self) -> None:
        self.transport.close()


# -- one cell of the table ------------------------------------------------------------------------
@dataclass
class Cell:
    protocol: str
    concurrency: int
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    client_cpu_s: float = 0.0
    frontend_cpu_s: float | None = None  # the server's front-end process, when we know its pid
    server_cpu_s: float | None = None  # the front-end and every process under it

    def pct(self, p: float) -> float:
        return percentile(self.latencies_ms, p)

    def row(self) -> str:
        n = len(self.latencies_ms)
        rps = n / self.seconds if self.seconds else 0.0
        cpu = 100 * self.client_cpu_s / self.seconds if self.seconds else 0.0
        front = whole = "-"
        if self.frontend_cpu_s is not None and n:
            front = f"{self.frontend_cpu_s / n * 1e6:.0f}"
        if self.server_cpu_s is not None and n:
            whole = f"{self.server_cpu_s / n * 1e3:.2f}"
        return (
            f"| {self.protocol} | {self.concurrency} | {n} | {rps:.1f} | {self.pct(50):.1f} "
            f"| {self.pct(99):.1f} | {self.errors} | {cpu:.1f}% | {front} | {whole} |"
        )


async def run_cell(
    cell: Cell,
    host: str,
    port: int,
    requests: list[bytes],
    duration: float,
    limit: int,
    pid: int | None,
) -> None:
    shared: AsyncBinaryClient | None = None
    channel: Any = None
    lean: LeanGrpc | None = None
    if cell.protocol == "binary":
        shared = await AsyncBinaryClient.connect(host, port)
        senders = [binary_sender(shared)] * cell.concurrency
    elif cell.protocol == "grpc":
        import grpc

        channel = grpc.aio.insecure_channel(f"{host}:{port}")
        senders = [grpc_sender(channel)] * cell.concurrency
    elif cell.protocol == "grpc-lean":
        lean = await LeanGrpc.connect(host, port)
        senders = [lean.send] * cell.concurrency
    else:
        senders = [await http_sender(host, port) for _ in range(cell.concurrency)]
    texts = itertools.cycle(requests)
    for send in senders:  # warm: one untimed request per connection slot
        await send(next(texts))
    stop_at = time.perf_counter() + duration
    started = time.perf_counter()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    front0, whole0 = process_cpu(pid), tree_cpu(pid)

    async def worker(send: Sender) -> None:
        while time.perf_counter() < stop_at and len(cell.latencies_ms) + cell.errors < limit:
            t0 = time.perf_counter()
            code = await send(next(texts))
            if code == 200:
                cell.latencies_ms.append((time.perf_counter() - t0) * 1000)
            else:
                cell.errors += 1

    await asyncio.gather(*(worker(s) for s in senders))
    cell.seconds = time.perf_counter() - started
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    front1, whole1 = process_cpu(pid), tree_cpu(pid)
    if front0 is not None and front1 is not None:
        cell.frontend_cpu_s = front1 - front0
    if whole0 is not None and whole1 is not None:
        cell.server_cpu_s = whole1 - whole0
    cell.client_cpu_s = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    if shared is not None:
        await shared.close()
    if channel is not None:
        await channel.close()
    if lean is not None:
        lean.close()


def process_cpu(pid: int | None) -> float | None:
    if pid is None:
        return None
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def tree_cpu(pid: int | None) -> float | None:
    """CPU seconds of the process and of every live process under it (workers, zygote)."""
    if pid is None:
        return None
    total = 0.0
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


async def measure(
    args: argparse.Namespace, url: str, binary_port: int, grpc_port: int, pid: int | None
) -> list[Cell]:
    host, port = urlsplit(url).hostname or "127.0.0.1", urlsplit(url).port or 80
    model = str(get_json(port, "/v1/model", host=host)["name"])
    texts = load_texts(args.data, args.texts)
    idle_rate = idle_whole = 0.0
    before, whole = process_cpu(pid), tree_cpu(pid)
    if before is not None and whole is not None:  # ticks, heartbeats: not the protocols' cost
        await asyncio.sleep(IDLE_S)
        idle_rate = ((process_cpu(pid) or before) - before) / IDLE_S
        idle_whole = ((tree_cpu(pid) or whole) - whole) / IDLE_S
    protocols = args.protocols.split(",")
    outputs = tuple(o for o in args.outputs.split(",") if o)
    requests = {p: encode_requests(p, texts, model, outputs) for p in protocols}
    cells = []
    # Rounds, and the protocols side by side at each concurrency: a neighbour's load on a shared
    # machine then weighs on every protocol alike.
    for _ in range(args.rounds):
        for conc in (int(c) for c in args.concurrency.split(",")):
            for protocol in protocols:
                target = {"binary": binary_port, "grpc": grpc_port, "grpc-lean": grpc_port}.get(
                    protocol, port
                )
                cell = Cell(protocol, conc)
                await run_cell(
                    cell, host, target, requests[protocol], args.duration, args.max_requests, pid
                )
                if cell.frontend_cpu_s is not None:  # less what the idle front-end spends anyway
                    cell.frontend_cpu_s = max(0.0, cell.frontend_cpu_s - idle_rate * cell.seconds)
                if cell.server_cpu_s is not None:
                    cell.server_cpu_s = max(0.0, cell.server_cpu_s - idle_whole * cell.seconds)
                print(cell.row(), flush=True)
                cells.append(cell)
    if args.rounds > 1:
        summary(cells)
    return cells


def summary(cells: list[Cell]) -> None:
    """Each cell's median over the rounds, and each round's req/s over KServe JSON's."""
    print("\nmedian of the rounds; per round, req/s over kserve-json's at the same concurrency")
    print("| protocol | conc | req/s | p50 ms | p99 ms | front-end CPU us/req | server CPU ms/req "
          "| req/s / kserve-json, each round |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    keys = list(dict.fromkeys((c.protocol, c.concurrency) for c in cells))
    for protocol, conc in sorted(keys, key=lambda k: (k[1], keys.index(k))):
        mine = [c for c in cells if (c.protocol, c.concurrency) == (protocol, conc)]
        base = [c for c in cells if (c.protocol, c.concurrency) == ("kserve-json", conc)]
        rates = [len(c.latencies_ms) / c.seconds for c in mine]
        ratios = [r / (len(b.latencies_ms) / b.seconds) for r, b in zip(rates, base, strict=False)]
        front = [c.frontend_cpu_s / len(c.latencies_ms) * 1e6 for c in mine if c.frontend_cpu_s]
        whole = [c.server_cpu_s / len(c.latencies_ms) * 1e3 for c in mine if c.server_cpu_s]
        p50, p99 = median([c.pct(50) for c in mine]), median([c.pct(99) for c in mine])
        print(
            f"| {protocol} | {conc} | {median(rates):.1f} | {p50:.1f} | {p99:.1f} "
            f"| {median(front):.0f} | {median(whole):.2f} "
            f"| {', '.join(f'{r:.2f}' for r in ratios)} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server's HTTP base URL (default: start one)")
    parser.add_argument("--binary-port", type=int, default=8001, help="with --url")
    parser.add_argument("--grpc-port", type=int, default=8002, help="with --url")
    parser.add_argument("--server-pid", type=int, help="with --url: front-end pid, for its CPU")
    parser.add_argument("--server-args", default="--workers 2 --spares 0", help="when started")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS))
    parser.add_argument(
        "--outputs", default="", help="KServe/gRPC outputs to name (e.g. scores,label); none: all"
    )
    parser.add_argument("--concurrency", default="1,32,64")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per cell at most")
    parser.add_argument("--rounds", type=int, default=1, help="repeat the table, then medians")
    parser.add_argument("--max-requests", type=int, default=4000, help="per cell at most")
    parser.add_argument("--data", default=str(SST2), help="TSV with the texts in column one")
    parser.add_argument("--texts", type=int, default=1000, help="distinct texts, cycled")
    args = parser.parse_args(argv)

    import uvloop

    with tempfile.TemporaryDirectory(prefix="rs-bench-") as tmp:
        srv = None if args.url else Launched(tmp, args.server_args.split(), grpc=True)
        try:
            if srv is None:  # a running server: assumed ready
                url, pid = args.url.rstrip("/"), args.server_pid
                binary_port, grpc_port = args.binary_port, args.grpc_port
            else:
                srv.wait_ready()
                url, binary_port, grpc_port, pid = srv.url, srv.binary_port, srv.grpc_port, srv.pid
            print(f"server: {url} ({args.server_args if srv else 'external'}), one text a request")
            print(
                "| protocol | conc | requests | req/s | p50 ms | p99 ms | errors | client CPU "
                "| front-end CPU us/req | server CPU ms/req |"  # the idle share subtracted
            )
            print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
            uvloop.run(measure(args, url, binary_port, grpc_port, pid))
        finally:
            if srv is not None:
                srv.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
