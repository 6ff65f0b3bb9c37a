"""Every limit and tunable of the server, named once, with its default and its reason.

Config declares each one; SETTINGS is read from it. The CLI builds its options from SETTINGS,
the environment overrides defaults through RINGSERVE_<NAME>, and the README's option table is
generated from the same list.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar, cast

T = TypeVar("T")


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def _cgroup_quota(root: str, path: str) -> float | None:
    """CPUs allowed by a cgroup's quota: v2 `cpu.max` ("max 100000" or "200000 100000") or v1
    `cpu.cfs_quota_us` over `cpu.cfs_period_us` (-1: none); None when unlimited or unknown."""
    here = os.path.join(root, path.lstrip("/"))
    try:
        with open(os.path.join(here, "cpu.max")) as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(here, "cpu.cfs_quota_us")) as f:
            quota_us = int(f.read())
        with open(os.path.join(here, "cpu.cfs_period_us")) as f:
            period_us = int(f.read())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def cgroup_cpu_limit(root: str = "/sys/fs/cgroup", proc: str = "/proc/self/cgroup") -> float | None:
    """The tightest CPU quota on this process's cgroup (a container's CPU limit), or None.
    Read at the cgroup named in /proc/self/cgroup, and at the root, which is the container's own
    under a cgroup namespace."""
    places: list[tuple[str, str]] = [(root, "/"), (os.path.join(root, "cpu"), "/")]
    try:
        with open(proc) as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers == "":  # cgroup v2
                    places.insert(0, (root, path))
                elif "cpu" in controllers.split(","):
                    places.insert(0, (os.path.join(root, controllers), path))
    except (OSError, ValueError):
        pass
    limits = [q for r, p in places if (q := _cgroup_quota(r, p)) is not None]
    return min(limits) if limits else None


def default_workers() -> int:
    # One single-threaded worker per core: two 1-thread workers matched one 2-thread worker's
    # throughput here with far steadier latency (docs/design.md), and survive a busy front-end core.
    # A container's CPU limit (cgroup quota) caps it: the node's cores are not ours to use, and
    # a worker per node core under a 2-CPU limit is throttled to a crawl.
    cores = _cpu_count()
    limit = cgroup_cpu_limit()
    if limit is not None:
        cores = min(cores, int(limit))
    return max(1, cores)


def parse_buckets(text: str) -> tuple[int, ...]:
    """A comma list of token lengths; empty means the device's default (CONTRACT.md)."""
    values = sorted({int(v) for v in str(text).split(",") if v.strip()})
    if not values:
        return ()
    if values[0] <= 2:
        raise ValueError(f"buckets must be token lengths above 2, got {text!r}")
    return tuple(values)


def parse_flag(text: str) -> bool:
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected 1 or 0, got {text!r}")


def one_of(what: str, *choices: str, said: str = "") -> Callable[[str], str]:
    """A parser that takes one of `choices` (any case, spaces around), named for argparse."""
    said = said or ", ".join(choices[:-1]) + f" or {choices[-1]}"

    def parse(text: str) -> str:
        value = str(text).strip().lower()
        if value not in choices:
            raise ValueError(f"{what} must be {said}, got {text!r}")
        return value

    parse.__name__ = parse.__qualname__ = "parse_" + what.replace("-", "_").replace(" ", "_")
    return parse


_start_method = one_of("start method", "zygote", "fork", "spawn")


def parse_start_method(text: str) -> str:
    value = _start_method(text)
    return "zygote" if value == "fork" else value


parse_precision = one_of(
    "precision", "fp32", "fp16", "bf16", "int8", "int8-checked", "auto",
    said="fp32, int8 or int8-checked (CPU), bf16 (CPU with bf16, or CUDA), fp16 (CUDA), or auto",
)  # fmt: skip
parse_runtime = one_of("runtime", "auto", "torch", "onnx", "openvino")
parse_graph = one_of("graph", "auto", "plain", "fused")
parse_long_text = one_of("long-text", "truncate", "refuse", "window")
parse_model_control = one_of("model-control", "none", "explicit")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


parse_priority = one_of("priority", "interactive", "bulk")


def parse_max_length(text: str) -> int:
    """A [models.NAME] table's max_length: tokens, at least 3 (as an artifact's)."""
    value = int(text)
    if value < 3:
        raise ValueError(f"max-length must be at least 3, got {text!r}")
    return value


def parse_version(text: str) -> int | str:
    """A [models.NAME] table's version: `latest` (the highest) or a version number above 0."""
    value = str(text).strip().lower()
    if value == "latest":
        return value
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"version must be latest or a number above 0, got {text!r}")
    return int(value)


