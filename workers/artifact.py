"""Model artifacts, the reading side: check the manifest, verify the fingerprint, load the
tokenizer and the TorchScript classifier. Building one is factory/build.py's.

An artifact directory holds the scripted model (model.pt), the pinned tokenizer.json and
manifest.json; since format 2 also the same model as ONNX (model.onnx) and its int8 form
(model.int8.onnx) with int8's measured cost in the manifest. The manifest's fingerprint covers
every file it names, so a changed byte is refused; an artifact without the ONNX files still
serves, on TorchScript.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tokenizers import Tokenizer

if TYPE_CHECKING:
    import torch

MANIFEST_FILE = "manifest.json"
# graphs beside model.pt, when present
OTHER_FILES = ("onnx_file", "int8_file", "fused_file", "checked_file")
ACTIVATIONS = ("softmax", "sigmoid")
# "multivector": a ColBERT model's token vectors (factory/colbert.py), with "rerank" by MaxSim;
# "sparse": a SPLADE model's weights over the vocabulary (factory/sparse.py); "token-classify":
# label logits for every token (factory/token_heads.py).
TASKS = ("classify", "embed", "rerank", "multivector", "sparse", "token-classify")
LABELLED = ("classify", "token-classify")  # tasks whose answers name labels


@contextlib.contextmanager
def quiet_torchscript() -> Iterator[None]:
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
    int8: dict[str, Any] = field(default_factory=dict)  # int8's recipe and cost (factory/int8.py)
    # bf16's cost on OpenVINO, published by a building CPU with bf16 ({}: none; format 6)
    bf16: dict[str, Any] = field(default_factory=dict)
    # int8 with an fp32 second look at close calls: its threshold and published cost ({}:
    # none; format 7; factory/int8.py publish_checked)
    int8_checked: dict[str, Any] = field(default_factory=dict)
    # the int8 graph int8-checked runs when it is not int8's own (format 9: the fastest recipe,
    # factory/int8.py checked_pick); "" = int8_file
    checked_file: str = ""
    fused_file: str = ""  # ONNX Runtime's fused fp32 graph; "" = none (nothing fused, or old)
    data_files: list[str] = field(default_factory=list)  # the graphs' weights (.data files)
    graphs: dict[str, Any] = field(default_factory=dict)  # the fused graph's ops and drift
    # What the model does: "classify" always; "embed" (the graph also gives the pooled vector
    # of `dimension` floats, from the same forward), "rerank" (a one-output pair scorer),
    # "sparse" alone (no labels: SPLADE's weights over the vocabulary, factory/sparse.py);
    # "token-classify" alone: label logits for every token (factory/token_heads.py).
    task: list[str] = field(default_factory=lambda: ["classify"])
    dimension: int = 0
    # Whether the model's own pipeline L2-normalizes its embeddings (sentence-transformers'
    # 2_Normalize): the graph gives the pooled vector and the front-end normalizes by default.
    normalize: bool = False

    @property
    def embeds(self) -> bool:
        return "embed" in self.task

    @property
    def multivector(self) -> dict[str, Any]:
        """A ColBERT model's settings (factory/colbert.py multivector_extra); {} otherwise."""
        found = self.extra.get("multivector") if "multivector" in self.task else None
        return found if isinstance(found, dict) else {}

    @property
    def sparse(self) -> bool:
        """A sparse (SPLADE) model: its answers are weights over the vocabulary."""
        return "sparse" in self.task

    @property
    def token_classifies(self) -> bool:
        """A token classifier: its answers are per token (workers/token_entities.py)."""
        return "token-classify" in self.task

    @property
    def embed_only(self) -> bool:
        """An embedding model without labels: every answer is its vector."""
        return self.embeds and "classify" not in self.task

    def onnx_for(self, precision: str, graph: str = "plain") -> str:
        """The ONNX file that runs `precision` on `graph` ("" when the artifact has none); a
        fused graph asked of an artifact without one is the plain graph."""
        if precision == "int8-checked":  # and the plain fp32 graph beside it
            return self.checked_file or self.int8_file
        if precision == "int8":
            return self.int8_file
        return self.fused_file if graph == "fused" and self.fused_file else self.onnx_file

    def files(self) -> list[str]:
        """The fingerprinted model files beside the tokenizer, in a fixed order."""
        graphs = (self.onnx_file, self.int8_file, self.fused_file, self.checked_file)
        return [self.model_file, *(f for f in graphs if f), *self.data_files]


