"""HTTP/2 floods on the gRPC port while another client classifies: issue 46's attacks, each in a
10 s window (devkit/h2flood.py: an attacker floods from one connection until the server closes
it; with --reconnect, again on a new connection each time), while one HTTP client
(`/v1/classify`, keep-alive) and one gRPC client (tritonclient ModelInfer) call in a closed loop
on a server of its own.

Prints per attack: the attacking connections and whether the server closed each (with the
GOAWAY code seen), the frames each wrote before it saw the close and the seconds it lasted
(median; the kernel's socket buffers take far more frames than the server reads), the normal
clients' P50/P99/max and failures over HTTP and gRPC, and the front-end's RSS growth. A first
row with no attack is the baseline. Acceptance (issue 46): the normal client never fails and
never waits over 1 s (P99 under 100 ms the aim), every attacker is closed, RSS grows under 64 MiB.

    python -m benchmarks.h2_attacks [--seconds 10] [--attacks continuation,ping,...]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

import psutil

from devkit import h2flood
from devkit.launcher import Launched
from devkit.load import percentile

TEXT = "a gripping, beautifully acted film"


@dataclass
class Calls:
    """One normal client's calls: (start time, latency s, ok) each."""

    done: list[tuple[float, float, bool]] = field(default_factory=list)

    def between(self, t0: float, t1: float) -> tuple[list[float], int]:
        window = [(lat, ok) for start, lat, ok in self.done if t0 <= start < t1]
        return [lat * 1000 for lat, ok in window if ok], sum(1 for _, ok in window if not ok)


def http_client(port: int, calls: Calls, stop: threading.Event) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = json.dumps({"text": TEXT})
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            conn.request("POST", "/v1/classify", body)
            resp = conn.getresponse()
            ok = resp.status == 200 and b"label" in resp.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            ok = False
        calls.done.append((t0, time.monotonic() - t0, ok))


def grpc_client(port: int, model: str, calls: Calls, stop: threading.Event) -> None:
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    inp = grpcclient.InferInput("text", [1], "BYTES")
    inp.set_data_from_numpy(np.array([TEXT.encode()], dtype=object))
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            ok = client.infer(model, [inp], client_timeout=30).as_numpy("label") is not None
        except InferenceServerException:
            ok = False
        calls.done.append((t0, time.monotonic() - t0, ok))
    client.close()


def rss_peak(pid: int, stop: threading.Event, out: list[int]) -> None:
    proc = psutil.Process(pid)
    while not stop.is_set():
        out.append(proc.memory_info().rss)
        stop.wait(0.05)


def summary(ms: list[float], failed: int) -> str:
    if not ms:
        return f"no answer | {failed}"
    return f"{percentile(ms, 50):.1f} / {percentile(ms, 99):.1f} / {max(ms):.0f} | {failed}"


def phase(
    srv: Launched, kind: str, ns: argparse.Namespace, body: bytes, clients: list[Calls]
) -> str:
    seconds = ns.seconds
    stop = threading.Event()
    rss: list[int] = []
    sampler = threading.Thread(target=rss_peak, args=(srv.pid, stop, rss), daemon=True)
    sampler.start()
    t0 = time.monotonic()
    if kind == "none":
        time.sleep(seconds)
        attacker = "- | - | -"
    else:
        attack = h2flood.Attack(srv.grpc_port, kind, body, seconds, ns.reconnect).run()
        time.sleep(max(0.0, t0 + seconds - time.monotonic()))  # the window is the same
        conns = attack.connections
        codes = sorted({c.goaway for c in conns}, key=str)
        frames = statistics.median(c.frames for c in conns)
        secs = statistics.median(c.seconds for c in conns)
        closed = sum(c.closed for c in conns)
        attacker = f"{closed}/{len(conns)} closed, GOAWAY {codes} | {frames:.0f} | {secs:.3f}"
    t1 = time.monotonic()
    stop.set()
    sampler.join()
    growth = (max(rss) - rss[0]) / 2**20
    (http_ms, http_failed), (grpc_ms, grpc_failed) = (c.between(t0, t1) for c in clients)
    row = f"| {kind} | {attacker} | {summary(http_ms, http_failed)} | "
    return row + f"{summary(grpc_ms, grpc_failed)} | {growth:.1f} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.h2_attacks", description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--attacks", default=",".join(h2flood.ATTACKS))
    parser.add_argument(
        "--reconnect", action="store_true", help="attack again on a new connection each close"
    )
    ns = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ringserve-h2-") as tmp:
        srv = Launched(tmp, ["--workers", "1", "--spares", "0"], binary=False, grpc=True)
        stop = threading.Event()
        try:
            srv.wait_ready()
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
            conn.request("GET", "/v1/model")
            model = json.loads(conn.getresponse().read())["name"]
            body = h2flood.model_infer_body(model, TEXT)
            clients = [Calls(), Calls()]
            threads = [
                threading.Thread(target=http_client, args=(srv.port, clients[0], stop)),
                threading.Thread(target=grpc_client, args=(srv.grpc_port, model, clients[1], stop)),
            ]
            for t in threads:
                t.start()
            time.sleep(1.0)  # both clients warm
            print(
                "| attack | attacker: connections closed | frames written before the"
                " close (median) | seconds each (median) | HTTP P50 / P99 / max ms | HTTP"
                " failed | gRPC P50 / P99 / max ms | gRPC failed | front-end RSS growth MiB |"
            )
            print("| --- " * 9 + "|")
            for kind in ["none", *ns.attacks.split(",")]:
                print(phase(srv, kind, ns, body, clients), flush=True)
        finally:
            stop.set()
            srv.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
