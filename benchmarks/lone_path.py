"""A lone request against the model's own time: where the rest of its time goes.

First the model alone, in this process: the graph the server serves (its `/v1/model` `graph`),
one intra-op thread pinned to one core, batch 1, each text in turn. Then the default server
(`ringserve serve`, default settings, on free ports), the same texts one at a time on one
keep-alive connection (c=1), each answer's client round trip and `x-latency-ms` kept; the
server's own means a text come from its Prometheus histograms read before and after each mix
(`ringserve_request_{latency,queued,model}_seconds` sum and count): latency (admission to the
answer), queued (the worker's tokenizing, waiting and filling before the forward pass) and model
(the forward pass and its activation). What the issue asks of a lone request is the server's
P50 at c=1 against the model's one-thread batch-1 P50 on the same texts, at most 0.65.

`python -m benchmarks.lone_path [--texts 200] [--args "--spares 0"]`; run it alone (under the
project's heavy lock).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from ringserve.factory.build import default_artifact_dir
from ringserve.workers.artifact import load_manifest, load_tokenizer
from ringserve.workers.runtimes.onnx_model import open_session

from devkit.http import HOST, get_json
from devkit.launcher import AG_NEWS, SST2, Launched, load_texts

MIXES = {"short": SST2, "long": AG_NEWS}
SERIES = ("latency", "queued", "model")


def model_ms(graph_file: Path, encodings: list[Any], cpu: int) -> np.ndarray:
    """ms a text through the model alone: one thread on `cpu`, batch 1, no padding."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        session = open_session(graph_file, 1)
        out = []
        for i, e in enumerate([*encodings[:5], *encodings]):  # the first five warm it
            ids = np.array([e.ids], dtype=np.int64)
            t0 = time.perf_counter()
            session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
            if i >= 5:
                out.append((time.perf_counter() - t0) * 1000)
        return np.array(out)
    finally:
        os.sched_setaffinity(0, before)


def sums(port: int) -> dict[str, tuple[float, float]]:
    """(sum in seconds, count) of each request histogram, all length buckets together."""
    conn = http.client.HTTPConnection(HOST, port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    out = {}
    for name in SERIES:
        total = count = 0.0
        for kind, value in re.findall(
            rf"^ringserve_request_{name}_seconds_(sum|count)(?:\{{[^}}]*\}})? (\S+)$", text, re.M
        ):
            if kind == "sum":
                total += float(value)
            else:
                count += float(value)
        out[name] = (total, count)
    return out


def lone(port: int, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each text alone, in turn, on one keep-alive connection: client ms and x-latency-ms."""
    conn = http.client.HTTPConnection(HOST, port, timeout=30)
    client, server = [], []
    try:
        for text in texts:
            body = json.dumps({"text": text})
            t0 = time.perf_counter()
            conn.request("POST", "/v1/classify", body, {"content-type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            took = (time.perf_counter() - t0) * 1000
            if resp.status != 200:
                raise RuntimeError(f"/v1/classify answered {resp.status}")
            client.append(took)
            server.append(float(resp.getheader("x-latency-ms") or "nan"))
    finally:
        conn.close()
    return np.array(client), np.array(server)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--texts", type=int, default=200, help="texts of each mix")
    p.add_argument("--args", default="", help="more `ringserve serve` options")
    args = p.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    model_dir = default_artifact_dir()
    m = load_manifest(model_dir)
    tokenizer = load_tokenizer(model_dir, m.max_length)
    texts = {kind: load_texts(path, args.texts) for kind, path in MIXES.items()}
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"model: {model_dir.name}; cpus {cpus}; server options: {args.args or 'defaults'}; "
          f"load average {os.getloadavg()[0]:.2f}; {when}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        srv = Launched(tmp, shlex.split(args.args))
        try:
            srv.wait_ready()
            info = get_json(srv.port, "/v1/model")
            chosen = info.get("graph") or {}
            graph = str(chosen.get("graph", "plain") if isinstance(chosen, dict) else chosen)
            rows = srv.ctl({"cmd": "status"})["workers"]
            layout = "; ".join(f"worker {w['id']}: lanes {w.get('lanes')}, cpus {w['cpus']}"
                               for w in rows)  # fmt: skip
            print(f"server: graph {graph}; {layout}")
            served: dict[str, dict[str, Any]] = {}
            for kind, some in texts.items():
                lone(srv.port, some[:5])  # warm the path, before the counts are read
                before = sums(srv.port)
                client, xlat = lone(srv.port, some)
                after = sums(srv.port)
                means = {}
                for name in SERIES:
                    n = after[name][1] - before[name][1]
                    means[name] = (after[name][0] - before[name][0]) / n * 1000 if n else 0.0
                served[kind] = {"client": client, "x": xlat, **means}
        finally:
            srv.terminate()
    graph_file = model_dir / (m.fused_file if graph == "fused" and m.fused_file else m.onnx_file)
    print("\n| mix | tokens mean | model alone P50 (mean) ms | client P50 ms | x-latency-ms P50 | "
          "x-latency / model | server means ms: latency, queued, model, rest |")  # fmt: skip
    print("| --- " * 7 + "|")
    for kind, some in texts.items():
        encodings = tokenizer.encode_batch(some)
        times = model_ms(graph_file, encodings, cpus[-1])
        alone = float(np.median(times))
        s = served[kind]
        x50 = float(np.median(s["x"]))
        rest = s["latency"] - s["queued"] - s["model"]
        print(f"| {kind} | {np.mean([len(e.ids) for e in encodings]):.1f} | {alone:.2f} "
              f"({float(times.mean()):.2f}) | "
              f"{float(np.median(s['client'])):.2f} | {x50:.2f} | {x50 / alone:.2f} | "
              f"{s['latency']:.2f}, {s['queued']:.2f}, {s['model']:.2f}, {rest:.2f} |")  # fmt: skip
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
