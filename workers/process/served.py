"""The models one worker serves: each model's own state (Served, built by Loader), and the fair
turn-taking among them (Turns) that decides whose batch runs next.

Every model keeps its own tokenizer, long-text planner, runner and Batcher, so a batch always
holds one model's texts, formed by length under that model's token budget as before. The
models share the worker's loop, its rings and its control block.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ringserve.shm import layout as L
from ringserve.shm.control import ControlBlock
from ringserve.workers.artifact import as_served, load_manifest, load_model, load_tokenizer
from ringserve.workers.process.batcher import Batcher, default_grid, pad_grid
from ringserve.workers.process.longtext import LongText
from ringserve.workers.process.multivector import MultiVectorText
from ringserve.workers.process.sparse import sparse_limit
from ringserve.workers.process.tokens import TokenHead, TokenLongText, token_softmax
from ringserve.workers.runtimes.cpu import Runner, answer_activation, ort_runner
from ringserve.workers.runtimes.onnx_model import choose_runtime
from ringserve.workers.spec import ModelRef, WorkerSpec, is_gpu_device

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """This process's resident set, from /proc/self/statm (0 where it cannot be read)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def weights_bytes(model_dir: str, name: str) -> int:
    """The size of a model file and of its external weights (`NAME.data`), if any."""
    total = 0
    for path in (os.path.join(model_dir, name), os.path.join(model_dir, name + ".data")):
        try:
            total += os.path.getsize(path)
        except OSError:
            continue
    return total


@dataclass
class Preloaded:
    """What the zygote loaded of one model before forking: its CPU TorchScript model (None for
    ONNX Runtime workers, whose session is made after the fork) and the bytes that load added
    to the zygote's RSS, which a forked worker shares rather than measures. Its presence means
    the zygote verified the artifact's fingerprint."""

    model: Any
    rss_bytes: int


@dataclass
class Served:
    """One model in a worker: everything its texts need from request to answer."""

    ref: ModelRef
    longtext: LongText
    runner: Runner
    batcher: Batcher
    n_labels: int
    dimension: int  # embedding size; 0 for a model without embeddings
    activation: str  # the manifest's: how window scores combine
    report_grid: tuple[int, ...]  # the length classes latency is reported by
    rss_bytes: int = 0  # what loading it added to the worker's resident set
    # Every lane's runner, lane k's at k (the spec's lanes; `runner` is lane 0's): each with
    # buffers of its own and the one session (or compiled model) they share, run on each lane's
    # thread, so the lanes run batches at once.
    runners: tuple[Runner, ...] = ()
    # The most tokens whose vectors (OPT_TOKENS) one answer may carry: what half the response
    # ring holds (room to wrap); 0 when the runner has no token states to give.
    token_limit: int = 0
    # A sparse model's (workers/process/sparse.py): the most terms one answer carries (0: not
    # sparse), and whether its windows pool by sum (else max).
    sparse_limit: int = 0
    sparse_sum: bool = False
    # A token classifier's admitting and answering (workers/process/tokens.py); None otherwise.
    tokens: TokenHead | None = None

    def refuses(self, embed: bool, both: bool = False, tokens: bool = False) -> bool:
        """A vector from a model without one, scores from a model without labels, or token
        vectors from a runner without them (the front-end checks first; the last guard). A
        sparse model answers its terms, and nothing else."""
        if self.sparse_limit:
            return embed or both or tokens
        if tokens:
            return not self.token_limit
        if both:
            return not (self.dimension and self.n_labels)
        return (embed and not self.dimension) or not (embed or self.n_labels)

    def part(self, row: Any, embed: bool, both: bool = False) -> Any:
        """A runner row's embedding (after the C scores), its scores, or (both) the two."""
        if both:
            return row[: self.n_labels + self.dimension]
        return row[self.n_labels :] if embed else row[: self.n_labels]


def check_answer_room(max_payload: int, dimension: int, n_labels: int = 0) -> None:
    """An embed model's largest answer (D floats, or C + D for OPT_BOTH) must fit the
    response ring, with room to wrap."""
    need = L.RESPONSE_SIZE + 4 * (dimension + n_labels)
    if 2 * need > max_payload:
        raise RuntimeError(
            f"the model's {dimension}-float embeddings need {need} bytes an answer; the response "
            f"ring holds {max_payload} (raise --ring-slots)"
        )


