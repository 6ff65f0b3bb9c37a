"""ringserve beside its peers on embeddings, in one run: Infinity, LitServe and PyTriton, the same
model on the same cores and texts, at c=1 and c=32, fp32 against fp32 and each at its best.

  python -m benchmarks.peers [--seconds 4] [--runs 2] [--levels 1,32] [--mixes short,long]
      [--configs fp32,best] [--peers infinity,litserve,pytriton] [--out FILE]

The model: all-MiniLM-L6-v2, the encoder of ringserve's default artifact (the sentence-transformers
directory ringserve's default artifact is built from; nothing is downloaded). Each peer runs as
its users would, from a venv of its own (`make bench-peers`: benchmarks/peers/install_peer.sh),
offline, telemetry off:
- ringserve: its defaults but its answer cache (off: every text comes back many times in a run,
  and no peer has one), `POST /v1/embeddings`;
- Infinity: `infinity_emb v2`, its torch engine and defaults, `POST /embeddings`;
- LitServe: benchmarks/peers/litserve_embed.py, a LitAPI encoding with sentence-transformers on
  torch, LitServe's batching (32 texts or 5 ms), 1 worker, `POST /predict`;
- PyTriton: benchmarks/peers/pytriton_embed.py, a torch callable under @batch with Triton's
  dynamic batcher (32 texts, 5 ms), KServe v2 JSON over Triton's HTTP endpoint.
Every peer uses torch's threads on all cores. A peer that is not installed, or does not start
here, is reported as not run with the reason, and the others still run.

Configurations (--configs), reported apart: fp32, every server in fp32 (ringserve's defaults,
Infinity `--dtype float32`, torch fp32 in LitServe and PyTriton); best, each at its best precision
on this CPU: ringserve `--precision auto` (it says what it chose), and where the CPU has
avx512_bf16 or amx_bf16, Infinity `--dtype bfloat16` and the torch peers' model in bfloat16
(fp32 where it has neither).

All servers of a configuration are up at once and take turns at every level: one text a
request, closed loop, the others idle (their CPU over the draw is recorded: near 0; a peer that
burns more than 5% of a core while idle, as LitServe's batching loop does, is stopped with
SIGSTOP during the others' turns and continued for its own); each draw
runs --runs times, the order reversed each time, the fastest kept. Before the load each server
embeds 4 texts of each mix: the cosine of its vectors to the model's fp32 ones (ringserve's fp32;
each row records the lowest). The output, tee'd to benchmarks/results/peers-STAMP.txt: a machine
line, one JSON line a (config, mix, c), and the table (benchmarks/peers_table.py reads the file
and makes README's table of ratios).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ringserve.workers.cpu import BF16_FLAGS, cpu_flags

from benchmarks import peers_table
from benchmarks.peers_embed import (
    CHECKED,
    FAITHFUL,
    MIXES,
    NO_CACHE,
    OFFLINE,
    SERVED_NAME,
    Infinity,
    PeerProcess,
    Side,
    cosine,
    draw_options,
    start_ringserve,
    turns,
)
from benchmarks.serving import cpu_name, simd_flags, tree_cpu_s
from devkit.launcher import ROOT, free_port, load_texts

CONFIGS = ("fp32", "best")
PEERS = ("infinity", "litserve", "pytriton")
HERE = Path(__file__).with_name("peers")


def has_bf16(flags: set[str]) -> bool:
    return any(f in flags for f in BF16_FLAGS)


def dtype(config: str, flags: set[str]) -> str:
    """The torch dtype a peer serves `config` in on a CPU with `flags`."""
    return "bfloat16" if config == "best" and has_bf16(flags) else "float32"


@dataclass(frozen=True)
class Plan:
    """How one server of one configuration is started and asked."""

    name: str
    setting: str  # what it serves with, in words, for the results
    start: Callable[[Path], PeerProcess]  # its process, given a folder for its log
    path: str
    wire: str
    extra: tuple[tuple[str, str], ...] = ()


def peer_plan(name: str, config: str, flags: set[str], venv: Path, model_dir: Path) -> Plan:
    """Peer `name` in `config`: its command line and its wire."""
    dt = dtype(config, flags)
    python = str(venv / "bin" / "python")
    if name == "infinity":
        args = ["--dtype", dt]
        return Plan(
            name, f"infinity_emb v2, torch engine, --dtype {dt}",
            lambda tmp: Infinity(venv, model_dir, args, tmp / "infinity.log"),
            "/embeddings", "openai", (("model", SERVED_NAME),),
        )  # fmt: skip
    if name == "litserve":

        def litserve(tmp: Path) -> PeerProcess:
            port = free_port()
            cmd = [python, str(HERE / "litserve_embed.py"), "--port", str(port),
                   "--model", str(model_dir), "--dtype", dt]  # fmt: skip
            return PeerProcess("LitServe", port, cmd, ROOT, OFFLINE, tmp / "litserve.log")

        return Plan(name, f"LitAPI, sentence-transformers on torch {dt}, batches of 32 or 5 ms, "
                    "1 worker", litserve, "/predict", "plain")  # fmt: skip

    def pytriton(tmp: Path) -> PeerProcess:
        port = free_port()
        cmd = [python, str(HERE / "pytriton_embed.py"), "--port", str(port),
               "--grpc-port", str(free_port()), "--metrics-port", str(free_port()),
               "--model", str(model_dir), "--dtype", dt]  # fmt: skip
        return PeerProcess("PyTriton", port, cmd, ROOT, OFFLINE, tmp / "pytriton.log",
                           health="/v2/models/minilm/ready")  # fmt: skip

    return Plan(name, f"@batch torch {dt} callable, dynamic batching 32 or 5 ms, KServe v2 HTTP",
                pytriton, "/v2/models/minilm/infer", "kserve")  # fmt: skip


def ringserve_args(config: str, base: list[str]) -> list[str]:
    return [*NO_CACHE, *base, *(["--precision", "auto"] if config == "best" else [])]


def venv_of(name: str, args: argparse.Namespace) -> Path:
    return Path(getattr(args, f"{name}_venv"))


def installed(name: str, venv: Path) -> str | None:
    """Why peer `name` cannot run from `venv`, or None."""
    if not (venv / ".installed").exists():
        return f"not installed in {venv} (`make bench-peers`, or " \
               f"benchmarks/peers/install_peer.sh {name} {venv})"  # fmt: skip
    return None


def reason(text: str, width: int = 300) -> str:
    """Why a peer did not start, in a line: the last line of its log's tail that names an error
    (a Python traceback's last, Triton's `E...` lines), else its first line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.search(r"Error|Exception|error:|^E\d{4}", ln)]
    said = errors[-1] if errors else lines[0] if lines else "no output"
    return said if len(said) <= width else said[: width - 3] + "..."


