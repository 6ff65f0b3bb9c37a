"""The docs' pictures, each drawn from one results file (or, for a request's path, from the walk
tables of docs/design.md), and the machines page:

    python -m benchmarks.pictures            # writes every file below
    python -m benchmarks.pictures --check    # exit 1 when a committed file differs

- docs/assets/overload.svg: goodput and refusal P99 against offered load (benchmarks.shedding)
- docs/assets/chaos.svg: a chaos run's timeline, its faults and each window's P99 (benchmarks.chaos)
- docs/assets/precision.svg: speed against agreement with fp32, the 99% line (benchmarks.runtimes)
- docs/assets/request-path.svg: a /v1 call and a gRPC ModelInfer, step by step
- docs/benchmarks/machines.md: each machine a results file records (benchmarks/machines.py)

The SVG is plain text written here, with no plotting library and nothing fetched when it is
viewed; tests/unit/test_pictures.py checks that the committed files are what this writes.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from html import escape
from pathlib import Path

from benchmarks import machines

ROOT = Path(__file__).parents[1]
RESULTS = machines.RESULTS
ASSETS = ROOT / "docs" / "assets"
DESIGN = ROOT / "docs" / "design.md"
SHEDDING = RESULTS / "shedding-20261205T2005Z.txt"
CHAOS = RESULTS / "chaos-20261205T1309Z.txt"
RUNTIMES = RESULTS / "runtimes-2026-12-06T0507Z-amx.txt"
BLUE, ORANGE, GREY, RED = "#3b6fb6", "#e39a3b", "#8c8c8c", "#c0392b"


def table_rows(text: str, first_header: str) -> list[dict[str, str]]:
    """The rows of the first markdown table in `text` whose header starts `| first_header |`."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_header:
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append(
                    dict(zip(cells, (c.strip() for c in row.strip("|").split("|")), strict=False))
                )
            return rows
    raise ValueError(f"no table headed {first_header!r}")


def number(cell: str) -> float:
    return float(cell.replace(",", "").split()[0])


class Svg:
    """A small SVG writer: the page, its title and source line, and a few marks."""

    def __init__(self, width: int, height: int, title: str, source: Path | str) -> None:
        self.width, self.height = width, height
        cite = machines.citation(source) if isinstance(source, Path) else source
        self.out = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
            f"<title>{escape(title)}</title>",
            f'<rect width="{width}" height="{height}" fill="#fff"/>',
            f'<text x="20" y="22" font-size="14" font-weight="bold">{escape(title)}</text>',
            f'<text x="20" y="40" fill="#555">{escape(cite.replace("`", ""))}</text>',
        ]

    def text(self, x: float, y: float, s: str, anchor: str = "start", **attrs: str) -> None:
        extra = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in attrs.items())
        self.out.append(
            f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{extra}>{escape(s)}</text>'
        )

    def line(self, x1: float, y1: float, x2: float, y2: float, color: str, **attrs: str) -> None:
        extra = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in attrs.items())
        self.out.append(
            f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
            f'stroke="{color}"{extra}/>'
        )

    def rect(self, x: float, y: float, w: float, h: float, fill: str, **attrs: str) -> None:
        extra = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in attrs.items())
        self.out.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}"{extra}/>'
        )

    def dot(self, x: float, y: float, color: str, r: float = 4) -> None:
        self.out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{color}"/>')

    def polyline(self, points: list[tuple[float, float]], color: str) -> None:
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        self.out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"/>')

    def done(self) -> str:
        return "\n".join([*self.out, "</svg>"]) + "\n"


@dataclass(frozen=True)
class Panel:
    """A plot area and its scales: x and y from data to pixels (y may be log10)."""

    x0: float
    y0: float
    w: float
    h: float
    xmin: float
    xmax: float
    ymin: float
    ymax: float
    log: bool = False

    def x(self, v: float) -> float:
        return self.x0 + (v - self.xmin) / (self.xmax - self.xmin) * self.w

    def y(self, v: float) -> float:
        lo, hi, at = self.ymin, self.ymax, v
        if self.log:
            lo, hi, at = math.log10(lo), math.log10(hi), math.log10(max(v, self.ymin))
        return self.y0 + self.h - (at - lo) / (hi - lo) * self.h

    def axes(self, svg: Svg, yticks: list[float], ylabel: str, fmt: str = "{:g}") -> None:
        for t in yticks:
            svg.line(self.x0, self.y(t), self.x0 + self.w, self.y(t), "#ddd")
            svg.text(self.x0 - 6, self.y(t) + 4, fmt.format(t), "end")
        svg.line(self.x0, self.y0 + self.h, self.x0 + self.w, self.y0 + self.h, "#333")
        svg.text(self.x0, self.y0 - 8, ylabel, fill="#333")


