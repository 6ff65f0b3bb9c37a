"""Bursts after idle are answered in full; a standing queue is refused fast on every protocol.

One server with the defaults (the contract's "Admission"), after light traffic, as a user meets
it: a client checks the server with single requests, goes quiet, then a burst comes. The burst
shapes are the ones users make: many binary connections each pipelining a few frames of mixed
lengths, several concurrent batch requests of long texts, one connection pipelining a thousand
frames. Then a burst of long texts that takes the server several seconds (a text of 256 tokens
takes it about 45 ms here): once it has stood past --max-queue-ms, HTTP, KServe, gRPC and binary
requests are each refused within 1 s.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from ringserve.wire.frames import AnswerParser, encode_frame
from tritonclient.utils import InferenceServerException

from devkit.http import HOST, HttpConn, get_json
from devkit.server import ServerProc, serving, wait_for

MODEL = "sst2-minilm"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    with serving(ServerProc(tmp_path_factory.mktemp("bursts"), [], grpc=True)) as srv:
        yield srv


@pytest.fixture(scope="module")
def long_texts(agnews_texts: list[str]) -> list[str]:
    """Texts of well over the model's 256 tokens (cut to 256: the longest a batch runs)."""
    out, i = [], 0
    while len(out) < 64:
        text = ""
        while len(text) < 1600:
            text += agnews_texts[i % len(agnews_texts)] + " "
            i += 1
        out.append(text)
    return out


def idle_after_light_traffic(srv: ServerProc, texts: list[str]) -> None:
    """A client checks the server with single requests, then goes quiet: the queue is empty."""
    for text in texts[:60]:
        srv.classify(text)
    wait_for(lambda: srv.status()["queue_depth"] == 0, 60, "an empty queue")


async def pipelined(port: int, frames: list[bytes], start: asyncio.Event) -> list[int]:
    """One binary connection: write every frame at once when `start` is set, read every
    answer; the statuses in tag order."""
    reader, writer = await asyncio.open_connection(HOST, port)
    await start.wait()
    writer.write(b"".join(frames))
    parser, got = AnswerParser(), []
    while len(got) < len(frames):
        data = await asyncio.wait_for(reader.read(1 << 16), 60)
        assert data, f"closed after {len(got)} of {len(frames)} answers"
        got += parser.feed(data)
    writer.close()
    return [a.status for a in sorted(got, key=lambda a: a.tag)]


async def binary_burst(port: int, batches: list[list[str]]) -> list[list[int]]:
    start = asyncio.Event()
    tasks = [
        asyncio.ensure_future(
            pipelined(port, [encode_frame(t, k + 1) for k, t in enumerate(batch)], start)
        )
        for batch in batches
    ]
    await asyncio.sleep(0)  # every connection opening before the burst is written
    start.set()
    return list(await asyncio.gather(*tasks))


def test_fifty_connections_of_four_pipelined_frames_are_answered_in_full(
    srv: ServerProc, sst2_texts: list[str], long_texts: list[str]
) -> None:
    idle_after_light_traffic(srv, sst2_texts)
    batches = [
        [long_texts[(4 * c + k) % 64] if (4 * c + k) % 6 == 0 else sst2_texts[4 * c + k]
         for k in range(4)]
        for c in range(50)
    ]  # fmt: skip
    statuses = asyncio.run(binary_burst(srv.binary_port, batches))
    assert statuses == [[0] * 4] * 50


def test_eight_concurrent_batches_of_16_long_texts_are_answered_in_full(
    srv: ServerProc, sst2_texts: list[str], long_texts: list[str]
) -> None:
    """128 long texts at once (about 45 ms each here: several times --max-queue-ms, 1 s, of
    work) are admitted whole into the empty queue and answered in full. It once sent 32 texts
    a batch: twice the time for the same case."""
    idle_after_light_traffic(srv, sst2_texts)

    async def one(k: int) -> tuple[int, bytes]:
        conn = await HttpConn.open(srv.port)
        body = json.dumps({"texts": [long_texts[(k * 16 + i) % 64] for i in range(16)]})
        answer = await conn.call("POST", "/v1/classify", body.encode())
        conn.close()
        return answer.status, answer.body

    async def all_at_once() -> list[tuple[int, bytes]]:
        return list(await asyncio.gather(*(one(k) for k in range(8))))

    answers = asyncio.run(all_at_once())
    assert [code for code, _ in answers] == [200] * 8, [body[:200] for _, body in answers]
    assert all(len(json.loads(body)["results"]) == 16 for _, body in answers)