def start_peers(plans: list[Plan], tmp: Path) -> tuple[list[Side], list[PeerProcess], list[str]]:
    """Every peer started at once, then each waited for: its sides, its processes to stop, and
    a line for each that did not start."""
    procs, sides, failed = [], [], []
    launched = []
    for plan in plans:
        try:
            launched.append((plan, plan.start(tmp)))
        except OSError as exc:
            failed.append(f"not run: {plan.name}: {exc}")
    for plan, proc in launched:
        procs.append(proc)
        try:
            proc.wait_ready(300.0)
        except (RuntimeError, TimeoutError) as exc:
            failed.append(f"not run: {plan.name}: {reason(str(exc))}")
            proc.close()
            continue
        sides.append(Side(plan.name, proc.port, proc.pid, plan.path, dict(plan.extra),
                          plan.wire, setting=plan.setting))  # fmt: skip
    return sides, procs, failed


def check_vectors(
    sides: list[Side], texts: dict[str, list[str]], model: list[list[float]] | None, fp32: bool
) -> list[list[float]] | None:
    """Each side's lowest cosine to the model's fp32 vectors (`model`; in the fp32
    configuration, ringserve's own when `model` is None; without them, unmeasured: nan),
    printed; the model's vectors."""
    sample = [t for mix in texts.values() for t in mix[:CHECKED]]
    vectors = {s.name: s.embed(sample) for s in sides}
    if model is None and fp32 and "ringserve" in vectors:
        model = vectors["ringserve"]
    for s in sides:
        if model is None:
            continue
        s.cosine_min = min(cosine(x, y) for x, y in zip(vectors[s.name], model, strict=True))
        flag = "" if s.cosine_min >= FAITHFUL else f" NOT FAITHFUL (under {FAITHFUL})"
        print(f"vectors, {s.name} against the model's fp32 ones on {len(sample)} texts: "
              f"cosine min {s.cosine_min:.6f}{flag}")  # fmt: skip
    return model


