"""The tiny Hugging Face classifiers of devkit/hfmodels.py, each saved and exported once a test
session (tests/conftest.py's `hf_exports`): test_hf, test_worker_models, test_rerank and
test_many_models serve the same BERT and XLM-R reranker, and an export is seconds of a core.

The builds are those the modules made each for itself: `ringserve export --from` with
`--max-length MAX_LENGTH` and cheap_builds (devkit/builds.py: their scores are tested, not int8's
choice or its cost), named as the source directory. They live under the session's pytest tmp
dir (never the user's cache) and are shared: a test that edits a source or an artifact copies it
first."""

from __future__ import annotations

from pathlib import Path

from devkit.builds import cheap_builds
from devkit.hfmodels import MAX_LENGTH, MODELS, save_model


class HfExports:
    """`get(name)`: (the saved HF directory, its artifact) for a devkit/hfmodels.py model,
    built on first use under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._built: dict[str, tuple[Path, Path]] = {}

    def get(self, name: str) -> tuple[Path, Path]:
        if name not in MODELS:
            raise KeyError(f"{name} is not a devkit/hfmodels.py model: {', '.join(MODELS)}")
        if name not in self._built:
            self._built[name] = self._build(name)
        return self._built[name]

    def source(self, name: str) -> Path:
        return self.get(name)[0]

    def artifact(self, name: str) -> Path:
        return self.get(name)[1]

    def _build(self, name: str) -> tuple[Path, Path]:
        from ringserve.factory import export

        source = save_model(name, self.root / "src")
        out = self.root / "art" / name
        args = ["--from", str(source), "--out", str(out), "--max-length", str(MAX_LENGTH)]
        with cheap_builds():
            if export.main(args) != 0:
                raise RuntimeError(f"export of {name} failed")
        return source, out