def token_room(max_payload: int, runner: Any) -> int:
    """Served.token_limit: the tokens whose H-float vectors fit half the response ring; 0 for a
    runner without token states (TorchScript, CUDA, a graph built before they were exported)."""
    width = getattr(runner, "token_width", 0)
    if not width:
        return 0
    return max(0, (max_payload // 2 - L.RESPONSE_SIZE) // (4 * width))


def check_multivector_room(max_payload: int, runner: Any, max_len: int) -> None:
    """A multivector (ColBERT) model answers token vectors only: its runner must give them
    (ONNX Runtime, OpenVINO) and the response ring must hold a text's longest answer."""
    room = token_room(max_payload, runner)
    if not room:
        raise RuntimeError(
            "a multivector (ColBERT) model serves on ONNX Runtime or OpenVINO, the runtimes "
            "that give token vectors (--runtime onnx; not on a GPU)"
        )
    if room < max_len:
        raise RuntimeError(
            f"the response ring holds the vectors of {room} tokens, the model's texts have up "
            f"to {max_len} (raise --ring-slots)"
        )


class Loader:
    """Builds a worker's Served models one at a time. `model_ok` tells a device's failure from
    a bad model: it is set once the current model's CPU weights are loaded; `started` holds,
    on a GPU, each runner's callback that reports its graphs and returns the NVML monitor."""

    def __init__(self, spec: WorkerSpec, ctl: ControlBlock, max_payload: int) -> None:
        self.spec = spec
        self.ctl = ctl
        self.max_payload = max_payload  # the response ring's largest answer
        self.model_ok = False
        self.current: ModelRef | None = None  # the model being loaded (or the last one)
        self.started: list[tuple[Any, float]] = []  # (callback, warm seconds)
        self.first: Any = None  # the first lane's runner of the model being loaded

    def load(self, ref: ModelRef, pre: Preloaded | None) -> Served:
        """Load (or take the zygote's CPU model for) one model, and warm its shapes."""
        spec = self.spec.for_model(ref)  # a config file's per-model settings, when it has any
        self.model_ok = False
        self.current = ref
        self.first = None
        on_gpu = is_gpu_device(spec.device)
        # The zygote verified the fingerprint before it loaded the weights it hands over.
        manifest = as_served(load_manifest(ref.model_dir, verify=pre is None), spec.max_length)
        runtime, _ = choose_runtime(spec.runtime, spec.precision, on_gpu, manifest)
        _import_runtime(runtime)  # so the first model's memory is its own, not the library's
        before = rss_bytes()
        max_len = manifest.max_length
        grid = pad_grid(spec.buckets, on_gpu, max_len, runtime)
        tokenizer = load_tokenizer(ref.model_dir, max_len)
        token_head = manifest.token_classifies
        if token_head:
            longtext: LongText = TokenLongText(
                tokenizer, max_len, spec.long_text, spec.window_stride, spec.max_windows
            )
        elif manifest.multivector:
            longtext = MultiVectorText(tokenizer, max_len, manifest.multivector)
        else:
            longtext = LongText(
                tokenizer, max_len, spec.long_text, spec.window_stride, spec.max_windows,
                manifest.token_types,
            )  # fmt: skip
        self.ctl.beat()
        n_labels = len(manifest.labels)
        activation = answer_activation(manifest, token_softmax if token_head else None)
        if manifest.embeds:  # one output holds both answers: logits, then the embedding
            check_answer_room(self.max_payload, manifest.dimension, n_labels)
        if spec.lanes > 1 and runtime not in ("onnx", "openvino"):  # resolve_lanes keeps it out
            raise ValueError("a worker of several lanes runs ONNX Runtime or OpenVINO only")
        runners = []
        # OpenVINO: one loop, its threads on every lane's core (ov_runner), not a request a lane:
        # the requests of one compiled model ran one at a time (docs/design.md, "Lanes").
        count = 1 if runtime == "openvino" else spec.lanes
        for _ in range(count):  # a runner each, warmed before the worker says ready
            runners.append(self._runner(runtime, ref, manifest, grid or (max_len,), activation,
                                        pre))  # fmt: skip
            self.ctl.beat()
        runner = runners[0]
        if manifest.multivector:
            check_multivector_room(self.max_payload, runner, max_len)
        delay_ns = int(spec.max_delay_ms * 1e6)
        batcher = Batcher(
            spec.max_batch, spec.max_batch_tokens, delay_ns, grid, runner.overhead_tokens
        )
        batcher.bulk_wait_ns = int(spec.bulk_max_wait_ms * 1e6)
        grown = max(0, rss_bytes() - before) + (pre.rss_bytes if pre is not None else 0)
        # The allocator may hand the load memory freed earlier, so the delta can read low; the
        # weights it loaded are resident either way.
        weights = manifest.onnx_for(spec.precision, spec.graph) if runtime == "onnx" else ""
        if runtime == "openvino":  # compiled from the plain graph, whatever the precision
            weights = manifest.onnx_file
        grown = max(grown, weights_bytes(ref.model_dir, weights or manifest.model_file))
        report = grid or default_grid(max_len)
        heads = None
        if isinstance(longtext, TokenLongText):
            unk = manifest.extra.get("unk_token_id")
            heads = TokenHead(longtext, n_labels, unk, self.max_payload // 2, report)
        served = Served(
            ref, longtext, runner, batcher, n_labels, manifest.dimension, manifest.activation,
            report, grown, tuple(runners), token_room(self.max_payload, runner), tokens=heads,
        )  # fmt: skip
        if manifest.sparse:
            vocabulary = int(manifest.extra.get("vocabulary", 0xFFFF))
            served.sparse_limit = sparse_limit(self.max_payload, vocabulary)
            served.sparse_sum = manifest.extra.get("splade", {}).get("pooling") == "sum"
        return served

    def _runner(
        self,
        runtime: str,
        ref: ModelRef,
        manifest: Any,
        grid: tuple[int, ...],
        activation: Any,
        pre: Preloaded | None,
    ) -> Runner:
        """The model's runner, warmed; on a GPU its report callback joins `started`."""
        if runtime == "onnx":  # the session is made here, after any fork: ORT keeps threads
            # One session for every lane of the worker, each lane with buffers of its own and
            # calling run on its own thread (one intra-op thread: the caller's), so the lanes
            # still run batches at once, and the weights are in memory and cache once: two
            # sessions' copies took turns evicting each other while lone texts alternated
            # between the lanes (docs/design.md, "A lone request").
            spec = self.spec.for_model(ref)
            if spec.precision == "int8-checked":
                from ringserve.workers.runtimes.checked import checked_runner

                runner: Runner = checked_runner(
                    spec, manifest, activation, ref.model_dir, self.first
                )
            else:
                runner = ort_runner(spec, manifest, activation, ref.model_dir, self.first)
            self.first = self.first or runner
            self.model_ok = True
            runner.warm()
            return runner
        if runtime == "openvino":  # compiled here, after any fork, as ONNX Runtime's session
            from ringserve.workers.runtimes.openvino import ov_runner

            # One compiled model a worker, run by one loop on all of the worker's cores (its
            # lanes' CPUs): two lanes' infer requests of one compiled model took turns.
            compiled = self.first.compiled if self.first is not None else None
            runner = ov_runner(
                self.spec.for_model(ref), manifest, activation, ref.model_dir, compiled
            )
            self.first = self.first or runner
            self.model_ok = True
            runner.warm()
            return runner
        runner, started = self._torch_runner(ref, manifest, grid, activation, pre)
        warm_s = runner.warm()
        if started is not None:
            self.started.append((started, warm_s))
        return runner

    def _torch_runner(
        self,
        ref: ModelRef,
        manifest: Any,
        grid: tuple[int, ...],
        activation: Any,
        pre: Preloaded | None,
    ) -> tuple[Runner, Any]:
        """The TorchScript runner (CPU, or CUDA graphs on a GPU) and, on a GPU, the callback
        that reports its graphs; the zygote's CPU model when it preloaded one."""
        import torch
        from ringserve.workers.runtimes.cuda import make_runner

        spec = self.spec.for_model(ref)
        torch.set_num_threads(spec.threads)
        set_graph_optimize(not is_gpu_device(spec.device))  # before the model's first call
        model = pre.model if pre is not None and pre.model is not None else None
        if model is None:
            model = load_model(ref.model_dir, "cpu")
        if manifest.embeds:
            from ringserve.workers.runtimes.joined import Joined

            model = Joined(model)
        self.model_ok = True  # a failure from here on is the device's, not the model's
        return make_runner(spec, grid, model, self.ctl, activation)


def _import_runtime(runtime: str) -> None:
    if runtime == "onnx":
        import onnxruntime  # noqa: F401
    elif runtime == "openvino":
        import openvino  # noqa: F401
    else:
        import ringserve.workers.runtimes.cuda  # noqa: F401
        import torch  # noqa: F401


def set_graph_optimize(cpu: bool) -> None:
    """On the CPU, run TorchScript without the profiling executor's graph optimisation.

    Measured here on MiniLM, one thread: with it, a just-loaded model's first calls took 0.17,
    0.07 and 0.013 s on 16 tokens (the profiling runs); without it, 0.027, 0.021, 0.020, and
    steady batches (32 x 24 tokens, 256 x 1) ran at the same speed (0.66-0.73 s, 0.24-0.34 s)
    with bit-identical logits, since nothing on the CPU is fused. So a worker is warm almost at
    once, which is most of a forked worker's boot. CUDA keeps the optimising executor."""
    import torch

    torch._C._set_graph_executor_optimize(not cpu)


# A model with at least LIGHT_RATIO times the recent work (Batcher.work) of another model that
# had a text in the last LIGHT_RECENT_NS runs batches of at most 1/SHORT_SHARE of its token
# budget, so that the lighter model's text, which comes while such a batch runs, waits behind a
# short one: a batch cannot be stopped once it runs, so its length is the light model's wait.
# The front-end sends a light model's texts to one home worker (service.engine.routing.Homes),
# so only that worker shortens and the others keep whole batches. Measured before the home
# (benchmarks/many_models.py, 2 CPUs, c=32, 90/10, light sent on a clock): a quarter cost
# nothing, an eighth a tenth of throughput; with the home, an eighth light P99 2.20x, 1.59x and
# 1.74x alone at (b)/(a) 0.98-1.04, a quarter 2.58x. A sixteenth (32 of 512 tokens: one text)
# once collapsed (18x, 0.68); worker timings showed why: the home worker sees every light text
# but only its share of the busy ones, and its short batches slow it, so the front-end gives it
# fewer; its busy work fell to 2-3x the light one's, dipped under LIGHT_RATIO, the cap came off
# and whole batches (up to 8 rows, 95 ms) ran while light texts waited. So a cap, once set, is
# kept while the busier model has LIGHT_KEEP_RATIO times the work (hysteresis; two equally busy
# models stay far below either). With it a sixteenth no longer collapses, but it costs
# throughput and buys no light P99: full runs interleaved with the eighth before it, (b)/(a)
# 0.89, 0.88, 0.86 against 0.89, 1.01; light P99 in (b) 30.3, 32.9, 27.9 ms against 32.9,
# 30.1. What a light text waits for is then the short batch's tail, stretched by the front-end
# and the load generator sharing its core, not its rows: an eighth.
# On the CPU a worker of many models no longer cuts (Turns(behind=True)): the owed model's
# batches stay whole and run on the worker's background thread at a lower priority, beside the
# lighter model's on the loop (workers/process/behind.py), so its text waits for no batch
# at all; the cut is what a GPU worker, which runs one batch at a time, still does.
LIGHT_RATIO = 2.0
LIGHT_KEEP_RATIO = 1.25
LIGHT_RECENT_NS = 1_000_000_000
SHORT_SHARE = 8
# While a model is owed short batches by a busier one, its due batches also go first, up to this
# many in a row while the busier model has a batch due; then the busier model gets one turn. In
# strict round-robin a light text that came during the light model's own batch waited a whole
# batch of the busier model: measured here (worker timings, benchmarks/many_models.py (b)), the
# light texts' wait after the worker read them reached 35-70 ms at P99, behind 1-3 busy batches.
LIGHT_FIRST_RUNS = 4


class Turns:
    """Whose batch runs next among a worker's models: round-robin over the models that have a
    batch due, starting after the one that ran last. A model flooded with texts therefore
    delays another model's due batch by at most one batch of its own (with k models, by at
    most one batch of each other one); and while a model with much less recent work had texts
    lately, the busier model is owed to it (`owed`): its batch is a short one (`shorten`,
    SHORT_SHARE) or, with `behind`, a whole one the worker runs behind the lighter model's (on
    its background thread, `owes`); and the lighter model's due batches go first
    (`lighter_first`, at most LIGHT_FIRST_RUNS in a row while a busier one's batch is due).
    Time is a parameter (`now_ns`). One model: its batcher's own choices, untouched."""

    def __init__(self, batchers: Mapping[int, Batcher], behind: bool = False) -> None:
        self.batchers = dict(batchers)
        self.order = sorted(self.batchers)
        self.last = len(self.order) - 1  # position of the model that ran last
        self.light_runs = 0  # lighter models' batches run in a row while a busier one's was due
        # The models owed to a lighter one (shorten). `behind`: their batches are whole and run
        # behind the lighter models' (the worker's background thread), not capped.
        self.owed: set[int] = set()
        self.behind = behind

    def owes(self, index: int) -> bool:
        """The model's batches run behind a lighter model's (Turns(behind=True) only)."""
        return self.behind and index in self.owed

    def shorten(self, now_ns: int) -> None:
        """Owe each model with LIGHT_RATIO times the recent work of another model that had a
        text within LIGHT_RECENT_NS to it, and keep it owed while it has LIGHT_KEEP_RATIO
        times; release it otherwise. An owed model's batches are capped, unless `behind`."""
        works = {i: b.work(now_ns) for i, b in self.batchers.items()}
        light = [
            works[i]
            for i, b in self.batchers.items()
            if b.recent and now_ns - b.newest_ns < LIGHT_RECENT_NS
        ]
        lightest = min(light, default=None)
        for i, b in self.batchers.items():
            ratio = LIGHT_KEEP_RATIO if i in self.owed else LIGHT_RATIO
            if lightest is not None and works[i] >= ratio * max(lightest, 1.0):
                self.owed.add(i)
            else:
                self.owed.discard(i)
            short = i in self.owed and not self.behind
            b.cap_tokens = max(1, b.max_tokens // SHORT_SHARE) if short else 0

    def next(self, now_ns: int, held: bool = False) -> tuple[int | None, int]:
        """(the model whose batch runs now, 0), or (None, wait): -1 when nothing waits, else
        the nanoseconds until the earliest batch is due. Choosing a model is its turn.
        `held`: a batch runs behind, so no owed model's batch is chosen until it is done."""
        n = len(self.order)
        if n > 1:
            self.shorten(now_ns)
        # Each model's wait, planned once for this choice (wait_ns plans its next batch).
        lefts = {
            i: -1 if held and i in self.owed else b.wait_ns(now_ns)
            for i, b in self.batchers.items()
        }
        if n > 1:
            first = self.lighter_first(lefts)
            if first is not None:
                return first, 0
        wait = -1
        for step in range(1, n + 1):
            pos = (self.last + step) % n
            index = self.order[pos]
            left = lefts[index]
            if left == 0:
                self.last = pos
                if index in self.owed:
                    self.light_runs = 0
                return index, 0
            if left > 0 and (wait < 0 or left < wait):
                wait = left
        return None, wait

    def lighter_first(self, lefts: Mapping[int, int]) -> int | None:
        """A model not owed to another (while another one is) whose batch is due
        (`lefts`: each model's wait), unless LIGHT_FIRST_RUNS such batches ran in a row while an
        owed model's was due."""
        if not self.owed:
            return None
        busy_due = any(lefts[i] == 0 for i in self.owed)
        if busy_due and self.light_runs >= LIGHT_FIRST_RUNS:
            return None
        n = len(self.order)
        for step in range(1, n + 1):
            pos = (self.last + step) % n
            index = self.order[pos]
            if index not in self.owed and lefts[index] == 0:
                self.last = pos
                self.light_runs = self.light_runs + 1 if busy_due else 0
                return index
        return None
