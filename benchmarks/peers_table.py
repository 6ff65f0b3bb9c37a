"""The tables of one `benchmarks.peers` run: its rows as the benchmark prints them, the full table
it ends with, whether issue 60's bounds hold, and README's table of ratios read back from the
results file.

    python -m benchmarks.peers_table [RESULTS]     # README's table (default: the newest run)

A results file holds a `machine: NAME, N cpus, flags ...` line, a line `CONFIG: not run: PEER:
WHY` for each server that did not run, one `CONFIG: NAME: SETTING` line a server, and one JSON
line a (config, mix, concurrency).
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import machines

RESULTS = Path(__file__).with_name("results")
NAMES = {"infinity": "Infinity", "litserve": "LitServe", "pytriton": "PyTriton"}
MIXES = {"short": "short (SST-2)", "long": "long (AG News)"}
BOUND = 2.0  # issue 60: ringserve at least twice every peer (fp32 at c=1; best in every cell)


def row(config: str, mix: str, c: int, sides: list[Any]) -> dict[str, Any]:
    """One (config, mix, c) of the run: each side's best draw, and ringserve's rate over each
    peer's."""
    out: dict[str, Any] = {"config": config, "mix": mix, "c": c, "sides": {}}
    for s in sides:
        d = s.best[mix, c]
        out["sides"][s.name] = {
            "per_s": round(d.load.rps, 1), "p50_ms": round(d.load.pct(50), 1),
            "p99_ms": round(d.load.pct(99), 1), "cpu_ms": round(d.cpu_ms, 2),
            "others_cpu_pct": round(d.idle_pct, 1), "cosine_min": round(s.cosine_min, 6),
        }  # fmt: skip
    out["ratio"] = ratios(out["sides"])
    return out


def ratios(sides: dict[str, dict[str, float]]) -> dict[str, float]:
    ours = sides.get("ringserve")
    if ours is None:
        return {}
    return {n: round(ours["per_s"] / v["per_s"], 2) for n, v in sides.items() if n != "ringserve"}


@dataclass
class Run:
    """What a results file of benchmarks.peers says."""

    path: Path
    machine: str  # the `machine:` line's value
    rows: list[dict[str, Any]]
    not_run: dict[str, dict[str, str]] = field(default_factory=dict)  # config -> peer -> why
    settings: dict[str, dict[str, str]] = field(default_factory=dict)  # config -> name -> what


def read(path: Path) -> Run:
    text = path.read_text(encoding="utf-8")
    found = re.search(r"^machine: (.*)$", text, re.M)
    run = Run(path, found[1] if found else machines.NOT_RECORDED, [])
    for line in text.splitlines():
        if line.startswith("{"):
            got = json.loads(line)
            if "config" in got and "sides" in got:
                run.rows.append(got)
        elif m := re.match(r"^(\w+): not run: (\w+): (.*)$", line):
            run.not_run.setdefault(m[1], {})[m[2]] = m[3]
        elif m := re.match(r"^(\w+): (ringserve|infinity|litserve|pytriton): (.*)$", line):
            run.settings.setdefault(m[1], {})[m[2]] = m[3]
    return run


def peers_of(rows: list[dict[str, Any]]) -> list[str]:
    seen = {n for r in rows for n in r["sides"]}
    return [n for n in NAMES if n in seen]


