"""Every limit and tunable of the server, named once, with its default and its reason.

The CLI builds its options from SETTINGS, the environment overrides defaults through
RINGSERVE_<NAME>, and the README's option table is generated from the same list.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def default_workers() -> int:
    # One single-threaded worker per core: two 1-thread workers matched one 2-thread worker's
    # throughput here with far steadier latency (DESIGN.md), and survive a busy front-end core.
    return max(1, _cpu_count())


def parse_buckets(text: str) -> tuple[int, ...]:
    """A comma list of token lengths; empty means the device's default (CONTRACT.md)."""
    values = sorted({int(v) for v in str(text).split(",") if v.strip()})
    if not values:
        return ()
    if values[0] <= 2:
        raise ValueError(f"buckets must be token lengths above 2, got {text!r}")
    return tuple(values)


def parse_precision(text: str) -> str:
    value = str(text).strip().lower()
    if value not in ("fp32", "fp16", "bf16"):
        raise ValueError(f"precision must be fp32, fp16 or bf16, got {text!r}")
    return value


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    help: str
    type: Callable[[str], Any] = str

    @property
    def env(self) -> str:
        return "RINGSERVE_" + self.name.upper().replace("-", "_")

    @property
    def attr(self) -> str:
        return self.name.replace("-", "_")


SETTINGS: tuple[Setting, ...] = (
    Setting("model", None, "model artifact directory (default: the built-in default model)"),
    Setting("host", "127.0.0.1", "bind address for the HTTP and binary ports"),
    Setting("port", 8000, "HTTP port", int),
    Setting("binary-port", 8001, "framed binary TCP port (0 = off)", int),
    Setting(
        "api-key",
        None,
        "when set, every request but the health probes needs `Authorization: Bearer KEY`, and a "
        "binary connection's first frame must be `AUTH KEY` (give it by the environment: "
        "`ps` shows the command line)",
    ),
    Setting(
        "operator-port",
        0,
        "serve /metrics, /v1/stats and /dashboard on this port, without the key, and not on "
        "the HTTP port (0 = on the HTTP port)",
        int,
    ),
    Setting("operator-host", None, "bind address of the operator port (default: --host)"),
    Setting("control", "./ringserve.sock", "Unix control socket path (mode 0600)"),
    Setting("workers", None, "serving worker processes (default: one per core)", int),
    Setting("threads", 1, "torch threads per worker (1 measured steadiest, DESIGN.md)", int),
    Setting("device", "auto", "cpu, cuda, cuda:K or auto (CUDA when available)"),
    Setting("workers-per-gpu", 1, "serving workers per GPU when the device is CUDA", int),
    Setting(
        "precision",
        "fp32",
        "CUDA compute precision: fp32, fp16 or bf16 (autocast; the guarantee of equal scores "
        "is for fp32, benchmarks/gpu_check.py measures the others' cost); ignored on the CPU",
        parse_precision,
    ),
    Setting("spares", 1, "warm spare workers beside the serving ones", int),
    Setting("max-batch", 32, "largest batch a worker runs at once (rows)", int),
    # Measured by benchmarks/serving.py (README): 2 x 1-thread workers, MiniLM, best budget
    # for both short and long texts; smaller budgets keep a batch's activations in cache.
    Setting(
        "max-batch-tokens",
        512,
        "CPU: most padded tokens in one batch (rows x the batch's padded length)",
        int,
    ),
    # 0: a batch forms from what queued while the previous one ran; waiting only adds latency
    # (a forward is 17-450 ms here, far longer than any useful fill delay).
    Setting("max-delay-ms", 0.0, "longest a worker waits to fill a batch", float),
    Setting(
        "buckets",
        "",
        "sequence lengths batches are padded up to; default CPU: none (each batch padded to "
        "its own longest text), CUDA: 16,32,48,64,96,128,192,256 (the captured graph shapes)",
        parse_buckets,
    ),
    Setting("max-queue", 1024, "requests admitted and not yet answered, all protocols", int),
    Setting("max-body", 1048576, "largest HTTP body in bytes (413 above)", int),
    Setting("max-head", 8192, "largest HTTP request head in bytes (431 above)", int),
    Setting("max-texts", 256, "most texts in one batch request", int),
    Setting("max-frame", 65536, "largest binary-protocol text in bytes", int),
    Setting("max-control-line", 65536, "longest control-socket line in bytes", int),
    Setting("max-connections", 1024, "open client connections before new ones are refused", int),
    Setting("read-timeout-s", 10.0, "longest wait for the rest of a request head or body", float),
    Setting("keepalive-timeout-s", 60.0, "idle keep-alive connection lifetime", float),
    Setting(
        "write-timeout-s",
        30.0,
        "longest a client may leave its answers unread (writes paused) before it is dropped",
        float,
    ),
    Setting("request-timeout-s", 30.0, "deadline of a request that sets none", float),
    Setting("drain-timeout-s", 30.0, "longest drain on SIGTERM before workers are stopped", float),
    Setting("heartbeat-timeout-s", 5.0, "heartbeat age that marks a worker hung", float),
    Setting("worker-max-rss", 0, "RSS bytes past which a worker is recycled (0 = off)", int),
    Setting("ring-slots", 4096, "slots per request ring (power of two)", int),
    Setting("cache-dir", None, "where the default model artifact is built and kept"),
    Setting("log-level", "info", "debug, info, warning or error"),
    Setting("access-log", 0, "1 to log every request as a JSON line", int),
    Setting("metrics", 1, "0 turns metric collection off (for overhead measurement)", int),
    Setting("binary-max-owed", 256, "answers a binary connection owes before it pauses", int),
    Setting("binary-group", 32, "most binary frames admitted (and answered) as one group", int),
    Setting("binary-linger-s", 2.0, "oversize frame: drop input this long, then close", float),
)

