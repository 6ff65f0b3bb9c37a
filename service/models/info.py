"""The model facts every protocol reads, as one frozen value: the artifact's manifest and where
it lies, the device, runtime and fp32 graph it serves on, and the length grids. Resolved once
at start (`resolve_models`: every model --model and --model-repository name) or by a load
(models/repository.py); a reload swaps in a new value, never edits this one. Here too: what a
model directory holds (an artifact, or numbered versions) and a repository's scan."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ringserve.factory.build import default_in_child
from ringserve.service.config.settings import (
    PER_MODEL_MANIFEST,
    PER_MODEL_SERVED,
    Config,
    ModelTableError,
)
from ringserve.service.engine.tenants import INTERACTIVE, PRIORITIES
from ringserve.service.logs import EventLog
from ringserve.service.models.device import resolve_device
from ringserve.service.models.precision import auto_precision, cpu_refusal
from ringserve.shm import layout as L
from ringserve.workers.artifact import (
    MANIFEST_FILE,
    ArtifactError,
    Manifest,
    as_served,
    default_cache_dir,
    load_manifest,
    load_tokenizer,
)
from ringserve.workers.cpu import BF16_FLAGS, cpu_flags
from ringserve.workers.process.batcher import default_grid, pad_grid
from ringserve.workers.runtimes.graphpick import choose
from ringserve.workers.runtimes.onnx_model import choose_runtime
from ringserve.workers.spec import ModelRef


@dataclass(frozen=True)
class ModelInfo:
    manifest: Manifest
    model_dir: str
    served_as: str | None  # --model-name: the name KServe and /v1/model give, else the artifact's
    device: str  # resolved: cpu, cuda, cuda:K (or the test-only fake-gpu)
    runtime: str  # resolved: torch, onnx or openvino
    graph: dict[str, Any]  # ONNX Runtime at fp32: the graph chosen, and why; else empty
    pad_grid: tuple[int, ...]  # empty: each CPU batch padded to its own longest text
    buckets: tuple[int, ...]  # the length classes latency is reported in
    index: int = 0  # its index on the wire to the workers (shm.layout.request_meta); 0: the first
    version: int = 1  # the repository's version directory it came from (1 without versions)
    # Its config file table's per-model settings the workers apply (Config.for_model).
    options: tuple[tuple[str, Any], ...] = ()
    precision_chosen_by: str = ""  # --precision auto: what it resolved to and why; else empty
    # Its table's settings that change the manifest as served (max_length, prompt_name):
    # `manifest` is already the served one (table_manifest); a reload applies them again.
    table: tuple[tuple[str, Any], ...] = ()
    # The level its texts are batched at, at most (its table's `priority`; service.engine
    # tenants' INTERACTIVE 0 or BULK 1): a key or a request may lower it, never raise it.
    priority: int = INTERACTIVE

    @property
    def name(self) -> str:
        return self.served_as or self.manifest.name

    @property
    def labels(self) -> list[str]:
        return self.manifest.labels

    @property
    def shape(self) -> tuple[int, int]:
        """(labels, dimension): what every answer of its workers holds (engine/answers.py)."""
        return len(self.manifest.labels), self.manifest.dimension

    @property
    def warm_options(self) -> int:
        """The options byte of a warm-up text (service/pool/warmup.py): an ask the model
        answers, so answering it shows the model runs: a document's token vectors (a ColBERT
        model), a vector (an embed-only model), else its own plain answer (scores, terms, or
        per-token labels)."""
        if self.manifest.multivector:
            return L.OPT_TOKENS
        return L.OPT_EMBED if self.manifest.embed_only else 0

    @property
    def ref(self) -> ModelRef:
        """What a worker is told to load for this model (workers.spec)."""
        return ModelRef(self.index, self.name, self.version, self.model_dir, self.options)

    def reloaded(self, manifest: Manifest) -> ModelInfo:
        """The same facts for a new artifact in the same place (a reload), as its table says
        it serves; raises ModelTableError when the new artifact cannot (a prompt it lacks)."""
        served = table_manifest(manifest, dict(self.table), self.name)
        return dataclasses.replace(self, manifest=served)


def table_manifest(
    manifest: Manifest, table: dict[str, Any], name: str, lines: dict[str, str] | None = None
) -> Manifest:
    """The manifest as the model serves with its [models.NAME] table (workers.artifact
    as_served): `prompt_name` its default prompt, `max_length` lower than its artifact's. A
    prompt the model lacks, or a max_length over its artifact's, raises ModelTableError
    naming the table, the key and (`lines`: setting -> "FILE:LINE") where the file sets it."""
    where = lines or {}
    prompt = table.get("prompt_name")
    prompts = manifest.extra.get("prompts")
    known = sorted(prompts) if isinstance(prompts, dict) else []
    if prompt is not None and prompt not in known:
        why = f"{prompt!r} is not one of the model's prompts: {', '.join(known) or 'none'}"
        raise ModelTableError(name, "prompt_name", why, where.get("prompt_name", ""))
    longest = int(table.get("max_length", 0))
    if longest > manifest.max_length:
        why = (
            f"{longest} is over the artifact's max_length of {manifest.max_length} (a table "
            "may lower it, never raise it)"
        )
        raise ModelTableError(name, "max_length", why, where.get("max_length", ""))
    return as_served(manifest, longest, prompt)


def check_window_room(
    settings: Config, name: str, model_dir: str, max_length: int, where: dict[str, str]
) -> None:
    """A table that lowers max_length on a model whose long texts go in windows: a pair's
    window must still move on past --window-stride (workers/process/longtext.py checks the
    same at boot, where the refusal would name no file or line). Raises ModelTableError."""
    served = settings.for_model(name)
    if served.long_text != "window":
        return
    tokenizer = load_tokenizer(model_dir, max_length)
    room = max_length - tokenizer.num_special_tokens_to_add(True) - 1
    if not 0 <= served.window_stride < room:
        why = (
            f"{max_length} is too short for windows: --window-stride {served.window_stride} "
            f"must stay below {room} (max_length less a pair's special tokens, less one); "
            "raise max-length, lower --window-stride or set long-text to truncate or refuse"
        )
        raise ModelTableError(name, "max_length", why, where.get("max_length", ""))


# -- where models are: an artifact, or numbered versions, and a repository of them ----------------
def artifact_versions(path: str | Path) -> tuple[dict[int, str], str]:
    """The versions a model directory holds: itself when it is an artifact (version 1), else
    its numbered subdirectories holding one. Returns ({version: dir}, the problem or "")."""
    where = Path(path)
    if (where / MANIFEST_FILE).is_file():
        return {1: str(where)}, ""
    try:
        children = list(where.iterdir())
    except OSError as exc:
        return {}, f"{where}: {exc.strerror or exc}"
    versions = {
        int(c.name): str(c)
        for c in children
        if c.name.isdigit() and int(c.name) > 0 and (c / MANIFEST_FILE).is_file()
    }
    if not versions:
        return {}, f"{where} holds no artifact ({MANIFEST_FILE}) and no numbered version with one"
    return versions, ""


@dataclass(frozen=True)
class Candidate:
    """One model of the repository as its directory shows it (nothing read but names)."""

    name: str
    versions: dict[int, str]  # version -> artifact directory
    problem: str = ""  # why it cannot be loaded as it stands, or ""

    def pick(self, version: int | None = None) -> tuple[int, str] | None:
        """(version, directory): the one asked for, or the highest; None when absent."""
        if not self.versions:
            return None
        v = max(self.versions) if version is None else version
        return (v, self.versions[v]) if v in self.versions else None


def scan_repository(root: str | Path) -> dict[str, Candidate]:
    """Every subdirectory NAME/ of the repository (hidden ones and files aside), by name."""
    found: dict[str, Candidate] = {}
    try:
        children = sorted(Path(root).iterdir())
    except OSError as exc:
        raise ArtifactError(f"model repository {root}: {exc.strerror or exc}") from None
    for child in children:
        if child.name.startswith(".") or not child.is_dir():
            continue
        versions, problem = artifact_versions(child)
        found[child.name] = Candidate(child.name, versions, problem)
    return found


@dataclass(frozen=True)
class Wanted:
    """A model the server starts with: its name (None: the artifact's) and where it lies."""

    served_as: str | None
    model_dir: str
    version: int
    named: bool  # given by --model (a problem stops the start) or found in the repository


def wanted_at_start(settings: Config, log: EventLog) -> list[Wanted]:
    """What --model, --model-repository and --model-control ask to serve from the start, in
    index order: the bare --model DIR (or the built-in default when nothing else is named),
    each --model NAME=DIR, then the repository's models (with --model-control none; with
    explicit they load on request)."""
    s = settings
    repo = scan_repository(s.model_repository) if s.model_repository else {}
    out: list[Wanted] = []
    bare, named = s.model, s.named_models  # a repository model's bare NAME is named (settings)
    # No --model at all serves the built-in default, as before, unless the repository is the
    # set (--model-control none); explicit control with nothing named starts with it too.
    if bare is not None or (not named and (not repo or s.model_control == "explicit")):
        where = bare or str(default_in_child(s.cache_dir))
        out.append(one_wanted(s.model_name, where, True))
    out += [one_wanted(name, where, True, s.model_version(name)) for name, where in named]
    if s.model_control == "none":
        for cand in repo.values():
            if any(w.served_as == cand.name for w in out):
                continue
            picked = cand.pick()
            if picked is None:
                log.warning("model_skipped", model=cand.name, reason=cand.problem)
                continue
            out.append(Wanted(cand.name, picked[1], picked[0], False))
    if not out:
        raise ArtifactError(f"model repository {s.model_repository}: no model in it loads")
    return out


def one_wanted(
    served_as: str | None, where: str, named: bool, version: int | None = None
) -> Wanted:
    """The model at `where`: its highest version, or `version` (a config file's table)."""
    versions, problem = artifact_versions(where)
    if not versions:
        raise ArtifactError(f"model artifact {problem}")
    v = max(versions) if version is None else version
    if v not in versions:
        raise ArtifactError(f"model {served_as}: {where} has no version {v}")
    return Wanted(served_as, versions[v], v, named)


def check_tables(settings: Config) -> None:
    """`ringserve config check`: each table's max_length and prompt_name against its artifact's
    manifest, where the artifact can be read (one that cannot is the start's to refuse).
    Raises ModelTableError, as the start would."""
    for name, where in settings.named_models:
        options = settings.model_options.get(name, {})
        table = {k: v for k, v in options.items() if k in PER_MODEL_MANIFEST}
        if not table:
            continue
        try:
            wanted = one_wanted(name, where, True, settings.model_version(name))
            manifest = load_manifest(wanted.model_dir, verify=False)
        except ArtifactError:
            continue
        lines = settings.model_lines.get(name) or {}
        served = table_manifest(manifest, table, name, lines)
        if "max_length" in table:
            check_window_room(settings, name, wanted.model_dir, served.max_length, lines)


def resolve_models(
    settings: Config, log: EventLog, problems: dict[str, str] | None = None
) -> list[ModelInfo]:
    """Every model the server starts with, read and verified, indexes 0, 1, ... The device is
    resolved once, and --graph auto timed on the first model only: the others use its choice
    (one CPU, one kind of encoder: timing each would only lengthen the start). A problem with
    a model --model names stops the start with one sentence; a repository model that fails
    its check is skipped (logged, and its reason put in `problems`)."""
    try:
        wanted = wanted_at_start(settings, log)
    except ArtifactError as exc:
        raise SystemExit(f"ringserve: {exc}") from None
    device = resolve_device(settings.device, log)
    out: list[ModelInfo] = []
    for w in wanted:
        try:
            manifest = load_manifest(w.model_dir)
        except ArtifactError as exc:
            if w.named:
                raise SystemExit(f"ringserve: {exc}") from None
            log.warning("model_skipped", model=w.served_as, reason=str(exc))
            if problems is not None:
                problems[str(w.served_as)] = str(exc)
            continue
        try:
            info = describe(settings, log, manifest, w, len(out), device, out[0] if out else None)
        except ModelTableError as exc:  # refused as a bad config file is: exit 2
            print(f"ringserve: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        if any(m.name == info.name for m in out):
            raise SystemExit(f"ringserve: two models are named {info.name}")
        out.append(info)
    if not out:
        raise SystemExit("ringserve: no model of the repository could be loaded; see the log")
    return out


def resolve_model(settings: Config, log: EventLog) -> ModelInfo:
    """The first model alone (a one-model caller)."""
    return resolve_models(settings, log)[0]


def describe(
    settings: Config,
    log: EventLog,
    manifest: Manifest,
    wanted: Wanted,
    index: int,
    device: str,
    first: ModelInfo | None,
) -> ModelInfo:
    """The facts of one verified artifact on `device`: its runtime (and fp32 graph) and length
    grids, with its own per-model settings (a config file's table). Raises SystemExit (at
    start) when --runtime cannot serve it, ModelTableError when its table asks what the
    artifact cannot give."""
    server = settings
    settings = settings.for_model(wanted.served_as)
    name = wanted.served_as or ""
    options = server.model_options.get(name, {})
    table = {k: v for k, v in options.items() if k in PER_MODEL_MANIFEST}
    lines = server.model_lines.get(name) or {}
    manifest = table_manifest(manifest, table, name, lines)
    if "max_length" in table:
        check_window_room(server, name, wanted.model_dir, manifest.max_length, lines)
    # What the workers apply: the settings of their spec, and the max_length they serve at.
    served = {k: v for k, v in options.items() if k in PER_MODEL_SERVED or k == "max_length"}
    max_len = manifest.max_length
    on_gpu = device != "cpu"
    chosen_by = pick_precision(settings, manifest, on_gpu, log, first)
    runtime = pick_runtime(settings, manifest, on_gpu, log)
    grid = pad_grid(settings.buckets, on_gpu, max_len, runtime)  # as the workers' (served.py)
    graph: dict[str, Any] = {}
    if runtime == "onnx" and settings.precision == "fp32":
        if first is None:
            graph = pick_graph(settings, wanted.model_dir, manifest, log)
            server.graph = settings.graph  # the workers are told the choice by the settings
        else:  # the first model's timing decides for all (resolve_models says why)
            graph = {"graph": settings.graph, "chosen_by": f"as for {first.name}"}
    return ModelInfo(
        manifest=manifest,
        model_dir=wanted.model_dir,
        served_as=wanted.served_as,
        device=device,
        runtime=runtime,
        graph=graph,
        pad_grid=grid,
        # Latency is reported per length class: the padding grid's, or a fixed one without it.
        buckets=grid or default_grid(max_len),
        index=index,
        version=wanted.version,
        options=tuple(sorted(served.items())),
        precision_chosen_by=chosen_by,
        table=tuple(sorted(table.items())),
        priority=PRIORITIES[options.get("priority", "interactive")],
    )


def pick_precision(
    settings: Config, manifest: Manifest, on_gpu: bool, log: EventLog, first: ModelInfo | None
) -> str:
    """Resolve --precision auto once, on the first model (one setting serves them all, as
    --graph auto: the others say "as for" it), from int8's and bf16's published costs
    (models/precision.py); refuse a precision this CPU cannot run. Returns why auto chose what
    it did ("" without auto)."""
    s = settings
    if s.precision == "auto":
        if on_gpu:
            s.precision, why = "fp32", "auto: no published cost for fp16 or bf16 on CUDA"
        else:
            cpu_bf16 = bool(cpu_flags() & set(BF16_FLAGS))
            s.precision, why = auto_precision(
                manifest.int8, bool(manifest.int8_file), manifest.bf16, cpu_bf16,
                manifest.int8_checked,
            )  # fmt: skip
        log.info("precision_chosen", precision=s.precision, reason=why)
        print(f"ringserve: --precision auto: serving {s.precision} ({why})", file=sys.stderr)
        return why
    refusal = "" if on_gpu else cpu_refusal(s.precision, cpu_flags())
    if refusal:
        raise SystemExit(f"ringserve: {refusal}")
    if first is not None and first.precision_chosen_by:
        return f"as for {first.name}"
    return ""


def pick_runtime(settings: Config, manifest: Manifest, on_gpu: bool, log: EventLog) -> str:
    """Resolve --runtime once here (workers resolve it the same way) and say what int8
    costs when it is asked for: the figure measured when the artifact was built."""
    s = settings
    try:
        runtime, note = choose_runtime(s.runtime, s.precision, on_gpu, manifest)
    except ValueError as exc:
        raise SystemExit(f"ringserve: {exc}") from None  # a load catches it (repository.py)
    if note:
        log.warning("runtime_fallback", runtime=runtime, reason=note)
    refusal = torch_refusal(runtime)
    if refusal:
        raise SystemExit(f"ringserve: {refusal}")
    if s.precision == "int8" and not on_gpu:
        log.warning("int8_cost", **manifest.int8)
        print(int8_note(manifest.int8), file=sys.stderr)
    if s.precision == "int8-checked" and not on_gpu:
        log.info("int8_checked_cost", **manifest.int8_checked)
        print(checked_note(manifest.int8_checked), file=sys.stderr)
    if runtime == "openvino":
        log.info("runtime_chosen", runtime=runtime, precision=s.precision, bf16=manifest.bf16)
        said = bf16_note(s.precision, manifest.bf16)
        print(f"ringserve: serving {s.precision} on OpenVINO{said}", file=sys.stderr)
    return runtime


def torch_refusal(runtime: str) -> str | None:
    """Why `runtime` cannot serve in this install: TorchScript (--runtime torch, any GPU, an
    artifact without ONNX graphs) needs torch, which a serving-only install (the CPU serving
    image's) lacks; said at start rather than by each worker's traceback."""
    if runtime != "torch" or importlib.util.find_spec("torch") is not None:
        return None
    return (
        "this model would serve on TorchScript (--runtime torch, a GPU, or an artifact without "
        "ONNX graphs), which needs torch, and this install lacks it: "
        "`pip install 'ringserve[full]'` adds it (or the full container image)"
    )


def bf16_note(precision: str, cost: dict[str, Any]) -> str:
    """bf16's cost as published (factory/int8.py publish_bf16), or "" (fp32, or none)."""
    if precision != "bf16":
        return ""
    if not cost:
        return " (the artifact publishes no bf16 cost: built on a CPU without bf16)"
    where = f"{cost.get('texts')} texts of the publication split"
    speed = f", {cost['speedup']}x fp32's speed where built" if "speedup" in cost else ""
    if "rank_overlap_at_10" in cost:  # a sparse model (factory/sparse_cost.py)
        return (
            f": {cost['rank_overlap_at_10']} of each query's top 10 documents as fp32's on "
            f"{where}{speed}"
        )
    if "mean_cosine" in cost:
        return f": mean cosine to fp32 {cost['mean_cosine']} on {where}{speed}"
    return (
        f": accuracy cost {cost.get('accuracy_cost')}, same decision as fp32 on "
        f"{cost.get('argmax_agreement')} of {where}{speed}"
    )


def int8_note(cost: dict[str, Any]) -> str:
    """What int8 costs, as published from the split no choice read (factory/int8.py publish)."""
    where = f"{cost.get('texts')} texts of the publication split"
    if "rank_overlap_at_10" in cost:  # a sparse model (factory/sparse_cost.py)
        return (
            f"ringserve: --precision int8: {cost.get('term_overlap_at_32')} of each text's 32 "
            f"heaviest terms kept, {cost['rank_overlap_at_10']} of each query's top 10 "
            f"documents by dot product as fp32's, on {where}"
        )
    if "min_cosine" in cost:  # an embed-only model: how far int8 turns its vectors
        return (
            f"ringserve: --precision int8: cosine to fp32 at least {cost['min_cosine']} "
            f"(mean {cost.get('mean_cosine')}) on {where}"
        )
    speed = f", {cost['speedup']}x fp32's speed here" if "speedup" in cost else ""
    ci = cost.get("accuracy_cost_ci95")
    within = f", 95% interval {ci[0]} to {ci[1]}" if ci else ""
    return (
        f"ringserve: --precision int8: accuracy cost {cost.get('accuracy_cost')}{within} "
        f"({cost.get('accuracy_fp32')} -> {cost.get('accuracy_int8')}), same decision "
        f"as fp32 on {cost.get('argmax_agreement')} of {where} "
        f"(recipe: {cost.get('recipe', 'dynamic')}{speed})"
    )


def checked_note(cost: dict[str, Any]) -> str:
    """int8-checked's threshold and cost, as its build published them (factory/int8.py
    publish_checked)."""
    share, ci = cost.get("rerun_share"), cost.get("rerun_share_ci95") or ["?", "?"]
    said = (
        f"ringserve: --precision int8-checked: a text whose int8 margin is under "
        f"{cost.get('threshold')} is scored again by fp32 ({share} of "
        f"{cost.get('texts')} texts of the publication split, 95% interval {ci[0]} to "
        f"{ci[1]}); same decision as fp32 on {cost.get('argmax_agreement')}"
    )
    if "accuracy_cost" in cost:
        said += f", accuracy cost {cost['accuracy_cost']}"
    said += f", {cost['speedup']}x fp32's speed where built" if "speedup" in cost else ""
    return said + (f"; int8 recipe: {cost['recipe']}" if "recipe" in cost else "")


def pick_graph(
    settings: Config, model_dir: str, manifest: Manifest, log: EventLog
) -> dict[str, Any]:
    """Resolve --graph auto by timing both fp32 graphs on this CPU (workers/runtimes/graphpick.py);
    the workers are given the resolved choice through the settings they are built from."""
    s = settings
    cache = Path(s.cache_dir) if s.cache_dir else default_cache_dir()
    graph = choose(model_dir, manifest, s.graph, cache)
    s.graph = graph["graph"]
    log.info("graph_chosen", **graph)
    ms = graph.get("ms")
    timing = f": {', '.join(f'{g} {t} ms' for g, t in ms.items())}" if ms else ""
    print(
        f"ringserve: serving the {s.graph} fp32 graph ({graph['chosen_by']}{timing})",
        file=sys.stderr,
    )
    return graph
