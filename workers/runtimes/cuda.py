"""The CUDA model path: static shapes replayed as CUDA graphs, with a warm CPU copy to fall back
on when the GPU runs out of memory.

CudaRunner keeps, per length bucket, one pinned host buffer and one device buffer sized for the
bucket's largest batch, and captures the model once per (bucket, batch size) in a small fixed
set; a batch is copied into the static buffers, padded up to the next captured size and replayed.
FallbackRunner wraps it with a CpuRunner: a CUDA out-of-memory error re-runs the batch on the CPU
(no request fails), the worker says `degraded`, and a later probe batch returns it to the GPU.

Bounds: a runner captures at most MAX_GRAPHS graphs (buckets x batch sizes 1, 2, 4, ... up to
the bucket's row limit), and every graph shares one memory pool, so graph memory is about the
largest shape's working set, not the sum over shapes.

On a machine without a GPU the same CudaRunner runs on device "cpu" with no graphs (the tests'
"fake GPU"): shape selection, buffers and the whole fallback path are then the production code.
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, Protocol

import numpy as np
import torch
from ringserve.shm import layout as L
from ringserve.workers.batches import BATCH_OVERHEAD_TOKENS, Item, row_limit
from ringserve.workers.events import EventLog
from ringserve.workers.runtimes.cpu import CpuRunner, Runner, fill_rows, softmax
from ringserve.workers.spec import FAKE_GPU, is_gpu_device
from ringserve.workers.testhooks import HOOKS

# Batch sizes captured per bucket (each capped by the bucket's batch limit, which is captured
# too): a batch pads to the next size, so padding never more than doubles a batch.
GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MAX_GRAPHS = 128  # per runner: 8 buckets x 9 sizes is 72; more means a grid set by mistake
WARMUP_RUNS = 3  # eager runs per shape before capture (cuBLAS picks kernels, allocator settles)
PROBE_EVERY_BATCHES = 16  # while degraded, retry the GPU every this many batches ...
PROBE_AFTER_S = 1.0  # ... or once this long has passed since the last out-of-memory error
CPU_FALLBACK_TOKENS = 512  # a GPU batch re-run on the CPU goes in pieces of this many tokens
PRECISIONS = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
# The TorchScript interpreter re-raises an op's error as a plain RuntimeError with the message
# inside, so a real out-of-memory error from the model is recognised by its text as well.
OOM_MARKERS = (
    "CUDA out of memory",
    "CUDA error: out of memory",
    "CUDA driver error: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
)
INJECTED_CAPTURE_ERROR = "CUDA error: operation not permitted when stream is capturing (test)"
# Capture outcome, in the control block's `capture_error` word (read by /v1/stats).
CAPTURE_OK, CAPTURE_OOM, CAPTURE_FAILED = 0, 1, 2


class DeviceError(RuntimeError):
    """The GPU could not be used at start-up (out of memory, busy, lost): the worker exits with
    EXIT_DEVICE_ERROR and the supervisor retries the slot, then serves it from the CPU."""


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in OOM_MARKERS)


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The error's first non-empty line (its type name when the message is empty)."""
    lines = [x for x in str(exc).splitlines() if x.strip()]
    return (lines[0] if lines else type(exc).__name__)[:limit]


def graph_sizes(limit: int) -> list[int]:
    """The batch sizes captured for a bucket whose batches hold at most `limit` rows."""
    return [s for s in GRAPH_BATCH_SIZES if s < limit] + [limit]


def padded_rows(sizes: list[int], n: int) -> int:
    """The smallest captured size that holds `n` rows."""
    i = bisect.bisect_left(sizes, n)
    if i == len(sizes):
        raise ValueError(f"batch of {n} rows exceeds the largest captured size {sizes[-1]}")
    return sizes[i]


def gpu_batch_limits(buckets: tuple[int, ...], max_batch: int, max_tokens: int) -> list[int]:
    """Rows per batch for each bucket on a GPU: `max_batch`, and at most `max_tokens` padded
    tokens (0: no token budget), as the worker's Batcher forms them. The budget bounds the
    activations (and the graph pool) of the longest buckets."""
    return [row_limit(b, max_batch, max_tokens or max_batch * b) for b in buckets]