BY_NAME = {s.name: s for s in SETTINGS}


@dataclass
class Config:
    """The resolved settings of one server; picklable, handed to workers as needed."""

    model: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    binary_port: int = 8001
    api_key: str | None = field(default=None, repr=False)  # never printed (service.auth)
    operator_port: int = 0
    operator_host: str | None = None
    control: str = "./ringserve.sock"
    workers: int | None = None
    threads: int = 1
    device: str = "auto"
    workers_per_gpu: int = 1
    precision: str = "fp32"
    spares: int = 1
    max_batch: int = 32
    max_delay_ms: float = 0.0
    max_batch_tokens: int = 512
    buckets: tuple[int, ...] = ()
    max_queue: int = 1024
    max_body: int = 1048576
    max_head: int = 8192
    max_texts: int = 256
    max_frame: int = 65536
    max_control_line: int = 65536
    max_connections: int = 1024
    read_timeout_s: float = 10.0
    keepalive_timeout_s: float = 60.0
    write_timeout_s: float = 30.0
    request_timeout_s: float = 30.0
    drain_timeout_s: float = 30.0
    heartbeat_timeout_s: float = 5.0
    worker_max_rss: int = 0
    ring_slots: int = 4096
    cache_dir: str | None = None
    log_level: str = "info"
    access_log: int = 0
    metrics: int = 1
    binary_max_owed: int = 256
    binary_group: int = 32
    binary_linger_s: float = 2.0
    extra: dict[str, Any] = field(default_factory=dict)

    def serving_workers(self) -> int:
        return self.workers if self.workers is not None else default_workers()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for s in SETTINGS:
        default = os.environ.get(s.env, s.default)
        parser.add_argument(
            "--" + s.name,
            dest=s.attr,
            default=default,
            type=s.type,
            help=f"{s.help} [env {s.env}, default {s.default}]",
        )


def from_namespace(ns: argparse.Namespace) -> Config:
    values: dict[str, Any] = {}
    for s in SETTINGS:
        value = getattr(ns, s.attr)
        if isinstance(value, str) and s.type is not str:
            value = s.type(value)  # a default taken from the environment arrives as text
        values[s.attr] = value
    known = {f.name for f in fields(Config)}
    return Config(**{k: v for k, v in values.items() if k in known})


def markdown_table() -> str:
    rows = ["| option | env | default | meaning |", "| --- | --- | --- | --- |"]
    for s in SETTINGS:
        rows.append(f"| `--{s.name}` | `{s.env}` | `{s.default}` | {s.help} |")
    return "\n".join(rows)


if __name__ == "__main__":  # `python -m service.settings` prints the README's option table
    print(markdown_table())
