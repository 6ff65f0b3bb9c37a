"""Model repositories for the many-models tests and benchmark: the tiny random NLI BERT (three
labels, classifies pairs) and one-output XLM-R reranker of devkit/hfmodels.py exported as
artifacts, a repository laid out from artifacts (`DIR/NAME/VERSION/`), and broken artifacts (a
fingerprint that no longer matches, a missing file) for the loads that must be refused."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from devkit.hfmodels import MAX_LENGTH, save_model

# Served name -> the devkit/hfmodels.py model it is built from.
NLI = "nli"
RERANK = "rerank"
BUILT = {NLI: "bert", RERANK: "xlmr-reranker"}
NLI_LABELS = ["entailment", "neutral", "contradiction"]


def export_artifact(hf_name: str, root: Path, name: str | None = None) -> Path:
    """`root/art/NAME`: the tiny random HF model `hf_name` saved under `root/src` and exported
    with `ringserve export --from` (as a user builds one), its manifest named `name`."""
    from ringserve.factory import export

    name = name or hf_name
    source = save_model(hf_name, root / "src")
    out = root / "art" / name
    args = ["--from", str(source), "--out", str(out), "--max-length", str(MAX_LENGTH)]
    if export.main([*args, "--name", name]) != 0:
        raise RuntimeError(f"export of {hf_name} failed")
    return out


def lay_out(
    repo: Path, name: str, artifact: Path | str, version: int | None = 1, copy: bool = False
) -> Path:
    """Put `artifact` in the repository `repo` as model `name`: `repo/name/version/` (or
    `repo/name/` itself when `version` is None), a symlink unless `copy`. Returns that path."""
    target = repo / name if version is None else repo / name / str(version)
    target.parent.mkdir(parents=True, exist_ok=True)
    if copy:
        shutil.copytree(artifact, target, symlinks=False)
    else:
        os.symlink(Path(artifact).resolve(), target, target_is_directory=True)
    return target


def repository(repo: Path, models: dict[str, Path | str], copy: bool = False) -> Path:
    """A repository holding each model as version 1."""
    repo.mkdir(parents=True, exist_ok=True)
    for name, artifact in models.items():
        lay_out(repo, name, artifact, 1, copy)
    return repo


def break_fingerprint(artifact: Path) -> Path:
    """Edit the manifest after export (its labels), so the stored fingerprint no longer matches:
    the server must refuse the model naming the mismatch. `artifact` must be a copy."""
    _own(artifact)
    path = artifact / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["labels"] = [f"{label}!" for label in manifest["labels"]]
    path.write_text(json.dumps(manifest))
    return artifact


def drop_file(artifact: Path, name: str = "tokenizer.json") -> Path:
    """Remove one of the artifact's files (the tokenizer by default). `artifact` must be a copy."""
    _own(artifact)
    (artifact / name).unlink()
    return artifact


def _own(artifact: Path) -> None:
    if artifact.is_symlink():  # never break the artifact a symlink shares with other models
        raise ValueError(f"{artifact} is a symlink: break a copy (lay_out(..., copy=True))")