def full_table(rows: list[dict[str, Any]]) -> str:
    """Every row: each server's texts/s, ringserve's over each peer's, and each P50."""
    peers = peers_of(rows)
    head = ["config", "mix", "c", "ringserve/s"]
    for n in peers:
        head += [f"{NAMES[n]}/s", f"ringserve / {NAMES[n]}"]
    head += ["P50 ms, " + " / ".join(["ringserve", *(NAMES[n] for n in peers)])]
    head += ["cosine min to fp32, " + " / ".join(["ringserve", *(NAMES[n] for n in peers)])]
    lines = ["| " + " | ".join(head) + " |", "| --- " * len(head) + "|"]
    for r in rows:
        sides = r["sides"]

        def cell(name: str, key: str, sides: dict[str, Any] = sides) -> str:
            return str(sides[name][key]) if name in sides else "-"

        cells = [r["config"], r["mix"], str(r["c"]), cell("ringserve", "per_s")]
        for n in peers:
            cells += [cell(n, "per_s"), str(r["ratio"].get(n, "-"))]
        cells.append(" / ".join(cell(n, "p50_ms") for n in ["ringserve", *peers]))
        cells.append(" / ".join(cell(n, "cosine_min") for n in ["ringserve", *peers]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def acceptance(rows: list[dict[str, Any]]) -> list[str]:
    """Issue 60's bounds on the run: fp32 >= 2x every peer's fp32 at c=1, short and long; best
    >= 2x every peer at its best in every cell. Each with its lowest ratio."""
    out = []
    for config, cells in (("fp32", [r for r in rows if r["config"] == "fp32" and r["c"] == 1]),
                          ("best", [r for r in rows if r["config"] == "best"])):  # fmt: skip
        found = [(v, r["mix"], r["c"], n) for r in cells for n, v in r["ratio"].items()]
        where = "at c=1" if config == "fp32" else "in every cell"
        if not found:
            out.append(f"{config} >= {BOUND:g}x every peer {where}: not measured")
            continue
        low = min(found)
        holds = "holds" if low[0] >= BOUND else "does NOT hold"
        out.append(f"{config} >= {BOUND:g}x every peer {where}: {holds} (lowest {low[0]:.2f}, "
                   f"{NAMES[low[3]]} on {low[1]} texts at c={low[2]})")  # fmt: skip
    return out


def caption(run: Run) -> str:
    cpus = re.search(r", (\d+) cpus, flags (.*)$", run.machine)
    name = run.machine.split(",")[0]
    facts = f"CPU model name {name}, {cpus[1]} vCPUs, flags {cpus[2]}" if cpus else run.machine
    return (f"From {machines.citation(run.path)}; {facts}; no GPU. ringserve's texts/s over each "
            "peer's, one text a request, the servers in turns on the same cores; made by "
            "`python -m benchmarks.peers_table`:")  # fmt: skip


def readme_table(path: Path) -> str:
    """README's table: ringserve's texts/s and its ratio to each peer, by configuration, texts
    and concurrency, with its caption and what each server ran in each configuration."""
    run = read(path)
    peers = [n for n in NAMES if any(n in r["sides"] for r in run.rows)]
    peers += [n for n in NAMES if n not in peers and any(n in w for w in run.not_run.values())]
    head = ["precision", "texts", "c", "ringserve texts/s", *(f"/ {NAMES[n]}" for n in peers)]
    lines = [caption(run), "", "| " + " | ".join(head) + " |", "| --- " * len(head) + "|"]
    for r in run.rows:
        cells = [r["config"], MIXES.get(r["mix"], r["mix"]), str(r["c"])]
        ours = r["sides"].get("ringserve")
        cells.append(f"{ours['per_s']:,.1f}" if ours else "not run")
        cells += [f"{r['ratio'][n]:.2f}x" if n in r["ratio"] else "not run" for n in peers]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for config, settings in run.settings.items():
        said = "; ".join(f"{NAMES.get(n, n)}: {what}" for n, what in settings.items())
        lines.append(f"- {config}: {said}")
    for config, why in run.not_run.items():
        for n, reason in why.items():
            lines.append(f"- {config}: {NAMES.get(n, n)} not run: {reason}")
    return "\n".join(lines)


def newest() -> Path:
    runs = sorted(RESULTS.glob("peers-2*.txt"))
    if not runs:
        raise SystemExit("no benchmarks/results/peers-*.txt: run `python -m benchmarks.peers`")
    return runs[-1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peers_table", description=__doc__)
    p.add_argument("results", nargs="?", type=Path, help="a peers-*.txt (default: the newest)")
    args = p.parse_args(argv)
    print(readme_table(args.results or newest()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
