"""benchmarks/peers.py's choices (each configuration's precision and options, each peer's wire,
a busy idler stopped during the others' turns) and benchmarks/peers_table.py's reading of a
results file back into README's table of ratios and issue 60's bounds. No timing: a results
file is written here by hand."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import peers_table
from benchmarks.peers import dtype, options, peer_plan, reason, ringserve_args, stopped
from benchmarks.peers_embed import WIRES, Side
from benchmarks.serving import stop_group

AMX = {"avx2", "avx512f", "amx_bf16", "amx_int8"}
ZEN4 = {"avx2", "avx512f", "avx512_bf16"}
AVX2 = {"avx2", "fma"}


def test_best_is_bf16_only_where_the_cpu_has_it() -> None:
    assert [dtype("best", f) for f in (AMX, ZEN4, AVX2)] == ["bfloat16", "bfloat16", "float32"]
    assert {dtype("fp32", f) for f in (AMX, ZEN4, AVX2)} == {"float32"}


def test_ringserve_serves_without_its_answer_cache_and_auto_at_its_best() -> None:
    assert ringserve_args("fp32", []) == ["--cache-bytes", "0"]
    assert ringserve_args("best", ["--workers", "2"]) == [
        "--cache-bytes", "0", "--workers", "2", "--precision", "auto",
    ]  # fmt: skip


def test_each_peer_gets_its_dtype_and_its_wire(tmp_path: Path) -> None:
    plans = {n: peer_plan(n, "best", ZEN4, tmp_path, tmp_path) for n in peers_table.NAMES}
    assert "--dtype bfloat16" in plans["infinity"].setting
    assert "torch bfloat16" in plans["litserve"].setting
    assert "torch bfloat16" in plans["pytriton"].setting
    assert [plans[n].wire for n in peers_table.NAMES] == ["openai", "plain", "kserve"]
    assert "float32" in peer_plan("pytriton", "best", AVX2, tmp_path, tmp_path).setting


def test_each_wire_writes_one_text_and_reads_its_vector() -> None:
    triton = Side("pytriton", 1, 1, "/v2/models/minilm/infer", wire="kserve")
    assert json.loads(triton.body("a text")) == {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": ["a text"]}]
    }
    infinity = Side("infinity", 1, 1, "/embeddings", {"model": "m"})
    assert json.loads(infinity.body("x")) == {"input": "x", "model": "m"}
    answers = {
        "openai": {"data": [{"index": 0, "embedding": [0.5, 1.5]}]},
        "plain": {"embedding": [0.5, 1.5]},
        "kserve": {"outputs": [{"name": "embedding", "shape": [1, 2], "data": [0.5, 1.5]}]},
    }
    for wire, answer in answers.items():
        assert WIRES[wire][1](answer) == [0.5, 1.5], wire


def test_options_keep_a_fixed_order_of_configs_and_peers() -> None:
    args = options(["--configs", "best,fp32", "--peers", "pytriton,infinity", "--levels", "1,32"])
    assert (args.configs, args.peers, args.levels) == (["fp32", "best"], ["infinity", "pytriton"],
                                                       [1, 32])  # fmt: skip


def side(per_s: float, p50: float = 5.0) -> dict[str, float]:
    return {"per_s": per_s, "p50_ms": p50, "p99_ms": 9.0, "cpu_ms": 3.0, "others_cpu_pct": 0.5,
            "cosine_min": 0.99999}  # fmt: skip


def results(tmp_path: Path) -> Path:
    """A run as benchmarks.peers writes one: PyTriton did not start in the best configuration."""
    rows = []
    for config in ("fp32", "best"):
        for mix in ("short", "long"):
            for c in (1, 32):
                k = 2.0 if config == "best" else 1.0
                sides = {"ringserve": side(300.0 * k), "infinity": side(100.0),
                         "litserve": side(120.0), "pytriton": side(150.0)}  # fmt: skip
                if config == "best":
                    del sides["pytriton"]
                if (config, mix, c) == ("fp32", "long", 1):
                    sides["ringserve"] = side(200.0)  # 1.33x PyTriton: under the bound
                rows.append({"config": config, "mix": mix, "c": c, "sides": sides,
                             "ratio": peers_table.ratios(sides)})  # fmt: skip
    path = tmp_path / "peers-20261207T1600Z.txt"
    lines = [
        "# python -m benchmarks.peers",
        "machine: AMD EPYC, 2 cpus, flags avx2 avx512f avx512_vnni avx512_bf16",
        "fp32: ringserve: --cache-bytes 0: fp32 on onnx",
        "fp32: infinity: infinity_emb v2, torch engine, --dtype float32",
        "best: not run: pytriton: PyTriton exited with 1: | load failed",
        "best: ringserve: --cache-bytes 0 --precision auto: bf16 on openvino",
        *(json.dumps(r) for r in rows),
        "| config | mix | c |",
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_results_file_reads_back_into_its_rows_settings_and_peers_not_run(
    tmp_path: Path,
) -> None:
    run = peers_table.read(results(tmp_path))
    assert run.machine == "AMD EPYC, 2 cpus, flags avx2 avx512f avx512_vnni avx512_bf16"
    assert len(run.rows) == 8
    assert run.not_run == {"best": {"pytriton": "PyTriton exited with 1: | load failed"}}
    assert run.settings["best"] == {
        "ringserve": "--cache-bytes 0 --precision auto: bf16 on openvino"
    }
    assert run.rows[0]["ratio"] == {"infinity": 3.0, "litserve": 2.5, "pytriton": 2.0}


def test_readme_table_is_ratios_with_its_file_date_machine_and_flags(tmp_path: Path) -> None:
    table = peers_table.readme_table(results(tmp_path))
    lines = table.splitlines()
    assert lines[0].startswith(
        "From `benchmarks/results/peers-20261207T1600Z.txt` (2026-12-07, AMD EPYC (AVX-512)); "
        "CPU model name AMD EPYC, 2 vCPUs, flags avx2 avx512f avx512_vnni avx512_bf16;"
    )
    assert lines[2] == (
        "| precision | texts | c | ringserve texts/s | / Infinity | / LitServe | / PyTriton |"
    )
    assert "| fp32 | short (SST-2) | 1 | 300.0 | 3.00x | 2.50x | 2.00x |" in lines
    assert "| best | long (AG News) | 32 | 600.0 | 6.00x | 5.00x | not run |" in lines
    assert "- best: PyTriton not run: PyTriton exited with 1: | load failed" in lines


def test_acceptance_names_the_lowest_ratio_and_whether_the_bound_holds(tmp_path: Path) -> None:
    rows = peers_table.read(results(tmp_path)).rows
    assert peers_table.acceptance(rows) == [
        "fp32 >= 2x every peer at c=1: does NOT hold (lowest 1.33, PyTriton on long texts at c=1)",
        "best >= 2x every peer in every cell: holds (lowest 5.00, LitServe on long texts at c=1)",
    ]
    assert peers_table.acceptance([])[0] == "fp32 >= 2x every peer at c=1: not measured"


def test_full_table_has_a_column_per_peer_and_a_dash_where_one_did_not_run(
    tmp_path: Path,
) -> None:
    table = peers_table.full_table(peers_table.read(results(tmp_path)).rows).splitlines()
    assert table[0].startswith(
        "| config | mix | c | ringserve/s | Infinity/s | ringserve / Infinity"
    )
    assert "| best | short | 1 | 600.0 | 100.0 | 6.0 | 120.0 | 5.0 | - | - |" in table[-4]


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_busy_idler_is_stopped_for_the_block_and_continued_after() -> None:
    """benchmarks.peers stops a peer that polls while idle (LitServe) during the others' turns:
    a real process in a session of its own, its state read from /proc (polled with a deadline:
    a signal's effect is not instantaneous)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            start_new_session=True)  # fmt: skip
    sleeper = Side("litserve", 1, proc.pid, "/predict", wire="plain")

    def becomes(wanted: set[str]) -> bool:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if state(proc.pid) in wanted:
                return True
            time.sleep(0.01)
        return False

    try:
        with stopped([sleeper]):
            assert becomes({"T"})
        assert becomes({"S", "R"})
    finally:
        stop_group(proc)


def test_readmes_peers_table_is_what_peers_table_makes_of_its_file() -> None:
    """Once README cites a peers-*.txt, its table is the generator's, unedited."""
    readme = (peers_table.RESULTS.parents[1] / "README.md").read_text(encoding="utf-8")
    cited = re.search(r"`benchmarks/results/(peers-\d{8}T\d{4}Z\.txt)`", readme)
    if cited is None:
        pytest.skip("README quotes no benchmarks.peers run yet")
    assert peers_table.readme_table(peers_table.RESULTS / cited[1]) in readme, (
        f"run `python -m benchmarks.peers_table benchmarks/results/{cited[1]}` and paste its table"
    )


def test_a_peer_that_did_not_start_is_said_by_its_last_error_line() -> None:
    tail = "PyTriton exited with 1:\nTraceback (most recent call last):\n  File x\n" \
           "AttributeError: '_thread.RLock' object has no attribute '_recursion_count'\n\nAt:\n" \
           "  /tmp/f/1/model.py(454): initialize\n"  # fmt: skip
    assert reason(tail) == (
        "AttributeError: '_thread.RLock' object has no attribute '_recursion_count'"
    )
    assert reason("LitServe did not answer /health in 300.0 s") == (
        "LitServe did not answer /health in 300.0 s"
    )
    assert reason("x" * 400).endswith("...") and len(reason("x" * 400)) == 300