# -- overload -----------------------------------------------------------------------------------
def overload_svg(path: Path = SHEDDING) -> str:
    """Goodput (of the capacity measured in the same run) and refusal P99 at each offered load."""
    rows = table_rows(path.read_text(encoding="utf-8"), "load")
    loads = [number(r["load"].rstrip("x")) for r in rows]
    svg = Svg(720, 340, "Under overload: goodput holds, refusals come fast", path)
    left = Panel(70, 80, 260, 200, 0, max(loads) + 1, 0, 1.2)
    left.axes(svg, [0, 0.25, 0.5, 0.75, 1.0], "goodput, of the capacity measured (1x)")
    right_max = 10 ** math.ceil(math.log10(max(number(r["refusal P99 ms"]) for r in rows)))
    right = Panel(430, 80, 260, 200, 0, max(loads) + 1, 1, right_max, log=True)
    ticks = [10.0**k for k in range(int(math.log10(right_max)) + 1)]
    right.axes(svg, ticks, "refusal P99 ms (log scale)")
    for panel, key, color in ((left, "of 1x", BLUE), (right, "refusal P99 ms", ORANGE)):
        points = [(panel.x(x), panel.y(number(r[key]))) for x, r in zip(loads, rows, strict=True)]
        svg.polyline(points, color)
        for (px, py), r in zip(points, rows, strict=True):
            svg.dot(px, py, color)
            svg.text(px, py - 8, r[key], "middle", font_size="11")
        for x, r in zip(loads, rows, strict=True):
            svg.text(panel.x(x), panel.y0 + panel.h + 16, r["load"], "middle")
        svg.text(
            panel.x0 + panel.w / 2, panel.y0 + panel.h + 34, "offered load, of capacity", "middle"
        )
    svg.line(left.x0, left.y(1.0), left.x0 + left.w, left.y(1.0), GREY, stroke_dasharray="4 3")
    return svg.done()


# -- chaos --------------------------------------------------------------------------------------
EVENT = re.compile(r"^\s+(\d+\.\d+) s\s+(.*)$")
WINDOW = re.compile(r"^\s+(\d+) s\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$")


def chaos_svg(path: Path = CHAOS) -> str:
    """The run's faults on a time line, and each 10 s window's P50, P99 and slowest answer."""
    events, windows = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        if m := EVENT.match(line):
            events.append((float(m[1]), m[2]))
        elif m := WINDOW.match(line):
            windows.append((int(m[1]), int(m[2]), int(m[3]), float(m[4]), float(m[5]), float(m[6])))
    span = windows[-1][0] + 10
    svg = Svg(760, 420, "A chaos run: faults every few seconds, every request answered", path)
    top = 10 ** math.ceil(math.log10(max(w[5] for w in windows)))
    p = Panel(70, 170, 640, 180, 0, span, 1, top, log=True)
    p.axes(
        svg, [10.0**k for k in range(int(math.log10(top)) + 1)], "ms (log scale), each 10 s window"
    )
    for start, n, bad, p50, p99, slowest in windows:
        x, w = p.x(start) + 6, p.x(start + 10) - p.x(start) - 12
        for value, color in ((slowest, "#d9e3f2"), (p99, BLUE), (p50, "#1d3f73")):
            svg.rect(x, p.y(value), w, p.y0 + p.h - p.y(value), color)
        svg.text(x + w / 2, p.y(p99) - 4, f"P99 {p99:g}", "middle", font_size="10")
        svg.text(x + w / 2, p.y0 + p.h + 30, f"{n} requests", "middle", font_size="10")
        svg.text(x + w / 2, p.y0 + p.h + 42, f"{bad} failed", "middle", font_size="10")
    for second in range(0, int(span) + 1, 10):
        svg.text(p.x(second), p.y0 + p.h + 16, f"{second} s", "middle")
    for i, (at, what) in enumerate(events):
        color = RED if "SIGKILL" in what else ORANGE if "SIG" in what else GREY
        y = 62 + (i % 4) * 18
        svg.line(p.x(at), y + 4, p.x(at), p.y0 + p.h, color, stroke_dasharray="2 2")
        short = re.sub(r" \d+(?=:|$)| \d+ ", " ", what).split(":")[0].strip()
        svg.text(p.x(at) + 3, y, short, font_size="10", fill=color)
    legend = [("#1d3f73", "P50"), (BLUE, "P99"), ("#d9e3f2", "slowest answer")]
    for j, (color, name) in enumerate(legend):
        svg.rect(70 + j * 130, 396, 12, 12, color)
        svg.text(88 + j * 130, 406, name)
    return svg.done()


