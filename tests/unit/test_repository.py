"""Many models without a server: --model and its friends parsed, a repository's directories
read (artifacts, numbered versions, bad directories), the ModelSet's changes, and the
memory-budget decision a load is refused by."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest
from ringserve.service.config.settings import (
    Config,
    add_arguments,
    cgroup_memory_limit,
    from_namespace,
    mem_available,
    parse_bytes,
    split_models,
)
from ringserve.service.models.info import ModelInfo, artifact_versions, scan_repository
from ringserve.service.models.modelset import LOADING, READY, UNLOADING, ModelSet, UnknownModel
from ringserve.service.models.repository import memory_refusal, per_worker_estimate, weights_bytes
from ringserve.service.offline.batch import batch_model_dir
from ringserve.workers.artifact import ArtifactError, Manifest


def parsed(*argv: str) -> Config:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return from_namespace(parser.parse_args(list(argv)))


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No RINGSERVE_ variable of the shell reaches the parser."""
    for name in list(os.environ):
        if name.startswith("RINGSERVE_"):
            monkeypatch.delenv(name)
    return monkeypatch


def artifact(where: Path) -> Path:
    where.mkdir(parents=True)
    (where / "manifest.json").write_text("{}")
    return where


def model(name: str, index: int, version: int = 1) -> ModelInfo:
    manifest = Manifest(name=name, labels=["neg", "pos"], max_length=128, fingerprint="f" * 64)
    return ModelInfo(manifest, f"/m/{name}", name, "cpu", "onnx", {}, (), (128,), index, version)


# -- settings ---------------------------------------------------------------------------------
def test_one_bare_model_or_none_is_as_before(clean_env: pytest.MonkeyPatch) -> None:
    assert parsed() == Config()
    one = parsed("--model", "/art")
    assert (one.model, one.named_models) == ("/art", ())
    assert (one.model_control, one.model_repository, one.memory_budget) == ("none", None, None)


def test_named_models_repeat_and_mix_with_a_bare_one(clean_env: pytest.MonkeyPatch) -> None:
    cfg = parsed("--model", "a=/x/a", "--model", "/art", "--model", "b.2=/x/b")
    assert cfg.model == "/art"
    assert cfg.named_models == (("a", "/x/a"), ("b.2", "/x/b"))
    assert split_models(["./odd=dir/x"]) == ("./odd=dir/x", ())  # a path, not NAME=DIR
    with pytest.raises(ValueError, match="only one model may be unnamed"):
        split_models(["/one", "/two"])
    with pytest.raises(ValueError, match="given twice"):
        split_models(["a=/x", "a=/y"])
    with pytest.raises(SystemExit):
        parsed("--model", "/one", "--model", "/two")


