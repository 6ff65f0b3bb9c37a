"""`ringserve batch`: score a whole file through the server's own worker pool, with no HTTP.

The input is reached through mmap (corpus.py) and fed to the dispatcher longest first over
the whole file, so the workers' batches hold texts of about one length. Answers arrive out of
order; each is stored by line number in a fixed-size results table (`OUTPUT.state.npy`, a
memory-mapped file), and the output is written from that table in input order as far as every
line is finished. Memory is therefore a constant per line (index and table) and nothing grows
with the run. Ctrl-C stops feeding, waits for what is in flight, and leaves a valid prefix of
the output plus the table, from which `--resume` continues.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from ringserve.factory.build import default_in_child
from ringserve.service.config.settings import BY_NAME, Config
from ringserve.service.engine.admission import too_long
from ringserve.service.engine.dispatcher import Dispatcher, Result
from ringserve.service.logs import EventLog
from ringserve.service.models.device import resolve_device
from ringserve.service.models.info import pick_precision, scan_repository
from ringserve.service.offline import corpus as C
from ringserve.service.pool.supervisor import Supervisor
from ringserve.service.protocols.routes import long_text_fields
from ringserve.service.protocols.tasks import float_json
from ringserve.service.request import prompts
from ringserve.shm import layout as L
from ringserve.shm import segment
from ringserve.workers.artifact import ArtifactError, load_manifest

PENDING = 0
DONE_OK = 1
TOO_LONG = 9
# Status byte of a finished line that is an error: 10 + a corpus code, or 20 + a worker status.
MESSAGES = {10 + code: msg for code, msg in C.ERRORS.items()}
MESSAGES.update(
    {
        10 + TOO_LONG: "text is longer than the largest request",
        20 + L.STATUS_BAD_REQUEST: "text is empty or not valid UTF-8",
        20 + L.STATUS_OVERLOADED: "overloaded",
        20 + L.STATUS_DEADLINE: "request deadline passed",
        20 + L.STATUS_INTERNAL: "internal error",
    }
)
GROUP = 32  # texts admitted as one dispatcher group
WRITE_CHUNK = 4096  # rows looked at per step when writing the finished prefix
RELEASE_EVERY = 8192  # lines fed between giving the input's mapped pages back
STOP_WAIT_S = 60.0  # on Ctrl-C, longest wait for answers already in flight


def table_dtype(n_labels: int) -> np.dtype[Any]:
    # flags, tokens, windows and limit as the worker answered them (long texts: shm/layout.py)
    return np.dtype(
        [
            ("status", "u1"),
            ("label", "<u2"),
            ("scores", "<f4", (n_labels,)),
            ("flags", "u1"),
            ("tokens", "<u4"),
            ("windows", "<u2"),
            ("limit", "<u2"),
        ]
    )


class Results:
    """The results table (memory-mapped, by line number) and the in-order output it feeds."""

    def __init__(
        self,
        output: Path,
        n: int,
        labels: list[str],
        meta: dict[str, Any],
        resume: bool,
        embed: tuple[int, bool] | None = None,
    ):
        """`embed`: (dimension, normalize) for --task embed: a row holds the vector."""
        self.output = output
        self.embed = embed
        self.width = embed[0] if embed else len(labels)
        # A .npy output is the [N, D] float32 matrix, written whole when every line is done
        # (a line that failed is a row of NaN); the table alone carries a stopped run.
        self.npy = output.suffix == ".npy"
        if self.npy and not embed:
            raise ValueError("a .npy output holds embeddings: use --task embed")
        self.state = Path(str(output) + ".state.npy")
        self.meta_path = Path(str(output) + ".state.json")
        self.labels = labels
        self.n = n
        self.table = self._open_table(n, meta, resume)
        self.written = self._open_output(resume)
        self.status = self.table["status"]

    def _open_table(self, n: int, meta: dict[str, Any], resume: bool) -> Any:
        if resume and self.state.exists() and self.meta_path.exists():
            old = json.loads(self.meta_path.read_text())
            if old != meta:
                raise SystemExit(
                    f"ringserve batch: --resume: {self.meta_path} was made for another input, "
                    "model or precision; remove it or run without --resume"
                )
            table = np.lib.format.open_memmap(self.state, mode="r+")
            if table.shape != (n,) or table.dtype != table_dtype(self.width):
                raise SystemExit(f"ringserve batch: --resume: {self.state} does not fit")
            return table
        self.meta_path.write_text(json.dumps(meta))
        return np.lib.format.open_memmap(
            self.state, mode="w+", dtype=table_dtype(self.width), shape=(n,)
        )

    def _open_output(self, resume: bool) -> int:
        """Lines already in the output (cut after its last whole line); 0 when starting over."""
        self.out: Any = None
        if self.npy:
            return 0  # write_ready() passes the finished prefix again from the table
        if not resume or not self.output.exists():
            self.out = open(self.output, "wb")  # noqa: SIM115 - closed in close()
            return 0
        with open(self.output, "r+b") as f:
            data = f.read()
            keep = data.rfind(b"\n") + 1
            f.truncate(keep)
        self.out = open(self.output, "ab")  # noqa: SIM115 - closed in close()
        return min(data.count(b"\n", 0, keep), self.n)

    def store(self, rows: list[int], results: list[Result]) -> None:
        ok = [(i, r) for i, r in zip(rows, results, strict=True) if r.status == L.STATUS_OK]
        table = self.table
        for i, r in zip(rows, results, strict=True):
            if r.status != L.STATUS_OK:
                if r.status == L.STATUS_TOO_LONG:  # its message names the counts
                    table[i] = (PENDING, 0, 0, r.flags, r.tokens, r.windows, r.limit)
                self.status[i] = 20 + r.status
        if ok:
            idx = np.fromiter((i for i, _ in ok), np.int64, len(ok))
            table["scores"][idx] = np.stack([r.scores for _, r in ok])  # type: ignore[misc]
            table["label"][idx] = [r.label_id for _, r in ok]
            table["flags"][idx] = [r.flags for _, r in ok]
            table["tokens"][idx] = [r.tokens for _, r in ok]
            table["windows"][idx] = [r.windows for _, r in ok]
            self.status[idx] = DONE_OK  # last: a row is finished only once its scores are in

    def line(self, i: int) -> bytes:
        st = int(self.status[i])
        row = self.table[i]
        if st == 20 + L.STATUS_TOO_LONG:  # as /v1/classify's 413 says it
            message, counts = too_long(self.row_result(row, L.STATUS_TOO_LONG))
            return json.dumps({"error": message, **counts}).encode() + b"\n"
        if st != DONE_OK:
            return json.dumps({"error": MESSAGES.get(st, "internal error")}).encode() + b"\n"
        doc: dict[str, Any]
        if self.embed:  # the vector, normalized as the model's own pipeline does
            vec = row["scores"].astype(np.float64)
            if self.embed[1]:
                vec /= max(float(np.linalg.norm(vec)), 1e-12)
            if not row["flags"]:  # the common line, formatted in one C call (tasks.py)
                return b'{"embedding":%s}\n' % float_json(vec)
            doc = {"embedding": vec.astype(np.float32).tolist()}
        else:
            label = int(row["label"])
            doc = {"label": self.labels[label], "label_id": label, "scores": row["scores"].tolist()}
        if row["flags"]:
            doc.update(long_text_fields(self.row_result(row, L.STATUS_OK)))
        return json.dumps(doc).encode() + b"\n"

    @staticmethod
    def row_result(row: Any, status: int) -> Result:
        """The long-text counts of a table row, as the worker answered them."""
        return Result(
            status,
            flags=int(row["flags"]),
            tokens=int(row["tokens"]),
            windows=int(row["windows"]),
            limit=int(row["limit"]),
        )

    def write_ready(self) -> int:
        """Append every finished line after the last one written; returns lines written."""
        start = self.written
        while self.written < self.n:
            chunk = self.status[self.written : self.written + WRITE_CHUNK]
            pending = np.flatnonzero(chunk == PENDING)
            stop = self.written + (int(pending[0]) if len(pending) else len(chunk))
            if self.out is not None:
                self.out.write(b"".join(self.line(i) for i in range(self.written, stop)))
            self.written = stop
            if len(pending):
                break
        if self.out is not None:
            self.out.flush()
        return self.written - start

    def errors(self) -> int:
        """Finished lines that are errors (a .npy output has no error lines to count)."""
        return int(np.count_nonzero(self.status[: self.written] != DONE_OK))

    def save_matrix(self) -> None:
        """The .npy output: every line's vector, normalized as the model does; NaN for errors."""
        assert self.embed is not None
        vecs = np.asarray(self.table["scores"], dtype=np.float64)
        if self.embed[1]:
            vecs /= np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
        vecs[self.status != DONE_OK] = np.nan
        tmp = self.output.with_name(self.output.name + ".tmp.npy")
        np.save(tmp, vecs.astype(np.float32))
        os.replace(tmp, self.output)

    def close(self, finished: bool) -> None:
        if self.out is not None:
            self.out.close()
        if self.npy and finished:
            self.save_matrix()
        self.table.flush()
        del self.status, self.table
        if finished:  # nothing left to resume: leave nothing behind
            for p in (self.state, self.meta_path):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()


