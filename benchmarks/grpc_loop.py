"""Where the gRPC server should run, measured: three arrangements of grpcio around a uvloop event
loop that owns the work (as the front-end's loop owns the dispatcher), side by side in one run.

- `aio-on-loop`: grpc.aio's server on the uvloop loop itself (what service/protocols/rpc does);
- `aio-thread`: grpc.aio on a thread with its own asyncio loop, each call handed to the uvloop
  loop and its answer handed back (call_soon_threadsafe both ways);
- `sync-pool`: grpcio's threaded server (a pool of 8), each call handed to the loop and waited
  for (run_coroutine_threadsafe);
- `h2-on-loop`: ringserve's own HTTP/2 (service/protocols/rpc/http2/) on the uvloop loop, the
  gRPC port's transport now: no thread, no grpcio server.

The work is a future the loop completes on its next turn, so what is measured is the protocol
and the hand-offs alone: calls per second and the server's CPU per call (all its threads), at
each concurrency, from a grpc.aio client in this process over one channel. The server runs in
a process of its own.

    python -m benchmarks.grpc_loop [--duration 5] [--concurrency 1,32]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psutil

METHOD = "/bench.Echo/Call"
ARRANGEMENTS = ("aio-on-loop", "aio-thread", "sync-pool", "h2-on-loop")


def identity(data: bytes) -> bytes:
    return data


def handler(behaviour: Any, aio: bool) -> Any:
    import grpc

    method = grpc.unary_unary_rpc_method_handler(
        behaviour, request_deserializer=identity, response_serializer=identity
    )
    return grpc.method_handlers_generic_handler("bench.Echo", {"Call": method})


async def answer_soon(data: bytes) -> bytes:
    """The work: answered by the loop on its next turn, as a ring reader answers."""
    fut = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(fut.set_result, data)
    return await fut


def serve(arrangement: str, ports: Any) -> None:
    import grpc
    import uvloop

    async def main() -> None:
        loop = asyncio.get_running_loop()
        if arrangement == "aio-on-loop":

            async def call(request: bytes, context: Any) -> bytes:
                return await answer_soon(request)

            server = grpc.aio.server()
            server.add_generic_rpc_handlers([handler(call, True)])
            ports.put(server.add_insecure_port("127.0.0.1:0"))
            await server.start()
            await server.wait_for_termination()
        elif arrangement == "h2-on-loop":
            from ringserve.service.protocols.rpc import http2 as h2

            port = EchoPort()
            server = await loop.create_server(
                lambda: h2.Connection(port, time.monotonic_ns), "127.0.0.1", 0
            )
            ports.put(server.sockets[0].getsockname()[1])
            await asyncio.Event().wait()
        elif arrangement == "aio-thread":
            threading.Thread(target=aio_thread, args=(loop, ports), daemon=True).start()
            await asyncio.Event().wait()
        else:

            def blocking(request: bytes, context: Any) -> bytes:
                return asyncio.run_coroutine_threadsafe(answer_soon(request), loop).result()

            server = grpc.server(ThreadPoolExecutor(8))
            server.add_generic_rpc_handlers([handler(blocking, False)])
            ports.put(server.add_insecure_port("127.0.0.1:0"))
            server.start()
            await asyncio.Event().wait()

    uvloop.run(main())


class EchoPort:
    """h2.Port: each call's message answered on the loop's next turn, as `answer_soon` does."""

    limit = 1 << 20
    max_streams = 1024
    budget = 8 << 20
    stream_window = 65535  # as the gRPC port has it

    def opened(self, conn: Any) -> None: ...
    def closed(self, conn: Any) -> None: ...
    def broken(self, exc: Exception) -> None: ...

    def begin(self, stream: Any) -> None:
        def keep(s: Any, data: bytes) -> None:
            s.request = data

        def end(s: Any) -> None:
            asyncio.get_running_loop().call_soon(s.reply, s.request or b"")

        stream.on_message, stream.on_end = keep, end


def aio_thread(work_loop: asyncio.AbstractEventLoop, ports: Any) -> None:
    import grpc

    async def main() -> None:
        own = asyncio.get_running_loop()

        async def call(request: bytes, context: Any) -> bytes:
            back = own.create_future()

            def done(task: asyncio.Future[bytes]) -> None:
                own.call_soon_threadsafe(back.set_result, task.result())

            def start() -> None:
                asyncio.ensure_future(answer_soon(request)).add_done_callback(done)

            work_loop.call_soon_threadsafe(start)
            result: bytes = await back
            return result

        server = grpc.aio.server()
        server.add_generic_rpc_handlers([handler(call, True)])
        ports.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


async def load(port: int, concurrency: int, duration: float) -> int:
    import grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(METHOD)
        await call(b"warm")
        done = 0
        stop_at = time.perf_counter() + duration

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < stop_at:
                await call(b"x" * 64, timeout=30)
                done += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done


def measure(arrangement: str, concurrency: int, duration: float) -> tuple[float, float]:
    ctx = mp.get_context("spawn")
    ports = ctx.Queue()
    proc = ctx.Process(target=serve, args=(arrangement, ports), daemon=True)
    proc.start()
    try:
        port = ports.get(timeout=60)
        ps = psutil.Process(proc.pid)
        asyncio.run(load(port, 1, 0.5))  # warm
        cpu0, t0 = sum(ps.cpu_times()[:2]), time.perf_counter()
        n = asyncio.run(load(port, concurrency, duration))
        cpu1, t1 = sum(ps.cpu_times()[:2]), time.perf_counter()
    finally:
        proc.kill()
        proc.join()
    return n / (t1 - t0), (cpu1 - cpu0) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--concurrency", default="1,32")
    args = parser.parse_args(argv)
    print("| arrangement | conc | calls/s | server CPU us/call |")
    print("| --- | --- | --- | --- |")
    for conc in (int(c) for c in args.concurrency.split(",")):
        for arrangement in ARRANGEMENTS:
            rate, cpu = measure(arrangement, conc, args.duration)
            print(f"| {arrangement} | {conc} | {rate:.0f} | {cpu:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