def _canonical(manifest: dict[str, Any]) -> bytes:
    body = {k: v for k, v in manifest.items() if k != "fingerprint"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


_HASH_CHUNK = 4 << 20


def _hash_file(digest: Any, tag: bytes, path: Path, buffer: memoryview) -> None:
    """digest.update(tag + the file's length as 8 bytes + its bytes), read in chunks into one
    buffer: the same digest as reading the file whole, without a copy of each graph's hundreds
    of MB in memory (a front-end's start, a reload and reference_logits verify every file).
    A file whose length changes while it is read gets a digest no manifest holds."""
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        digest.update(tag + size.to_bytes(8, "big"))
        read = 0
        while n := f.readinto(buffer):
            digest.update(buffer[:n])
            read += n
    if read != size:
        digest.update(b"the file changed while it was read")


def fingerprint_files(
    model: Path, tokenizer: Path, manifest: dict[str, Any], others: tuple[Path, ...] = ()
) -> str:
    digest = hashlib.sha256()
    parts = [(b"model", model), (b"tokenizer", tokenizer)]
    # Files added in format 2 are tagged by name; an older artifact's hash is unchanged.
    parts += [(b"file:" + p.name.encode(), p) for p in others]
    # Each part is length-prefixed so bytes cannot shift from one part to the next unnoticed.
    buffer = memoryview(bytearray(_HASH_CHUNK))
    for tag, path in parts:
        _hash_file(digest, tag, path, buffer)
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
    return fingerprint_files(model, tokenizer, raw, others)


def check_fields(directory: Path, raw: dict[str, Any]) -> Manifest:
    """The Manifest that `raw` describes, every field checked (factory/build.py checks its own
    before it writes one)."""

    def bad(why: str) -> ArtifactError:
        return ArtifactError(f"model artifact {directory}: {MANIFEST_FILE}: {why}")

    for key in ("name", "labels", "max_length", "fingerprint"):
        if key not in raw:
            raise bad(f"missing field {key!r}")
    data_files = _check_files(raw, bad)
    for key in ("int8", "bf16", "int8_checked", "graphs"):
        if not isinstance(raw.get(key, {}), dict):
            raise bad(f"{key!r} must be an object")
    task, dimension = _check_task(raw, bad)
    labels = raw["labels"]
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        raise bad("'labels' must be a list of strings")
    if any(t in LABELLED for t in task) != bool(labels):  # an embed-only model has no labels
        raise bad(
            "'labels' must be non-empty for task classify or token-classify, and empty without"
        )
    if len(set(labels)) != len(labels):
        raise bad("'labels' has duplicates")
    max_length = raw["max_length"]
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 3:
        raise bad("'max_length' must be an integer of at least 3")
    extra = raw.get("extra", {})
    if not isinstance(extra, dict):
        raise bad("'extra' must be an object")
    if "multivector" in task and not isinstance(extra.get("multivector"), dict):
        raise bad("task multivector needs 'extra.multivector' (factory/colbert.py)")
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
        bf16=raw.get("bf16", {}),
        int8_checked=raw.get("int8_checked", {}),
        checked_file=raw.get("checked_file", ""),
        fused_file=raw.get("fused_file", ""),
        data_files=list(data_files),
        graphs=raw.get("graphs", {}),
        task=task,
        dimension=dimension,
        normalize=raw.get("normalize", False) is True,
    )


def _check_files(raw: dict[str, Any], bad: Callable[[str], ArtifactError]) -> list[str]:
    """The manifest's file names (each a plain name inside the artifact) and its data files."""
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
    return list(data_files)


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
    manifest = check_fields(directory, raw)
    model = _artifact_file(directory, manifest.model_file, "model")
    tokenizer = _artifact_file(directory, manifest.tokenizer_file, "tokenizer")
    others = tuple(_artifact_file(directory, n, "model") for n in manifest.files()[1:])
    if verify:
        actual = fingerprint_files(model, tokenizer, raw, others)
        if actual != manifest.fingerprint:
            raise ArtifactError(
                f"model artifact {directory}: fingerprint mismatch: manifest says "
                f"{manifest.fingerprint}, files hash to {actual}"
            )
    return manifest


def as_served(manifest: Manifest, max_length: int = 0, prompt_name: str | None = None) -> Manifest:
    """The manifest as a model serves it with its config file table's settings: `max_length`
    below the artifact's own (never above; 0: its own), and `prompt_name` as its default prompt
    in place of `default_prompt_name`. The front-end's view of the model (service.model_info,
    which refuses what a table cannot set) and the worker's (max_length) both come from here."""
    changes: dict[str, Any] = {}
    if 0 < max_length < manifest.max_length:
        changes["max_length"] = max_length
    if prompt_name is not None:
        changes["extra"] = {**manifest.extra, "default_prompt_name": prompt_name}
    return replace(manifest, **changes) if changes else manifest


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
        with quiet_torchscript():
            model = torch.jit.load(str(directory / name), map_location=device)
    except RuntimeError as exc:
        raise ArtifactError(f"model artifact {directory}: cannot load {name}: {exc}") from None
    return model.eval()


def onnx_available() -> bool:
    """Whether this environment can export (onnx) and run (onnxruntime) the ONNX graphs."""
    return all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxruntime"))


def default_cache_dir() -> Path:
    """Where built artifacts (and the graph timings, workers/runtimes/graphpick.py) are kept."""
    return Path(os.environ.get("RINGSERVE_CACHE_DIR") or Path.home() / ".cache" / "ringserve")


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