@dataclass(frozen=True)
class ModelSetting:
    """One key of a config file's [models.NAME] table. `served`: honoured per model today (the
    rest are refused by name, so a file never seems to set what the server ignores)."""

    name: str
    help: str
    parse: Callable[[str], Any] = str
    served: bool = True

    @property
    def attr(self) -> str:
        return self.name.replace("-", "_")


MODEL_SETTINGS: tuple[ModelSetting, ...] = (
    ModelSetting("path", "the model's artifact directory, or a directory of numbered versions "
                 "(required)"),
    ModelSetting("version", "the version served from a directory of numbered versions: latest "
                 "(the highest; default) or a number", parse_version),
    ModelSetting("runtime", "as --runtime, for this model alone", parse_runtime),
    ModelSetting("precision", "as --precision, for this model alone", parse_precision),
    ModelSetting("long-text", "as --long-text, for this model alone", parse_long_text),
    ModelSetting("max-batch", "as --max-batch, for this model alone", int),
    ModelSetting("max-delay-ms", "as --max-delay-ms, for this model alone", float),
    ModelSetting("max-length", "the tokens a text is served at, below the artifact's own "
                 "max_length (never above it); a longer text is cut, refused or windowed as "
                 "long-text says, as past the artifact's own", parse_max_length),
    ModelSetting("prompt-name", "the prompt a request that names none gets, in place of the "
                 "artifact's default_prompt_name (one of the model's prompts)"),
    ModelSetting("priority", "interactive (the default) or bulk: the level the model's texts "
                 "are batched at; a key or a request may lower it, never raise it", parse_priority),
)  # fmt: skip
# The per-model settings a worker and the front-end read from the model's own Config.
PER_MODEL_SERVED = frozenset(("runtime", "precision", "long_text", "max_batch", "max_delay_ms"))
# The per-model settings that change the model's manifest as it serves (workers.artifact
# as_served): the front-end's view of it, and (max_length) the worker's too.
PER_MODEL_MANIFEST = frozenset(("max_length", "prompt_name"))


class ModelTableError(ValueError):
    """A [models.NAME] table's setting its model cannot serve (a prompt it lacks, a max_length
    over its artifact's), named as a config file refusal is: `FILE:LINE: key models.NAME.KEY:
    why` (`where` is "" when the line is not known). At start the server exits 2 with it."""

    def __init__(self, name: str, attr: str, why: str, where: str = "") -> None:
        key = f"models.{name}.{attr.replace('_', '-')}"
        super().__init__(f"{where}: key {key}: {why}" if where else f"key {key}: {why}")


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: str) -> int:
    """A byte count: digits, optionally with K, M, G or T (powers of 1024; `KiB`, `GB` too)."""
    found = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)(?:i?b)?\s*", str(text).lower())
    if found is None:
        raise ValueError(f"expected a byte count such as 8589934592 or 8G, got {text!r}")
    return int(found.group(1)) * _UNITS[found.group(2)]


def split_models(
    values: list[str] | tuple[str, ...], repository: str | None = None
) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    """--model values: at most one bare DIR (the model of a one-model server, as before) and any
    number of NAME=DIR (a NAME is letters, digits, `_.-`; a path with `/` before its `=` is a
    bare DIR). With a repository, a bare NAME of one of its models (and no directory of that
    name here) is that model: --model-control explicit starts with it. Returns (bare DIR or
    None, ((NAME, DIR), ...)); a repeated NAME is refused."""
    bare: str | None = None
    named: list[tuple[str, str]] = []
    for value in values:
        name, eq, where = str(value).partition("=")
        in_repo = repository is not None and _NAME.fullmatch(value) and not os.path.isdir(value)
        if in_repo and os.path.isdir(os.path.join(str(repository), value)):
            name, eq, where = value, "=", os.path.join(str(repository), value)
        if eq and _NAME.fullmatch(name) and where:
            if any(n == name for n, _ in named):
                raise ValueError(f"--model {name}= is given twice")
            named.append((name, where))
        elif bare is not None:
            raise ValueError(f"--model {value}: only one model may be unnamed (use NAME=DIR)")
        else:
            bare = str(value)
    return bare, tuple(named)


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def cgroup_memory_limit(
    root: str = "/sys/fs/cgroup", proc: str = "/proc/self/cgroup"
) -> int | None:
    """The tightest memory limit on this process's cgroup: v2 `memory.max` or v1
    `memory.limit_in_bytes` (a huge v1 value means none); None when unlimited or unknown."""
    places = [
        os.path.join(root, "memory.max"),
        os.path.join(root, "memory", "memory.limit_in_bytes"),
    ]
    try:
        with open(proc) as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers == "":
                    places.insert(0, os.path.join(root, path.lstrip("/"), "memory.max"))
                elif "memory" in controllers.split(","):
                    here = os.path.join(root, controllers, path.lstrip("/"))
                    places.insert(0, os.path.join(here, "memory.limit_in_bytes"))
    except (OSError, ValueError):
        pass
    limits = [v for p in places if (v := _read_int(p)) is not None and v < 1 << 60]
    return min(limits) if limits else None


