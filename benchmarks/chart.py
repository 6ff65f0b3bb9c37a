"""The README's headline comparison, read from one `benchmarks.serving` results file: the table
of ringserve against its peers (FastAPI under uvicorn, LitServe) and an SVG bar chart of it.

    python -m benchmarks.chart [RESULTS] [--svg docs/assets/serving-peers.svg] [--table]

RESULTS defaults to the run the README quotes (LATEST). The SVG is plain text, written without
a plotting library; tests/unit/test_docs.py checks that the README's table and the committed
chart are what this script makes of that file.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

from benchmarks import machines

RESULTS = Path(__file__).with_name("results")
LATEST = RESULTS / "serving-20261204T1950Z.txt"
SVG = Path(__file__).parents[1] / "docs" / "assets" / "serving-peers.svg"
PEERS = {"FastAPI": "fastapi", "LitServe": "litserve"}  # the name in the file's peer headers
LEVELS = (1, 32, 64)


@dataclass(frozen=True)
class Row:
    mix: str
    c: int
    ringserve: float
    peers: dict[str, float]  # texts/s by peer
    p99: dict[str, float]  # P99 ms by server, ringserve's included


def read_rows(path: Path = LATEST) -> list[Row]:
    """Each (mix, concurrency) with ringserve's and every peer's texts/s and P99."""
    cells: dict[tuple[str, int], dict[str, tuple[float, float, float, float]]] = {}
    peer = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("the peer: "):
            peer = next((name for name in PEERS if name in line.split(",")[0]), None)
            continue
        cols = [c.strip() for c in line.strip("|").split("|")]
        if peer is None or len(cols) != 8 or not cols[1].isdigit():
            continue
        p99_ours, p99_peer = (float(v) for v in cols[6].split("/"))
        cells.setdefault((cols[0], int(cols[1])), {})[peer] = (
            float(cols[2]), float(cols[3]), p99_ours, p99_peer
        )  # fmt: skip
    rows = []
    for (mix, c), by_peer in cells.items():
        ours = next(iter(by_peer.values()))
        rows.append(
            Row(
                mix, c, ours[0],
                {name: v[1] for name, v in by_peer.items()},
                {"ringserve": ours[2], **{name: v[3] for name, v in by_peer.items()}},
            )
        )  # fmt: skip
    return rows


def run_facts(path: Path = LATEST) -> str:
    """The machine line of the run."""
    text = path.read_text(encoding="utf-8")
    found = re.search(r"^machine: (.*)$", text, re.M)
    return found[1] if found else "machine not recorded"


def ceilings(path: Path = LATEST) -> dict[tuple[str, int], float]:
    """The fastest fp32 ceiling (the model alone in pinned processes) of each (mix, c)."""
    out: dict[tuple[str, int], float] = {}
    header = None
    for line in path.read_text(encoding="utf-8").splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| mix | c |"):
            header = cols if "fastest fp32 ceiling/s" in cols else None
        elif header is not None and line.startswith("|") and len(cols) == len(header):
            if cols[1].isdigit():
                out[(cols[0], int(cols[1]))] = float(cols[header.index("fastest fp32 ceiling/s")])
        elif not line.startswith("|"):
            header = None
    return out


def caption(path: Path = LATEST) -> str:
    """Where the table's figures come from: the results file, its date and its machine."""
    return f"From {machines.citation(path)}, 2 vCPUs, no GPU; made by `python -m benchmarks.chart`:"


