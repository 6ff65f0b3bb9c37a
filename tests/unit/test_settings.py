"""service/config/settings.py: every option declared once, read from the command line, the
environment (RINGSERVE_<NAME>) or its default, and the machine facts the defaults follow."""

from __future__ import annotations

import argparse
import os
import re
import tomllib
from pathlib import Path

import pytest
from ringserve.service.config.file import ConfigError, resolve, show
from ringserve.service.config.settings import (
    MODEL_SETTINGS,
    SETTINGS,
    Config,
    add_arguments,
    cgroup_cpu_limit,
    config_reference,
    from_namespace,
    parse_buckets,
    parse_flag,
    parse_start_method,
    toml_schema,
)

from devkit.launcher import ROOT


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


def test_defaults_are_the_configs_own(clean_env: pytest.MonkeyPatch) -> None:
    assert parsed() == Config()


def test_the_environment_sets_a_default_and_the_command_line_wins(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("RINGSERVE_MAX_BATCH", "7")
    clean_env.setenv("RINGSERVE_REUSE_PORT", "1")
    clean_env.setenv("RINGSERVE_BUCKETS", "64,16")
    env = parsed()
    assert (env.max_batch, env.reuse_port, env.buckets) == (7, True, (16, 64))
    argv = parsed("--max-batch", "9", "--reuse-port", "0", "--buckets", "32")
    assert (argv.max_batch, argv.reuse_port, argv.buckets) == (9, False, (32,))
    assert parsed("--reuse-port").reuse_port is True  # a flag may stand alone


def test_every_setting_names_its_environment_variable() -> None:
    for s in SETTINGS:
        assert s.env == "RINGSERVE_" + s.name.upper().replace("-", "_")
        assert s.help and s.attr in Config.__dataclass_fields__


def test_values_outside_the_contract_are_refused() -> None:
    assert parse_buckets("32,16,16") == (16, 32) and parse_buckets("") == ()
    with pytest.raises(ValueError, match="above 2"):
        parse_buckets("2,16")
    assert parse_flag("on") is True and parse_flag("") is False
    with pytest.raises(ValueError):
        parse_flag("maybe")
    assert parse_start_method("fork") == "zygote"  # fork is the zygote's way of starting
    with pytest.raises(ValueError):
        parse_start_method("thread")


def test_cgroup_cpu_limit_formats(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    (v2 / "pod").mkdir(parents=True)
    (v2 / "pod" / "cpu.max").write_text("150000 100000\n")
    proc = tmp_path / "cgroup-v2"
    proc.write_text("0::/pod\n")
    assert cgroup_cpu_limit(str(v2), str(proc)) == 1.5
    (v2 / "pod" / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(str(v2), str(proc)) is None
    v1 = tmp_path / "v1" / "cpu,cpuacct" / "pod"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("300000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    proc.write_text("4:cpu,cpuacct:/pod\n1:name=systemd:/pod\n")
    assert cgroup_cpu_limit(str(tmp_path / "v1"), str(proc)) == 3.0


def test_lanes_pair_the_cores_for_one_onnx_model_with_default_workers() -> None:
    """Two lanes a worker, a worker per pair of cores, only where a lane can serve; the
    dispatcher's hold grows with the lanes."""
    c = Config()
    assert "pair" in c.resolve_lanes("cpu", ["onnx"], cores=2)
    assert (c.lanes, c.lane_count(), c.hold_cost("cpu")) == (2, 2, 2 * Config().hold_cost("cpu"))
    c = Config()
    c.resolve_lanes("cpu", ["onnx"], cores=4)
    assert c.lanes == 2
    c = Config()  # bf16 on OpenVINO: the lanes share one compiled model
    assert "one model on OpenVINO" in c.resolve_lanes("cpu", ["openvino"], cores=2)
    assert c.lanes == 2
    for cores, config, device, runtimes in [
        (3, Config(), "cpu", ["onnx"]),  # odd cores do not pair
        (1, Config(), "cpu", ["onnx"]),
        (2, Config(workers=2), "cpu", ["onnx"]),  # an explicit layout is kept as it was
        (2, Config(threads=2), "cpu", ["onnx"]),
        (2, Config(), "cpu", ["torch"]),
        (2, Config(), "cuda:0", ["torch"]),
        (2, Config(), "cpu", ["onnx", "onnx"]),  # many models share a worker's turns
        (2, Config(model_control="explicit"), "cpu", ["onnx"]),
    ]:
        why = config.resolve_lanes(device, runtimes, cores=cores)
        assert config.lanes == 1 and why, (cores, config, device, runtimes)


def test_lanes_asked_for_are_kept_or_refused_with_the_reason() -> None:
    c = Config(lanes=2, workers=1)
    assert c.resolve_lanes("cpu", ["onnx"], cores=3) == "as --lanes asks"
    assert (c.lanes, c.serving_workers()) == (2, 1)
    with pytest.raises(ValueError, match="runtime is neither ONNX Runtime nor OpenVINO"):
        Config(lanes=2).resolve_lanes("cpu", ["torch"], cores=2)
    with pytest.raises(ValueError, match="more than one model"):
        Config(lanes=2).resolve_lanes("cpu", ["onnx", "onnx"], cores=2)
    with pytest.raises(ValueError, match="at least 1"):
        Config(lanes=0).resolve_lanes("cpu", ["onnx"], cores=2)
    assert Config(lanes=1, threads=4).resolve_lanes("cpu", ["onnx"], cores=2) == "as --lanes asks"


# -- the config file (service/config/file.py) ------------------------------------------------------
FILE = """# a server of two models
port = 9000
max_batch = 8
reuse-port = true
buckets = [64, 16]
memory-budget = "8G"

[models.a]
path = "/models/a"
long-text = "refuse"

[models.b]
path = "/models/b"
version = 2
max_batch = 4
runtime = "torch"
"""


def test_the_file_sits_under_the_environment_and_the_flags(
    tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ringserve.toml"
    path.write_text(FILE)
    r = resolve(["--config", str(path)], {"RINGSERVE_PORT": "9100"})
    c = r.config
    assert (c.port, c.max_batch, c.reuse_port, c.buckets, c.memory_budget) == (
        9100, 8, True, (16, 64), 8 << 30,
    )  # fmt: skip
    assert r.sources["port"] == "env RINGSERVE_PORT"
    assert r.sources["max-batch"] == f"{path}:3" and r.sources["threads"] == "default"
    assert c.named_models == (("a", "/models/a"), ("b", "/models/b"))
    assert c.for_model("a").long_text == "refuse" and c.for_model("a").max_batch == 8
    assert (c.for_model("b").max_batch, c.for_model("b").runtime) == (4, "torch")
    assert c.model_version("b") == 2 and c.model_version("a") is None
    flagged = resolve(["--config", str(path), "--max-batch", "3", "--port", "1"], {})
    assert (flagged.config.max_batch, flagged.config.port) == (3, 1)
    assert flagged.sources["max-batch"] == "flag"
    shown = show(flagged)
    assert "models.b             path=/models/b max-batch=4 runtime=torch version=2" in shown
    # the file named by its variable, as a container would
    assert resolve([], {"RINGSERVE_CONFIG": str(path)}).config.port == 9000


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("prot = 1", ":3: key prot: unknown key"),
        ('port = "x"', ":3: key port: expected integer, got string 'x'"),
        ("threads = 1.5", ":3: key threads: expected integer, got float"),
        ('long_text = "wrap"', ":3: key long_text: bad value: long-text must be"),
        ('[models.a]\npath = "/a"\nprompt-name = 3',
         ":5: key models.a.prompt-name: expected string, got integer 3"),
        ('[models.a]\npath = "/a"\nmax-length = 2',
         ":5: key models.a.max-length: bad value: max-length must be at least 3, got '2'"),
        ('[models.a]\npath = "/a"\ncolour = 1', ":5: key models.a.colour: unknown key"),
        ('[models.a]\nruntime = "onnx"', ":3: key models.a: a model table needs a path"),
        ("port =", "not valid TOML"),
    ],
)  # fmt: skip
def test_a_bad_file_is_refused_naming_the_key_and_the_line(
    tmp_path: Path, text: str, said: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(f"# bad\n\n{text}\n")
    with pytest.raises(ConfigError, match=re.escape(str(path)) + ".*" + re.escape(said)):
        resolve(["--config", str(path)], {})


def test_the_reference_page_and_the_schema_come_from_the_settings() -> None:
    page = (ROOT / "docs" / "reference" / "config.md").read_text(encoding="utf-8")
    assert page.strip() == config_reference().strip(), "regenerate docs/reference/config.md"
    schema = toml_schema()
    for s in SETTINGS:
        assert s.name == "config" or s.name in schema["properties"]
        assert s.name == "config" or f"`{s.env}`" in page
    table = schema["properties"]["models"]["additionalProperties"]["properties"]
    assert set(table) == {n for m in MODEL_SETTINGS if m.served for n in (m.name, m.attr)}


def test_the_example_in_the_api_docs_checks(tmp_path: Path) -> None:
    page = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    example = re.search(r"```toml\n(.*?)```", page, re.S)
    assert example is not None
    path = tmp_path / "ringserve.toml"
    path.write_text(example.group(1))
    c = resolve(["--config", str(path)], {}).config
    assert c.model_version("topics") == 3 and c.for_model("topics").max_delay_ms == 2.0
    assert (c.for_model("sentiment").long_text, c.operator_port) == ("refuse", 9000)
    # the JSON Schema an editor checks a file by takes the example, and not a bad key
    jsonschema = pytest.importorskip("jsonschema")
    doc = tomllib.loads(example.group(1))
    jsonschema.validate(doc, toml_schema())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**doc, "prot": 1}, toml_schema())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"models": {"a": {"path": "/a", "colour": "q"}}}, toml_schema())
