"""Steady background load for tests: client threads on keep-alive connections, every answer kept."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import Counter


class Load:
    """`clients` threads post /v1/classify in a loop until stop(); records every outcome."""

    def __init__(
        self, port: int, texts: list[str], clients: int = 6, batch: int = 1, pause_s: float = 0.0
    ) -> None:
        self.port = port
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
            if self.batch == 1:
                body = json.dumps({"text": self.texts[i % len(self.texts)]})
            else:
                chunk = [self.texts[(i + k) % len(self.texts)] for k in range(self.batch)]
                body = json.dumps({"texts": chunk})
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
            with self.lock:
                self.outcomes[key] += 1
            if self.pause_s:
                self.stop_event.wait(self.pause_s)
        if conn is not None:
            conn.close()

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
        super().__init__(port, texts, clients)
        self.model = model
        self.fresh = fresh

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
