"""The worker process: attach rings, load the model, then tokenize, batch and answer.

Started with spawn, or forked from the zygote (workers/zygote.py), which hands over torch
already imported and the CPU weights already loaded. Everything that creates threads or device
state (thread count, CUDA, the runtime's warm-up) happens here, in the child, either way. The
heartbeat is stamped by the serving loop itself, so a stuck batch shows.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
import traceback
from typing import TYPE_CHECKING, Any

from shm import layout as L
from shm.channel import Channel
from workers.batcher import REPORT_GRID, Item, bucket_index, length_grid, pad_grid
from workers.spec import (
    EXIT_BOOT_ERROR,
    EXIT_DEVICE_ERROR,
    EXIT_OK,
    EXIT_PARENT_GONE,
    STOP_SIGNAL,
    WorkerSpec,
    ignore_group_signals,
)
from workers.testhooks import HOOKS

if TYPE_CHECKING:  # torch is imported in boot(), after the fork
    from workers.runtime import Runner

IDLE_WAIT_S = 0.1  # longest sleep on the doorbell: bounds heartbeat gaps and exit latency
READ_LIMIT = 1024  # messages taken from the ring per pass
_PR_SET_PDEATHSIG = 1
Answer = tuple[int, bytes, int]  # (msg id, response payload, aux) as the ring takes it


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # the loop's getppid check still catches a dead parent


def set_graph_optimize(cpu: bool) -> None:
    """On the CPU, run TorchScript without the profiling executor's graph optimisation.

    Measured here on MiniLM, one thread: with it, a just-loaded model's first calls took 0.17,
    0.07 and 0.013 s on 16 tokens (the profiling runs); without it, 0.027, 0.021, 0.020, and
    steady batches (32 x 24 tokens, 256 x 1) ran at the same speed (0.66-0.73 s, 0.24-0.34 s)
    with bit-identical logits, since nothing on the CPU is fused. So a worker is warm almost at
    once, which is most of a forked worker's boot. CUDA keeps the optimising executor."""
    import torch

    torch._C._set_graph_executor_optimize(not cpu)