def test_a_thousand_frames_pipelined_on_one_connection_are_answered_in_full(
    srv: ServerProc, sst2_texts: list[str]
) -> None:
    idle_after_light_traffic(srv, sst2_texts)
    (statuses,) = asyncio.run(binary_burst(srv.binary_port, [sst2_texts[:1000]]))
    assert statuses == [0] * 1000


def http_probe(srv: ServerProc, path: str, body: dict[str, object]) -> tuple[str, float]:
    t0 = time.monotonic()
    code, headers, _ = srv.request("POST", path, body, timeout=30)
    outcome = "refused" if code == 503 and headers.get("retry-after") == "1" else str(code)
    return outcome, time.monotonic() - t0


def grpc_probe(srv: ServerProc, text: str) -> tuple[str, float]:
    client = grpcclient.InferenceServerClient(f"{HOST}:{srv.grpc_port}")
    tensor = grpcclient.InferInput("text", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([text.encode()], dtype=object))
    t0 = time.monotonic()
    try:
        client.infer(MODEL, [tensor], client_timeout=30)
        outcome = "200"
    except InferenceServerException as exc:
        outcome = "refused" if exc.status() == "StatusCode.UNAVAILABLE" else str(exc.status())
    finally:
        client.close()
    return outcome, time.monotonic() - t0


def binary_probe(srv: ServerProc, text: str) -> tuple[str, float]:
    async def one() -> int:
        start = asyncio.Event()
        start.set()
        (status,) = await pipelined(srv.binary_port, [encode_frame(text, 9)], start)
        return status

    t0 = time.monotonic()
    status = asyncio.run(one())
    return ("refused" if status == 2 else f"status {status}"), time.monotonic() - t0


def test_a_standing_queue_is_refused_within_a_second_on_every_protocol(
    srv: ServerProc, sst2_texts: list[str], long_texts: list[str]
) -> None:
    """120 long texts arrive at once (about 5 s of work here): admitted whole, as any
    burst into an empty queue. Once the oldest of them has waited past --max-queue-ms for
    CoDel's interval, the queue stands, and a new request on each protocol is refused at once;
    the burst itself is still answered in full."""
    idle_after_light_traffic(srv, sst2_texts)
    burst = [long_texts[k % 64] for k in range(120)]

    async def burst_and_probes() -> tuple[list[int], dict[str, tuple[str, float]]]:
        flood = asyncio.ensure_future(binary_burst(srv.binary_port, [burst]))

        def probes() -> dict[str, tuple[str, float]]:
            stats = lambda: get_json(srv.port, "/v1/stats")  # noqa: E731
            wait_for(lambda: stats()["queue_wait_ms"] > 1300, 30, "a standing queue")
            text = sst2_texts[0]
            return {
                "http": http_probe(srv, "/v1/classify", {"text": text}),
                "kserve": http_probe(
                    srv,
                    f"/v2/models/{MODEL}/infer",
                    {
                        "inputs": [
                            {"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}
                        ]
                    },
                ),
                "grpc": grpc_probe(srv, text),
                "binary": binary_probe(srv, text),
            }

        outcomes = await asyncio.to_thread(probes)
        (statuses,) = await flood
        return statuses, outcomes

    statuses, outcomes = asyncio.run(burst_and_probes())
    assert statuses == [0] * 120  # the burst that met an empty queue: answered in full
    for protocol, (outcome, seconds) in outcomes.items():
        assert outcome == "refused", (protocol, outcome)
        assert seconds < 1.0, (protocol, seconds)