BUSY_IDLE_PCT = 5.0  # a peer idling above this share of a core is stopped during others' turns


def idle_cpu(sides: list[Side], seconds: float = 2.0) -> dict[str, float]:
    """Each side's CPU with nothing sent to any, % of one core."""
    before = {s.name: tree_cpu_s(s.pid)[0] for s in sides}
    time.sleep(seconds)  # a measurement window, not a wait for a state
    return {s.name: (tree_cpu_s(s.pid)[0] - before[s.name]) * 100 / seconds for s in sides}


def busy_idlers(sides: list[Side], peers: set[str]) -> list[Side]:
    """The peers (in sessions of their own, `peers`) that burn CPU while idle, printed: each is
    stopped (SIGSTOP to its group) while another server is measured, so that it takes nothing
    from it (LitServe's batching loop polls its queue every millisecond)."""
    idle = idle_cpu(sides)
    print("idle CPU, % of a core: " + ", ".join(f"{n} {v:.1f}" for n, v in idle.items()))
    busy = [s for s in sides if s.name in peers and idle[s.name] > BUSY_IDLE_PCT]
    for s in busy:
        print(f"{s.name} idles at {idle[s.name]:.1f}% of a core: stopped while the others are "
              "measured")  # fmt: skip
    return busy


@contextlib.contextmanager
def stopped(sides: list[Side]) -> Iterator[None]:
    """`sides` (each the leader of its own process group) stopped for the block."""
    for s in sides:
        os.killpg(s.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for s in sides:
            os.killpg(s.pid, signal.SIGCONT)


def measure(
    sides: list[Side],
    texts: dict[str, list[str]],
    args: argparse.Namespace,
    config: str,
    busy: list[Side],
) -> list[dict[str, Any]]:
    """peers_embed's turns, the `busy` sides stopped during the others' turns; a row each,
    printed as it comes."""

    def row(mix: str, c: int) -> dict[str, Any]:
        made = peers_table.row(config, mix, c, sides)
        print(json.dumps(made), flush=True)
        return made

    return turns(sides, texts, args, row, lambda side: stopped([s for s in busy if s is not side]))


def run_config(
    config: str,
    texts: dict[str, list[str]],
    args: argparse.Namespace,
    model: list[list[float]] | None,
) -> tuple[list[dict[str, Any]], list[list[float]] | None]:
    from ringserve.factory.build import default_encoder_dir

    flags = cpu_flags()
    ours = ringserve_args(config, shlex.split(args.ringserve_args))
    print(f"\n{config}: ringserve {' '.join(ours) or '(its defaults)'}", flush=True)
    plans, missing = [], []
    for name in args.peers:
        venv = venv_of(name, args)
        if (why := installed(name, venv)) is not None:
            missing.append(f"not run: {name}: {why}")
            continue
        plans.append(peer_plan(name, config, flags, venv, default_encoder_dir()))
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        t0 = time.monotonic()
        srv = start_ringserve(Path(tmp), ours)  # alone first: `auto` times its candidates
        sides: list[Side] = []
        if srv is not None:
            served = json.loads(srv_model(srv.port))
            setting = f"{' '.join(ours) or 'defaults'}: {served.get('precision')} on " \
                      f"{served.get('runtime')}"  # fmt: skip
            print(f"ringserve ready in {time.monotonic() - t0:.1f} s, serving {setting}")
            sides.append(Side("ringserve", srv.port, srv.pid, "/v1/embeddings", setting=setting))
        else:
            missing.append("not run: ringserve: did not start (its log's last line above)")
        t1 = time.monotonic()
        peer_sides, procs, failed = start_peers(plans, Path(tmp))
        print(f"peers ready in {time.monotonic() - t1:.1f} s")
        try:
            for line in missing + failed:
                print(f"{config}: {line}")
            sides += peer_sides
            for s in sides:
                print(f"{config}: {s.name}: {s.setting}")
            model = check_vectors(sides, texts, model, config == "fp32")
            busy = busy_idlers(sides, {s.name for s in peer_sides})
            return measure(sides, texts, args, config, busy), model
        finally:
            for proc in procs:
                proc.close()
            if srv is not None:
                srv.terminate(60)


def srv_model(port: int) -> bytes:
    from devkit.http import http_request

    return http_request(port, "GET", "/v1/model")[2]


def options(argv: list[str] | None) -> argparse.Namespace:
    p = draw_options(__doc__ or "", 4.0, "1,32")
    p.add_argument("--configs", default=",".join(CONFIGS), help="fp32, best or both")
    p.add_argument("--peers", default=",".join(PEERS), help="which peers run")
    p.add_argument("--ringserve-args", default="", help="`ringserve serve` options for every run")
    for name in PEERS:
        p.add_argument(f"--{name}-venv", type=Path, default=ROOT / f".venv-{name}")
    p.add_argument("--note", default="", help="a line for the results file's header (a trial, "
                   "what else ran)")  # fmt: skip
    p.add_argument("--out", type=Path, help="the results file (default: "
                   "benchmarks/results/peers-STAMP.txt; '-' for none)")  # fmt: skip
    args = p.parse_args(argv)
    args.levels = [int(c) for c in args.levels.split(",")]
    args.mixes = [m for m in MIXES if m in args.mixes.split(",")]
    args.configs = [c for c in CONFIGS if c in args.configs.split(",")]
    args.peers = [n for n in PEERS if n in args.peers.split(",")]
    return args


class Tee:
    """stdout and the results file at once."""

    def __init__(self, *streams: TextIO) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()


@contextlib.contextmanager
def results_file(out: Path | None, stamp: str) -> Iterator[Path | None]:
    if out is not None and str(out) == "-":
        yield None
        return
    path = out or peers_table.RESULTS / f"peers-{stamp}.txt"
    with open(path, "w", encoding="utf-8") as f, contextlib.redirect_stdout(Tee(sys.stdout, f)):
        yield path


def versions(args: argparse.Namespace) -> str:
    """Each installed peer's package and torch versions."""
    found = []
    for name in args.peers:
        venv = venv_of(name, args)
        wanted = [ln.split("==")[0].split("[")[0] for ln in (HERE / f"{name}.txt").read_text()
                  .splitlines() if ln.strip() and not ln.startswith("#")]  # fmt: skip
        code = "import importlib.metadata as m, sys; print(', '.join(f'{n} ' + m.version(n) " \
               "for n in sys.argv[1:]))"  # fmt: skip
        if installed(name, venv) is None:
            out = subprocess.run([str(venv / "bin" / "python"), "-c", code, *wanted, "torch"],
                                 capture_output=True, text=True).stdout.strip()  # fmt: skip
            found.append(f"{name}: {out or 'versions unknown'}")
    return "; ".join(found) or "no peer installed"


def main(argv: list[str] | None = None) -> int:
    args = options(argv)
    texts = {m: load_texts(MIXES[m], args.texts) for m in args.mixes}
    stamp = time.strftime("%Y%m%dT%H%MZ", time.gmtime())
    with results_file(args.out, stamp) as path:
        print(f"# python -m benchmarks.peers {shlex.join(sys.argv[1:] if argv is None else argv)}")
        if args.note:
            print(f"# {args.note}")
        print(f"machine: {cpu_name()}, {os.cpu_count()} cpus, flags {simd_flags()}"
              f"{' amx_bf16' if 'amx_bf16' in cpu_flags() else ''}")  # fmt: skip
        print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average "
              f"{os.getloadavg()[0]:.1f}; {versions(args)}; {args.seconds:g} s a draw, best of "
              f"{args.runs}")  # fmt: skip
        t0 = time.monotonic()
        rows: list[dict[str, Any]] = []
        model = None
        for config in args.configs:
            got, vectors = run_config(config, texts, args, model)
            rows += got
            if config == "fp32":
                model = vectors
        print()
        print(peers_table.full_table(rows))
        print()
        print("\n".join(peers_table.acceptance(rows)))
        print(f"took {time.monotonic() - t0:.0f} s; load average after {os.getloadavg()[0]:.1f}")
    if path is not None:
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