class Progress:
    """A bar on a terminal (rewritten in place), else a log line every `every_s` seconds."""

    def __init__(self, total: int, done: int, stream: TextIO, every_s: float) -> None:
        self.total = total
        self.start_done = done
        self.stream = stream
        self.tty = stream.isatty()
        self.every_s = 0.5 if self.tty else every_s
        self.t0 = time.monotonic()
        self.first_at: float | None = None  # the whole pool ready: excludes its boot
        self.last = 0.0

    def rate(self, done: int, now: float) -> float:
        if self.first_at is None or now - self.first_at <= 0:
            return 0.0
        return (done - self.start_done) / (now - self.first_at)

    def started(self) -> None:
        if self.first_at is None:
            self.first_at = time.monotonic()

    def update(self, done: int, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < self.every_s:
            return
        self.last = now
        rate = self.rate(done, now)
        eta = (self.total - done) / rate if rate > 0 else float("nan")
        pct = 100.0 * done / self.total if self.total else 100.0
        eta_s = "?" if eta != eta else time.strftime("%H:%M:%S", time.gmtime(eta))
        if self.tty:
            bar = "#" * int(pct / 100 * 30)
            self.stream.write(
                f"\r[{bar:<30}] {pct:5.1f}% {done}/{self.total} {rate:7.1f} texts/s ETA {eta_s}"
            )
        else:
            self.stream.write(
                f"ringserve batch: {done}/{self.total} lines ({pct:.1f}%), "
                f"{rate:.1f} texts/s, ETA {eta_s}\n"
            )
        self.stream.flush()

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\n")


class BatchJob:
    def __init__(self, args: argparse.Namespace, settings: Config) -> None:

        self.args = args
        self.settings = settings
        self.log = EventLog(settings.log_level)
        self.model_dir = batch_model_dir(settings)
        self.manifest = load_manifest(self.model_dir)
        self.device = resolve_device(settings.device, self.log)
        # --precision as serve resolves it: auto from the artifact's published costs and this
        # CPU's flags, a precision the CPU cannot run refused; the workers read the result.
        self.chosen_by = pick_precision(
            settings, self.manifest, self.device != "cpu", self.log, None
        )
        self.source = C.open_texts(args.input)
        self.n = len(self.source)
        st = os.stat(args.input)
        meta = {
            "input": os.path.abspath(args.input),
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "lines": self.n,
            "fingerprint": self.manifest.fingerprint,
            "task": args.task,
            "precision": settings.precision,  # a resumed run keeps the precision it began with
        }
        m = self.manifest
        if args.task not in m.task:
            raise ValueError(f"the model does not {args.task}; its tasks: {', '.join(m.task)}")
        embed = (m.dimension, m.normalize) if args.task == "embed" else None
        # An embedding asks its worker for the vector (shm/layout.py OPT_EMBED), an embed
        # model's default prompt (service/request/prompts.py) before each text.
        self.prefix = prompts.prompt_bytes(m) if embed else b""
        self.options = L.OPT_EMBED if embed else 0
        self.results = Results(Path(args.output), self.n, list(m.labels), meta, args.resume, embed)
        # Eight batches a worker: a group's answers come from both workers, so with only two
        # the workers starved between refills (measured: 181 against 393 texts/s on ONNX).
        self.window = max(GROUP, settings.serving_workers() * settings.batch_rows(self.device) * 8)
        self.dispatcher = Dispatcher(self.window + GROUP)
        self.supervisor = Supervisor(
            settings, self.dispatcher, self.model_dir, self.device, self.log
        )
        self.max_text = max(settings.max_body, settings.max_frame)
        self.inflight = 0
        self.done = 0  # lines finished in this run
        self.stopping = False
        self.wake = asyncio.Event()

    def order(self) -> np.ndarray:
        """Lines still to score, longest first over the whole file (by bytes: no tokenizing)."""
        status = self.results.status
        todo = np.flatnonzero(status[self.results.written :] == PENDING) + self.results.written
        lengths = self.source.byte_lengths()[todo]
        return todo[np.argsort(-lengths, kind="stable")]

    def feed(self, rows: np.ndarray) -> None:
        """Admit one group: bad lines are finished at once, the rest go to the dispatcher."""
        keep: list[int] = []
        texts: list[bytes] = []
        status = self.results.status
        for i in rows.tolist():
            code, text, pair = self.source.record(i)
            if code == C.OK and pair is not None:
                text = text + L.PAIR_SEPARATOR + pair  # as /v1 sends a pair (shm/layout.py)
            if code == C.OK and len(text) > self.max_text:
                code = TOO_LONG
            if code != C.OK:
                status[i] = 10 + code
                self.done += 1
                continue
            keep.append(i)
            texts.append(self.prefix + text if self.prefix else text)
        if texts:
            done = self.on_done(keep)
            if not self.dispatcher.submit(texts, 0, done, "batch", options=self.options):
                raise RuntimeError("dispatcher refused a group inside the window")
            self.inflight += len(texts)

    def on_done(self, rows: list[int]) -> Callable[[list[Result]], None]:
        def done(results: list[Result]) -> None:
            self.results.store(rows, results)
            self.inflight -= len(rows)
            self.done += len(rows)
            self.wake.set()

        return done

    def stop(self, signame: str) -> None:
        if not self.stopping:
            self.log.warning("batch_stopping", signal=signame)
        self.stopping = True
        self.wake.set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop, signal.Signals(sig).name)
        sup_task = asyncio.create_task(self.supervisor.run())
        order = self.order()
        total_done = self.n - len(order)
        progress = Progress(self.n, total_done, sys.stderr, self.args.progress_every_s)
        pos = 0
        try:
            while (pos < len(order) and not self.stopping) or self.inflight:
                while self.inflight < self.window and pos < len(order) and not self.stopping:
                    self.feed(order[pos : pos + GROUP])
                    pos += GROUP
                    if pos % RELEASE_EVERY < GROUP:  # lines are read out of order: give back
                        self.source.release()  # their pages, or RSS grows to the file's size
                if self.supervisor.fatal:
                    raise SystemExit(f"ringserve batch: {self.supervisor.fatal}")
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    wait_s = 0.5 if progress.first_at else 0.05  # see the pool's start closely
                    await asyncio.wait_for(
                        self.wake.wait(), STOP_WAIT_S if self.stopping else wait_s
                    )
                if self.stopping and self.wake.is_set() is False and self.inflight:
                    break  # answers stopped coming: give up on them, they stay pending
                self.results.write_ready()
                if len(self.dispatcher.serving) >= self.supervisor.target:
                    progress.started()
                progress.update(total_done + self.done)
        finally:
            self.results.write_ready()
            progress.update(total_done + self.done, force=True)
            rate = progress.rate(total_done + self.done, time.monotonic())  # before the stop
            progress.finish()
            await self.supervisor.stop()
            sup_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sup_task
        return self.report(progress, total_done + self.done, rate)

    def report(self, progress: Progress, done: int, rate: float) -> int:
        """The summary line (stderr); `done` counts the lines a --resume found finished."""
        finished = self.results.written == self.n
        bad = self.results.errors() if self.results.npy else 0
        self.results.close(finished)
        if not self.results.npy:  # counted from the output, which is the truth a user sees
            with open(self.args.output, "rb") as f:
                for line in f:
                    bad += line.startswith(b'{"error"')
        summary = {
            "lines": self.n,
            "scored": done,  # finished lines, in the output or kept for --resume
            "resumed": progress.start_done,  # of them, finished before this run began
            "written": self.results.written,
            "errors": bad,
            "precision": self.settings.precision,  # the one that scored every line
            "texts_per_s": round(rate, 1),
            "seconds": round(time.monotonic() - progress.t0, 2),
            "front_end_max_rss_mib": round(_max_rss_mib(), 1),
            "front_end_cpu_s": round(_cpu_s(), 2),
        }
        print(json.dumps(summary), file=sys.stderr)
        if finished:
            return 0
        print(
            f"ringserve batch: stopped; {self.results.written} of {self.n} lines are "
            f"{'done (the .npy is written at the end)' if self.results.npy else 'in'} "
            f"{self.args.output}; run again with --resume to continue",
            file=sys.stderr,
        )
        return 130


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _max_rss_mib() -> float:
    """This process's peak RSS (VmHWM). Not ru_maxrss: Linux carries that over from the parent
    across fork and exec, so a big parent (a benchmark holding torch) would show as ours."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def batch_model_dir(settings: Config) -> str:
    """The artifact a batch run scores with: --model's directory (default: the built-in model),
    or with --model-repository the highest version of the model --model names (it may be left
    out when the repository holds one model). Raises ValueError naming what is wrong."""
    if not settings.model_repository:
        return settings.model or str(default_in_child(settings.cache_dir))
    try:
        found = scan_repository(settings.model_repository)
    except ArtifactError as exc:
        raise ValueError(str(exc)) from None
    name = settings.model
    if name is None and len(found) == 1:
        name = next(iter(found))
    if name is None or name not in found:
        names = ", ".join(found) or "none"
        said = f"no model {name!r} in" if name else "name a model (--model NAME) of"
        raise ValueError(f"{said} the repository {settings.model_repository} (it holds: {names})")
    picked = found[name].pick()
    if picked is None:
        raise ValueError(found[name].problem)
    return picked[1]


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, Config]:
    p = argparse.ArgumentParser(prog="ringserve batch", description=__doc__.splitlines()[0])
    p.add_argument("--input", required=True, help=".txt, .tsv (first column), .jsonl or corpus")
    p.add_argument("--output", required=True, help="JSONL: one result per input line, in order")
    p.add_argument(
        "--model", default=os.environ.get("RINGSERVE_MODEL"),
        help="artifact directory, or with --model-repository a model's NAME (its highest version)",
    )  # fmt: skip
    p.add_argument(
        "--model-repository", default=os.environ.get("RINGSERVE_MODEL_REPOSITORY"),
        help="a model repository, as for serve (--model names one of its models)",
    )  # fmt: skip
    p.add_argument(
        "--task", choices=("classify", "embed"), default="classify",
        help="classify: labels and scores; embed: {\"embedding\": [...]} a line",
    )  # fmt: skip
    p.add_argument("--workers", type=int, default=None, help="worker processes (one per core)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--device", default="auto")
    p.add_argument("--runtime", default="auto", help="auto, torch or onnx, as for serve")
    opt = BY_NAME["precision"]
    p.add_argument(
        "--precision", type=opt.type, default=os.environ.get(opt.env, opt.default),
        help=f"as for serve: fp32, int8, bf16 or auto [env {opt.env}, default {opt.shown}]",
    )  # fmt: skip
    p.add_argument("--max-batch", type=int, default=None, help="rows a batch (serve's default)")
    p.add_argument("--max-batch-tokens", type=int, default=None, help="padded tokens a batch")
    for name in ("long-text", "window-stride", "max-windows"):  # as serve names them
        opt = BY_NAME[name]
        p.add_argument(
            "--" + name, type=opt.type, default=os.environ.get(opt.env, opt.default),
            help=f"{opt.help} [env {opt.env}, default {opt.shown}]",
        )  # fmt: skip
    p.add_argument("--resume", action="store_true", help="continue a stopped run's output")
    p.add_argument("--progress-every-s", type=float, default=5.0, help="log line interval")
    p.add_argument("--log-level", default="warning")
    args = p.parse_args(argv)
    settings = Config(
        model=args.model,
        model_repository=args.model_repository,
        workers=args.workers,
        threads=args.threads,
        device=args.device,
        runtime=args.runtime,
        precision=BY_NAME["precision"].type(args.precision),  # an environment default is text
        spares=0,  # a batch run has no clients to keep waiting: a replacement may boot cold
        max_batch=args.max_batch,
        max_batch_tokens=args.max_batch_tokens,
        long_text=BY_NAME["long-text"].type(args.long_text),  # an environment default is text
        window_stride=int(args.window_stride),
        max_windows=int(args.max_windows),
        log_level=args.log_level,
    )
    return args, settings


def main(argv: list[str]) -> int:
    import uvloop

    args, settings = parse_args(argv)
    if not os.path.exists(args.input):
        print(f"ringserve batch: no such input: {args.input}", file=sys.stderr)
        return 2
    segment.remove_stale(keep_pid=os.getpid())
    try:
        job = BatchJob(args, settings)
    except (OSError, ValueError) as exc:
        print(f"ringserve batch: {exc}", file=sys.stderr)
        return 2
    return uvloop.run(job.run())
