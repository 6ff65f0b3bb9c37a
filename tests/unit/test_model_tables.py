"""A config file's [models.NAME] settings that change how a model serves its artifact
(service/models/info.py table_manifest, workers/artifact.py as_served): read from the file, then
checked against the artifact's manifest, a refusal naming the table, the key and its line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ringserve.service.config.file import ConfigError, resolve, show
from ringserve.service.config.settings import Config, ModelTableError
from ringserve.service.engine.admission import Admission
from ringserve.service.engine.dispatcher import Dispatcher
from ringserve.service.engine.tenants import BULK, INTERACTIVE, Tenant
from ringserve.service.models.info import table_manifest
from ringserve.service.request.prompts import default_prompt_name
from ringserve.workers.artifact import Manifest

PROMPTS = {"query": "query: ", "passage": "passage: "}


def manifest(max_length: int = 128, prompts: dict[str, str] | None = None) -> Manifest:
    extra = {"prompts": prompts, "default_prompt_name": "passage"} if prompts else {}
    return Manifest("m", ["no", "yes"], max_length, "sha256:-", extra=extra)


def table(tmp_path: Path, text: str) -> tuple[Path, Config]:
    path = tmp_path / "ringserve.toml"
    path.write_text(f'# models\n[models.a]\npath = "/a"\n{text}\n')
    return path, resolve(["--config", str(path)], {}).config


def served(config: Config, artifact: Manifest) -> Manifest:
    return table_manifest(artifact, config.model_options["a"], "a", config.model_lines["a"])


def test_the_table_prompt_replaces_the_artifact_default(tmp_path: Path) -> None:
    _, config = table(tmp_path, 'prompt_name = "query"')
    artifact = manifest(prompts=PROMPTS)
    assert default_prompt_name(served(config, artifact)) == "query"
    assert default_prompt_name(artifact) == "passage"  # the artifact's own is left alone
    shown = show(resolve(["--config", str(tmp_path / "ringserve.toml")], {})).splitlines()
    assert "path=/a prompt-name=query" in next(r for r in shown if r.startswith("models.a"))


def test_a_prompt_the_model_lacks_is_refused_naming_the_line(tmp_path: Path) -> None:
    path, config = table(tmp_path, 'prompt-name = "document"')
    said = f"{path}:4: key models.a.prompt-name: 'document' is not one of the model's prompts"
    with pytest.raises(ModelTableError, match=re.escape(said + ": passage, query")):
        served(config, manifest(prompts=PROMPTS))
    with pytest.raises(ModelTableError, match=re.escape(said + ": none")):
        served(config, manifest())


def test_a_bad_priority_is_refused_naming_the_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape(
        f"{tmp_path / 'ringserve.toml'}:4: key models.a.priority: bad value: priority must be "
        "interactive or bulk, got 'urgent'"
    )):  # fmt: skip
        table(tmp_path, 'priority = "urgent"')
    assert table(tmp_path, 'priority = "Bulk"')[1].model_options["a"]["priority"] == "bulk"


def test_the_level_is_the_lowest_of_the_model_the_key_and_the_request() -> None:
    """A bulk model's texts are bulk whatever the key or the request asks; an interactive
    model's are what the key and the request lower them to."""
    dispatcher = Dispatcher(64)
    dispatcher.table.open(1, "nightly", 0, BULK)
    admission = Admission(dispatcher, lambda: "full", 1.0)
    key = Tenant("t", priority=INTERACTIVE)
    assert admission.level(key, INTERACTIVE, 1) == BULK
    assert admission.level(None, None, 1) == BULK
    assert admission.level(key, None, 0) == INTERACTIVE
    assert admission.level(key, BULK, 0) == BULK
    assert admission.level(Tenant("t", priority=BULK), INTERACTIVE, 0) == BULK


def test_max_length_may_lower_the_artifact_never_raise_it(tmp_path: Path) -> None:
    path, config = table(tmp_path, "max-length = 64")
    assert served(config, manifest(128)).max_length == 64
    assert served(config, manifest(64)).max_length == 64
    with pytest.raises(ModelTableError, match=re.escape(
        f"{path}:4: key models.a.max-length: 64 is over the artifact's max_length of 32"
    )):  # fmt: skip
        served(config, manifest(32))
