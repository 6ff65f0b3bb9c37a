"""--precision auto on the default model, served: it resolves at start to a concrete precision
from int8's published cost, says which and why on stderr and in /v1/model, and serves it; and
--precision bf16 on a CPU without AVX512_BF16 or AMX is refused at start, naming the flags."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from ringserve.service.precision import BF16_FLAGS, cpu_flags
from ringserve.workers.artifact import load_manifest

from devkit.server import ServerProc, serving

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def auto(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    args = ["--precision", "auto", "--workers", "1", "--spares", "0"]
    with serving(ServerProc(tmp_path_factory.mktemp("auto"), args)) as srv:
        yield srv


def test_auto_names_what_it_serves_and_why(auto: ServerProc, default_model: str) -> None:
    cost = load_manifest(default_model).int8
    doc = json.loads(auto.request("GET", "/v1/model")[2])
    if cost["argmax_agreement"] >= 0.99 and cost["accuracy_cost"] <= 0.005:
        pytest.skip("this artifact's int8 is faithful: auto serves it (tests/unit covers the rule)")
    # int8 is not faithful on the default model today: fp32 serves, and the reason is its figure
    assert doc["precision"] == "fp32" and doc["runtime"] == "onnx"
    why = doc["precision_chosen_by"]
    assert why.startswith("auto: int8 ") and f"of {cost['texts']} texts" in why
    assert "int8" not in doc  # int8's cost is shown when int8 serves
    said = [x for x in auto.logs().splitlines() if x.startswith("ringserve: --precision auto")]
    assert said == [f"ringserve: --precision auto: serving fp32 ({why})"]
    assert auto.classify("a warm and funny film")["label"] in ("negative", "positive")


@pytest.mark.skipif(bool(cpu_flags() & set(BF16_FLAGS)), reason="this CPU has bf16")
def test_bf16_on_a_cpu_without_it_is_refused_at_start(tmp_path: Path) -> None:
    srv = ServerProc(tmp_path, ["--precision", "bf16", "--device", "cpu"])
    assert srv.wait_exit(60) != 0
    assert "--precision bf16 needs a CPU with avx512_bf16 or amx_bf16" in srv.logs()