def shape_sizes(limits: list[int], buckets: tuple[int, ...], max_batch: int) -> list[list[int]]:
    """Each bucket's graph batch sizes; refused when they make over MAX_GRAPHS shapes (checked
    on the fake GPU too, so tests see the same refusal)."""
    sizes = [graph_sizes(n) for n in limits]
    shapes = sum(len(s) for s in sizes)
    if shapes > MAX_GRAPHS:
        raise ValueError(
            f"{shapes} CUDA graphs for buckets {list(buckets)} at {max_batch} rows: over "
            f"{MAX_GRAPHS}; use fewer buckets or a smaller --max-batch"
        )
    return sizes


def side_stream(device: torch.device) -> Any:
    """Make `device` current with TF32 off, and the one side stream for every warm-up and
    capture (each stream that runs a matmul keeps its own cuBLAS workspace for the life of the
    process)."""
    torch.cuda.set_device(device)
    # fp32 means fp32: TF32 matmuls would break "same text, same scores" (1e-5).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch.cuda.Stream(device)


def device_model(model: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    """The model on `device`, its weights cast once to `dtype` (a half-precision graph then
    reads half weights instead of re-casting every weight on every replay). The caller's copy
    is never changed: tests and benchmarks share one model between runners."""
    params = list(model.parameters())
    if all(p.device == device and (dtype is None or p.dtype == dtype) for p in params):
        return model
    moved = copy.deepcopy(model)
    with torch.no_grad():  # tensor by tensor: Module.to() trips over a script module's grads
        for t in [*moved.parameters(), *moved.buffers()]:
            cast = dtype if dtype is not None and t.is_floating_point() else t.dtype
            t.data = t.data.to(device=device, dtype=cast)
    return moved


class Forward(Protocol):
    """What a capture runs of its runner: the model on a shape's device buffers, and the mode
    (inference, the plain interpreter, autocast) every run of it is made in."""

    def mode(self) -> contextlib.AbstractContextManager[None]: ...
    def call(self, bucket: int, rows: int) -> torch.Tensor: ...


class Graphs:
    """One runner's CUDA graphs, made once at start-up: every (bucket, rows) shape captured
    after warm-up runs on a side stream, largest first and all in one memory pool; then what
    the capture cost (time and memory per graph), or why it failed, for the start-up report
    and /v1/stats. A failed capture drops every graph: the runner serves eagerly."""

    def __init__(self, device: torch.device, expected: int) -> None:
        self.device = device
        self.on_cuda = device.type == "cuda"
        self.expected = expected  # shapes to capture (0: no graphs, as on the fake GPU)
        self.by_shape: dict[tuple[int, int], tuple[Any, torch.Tensor]] = {}  # -> (graph, out)
        self.stats: list[dict[str, Any]] = []  # per graph: its shape, capture time, pool growth
        self.pool_bytes = 0  # the graphs' shared pool, measured after every capture
        self.seconds = 0.0
        self.error = ""
        self.code = CAPTURE_OK
        self.inject_error = False  # test-only hook: the capture raises, as a real one can
        self.side: Any = side_stream(device) if self.on_cuda else None

    def __len__(self) -> int:
        return len(self.by_shape)

    def get(self, bucket: int, rows: int) -> tuple[Any, torch.Tensor] | None:
        return self.by_shape.get((bucket, rows))

    def outputs(self) -> list[torch.Tensor]:
        """Each graph's output tensor (static: the runner's buffers include them)."""
        return [out for _, out in self.by_shape.values()]

    def capture(self, run: Forward, sizes: list[list[int]], buckets: tuple[int, ...]) -> None:
        """Capture every shape (`sizes[b]`: the row counts of bucket b); on a RuntimeError
        keep none, and the reason."""
        t0 = time.perf_counter()
        try:
            if self.inject_error:
                raise RuntimeError(INJECTED_CAPTURE_ERROR)
            self._capture_all(run, sizes, buckets)
        except RuntimeError as exc:
            self._failed(exc)
        self.seconds = time.perf_counter() - t0

    def _failed(self, exc: BaseException) -> None:
        """Drop every graph, give their pool back, and keep the reason for /v1/stats."""
        if self.on_cuda:
            with contextlib.suppress(RuntimeError):
                torch.cuda.synchronize(self.device)
        self.by_shape.clear()
        self.pool_bytes = 0
        if self.on_cuda:
            torch.cuda.empty_cache()  # the dropped graphs' pool is free once they are gone
        self.code = CAPTURE_OOM if is_out_of_memory(exc) else CAPTURE_FAILED
        self.error = first_line(exc)

    def _capture_all(self, run: Forward, sizes: list[list[int]], buckets: tuple[int, ...]) -> None:
        """Largest shapes first, all in one memory pool: a smaller graph's intermediates reuse
        the larger one's blocks (replays never overlap: one stream, one batch at a time)."""
        pool = torch.cuda.graph_pool_handle()
        for b in range(len(buckets)):
            for rows in reversed(sizes[b]):
                self._capture(run, b, buckets[b], rows, pool)
        for graph, _ in self.by_shape.values():  # the first launch uploads the graph: not on
            graph.replay()  # a live request, and not with the GPU full
        torch.cuda.synchronize(self.device)
        # The pool's own segments; should the snapshot not name them (an API change), the sum of
        # each capture's pool growth, which the empty_cache() before each one keeps honest.
        growth = sum(max(0, int(st["bytes"])) for st in self.stats)
        self.pool_bytes = pool_bytes(self.device, pool) or growth

    def _capture(self, run: Forward, b: int, bucket: int, rows: int, pool: Any) -> None:
        dev = self.device
        self._warmup(run, b, rows)
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()  # as torch.cuda.graph does on entry: measure after it
        reserved0 = torch.cuda.memory_reserved(dev)
        t0 = time.perf_counter()
        graph = torch.cuda.CUDAGraph()
        with run.mode(), torch.cuda.graph(graph, pool=pool, stream=self.side):
            out = run.call(b, rows)
        torch.cuda.synchronize(dev)
        self.by_shape[(b, rows)] = (graph, out)
        capture_ms = round((time.perf_counter() - t0) * 1000, 2)
        grown = int(torch.cuda.memory_reserved(dev) - reserved0)  # the pool's growth
        self.stats.append(
            {"bucket": bucket, "rows": rows, "capture_ms": capture_ms, "bytes": grown}
        )

    def _warmup(self, run: Forward, bucket: int, rows: int) -> None:
        # torch requires warm-up runs on a side stream before capture (lazy init, workspaces);
        # the same stream then captures, so its cuBLAS state exists before the capture begins.
        current = torch.cuda.current_stream(self.device)
        self.side.wait_stream(current)
        with torch.cuda.stream(self.side):
            for _ in range(WARMUP_RUNS):
                with run.mode():
                    run.call(bucket, rows)
        current.wait_stream(self.side)

    def held_bytes(self) -> int:
        """Device memory held by the graphs' shared pool (0 without graphs)."""
        return self.pool_bytes if self.by_shape else 0


class CudaRunner:
    """Static-shape model runner for one CUDA device (or the CPU, as a stand-in in tests).

    Same interface as CpuRunner: fill(length, items) -> tokens, forward(length, n) -> float32
    probabilities [n, C], warm() -> seconds, where `length` is one of the grid's lengths. Every
    buffer is made at start-up; the tests check with torch's profiler that serving a batch
    allocates no tensor. Its CUDA graphs are `graphs` (Graphs), captured by warm()."""

    # A graph replay's fixed cost in tokens of work: not measured (no GPU has run this yet);
    # a batch's rows are bounded by the graph shapes captured anyway.
    overhead_tokens = BATCH_OVERHEAD_TOKENS

    def __init__(
        self,
        model: Any,
        buckets: tuple[int, ...],
        max_batch: int,
        device: str = "cuda:0",
        precision: str = "fp32",
        graphs: bool = True,
        max_tokens: int | None = None,  # padded tokens per batch; None: the CPU's budget
        activation: Callable[[np.ndarray], np.ndarray] = softmax,
    ) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r}: expected one of {sorted(PRECISIONS)}")
        self.activation = activation  # logits -> scores, from the manifest
        self.buckets = buckets
        self.max_batch = max_batch
        self.torch_device = torch.device("cpu" if device == FAKE_GPU else device)
        self.device = device
        self.on_cuda = self.torch_device.type == "cuda"
        self.use_graphs = graphs and self.on_cuda
        self.precision = precision
        if max_tokens is None:
            max_tokens = max_batch * buckets[0]  # a CPU-sized budget (tests, the fake GPU)
        self.max_tokens = max_tokens
        self.limits = gpu_batch_limits(buckets, max_batch, max_tokens)
        self.sizes = shape_sizes(self.limits, buckets, max_batch)
        expected = sum(len(s) for s in self.sizes) if self.use_graphs else 0
        self.graphs = Graphs(self.torch_device, expected)
        self.model = device_model(model, self.torch_device, PRECISIONS[precision])
        self._alloc_buffers()

    def _alloc_buffers(self) -> None:
        pin = self.on_cuda  # pinned host memory makes the copies true DMA; CUDA-only
        shapes = list(zip(self.limits, self.buckets, strict=True))
        self.host_ids = [torch.zeros(s, dtype=torch.int64, pin_memory=pin) for s in shapes]
        self.host_mask = [torch.zeros(s, dtype=torch.int64, pin_memory=pin) for s in shapes]
        for mask in self.host_mask:
            mask[:, 0] = 1  # padded rows hold one token: no all-masked row, no NaN to look at
        self.ids = [t.numpy() for t in self.host_ids]  # numpy views for fill()
        self.mask = [t.numpy() for t in self.host_mask]
        dev = self.torch_device  # device buffers start as copies: warm-up rows are never empty
        self.dev_ids = [t.to(dev, copy=True) for t in self.host_ids]
        self.dev_mask = [t.to(dev, copy=True) for t in self.host_mask]
        self.host_out: list[torch.Tensor] = []  # [rows, C] float32 (or [rows, length, C])
        self.out: list[np.ndarray] = []

    def buffer_ptrs(self) -> list[int]:
        """Addresses of every static buffer (tests check they never change)."""
        tensors = [*self.host_ids, *self.host_mask, *self.dev_ids, *self.dev_mask, *self.host_out]
        tensors += self.graphs.outputs()
        return [t.data_ptr() for t in tensors]

    # -- serving --------------------------------------------------------------------------------
    def fill(self, length: int, batch: list[Item]) -> int:
        """Copy token ids into the host buffers of the bucket of `length` tokens (a grid
        length: the batcher pads to the grid); returns the real token count."""
        bucket = self.buckets.index(length)
        return fill_rows(self.ids[bucket], self.mask[bucket], batch)

    def rows_for(self, bucket: int, n: int) -> int:
        return padded_rows(self.sizes[bucket], n)

    def forward(self, length: int, n: int) -> np.ndarray:
        """Probabilities [n, C]: copy in, replay the shape's graph (or run eagerly), copy out."""
        return self._run(self.buckets.index(length), n, graph=True)

    def forward_eager(self, length: int, n: int) -> np.ndarray:
        """As forward() without the graph (benchmarks compare the two)."""
        return self._run(self.buckets.index(length), n, graph=False)

    def _run(self, bucket: int, n: int, graph: bool) -> np.ndarray:
        rows = self.rows_for(bucket, n)
        try:
            self.dev_ids[bucket][:rows].copy_(self.host_ids[bucket][:rows], non_blocking=True)
            self.dev_mask[bucket][:rows].copy_(self.host_mask[bucket][:rows], non_blocking=True)
            captured = self.graphs.get(bucket, rows) if graph else None
            if captured is not None:
                captured[0].replay()
                logits = captured[1]
            else:
                logits = self._eager(bucket, rows)
            self.host_out[bucket][:rows].copy_(logits[:rows], non_blocking=True)
        finally:  # also after an error: no queued copy may still write into reused buffers
            if self.on_cuda:
                torch.cuda.current_stream(self.torch_device).synchronize()
        return self.activation(self.out[bucket][:n])

    @contextlib.contextmanager
    def mode(self) -> Iterator[None]:
        # TorchScript's optimising executor would profile, fuse and re-specialise per shape,
        # compiling kernels at unpredictable times (fatal inside a capture); the plain
        # interpreter dispatches each op, which autocast needs too. Graphs remove the launch
        # overhead the fuser would have saved.
        dtype = PRECISIONS[self.precision]
        cast: Any = contextlib.nullcontext()
        if dtype is not None:  # cache off: cached casts would be freed under a captured graph
            cast = torch.autocast(self.torch_device.type, dtype=dtype, cache_enabled=False)
        with torch.inference_mode(), torch.jit.optimized_execution(False), cast:
            yield

    def call(self, bucket: int, rows: int) -> torch.Tensor:
        """The model on the first `rows` rows of a bucket's device buffers (in mode())."""
        out: torch.Tensor = self.model(self.dev_ids[bucket][:rows], self.dev_mask[bucket][:rows])
        return out.float()

    def _eager(self, bucket: int, rows: int) -> torch.Tensor:
        with self.mode():
            return self.call(bucket, rows)

    def release(self) -> None:
        """After an out-of-memory error: hand back cached blocks outside the graph pool (the
        allocator has usually done so before raising; graph pools are never freed here)."""
        if self.on_cuda:
            torch.cuda.empty_cache()

    # -- start-up -------------------------------------------------------------------------------
    def warm(self) -> float:
        """Run every shape eagerly, then capture each as a CUDA graph and replay it once (CUDA
        only). A failed capture leaves an eager runner, said in `graphs.error`."""
        t0 = time.perf_counter()
        for b in range(len(self.buckets)):
            logits = self._eager(b, 1)
            self.host_out.append(  # [rows, C]; a token classifier's [rows, length, C]
                torch.zeros((self.limits[b], *logits.shape[1:]), pin_memory=self.on_cuda)
            )
            self.out.append(self.host_out[b].numpy())
        if self.use_graphs or self.graphs.inject_error:
            self.graphs.capture(self, self.sizes, self.buckets)
        else:  # the CPU stand-in: run the shapes a fresh TorchScript model is slow on first
            for b in range(len(self.buckets)):
                for rows in sorted({1, self.sizes[b][min(1, len(self.sizes[b]) - 1)]}):
                    self._eager(b, rows)
        return time.perf_counter() - t0