def mem_available(meminfo: str = "/proc/meminfo") -> int | None:
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def default_memory_budget() -> int:
    """--memory-budget when not given, read once at start, before any worker: the cgroup's limit
    when one is set (the OOM killer acts at that line, whatever the host has free), else the
    host's MemAvailable (what can be used without swapping). Compared with what the server's
    processes hold, so it is the whole server's allowance."""
    limit = cgroup_memory_limit()
    if limit is not None:
        return limit
    return mem_available() or 1 << 62  # unknown: no refusal on memory grounds


# Batch limits per device. CPU: measured by benchmarks/serving.py (README), 2 x 1-thread
# workers, MiniLM; smaller token budgets keep a batch's activations in cache. GPU: not yet
# measured on one (benchmarks/gpu_check.py will); CPU-sized batches would leave a GPU mostly
# idle, and 16384 tokens (128 rows to 128 tokens, 64 rows at 256) keeps the graph pool small.
CPU_MAX_BATCH = 64  # benchmarks/serving.py, 2026-11-30: the fastest of 5 limits for the split
CPU_MAX_BATCH_TOKENS = 512
GPU_MAX_BATCH = 128
GPU_MAX_BATCH_TOKENS = 16384


@dataclass(frozen=True)
class Setting:
    """One option as the CLI, the environment and the README see it."""

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

    @property
    def kind(self) -> str:
        """Its value's type in a config file (toml_schema, config_file)."""
        return TOML_KINDS.get(self.type, "integer" if self.type is int else "string")

    @property
    def shown(self) -> str:
        """The default as a user would type it."""
        if isinstance(self.default, tuple):
            return ",".join(str(v) for v in self.default)
        return str(self.default)


def option(default: T, help: str, parse: Callable[[str], Any] = str, secret: bool = False) -> T:
    """A Config field that is also a command-line option: its default, help and parser; a
    secret one is left out of the Config's repr."""
    meta = {"help": help, "parse": parse}
    return cast(T, field(default=default, metadata=meta, repr=not secret))


