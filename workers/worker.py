"""The worker process: attach rings, load the model, then tokenize, batch and answer.

Started with spawn, or forked from the zygote (workers/zygote.py), which hands over the imports
(torch and the CPU weights too, for TorchScript workers) already loaded. Everything that
creates threads or device state (thread count, CUDA, the runtime's warm-up) happens here, in
the child, either way. The heartbeat is stamped by the serving loop itself, so a stuck batch shows.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
import traceback
from typing import Any

import numpy as np
from ringserve.shm import layout as L
from ringserve.shm.channel import Channel
from ringserve.workers.artifact import load_manifest, load_model, load_tokenizer
from ringserve.workers.batcher import (
    REPORT_GRID,
    Batcher,
    Item,
    bucket_index,
    length_grid,
    pad_grid,
)
from ringserve.workers.longtext import LongText, Plan, Whole, combine, split_options
from ringserve.workers.onnx_model import choose_runtime
from ringserve.workers.runtime import ACTIVATIONS, Runner, joined, ort_runner
from ringserve.workers.spec import (
    EXIT_BOOT_ERROR,
    EXIT_DEVICE_ERROR,
    EXIT_OK,
    EXIT_PARENT_GONE,
    STOP_SIGNAL,
    WorkerSpec,
    ignore_group_signals,
    is_gpu_device,
)
from ringserve.workers.testhooks import HOOKS

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
        spec = self.spec
        on_gpu = is_gpu_device(spec.device)
        # The zygote verified the fingerprint before it loaded the weights it hands over.
        manifest = load_manifest(spec.model_dir, verify=not verified)
        max_len = manifest.max_length
        grid = pad_grid(spec.buckets, on_gpu, max_len)
        self.report_grid = length_grid(grid or REPORT_GRID, max_len)
        self.tokenizer = load_tokenizer(spec.model_dir, max_len)
        self.longtext = LongText(
            self.tokenizer, max_len, spec.long_text, spec.window_stride, spec.max_windows,
            manifest.token_types,
        )  # fmt: skip
        self.activation = manifest.activation
        self.ctl.beat()
        runtime, _ = choose_runtime(spec.runtime, spec.precision, on_gpu, manifest)
        activation = ACTIVATIONS[manifest.activation]
        self.n_labels = len(manifest.labels)
        self.dimension = manifest.dimension
        if manifest.embeds:  # one output holds both answers: logits, then the embedding
            activation = joined(activation, self.n_labels)
            check_answer_room(self.responses.max_payload(), self.dimension)
        self.token_types = manifest.token_types
        started = None  # on a GPU: reports the graphs and returns the NVML monitor
        if runtime == "onnx":  # the session is made here, after any fork: ORT keeps threads
            self.runner: Runner = ort_runner(spec, manifest, activation)
            self.cpu_model_ok = True
        else:
            self.runner, started = self._torch_runner(
                model, manifest, grid or (max_len,), activation
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
        self.batcher.bulk_wait_ns = int(spec.bulk_max_wait_ms * 1e6)
        self.ctl.set("boot_ms", int((time.monotonic() - t0) * 1000))
        self.ctl.set("state", L.W_READY)
        self.ctl.beat()
        spec.eventfd.ring()  # tells the supervisor at once, without waiting for its tick

    def _torch_runner(
        self, model: Any, manifest: Any, grid: tuple[int, ...], activation: Any
    ) -> tuple[Runner, Any]:
        """The TorchScript runner (CPU, or CUDA graphs on a GPU) and, on a GPU, the callback
        that reports its graphs; `model`: the zygote's, or None to load it here."""
        import torch
        from ringserve.workers.cuda import make_runner

        spec = self.spec
        torch.set_num_threads(spec.threads)
        set_graph_optimize(not is_gpu_device(spec.device))  # before the model's first call
        if model is None:
            model = load_model(spec.model_dir, "cpu")
        if manifest.embeds:
            from ringserve.workers.joined import Joined

            model = Joined(model)
        self.cpu_model_ok = True  # a failure from here on is the device's, not the model's
        return make_runner(spec, grid, model, self.ctl, activation)

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
        options: list[int] = []
        keep: list[tuple[int, int, int]] = []  # msg id, deadline, options
        bad: list[Answer] = []
        for msg_id, deadline, payload in msgs:
            opts, payload = split_options(payload)
            text = decode_payload(payload)
            embed = bool(opts & L.OPT_EMBED)
            # The front-end checks first: a vector from a model without one, scores from a
            # model without labels.
            if text is None or (embed and not self.dimension) or not (embed or self.n_labels):
                bad.append(self.pack(msg_id, L.STATUS_BAD_REQUEST))
                continue
            texts.append(text)
            options.append(opts)
            keep.append((msg_id, deadline, opts))
        if texts:
            # A pair goes through the tokenizer's own post-processor (special tokens, type ids);
            # a text over max_length is cut, refused or windowed (workers/longtext.py).
            plans = self.longtext.plan(texts, options)
            refused = self.admit(keep, plans, now)
            bad.extend(refused)
        if bad:
            self.ctl.add("bad_requests", len(bad))
            self.send(bad)
        return len(msgs)

    def admit(self, keep: list[tuple[int, int, int]], plans: list[Plan], now: int) -> list[Answer]:
        """Each plan's rows into the batcher; returns the refusals of texts that are too long."""
        refused: list[Answer] = []
        add = self.batcher.add
        for (msg_id, deadline, opts), plan in zip(keep, plans, strict=True):
            embed, bulk = bool(opts & L.OPT_EMBED), bool(opts & L.OPT_BULK)
            if plan.refusal is not None:
                windows, limit = plan.refusal
                head = L.pack_response(
                    L.STATUS_TOO_LONG, flags=plan.flags, windows=windows, tokens=plan.tokens,
                    limit=limit,
                )  # fmt: skip
                refused.append((msg_id, head, 0))
            elif len(plan.pieces) == 1:
                p = plan.pieces[0]
                add(Item(msg_id, deadline, now, p.ids, types=p.types, tokens=plan.tokens,
                         flags=plan.flags, embed=embed, bulk=bulk))  # fmt: skip
            else:  # windows: one Whole answers once, when its last window is scored
                whole = Whole(msg_id, plan.tokens, now, left=len(plan.pieces), embed=embed)
                whole.scores = [None] * len(plan.pieces)
                for i, p in enumerate(plan.pieces):
                    add(Item(msg_id, deadline, now, p.ids, types=p.types, whole=whole, window=i,
                             bulk=bulk))  # fmt: skip
        return refused

    def run_next(self) -> None:
        late = self.batcher.expire(time.monotonic_ns())
        if late:  # expired before it started: skip the work
            late = [it for it in late if it.whole is None or _settle(it.whole)]
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
        aux = L.pack_batch(len(batch), length, t0)  # the batch, for the front-end's traces
        out = []
        for row, it in enumerate(batch):
            if it.whole is not None:
                answer = self.window_done(it, probs[row], t0, model_us, aux)
                if answer is not None:
                    out.append(answer)
                continue
            queued_us = (t0 - it.arrived_ns) // 1000
            cls = bucket_index(grid, len(it.ids))  # latency is reported by the text's own length
            out.append(
                self.pack(it.msg_id, L.STATUS_OK, cls, self.part(probs[row], it.embed),
                          queued_us, model_us, it.flags, it.tokens, embed=it.embed, aux=aux)
            )  # fmt: skip
        ctl = self.ctl  # counted before the answers go: whoever sees one sees its batch counted
        ctl.add("requests", len(out))
        ctl.add("rows", len(batch))
        ctl.add("batches", 1)
        ctl.add("tokens", tokens)
        ctl.add("padded_tokens", len(batch) * length)
        ctl.add("busy_ns", t1 - t0)
        ctl.count_batch(len(batch))
        self.send(out)

    def window_done(
        self, it: Item, probs: Any, t0: int, model_us: int, aux: int = 0
    ) -> Answer | None:
        """Record one window's scores (a copy: the runner reuses its output buffer); the answer
        once the text's last window is in."""
        whole: Whole = it.whole
        if whole.done:  # its deadline passed while this window ran
            return None
        whole.scores[it.window] = probs.copy()
        whole.left -= 1
        whole.model_us += model_us  # the model time the text cost, over all its windows
        if whole.left:
            return None
        whole.done = True
        parts = [self.part(row, whole.embed) for row in whole.scores]
        # Embeddings: the mean of the window vectors (the contract's --long-text window).
        combined = combine(parts, "softmax" if whole.embed else self.activation)
        cls = bucket_index(self.report_grid, self.longtext.max_length)
        queued_us = (t0 - whole.arrived_ns) // 1000 - whole.model_us + model_us
        return self.pack(
            whole.msg_id, L.STATUS_OK, cls, combined, max(0, queued_us), whole.model_us,
            L.RSP_WINDOWED, whole.tokens, len(whole.scores), embed=whole.embed, aux=aux,
        )  # fmt: skip

    def part(self, row: Any, embed: bool) -> Any:
        """A runner row's embedding (after the C scores) or its scores."""
        return row[self.n_labels :] if embed else row[: self.n_labels]

    def pack(
        self,
        msg_id: int,
        status: int,
        bucket: int = 0,
        probs: Any = None,
        queued_us: int = 0,
        model_us: int = 0,
        flags: int = 0,
        tokens: int = 0,
        windows: int = 0,
        embed: bool = False,
        aux: int = 0,
    ) -> Answer:
        if probs is None:
            return (msg_id, L.pack_response(status), 0)
        probs = np.ascontiguousarray(probs, dtype=np.float32)
        label = 0 if embed else int(probs.argmax())
        head = L.pack_response(
            status, bucket, label, len(probs), queued_us, model_us, flags, windows, tokens
        )
        return (msg_id, head + probs.tobytes(), aux)

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
        if HOOKS.batch_delay_ms:  # test-only: a slow batch, to hold a text between batches
            time.sleep(HOOKS.batch_delay_ms / 1000)


def check_answer_room(max_payload: int, dimension: int) -> None:
    """An embed model's answer (D floats) must fit the response ring, with room to wrap."""
    need = L.RESPONSE_SIZE + 4 * dimension
    if 2 * need > max_payload:
        raise RuntimeError(
            f"the model's {dimension}-float embeddings need {need} bytes an answer; the response "
            f"ring holds {max_payload} (raise --ring-slots)"
        )


def _settle(whole: Whole) -> bool:
    """A windowed text's deadline passed: True for the first of its windows to see it (which
    answers), False for the rest."""
    if whole.done:
        return False
    whole.done = True
    return True


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