def test_a_bare_name_of_a_repository_model_is_that_model(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    artifact(tmp_path / "repo" / "alpha")
    cfg = parsed("--model-repository", str(tmp_path / "repo"), "--model", "alpha")
    assert cfg.model is None
    assert cfg.named_models == (("alpha", str(tmp_path / "repo" / "alpha")),)


def test_the_environment_gives_models_and_options(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("RINGSERVE_MODEL", "a=/x/a,b=/x/b")
    clean_env.setenv("RINGSERVE_MODEL_CONTROL", "explicit")
    clean_env.setenv("RINGSERVE_MEMORY_BUDGET", "2G")
    cfg = parsed()
    assert cfg.named_models == (("a", "/x/a"), ("b", "/x/b"))
    assert (cfg.model_control, cfg.memory_budget) == ("explicit", 2 << 30)
    assert parsed("--model", "/only").named_models == ()  # the command line wins
    with pytest.raises(SystemExit):
        parsed("--model-control", "sometimes")


def test_byte_counts() -> None:
    assert parse_bytes("8589934592") == 8 << 30
    assert [parse_bytes(t) for t in ("8G", "512m", "1KiB", "3 GB")] == [
        8 << 30,
        512 << 20,
        1024,
        3 << 30,
    ]
    with pytest.raises(ValueError):
        parse_bytes("lots")


def test_memory_budget_defaults(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    (v2 / "pod").mkdir(parents=True)
    (v2 / "pod" / "memory.max").write_text("1073741824\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/pod\n")
    assert cgroup_memory_limit(str(v2), str(proc)) == 1 << 30
    (v2 / "pod" / "memory.max").write_text("max\n")
    assert cgroup_memory_limit(str(v2), str(proc)) is None
    v1 = tmp_path / "v1" / "memory" / "pod"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    proc.write_text("5:memory:/pod\n")
    assert cgroup_memory_limit(str(tmp_path / "v1"), str(proc)) is None
    (v1 / "memory.limit_in_bytes").write_text("536870912\n")
    assert cgroup_memory_limit(str(tmp_path / "v1"), str(proc)) == 512 << 20
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 2048 kB\nMemAvailable: 1024 kB\n")
    assert mem_available(str(meminfo)) == 1 << 20


# -- the repository's directories -------------------------------------------------------------
def test_a_repository_scan(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    artifact(root / "plain")
    artifact(root / "versioned" / "1")
    artifact(root / "versioned" / "10")
    artifact(root / "versioned" / "2")
    (root / "versioned" / "11").mkdir()  # no artifact: not a version
    (root / "versioned" / "latest").mkdir()  # not a number: not a version
    (root / "empty").mkdir()
    (root / ".hidden").mkdir()
    (root / "README").write_text("not a model")
    found = scan_repository(root)
    assert list(found) == ["empty", "plain", "versioned"]
    assert found["plain"].versions == {1: str(root / "plain")}
    assert sorted(found["versioned"].versions) == [1, 2, 10]
    assert found["versioned"].pick() == (10, str(root / "versioned" / "10"))
    assert found["versioned"].pick(2) == (2, str(root / "versioned" / "2"))
    assert found["versioned"].pick(11) is None
    assert found["empty"].pick() is None and "no artifact" in found["empty"].problem
    assert artifact_versions(root / "missing")[0] == {}
    with pytest.raises(ArtifactError, match="model repository"):
        scan_repository(root / "missing")


# -- the set of models ------------------------------------------------------------------------
def test_model_set_indexes_are_never_reused() -> None:
    models = ModelSet(model("a", 0), model("b", 1))
    assert models.new_index() == 2
    c = model("c", models.new_index())
    models.add(c)
    entry = models.state_of("c")
    assert entry is not None and entry.state == LOADING
    with pytest.raises(UnknownModel):
        models.find("c")  # LOADING: not routable yet
    models.set_state(c, READY)
    assert models.find("c") is c
    models.set_state(c, UNLOADING)
    with pytest.raises(UnknownModel):
        models.find("c")
    models.remove(c)
    assert models.new_index() == 3  # c's index stays spent
    with pytest.raises(ValueError):
        models.add(model("d", 2))
    with pytest.raises(ValueError):
        models.add(model("a", 5))  # a is loaded already
    assert [m.name for m in models.infos()] == ["a", "b"]


# -- memory -----------------------------------------------------------------------------------
def test_memory_budget_decision() -> None:
    mib = 1 << 20
    assert memory_refusal(1000 * mib, 400 * mib, 100 * mib, 6) is None  # 1000 fits exactly
    why = memory_refusal(1000 * mib, 401 * mib, 100 * mib, 6)
    assert why is not None and "--memory-budget" in why and "1000 MiB" in why
    assert per_worker_estimate(90 * mib, []) == 90 * mib  # nothing measured: its weights
    # Loaded models measured at 1.5x their weights: a new one is expected the same.
    assert (
        per_worker_estimate(90 * mib, [(150 * mib, 100 * mib), (30 * mib, 20 * mib)]) == 135 * mib
    )


def test_weights_are_what_the_runtime_loads(tmp_path: Path) -> None:
    for name, size in (("model.pt", 50), ("model.onnx", 3), ("model.onnx.data", 40),
                       ("model.int8.onnx", 2), ("model.int8.onnx.data", 10)):  # fmt: skip
        (tmp_path / name).write_bytes(b"x" * size)
    m = Manifest(
        name="m", labels=["a"], max_length=8, fingerprint="f", onnx_file="model.onnx",
        int8_file="model.int8.onnx", data_files=["model.onnx.data", "model.int8.onnx.data"],
    )  # fmt: skip
    assert weights_bytes(str(tmp_path), m, "torch", "fp32") == 50
    assert weights_bytes(str(tmp_path), m, "onnx", "fp32") == 43
    assert weights_bytes(str(tmp_path), m, "onnx", "int8") == 12
    # int8-checked: the int8 graph and the plain fp32 one beside it
    assert weights_bytes(str(tmp_path), m, "onnx", "int8-checked") == 12 + 43


def test_batch_names_a_repository_model(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    artifact(root / "alpha" / "1")
    artifact(root / "alpha" / "2")
    settings = Config(model="alpha", model_repository=str(root))
    assert batch_model_dir(settings) == str(root / "alpha" / "2")
    settings.model = None  # the only model: it may be left out
    assert batch_model_dir(settings) == str(root / "alpha" / "2")
    artifact(root / "beta")
    with pytest.raises(ValueError, match="name a model"):
        batch_model_dir(settings)
    settings.model = "gamma"
    with pytest.raises(ValueError, match=r"no model 'gamma'.*alpha, beta"):
        batch_model_dir(settings)
    assert batch_model_dir(Config(model="/elsewhere")) == "/elsewhere"