class Worker:
    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.stop = False
        self.channel = Channel.attach(spec.channel)
        self.requests = self.channel.requests
        self.responses = self.channel.responses
        self.ctl = self.channel.ctl
        self.ctl.set("pid", os.getpid())
        self.ctl.set("state", L.W_STARTING)
        self.ctl.beat()
        self.grow: list[bytes] = []  # test-only memory growth hook
        self.gpu: Any = None  # workers.nvml.GpuMonitor on CUDA: NVML sampled from the loop
        self.cpu_model_ok = False

    def boot(self, model: Any = None, verified: bool = False) -> None:
        """Load (or take the zygote's already loaded CPU model), then warm this worker's shapes."""
        t0 = time.monotonic()
        import torch

        from workers.artifact import load_manifest, load_model, load_tokenizer
        from workers.batcher import Batcher
        from workers.cuda import make_runner
        from workers.onnx_model import choose_runtime
        from workers.runtime import ACTIVATIONS, ort_runner
        from workers.spec import is_gpu_device

        spec = self.spec
        torch.set_num_threads(spec.threads)
        on_gpu = is_gpu_device(spec.device)
        set_graph_optimize(not on_gpu)  # before the model's first call
        # The zygote verified the fingerprint before it loaded the weights it hands over.
        manifest = load_manifest(spec.model_dir, verify=not verified)
        max_len = manifest.max_length
        grid = pad_grid(spec.buckets, on_gpu, max_len)
        self.report_grid = length_grid(grid or REPORT_GRID, max_len)
        self.tokenizer = load_tokenizer(spec.model_dir, max_len)
        self.ctl.beat()
        runtime, _ = choose_runtime(spec.runtime, spec.precision, on_gpu, manifest)
        activation = ACTIVATIONS[manifest.activation]
        self.token_types = manifest.token_types
        started = None  # on a GPU: reports the graphs and returns the NVML monitor
        if runtime == "onnx":  # the session is made here, after any fork: ORT keeps threads
            self.runner: Runner = ort_runner(spec, manifest, activation)
            self.cpu_model_ok = True
        else:
            if model is None:
                model = load_model(spec.model_dir, "cpu")
            self.cpu_model_ok = True  # a failure from here on is the device's, not the model's
            self.runner, started = make_runner(
                spec, grid or (max_len,), model, self.ctl, activation
            )
        self.ctl.beat()
        warm_s = self.runner.warm()
        if started is not None:  # GPU worker: report its graphs; the loop samples NVML from now on
            self.gpu = started(warm_s)
        # Rows and padded tokens per batch, resolved for the device by the front-end; on a GPU
        # the runner captured one graph shape per (grid length, row count) they allow.
        delay_ns = int(spec.max_delay_ms * 1e6)
        overhead = self.runner.overhead_tokens
        self.batcher = Batcher(spec.max_batch, spec.max_batch_tokens, delay_ns, grid, overhead)
        self.n_labels = len(manifest.labels)
        self.ctl.set("boot_ms", int((time.monotonic() - t0) * 1000))
        self.ctl.set("state", L.W_READY)
        self.ctl.beat()
        spec.eventfd.ring()  # tells the supervisor at once, without waiting for its tick

    # -- serving loop -------------------------------------------------------------------------
    def serve(self) -> int:
        spec = self.spec
        doorbell = spec.doorbell
        while not self.stop:
            self.ctl.beat()
            if os.getppid() != spec.parent_pid:
                return EXIT_PARENT_GONE
            if self.gpu is not None:
                self.gpu.tick()  # at most once a second; never raises
            took = self.take_requests()
            for _ in range(took):  # each request was posted once: keep the count honest
                if not doorbell.acquire(False):
                    break
            wait_ns = self.batcher.wait_ns(time.monotonic_ns())
            if wait_ns == 0:
                self.run_next()
            elif not took:
                timeout = IDLE_WAIT_S if wait_ns < 0 else min(IDLE_WAIT_S, wait_ns / 1e9)
                doorbell.acquire(True, timeout)
        return EXIT_OK

    def take_requests(self) -> int:
        msgs = self.requests.read(READ_LIMIT)
        if not msgs:
            return 0
        now = time.monotonic_ns()
        texts: list[str | tuple[str, str]] = []
        keep: list[tuple[int, int]] = []
        bad: list[Answer] = []
        for msg_id, deadline, payload in msgs:
            text = decode_payload(payload)
            if text is None:
                bad.append(self.pack(msg_id, L.STATUS_BAD_REQUEST))
                continue
            texts.append(text)
            keep.append((msg_id, deadline))
        if texts:
            # A pair goes through the tokenizer's own post-processor (special tokens, type ids)
            # and is truncated longest-first to max_length.
            encodings = self.tokenizer.encode_batch(texts)
            for (msg_id, deadline), text, enc in zip(keep, texts, encodings, strict=True):
                types = enc.type_ids if self.token_types and isinstance(text, tuple) else None
                self.batcher.add(Item(msg_id, deadline, now, enc.ids, types=types))
        if bad:
            self.ctl.add("bad_requests", len(bad))
            self.send(bad)
        return len(msgs)

    def run_next(self) -> None:
        late = self.batcher.expire(time.monotonic_ns())
        if late:  # expired before it started: skip the work
            self.ctl.add("expired", len(late))
            self.send([self.pack(it.msg_id, L.STATUS_DEADLINE) for it in late])
        batch, length = self.batcher.take()
        if not batch:
            return
        self.maybe_grow()
        tokens = self.runner.fill(length, batch)
        t0 = time.monotonic_ns()
        probs = self.runner.forward(length, len(batch))
        t1 = time.monotonic_ns()
        model_us = (t1 - t0) // 1000
        grid = self.report_grid
        out = []
        for row, it in enumerate(batch):
            queued_us = (t0 - it.arrived_ns) // 1000
            cls = bucket_index(grid, len(it.ids))  # latency is reported by the text's own length
            out.append(self.pack(it.msg_id, L.STATUS_OK, cls, probs[row], queued_us, model_us))
        ctl = self.ctl  # counted before the answers go: whoever sees one sees its batch counted
        ctl.add("requests", len(batch))
        ctl.add("batches", 1)
        ctl.add("tokens", tokens)
        ctl.add("padded_tokens", len(batch) * length)
        ctl.add("busy_ns", t1 - t0)
        ctl.count_batch(len(batch))
        self.send(out)

    def pack(
        self,
        msg_id: int,
        status: int,
        bucket: int = 0,
        probs: Any = None,
        queued_us: int = 0,
        model_us: int = 0,
    ) -> Answer:
        if probs is None:
            return (msg_id, L.RESPONSE.pack(status, 0, 0, 0, 0, 0, 0), 0)
        label = int(probs.argmax())
        head = L.RESPONSE.pack(
            status, bucket, label, len(probs), 0, min(queued_us, 0xFFFFFFFF), model_us
        )
        return (msg_id, head + probs.tobytes(), 0)

    def send(self, msgs: list[Answer]) -> None:
        """Publish answers, then ring the front-end's doorbell once."""
        while msgs:
            n = self.responses.write_many(msgs)
            msgs = msgs[n:]
            if msgs:  # the front-end is behind: let it catch up, still beating
                self.spec.eventfd.ring()
                self.ctl.beat()
                time.sleep(0.0005)
                if os.getppid() != self.spec.parent_pid:
                    raise SystemExit(EXIT_PARENT_GONE)
        self.spec.eventfd.ring()

    def close(self) -> None:
        """Drop every view into the segments, then the mappings (the front-end unlinks)."""
        self.channel.close()

    def maybe_grow(self) -> None:
        step = HOOKS.grow_bytes_per_batch
        if step:  # test-only: a leak for the supervisor's RSS limit to catch
            self.grow.append(b"\x01" * step)