def pool_bytes(device: torch.device, pool: Any) -> int:
    """Bytes of the segments the caching allocator holds for graph pool `pool`; the sum of
    per-capture growth when the allocator's snapshot cannot say."""
    try:
        segments = torch.cuda.memory._snapshot(device)["segments"]
        want = tuple(pool)
        return sum(
            int(s["total_size"]) for s in segments if tuple(s.get("segment_pool_id", ())) == want
        )
    except (RuntimeError, KeyError, TypeError):
        return 0


class FallbackSink(Protocol):
    """Where FallbackRunner reports: the worker's control block and log in production."""

    def degraded(self, reason: str) -> None: ...
    def recovered(self, seconds: float) -> None: ...
    def fell_back(self) -> None: ...
    def alive(self) -> None: ...


class FallbackRunner:
    """A GPU runner with a warm CPU copy behind it. A torch.cuda.OutOfMemoryError during a batch
    re-runs that batch on the CPU; while degraded, batches go to the CPU and every
    PROBE_EVERY_BATCHES-th batch (or the first after PROBE_AFTER_S) tries the GPU again.

    `inject_oom` (test-only hook, 0 in production) makes the next that many GPU forwards raise
    the same error a real out-of-memory raises, so the path is tested as it runs."""

    def __init__(
        self,
        primary: Any,
        cpu: Any,
        sink: FallbackSink | None = None,
        inject_oom: int = 0,
        probe_every: int = PROBE_EVERY_BATCHES,
        probe_after_s: float = PROBE_AFTER_S,
        cpu_tokens: int = CPU_FALLBACK_TOKENS,
    ) -> None:
        self.primary = primary
        self.cpu = cpu
        self.sink = sink
        self.inject_oom = inject_oom
        self.probe_every = probe_every
        self.probe_after_s = probe_after_s
        self.device = primary.device
        self.overhead_tokens = primary.overhead_tokens
        self.buckets = primary.buckets
        self.limits = primary.limits
        self.max_tokens = primary.max_tokens
        self.cpu_tokens = cpu_tokens
        self.degraded = False
        self.degraded_at = 0.0
        self.failed_at = 0.0
        self.since_fail = 0  # batches served on the CPU since the last GPU failure
        self.fallbacks = 0
        self.on_cpu = False  # where the batch being filled goes
        self.items: list[Item] = []

    def warm(self) -> float:
        try:
            gpu_s = float(self.primary.warm())
        except RuntimeError as exc:  # an eager warm-up that fails: the device is not usable
            raise DeviceError(first_line(exc)) from exc
        return gpu_s + float(self.cpu.warm())

    def fill(self, length: int, batch: list[Item]) -> int:
        self.items = batch
        self.on_cpu = self.degraded and not self._probe_due()
        if self.on_cpu:  # filled in forward(), in CPU-sized pieces
            return sum(len(it.ids) for it in batch)
        return int(self.primary.fill(length, batch))

    def _probe_due(self) -> bool:
        waited = time.monotonic() - self.failed_at
        return self.since_fail >= self.probe_every or waited >= self.probe_after_s

    def forward(self, length: int, n: int) -> np.ndarray:
        if not self.on_cpu:
            try:
                probs = self._gpu_forward(length, n)
            except RuntimeError as exc:  # torch.cuda.OutOfMemoryError is one
                if not is_out_of_memory(exc):
                    raise  # any other error ends the worker; its requests are rerouted
                self._out_of_memory(exc)
            else:
                if self.degraded:
                    self._recover()
                return probs
        self.since_fail += 1
        self.fallbacks += 1
        if self.sink is not None:
            self.sink.fell_back()
        return self._cpu_forward(length, self.items[:n])

    def _cpu_forward(self, length: int, items: list[Item]) -> np.ndarray:
        """The batch on the CPU copy in pieces of at most `cpu_tokens` padded tokens: a GPU
        batch (up to 16384 tokens) would hold one CPU core for seconds; the sink hears from
        each piece, so the worker's heartbeat stays fresh."""
        step = row_limit(length, len(items), self.cpu_tokens)
        parts = []
        for i in range(0, len(items), step):
            chunk = items[i : i + step]
            self.cpu.fill(length, chunk)
            parts.append(np.asarray(self.cpu.forward(length, len(chunk))))
            if self.sink is not None:
                self.sink.alive()
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _gpu_forward(self, length: int, n: int) -> np.ndarray:
        if self.inject_oom > 0:
            self.inject_oom -= 1
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected by a test hook)")
        return np.asarray(self.primary.forward(length, n))

    def _out_of_memory(self, exc: BaseException) -> None:
        self.failed_at = time.monotonic()
        text = str(exc)  # the interpreter puts its traceback before the error itself
        starts = [i for i in (text.find(m) for m in OOM_MARKERS) if i >= 0]
        reason = text[min(starts) :] if starts else text
        self.since_fail = 0
        with contextlib.suppress(Exception):  # freeing the cache is a courtesy, never fatal
            self.primary.release()
        if not self.degraded:
            self.degraded = True
            self.degraded_at = self.failed_at
            if self.sink is not None:
                self.sink.degraded(reason.splitlines()[0][:200] if reason.strip() else "OOM")

    def _recover(self) -> None:
        self.degraded = False
        if self.sink is not None:
            self.sink.recovered(time.monotonic() - self.degraded_at)


