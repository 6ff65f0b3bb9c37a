"""The front-end's CPU for one request's body and answer, in-process: a route's handler called
with a real Exchange, up to the point where it would admit the texts, and its answer callback
with a classifier's results, for /v1/classify and KServe JSON (one SST-2-sized sentence).

Admission is left out (admit.submit is replaced by a recorder; nothing else is faked), so the
figure is what the body's decoding and checking and the answer's encoding cost, not the queue.
Run it against another checkout (a baseline) with that checkout's .typecheck on PYTHONPATH:

    python -m benchmarks.body_cpu [--calls 20000] [--repeat 5]
    PYTHONPATH=/path/to/base/.typecheck python -m benchmarks.body_cpu
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
from ringserve.service.config.settings import Config
from ringserve.service.engine.requests import Result
from ringserve.service.protocols import admit, kserve, routes
from ringserve.service.protocols.http import Exchange
from ringserve.shm import layout as L

TEXT = "an honest, moving and beautifully acted film that stays with you"


class Models:
    """The one model a request names (models/modelset.py's ModelSet, as routes read it)."""

    def __init__(self, info: Any) -> None:
        self.info = info

    def find(self, name: Any = None, version: Any = None) -> Any:
        return self.info

    def ready(self) -> list[Any]:
        return [self.info]

    def __iter__(self) -> Any:
        return iter(())


class Conn:
    """What a handler writes to: the answer is kept, not sent."""

    def __init__(self) -> None:
        self.sent = b""

    def clock(self) -> int:
        return time.monotonic_ns()

    def respond(self, ex: Exchange, status: int, body: bytes, **kw: Any) -> None:
        self.sent = body

    def respond_error(self, ex: Exchange, status: int, message: str, extra: Any = None) -> None:
        raise RuntimeError(f"{status} {message}")


def server() -> Any:
    manifest = SimpleNamespace(
        task=["classify"], embeds=False, embed_only=False, normalize=False, labels=["n", "p"],
        activation="softmax", dimension=0, extra={}, prompts={}, default_prompt_name=None,
        multivector={}, token_classifies=False,
    )  # fmt: skip
    info = SimpleNamespace(
        name="m", labels=["negative", "positive"], index=0, version=1, manifest=manifest
    )
    return SimpleNamespace(settings=Config(), models=Models(info), admission=None, repository=None)


def exchange(url: bytes, body: bytes) -> Exchange:
    ex = Exchange()
    ex.method, ex.url, ex.body, ex.done_ns = b"POST", url, [body], time.monotonic_ns()
    return ex


def timed(call: Callable[[], None], calls: int, repeat: int) -> float:
    """Best of `repeat` runs of `calls` calls, in microseconds a call."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    srv, conn = server(), Conn()
    admitted: list[Any] = []
    admit.submit = lambda *a, **kw: admitted.append(a[4])
    result = Result(L.STATUS_OK, 1, np.array([0.1, 0.9], dtype=np.float32))
    classify_body = json.dumps({"text": TEXT}).encode()
    infer_body = json.dumps(
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [TEXT]}]}
    ).encode()
    infer = kserve.guard(srv, kserve.infer, inference=True)

    def classify_request() -> None:
        routes.classify(srv, conn, exchange(b"/v1/classify", classify_body), {})

    def infer_request() -> None:
        infer(conn, exchange(b"/v2/models/m/infer", infer_body), {"model": "m"})

    rows = []
    for name, request in (("/v1/classify", classify_request), ("kserve-json", infer_request)):
        admitted.clear()
        request()
        done = admitted[-1]
        decode_us = timed(request, args.calls, args.repeat)
        answer_us = timed(lambda done=done: done([result]), args.calls, args.repeat)
        rows.append((name, decode_us, answer_us, conn.sent[:60]))
    print(f"tree: {routes.__file__.rsplit('/service/', 1)[0]}")
    print("| route | body decoded and checked, us | answer written, us | answer starts |")
    print("| --- | --- | --- | --- |")
    for name, decode_us, answer_us, head in rows:
        print(f"| {name} | {decode_us:.2f} | {answer_us:.2f} | `{head.decode()}` |")


if __name__ == "__main__":
    main()
