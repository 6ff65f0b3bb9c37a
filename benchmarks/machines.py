"""The machine each results file was measured on, as the file itself records it, and the docs'
"machines" page made from them (docs/benchmarks/machines.md, written by `python -m
benchmarks.pictures`).

A benchmark records its machine in one of three ways: a `machine: NAME, N cpus, flags ...`
line (benchmarks.serving and its kin), a `CPU: NAME; flags: avx2 yes, ...` line
(benchmarks.runtimes), or a header comment such as `2-core AMD EPYC (AVX2)`. A machine here is
the CPU's model name and the instruction sets recorded beside it; what a file does not record is
said to be not recorded, never guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).with_name("results")
PAGE = Path(__file__).parents[1] / "docs" / "benchmarks" / "machines.md"
NOT_RECORDED = "machine not recorded in the file"

MACHINE_LINE = re.compile(r"machine: ([^,;]+), (\d+) cpus, flags ([a-z0-9_ ]+)")
CPU_LINE = re.compile(r"^CPU: ([^;]+); flags: (.*)$", re.M)
HEADER = re.compile(r"(\d+)-(?:core|vCPU) (AMD EPYC|Intel[^,(;]*)([^\n]*)")
NAME_ONLY = re.compile(r"^#.*\b(AMD EPYC|Intel\(R\) Xeon\(R\)[^,;]*)", re.M)
FLAG = re.compile(r"(?<!no )\b(avx2|avx512[a-z0-9_]*|avx_vnni|amx_[a-z0-9]+)\b", re.I)


@dataclass(frozen=True)
class Machine:
    name: str  # the CPU's model name as recorded ("AMD EPYC", "Intel(R) Xeon(R) Processor")
    cpus: int | None
    flags: frozenset[str]  # the instruction sets recorded as present (lower case)
    flags_recorded: bool

    @property
    def label(self) -> str:
        """A short name the docs cite: the vendor's line and the widest instruction set."""
        short = "Intel Xeon" if "Xeon" in self.name else self.name.strip()
        if not self.flags_recorded:
            return f"{short} (flags not recorded)"
        if any(f.startswith("amx") for f in self.flags):
            return f"{short} (AMX)"
        if "avx512f" in self.flags:
            return f"{short} (AVX-512)"
        return f"{short} (AVX2)" if "avx2" in self.flags else short


def read_machine(path: Path) -> Machine | None:
    """The machine `path` records, or None when it records none."""
    text = path.read_text(encoding="utf-8", errors="replace")
    head = text[:4000]
    if m := MACHINE_LINE.search(head):
        return Machine(m[1].strip(), int(m[2]), frozenset(m[3].split()), True)
    if m := CPU_LINE.search(head):
        have = {f.split()[0] for f in m[2].split(",") if f.strip().endswith("yes")}
        return Machine(m[1].strip(), None, frozenset(have), True)
    if m := HEADER.search(head):
        flags = {f.lower() for f in FLAG.findall(m[3].split(";")[0])}
        return Machine(m[2].strip().rstrip("."), int(m[1]), frozenset(flags), bool(flags))
    if m := NAME_ONLY.search(head):
        return Machine(m[1].strip(), None, frozenset(), False)
    return None


def date_of(path: Path) -> str:
    """The run's date from the file's name (`...-20261205T2005Z.txt`, `...-2026-12-05T1343...`)."""
    m = re.search(r"(\d{4})-?(\d{2})-?(\d{2})", path.name)
    return f"{m[1]}-{m[2]}-{m[3]}" if m else "undated"


def label(path: Path) -> str:
    """What the docs say of the machine a results file was measured on."""
    machine = read_machine(path)
    return machine.label if machine is not None else NOT_RECORDED


def citation(path: Path) -> str:
    """`benchmarks/results/FILE` (DATE, MACHINE): how a figure names where it came from."""
    return f"`benchmarks/results/{path.name}` ({date_of(path)}, {label(path)})"


def results_files() -> list[Path]:
    return sorted(p for p in RESULTS.iterdir() if p.is_file())


def page() -> str:
    """docs/benchmarks/machines.md: each machine, its CPU model and flags, and its files."""
    by_label: dict[str, list[tuple[Path, Machine]]] = {}
    unrecorded: list[Path] = []
    for path in results_files():
        machine = read_machine(path)
        if machine is None:
            unrecorded.append(path)
        else:
            by_label.setdefault(machine.label, []).append((path, machine))
    out = [
        "# Benchmarks: machines",
        "",
        "<!-- generated from benchmarks/results by `python -m benchmarks.pictures` -->",
        "",
        "Every results file under `benchmarks/results/`, by the machine it records: the CPU's",
        "model name and the instruction sets the benchmark printed (it prints those that decide",
        "which runtime and precision are fastest, not the whole flags line). The development",
        "machines are shared 2-vCPU VMs with no GPU; two files of one machine here may still",
        "come from two VMs of the same CPU. A figure in these docs names its results file, its",
        "date and the machine's name below.",
        "",
    ]
    for name in sorted(by_label):
        entries = by_label[name]
        models = sorted({m.name for _, m in entries})
        flags = sorted(set().union(*(m.flags for _, m in entries)))
        cpus = sorted({m.cpus for _, m in entries if m.cpus is not None})
        out += [f"## {name}", ""]
        out.append(f"- CPU model name: {', '.join(models)}")
        out.append(f"- flags recorded: {' '.join(flags) if flags else 'none recorded'}")
        if cpus:
            out.append(f"- CPUs: {', '.join(str(c) for c in cpus)}")
        dates = sorted({date_of(p) for p, _ in entries})
        out.append(
            f"- dates: {dates[0]} to {dates[-1]}" if len(dates) > 1 else f"- date: {dates[0]}"
        )
        out += ["", "| results file | date |", "| --- | --- |"]
        out += [f"| `{p.name}` | {date_of(p)} |" for p, _ in entries]
        out.append("")
    out += [
        "## Machine not recorded",
        "",
        "These files do not say which machine ran them; a figure taken from one says so.",
        "",
        "| results file | date |",
        "| --- | --- |",
    ]
    out += [f"| `{p.name}` | {date_of(p)} |" for p in unrecorded]
    return "\n".join(out) + "\n"
