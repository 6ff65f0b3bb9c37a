"""Every shell, curl and Python block of README.md and docs/ runs here, against real servers.

One module-scoped server (the default model, 1 worker, no spare, gRPC on) stands in for the
`make serve` the pages assume: `localhost:8000`, `:8001` and `:8002` in a block become its ports,
and `ringserve ctl` reaches its control socket. A block that starts servers of its own
(`ringserve serve ... &`) gets fresh free ports for every port it names, no spare
(`RINGSERVE_SPARES=0`, less CPU), the plain ONNX graph without timing both at start
(`RINGSERVE_GRAPH=plain`), and the binary and gRPC ports off unless it names them; its
servers are stopped when it ends. A block that exports a page's stand-in model builds it the
tests' cheap way (devkit/builds.py: int8's recipe search skipped; no page shows that cost), and
where no block of its page names int8, a precision, a graph or a runtime, the plain ONNX graph
alone (plain_builds: the block servers serve that graph, RINGSERVE_GRAPH=plain; the families'
fused and int8 builds are tests/model/test_families.py's and test_hf.py's).
The blocks of one page run in order in one directory (a page may build a model in one block
and serve it in the next); two pages run at a time, each page's blocks on a core of their own
(`taskset`: a block's processes, and the servers it starts, see one CPU; on two cores,
`ringserve evaluate`'s two torch threads beside the other page's processes took 19.7 s, and 9.0 s
on a core of its own). Output shown
under a `$ ` command is checked for shape (devkit/snippets.py). A block marked
`<!-- not-run: REASON -->` is skipped with that reason: it needs a GPU, root, systemd, another
host, or minutes of CPU; one marked `<!-- same-as: PAGE -->` must read exactly as a block that
runs on PAGE.

The same server checks the two reference pages a running server can contradict: the HTTP page's
routes are the server's own OpenAPI operations, and every metric family and label the server
exposes is named in docs/api.md.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from devkit.builds import CHEAP_BUILDS, PLAIN_BUILDS
from devkit.launcher import ROOT, free_port
from devkit.server import ServerProc, serving
from devkit.snippets import PORT, PYTHON, SHELL, Block, blocks, output_matches

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
ALL = [b for page in PAGES for b in blocks(page) if b.runnable]
VENV_BIN = Path(sys.executable).parent
BLOCK_TIMEOUT_S = 240
# A page whose blocks name none of these serves its exports on the plain graph alone.
GRAPH_WORDS = ("int8", "precision", "fused", "graph", "runtime")

PRELUDE = r"""
set -e  # no pipefail: `... | head` may end its writer early, as in a terminal
__ready() {  # PORT PID: wait until that server answers ready on the port (or over TLS), or fail
    local end=$((SECONDS + 180))
    until { command curl -sf -o /dev/null "http://127.0.0.1:$1/v2/health/ready" \
            || command curl -sfk -o /dev/null "https://127.0.0.1:$1/v2/health/ready"; } \
        && ss -ltnpH "sport = :$1" | grep -q "pid=$2,"; do
        kill -0 "$2" 2>/dev/null || { echo "server $2 exited" >&2; return 1; }
        [ "$SECONDS" -lt "$end" ] || { echo "server $2 not ready in 180 s" >&2; return 1; }
        sleep 0.1
    done
}
__stop() {  # the servers this block started: SIGTERM, and wait for them to drain
    local pids
    pids=$(jobs -p)
    [ -z "$pids" ] && return 0
    kill -TERM $pids 2>/dev/null || true
    wait $pids 2>/dev/null || true
}
trap __stop EXIT
# An HTTP error fails the command, unless it prints the status or shows an error answer.
curl() {
    if [ -n "${__error_shown:-}" ] || [[ " $* " == *http_code* ]]; then command curl "$@"
    else command curl --fail-with-body "$@"; fi
}
"""


@pytest.fixture(scope="module")
def docs_server(
    tmp_path_factory: pytest.TempPathFactory, default_model: str
) -> Iterator[ServerProc]:
    srv = ServerProc(
        tmp_path_factory.mktemp("docs"), ["--workers", "1", "--spares", "0"], grpc=True
    )
    with serving(srv, 1) as ready:
        yield ready


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, Path]:
    """One working directory a page, with `.venv` linked (the pages say `.venv/bin/...`)."""
    made: dict[Path, Path] = {}
    for page in PAGES:
        d = tmp_path_factory.mktemp(page.stem)
        (d / ".venv").symlink_to(VENV_BIN.parent)
        (d / "data").symlink_to(ROOT / "data")
        made[page] = d
    return made


def port_map(block: Block, srv: ServerProc) -> dict[str, str]:
    ours = {"8000": srv.port, "8001": srv.binary_port, "8002": srv.grpc_port}
    mapping = {}
    for port in sorted(set(PORT.findall(block.text))):
        mapping[port] = ours[port] if port in ours and not block.starts_server else free_port()
    return {k: str(v) for k, v in mapping.items()}


def localize(text: str, mapping: dict[str, str]) -> str:
    return PORT.sub(lambda m: mapping.get(m[1], m[1]), text)


def environment(block: Block, srv: ServerProc) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGSERVE_")}
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    env.update(RINGSERVE_SPARES="0", RINGSERVE_BINARY_PORT="0", RINGSERVE_GRPC_PORT="0")
    env["RINGSERVE_GRAPH"] = "plain"  # no graph timing at each block server's start (~1 s)
    if "ringserve export --from" in block.text:  # a stand-in model: its int8 cost is not shown
        env.update(PLAIN_BUILDS if plain_page(block.path) else CHEAP_BUILDS)  # ~1.9 / 2.9 s, not 8
    if not block.starts_server:
        env["RINGSERVE_CONTROL"] = srv.control
    return env


def plain_page(page: Path) -> bool:
    """No runnable block of the page names an int8 graph, a precision, a graph or a runtime."""
    texts = [b.text for b in blocks(page) if b.runnable and not b.not_run]
    return not any(word in text for text in texts for word in GRAPH_WORDS)


def shell_script(block: Block, mapping: dict[str, str]) -> tuple[str, list[list[str]]]:
    """The block as one bash script, a marker before each command to split its output."""
    script, expected = [PRELUDE], []
    for i, command in enumerate(block.commands()):
        text = localize(command.text, mapping)
        script.append(f"printf '\\n@@command {i}@@\\n'")
        script.append(f"__error_shown=1 {text}" if command.shows_an_error else text)
        if command.starts_server:
            port = re.search(r"--port[ =](\d+)", text)
            script.append(f"__ready {port[1] if port else mapping.get('8000', '8000')} $!")
        expected.append(command.expected)
    return "\n".join(script) + "\n", expected


def run_block(block: Block, srv: ServerProc, cwd: Path, cpu: int | None = None) -> None:
    mapping = port_map(block, srv)
    env = environment(block, srv)
    if block.lang in PYTHON:
        argv = [str(VENV_BIN / "python"), "-c", localize(block.text, mapping)]
        expected: list[list[str]] = []
    else:
        script, expected = shell_script(block, mapping)
        if block.starts_server:  # a server started without --port takes this one
            env["RINGSERVE_PORT"] = mapping.get("8000", str(free_port()))
        argv = ["bash", "-c", script]
    if cpu is not None:  # the page's core (outcomes)
        argv = ["taskset", "-c", str(cpu), *argv]
    start = time.monotonic()
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S,
        start_new_session=True,
    )  # fmt: skip
    where = f"{block.name} ({block.lang})"
    assert done.returncode == 0, f"{where} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    outputs = re.split(r"\n?@@command \d+@@\n", done.stdout)[1:]
    record = os.environ.get("RINGSERVE_DOCS_RECORD")  # a file: each block's time, its output
    if record:
        with open(record, "a", encoding="utf-8") as f:
            f.write(f"== {block.name} took {time.monotonic() - start:.1f} s\n")
            for i, out in enumerate(outputs or [done.stdout]):
                f.write(f"== {block.name} command {i + 1}\n{out.strip()[:600]}\n")
    for i, want in enumerate(expected):
        why = output_matches(want, outputs[i] if i < len(outputs) else "")
        assert why is None, f"{where}, command {i + 1}: {why}"


def to_run(block: Block) -> bool:
    return not block.not_run and not block.same_as


@pytest.fixture(scope="module")
def outcomes(docs_server: ServerProc, workdirs: dict[Path, Path]) -> dict[str, str | None]:
    """Every page's runnable blocks, in order, two pages at a time (the blocks are subprocesses
    and their servers; two cores), each page on a core of its own while it runs, where there
    are two and `taskset`: block name -> None, or why it failed."""
    by_page: dict[Path, list[Block]] = {}
    for block in ALL:
        if to_run(block):
            by_page.setdefault(block.path, []).append(block)
    results: dict[str, str | None] = {}

    took: dict[str, float] = {}
    cpus = sorted(os.sched_getaffinity(0))
    free: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    for lane in range(2):  # one page a lane; without two cores and taskset, unpinned
        free.put(cpus[lane] if len(cpus) >= 2 and shutil.which("taskset") else None)

    def run_page(page: Path) -> None:
        start = time.monotonic()
        cpu = free.get()
        try:
            for block in by_page[page]:  # a later block may use what an earlier one made
                try:
                    run_block(block, docs_server, workdirs[page], cpu)
                    results[block.name] = None
                except (AssertionError, subprocess.TimeoutExpired) as exc:
                    results[block.name] = str(exc)
        finally:
            free.put(cpu)
        took[page.name] = time.monotonic() - start

    # the pages that build models first, so the two lanes end together
    order = sorted(
        by_page, key=lambda p: -sum(b.starts_server + 2 * (b.lang in PYTHON) for b in by_page[p])
    )
    start = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(run_page, order))
    print(f"{len(results)} blocks of {len(by_page)} pages in {time.monotonic() - start:.1f} s:")
    print(", ".join(f"{name} {s:.1f} s" for name, s in sorted(took.items(), key=lambda t: -t[1])))
    return results


@pytest.mark.parametrize("block", ALL, ids=[b.name for b in ALL])
def test_snippet(block: Block, outcomes: dict[str, str | None]) -> None:
    if block.not_run:
        pytest.skip(f"not-run: {block.not_run}")
    if block.same_as:
        there = [b for b in blocks(ROOT / block.same_as) if b.runnable and not b.not_run]
        twin = next((b for b in there if (b.lang, b.text) == (block.lang, block.text)), None)
        assert twin is not None, f"{block.name}: no block of {block.same_as} reads the same"
        pytest.skip(f"runs as {twin.name}")
    assert outcomes[block.name] is None, outcomes[block.name]


def test_every_runnable_block_is_run_or_says_why() -> None:
    """A block in a language the runner does not know cannot hide commands from it (`text` is
    declared output: the command line's help pages)."""
    hidden = [
        b.name
        for page in PAGES
        for b in blocks(page)
        if b.lang not in SHELL | PYTHON | {"text"}
        and re.search(r"^\s*(\$ |curl |ringserve |\.venv/bin/|python -m )", b.text, re.M)
    ]
    assert hidden == [], f"commands in blocks of no runnable language: {hidden}"
    assert sum(1 for b in ALL if not b.not_run and not b.same_as) >= 30


def test_http_reference_lists_the_servers_routes(docs_server: ServerProc) -> None:
    status, _, data = docs_server.request("GET", "/openapi.json")
    assert status == 200
    served = {(m.upper(), p) for p, item in json.loads(data)["paths"].items() for m in item}
    page = (ROOT / "docs" / "reference" / "http.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^### (GET|POST|PUT|DELETE|HEAD) (\S+)$", page, re.M))
    assert documented == served


def test_api_reference_names_every_metric_and_label(docs_server: ServerProc) -> None:
    status, _, data = docs_server.request("GET", "/metrics")
    assert status == 200
    text = data.decode()
    families = set(re.findall(r"^# TYPE (ringserve_\w+) ", text, re.M))
    labels = {name for name in re.findall(r"(\w+)=\"", text) if name != "le"}
    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    metrics = api.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    missing = sorted(f for f in families if f not in metrics and not f.startswith("ringserve_gpu"))
    assert missing == [], f"metric families not in docs/api.md#metrics: {missing}"
    assert sorted(lb for lb in labels if f"`{lb}`" not in metrics) == []
    assert len(families) >= 20