def markdown_table(path: Path = LATEST, levels: tuple[int, int] = (1, 32)) -> str:
    """Texts/s and P99 at c=1 beside c=32, for the model alone (the ceiling), ringserve and each
    peer, with its caption."""
    one, many = levels
    rows = {(r.mix, r.c): r for r in read_rows(path)}
    ceiling = ceilings(path)
    lines = [
        caption(path),
        "",
        f"| texts | server | c={one} texts/s | c={one} P99 ms "
        f"| c={many} texts/s | c={many} P99 ms |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for mix in dict.fromkeys(r.mix for r in rows.values()):
        a, b = rows[(mix, one)], rows[(mix, many)]
        lines.append(
            f"| {mix} | the model alone, 2 pinned processes (the ceiling) "
            f"| {ceiling[(mix, one)]:.1f} | - | {ceiling[(mix, many)]:.1f} | - |"
        )
        lines.append(
            f"| {mix} | **ringserve** | **{a.ringserve:.1f}** | {a.p99['ringserve']:g} "
            f"| **{b.ringserve:.1f}** | {b.p99['ringserve']:g} |"
        )
        for k in PEERS:
            lines.append(
                f"| {mix} | {k} | {a.peers[k]:.1f} | {a.p99[k]:g} "
                f"| {b.peers[k]:.1f} | {b.p99[k]:g} |"
            )
    return "\n".join(lines)


COLORS = {"ringserve": "#3b6fb6", "FastAPI": "#e39a3b", "LitServe": "#8c8c8c"}


def svg_chart(path: Path = LATEST, levels: tuple[int, ...] = (1, 32)) -> str:
    """Grouped bars: texts/s per (mix, concurrency), one bar per server, and the ceiling (the
    model alone) drawn as a dashed line over each group."""
    rows = [r for r in read_rows(path) if r.c in levels]
    servers = ["ringserve", *PEERS]
    width, height, left, top, bottom = 720, 360, 60, 50, 60
    plot_h = height - top - bottom
    ceiling = ceilings(path)
    top_value = max(max(r.ringserve, *r.peers.values(), ceiling[(r.mix, r.c)]) for r in rows)
    scale = plot_h / (top_value * 1.1)
    group_w = (width - left - 20) / len(rows)
    bar_w = group_w / (len(servers) + 1)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f"<title>Texts/s served, ringserve and its peers ({path.name})</title>",
        f'<rect width="{width}" height="{height}" fill="#fff"/>',
        f'<text x="{left}" y="22" font-size="14" font-weight="bold">Texts a second served, '
        f"one text a request (higher is better)</text>",
        f'<text x="{left}" y="40" fill="#555">benchmarks/results/{path.name} '
        f"({machines.date_of(path)}, {machines.label(path)}, 2 vCPUs)</text>",
    ]
    for tick in range(0, int(top_value * 1.1) + 1, 100):
        y = top + plot_h - tick * scale
        out.append(f'<line x1="{left}" x2="{width - 20}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{tick}</text>')
    for i, r in enumerate(rows):
        x0 = left + i * group_w + bar_w / 2
        values = {"ringserve": r.ringserve, **r.peers}
        for j, name in enumerate(servers):
            h = values[name] * scale
            x, y = x0 + j * bar_w, top + plot_h - h
            out.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w - 2:.1f}" height="{h:.1f}" '
                f'fill="{COLORS[name]}"/>'
            )
            out.append(
                f'<text x="{x + bar_w / 2 - 1:.1f}" y="{y - 4:.1f}" text-anchor="middle" '
                f'font-size="10">{values[name]:.0f}</text>'
            )
        cy = top + plot_h - ceiling[(r.mix, r.c)] * scale
        x_end = x0 + bar_w * len(servers)
        out.append(
            f'<line x1="{x0 - 2:.1f}" x2="{x_end:.1f}" y1="{cy:.1f}" y2="{cy:.1f}" '
            f'stroke="#333" stroke-dasharray="5 3"/>'
        )
        label = f"{r.mix} texts, c={r.c}"
        out.append(
            f'<text x="{x0 + bar_w * len(servers) / 2:.1f}" y="{top + plot_h + 18}" '
            f'text-anchor="middle">{label}</text>'
        )
    for j, name in enumerate(servers):
        x = left + j * 130
        box = f'x="{x}" y="{height - 22}" width="12" height="12"'
        out.append(f'<rect {box} fill="{COLORS[name]}"/>')
        out.append(f'<text x="{x + 18}" y="{height - 12}">{name}</text>')
    x = left + len(servers) * 130
    out.append(
        f'<line x1="{x}" x2="{x + 14}" y1="{height - 16}" y2="{height - 16}" stroke="#333" '
        f'stroke-dasharray="5 3"/>'
    )
    out.append(f'<text x="{x + 20}" y="{height - 12}">the model alone (ceiling)</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chart", description=__doc__)
    parser.add_argument("results", nargs="?", type=Path, default=LATEST)
    parser.add_argument("--svg", type=Path, default=SVG, help="where to write the chart")
    parser.add_argument("--table", action="store_true", help="print the markdown table only")
    args = parser.parse_args(argv)
    print(markdown_table(args.results))
    if not args.table:
        args.svg.write_text(svg_chart(args.results), encoding="utf-8")
        print(f"wrote {args.svg}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