def decode_payload(payload: bytes) -> str | tuple[str, str] | None:
    """A request's text, or its (text, text_pair) (L.PAIR_SEPARATOR between the two); None when
    a part is not UTF-8 or is blank (the front-end checks first; this is the last guard)."""
    parts = payload.split(L.PAIR_SEPARATOR)
    if len(parts) > 2:
        return None
    try:
        texts = [p.decode("utf-8") for p in parts]
    except UnicodeDecodeError:
        return None
    if not all(t.strip() for t in texts):
        return None
    return texts[0] if len(texts) == 1 else (texts[0], texts[1])


def main(spec: WorkerSpec, model: Any = None, verified: bool = False) -> None:
    """The worker's life; `model` is the zygote's preloaded CPU model when forked from it."""
    _die_with_parent()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA indices = the front-end's NVML ones
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setaffinity(0, spec.cpus)
    worker = Worker(spec)

    def on_stop(signum: int, frame: Any) -> None:
        worker.stop = True

    ignore_group_signals()  # the front-end decides (workers.spec)
    signal.signal(STOP_SIGNAL, on_stop)
    try:
        worker.boot(model, verified)
    except Exception as exc:  # noqa: BLE001 - any boot failure is reported the same way
        device_fault = worker.cpu_model_ok and spec.device != "cpu"
        what = f"cannot start on {spec.device}" if device_fault else "cannot load the model"
        print(f"ringserve worker {spec.serial}: {what}: {exc}", file=sys.stderr)
        traceback.print_exc()
        worker.ctl.set("state", L.W_EXITING)
        worker.close()
        sys.exit(EXIT_DEVICE_ERROR if device_fault else EXIT_BOOT_ERROR)
    code = worker.serve()
    worker.ctl.set("state", L.W_EXITING)
    worker.close()
    sys.exit(code)
