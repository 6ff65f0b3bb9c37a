"""No work for a client that left (issue 56, item 6), against a real server: a client pipelines
10 batches of 256 texts (HTTP) or 2,560 frames (binary) and disconnects, by closing its socket
(a FIN, with nothing read) or by resetting it. Fewer than 512 of its texts may reach a worker
(measured by the workers' own count of texts answered, less the probe's), the rest are dropped
(`dropped` in /v1/stats), and a probe client's P99 over the seconds around the attack stays
within 2x of its P99 over as many seconds without one. Then the connection cap's share: a
client address holding every connection gives an idle one up to another address."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
from ringserve.wire.frames import encode_frame, parse_answers

from devkit.http import get_json
from devkit.load import percentile
from devkit.raw import Raw
from devkit.server import ServerProc, serving, wait_for

WINDOW_S = 5.0  # each probe window; the attack's own effect lasts well under a second


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    server = ServerProc(tmp_path_factory.mktemp("left"), ["--spares", "0"])
    with serving(server):
        yield server


@pytest.fixture(scope="module")
def warm(srv: ServerProc, sst2_texts: list[str]) -> ServerProc:
    """The module's server after the probe's 200 texts, each classified once as the probe
    sends them (its first batches, each lane's first lengths; a probe window of 5 s did the
    same, a few times over): a test after another finds it warm, its queue emptied (each test
    waits for that), and measures its own unloaded window right before its attack."""
    for text in sst2_texts[:200]:
        srv.classify(text)
    return srv


class Probe(threading.Thread):
    """One keep-alive client classifying one text at a time, each answer's latency kept."""

    def __init__(self, port: int, texts: list[str], seconds: float) -> None:
        super().__init__(daemon=True)
        self.port, self.texts, self.seconds = port, texts, seconds
        self.latencies_ms: list[float] = []

    def run(self) -> None:
        with Raw(self.port, timeout=60) as c:
            end = time.monotonic() + self.seconds
            i = 0
            while time.monotonic() < end:
                body = json.dumps({"text": self.texts[i % len(self.texts)]}).encode()
                i += 1
                t0 = time.perf_counter()
                c.send(b"POST /v1/classify HTTP/1.1\r\nHost: localhost\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
                assert c.response().status == 200
                self.latencies_ms.append((time.perf_counter() - t0) * 1000)


def probe(srv: ServerProc, texts: list[str], attack: bytes = b"", port: int = 0,
          reset: bool = False) -> tuple[float, int]:  # fmt: skip
    """The probe's P99 over WINDOW_S, with the attack sent 0.5 s in; and how many texts it
    had answered."""
    p = Probe(srv.port, texts, WINDOW_S)
    p.start()
    if attack:
        time.sleep(0.5)
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(attack)
        if reset:  # an abortive close: RST, whatever is unread
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    p.join(WINDOW_S + 60)
    return percentile(p.latencies_ms, 99), len(p.latencies_ms)


def totals(srv: ServerProc) -> tuple[int, int]:
    """Texts the workers answered, and texts dropped because their client had gone."""
    t = get_json(srv.port, "/v1/stats")["totals"]
    return t["answered"], t["dropped"]


def attack_bytes(protocol: str, texts: list[str]) -> bytes:
    if protocol == "binary":
        return b"".join(encode_frame(texts[k % len(texts)], k + 1) for k in range(2560))
    out = []
    for b in range(10):
        batch = [texts[(b * 256 + k) % len(texts)] for k in range(256)]
        body = json.dumps({"texts": batch}).encode()
        out.append(b"POST /v1/classify HTTP/1.1\r\nHost: localhost\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
    return b"".join(out)


@pytest.mark.parametrize("how", ["close", "reset"])
@pytest.mark.parametrize("protocol", ["http", "binary"])
def test_a_client_that_pipelines_and_leaves_costs_little(
    warm: ServerProc, sst2_texts: list[str], protocol: str, how: str
) -> None:
    srv = warm
    unloaded_p99, _ = probe(srv, sst2_texts[:200])
    answered, dropped = totals(srv)
    port = srv.binary_port if protocol == "binary" else srv.port
    attack = attack_bytes(protocol, sst2_texts)
    attacked_p99, probed = probe(srv, sst2_texts[:200], attack, port, how == "reset")
    wait_for(lambda: get_json(srv.port, "/v1/stats")["queue_depth"] == 0, 30, "the queue empty")
    answered_after, dropped_after = totals(srv)
    computed = answered_after - answered - probed
    print(f"{protocol} {how}: the leaver's texts computed {computed}, dropped "
          f"{dropped_after - dropped}; probe P99 {unloaded_p99:.1f} ms unloaded, "
          f"{attacked_p99:.1f} ms around the attack")  # fmt: skip
    assert computed < 512
    assert attacked_p99 <= 2 * unloaded_p99, (attacked_p99, unloaded_p99)


# -- the connection cap's share -------------------------------------------------------------------
def test_at_the_cap_another_address_takes_an_idle_connection(start_server) -> None:
    """--max-connections 4, every one held idle by 127.0.0.2 (HTTP and binary): a client from
    127.0.0.1 is served on each port, and the hog's longest-idle connection is the one closed."""
    srv = start_server("--workers", "1", "--spares", "0", "--max-connections", "4", workers=1)
    hog = [Raw(srv.port, source="127.0.0.2") for _ in range(4)]
    for c in hog:
        c.send(b"GET /v1/model HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert c.response().status == 200  # in turn: hog[0] is the longest idle
    status, _, body = srv.request("POST", "/v1/classify", {"text": "a fine film"})
    assert status == 200, body
    hog[0].sock.settimeout(5)
    assert hog[0].closed_by_server()
    for c in hog[1:]:  # the others still serve
        c.send(b"GET /v1/model HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert c.response().status == 200
    binary_hog = [socket.create_connection(("127.0.0.1", srv.binary_port), 10, ("127.0.0.2", 0))
                  for _ in range(4)]  # fmt: skip
    mine = socket.create_connection(("127.0.0.1", srv.binary_port), timeout=10)
    mine.sendall(encode_frame("a fine film", 7))
    (answer,), _ = wait_for(lambda: parse_answers(mine.recv(64)), 10, "an answer")
    assert answer.tag == 7 and answer.ok, answer
    binary_hog[0].settimeout(5)
    assert binary_hog[0].recv(64) == b""  # the longest idle gave way
    for s in [*binary_hog, mine]:
        s.close()
    for c in hog:
        c.close()