class WorkerSink:
    """FallbackSink for a worker: state and counters in its control block, one JSON line on
    stderr per transition (never one per batch)."""

    def __init__(self, ctl: Any, serial: int, device: str) -> None:
        self.ctl = ctl
        self.serial = serial
        self.device = device
        self.log = EventLog(stream=sys.stderr)

    def degraded(self, reason: str) -> None:
        if self.ctl.get("state") == L.W_READY:
            self.ctl.set("state", L.W_DEGRADED)
        self.log.warning(
            "worker_degraded", serial=self.serial, device=self.device, serving_on="cpu",
            reason=reason,
        )  # fmt: skip

    def recovered(self, seconds: float) -> None:
        if self.ctl.get("state") == L.W_DEGRADED:
            self.ctl.set("state", L.W_READY)
        self.log.info(
            "worker_recovered", serial=self.serial, device=self.device,
            degraded_s=round(seconds, 3),
        )  # fmt: skip

    def fell_back(self) -> None:
        self.ctl.add("fallbacks", 1)

    def alive(self) -> None:
        self.ctl.beat()  # between the pieces of a long CPU re-run

    def started(self, fallback: FallbackRunner, warm_s: float) -> Any:
        """Log the start-up report (capture time and memory per graph); returns the GpuMonitor
        the serving loop ticks (None for the fake GPU: there is nothing to sample)."""
        runner: CudaRunner = fallback.primary
        self.report(runner, warm_s)
        if not runner.on_cuda:
            return None
        from ringserve.workers.runtimes.nvml import GpuMonitor

        monitor = GpuMonitor(self.ctl, runner.torch_device.index or 0, runner.torch_device)
        monitor.tick()
        return monitor

    def report(self, runner: CudaRunner, warm_s: float) -> None:
        """Once per model's runner: a worker with many models counts all their graphs."""
        self.ctl.set("device_kind", 1 if runner.on_cuda else 0)
        graphs = runner.graphs
        self.ctl.add("graphs", len(graphs))
        self.ctl.add("graphs_expected", graphs.expected)
        self.ctl.add("graph_bytes", graphs.held_bytes())
        self.ctl.set("capture_error", max(self.ctl.get("capture_error"), graphs.code))
        fields: dict[str, Any] = {
            "serial": self.serial,
            "device": self.device,
            "precision": runner.precision,
            "graphs": len(graphs),
            "graphs_expected": graphs.expected,
            "graph_bytes": graphs.held_bytes(),
            "capture_s": round(graphs.seconds, 3),
            "warm_s": round(warm_s, 3),
            "per_graph": graphs.stats,
        }
        if graphs.error:
            fields["capture_error"] = graphs.error
            self.log.error("cuda_graphs_failed", serving="eager, for the life of this worker",
                           **fields)  # fmt: skip
        else:
            self.log.info("cuda_graphs", **fields)


