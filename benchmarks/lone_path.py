"""A lone request against the model's own time, for fp32 and the fast precision, in one run.

For each precision (`--precisions`, default `fp32,auto`) the default server (`ringserve serve
--precision P`, on free ports) is started, and each text of each mix (short SST-2, long AG
News) is sent alone on one keep-alive connection (c=1), then run through the model alone in
this process, in turns, text by text, so both see the same load. The model alone is the runner
of the precision and graph the server says it serves (its `/v1/model` `precision`, `runtime`
and `graph`: ONNX Runtime on the served `model.onnx`, its int8 graph, or OpenVINO's bf16
compile of it), one thread pinned to one core, batch 1, no padding. The server's own means a
text come from its Prometheus histograms read before and after each mix
(`ringserve_request_{latency,queued,model}_seconds`): latency (admission to the answer), queued
(the worker's tokenizing, waiting and filling before the forward pass), model (the forward pass
and its activation) and the rest (ring, wake-ups, answer, JSON). The acceptance (issue 60): the
server's `x-latency-ms` P50 at most 1.15x the model's own one-thread batch-1 P50 on the same
texts, short and long, for each precision.

`python -m benchmarks.lone_path [--texts 150] [--precisions fp32,auto] [--args "--spares 0"]`;
run it alone (under the project's heavy lock).
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
from types import SimpleNamespace
from typing import Any

import numpy as np
from ringserve.factory.build import default_artifact_dir
from ringserve.workers.artifact import load_manifest, load_tokenizer
from ringserve.workers.process.batcher import Item
from ringserve.workers.runtimes.cpu import Runner, answer_activation, ort_runner

from devkit.http import HOST, get_json
from devkit.launcher import AG_NEWS, SST2, Launched, load_texts

MIXES = {"short": SST2, "long": AG_NEWS}
SERIES = ("latency", "queued", "model")
BOUND = 1.15  # the server's lone P50 over the model's own (issue 60)
WARM = 5  # texts each side runs first, uncounted


def alone_runner(model_dir: Path, m: Any, info: dict[str, Any]) -> Runner:
    """The runner of what the server serves (precision, runtime, graph), on one thread and
    batch 1: the model alone."""
    graph = info.get("graph") or {}
    spec = SimpleNamespace(
        model_dir=model_dir, precision=info["precision"], threads=1, max_batch=1,
        lanes=1, lone_cores=False,
        graph=str(graph.get("graph", "plain") if isinstance(graph, dict) else graph),
    )  # fmt: skip
    activation = answer_activation(m)  # as the worker's: an embed model's rows hold both
    if info["runtime"] == "openvino":
        from ringserve.workers.runtimes.openvino import ov_runner

        return ov_runner(spec, m, activation)
    if spec.precision == "int8-checked":
        from ringserve.workers.runtimes.checked import checked_runner

        return checked_runner(spec, m, activation)
    return ort_runner(spec, m, activation)


class Alone:
    """The model alone on one core (`cpu`): the runner is made, and each text run, there."""

    def __init__(self, model_dir: Path, m: Any, info: dict[str, Any], cpu: int) -> None:
        self.cpu = cpu
        self.runner: Runner = self.pinned(lambda: alone_runner(model_dir, m, info))

    def pinned(self, call: Any) -> Any:
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {self.cpu})
        try:
            return call()
        finally:
            os.sched_setaffinity(0, before)

    def ms(self, ids: list[int]) -> float:
        def one() -> float:
            self.runner.fill(len(ids), [Item(0, 0, 0, ids)])
            t0 = time.perf_counter()
            self.runner.forward(len(ids), 1)
            return (time.perf_counter() - t0) * 1000

        return float(self.pinned(one))


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


def ask(conn: http.client.HTTPConnection, text: str) -> tuple[float, float]:
    """One text alone: the client's ms and the server's x-latency-ms."""
    body = json.dumps({"text": text})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/classify", body, {"content-type": "application/json"})
    resp = conn.getresponse()
    resp.read()
    took = (time.perf_counter() - t0) * 1000
    if resp.status != 200:
        raise RuntimeError(f"/v1/classify answered {resp.status}")
    return took, float(resp.getheader("x-latency-ms") or "nan")


def turns(port: int, texts: list[str], ids: list[list[int]], alone: Alone) -> dict[str, Any]:
    """Each text to the server alone, then through the model alone, in turns; the server's
    histogram means over the counted texts."""
    conn = http.client.HTTPConnection(HOST, port, timeout=30)
    client, server, model = [], [], []
    try:
        for i in range(WARM):  # warm both paths before the counts are read
            ask(conn, texts[i])
            alone.ms(ids[i])
        before = sums(port)
        for text, some in zip(texts[WARM:], ids[WARM:], strict=True):
            took, xlat = ask(conn, text)
            client.append(took)
            server.append(xlat)
            model.append(alone.ms(some))
        after = sums(port)
    finally:
        conn.close()
    out: dict[str, Any] = {"client": np.array(client), "x": np.array(server)}
    out["alone"] = np.array(model)
    for name in SERIES:
        n = after[name][1] - before[name][1]
        out[name] = (after[name][0] - before[name][0]) / n * 1000 if n else 0.0
    return out


def one_precision(
    precision: str, extra: list[str], texts: dict[str, list[str]], cpu: int
) -> tuple[str, dict[str, dict[str, Any]]]:
    """A server at `precision`: what it serves (a line) and each mix's figures."""
    model_dir = default_artifact_dir()
    m = load_manifest(model_dir)
    tokenizer = load_tokenizer(model_dir, m.max_length)
    with tempfile.TemporaryDirectory() as tmp:
        srv = Launched(tmp, ["--precision", precision, *extra])
        try:
            srv.wait_ready()
            info = get_json(srv.port, "/v1/model")
            rows = srv.ctl({"cmd": "status"})["workers"]
            layout = "; ".join(f"worker {w['id']}: lanes {w.get('lanes')}, cpus {w['cpus']}"
                               for w in rows)  # fmt: skip
            graph = info.get("graph") or {}
            graph = graph.get("graph", "plain") if isinstance(graph, dict) else graph
            line = (f"--precision {precision}: serves {info['precision']} on {info['runtime']}, "
                    f"graph {graph or '-'}; {layout}")  # fmt: skip
            if info.get("precision_chosen_by"):
                line += f"\n  chosen by: {info['precision_chosen_by']}"
            alone = Alone(model_dir, m, info, cpu)
            served = {}
            for kind, some in texts.items():
                ids = [e.ids for e in tokenizer.encode_batch(some)]
                served[kind] = turns(srv.port, some, ids, alone)
                served[kind]["tokens"] = float(np.mean([len(i) for i in ids[WARM:]]))
        finally:
            srv.terminate()
    return line, served


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--texts", type=int, default=150, help="texts of each mix, after 5 warm ones")
    p.add_argument("--precisions", default="fp32,auto", help="servers to run, in turn")
    p.add_argument("--args", default="", help="more `ringserve serve` options")
    args = p.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    texts = {kind: load_texts(path, args.texts + WARM) for kind, path in MIXES.items()}
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"model: {default_artifact_dir().name}; cpus {cpus}; server options: "
          f"{args.args or 'defaults'}; load average {os.getloadavg()[0]:.2f}; {when}")  # fmt: skip
    table = []
    for precision in args.precisions.split(","):
        line, served = one_precision(precision, shlex.split(args.args), texts, cpus[-1])
        print(line)
        table.append((precision, served))
    print(f"\nthe model alone: one thread on cpu {cpus[-1]}, batch 1, each text in turn with "
          f"the server's (bound: x-latency P50 <= {BOUND}x the model's P50)")  # fmt: skip
    print("\n| precision | mix | tokens mean | model alone P50 (mean) ms | client P50 ms | "
          "x-latency-ms P50 | x-latency / model | holds | "
          "server means ms: latency, queued, model, rest |")  # fmt: skip
    print("| --- " * 9 + "|")
    for precision, served in table:
        for kind, s in served.items():
            alone = float(np.median(s["alone"]))
            x50 = float(np.median(s["x"]))
            rest = s["latency"] - s["queued"] - s["model"]
            means = ", ".join(f"{v:.2f}" for v in (s["latency"], s["queued"], s["model"], rest))
            print(f"| {precision} | {kind} | {s['tokens']:.1f} | {alone:.2f} "
                  f"({float(s['alone'].mean()):.2f}) | {float(np.median(s['client'])):.2f} | "
                  f"{x50:.2f} | {x50 / alone:.2f} | {'yes' if x50 <= BOUND * alone else 'NO'} | "
                  f"{means} |")  # fmt: skip
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
