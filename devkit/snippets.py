"""The fenced code blocks of README.md and docs/, as tests/system/test_docs_snippets.py runs them.

A block in `sh`, `bash`, `shell` or `console` is a shell block, one in `python` a Python block; a
block in any other language (`text`, `json`, `yaml`, none) is not run. A runnable block that
cannot run on this machine carries the comment `<!-- not-run: REASON -->` on the line before it
(blank lines between are allowed); the reason is required. A block that repeats one of another
page word for word carries `<!-- same-as: PAGE -->` instead: it runs there, and the test checks
that the two texts are still the same.

In a `console` block (or any shell block with `$ ` lines) the commands are the `$ ` lines and the
lines under each are its expected output, checked for shape (`output_matches`); in a plain shell
block every line is a command (a trailing `\\` continues it, a heredoc runs to its end marker).
A command `ringserve serve ... &` starts a server in the background: the runner waits until it
answers ready on its port, and stops every such server when the block ends.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SHELL = {"sh", "bash", "shell", "console"}
PYTHON = {"python", "py"}
FENCE = re.compile(r"^```([\w+-]*)\s*$")
NOT_RUN = re.compile(r"^<!-- not-run: (\S.*?) -->$")
SAME_AS = re.compile(r"^<!-- same-as: (\S+\.md) -->$")  # the same block runs on that page
# Ports the docs name: HTTP 8000, binary 8001, gRPC 8002, and the 80xx/90xx of a second server.
PORT = re.compile(r"(?<![\w.-])(80[0-9]{2}|81[0-9]{2}|90[0-9]{2})(?![\w])")
SERVE = re.compile(r"^(?:\S*/)?ringserve serve\b.*&\s*(?:#.*)?$")


@dataclass
class Command:
    text: str
    expected: list[str] = field(default_factory=list)

    @property
    def starts_server(self) -> bool:
        return bool(SERVE.match(self.text.strip()))

    @property
    def shows_an_error(self) -> bool:
        """Its expected output is an error answer (so an HTTP error status is what it wants)."""
        return any(line.lstrip().startswith('{"error"') for line in self.expected)


@dataclass
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    not_run: str | None  # the reason, when marked
    same_as: str | None = None  # the page (relative to the repository) that runs this block

    @property
    def runnable(self) -> bool:
        return self.lang in SHELL | PYTHON

    @property
    def name(self) -> str:
        parts = self.path.parts
        inside = parts[len(parts) - parts[::-1].index("docs") :] if "docs" in parts else parts[-1:]
        return f"{'/'.join(inside)}:{self.line}"

    def commands(self) -> list[Command]:
        return shell_commands(self.text) if self.lang in SHELL else []

    @property
    def starts_server(self) -> bool:
        return any(c.starts_server for c in self.commands())


def blocks(path: Path) -> list[Block]:
    """Every fenced block of a markdown file, with the not-run reason before it, if any."""
    out: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start = i
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        before = lines[k].strip() if k >= 0 else ""
        marked, same = NOT_RUN.match(before), SAME_AS.match(before)
        text = "\n".join(lines[start + 1 : j]) + "\n"
        out.append(
            Block(
                path, start + 1, m[1].lower(), text,
                marked[1] if marked else None, same[1] if same else None,
            )
        )  # fmt: skip
        i = j + 1
    return out


def _logical_lines(lines: list[str]) -> list[str]:
    """Join `\\` continuations; keep a heredoc's body with the line that opens it."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        while line.endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line + "\n" + lines[i]
        heredoc = re.search(r"<<-?\s*'?(\w+)'?", line)
        if heredoc:
            while i + 1 < len(lines) and lines[i].strip() != heredoc[1]:
                i += 1
                line = line + "\n" + lines[i]
        out.append(line)
        i += 1
    return out


def shell_commands(text: str) -> list[Command]:
    lines = text.splitlines()
    if any(ln.startswith("$ ") for ln in lines):
        commands: list[Command] = []
        i = 0
        while i < len(lines):
            if not lines[i].startswith("$ "):
                if commands:
                    commands[-1].expected.append(lines[i])
                i += 1
                continue
            first = lines[i][2:]
            body = [first]
            while body[-1].endswith("\\") and i + 1 < len(lines):
                i += 1
                body.append(lines[i])
            commands.append(Command("\n".join(body)))
            i += 1
        return commands
    logical = _logical_lines([ln for ln in lines if ln.strip()])
    return [Command(ln) for ln in logical if not ln.lstrip().startswith("#")]


# -- output shapes ------------------------------------------------------------------------------
def _shape(value: Any) -> Any:
    """What a JSON value's shape is: keys and kinds, not values."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def _same_shape(expected: Any, actual: Any) -> bool:
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and set(expected) == set(actual)
            and all(_same_shape(expected[k], actual[k]) for k in expected)
        )
    if isinstance(expected, list):
        if not isinstance(actual, list):
            return False
        return not expected or not actual or _same_shape(expected[0], actual[0])
    return expected == actual


def _line_pattern(line: str) -> re.Pattern[str]:
    parts = re.split(r"(\.\.\.|-?\d+(?:\.\d+)?(?:e-?\d+)?)", line.strip())
    out = []
    for part in parts:
        if part == "...":
            out.append(".*")
        elif re.fullmatch(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", part):
            out.append(r"-?[\d.e+-]+")
        else:
            out.append(re.escape(part))
    return re.compile("".join(out))


def output_matches(expected: list[str], actual: str) -> str | None:
    """None when `actual` has the shape `expected` shows; else why not. JSON is compared by keys
    and kinds (every key, no more, no fewer, at every level shown in full); a JSON line cut short
    with `...` needs its keys present; any other line must match, numbers and `...` as
    wildcards."""
    want = "\n".join(expected).strip()
    if not want:
        return None
    got = actual.strip()
    if want[0] in "[{":
        try:
            shown = json.loads(want)
        except ValueError:
            shown = None
        if shown is not None:
            try:
                answer = json.loads(got)
            except ValueError:
                return f"not JSON: {got[:300]!r}"
            if not _same_shape(_shape(shown), _shape(answer)):
                return f"shape differs: expected {_shape(shown)}, got {_shape(answer)}"
            return None
        keys = re.findall(r'"(\w+)":', want)
        if keys:
            missing = [k for k in keys if f'"{k}":' not in got]
            return f"keys {missing} missing from {got[:300]!r}" if missing else None
    for line in expected:
        if line.strip() and not _line_pattern(line).search(got):
            return f"no line like {line.strip()!r} in {got[:300]!r}"
    return None
