"""The zygote: a spawned process that holds torch and its models' CPU weights and forks workers.

It preloads every model of its list (TorchScript ones; an ONNX Runtime model's session is made
in the worker after the fork) and hands each forked worker the lot, keyed by model directory
(workers.process.served.Preloaded), with the RSS each load added to the zygote. The
artifacts' hashes were checked by the front-end just before (preload's `verify`), except for
a zygote that replaces a dead one, which checks them again.

Why forking from it is as safe as spawn, for CUDA and for OpenMP:
- The zygote is started with spawn (a fresh interpreter). It imports torch and loads the
  TorchScript model onto the CPU and does nothing else: it never calls into torch.cuda (torch
  initialises CUDA lazily, on first use, so no driver context, no CUDA thread and no device
  memory exist in it), and it never runs a forward pass, so torch's OpenMP/intra-op thread pool
  is never created. `check_forkable` verifies both before every fork: one thread, CUDA not
  initialised. A fork therefore copies a single-threaded process with no CUDA state, which is
  what spawn would build, only with the imports and weights already in memory.
- The forked child pins itself, sets its thread count, opens its rings, initialises CUDA if its
  device is a GPU, creates any ONNX Runtime session, and warms its own shapes: every thread pool
  and every device context is born in the child.
- The weights' pages are shared copy-on-write: no child writes them (inference only).

Workers must outlive a dead zygote and die with the front-end, as spawned ones do. So the
zygote forks twice: the middle process reports the worker's pid and exits, and the worker is
re-parented to the front-end, which marks itself a child subreaper (PR_SET_CHILD_SUBREAPER).
The worker is then the front-end's own child: it is reaped with waitpid, its exit code means
what it means for a spawned worker, and its parent-death signal names the front-end.

Requests travel on a SOCK_SEQPACKET socketpair: a pickled WorkerSpec with its two doorbell fds
attached by SCM_RIGHTS; the answer is the worker's pid.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import multiprocessing
import os
import pickle
import select
import signal
import socket
import struct
import sys
import time
import traceback
from collections.abc import Iterator, Sequence

from ringserve.shm.doorbell import EventFd, Semaphore
from ringserve.workers.artifact import load_manifest, load_model
from ringserve.workers.process.served import Preloaded, rss_bytes
from ringserve.workers.spec import EXIT_PARENT_GONE, ModelRef, WorkerSpec, ignore_group_signals

SPAWN = multiprocessing.get_context("spawn")
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PID = struct.Struct("<q")
READY = b"ready"
MAX_SPEC = 1 << 20
FORK_TIMEOUT_S = 5.0  # a fork answers in milliseconds; longer means the zygote is stuck
REPARENT_TIMEOUT_S = 5.0


def _prctl(option: int, arg: int) -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Orphaned descendants (the zygote's grandchildren: the workers) are re-parented here."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def threads_of_self() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def check_forkable() -> str | None:
    """Why forking now would not be as clean as spawn, or None."""
    torch = sys.modules.get("torch")  # a zygote for ONNX Runtime workers never imports it
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised in the zygote"
    n = threads_of_self()
    if n != 1:
        return f"the zygote runs {n} threads"
    return None


# -- the zygote process ---------------------------------------------------------------------------
def zygote_main(
    sock: socket.socket,
    model_dirs: tuple[str, ...],
    parent_pid: int,
    torch_models: tuple[bool, ...] = (True,),
    verify: bool = True,
) -> None:
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    ignore_group_signals()  # the front-end decides; it stops us by closing the socket
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    if os.getppid() != parent_pid:
        os._exit(EXIT_PARENT_GONE)
    models = preload(model_dirs, torch_models, verify)
    problem = check_forkable()
    if problem:
        print(f"ringserve zygote: will not fork: {problem}", file=sys.stderr)
        os._exit(1)
    sock.send(READY + _PID.pack(os.getpid()))
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_SPEC, 2)
        except OSError:
            os._exit(0)
        if not data:  # the front-end closed its end: it is stopping or gone
            os._exit(0)
        fork_worker(sock, data, fds, models)


def preload(
    model_dirs: tuple[str, ...], torch_models: tuple[bool, ...], verify: bool = True
) -> dict[str, Preloaded]:
    """Import everything a worker needs and load each model's CPU weights; run nothing.
    `verify`: hash each artifact against its fingerprint first. The front-end has just done so
    for the list it starts or rolls onto (the hash of the default artifact takes about a
    second here, so doing it twice doubled a load's and a start's wait); a zygote that
    replaces a dead one checks again, since the files may have changed since.

    Models served on ONNX Runtime (their `torch_models` entry False) get no TorchScript copy,
    and with none of those no torch at all, which the workers would not use (measured: the
    tree's PSS fell by about 100 MiB): their session is created in the child and maps the
    artifact's weights (importing onnxruntime starts a thread, so not even the import happens
    here). Each model's entry carries the RSS its load added here, measured after the imports."""
    if any(torch_models):
        import ringserve.workers.runtimes.cuda
        import torch  # noqa: F401 - the point is to have it imported before the fork
    import ringserve.workers.process.worker  # noqa: F401

    models: dict[str, Preloaded] = {}
    for model_dir, torch_model in zip(model_dirs, torch_models, strict=True):
        if model_dir in models:  # one artifact at two indexes: one copy, shared
            continue
        before = rss_bytes()
        load_manifest(model_dir, verify)  # once here rather than in every child
        model = load_model(model_dir, "cpu") if torch_model else None
        models[model_dir] = Preloaded(model, max(0, rss_bytes() - before))
    # Everything loaded so far lives as long as the zygote: move it out of the collector's
    # reach, so a child's collections never write to (and so copy) the shared pages. Measured
    # here: a child's first full collection took 0.15-0.39 s without this, ~0 with it.
    gc.collect()
    gc.freeze()
    return models


