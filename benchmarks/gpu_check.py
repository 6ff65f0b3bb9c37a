"""Checks ringserve's CUDA path on a GPU machine in one run and prints one pass/fail table.

NOT YET RUN ON A GPU: every row below was only rehearsed on the CPU (`--dry-run`, and
`--device fake-gpu`, where CUDA-only rows say "n/a").

Rows, in order (PASS/FAIL rows decide the exit status; the others are measurements):
  env       torch, CUDA and the device are usable                                   PASS/FAIL
  graphs    captured as expected (every shape of the grid, no capture error)        PASS/FAIL
            graph memory from the shared pool, after every capture (> 0)            PASS/FAIL
            capture time; replay against eager latency at a few shapes
            same text alone and in a padded batch, max abs diff <= 1e-5 (fp32)      PASS/FAIL
            no allocation in 20 graph replays                                       PASS/FAIL
  precision fp16 and bf16 against fp32: drift, argmax flips, speed
  server    a real `ringserve serve --device cuda`: every worker on CUDA            PASS/FAIL
            every worker captured its graphs, no capture_error, graph_bytes > 0     PASS/FAIL
            served scores against the CPU reference; throughput at 1, 32 and 256
            connections (no failed request); GPU memory before and after load       PASS/FAIL
  oom       forced out-of-memory errors (test hook): no request fails, recovers     PASS/FAIL
  realoom   the GPU filled by this process: an eager batch falls back to the CPU    PASS/FAIL

Results are written to OUT/gpu_check.json (and .txt) after every section, so a run cut short
keeps what it did. The whole run fits --budget-s (420 s): a section that would not fit is
skipped, said in its rows.

A device machine may have no network, no default-model package, and its own python and torch
(the env row reports which torch ran). Prepare here, from the repo root: the encoder with fp16
weights (~46 MB; the texts come from data/ in the repository) and the wheels it may lack:

    .venv/bin/python benchmarks/gpu_check.py --pack .gpucheck
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .gpucheck/whl httptools==0.9.0 psutil==7.2.2

then run there, carrying `.gpucheck`, within a 540 s limit:

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpucheck/whl/*.whl \
        && export PYTHONPATH=/tmp/site:$PWD && PYTHONUNBUFFERED=1 \
        python3 benchmarks/gpu_check.py --out $OUT 2>&1 | tee $OUT/gpu_check.log
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from ringserve.service.config.settings import GPU_MAX_BATCH, GPU_MAX_BATCH_TOKENS  # noqa: E402
from ringserve.workers.process.batcher import CUDA_BUCKETS as GRID  # noqa: E402 - the CUDA default grid

from devkit.http import classify_request, get_json, http_request  # noqa: E402 - after the path set-up above
from devkit.launcher import AG_NEWS, SST2, Launched, load_texts  # noqa: E402
from devkit.load import LoadResult, median, run_load  # noqa: E402

CPU_SHAPES = (8, 512)  # rows and tokens a batch for the fake GPU: a CPU runs GPU shapes for minutes
SECTIONS = ("graphs", "precision", "server", "oom", "realoom")
# (section, check, pass/fail?) for every row the run produces, in order.
PLAN: tuple[tuple[str, str, bool], ...] = (
    ("env", "torch, CUDA and the device", True),
    ("graphs", "captured as expected", True),
    ("graphs", "graph memory (shared pool)", True),
    ("graphs", "capture time", False),
    ("graphs", "replay vs eager, 16 tokens x 1", False),
    ("graphs", "replay vs eager, 64 tokens x all rows", False),
    ("graphs", "replay vs eager, 256 tokens x all rows", False),
    ("graphs", "same text alone vs in a padded batch (fp32 1e-5)", True),
    ("graphs", "allocations in 20 replays", True),
    ("precision", "fp16 vs fp32", False),
    ("precision", "bf16 vs fp32", False),
    ("server", "ready after", False),
    ("server", "every worker on CUDA", True),
    ("server", "every worker's graphs captured", True),
    ("server", "served vs CPU reference", False),
    ("server", "throughput, 1 connection", True),
    ("server", "throughput, 32 connections", True),
    ("server", "throughput, 256 connections", True),
    ("server", "GPU memory before / after load", False),
    ("oom", "forced OOM: failed requests", True),
    ("oom", "forced OOM: degraded, then recovered", True),
    ("realoom", "eager batch with the GPU full", True),
)


# -- the table -------------------------------------------------------------------------------------
@dataclass
class Row:
    section: str
    check: str
    graded: bool
    result: str = "not run"
    note: str = ""
    ok: bool | None = None  # None: a measurement, or not run

    @property
    def verdict(self) -> str:
        return "" if self.ok is None else ("PASS" if self.ok else "FAILED")


@dataclass
class Table:
    out: Path | None
    budget_s: float
    started: float = field(default_factory=time.monotonic)
    rows: dict[tuple[str, str], Row] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rows = {(s, c): Row(s, c, g) for s, c, g in PLAN}

    def set(
        self, section: str, check: str, result: Any, note: str = "", ok: bool | None = None
    ) -> None:
        row = self.rows[(section, check)]
        row.result = f"{result:.4g}" if isinstance(result, float) else str(result)
        row.note, row.ok = note, ok if row.graded else None
        elapsed = time.monotonic() - self.started
        print(f"[{elapsed:6.1f}s] {section} | {check} | {row.result} | {row.verdict} | {note}")

    def mark(self, section: str, result: str, note: str = "", ok: bool | None = None) -> None:
        """Every row of `section` not yet set: skipped, n/a, or FAILED with the error."""
        for row in self.rows.values():
            if row.section == section and row.result == "not run":
                row.result, row.note = result, note
                row.ok = ok if row.graded else None
                if row.graded and ok is None:
                    row.note += "; a pass/fail row"

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    @contextlib.contextmanager
    def section(self, name: str, cost_s: float) -> Iterator[bool]:
        """Runs a section when the budget allows; an exception FAILs its unset rows. The table
        is written after every section."""
        if self.left_s() < cost_s:
            self.mark(name, "skipped", f"time budget: {self.left_s():.0f}s left, needs {cost_s}s")
            yield False
        else:
            try:
                yield True
            except Exception as exc:  # noqa: BLE001 - one broken section must not hide the rest
                traceback.print_exc()
                self.mark(name, type(exc).__name__, first_line(exc), ok=False)
        self.save()

    def failed(self) -> bool:
        return any(r.ok is False for r in self.rows.values())

    def render(self) -> str:
        head = ("section", "check", "result", "verdict", "note")
        body = [(r.section, r.check, r.result, r.verdict, r.note) for r in self.rows.values()]
        widths = [max(len(x[i]) for x in [head, *body]) for i in range(4)]
        fmt = " | ".join(f"{{:{w}}}" for w in widths) + " | {}"
        return "\n".join([fmt.format(*head), "-+-".join("-" * w for w in widths)] +
                         [fmt.format(*r) for r in body])  # fmt: skip

    def save(self) -> None:
        if self.out is None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        rows = [vars(r) | {"verdict": r.verdict} for r in self.rows.values()]
        doc = {"rows": rows, "failed": self.failed(), **self.data}
        (self.out / "gpu_check.json").write_text(json.dumps(doc, indent=1, default=str))
        (self.out / "gpu_check.txt").write_text(self.render() + "\n")


def first_line(exc: BaseException) -> str:
    lines = [x for x in str(exc).splitlines() if x.strip()]
    return (lines[0] if lines else type(exc).__name__)[:160]


# -- arguments and inputs --------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda:0", help="cuda:K, or fake-gpu for a CPU rehearsal")
    p.add_argument("--model", default=None, help="a model artifact directory to use as is")
    p.add_argument("--encoder", default=str(ROOT / ".gpucheck" / "encoder"),
                   help="encoder dir to build the artifact from (made by --pack)")  # fmt: skip
    p.add_argument("--workers-per-gpu", type=int, default=2, help="for the server runs")
    p.add_argument("--load-s", type=float, default=8.0, help="seconds per concurrency level")
    p.add_argument("--oom-batches", type=int, default=5, help="injected OOMs per worker")
    p.add_argument("--budget-s", type=float, default=420.0, help="skip sections past this")
    p.add_argument("--quick", action="store_true", help="short loads and fewer repetitions")
    p.add_argument("--dry-run", action="store_true", help="run the env row, list the others")
    p.add_argument("--out", default=None, help="folder for gpu_check.json/.txt and server logs")
    p.add_argument("--pack", default=None, metavar="DIR", help="only write DIR for the device")
    p.add_argument("--only", default=",".join(SECTIONS), help=f"sections of {','.join(SECTIONS)}")
    args = p.parse_args(argv)
    args.only = {x.strip() for x in args.only.split(",") if x.strip()}
    if args.only - set(SECTIONS):
        p.error(f"--only: unknown sections {sorted(args.only - set(SECTIONS))}")
    args.reps = 5 if args.quick else 40
    fake = args.device == "fake-gpu"
    args.max_batch, args.max_tokens = CPU_SHAPES if fake else (GPU_MAX_BATCH, GPU_MAX_BATCH_TOKENS)
    if args.quick:
        args.load_s = min(args.load_s, 3.0)
    return args


def pack(dest: str) -> None:
    """Write the encoder (weights as fp16: the fp32 file is over the carry limit) into `dest`."""
    import shutil

    from ringserve.factory.build import default_encoder_dir
    from safetensors.torch import load_file, save_file

    src, out = default_encoder_dir(), Path(dest) / "encoder"
    out.mkdir(parents=True, exist_ok=True)
    tensors = load_file(str(src / "model.safetensors"))
    save_file({k: v.half() if v.is_floating_point() else v for k, v in tensors.items()},
              str(out / "model.safetensors"))  # fmt: skip
    for name in ("config.json", "tokenizer.json"):
        shutil.copyfile(src / name, out / name)
    print(f"wrote {out} (fp16 weights); texts come from {SST2.parent.parent} in the repository")


def make_texts(base: list[str], n: int) -> list[str]:
    """`n` texts of mixed lengths (short ones, and joins of several that reach 128 and 256)."""
    out = []
    for i in range(n):
        parts = 1 if i % 3 == 0 else (3 if i % 3 == 1 else 12)
        out.append(" ".join(base[(i * 7 + k) % len(base)] for k in range(parts)))
    return out


def artifact_dir(args: argparse.Namespace) -> str:
    """--model; else an artifact built from the packed encoder; else the default model."""
    if args.model:
        return str(args.model)
    encoder = Path(args.encoder)
    if not (encoder / "model.safetensors").is_file():
        from ringserve.factory.build import default_artifact_dir

        return str(default_artifact_dir())
    from ringserve.factory.build import DEFAULT_HEAD, build_artifact, read_head

    head, info = read_head(DEFAULT_HEAD)
    out = Path(tempfile.mkdtemp(prefix="gpucheck-")) / "model"
    build_artifact(out, encoder, head, "gpucheck-minilm", info["labels"], 256)
    return str(out)


# -- env -------------------------------------------------------------------------------------------
def check_env(table: Table, device: str) -> bool:
    """The first row: torch imports, CUDA is usable, the device answers. False stops the run."""
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - a broken install is this row's answer
        table.set("env", "torch, CUDA and the device", "no torch", first_line(exc), ok=False)
        return False
    what = f"torch {torch.__version__}, CUDA {torch.version.cuda}"
    if device == "fake-gpu":
        table.set("env", "torch, CUDA and the device", "fake GPU (the CPU)", what, ok=True)
        return True
    try:
        if not torch.cuda.is_available():
            raise RuntimeError(f"torch.cuda.is_available() is False ({what})")
        name = torch.cuda.get_device_name(torch.device(device))
        free, total = torch.cuda.mem_get_info(torch.device(device))
    except Exception as exc:  # noqa: BLE001 - no CUDA, a bad index, a lost device: all FAIL
        table.set("env", "torch, CUDA and the device", "unusable", first_line(exc), ok=False)
        return False
    note = f"{what}; {free / 2**30:.1f} of {total / 2**30:.1f} GiB free"
    table.set("env", "torch, CUDA and the device", name, note, ok=True)
    return True


# -- in-process runner checks ----------------------------------------------------------------------
def tokenize(model_dir: str, texts: list[str]) -> list[Any]:
    from ringserve.workers.artifact import load_tokenizer
    from ringserve.workers.batches import Item

    tok = load_tokenizer(model_dir, max(GRID))
    return [Item(i, 0, 0, e.ids) for i, e in enumerate(tok.encode_batch(texts))]


def synthetic(length: int, n: int) -> list[Any]:
    from ringserve.workers.batches import Item

    body = [[2000 + (i * 31 + k * 7) % 20000 for k in range(length - 2)] for i in range(n)]
    return [Item(i, 0, 0, [101, *ids, 102]) for i, ids in enumerate(body)]


def time_ms(fn: Callable[[], Any], reps: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return median(times)


def score_all(runner: Any, items: list[Any]) -> Any:
    """Probabilities for every item, batched on the grid as a worker would."""
    import numpy as np
    from ringserve.workers.process.batcher import bucket_index

    out = np.zeros((len(items), 2), dtype=np.float32)
    groups: dict[int, list[Any]] = {}
    for it in items:
        groups.setdefault(bucket_index(runner.buckets, len(it.ids)), []).append(it)
    for b, group in groups.items():
        for i in range(0, len(group), runner.limits[b]):
            batch = group[i : i + runner.limits[b]]
            runner.fill(runner.buckets[b], batch)
            out[[it.msg_id for it in batch]] = runner.forward(runner.buckets[b], len(batch))
    return out


def new_runner(args: argparse.Namespace, model: Any, grid: tuple[int, ...], precision: str) -> Any:
    from ringserve.workers.runtimes.cuda import CudaRunner

    return CudaRunner(
        model, grid, args.max_batch, args.device, precision, max_tokens=args.max_tokens
    )


def check_graphs(args: argparse.Namespace, table: Table, model: Any, items: list[Any]) -> Any:
    import numpy as np

    runner = new_runner(args, model, GRID, "fp32")
    runner.warm()
    graphs = runner.graphs
    n, want = len(graphs), graphs.expected
    fake = not runner.on_cuda
    ok = None if fake else (n == want > 0 and not graphs.error)
    note = graphs.error or f"{want} expected" + (" (fake GPU: none)" if fake else "")
    table.set("graphs", "captured as expected", n, note, ok=ok)
    mib = graphs.held_bytes() / 2**20
    table.set("graphs", "graph memory (shared pool)", f"{mib:.1f} MiB", "measured after capture",
              ok=None if fake else graphs.held_bytes() > 0)  # fmt: skip
    table.set("graphs", "capture time", f"{graphs.seconds:.2f}s", f"{n} graphs")
    table.data["graph_stats"] = graphs.stats
    for length, check in ((16, "16 tokens x 1"), (64, "64 tokens x all rows"),
                          (256, "256 tokens x all rows")):  # fmt: skip
        rows = 1 if length == 16 else runner.limits[GRID.index(length)]
        runner.fill(length, synthetic(length, rows))
        replay = time_ms(partial(runner.forward, length, rows), args.reps)
        eager = time_ms(partial(runner.forward_eager, length, rows), max(3, args.reps // 4))
        table.set("graphs", f"replay vs eager, {check}", f"{replay:.3f} ms",
                  f"{rows} rows; eager {eager:.3f} ms, x{eager / replay:.1f}")  # fmt: skip
    short = [it for it in items if len(it.ids) <= 64]
    runner.fill(64, short[:1])
    alone = runner.forward(64, 1)[0]
    n = min(13, runner.limits[GRID.index(64)])  # padded up to the next captured row count
    runner.fill(64, short[:n])
    diff = float(np.abs(alone - runner.forward(64, n)[0]).max())
    table.set("graphs", "same text alone vs in a padded batch (fp32 1e-5)", diff,
              "max abs diff", ok=diff <= 1e-5)  # fmt: skip
    check_allocations(table, runner)
    return runner


def check_allocations(table: Table, runner: Any) -> None:
    """A replay takes nothing from the caching allocator (eager runs do, for comparison)."""
    if not runner.on_cuda:
        table.set("graphs", "allocations in 20 replays", "n/a", "needs CUDA")
        return
    import torch

    def count(fn: Callable[[], Any]) -> int:
        key = "allocation.all.allocated"
        before = torch.cuda.memory_stats(runner.torch_device)[key]
        for _ in range(20):
            fn()
        return int(torch.cuda.memory_stats(runner.torch_device)[key] - before)

    runner.fill(16, synthetic(16, 7))
    graph, eager = (
        count(partial(runner.forward, 16, 7)),
        count(partial(runner.forward_eager, 16, 7)),
    )
    table.set("graphs", "allocations in 20 replays", graph, f"eager: {eager}", ok=graph == 0)


def check_precision(args: argparse.Namespace, table: Table, fp32: Any, items: list[Any]) -> None:
    import numpy as np

    grid = (64, 256)  # two shapes: drift and speed, without capturing the whole grid again
    base_runner = new_runner(args, fp32.model, grid, "fp32")
    base_runner.warm()
    base = score_all(base_runner, items)
    for precision in ("fp16", "bf16"):
        runner = new_runner(args, fp32.model, grid, precision)
        runner.warm()
        probs = score_all(runner, items)
        diff = np.abs(probs - base)
        flips = int((probs.argmax(1) != base.argmax(1)).sum())
        rows = runner.limits[1]
        runner.fill(256, synthetic(256, rows))
        base_runner.fill(256, synthetic(256, rows))
        t = time_ms(partial(runner.forward, 256, rows), max(3, args.reps // 2))
        t32 = time_ms(partial(base_runner.forward, 256, rows), max(3, args.reps // 2))
        table.set("precision", f"{precision} vs fp32", f"{diff.max():.2e}",
                  f"mean {diff.mean():.1e}; flips {flips}/{len(items)}; 256 x {rows}: "
                  f"{t:.2f} ms vs {t32:.2f} ms")  # fmt: skip


def check_real_oom(args: argparse.Namespace, table: Table, model: Any) -> None:
    """Fill the GPU from this process, then run an eager batch: the real error falls back."""
    import torch
    from ringserve.workers.runtimes.cpu import CpuRunner
    from ringserve.workers.runtimes.cuda import CudaRunner, FallbackRunner

    eager = CudaRunner(model, (256,), 64, args.device, graphs=False, max_tokens=args.max_tokens)
    cpu = CpuRunner(model, 256, 64)
    runner = FallbackRunner(eager, cpu, None, probe_every=1, probe_after_s=0.0)
    runner.warm()
    hog = []
    for chunk in (1 << 30, 1 << 26, 1 << 21):  # plain cudaMalloc through torch
        with contextlib.suppress(torch.cuda.OutOfMemoryError):
            while True:
                hog.append(torch.empty(chunk, dtype=torch.uint8, device=eager.torch_device))
    items = synthetic(256, 64)
    runner.fill(256, items)
    served = len(runner.forward(256, 64))
    fell = runner.fallbacks
    hog.clear()
    torch.cuda.empty_cache()
    runner.fill(256, items)
    runner.forward(256, 64)
    ok = served == 64 and fell >= 1 and not runner.degraded
    table.set("realoom", "eager batch with the GPU full", f"{served} rows served",
              f"fallbacks {fell}; back on the GPU: {not runner.degraded}", ok=ok)  # fmt: skip


# -- the real server -------------------------------------------------------------------------------
def _load_process(port: int, texts: list[str], conc: int, seconds: float) -> tuple[Any, Any]:
    requests = [classify_request(t) for t in texts]
    r = asyncio.run(run_load(port, requests, conc, seconds, warmup_s=0.5))
    return dict(r.codes), r.latencies_ms


def load(port: int, texts: list[str], conc: int, seconds: float) -> LoadResult:
    """devkit.load.run_load in up to 4 client processes (one Python process would cap a
    GPU server's throughput), merged into one result."""
    procs = max(1, min(4, conc // 16))
    shares = [conc // procs + (i < conc % procs) for i in range(procs)]
    ctx = multiprocessing.get_context("spawn")  # never fork a process that holds CUDA
    with ctx.Pool(procs) as pool:
        parts = pool.starmap(_load_process, [(port, texts, n, seconds) for n in shares])
    out = LoadResult(conc, seconds)
    for codes, lat in parts:
        out.codes.update(codes)
        out.latencies_ms += lat
    return out


def start_server(args: argparse.Namespace, model_dir: str, env: dict[str, str]) -> Launched:
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="gpucheck-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.device == "fake-gpu":
        env = {**env, "RINGSERVE_TEST_FAKE_GPU": "1"}
    device = "fake-gpu" if args.device == "fake-gpu" else "cuda"
    srv = Launched(out, ["--model", model_dir, "--device", device, "--spares", "0",
                         "--workers-per-gpu", str(args.workers_per_gpu), "--max-queue", "4096"],
                   env, binary=False)  # fmt: skip
    srv.wait_ready(timeout=90)
    return srv


def check_workers(args: argparse.Namespace, table: Table, srv: Launched) -> None:
    stats = get_json(srv.port, "/v1/stats")
    table.data["stats_after_boot"] = stats
    rows, fake = stats["workers"], args.device == "fake-gpu"
    devices = sorted({w["device"] for w in rows})
    on_cuda = bool(rows) and all(w["device"].startswith("cuda") for w in rows) and stats["gpus"]
    table.set("server", "every worker on CUDA", ", ".join(devices),
              f"{len(rows)} workers; gpus reported: {len(stats['gpus'])}",
              ok=None if fake else bool(on_cuda))  # fmt: skip
    graphs = [(w.get("graphs"), w.get("graphs_expected"), w.get("graph_bytes")) for w in rows]
    errors = [w["capture_error"] for w in rows if w.get("capture_error")]
    good = all(g == e and e and b and b > 0 for g, e, b in graphs) and not errors
    table.set("server", "every worker's graphs captured", json.dumps(graphs),
              "; ".join(errors) or "(captured, expected, bytes) per worker",
              ok=None if fake else good)  # fmt: skip


def check_served(table: Table, srv: Launched, model_dir: str, texts: list[str]) -> None:
    import numpy as np
    from ringserve.workers.artifact import reference_logits
    from ringserve.workers.runtimes.cpu import softmax

    want = softmax(reference_logits(model_dir, texts))
    got = []
    for i in range(0, len(texts), 64):
        body = json.dumps({"texts": texts[i : i + 64]})
        status, _, data = http_request(srv.port, "POST", "/v1/classify", body)
        if status != 200:
            raise RuntimeError(f"classify answered {status}: {data[:200]!r}")
        got += [r["scores"] for r in json.loads(data)["results"]]
    diff = np.abs(np.asarray(got, dtype=np.float32) - want)
    flips = int((np.asarray(got).argmax(1) != want.argmax(1)).sum())
    table.set("server", "served vs CPU reference", f"{diff.max():.2e}",
              f"max abs diff over {len(texts)} texts; argmax differs on {flips}")  # fmt: skip


def gpu_memory(args: argparse.Namespace) -> int | None:
    from ringserve.workers.runtimes import nvml

    reader = nvml.Nvml()
    index = int(args.device.split(":")[1]) if ":" in args.device else 0
    sample = reader.sample(reader.handle(index))
    return sample.mem_used if sample is not None else None


def check_load(args: argparse.Namespace, table: Table, srv: Launched, texts: list[str]) -> None:
    before = gpu_memory(args)
    for conc in (1, 32, 256):
        r = load(srv.port, texts, conc, args.load_s)
        table.data[f"load_c{conc}"] = {"rps": r.rps, "codes": dict(r.codes),
                                       "p50_ms": r.pct(50), "p99_ms": r.pct(99)}  # fmt: skip
        table.set("server", f"throughput, {conc} connection" + ("s" if conc > 1 else ""),
                  f"{r.rps:.0f} req/s", f"p50 {r.pct(50):.1f} ms p99 {r.pct(99):.1f} ms, "
                  f"failed {r.failed}", ok=r.failed == 0 and r.ok > 0)  # fmt: skip
    after = gpu_memory(args)
    shown = "/".join("-" if m is None else f"{m / 2**20:.0f}" for m in (before, after))
    table.set("server", "GPU memory before / after load", f"{shown} MiB", "NVML, whole device")


def check_forced_oom(args: argparse.Namespace, table: Table, model_dir: str,
                     texts: list[str]) -> None:  # fmt: skip
    srv = start_server(args, model_dir, {"RINGSERVE_TEST_INJECT_OOM": str(args.oom_batches)})
    try:
        r = load(srv.port, texts, 32, max(args.load_s, 4.0))
        deadline = time.monotonic() + 20  # a worker recovers on its next batch after a probe delay
        while True:
            logs = srv.logs()
            degraded, recovered = logs.count('"worker_degraded"'), logs.count('"worker_recovered"')
            if recovered >= degraded or time.monotonic() > deadline:
                break
            more = load(srv.port, texts, 8, 1.0)
            r.codes.update(more.codes)
    finally:
        srv.terminate()
    note = f"{r.ok} ok; {args.oom_batches} OOMs injected per worker"
    table.set("oom", "forced OOM: failed requests", r.failed, note, ok=r.failed == 0)
    table.set("oom", "forced OOM: degraded, then recovered", f"{degraded} -> {recovered}",
              "workers", ok=degraded >= 1 and recovered == degraded)  # fmt: skip


# -- main ------------------------------------------------------------------------------------------
def run(args: argparse.Namespace, table: Table) -> None:
    if not check_env(table, args.device) or args.dry_run:
        reason = "dry run" if args.dry_run else "the environment row failed"
        for section in SECTIONS:
            table.mark(section, "not run", reason)
        table.save()
        return
    from ringserve.workers.artifact import load_model

    model_dir = artifact_dir(args)
    texts = make_texts(load_texts(SST2, 600), 48 if args.quick else 192)
    load_texts_ = load_texts(SST2, 1500) + load_texts(AG_NEWS, 500)
    items = tokenize(model_dir, texts)
    model, fp32 = load_model(model_dir, "cpu"), None
    skip = set(SECTIONS) - args.only
    for section in skip:
        table.mark(section, "not run", "--only")
    with table.section("graphs", 60) as go:
        if go and "graphs" in args.only:
            fp32 = check_graphs(args, table, model, items)
    with table.section("precision", 60) as go:
        if go and "precision" in args.only:
            check_precision(args, table, fp32 or new_runner(args, model, (64,), "fp32"), items)
    fp32 = None
    if args.device != "fake-gpu":
        import torch

        torch.cuda.empty_cache()  # give the in-process graphs' pools back before the server
    with table.section("server", 3 * args.load_s + 120) as go:
        if go and "server" in args.only:
            t0 = time.monotonic()
            srv = start_server(args, model_dir, {})
            try:
                table.set("server", "ready after", f"{time.monotonic() - t0:.1f}s",
                          f"{args.workers_per_gpu} workers a GPU, no spare")  # fmt: skip
                check_workers(args, table, srv)
                check_served(table, srv, model_dir, texts[: 48 if args.quick else 192])
                check_load(args, table, srv, load_texts_)
            finally:
                srv.terminate()
    with table.section("oom", args.load_s + 100) as go:
        if go and "oom" in args.only:
            check_forced_oom(args, table, model_dir, load_texts_)
    with table.section("realoom", 40) as go:
        if go and "realoom" in args.only:
            if args.device == "fake-gpu":
                table.mark("realoom", "n/a", "needs CUDA")
            else:
                check_real_oom(args, table, model)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.pack:
        pack(args.pack)
        return 0
    table = Table(Path(args.out) if args.out else None, args.budget_s)
    try:
        run(args, table)
    finally:
        print("\n" + table.render())
        table.save()
    return 1 if table.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
