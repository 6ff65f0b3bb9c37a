"""The worker process: attach rings, load its models, then tokenize, batch and answer.

A worker serves every model of its spec (workers/served.py): each request names its model by
index (shm.layout.split_model), each model batches its own texts, and Turns decides fairly
whose batch runs next.

Started with spawn, or forked from the zygote (workers/zygote.py), which hands over the imports
(torch and the CPU weights too, for TorchScript workers) already loaded. Everything that
creates threads or device state (thread count, CUDA, the runtime's warm-up) happens here, in
the child, either way. The heartbeat is stamped by the serving loop itself, so a stuck batch shows.

A worker of several lanes (spec.lanes, on ONNX Runtime, one model) runs the serving loop on a
thread per lane, each pinned to its own core with its own session: under one lock a lane reads
the ring, tokenizes, and takes the next batch from the model's one Batcher; it runs the forward
pass outside the lock, then answers under it. So the texts of both cores wait in one pool and
form fuller batches than two workers' halves (docs/design.md, "A lane per core").
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from ringserve.shm import layout as L
from ringserve.shm.channel import Channel
from ringserve.workers.batcher import Item, bucket_index
from ringserve.workers.longtext import Plan, Whole, combine, split_options
from ringserve.workers.served import Loader, Preloaded, Served, Turns
from ringserve.workers.served import check_answer_room as check_answer_room
from ringserve.workers.served import set_graph_optimize as set_graph_optimize
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
# Many models on the CPU: a model owed to a lighter one (workers.served.Turns) runs its whole
# batches on a background thread of the worker, at this nice value (a thread may raise its own
# without privilege), while the loop goes on reading and runs the lighter model's batches at
# once: the two threads share the worker's core, the kernel giving the light batch about 90%
# of it (weights 1024 against 110), so a light text no longer waits for the busy batch to end,
# and the busy model no longer runs cut batches for it. benchmarks/many_models.py --phases r
# (5 rounds, 2 shared CPUs, 90/10 at c=32): light P99 pooled over the rounds 1.26x alone at
# nice 10 with (b)/(a) median 0.93; 1.28x and 0.92 at nice 5; 1.87x at nice 0 (measured before
# a lost wake-up was fixed); against 1.81x and 0.94 with the eighth-cut batches before.
BEHIND_NICE = 10
_PR_SET_PDEATHSIG = 1
Answer = tuple[int, bytes, int]  # (msg id, response payload, aux) as the ring takes it
Kept = tuple[int, int, int]  # msg id, deadline, options: a request admitted to a model


@dataclass(slots=True)
class Running:
    """A batch whose forward pass started at t0: what answering it needs once its scores are
    in, and, for one run on the background thread, the future that brings them."""

    served: Served
    batch: list[Item]
    length: int
    tokens: int
    t0: int
    future: Future[tuple[Any, int]] | None = None


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # the loop's getppid check still catches a dead parent


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
        self.loader = Loader(spec, self.ctl, self.responses.max_payload())
        self.models: dict[int, Served] = {}  # model index (the wire's) -> its state
        self.turns = Turns({})
        self.behind: Running | None = None  # the batch running on the background thread
        self.behind_runs = 0  # batches run there
        self._thread: ThreadPoolExecutor | None = None
        # Lanes (serve_lanes): the lock they share, when each lane's running batch started (0:
        # none), the exit code a lane decided on, and the first lane's failure.
        self.lock = threading.Lock()
        self.started_ns = [0] * spec.lanes if spec.lanes > 1 else []
        self.ended: int | None = None
        self.failure: BaseException | None = None

    @property
    def cpu_model_ok(self) -> bool:
        """The model being loaded is fine: a boot failure now is the device's."""
        return self.loader.model_ok

    def boot(self, preloaded: dict[str, Preloaded] | None = None) -> None:
        """Load every model of the spec (taking what the zygote preloaded, keyed by model
        directory), warm each one's shapes, then say ready."""
        t0 = time.monotonic()
        for ref in self.spec.refs():
            served = self.loader.load(ref, (preloaded or {}).get(ref.model_dir))
            self.models[ref.index] = served
            self.ctl.set_model_rss(ref.index, served.rss_bytes)
            self.ctl.beat()
        # Whole batches behind a lighter model's on the CPU; a GPU keeps the capped ones.
        behind = len(self.models) > 1 and not is_gpu_device(self.spec.device)
        if self.spec.lanes > 1 and len(self.models) != 1:  # settings.resolve_lanes keeps this out
            raise ValueError("a worker of several lanes serves one model")
        self.turns = Turns({i: m.batcher for i, m in self.models.items()}, behind)
        for started, warm_s in self.loader.started:  # GPU: report the graphs; sample NVML
            monitor = started(warm_s)
            self.gpu = self.gpu if self.gpu is not None else monitor
        self.ctl.set("boot_ms", int((time.monotonic() - t0) * 1000))
        self.ctl.set("state", L.W_READY)
        self.ctl.beat()
        self.spec.eventfd.ring()  # tells the supervisor at once, without waiting for its tick

    # -- serving loop -------------------------------------------------------------------------
    def serve(self) -> int:
        if self.spec.lanes > 1:
            return self.serve_lanes()
        spec = self.spec
        try:
            while not self.stop:
                if self.behind is None:  # a batch behind stamps nothing until done, as any
                    self.ctl.beat()
                elif self.behind.future is not None and self.behind.future.done():
                    self.finish_behind()
                    self.ctl.beat()
                if os.getppid() != spec.parent_pid:
                    return EXIT_PARENT_GONE
                if self.gpu is not None:
                    self.gpu.tick()  # at most once a second; never raises
                took = self.take_posted()
                index, wait_ns = self.turns.next(time.monotonic_ns(), self.behind is not None)
                if index is not None:
                    self.run_next(self.models[index])
                elif not took:  # the batch behind rings the doorbell when it is done
                    self.wait_doorbell(wait_ns)
            if self.behind is not None:  # stopping: its texts are answered first
                self.finish_behind()
        finally:
            if self._thread is not None:
                self._thread.shutdown(wait=False, cancel_futures=True)
        return EXIT_OK

    def beat(self) -> None:
        """Stamp the heartbeat: now, or, with lanes, when the oldest batch still running
        started (a lane stuck in its batch stops the beat as one loop would)."""
        running = [t for t in self.started_ns if t]
        self.ctl.beat(min(running) if running else None)

    # -- lanes ----------------------------------------------------------------------------------
    def serve_lanes(self) -> int:
        """Run the serving loop on every lane, lane 0 on this thread (which takes the stop
        signal); returns once each lane has answered the batch it ran when the stop came."""
        served = self.models[min(self.models)]  # the one model (boot checks)
        others = [
            threading.Thread(target=self.lane, args=(k, served), name=f"lane-{k}", daemon=True)
            for k in range(1, self.spec.lanes)
        ]
        for t in others:  # before lane 0 pins this thread: they inherit the worker's CPUs
            t.start()
        self.lane(0, served)
        for t in others:
            t.join()
        if self.failure is not None:  # a lane's error is the worker's, as the loop's would be
            raise self.failure
        return self.ended if self.ended is not None else EXIT_OK

    def lane(self, k: int, served: Served) -> None:
        """One lane's life; its failure stops every lane and is raised by serve_lanes."""
        try:
            self.lane_loop(k, served)
        except BaseException as exc:  # noqa: BLE001 - handed to serve_lanes, which raises it
            if self.failure is None:
                self.failure = exc
            self.stop = True

    def lane_loop(self, k: int, served: Served) -> None:
        spec, doorbell, lock = self.spec, self.spec.doorbell, self.lock
        runner = served.runners[k]
        mine: set[int] = set()
        while True:
            mine = self.pin_lane(k, mine)
            with lock:
                if self.stop or self.ended is not None:
                    return
                self.beat()
                if os.getppid() != spec.parent_pid:
                    self.ended = EXIT_PARENT_GONE
                    return
                took = self.take_posted()
                now = time.monotonic_ns()
                self.expire(now)
                index, wait_ns = self.turns.next(now)
                batch, length = served.batcher.take() if index is not None else ([], 0)
                if batch:
                    self.started_ns[k] = now
                    if served.batcher.size:  # texts left: wake a lane that sleeps to take them
                        doorbell.release()
            if not batch:
                if not took:
                    self.wait_doorbell(wait_ns)
                continue
            self.maybe_grow()
            tokens = runner.fill(length, batch)  # the lane's own buffers: outside the lock
            run = Running(served, batch, length, tokens, time.monotonic_ns())
            probs = runner.forward(length, len(batch))
            t1 = time.monotonic_ns()
            with lock:
                self.started_ns[k] = 0
                self.answer(run, t1, probs)

    def pin_lane(self, k: int, mine: set[int]) -> set[int]:
        """Keep lane k on its own share of the worker's CPUs: the k-th `threads` of them. The
        front-end moves every thread of a spare onto its slot's CPUs when it takes the slot
        (service.pool.handle.pin), so a lane that finds its CPUs changed pins itself again."""
        try:
            now = os.sched_getaffinity(0)  # this thread's own
        except (OSError, AttributeError):
            return mine
        if now == mine:
            return mine
        cpus, per = sorted(now), self.spec.threads
        start = (k * per) % len(cpus)
        want = {cpus[(start + i) % len(cpus)] for i in range(per)}
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, want)
        return want

    def take_posted(self) -> int:
        """take_requests, then one doorbell post consumed for each request read (each was
        posted once: the count stays honest for the next sleep)."""
        took = self.take_requests()
        doorbell = self.spec.doorbell
        for _ in range(took):
            if not doorbell.acquire(False):
                break
        return took

    def wait_doorbell(self, wait_ns: int) -> None:
        """Sleep until a request is posted, the next text is due (`wait_ns`; < 0: none), or
        IDLE_WAIT_S, whichever is first."""
        timeout = IDLE_WAIT_S if wait_ns < 0 else min(IDLE_WAIT_S, wait_ns / 1e9)
        self.spec.doorbell.acquire(True, timeout)

    def take_requests(self) -> int:
        """Read what the ring holds and hand each text to its model's batcher."""
        msgs = self.requests.read(READ_LIMIT)
        if not msgs:
            return 0
        now = time.monotonic_ns()
        texts: dict[int, list[str | tuple[str, str]]] = {}
        keep: dict[int, list[Kept]] = {}
        bad: list[Answer] = []
        unknown = 0
        for msg_id, deadline, payload in msgs:
            index, payload = L.split_model(payload)
            served = self.models.get(index)
            if served is None:  # never loaded here, or unloaded: the front-end answers 404
                bad.append(self.pack(msg_id, L.STATUS_UNKNOWN_MODEL))
                unknown += 1
                continue
            opts, payload = split_options(payload)
            text = decode_payload(payload)
            if text is None or served.refuses(bool(opts & L.OPT_EMBED)):
                bad.append(self.pack(msg_id, L.STATUS_BAD_REQUEST))
                continue
            texts.setdefault(index, []).append(text)
            keep.setdefault(index, []).append((msg_id, deadline, opts))
        for index, some in texts.items():
            served = self.models[index]
            # A pair goes through the tokenizer's own post-processor (special tokens, type
            # ids); a text over max_length is cut, refused or windowed (workers/longtext.py).
            plans = served.longtext.plan(some, [opts for _, _, opts in keep[index]])
            bad.extend(self.admit(served, keep[index], plans, now))
        if bad:
            self.ctl.add("bad_requests", len(bad) - unknown)
            self.ctl.add("unknown_model", unknown)
            self.send(bad)
        return len(msgs)

    def admit(self, served: Served, keep: list[Kept], plans: list[Plan], now: int) -> list[Answer]:
        """Each plan's rows into the model's batcher; returns the refusals of texts too long."""
        refused: list[Answer] = []
        add = served.batcher.add
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

    def expire(self, now_ns: int) -> None:
        """Answer every text, of any model, whose deadline passed before it ran."""
        late: list[Item] = []
        for served in self.models.values():
            late.extend(served.batcher.expire(now_ns))
        if late:  # expired before it started: skip the work
            late = [it for it in late if it.whole is None or _settle(it.whole)]
            self.ctl.add("expired", len(late))
            self.send([self.pack(it.msg_id, L.STATUS_DEADLINE) for it in late])

    def run_next(self, served: Served) -> None:
        """Run the model's next batch and answer it."""
        self.expire(time.monotonic_ns())
        batch, length = served.batcher.take()
        if not batch:
            return
        self.maybe_grow()
        runner = served.runner
        tokens = runner.fill(length, batch)
        run = Running(served, batch, length, tokens, time.monotonic_ns())
        if self.turns.owes(served.ref.index):
            run.future = self.thread().submit(_forward, runner, length, len(batch))
            # Rung once the future is done (not before: the loop must then see it done).
            run.future.add_done_callback(self._ring)
            self.behind = run
            self.behind_runs += 1
            return
        probs = runner.forward(length, len(batch))
        self.answer(run, time.monotonic_ns(), probs)

    def thread(self) -> ThreadPoolExecutor:
        """The background thread, started at its first batch, at BEHIND_NICE."""
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, "behind", initializer=_lower_priority)
        return self._thread

    def _ring(self, future: Future[tuple[Any, int]]) -> None:
        """On the background thread, its batch done: wake the loop to answer it."""
        self.spec.doorbell.release()

    def finish_behind(self) -> None:
        """Answer the batch behind (waiting for it if it still runs); its error is the loop's."""
        run, self.behind = self.behind, None
        assert run is not None and run.future is not None
        probs, t1 = run.future.result()
        self.answer(run, t1, probs)

    def answer(self, run: Running, t1: int, probs: Any) -> None:
        """Answer a batch whose forward pass ran from run.t0 to t1."""
        served, batch, length, t0 = run.served, run.batch, run.length, run.t0
        model_us = (t1 - t0) // 1000
        grid = served.report_grid
        aux = L.pack_batch(len(batch), length, t0)  # the batch, for the front-end's traces
        scores = Scores(probs, len(batch), served.n_labels)
        out = []
        for row, it in enumerate(batch):
            if it.whole is not None:
                answer = self.window_done(served, it, probs[row], t0, model_us, aux)
                if answer is not None:
                    out.append(answer)
                continue
            queued_us = (t0 - it.arrived_ns) // 1000
            cls = bucket_index(grid, len(it.ids))  # latency is reported by the text's own length
            if it.embed:
                out.append(
                    self.pack(it.msg_id, L.STATUS_OK, cls, served.part(probs[row], True),
                              queued_us, model_us, it.flags, it.tokens, embed=True, aux=aux)
                )  # fmt: skip
                continue
            head = L.pack_response(
                L.STATUS_OK, cls, scores.labels[row], served.n_labels, queued_us, model_us,
                it.flags, 0, it.tokens,
            )  # fmt: skip
            out.append((it.msg_id, head + scores.row(row), aux))
        ctl = self.ctl  # counted before the answers go: whoever sees one sees its batch counted
        ctl.add("requests", len(out))
        ctl.add("rows", len(batch))
        ctl.add("batches", 1)
        ctl.add("tokens", run.tokens)
        ctl.add("padded_tokens", len(batch) * length)
        ctl.add("busy_ns", t1 - t0)
        ctl.count_batch(len(batch))
        self.send(out)

    def window_done(
        self, served: Served, it: Item, probs: Any, t0: int, model_us: int, aux: int = 0
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
        parts = [served.part(row, whole.embed) for row in whole.scores]
        # Embeddings: the mean of the window vectors (the contract's --long-text window).
        combined = combine(parts, "softmax" if whole.embed else served.activation)
        cls = bucket_index(served.report_grid, served.longtext.max_length)
        queued_us = (t0 - whole.arrived_ns) // 1000 - whole.model_us + model_us
        return self.pack(
            whole.msg_id, L.STATUS_OK, cls, combined, max(0, queued_us), whole.model_us,
            L.RSP_WINDOWED, whole.tokens, len(whole.scores), embed=whole.embed, aux=aux,
        )  # fmt: skip

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
                self.beat()
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


class Scores:
    """A batch's scores (the first `n_labels` columns of the runner's rows) as its answers
    carry them: every row's label from one argmax, every row's float32 bytes from one copy,
    the same bytes and labels Worker.pack gives a row alone."""

    __slots__ = ("blob", "labels", "width")

    def __init__(self, probs: Any, rows: int, n_labels: int) -> None:
        part = np.ascontiguousarray(probs[:rows, :n_labels], dtype=np.float32)
        self.labels: list[int] = part.argmax(axis=1).tolist() if n_labels else [0] * rows
        self.blob = part.tobytes()
        self.width = 4 * n_labels

    def row(self, i: int) -> bytes:
        return self.blob[i * self.width : (i + 1) * self.width]


def _forward(runner: Any, length: int, rows: int) -> tuple[Any, int]:
    """On the background thread: a batch's forward pass, and when it ended."""
    return runner.forward(length, rows), time.monotonic_ns()


def _lower_priority() -> None:
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BEHIND_NICE)


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


def main(spec: WorkerSpec, preloaded: dict[str, Preloaded] | None = None) -> None:
    """The worker's life; `preloaded`: what the zygote loaded, by model directory, when forked
    from it."""
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
        worker.boot(preloaded)
    except Exception as exc:  # noqa: BLE001 - any boot failure is reported the same way
        device_fault = worker.cpu_model_ok and spec.device != "cpu"
        what = f"cannot start on {spec.device}" if device_fault else "cannot load the model"
        if worker.loader.current is not None:
            what += f" at {worker.loader.current.model_dir}"
        print(f"ringserve worker {spec.serial}: {what}: {exc}", file=sys.stderr)
        traceback.print_exc()
        worker.ctl.set("state", L.W_EXITING)
        worker.close()
        sys.exit(EXIT_DEVICE_ERROR if device_fault else EXIT_BOOT_ERROR)
    code = worker.serve()
    worker.ctl.set("state", L.W_EXITING)
    worker.close()
    sys.exit(code)