def make_runner(
    spec: Any,
    buckets: tuple[int, ...],
    cpu_model: Any,
    ctl: Any,
    activation: Callable[[np.ndarray], np.ndarray] = softmax,
) -> tuple[Runner, Callable[[float], Any] | None]:
    """The runner for a worker's device: CpuRunner on "cpu"; otherwise a CudaRunner (on the
    GPU, or on the CPU for the test-only fake GPU) behind a FallbackRunner with a CPU copy.

    The GPU copy is made from the CPU model by the runner, so an error of the device itself (out
    of memory, busy, lost) is a DeviceError, never a bad artifact."""
    cpu = CpuRunner(cpu_model, max(buckets), spec.max_batch, activation)
    if not is_gpu_device(spec.device):
        return cpu, None
    device = "cuda:0" if spec.device == "cuda" else spec.device
    if HOOKS.device_boot_errors >= spec.serial:  # test-only
        raise DeviceError("CUDA error: all CUDA-capable devices are busy or unavailable "
                          "(injected by a test hook)")  # fmt: skip
    try:
        # --max-batch and --max-batch-tokens come resolved for the device (GPU-sized on a GPU,
        # CPU-sized on the fake GPU, which is the CPU). The runner copies the CPU model over.
        gpu = CudaRunner(
            cpu_model, buckets, spec.max_batch, device, spec.precision,
            max_tokens=spec.max_batch_tokens, activation=activation,
        )  # fmt: skip
    except RuntimeError as exc:  # CUDA init, the weights' copy, a buffer: all the device's
        raise DeviceError(first_line(exc)) from exc
    gpu.graphs.inject_error = HOOKS.capture_error
    sink = WorkerSink(ctl, spec.serial, device)
    fallback = FallbackRunner(gpu, cpu, sink, HOOKS.inject_oom_batches)
    return fallback, partial(sink.started, fallback)
