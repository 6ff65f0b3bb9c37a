"""Every table and paragraph of measured figures in README.md and docs/ names its results file.

A table of figures is a markdown table whose header names a measure (texts/s, req/s, P50, P99,
ms, goodput, agreement, MiB, ...) or whose cells hold a fraction with its unit (12.3 ms, 1.5x).
Its citation is a results file's name (`benchmarks/results/NAME`, or NAME alone) in the lines
just before it (back to its heading or the table before it) or in the few lines after it, and
the file must exist; the table's section names that file's date and machine as
benchmarks/machines.py reads them from the file (`2026-12-05`, `AMD EPYC (AVX2)`, or `machine
not recorded in the file`), as the machines page lists them. A table that is not a measurement
(a table of defaults, of limits) carries `<!-- not-measured: REASON -->` on one of the two lines
above it.

A figure in running prose is held to the same rule: a paragraph (or list item) that holds a
number that reads as a measurement (a fraction or a range with its unit, `12.3 ms`, `9-48 ms`,
`98.4%`, `1.68x`; a rate, `470 texts/s`) names, in itself or in its section before it,
an existing results file with that file's date and machine. A whole number with a unit is left
alone (`30 s`, `1 MiB`, `5x` are as often a default or a limit as a measurement), and so is a
paragraph that carries `<!-- not-measured: REASON -->` (a constant of the code, `0.5 s`).

    python -m devkit.figures     # each table or paragraph without a citation, as FILE:LINE
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from benchmarks import machines

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# Pages made from the code or from the results files, not written by hand.
GENERATED = ("docs/reference/", "docs/benchmarks/machines.md")
MEASURE = re.compile(
    r"texts/s|req/s|calls/s|lines/s|\bP50\b|\bP99|\bms\b|goodput|throughput|agreement|\bMiB\b|"
    r"served/|ceiling|speedup|texts a second|x fp32|PSS|RSS",
    re.I,
)
# A body cell that reads as a measurement: a number with a fraction and its unit (a default or a
# limit is a whole number: 256 texts, 1 MiB).
MEASURED = re.compile(r"\d\.\d+\s?(?:ms|us|s|MiB|GiB|MB|%|texts/s|req/s|x)(?![\w/])")
CITE = re.compile(r"([A-Za-z0-9_.-]+-20\d\d[0-9T:Z_.-]*[A-Za-z0-9_-]*\.(?:txt|json))")
NOT_MEASURED = "<!-- not-measured:"
AFTER = 6  # lines after a table in which its citation may come
_NUMBER = r"\d[\d,]*(?:\.\d+)?"
_UNIT = r"(?:ms|us|µs|s|seconds|MiB|GiB|MB|GB|%|x|texts/s|req/s)(?![\w/])"
_ALONE = r"(?<![\w.`/$-])"  # not part of a name, a version, a path or a code span's value
PROSE_FIGURE = re.compile(
    rf"{_ALONE}(?:\d[\d,]*\.\d+|{_NUMBER}[-\u2013]{_NUMBER})\s?{_UNIT}"
    rf"|{_ALONE}{_NUMBER}\s?(?:texts/s|req/s|calls/s|texts a second)"
)


def pages() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in found if not p.relative_to(ROOT).as_posix().startswith(GENERATED)]


def tables(lines: list[str]) -> list[tuple[int, int]]:
    """(first, last) line indexes of each markdown table outside code fences."""
    out, start, fence = [], None, False
    for i, line in enumerate([*lines, ""]):
        if line.lstrip().startswith("```"):
            fence = not fence
        is_row = not fence and line.startswith("|")
        if is_row and start is None:
            start = i
        elif not is_row and start is not None:
            out.append((start, i - 1))
            start = None
    return out


def named_whole(name: str, text: str) -> bool:
    """Whether `text` names the results file's date and its machine (as the machines page does)."""
    flat = " ".join(text.split())
    path = RESULTS / name
    return machines.date_of(path) in flat and machines.label(path) in flat


def cited(text: str) -> list[str]:
    """The results files `text` names that exist."""
    return [name for name in CITE.findall(text) if (RESULTS / name).is_file()]


def uncited(path: Path, root: Path = ROOT) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    where = path.relative_to(root).as_posix()
    out = []
    previous = -1  # the last line of the table before, in this section
    for first, last in tables(lines):
        start, previous = previous, last
        body = "\n".join(lines[first + 2 : last + 1])
        if not MEASURE.search(lines[first]) and not MEASURED.search(body):
            continue
        before = first - 1
        while before > start and not lines[before].startswith("#"):
            before -= 1
        context = lines[before + 1 : first] + lines[last + 1 : last + 1 + AFTER]
        if any(NOT_MEASURED in line for line in lines[max(first - 2, 0) : first]):
            continue
        files = cited("\n".join(context))
        if not files:
            out.append(f"{where}:{first + 1}: a table of figures names no results file")
            continue
        heading = first - 1
        while heading >= 0 and not lines[heading].startswith("#"):
            heading -= 1
        section = "\n".join(lines[heading + 1 : first] + lines[last + 1 : last + 1 + AFTER])
        if not any(named_whole(name, section) for name in files):
            name = files[0]
            said = f"{machines.date_of(RESULTS / name)}, {machines.label(RESULTS / name)}"
            out.append(f"{where}:{first + 1}: name the date and machine of {name} ({said})")
    return out


def paragraphs(lines: list[str]) -> list[tuple[int, int]]:
    """(first, last) line indexes of each paragraph or list item of running prose: outside code
    fences, tables and headings."""
    out: list[tuple[int, int]] = []
    start, fence = None, False
    for i, line in enumerate([*lines, ""]):
        bare = line.lstrip()
        opens_fence = bare.startswith(("```", "~~~"))
        item = re.match(r"(?:[-*]|\d+\.) ", bare) is not None
        ends = fence or opens_fence or not bare or line.startswith(("#", "|")) or item
        if ends and start is not None:
            out.append((start, i - 1))
            start = None
        if opens_fence:
            fence = not fence
        elif not fence and bare and not line.startswith(("#", "|")) and start is None:
            start = i
    return out


def unsourced_prose(path: Path, root: Path = ROOT) -> list[str]:
    """Each paragraph of `path` whose measured figures name no results file, date and machine."""
    lines = path.read_text(encoding="utf-8").splitlines()
    where = path.relative_to(root).as_posix()
    out = []
    for first, last in paragraphs(lines):
        text = " ".join(lines[first : last + 1])
        found = PROSE_FIGURE.findall(text)
        if not found or NOT_MEASURED in text or NOT_MEASURED in lines[max(first - 1, 0)]:
            continue
        heading = first - 1
        while heading >= 0 and not lines[heading].startswith("#"):
            heading -= 1
        section = "\n".join(lines[heading + 1 : last + 1])
        files = cited(section)
        if not files:
            out.append(
                f"{where}:{first + 1}: figures in prose ({', '.join(found[:3])}) name no "
                "results file"
            )
        elif not any(named_whole(name, section) for name in files):
            name = files[0]
            said = f"{machines.date_of(RESULTS / name)}, {machines.label(RESULTS / name)}"
            out.append(f"{where}:{first + 1}: name the date and machine of {name} ({said})")
    return out


def findings() -> list[str]:
    return [f for page in pages() for f in (*uncited(page), *unsourced_prose(page))]


def main() -> int:
    found = findings()
    print("\n".join(found) or "every table and paragraph of figures names its results file")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
