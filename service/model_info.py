"""The model facts every protocol reads, as one frozen value: the artifact's manifest and where
it lies, the device, runtime and fp32 graph it serves on, and the length grids. Resolved once
at start (`resolve_model`); a reload swaps in a new value, never edits this one."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ringserve.factory.build import default_in_child
from ringserve.service.device import resolve_device
from ringserve.service.logs import EventLog
from ringserve.service.settings import Config
from ringserve.workers.artifact import ArtifactError, Manifest, default_cache_dir, load_manifest
from ringserve.workers.batcher import REPORT_GRID, length_grid, pad_grid
from ringserve.workers.graphpick import choose
from ringserve.workers.onnx_model import choose_runtime
from ringserve.workers.spec import ModelRef


@dataclass(frozen=True)
class ModelInfo:
    manifest: Manifest
    model_dir: str
    served_as: str | None  # --model-name: the name KServe and /v1/model give, else the artifact's
    device: str  # resolved: cpu, cuda, cuda:K (or the test-only fake-gpu)
    runtime: str  # resolved: torch or onnx
    graph: dict[str, Any]  # ONNX Runtime at fp32: the graph chosen, and why; else empty
    pad_grid: tuple[int, ...]  # empty: each CPU batch padded to its own longest text
    buckets: tuple[int, ...]  # the length classes latency is reported in
    index: int = 0  # its index on the wire to the workers (shm.layout.with_model); 0: the first
    version: int = 1  # the repository's version directory it came from (1 without versions)

    @property
    def name(self) -> str:
        return self.served_as or self.manifest.name

    @property
    def labels(self) -> list[str]:
        return self.manifest.labels

    @property
    def ref(self) -> ModelRef:
        """What a worker is told to load for this model (workers.spec)."""
        return ModelRef(self.index, self.name, self.version, self.model_dir)

    def reloaded(self, manifest: Manifest) -> ModelInfo:
        """The same facts for a new artifact in the same place (a reload)."""
        return dataclasses.replace(self, manifest=manifest)


def resolve_model(settings: Config, log: EventLog) -> ModelInfo:
    """Read and verify the artifact, then resolve the device, the runtime (and its graph) and
    the length grids; a problem stops the start with one sentence."""
    try:
        model_dir = settings.model or str(default_in_child(settings.cache_dir))
        manifest = load_manifest(model_dir)
    except ArtifactError as exc:
        raise SystemExit(f"ringserve: {exc}") from None
    max_len = manifest.max_length
    device = resolve_device(settings.device, log)
    on_gpu = device != "cpu"
    grid = pad_grid(settings.buckets, on_gpu, max_len)
    runtime = pick_runtime(settings, manifest, on_gpu, log)
    graph: dict[str, Any] = {}
    if runtime == "onnx" and settings.precision == "fp32":
        graph = pick_graph(settings, model_dir, manifest, log)
    return ModelInfo(
        manifest=manifest,
        model_dir=model_dir,
        served_as=settings.model_name,
        device=device,
        runtime=runtime,
        graph=graph,
        pad_grid=grid,
        # Latency is reported per length class: the padding grid's, or a fixed one without it.
        buckets=length_grid(grid or REPORT_GRID, max_len),
    )


def pick_runtime(settings: Config, manifest: Manifest, on_gpu: bool, log: EventLog) -> str:
    """Resolve --runtime once here (workers resolve it the same way) and say what int8
    costs when it is asked for: the figure measured when the artifact was built."""
    s = settings
    try:
        runtime, note = choose_runtime(s.runtime, s.precision, on_gpu, manifest)
    except ValueError as exc:
        raise SystemExit(f"ringserve: {exc}") from None
    if note:
        log.warning("runtime_fallback", runtime=runtime, reason=note)
    if s.precision == "int8" and not on_gpu:
        log.warning("int8_cost", **manifest.int8)
        print(int8_note(manifest.int8), file=sys.stderr)
    return runtime


def int8_note(cost: dict[str, Any]) -> str:
    if "min_cosine" in cost:  # an embed-only model: how far int8 turns its vectors
        return (
            f"ringserve: --precision int8: cosine to fp32 at least {cost['min_cosine']} "
            f"(mean {cost.get('mean_cosine')}) on {cost.get('texts')} held-out texts"
        )
    speed = f", {cost['speedup']}x fp32's speed here" if "speedup" in cost else ""
    return (
        f"ringserve: --precision int8: accuracy cost {cost.get('accuracy_cost')} "
        f"({cost.get('accuracy_fp32')} -> {cost.get('accuracy_int8')}), same decision "
        f"as fp32 on {cost.get('argmax_agreement')} of {cost.get('texts')} held-out texts "
        f"(recipe: {cost.get('recipe', 'dynamic')}{speed})"
    )


def pick_graph(
    settings: Config, model_dir: str, manifest: Manifest, log: EventLog
) -> dict[str, Any]:
    """Resolve --graph auto by timing both fp32 graphs on this CPU (workers/graphpick.py);
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