@dataclass
class Config:
    """The resolved settings of one server, each declared once here with its default and its
    reason; picklable, handed to workers as needed. A field made with option() is an option."""

    # --model is repeatable: the one bare DIR lands here (a one-model server, as before), each
    # NAME=DIR in `named_models` (split_models).
    model: str | None = option(
        None,
        "model artifact directory (default: the built-in default model); repeatable as "
        "NAME=DIR, one more model served under NAME (a DIR of numbered versions: the highest)",
    )
    config: str | None = option(
        None,
        "a TOML file of settings: any option below by its name (dashes or underscores), and a "
        "[models.NAME] table per model (path and per-model settings; docs/api.md); flags and "
        "RINGSERVE_* variables override it; SIGHUP re-reads its model tables",
    )
    model_repository: str | None = option(
        None,
        "a directory whose every subdirectory NAME/ is a model: an artifact, or numbered "
        "versions NAME/1/, NAME/2/ (the highest serves unless a request names one)",
    )
    model_control: str = option(
        "none",
        "none: the models at start are the set; explicit: models load and unload on request "
        "(`ctl load|unload`, KServe's repository extension), starting with those --model names "
        "(none named: the built-in default)",
        parse_model_control,
    )
    memory_budget: int | None = option(
        None,
        "bytes the server's processes may hold; a load that would go past it is refused (409) "
        "(default: the cgroup's memory limit, else the host's MemAvailable at start)",
        parse_bytes,
    )
    model_name: str | None = option(
        None,
        "the name the model is served under (KServe paths, /v1/model; default: the artifact's); "
        "KServe's runtime passes its InferenceService's name",
    )
    host: str = option("127.0.0.1", "bind address for the HTTP, binary and gRPC ports")
    port: int = option(8000, "HTTP port", int)
    binary_port: int = option(8001, "framed binary TCP port (0 = off)", int)
    grpc_port: int = option(
        8002, "KServe v2 gRPC port (GRPCInferenceService, health, reflection; 0 = off)", int
    )
    api_key: str | None = option(
        None,
        "when set, every request but the health probes needs `Authorization: Bearer KEY`, and a "
        "binary connection's first frame must be `AUTH KEY` (give it by the environment: "
        "`ps` shows the command line)",
        secret=True,  # never printed (service.auth)
    )
    api_keys: str | None = option(
        None,
        "a key file: one key a line, `KEY tenant=NAME [rate=R] [burst=B] "
        "[priority=interactive|bulk]` (`#` comments); over its rate a key gets 429 (binary: "
        "status 6); re-read on SIGHUP and `ctl reload` (a bad line is refused with its number)",
    )
    otlp_endpoint: str | None = option(
        None,
        "export OpenTelemetry traces over OTLP/HTTP to this collector (`http://host:4318`; "
        "`/v1/traces` is added to a URL without a path); the standard OTEL_EXPORTER_OTLP_* and "
        "OTEL_TRACES_SAMPLER variables apply, and set alone they turn tracing on too",
    )
    operator_port: int = option(
        0,
        "serve /metrics, /v1/stats, /dashboard and /docs on this port, without the key, and "
        "not on "
        "the HTTP port (0 = on the HTTP port)",
        int,
    )
    operator_host: str | None = option(None, "bind address of the operator port (default: --host)")
    tls_cert: str | None = option(
        None,
        "a PEM certificate chain (the server's certificate first): with --tls-key, the HTTP, "
        "operator, binary and gRPC ports speak TLS only (gRPC with ALPN h2); a file that "
        "cannot be read, or does not match the key, stops the start (exit 2)",
    )
    tls_key: str | None = option(None, "the PEM private key of --tls-cert (unencrypted)")
    tls_client_ca: str | None = option(
        None,
        "PEM CA certificates: with --tls-cert, every port asks for a client certificate and "
        "completes the handshake only with one these CAs signed (mutual TLS)",
    )
    no_docs_page: bool = option(
        False,
        "do not serve /docs, the Swagger UI page for /openapi.json (served on the operator "
        "port when one is set, else on the HTTP port)",
        parse_flag,
    )
    control: str = option("./ringserve.sock", "Unix control socket path (mode 0600)")
    workers: int | None = option(
        None,
        "serving worker processes (default: one per core, at most the cgroup CPU limit; one "
        "per --lanes cores when a worker has several lanes)",
        int,
    )
    threads: int = option(1, "torch threads per worker (1 measured steadiest, docs/design.md)", int)
    lone_cores: bool = option(
        True,
        "a text alone (a batch of one while the worker's other lanes are idle) runs on all of "
        "the worker's cores (ONNX Runtime: a second session of that many threads; OpenVINO's "
        "one loop runs every batch so)",
        parse_flag,
    )
    lanes: int | None = option(
        None,
        "batches one CPU worker runs at once, each on its own core, sharing one ONNX Runtime "
        "session, taken from one batcher (default: 2 when the cores are even, one model is served "
        "on ONNX Runtime and --workers, --threads and --model-control are left alone; else 1)",
        int,
    )
    device: str = option("auto", "cpu, cuda, cuda:K or auto (CUDA when available)")
    workers_per_gpu: int = option(1, "serving workers per GPU when the device is CUDA", int)
    precision: str = option(
        "fp32",
        "CPU: fp32 or int8 (on ONNX Runtime, the recipe the artifact build chose by measuring "
        "agreement and speed; its accuracy cost is logged at start and in /v1/model), "
        "int8-checked (int8, and a text whose int8 margin is under the threshold the artifact "
        "build chose is scored again by fp32 in the same worker, which answers for it; each "
        "answer says which precision scored it), and bf16 "
        "on a CPU with avx512_bf16 or amx_bf16 (on OpenVINO; its cost is published as int8's); "
        "CUDA: fp32, fp16 or bf16 (autocast; benchmarks/gpu_check.py measures their cost); auto: "
        "the fastest of int8, int8-checked and bf16 whose published cost is within 0.5 point of "
        "accuracy and 0.99 agreement (embeddings: mean cosine 0.999) and that is faster, else "
        "fp32 (the choice and why: log, /v1/model). "
        "Equal scores (1e-5) are promised for fp32",
        parse_precision,
    )
    runtime: str = option(
        "auto",
        "torch (TorchScript), onnx (ONNX Runtime, CPU) or openvino (OpenVINO, CPU: fp32 or "
        "bf16); auto: onnx on the CPU when the artifact has model.onnx (measured 2-2.8x faster, "
        "README), openvino for bf16 on the CPU, torch on CUDA",
        parse_runtime,
    )
    graph: str = option(
        "auto",
        "ONNX Runtime at fp32: plain (the export) or fused (ONNX Runtime's fused transformer "
        "graph, when the artifact has one); auto: both timed on this CPU at start, the faster "
        "serves (kept per artifact and CPU; logged and in /v1/model)",
        parse_graph,
    )
    spares: int = option(1, "warm spare workers beside the serving ones", int)
    start_method: str = option(
        "zygote",
        "zygote (or fork): fork workers from a spawned process that holds torch and the CPU "
        "weights (sub-second boots, shared weight pages); spawn: a fresh interpreter each",
        parse_start_method,
    )
    # None: chosen for the worker's device by batch_rows() and batch_tokens().
    max_batch: int | None = option(
        None, "largest batch a worker runs at once, in rows (default: 64 CPU, 128 GPU)", int
    )
    max_batch_tokens: int | None = option(
        None,
        "most padded tokens in one batch, rows x the batch's padded length (default: 512 CPU, "
        "16384 GPU)",
        int,
    )
    # 0: a batch forms from what queued while the previous one ran; waiting only adds latency
    # (a forward is 17-450 ms here, far longer than any useful fill delay).
    max_delay_ms: float = option(0.0, "longest a worker waits to fill a batch", float)
    buckets: tuple[int, ...] = option(
        (),
        "sequence lengths batches are padded up to; default CPU: none (each batch padded to "
        "its own longest text), CUDA: 16,32,48,64,96,128,192,256 (the captured graph shapes)",
        parse_buckets,
    )
    long_text: str = option(
        "truncate",
        "what a text over the model's max_length gets when its request does not choose "
        "(`truncate`): truncate (cut, keeping the start), refuse (413) or window (scored in "
        "overlapping windows of max_length tokens, their scores combined)",
        parse_long_text,
    )
    # 32 of 256 tokens: each window sees its neighbour's last eighth, so a sentence cut by one
    # window's edge is read whole by the next, at 14% more rows than windows without overlap.
    window_stride: int = option(
        32, "tokens shared by consecutive windows (below max_length less the special tokens)", int
    )
    # 16 windows of 256 tokens cover 3,584 tokens (254 + 15 x 222): a bound on the work
    # one request can ask of a worker, as --max-texts bounds a batch request's.
    max_windows: int = option(16, "most windows one text is split into (413 beyond)", int)
    max_queue: int = option(
        1024, "texts admitted and not yet answered, all protocols: the hard ceiling", int
    )
    # 1 s: a client's own retry (Retry-After: 1) is sooner than a longer wait would answer.
    # The standing queue's delay settles near it plus CoDel's 100 ms interval (engine/bounds.py),
    # so accepted requests wait about that long under overload (benchmarks/shedding.py).
    max_queue_ms: float = option(
        1000.0,
        "the target delay of a standing queue: refuse (503) new work once the oldest waiting "
        "text has waited longer than this for a sustained interval, measured (0 = count only)",
        float,
    )
    # 2 s: twice --max-queue-ms, so a bulk text admitted into a full queue of bulk work still
    # leaves interactive texts first for as long as that queue takes to run (benchmarks/tenants.py).
    bulk_max_wait_ms: float = option(
        2000.0,
        "longest a bulk text waits in the front-end's queue behind interactive texts; past it, "
        "it goes before them (so bulk is never starved)",
        float,
    )
    worker_hold_batches: int = option(
        2,
        "batches of work (--max-batch-tokens each) a worker holds at once; the rest waits in "
        "the front-end, where deadlines, admission and every worker see it",
        int,
    )
    cache_bytes: int = option(
        64 << 20,
        "bytes of embeddings kept in the front-end's answer cache, least recently used out "
        "first; 0 = off. 64 MiB holds about 9,000 texts of a 384-float model answered in JSON "
        "floats (7.2 KB an entry: the vector, 2.1 KB with its text, and the JSON a hit is "
        "written from), a RAG corpus's repeated chunks and queries, at about half of one "
        "worker's memory",
        int,
    )
    max_body: int = option(1048576, "largest HTTP body in bytes (413 above)", int)
    max_head: int = option(8192, "largest HTTP request head in bytes (431 above)", int)
    max_texts: int = option(256, "most texts in one batch request", int)
    max_documents: int = option(1024, "most documents in one rerank request", int)
    max_frame: int = option(65536, "largest binary-protocol text in bytes", int)
    max_control_line: int = option(65536, "longest control-socket line in bytes", int)
    max_connections: int = option(
        1024,
        "open client connections a port holds (HTTP, operator, binary, gRPC); at the cap, on "
        "HTTP and binary a client address holding fewer than the busiest gets in by closing "
        "that one's longest-idle connection, else (and on gRPC) the new connection is refused",
        int,
    )
    # A quarter: four clients fill the queue between them; the ceiling (--max-queue) and the
    # standing test still bound the whole, and a client alone may fill it all.
    client_queue_share: float = option(
        0.25,
        "share of --max-queue one connection's texts may hold while other clients' texts are "
        "in flight (past it: HTTP 503, binary status 2); alone it may fill the queue (0 = off)",
        float,
    )
    allowed_hosts: str | None = option(
        None,
        "comma-separated host names (or IP addresses) a request's Host header may name, `*` for "
        "any; a request naming another is answered 400, and one with an Origin of another site "
        "and no key 403 (default: localhost, *.localhost and loopback addresses when the "
        "port is bound to loopback, else any)",
    )
    # 20 in a minute: a person mistyping a key never meets it; a guesser gets 1 try in 3 s.
    auth_failures: int = option(
        20,
        "failed API key attempts one client address may make within --auth-window-s; "
        "past them its requests are answered 429 (binary: closed) without a key check, with "
        "Retry-After, as the window refills (0 = off)",
        int,
    )
    auth_window_s: float = option(
        60.0, "the window --auth-failures counts in (refilled evenly across it)", float
    )
    read_timeout_s: float = option(
        10.0,
        "longest wait for the rest of a request head or body (gRPC: a connection's preface, a "
        "call's request message once begun)",
        float,
    )
    keepalive_timeout_s: float = option(60.0, "idle keep-alive connection lifetime", float)
    # 300 s: a gRPC channel is kept between calls by design, and grpc's clients reconnect
    # after the GOAWAY for their next call; an idle one still frees its --max-connections slot.
    grpc_idle_timeout_s: float = option(
        300.0, "a gRPC connection with no call open this long gets GOAWAY and is closed", float
    )
    # 8 MiB: room for several largest messages at once (2 x --max-body + 1 KiB each), and a
    # bound one connection's memory stays under whatever it sends or leaves unread.
    grpc_buffer: int = option(
        8 << 20,
        "bytes one gRPC connection may hold of request messages not yet consumed (its receive "
        "window, refilled only as they are) and, apart, of answers its client has not read; "
        "past either the call ends RESOURCE_EXHAUSTED (at least one largest message)",
        int,
    )
    write_timeout_s: float = option(
        30.0,
        "longest a client may leave its answers unread (writes paused) before it is dropped",
        float,
    )
    request_timeout_s: float = option(30.0, "deadline of a request that sets none", float)
    drain_timeout_s: float = option(
        30.0, "longest drain on SIGTERM before workers are stopped", float
    )
    shutdown_delay_s: float = option(
        0.0,
        "on SIGTERM, answer /v2/health/ready 503 this long while still serving, then drain "
        "(gives load balancers time to stop sending)",
        float,
    )
    reuse_port: bool = option(
        False,
        "bind with SO_REUSEPORT once a worker is ready, so a new server can take over the "
        "ports before the old one drains (zero-downtime upgrade)",
        parse_flag,
    )
    heartbeat_timeout_s: float = option(5.0, "heartbeat age that marks a worker hung", float)
    worker_max_rss: int = option(0, "RSS bytes past which a worker is recycled (0 = off)", int)
    ring_slots: int = option(4096, "slots per request ring (power of two)", int)
    cache_dir: str | None = option(None, "where the default model artifact is built and kept")
    log_level: str = option("info", "debug, info, warning or error")
    access_log: int = option(0, "1 to log every request as a JSON line", int)
    metrics: int = option(1, "0 turns metric collection off (for overhead measurement)", int)
    binary_max_owed: int = option(
        256, "answers a binary connection may owe while other clients' texts are in flight", int
    )
    binary_group: int = option(32, "most binary frames admitted (and answered) as one group", int)
    binary_linger_s: float = option(2.0, "oversize frame: drop input this long, then close", float)
    named_models: tuple[tuple[str, str], ...] = ()  # --model NAME=DIR, in order (split_models)
    # The config file's [models.NAME] tables: NAME -> {setting: value} (MODEL_SETTINGS).
    model_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    file_models: tuple[str, ...] = ()  # the models a config file's tables serve (SIGHUP's)
    # Where each table's setting is in the file: NAME -> {setting: "FILE:LINE"} (refusals).
    model_lines: dict[str, dict[str, str]] = field(default_factory=dict)

    def for_model(self, name: str | None) -> Config:
        """These settings as one model serves with them: its [models.NAME] table's per-model
        settings over the server's (this object itself when it has none)."""
        options = self.model_options.get(name or "", {})
        served = {k: v for k, v in options.items() if k in PER_MODEL_SERVED}
        return dataclasses.replace(self, **served) if served else self

    def model_version(self, name: str | None) -> int | None:
        """The version a [models.NAME] table pins (None: the highest)."""
        version = self.model_options.get(name or "", {}).get("version")
        return version if isinstance(version, int) else None

    def batch_rows(self, device: str) -> int:
        """--max-batch, or its default for the device ("cuda..." is a GPU; the test-only fake
        GPU is the CPU)."""
        if self.max_batch is not None:
            return self.max_batch
        return GPU_MAX_BATCH if device.startswith("cuda") else CPU_MAX_BATCH

    def batch_tokens(self, device: str) -> int:
        """--max-batch-tokens, or its default for the device."""
        if self.max_batch_tokens is not None:
            return self.max_batch_tokens
        return GPU_MAX_BATCH_TOKENS if device.startswith("cuda") else CPU_MAX_BATCH_TOKENS

    def hold_cost(self, device: str) -> int:
        """The most estimated tokens a worker holds at once (service.dispatcher): its batches
        in hand for each of its lanes."""
        return max(1, self.worker_hold_batches) * self.batch_tokens(device) * self.lane_count()

    def lane_count(self) -> int:
        """--lanes once resolved (resolve_lanes); 1 before, and for a caller that never does."""
        return max(1, self.lanes or 1)

    def serving_workers(self) -> int:
        if self.workers is not None:
            return self.workers
        return max(1, default_workers() // self.lane_count())

    def resolve_lanes(self, device: str, runtimes: list[str], cores: int | None = None) -> str:
        """Settle --lanes for a server of these models' runtimes on `device` with `cores` to use
        (default: default_workers()); returns why (logged). Raises ValueError when --lanes asks
        for what a lane cannot do.

        A lane is a thread of one worker process, pinned to its own core, running the whole
        serving loop on the one ONNX Runtime session the lanes share (on OpenVINO, one loop runs
        with OpenVINO's threads on the pair's cores instead): one copy of the weights, run
        on each calling thread, with buffers of its own; the lanes of a worker take their
        batches from one Batcher (workers/process/). Measured on 2 cores (docs/design.md, "A
        lane per core"): one worker of 2 lanes served 0.95-0.97 of the ceiling on short texts
        at c=32, against 0.81-0.84 for two workers of one, since both cores' texts wait in one
        pool and form fuller batches. The default pairs cores: one worker's lanes share its
        locks and the interpreter, so 2 is what was measured, and more would be a guess."""
        why = ""
        if device != "cpu":
            why = "the device is not the CPU"
        elif any(r not in ("onnx", "openvino") for r in runtimes):
            why = "the runtime is neither ONNX Runtime nor OpenVINO"
        elif len(runtimes) != 1 or self.model_control == "explicit" or self.file_models:
            why = "more than one model may be served"  # a config file's tables: by SIGHUP
        elif self.threads != 1:
            why = "--threads is not 1"
        if self.lanes is not None:
            if self.lanes < 1:
                raise ValueError("--lanes must be at least 1")
            if self.lanes > 1 and why:
                raise ValueError(f"--lanes {self.lanes} cannot be served: {why}")
            return "as --lanes asks"
        cores = default_workers() if cores is None else cores
        if not why and self.workers is not None:
            why = "--workers is given"
        if not why and (cores < 2 or cores % 2):
            why = f"{cores} cores do not pair"
        self.lanes = 1 if why else 2
        said = "OpenVINO" if runtimes == ["openvino"] else "ONNX Runtime"
        return why or f"{cores} cores, one model on {said}: a worker of 2 lanes per pair"


SETTINGS: tuple[Setting, ...] = tuple(
    Setting(f.name.replace("_", "-"), f.default, f.metadata["help"], f.metadata["parse"])
    for f in fields(Config)
    if "help" in f.metadata
)
BY_NAME = {s.name: s for s in SETTINGS}


def add_arguments(
    parser: argparse.ArgumentParser,
    from_file: dict[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Every setting as a flag; its default is its RINGSERVE_* variable's, else the config
    file's value (`from_file`, Config attr -> value, service/config/file.py), else its own."""
    env = os.environ if environ is None else environ
    from_file = from_file or {}
    for s in SETTINGS:
        default = env.get(s.env) or from_file.get(s.attr, s.default)
        if s.name == "model":  # repeatable; the environment may hold several, comma-separated
            if isinstance(default, list):  # the file's: a string or an array of them
                many = default
            else:
                many = [v for v in str(default).split(",") if v] if default is not None else []
            parser.add_argument(
                "--model", dest="model", action="append", default=None, type=str,
                help=f"{s.help} [env {s.env}, comma-separated, default built-in]",
            )  # fmt: skip
            parser.set_defaults(model_from_env=many)
            continue
        # A flag (`--reuse-port`) may stand alone or take a value (`--reuse-port 0`).
        flag: dict[str, Any] = {"nargs": "?", "const": True} if s.type is parse_flag else {}
        parser.add_argument(
            "--" + s.name,
            dest=s.attr,
            default=default,
            type=s.type,
            help=f"{s.help} [env {s.env}, default {s.shown}]",
            **flag,
        )


def from_namespace(ns: argparse.Namespace) -> Config:
    values: dict[str, Any] = {}
    for s in SETTINGS:
        value = getattr(ns, s.attr)
        if s.name == "model":
            given = value if value is not None else getattr(ns, "model_from_env", [])
            try:
                repository = getattr(ns, "model_repository", None)
                values["model"], values["named_models"] = split_models(given or [], repository)
            except ValueError as exc:
                raise SystemExit(f"ringserve: {exc}") from None
            continue
        if isinstance(value, str) and s.type is not str:
            value = s.type(value)  # a default taken from the environment arrives as text
        values[s.attr] = value
    return Config(**values)


def markdown_table() -> str:
    rows = ["| option | env | default | meaning |", "| --- | --- | --- | --- |"]
    for s in SETTINGS:
        rows.append(f"| `--{s.name}` | `{s.env}` | `{s.shown}` | {s.help} |")
    return "\n".join(rows)


TOML_KINDS: dict[Callable[[str], Any], str] = {
    float: "number",
    parse_flag: "boolean",
    parse_buckets: "array of integers",
    parse_bytes: "integer or string",
}
_JSON_TYPES: dict[str, dict[str, Any]] = {
    "integer": {"type": "integer"},
    "number": {"type": "number"},
    "boolean": {"type": ["boolean", "integer"]},
    "array of integers": {"type": ["array", "string"], "items": {"type": "integer"}},
    "integer or string": {"type": ["integer", "string"]},
    "string": {"type": "string"},
}


def model_kind(m: ModelSetting) -> str:
    """A model table key's value type in the file (as Setting.kind)."""
    kinds: dict[Callable[[str], Any], str] = {
        int: "integer",
        parse_max_length: "integer",
        float: "number",
        parse_version: "integer or string",
    }
    return kinds.get(m.parse, "string")


def toml_schema() -> dict[str, Any]:
    """The config file's JSON Schema, from SETTINGS and MODEL_SETTINGS (`ringserve config
    schema`; an editor with a TOML language server checks a file by it). Each key is there
    with dashes and with underscores, as the file takes both."""
    options: dict[str, Any] = {
        s.name: {**_JSON_TYPES[s.kind], "description": s.help}
        for s in SETTINGS
        if s.name != "config"
    }
    options["model"] = {"type": ["string", "array"], "items": {"type": "string"},
                        "description": BY_NAME["model"].help}  # fmt: skip
    table = {
        m.name: {**_JSON_TYPES[model_kind(m)], "description": m.help}
        for m in MODEL_SETTINGS
        if m.served
    }
    options["models"] = {
        "type": "object",
        "description": "one table per model, [models.NAME]",
        "additionalProperties": {
            "type": "object", "properties": table, "required": ["path"],
            "additionalProperties": False,
        },
    }  # fmt: skip
    options = with_underscores(options)
    options["models"]["additionalProperties"]["properties"] = with_underscores(table)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "ringserve serve --config FILE",
        "type": "object",
        "properties": options,
        "additionalProperties": False,
    }


def with_underscores(properties: dict[str, Any]) -> dict[str, Any]:
    """Each dashed key also under its underscored name."""
    return {**properties, **{k.replace("-", "_"): v for k, v in properties.items() if "-" in k}}


def config_reference() -> str:
    """The config file's reference page (docs/reference/config.md), from the same tables."""
    lines = [
        "# Config file reference",
        "",
        "<!-- generated by `python -m ringserve.service.config.settings --config-reference`: edit "
        "service/config/settings.py, not this page -->",
        "",
        "`ringserve serve --config FILE` reads a TOML file. Its top-level keys are the options "
        "of `ringserve serve` by name (dashes or underscores); each `[models.NAME]` table is "
        "one model served under NAME. Command-line flags win over `RINGSERVE_*` variables, "
        "which win over the file, which wins over the defaults. `ringserve config check FILE` "
        "validates a file; `ringserve config show --config FILE` prints every effective "
        "setting and where it came from. Relative paths are taken from the working directory, "
        "as on the command line.",
        "",
        "## Top-level keys",
        "",
        "| key | type | flag | env | default |",
        "| --- | --- | --- | --- | --- |",
    ]
    for s in SETTINGS:
        if s.name == "config":
            continue
        kind = "string or array of strings" if s.name == "model" else s.kind
        lines.append(f"| `{s.name}` | {kind} | `--{s.name}` | `{s.env}` | `{s.shown}` |")
    lines += [
        "",
        "## `[models.NAME]` tables",
        "",
        "| key | type | meaning |",
        "| --- | --- | --- |",
    ]
    for m in MODEL_SETTINGS:
        lines.append(f"| `{m.name}` | {model_kind(m)} | {m.help} |")
    if any(not m.served for m in MODEL_SETTINGS):
        lines += [
            "",
            "A key marked *not honoured per model yet* is refused with its name and line, so "
            "that a file never appears to set what the server would ignore.",
        ]
    lines.append("")
    return "\n".join(lines)


if (
    __name__ == "__main__"
):  # `python -m ringserve.service.config.settings` prints the README's option table
    import sys

    print(config_reference() if "--config-reference" in sys.argv else markdown_table())
