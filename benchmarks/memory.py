"""The whole process tree's memory (PSS: shared pages split between the processes that map them)
of `ringserve serve` with the default options, at start and after a load, per process role.

Optionally the same for another checkout's code (`--before /work/main`: that tree's server on
its own default artifact) in the same run, and a peer's tree, so the figures sit side by side.

    python -m benchmarks.memory [--before DIR] [--seconds 8] [--server-args "..."]
    python -m benchmarks.memory --against "--precision auto" --repeat 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import uvloop

from devkit.http import classify_request
from devkit.launcher import SST2, Launched, load_texts
from devkit.load import run_load

MIB = 1 << 20
SETTLE_S = 2.0  # after the load: a worker idle for a second trims its heap (process/trim.py)


def pss(proc: psutil.Process) -> float:
    try:
        return float(proc.memory_full_info().pss) / MIB
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0.0


def tree_pss(pid: int, roles: dict[int, str] | None = None) -> dict[str, float]:
    """MiB of PSS by role ("front-end", each worker's state, "zygote", "other") and "tree"."""
    root = psutil.Process(pid)
    out: dict[str, float] = {"front-end": pss(root)}
    for child in root.children(recursive=True):
        role = (roles or {}).get(child.pid) or _role(_cmdline(child))
        key, n = role, 1
        while key in out:
            n += 1
            key = f"{role} {n}"
        out[key] = pss(child)
    out["tree"] = sum(out.values())
    return out


def _role(cmdline: list[str]) -> str:
    line = " ".join(cmdline)
    if "resource_tracker" in line:
        return "resource tracker"
    return "zygote" if "multiprocessing.spawn" in line or "spawn_main" in line else "other"


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def server_roles(srv: Launched) -> dict[int, str]:
    rows = srv.ctl({"cmd": "status"})["workers"]
    return {int(w["pid"]): "worker" if w["state"] == "ready" else str(w["state"]) for w in rows}


def _wait_pool(srv: Launched, timeout: float = 120.0) -> None:
    """Until every worker and spare is up: none is still starting."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = [w["state"] for w in srv.ctl({"cmd": "status"})["workers"]]
        if states and all(s in ("ready", "spare") for s in states):
            return
        time.sleep(0.1)
    raise TimeoutError("the pool did not settle")


def measure(name: str, args: list[str], seconds: float, cwd: Path | None) -> dict[str, Any]:
    texts = [classify_request(t) for t in load_texts(SST2, 1000)]
    with tempfile.TemporaryDirectory(prefix="ringserve-memory-") as tmp:
        srv = Launched(tmp, args, binary=False, tree=cwd)
        try:
            srv.wait_ready()
            _wait_pool(srv)
            start = tree_pss(srv.pid, server_roles(srv))
            load = uvloop.run(run_load(srv.port, texts, 32, seconds))
            after = tree_pss(srv.pid, server_roles(srv))
            time.sleep(SETTLE_S)  # idle workers give malloc's free memory back (process/trim.py)
            settled = tree_pss(srv.pid, server_roles(srv))
        finally:
            srv.terminate()
    print(f"\n{name}: {load.rps:.0f} req/s at c=32 for {seconds:.0f} s")
    print(f"| process | PSS MiB at start | after the load | {SETTLE_S:.0f} s later |")
    print("| --- | --- | --- | --- |")
    for key in sorted(set(start) | set(after), key=lambda k: (k == "tree", k)):
        row = [start.get(key, 0), after.get(key, 0), settled.get(key, 0)]
        print(f"| {key} | " + " | ".join(f"{v:.1f}" for v in row) + " |")
    return {"start": start, "after": after, "settled": settled}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, default=None, help="another checkout to compare")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--server-args", default="", help="extra `ringserve serve` options")
    p.add_argument(
        "--against",
        default=None,
        help="the same checkout again with these options instead (e.g. '--precision auto' "
        "against the defaults), each run --repeat times, alternating",
    )
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args(argv)
    extra = args.server_args.split()
    if args.against is not None:
        return against(extra, args.against.split(), args.seconds, args.repeat)
    runs = {"this checkout": measure("this checkout", extra, args.seconds, None)}
    if args.before is not None:
        runs["before"] = measure(f"before ({args.before})", extra, args.seconds, args.before)
        for when in ("start", "after", "settled"):
            a, b = runs["this checkout"][when]["tree"], runs["before"][when]["tree"]
            print(f"tree PSS {when}: {a:.0f} MiB against {b:.0f} MiB before ({a / b:.2f}x)")
    return 0


def against(base: list[str], other: list[str], seconds: float, repeat: int) -> int:
    """The tree's PSS with `other` options against `base`, runs alternating, and the ratio of
    each pair: the figure an option's memory is judged by."""
    from benchmarks.serving import cpu_name, simd_flags

    names = (" ".join(base) or "defaults", " ".join(other))
    print(f"machine: {cpu_name()}, {os.cpu_count()} cpus, flags {simd_flags()}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)  # fmt: skip
    trees: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for _ in range(repeat):
        for name, opts in zip(names, (base, other), strict=True):
            run = measure(name, opts, seconds, None)
            trees[name].append({when: run[when]["tree"] for when in ("start", "after", "settled")})
    print(f"\n| tree PSS MiB | {names[0]} | {names[1]} | ratio |")
    print("| --- | --- | --- | --- |")
    for when in ("start", "after", "settled"):
        for i in range(repeat):
            a, b = trees[names[0]][i][when], trees[names[1]][i][when]
            print(f"| {when} (run {i + 1}) | {a:.1f} | {b:.1f} | {b / a:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