def fork_worker(
    sock: socket.socket, data: bytes, fds: list[int], models: dict[str, Preloaded]
) -> None:
    middle = os.fork()
    if middle == 0:
        try:
            pid = os.fork()
            if pid == 0:
                _run_child(sock, data, fds, models)  # never returns
            sock.send(_PID.pack(pid))
        finally:
            os._exit(0)
    for fd in fds:
        os.close(fd)
    os.waitpid(middle, 0)


def _run_child(
    sock: socket.socket, data: bytes, fds: list[int], models: dict[str, Preloaded]
) -> None:
    """The worker: wait to be the front-end's child, then boot and serve as a spawned one."""
    code = 1
    try:
        sock.close()
        spec: WorkerSpec = pickle.loads(data)
        spec.doorbell, spec.eventfd = Semaphore(fds[0]), EventFd(fds[1])
        deadline = time.monotonic() + REPARENT_TIMEOUT_S
        while os.getppid() != spec.parent_pid:  # the middle process has not exited yet
            if time.monotonic() > deadline:
                os._exit(EXIT_PARENT_GONE)
            time.sleep(0.0005)
        from ringserve.workers.process.worker import main

        main(spec, models)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - report and leave with a code, never unwind the zygote
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


# -- the front-end's side -------------------------------------------------------------------------
def model_dirs_of(models: str | Sequence[str | ModelRef]) -> tuple[str, ...]:
    """Model directories from one directory, or a sequence of directories or ModelRefs."""
    if isinstance(models, str):
        return (models,)
    return tuple(m.model_dir if isinstance(m, ModelRef) else m for m in models)


class Zygote:
    """The front-end's handle on one zygote process (for one model generation). `models`: the
    model directory, or every model (ModelRefs or directories) its workers serve;
    `torch_model`: whether each runs TorchScript (one bool for all, or one per model)."""

    def __init__(
        self,
        models: str | Sequence[str | ModelRef],
        generation: int,
        torch_model: bool | Sequence[bool] = True,
        verify: bool = True,
    ) -> None:
        become_subreaper()
        self.model_dirs = model_dirs_of(models)
        self.model_dir = self.model_dirs[0] if self.model_dirs else ""
        flags = (
            (torch_model,) * len(self.model_dirs)
            if isinstance(torch_model, bool)
            else tuple(torch_model)
        )
        self.generation = generation
        self.verify = verify  # whether it hashes its artifacts (preload)
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.process = SPAWN.Process(
            target=zygote_main,
            args=(child, self.model_dirs, os.getpid(), flags, verify),
            name="ringserve-zygote",
            daemon=False,
        )
        with _single_threaded_blas():
            self.process.start()
        child.close()
        self.ready = False
        self.dead = False
        self.announced = False  # the supervisor has logged that it is ready
        self.started_at = time.monotonic()

    def poll(self) -> bool:
        """True once the zygote has loaded the model (never blocks)."""
        if self.ready or self.dead:
            return self.ready
        if self.process.exitcode is not None:
            self.dead = True
            return False
        if select.select([self.sock], [], [], 0)[0]:
            msg = self._recv()
            self.ready = msg is not None and msg.startswith(READY)
            self.dead = not self.ready
        return self.ready

    def fork(self, spec: WorkerSpec) -> int | None:
        """Fork a worker for `spec`; its pid, or None when the zygote cannot (then it is dead)."""
        if not self.poll():
            return None
        fds = [spec.doorbell.fd, spec.eventfd.fd]
        bare = _without_fds(spec)
        try:
            socket.send_fds(self.sock, [pickle.dumps(bare)], fds)
            msg = self._recv(FORK_TIMEOUT_S)
        except OSError:
            msg = None
        if msg is None or len(msg) != _PID.size:
            self.close()
            return None
        pid: int = _PID.unpack(msg)[0]
        return pid

    def _recv(self, timeout: float = 0.0) -> bytes | None:
        if timeout and not select.select([self.sock], [], [], timeout)[0]:
            return None
        try:
            data = self.sock.recv(64)
        except OSError:
            return None
        return data or None

    def alive(self) -> bool:
        return not self.dead and self.process.exitcode is None

    def close(self) -> None:
        """Stop the zygote (its workers are not its children and go on serving)."""
        self.dead = True
        self.ready = False
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.process.exitcode is None:  # it exits on the socket's EOF (it ignores SIGTERM)
            self._wait_exit(2.0)
            if self.process.exitcode is None:
                self.process.kill()
                self._wait_exit(2.0)
        with contextlib.suppress(ValueError):
            self.process.close()

    def _wait_exit(self, timeout: float) -> None:
        """Wait on a pidfd, not multiprocessing's sentinel: the workers forked from us inherit
        that pipe's write end, so it reads EOF only once they have all exited too."""
        pid = self.process.pid
        if pid is None:
            return
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # already reaped
            return
        try:
            select.select([fd], [], [], timeout)
        finally:
            os.close(fd)


@contextlib.contextmanager
def _single_threaded_blas() -> Iterator[None]:
    """numpy's OpenBLAS starts its thread pool when it is loaded: one thread per core, before
    any code of ours runs. Workers compute in torch, not numpy's BLAS, so the zygote (and the
    workers it forks) get a pool of one, and the zygote stays single-threaded until it forks."""
    saved = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["OPENBLAS_NUM_THREADS"]
        else:
            os.environ["OPENBLAS_NUM_THREADS"] = saved


def _without_fds(spec: WorkerSpec) -> WorkerSpec:
    import dataclasses

    return dataclasses.replace(spec, doorbell=None, eventfd=None)