# -- the precision frontier ---------------------------------------------------------------------
def precision_svg(path: Path = RUNTIMES, column: str = "short b8") -> str:
    """Each runtime and precision: texts/s (one thread) against agreement with fp32, on a log
    scale of disagreement so that 0.98, 0.99 and 0.9997 stand apart; fp32 itself at the right."""
    rows = table_rows(path.read_text(encoding="utf-8"), "runtime")
    points = [(r["runtime"], number(r["agreement with fp32"]), number(r[column])) for r in rows]
    svg = Svg(
        860, 380, "Speed against faithfulness: only what agrees 99% with fp32 is a candidate", path
    )
    top = math.ceil(max(s for _, _, s in points) / 200) * 200
    worst = max(1 - a for _, a, _ in points)
    # x is -log10(disagreement), so it runs right as agreement rises, up to 0.9999; fp32 beyond
    p = Panel(70, 70, 420, 250, math.floor(-math.log10(worst) * 2) / 2, 4.5, 0, top)

    def x_of(agree: float) -> float:
        return p.x(p.xmax - 0.25 if agree >= 1.0 else -math.log10(1 - agree))

    p.axes(
        svg, list(range(0, top + 1, 200)), f"texts/s, one thread, {column.replace('b', 'batch ')}"
    )
    for agree in (0.7, 0.9, 0.97, 0.99, 0.997, 0.999, 0.9997):
        if -math.log10(1 - agree) >= p.xmin:
            svg.text(x_of(agree), p.y0 + p.h + 16, f"{agree:g}", "middle", font_size="11")
    svg.text(x_of(1.0), p.y0 + p.h + 16, "= fp32", "middle", font_size="11")
    svg.text(
        p.x0 + p.w / 2, p.y0 + p.h + 34, "agreement with fp32 (log scale of the rest)", "middle"
    )
    svg.line(x_of(0.99), p.y0, x_of(0.99), p.y0 + p.h, RED, stroke_dasharray="5 3")
    svg.text(x_of(0.99) - 4, p.y0 + 12, "0.99", "end", fill=RED)
    for i, (name, agree, speed) in enumerate(points, 1):
        color = BLUE if agree >= 0.99 else GREY
        svg.dot(x_of(agree), p.y(speed), color, 5)
        svg.text(x_of(agree) - 8, p.y(speed) + 4, str(i), "end", font_size="11", fill=color)
        label = f"{i}  {name.split(' (')[0]}: {speed:g}/s, agreement {agree:.4f}"
        svg.text(520, 80 + i * 20, label, font_size="11", fill=color)
    svg.text(520, 80, "blue: at or above 0.99, a candidate; grey: never served", font_size="11")
    return svg.done()


# -- a request's path ---------------------------------------------------------------------------
STEP = re.compile(r"^\| (\d+) \| (.+?) \| (.+) \|$")


def walks(design: Path = DESIGN) -> dict[str, list[tuple[str, str]]]:
    """The walk tables of docs/design.md: for each heading under "A request's path", its steps
    as (where, what), with where's first module path and name."""
    out: dict[str, list[tuple[str, str]]] = {}
    section = None
    in_path = False
    for line in design.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            in_path = line == "## A request's path"
        elif in_path and line.startswith("### "):
            section = line[4:]
        elif in_path and section and (m := STEP.match(line)):
            names = re.findall(r"`([^`]+)`", m[2])
            where = " ".join(names[:2]) if names else m[2]
            out.setdefault(section, []).append((where, re.sub(r"[`*]", "", m[3])))
    return out


def path_svg(design: Path = DESIGN) -> str:
    columns = walks(design)
    depth = max(len(steps) for steps in columns.values())
    box_h, gap, col_w = 34, 12, 560
    height = 90 + depth * (box_h + gap)
    source = "drawn from the walk tables of docs/design.md by python -m benchmarks.pictures"
    svg = Svg(40 + col_w * len(columns), height, "A request's path, step by step", source)
    for c, (title, steps) in enumerate(columns.items()):
        x = 20 + c * col_w
        svg.text(x, 66, title, font_weight="bold")
        for i, (where, what) in enumerate(steps):
            y = 76 + i * (box_h + gap)
            tier = where.split("/")[0]
            fill = {"service": "#eaf1fb", "workers": "#fdf1e2", "shm": "#eeeeee"}.get(tier, "#fff")
            svg.rect(x, y, col_w - 30, box_h, fill, stroke="#999", rx="4")
            svg.text(x + 8, y + 14, f"{i + 1}. {where}", font_size="11", font_weight="bold")
            svg.text(x + 8, y + 28, what if len(what) <= 90 else what[:88] + "…", font_size="10")
            if i + 1 < len(steps):
                mid = x + (col_w - 30) / 2
                svg.line(mid, y + box_h, mid, y + box_h + gap, "#666")
    return svg.done()


def outputs() -> dict[Path, Callable[[], str]]:
    return {
        ASSETS / "overload.svg": overload_svg,
        ASSETS / "chaos.svg": chaos_svg,
        ASSETS / "precision.svg": precision_svg,
        ASSETS / "request-path.svg": path_svg,
        machines.PAGE: machines.page,
    }


def stale() -> list[Path]:
    """The committed files that differ from what this module writes now."""
    return [
        path
        for path, make in outputs().items()
        if not path.exists() or path.read_text(encoding="utf-8") != make()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pictures", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only say which files differ")
    args = parser.parse_args(argv)
    if args.check:
        found = stale()
        for path in found:
            print(f"stale: {path.relative_to(ROOT)}")
        return 1 if found else 0
    for path, make in outputs().items():
        path.write_text(make(), encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
