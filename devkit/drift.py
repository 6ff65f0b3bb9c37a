"""The docs' names against the code's: every flag, route, metric, config key, environment variable,
control command, pip extra, module and repository file that README.md or docs/ names must exist,
and every public flag, route, metric and control command must be named on some page. The same
check reads the messages the code prints (string literals in service/, factory/, workers/) for
`ringserve COMMAND` and `--flag`. Where prose gives a server option's default beside it
("`--max-texts`, default 256", "`--max-body` (1 MiB)", "`--control` (default `./ringserve.sock`)"),
the value must be the option's default in service/config/settings.py. Where a sentence (or a
table row, whose first cell names it) names one route and then statuses (4xx, 5xx), each must
be one the OpenAPI document lists for that route.

`Names.from_code()` reads the names from the code itself (argparse's own help, SETTINGS, the
OpenAPI route table, the /metrics writer, the control socket's command table, pyproject's extras,
the file tree); `drift(names, pages)` compares, so a test can hand it a changed copy of the names.
Each finding reads `FILE:LINE: KIND NAME: why`. `python -m devkit.drift` prints them.

A finding is fixed in the page (or the message), as a rule. Where the name is right but not ours:
another program's flag goes in FOREIGN_FLAGS (its section must name the program: TOOLS), a peer's
route in FOREIGN_ROUTES; a line that names what no longer exists on purpose (a diary of
measurements at an old commit) carries `<!-- drift-ok: REASON -->`. A public name with no page
("(no page)") gets a line in docs/api.md or the guide it belongs to.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import importlib.util
import re
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("service", "factory", "workers", "wire", "shm")  # ringserve.X is X/
TOP_DIRS = (*PACKAGES, "devkit", "benchmarks", "tests", "deploy", "docs", "data")
MESSAGE_DIRS = ("service", "factory", "workers")
# The control socket's commands that no person types: the new server asks the old for its
# listening sockets on a --reuse-port upgrade (service/protocols/handover.py).
INTERNAL_COMMANDS = frozenset({"listeners"})
# What our processes call themselves in `ps` ("ringserve worker 3"), not commands.
PROCESS_TITLES = frozenset({"worker", "zygote"})
# Flags of other programs that the docs show beside ours (curl, pip, docker, kubectl, pytest,
# grpcurl, the peers' servers, git, make, mkdocs, python): prose naming them is not drift.
FOREIGN_FLAGS = frozenset(
    """
    --data --data-binary --header --json --fail --silent --show-error --request --output
    --max-time --http2 --http2-prior-knowledge --unix-socket --no-buffer --compressed
    --no-deps --upgrade --index-url --extra-index-url --editable --user --break-system-packages
    --shm-size --rm --network --ipc --gpus --cpus --cpuset-cpus --memory --name --volume
    --publish --env --init --detach --user --read-only --tmpfs --cap-drop --security-opt
    --build-arg --target --tag --file --platform --entrypoint --mount --interactive --tty
    --namespace --selector --timeout --wait --for --dry-run --validate --kubeconfig --restart
    --strict --config-file --site-dir --cacert --cert --key
    --durations --maxfail --exitfirst --capture --verbose --quiet --timeout-method
    --plaintext --import-path --proto --max-msg-sz -- --format --help --version
    --model-id --revision --max-batch-tokens --max-client-batch-size --auto-truncate
    --pooling --hostname --engine --batch-size --model-warmup --model-repository
    --model-control-mode --load-model --http-port --grpc-port --metrics-port
    --workers --port --host --reload --log-level --dtype --device --url-prefix
    --oneline --stat --all --check --diff --fix --preview --select --ignore
    --cov --cov-report --numprocesses --dist --benchmark-only --hypothesis-seed
    --system --home --now --variant --stop-timeout --offline --shape --shared-memory
    --concurrency-range --library-name --pooling-method
    --local-dir --include --exclude
    --served-model-name --max-concurrent-requests --payload-limit --prometheus-port
    --default-prompt-name
    """.split()  # noqa: SIM905 - a list of words reads better as words
)
# A line that names one of the repository's scripts, or another program, may name their flags.
SCRIPTS = re.compile(r"benchmarks|devkit|tests/|python -m|pytest|\bmake\b|\.sh\b")
TOOLS = re.compile(
    r"curl|pip|[Dd]ocker|podman|kubectl|useradd|systemctl|systemd|debootstrap|perf_analyzer|"
    r"optimum|[Ii]nfinity|text-embeddings|tritonserver|Triton|grpcurl|\bgit\b|mkdocs|uvicorn|"
    r"TEI|LitServe|ruff|mypy|kubeconform|kustomize"
    r"|huggingface-cli|\bhf download"
)
# Routes of other servers the docs compare with (Infinity's, OpenAI's), and URL paths that are
# not ours (the OTLP collector's).
FOREIGN_ROUTES = frozenset({"POST /embeddings", "/v1/traces"})
# OpenTelemetry's resource attributes, not our modules.
FOREIGN_DOTTED = frozenset({"service.name", "service.version", "service.instance.id"})
# File names of other tools' conventions (grpcio's generated stubs).
FOREIGN_FILES = frozenset({"_pb2_grpc.py"})
# Peers whose own extras a line may name ("Infinity's `optimum` extra").
PEERS = re.compile(r"Infinity|TEI|Triton|optimum|sentence-transformers|transformers'")
# A line holding this comment is not checked (a name that no longer exists, on purpose: history).
EXEMPT = "<!-- drift-ok:"
# Environment variables of other programs the docs may name.
FOREIGN_ENV = frozenset({"RINGSERVE_"})  # the prefix itself, in prose about the convention

METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD")
FENCE = re.compile(r"^\s*(```|~~~)")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*(?![\w-])")
RINGSERVE_CMD = re.compile(r"\bringserve\s+(?!ctl\b)([a-z][a-z-]*)\b")
CTL_CMD = re.compile(r"\bringserve\s+ctl(?:\s+--control[= ]\S+)?\s+([a-z][a-z-]*)")
CMD_JSON = re.compile(r'["\']cmd["\']\s*:\s*["\']([A-Za-z_-]+)')
ROUTE = re.compile(r"\b(GET|POST|PUT|DELETE|PATCH|HEAD)\s+(/[A-Za-z0-9_{}<>./:\[\]-]*)")
# A path alone names its routes; it is checked only under /v1 and /v2 (others may be files).
BARE_ROUTE = re.compile(r"`(/[A-Za-z0-9_{}<>.:\[\]/-]*)[`?]")
METRIC = re.compile(r"(?<![\w/.-])ringserve_[a-z0-9_]*[a-z0-9_*]")
ENV = re.compile(r"\bRINGSERVE_[A-Z0-9_]*[A-Z0-9]\b")
EXTRA = re.compile(r"(?:(?<=[.e])|(?<=ringserve))\[([a-z0-9_-]+(?:,\s*[a-z0-9_-]+)*)\]")
EXTRA_WORD = re.compile(r"`\[?([a-z0-9_-]+)\]?` extras?\b|\bthe ([a-z0-9_-]+) extras?\b")
DOTTED = re.compile(
    r"(?<![\w./-])((?:ringserve\.)?(?:service|factory|workers|wire|shm|devkit|benchmarks)"
    r"(?:\.[A-Za-z_]\w*)+)"
)
FILE = re.compile(
    r"(?<![\w./~$-])((?:(?:"
    + "|".join(TOP_DIRS)
    + r"|\.ci|\.github)/[\w./*{}@-]*[\w*}])|[\w./-]*\.py|[A-Z][A-Z_-]+\.md|Makefile|Dockerfile"
    r"|pyproject\.toml|mkdocs\.yml)(?![\w/-])"
)
ROOT_FILES = ("pyproject.toml", "mkdocs.yml")
TOML_KEY = re.compile(r"^\s*([A-Za-z_][\w-]*)\s*=")
TOML_TABLE = re.compile(r"^\s*\[([\w.-]+)\]\s*$")


@dataclass
class Names:
    """What the code defines, by kind. `commands`: each `ringserve` command's flags."""

    commands: dict[str, set[str]]
    other_flags: set[str]  # the repository's scripts' own (benchmarks/, devkit/, tests/)
    config_keys: set[str]  # top level, dashes and underscores both
    model_keys: set[str]  # a [models.NAME] table's
    env: set[str]
    routes: set[tuple[str, str]]  # (METHOD, /path/{param})
    metrics: set[str]
    control: set[str]
    extras: set[str]
    files: set[str]  # repository-relative paths (files and folders)
    public_flags: set[str] = field(default_factory=set)
    defaults: dict[str, object] = field(default_factory=dict)  # `serve`'s flag -> its default
    statuses: dict[tuple[str, str], set[int]] = field(default_factory=dict)  # route -> statuses

    @classmethod
    def from_code(cls) -> Names:
        from ringserve.service.config.settings import MODEL_SETTINGS, SETTINGS
        from ringserve.service.protocols.control import COMMANDS as CONTROL

        from devkit import docgen

        commands = {c: flags_of(docgen.command_help([c, "--help"])) for c in docgen.COMMANDS}
        commands["config"] |= commands["serve"]  # `config show [serve flags]`
        keys = {s.name for s in SETTINGS} | {s.attr for s in SETTINGS} | {"models"}
        model_keys = {m.name for m in MODEL_SETTINGS} | {m.attr for m in MODEL_SETTINGS}
        pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
        return cls(
            commands=commands,
            other_flags=script_flags(),
            config_keys=keys,
            model_keys=model_keys,
            env={s.env for s in SETTINGS} | code_env(),
            routes=code_routes(),
            metrics=code_metrics(),
            control=set(CONTROL),
            extras=set(pyproject["project"]["optional-dependencies"]),
            files=repository_files(),
            public_flags={f"--{s.name}" for s in SETTINGS},
            defaults={f"--{s.name}": s.default for s in SETTINGS},
            statuses=route_statuses(),
        )

    def renamed(self, kind: str, old: str, new: str) -> Names:
        """A copy with one name of `kind` (flag, route, metric, control) renamed, for tests."""
        copy = dataclasses.replace(
            self,
            commands={c: set(f) for c, f in self.commands.items()},
            public_flags=set(self.public_flags),
            routes=set(self.routes),
            metrics=set(self.metrics),
            control=set(self.control),
        )
        if kind == "flag":
            for flags in (*copy.commands.values(), copy.public_flags):
                if old in flags:
                    flags.discard(old)
                    flags.add(new)
        elif kind == "route":
            method, path = old.split(" ", 1)
            copy.routes.discard((method, path))
            copy.routes.add(tuple(new.split(" ", 1)))  # type: ignore[arg-type]
        else:
            names = copy.metrics if kind == "metric" else copy.control
            names.discard(old)
            names.add(new)
        return copy

    def flags_for(self, text: str) -> set[str]:
        """The flags a line may name: ringserve's; the scripts' where it names a script; other
        programs' where it names one."""
        out = set().union(*self.commands.values())
        scripts, tools = speaks_of(text)
        if scripts:
            out |= self.other_flags
        if tools:
            out |= FOREIGN_FLAGS
        return out


@functools.lru_cache(maxsize=64)
def speaks_of(text: str) -> tuple[bool, bool]:
    """Whether `text` names one of the repository's scripts, and another program."""
    return bool(SCRIPTS.search(text)), bool(TOOLS.search(text))


# -- the names, from the code -------------------------------------------------------------------
def flags_of(help_text: str) -> set[str]:
    return set(FLAG.findall(help_text))


def python_files(*dirs: str) -> list[Path]:
    out: list[Path] = []
    for d in dirs:
        out += sorted(p for p in (ROOT / d).rglob("*.py") if ".venv" not in p.parts)
    return out


@functools.cache
def parsed(path: Path) -> ast.Module:
    """A Python file's syntax tree, parsed once a process: the names are read from every file
    by several walks (script_flags, code_env, message_lines), and parsing is most of their time."""
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def literals(path: Path) -> Iterable[tuple[int, str]]:
    """Each string literal of a Python file (f-strings' constant parts too) but its docstrings
    (read by people in the source, not printed), with its line."""
    tree = parsed(path)
    docstrings = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            docstrings.add(id(body[0].value))
    for node in ast.walk(tree):
        is_text = isinstance(node, ast.Constant) and isinstance(node.value, str)
        if is_text and id(node) not in docstrings:
            yield node.lineno, node.value


def script_flags() -> set[str]:
    """The options the repository's own scripts and tests take (add_argument, addoption, and
    `"--x" in argv` or `argv == ["--x"]` in a module's own `main`)."""
    out: set[str] = set()
    for path in python_files(*PACKAGES, "benchmarks", "devkit", "tests"):
        tree = parsed(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                out |= {
                    c.value
                    for c in ast.walk(node)
                    if isinstance(c, ast.Constant) and FLAG.fullmatch(str(c.value))
                }
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") in (
                "add_argument",
                "addoption",
            ):
                out |= {
                    a.value
                    for a in node.args
                    if isinstance(a, ast.Constant) and str(a.value).startswith("--")
                }
    return out


def code_env() -> set[str]:
    out: set[str] = set()
    for path in python_files(*PACKAGES, "devkit", "benchmarks", "tests"):
        for _, text in literals(path):
            out |= set(ENV.findall(text))
    for path in [ROOT / "Makefile", *(ROOT / "deploy").rglob("*")]:
        if path.is_file():
            out |= set(ENV.findall(path.read_text(encoding="utf-8", errors="replace")))
    return out


def code_routes() -> set[tuple[str, str]]:
    """Every route the HTTP and operator ports can register: the declarations the router
    mounts and the document is written from (protocols/endpoint.py)."""
    from devkit import docgen

    doc = docgen.default_document()
    return {(m, p) for m, p, _ in docgen.operations(doc)} | {e.key for e in docgen.every_route()}


def route_statuses() -> dict[tuple[str, str], set[int]]:
    """Each route's statuses as the OpenAPI document of a server with every task and a key
    lists them."""
    from ringserve.service.protocols import openapi

    from devkit import docgen

    doc = openapi.document(docgen.every_route(), facts())
    return {
        (m, p): {int(c) for c in op.get("responses", {})} for m, p, op in docgen.operations(doc)
    }


def facts():  # type: ignore[no-untyped-def]
    from ringserve.service.kserve.documents import VERSION
    from ringserve.service.protocols.endpoint import Facts
    from ringserve.service.version import version
    from ringserve.workers.artifact import TASKS

    return Facts(
        model="m",
        labels=["a", "b"],
        tasks=list(TASKS),  # every task's routes: the union a server of each could serve
        dimension=4,
        max_texts=1,
        max_documents=1,
        max_body=1,
        version=VERSION,
        server_version=version(),
        key=True,
        models=("m", "n"),
    )


PROMETHEUS = ROOT / "service" / "ops" / "prometheus.py"
KINDS = ("counter", "gauge", "histogram")


def code_metrics() -> set[str]:
    """The metric families /metrics writes: service/ops/prometheus.py's `ringserve_` literals."""
    return {t for _, t in literals(PROMETHEUS) if re.fullmatch(r"ringserve_[a-z0-9_]+", t)}


def metric_families() -> dict[str, tuple[str, str]]:
    """Each family's (type, help) as service/ops/prometheus.py writes it: read from the tuple or
    the call that names it (a family whose help is added where it is written has that part
    left out; one named in a loop's table takes the help of the loop's call)."""
    tree = ast.parse(PROMETHEUS.read_text(encoding="utf-8"))
    parent: dict[int, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parent[id(child)] = node

    def texts(node: ast.AST) -> list[str]:
        items = node.elts if isinstance(node, ast.Tuple) else getattr(node, "args", [])
        return [c.value for c in items if isinstance(c, ast.Constant) and isinstance(c.value, str)]

    def enclosing(node: ast.AST, kind: type) -> ast.AST | None:
        while id(node) in parent:
            node = parent[id(node)]
            if isinstance(node, kind):
                return node
        return None

    out: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and code_metric(node.value)):
            continue
        holder = parent[id(node)]
        if not isinstance(holder, ast.Tuple | ast.Call):
            continue
        near = texts(holder)
        kinds = [t for t in near if t in KINDS]
        helps = [t for t in near if " " in t]
        loop = enclosing(holder, ast.For)
        if not helps and loop is not None and enclosing(holder, ast.For) is not None:
            calls = [c for b in loop.body for c in ast.walk(b) if isinstance(c, ast.Call)]
            helps = [t for c in calls for t in texts(c) if " " in t][:1]
        if not kinds:
            func = enclosing(holder, ast.FunctionDef)
            used = {c.value for c in ast.walk(func) if isinstance(c, ast.Constant)} if func else {}
            found = [k for k in KINDS if k in used]
            kinds = found if len(found) == 1 else []
        kind = kinds[0] if kinds else ("counter" if node.value.endswith("_total") else "gauge")
        seen = out.get(node.value)
        if seen is None or (helps and not seen[1]):
            out[node.value] = (kind, helps[0] if helps else "")
    return dict(sorted(out.items()))


def code_metric(value: object) -> bool:
    return isinstance(value, str) and re.fullmatch(r"ringserve_[a-z0-9_]+", value) is not None


def repository_files() -> set[str]:
    """The repository's files as git lists them (tracked, and new ones not ignored), and their
    folders; outside a git checkout, the tree without its virtualenv and caches."""
    import subprocess

    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        skip = {".venv", ".git", "__pycache__", "build", ".mypy_cache", ".ruff_cache"}
        listed = [
            p.relative_to(ROOT).as_posix()
            for p in ROOT.rglob("*")
            if p.is_file() and not skip & set(p.relative_to(ROOT).parts)
        ]
    out = set(listed)
    for name in listed:
        parts = name.split("/")
        out |= {"/".join(parts[:i]) for i in range(1, len(parts))}
    return out


# -- the pages ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Line:
    where: str  # FILE:LINE
    text: str
    code: str  # the fence's language, or "" in prose
    section: str = ""  # the text under the same heading: which programs it speaks of


def page_lines(path: Path) -> list[Line]:
    rel = path.relative_to(ROOT).as_posix()
    out: list[Line] = []
    lang = ""
    in_code = False
    held = ""
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(raw):
            in_code = not in_code
            lang = raw.strip().strip("`~").split(" ")[0] or "text" if in_code else ""
            continue
        if in_code and raw.rstrip().endswith("\\"):  # a shell line continued: read as one
            held += raw.rstrip()[:-1] + " "
            continue
        out.append(Line(f"{rel}:{n}", held + raw, lang if in_code else ""))
        held = ""
    return with_sections(out)


def with_sections(lines: list[Line]) -> list[Line]:
    out: list[Line] = []
    group: list[Line] = []
    for line in [*lines, Line("", "# end", "")]:
        if line.text.startswith("#") and not line.code:
            text = "\n".join(g.text for g in group)
            out += [dataclasses.replace(g, section=text) for g in group]
            group = []
        group.append(line)
    return out


def docs_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def message_lines() -> list[Line]:
    """The code's printed words: each string literal of service/, factory/, workers/."""
    out = []
    for path in python_files(*MESSAGE_DIRS):
        rel = path.relative_to(ROOT).as_posix()
        out += [Line(f"{rel}:{n}", text, "message") for n, text in literals(path)]
    return out


# -- the comparison -----------------------------------------------------------------------------
def drift(names: Names, lines: list[Line], messages: list[Line] | None = None) -> list[str]:
    """Every finding, as `FILE:LINE: KIND NAME: why`; the unnamed public names last."""
    out: list[str] = []
    named: dict[str, set[str]] = {"flag": set(), "route": set(), "metric": set(), "control": set()}
    toml_table = ""
    for line in lines:
        if EXEMPT in line.text:
            continue
        out += check_line(names, line, named)
        if line.code == "toml":
            out += check_toml(names, line, toml_table)
            table = TOML_TABLE.match(line.text)
            if table:
                toml_table = table.group(1)
    for line in messages or []:
        out += check_message(names, line)
    public = {
        "flag": names.public_flags,
        "route": {f"{m} {p}" for m, p in names.routes},
        "metric": names.metrics,
        "control": names.control - INTERNAL_COMMANDS,
    }
    for kind, defined in public.items():
        for name in sorted(defined - named[kind]):
            out.append(f"(no page): {kind} {name}: defined in the code, named on no docs page")
    return out


def check_line(names: Names, line: Line, named: dict[str, set[str]]) -> list[str]:
    out: list[str] = []
    text = line.text

    def bad(kind: str, name: str, why: str) -> None:
        out.append(f"{line.where}: {kind} {name}: {why}")

    # flags: after `ringserve COMMAND` on the line, that command's; elsewhere, any known one
    checked: set[int] = set()
    for m in re.finditer(r"\bringserve\s+([a-z][a-z-]*)\b([^`|;&\n]*)", text):
        command = m.group(1)
        if command not in names.commands and command != "ctl":
            continue
        own = names.commands.get(command, set()) | {"--control", "--version", "--help"}
        for f in FLAG.finditer(m.group(2)):
            checked.add(m.start(2) + f.start())
            if f.group() in own:
                named["flag"].add(f.group())
            else:
                bad("flag", f.group(), f"no such option of `ringserve {command}`")
    for f in FLAG.finditer(text):
        if f.start() in checked:
            continue
        known = names.flags_for(line.section or text)
        if f.group() in known:
            named["flag"].add(f.group())
        else:
            bad(
                "flag",
                f.group(),
                "no `ringserve` command takes it, nor a script its section names",
            )
    for m in RINGSERVE_CMD.finditer(text):
        if m.group(1) not in names.commands and looks_like_command(text, m, line.code):
            bad("command", f"ringserve {m.group(1)}", "no such `ringserve` command")
    for m in (*CTL_CMD.finditer(text), *CMD_JSON.finditer(text)):
        if m.group(1) in names.control:
            named["control"].add(m.group(1))
        else:
            bad("control command", m.group(1), "not in the control socket's command table")
    for m in ROUTE.finditer(text):
        said = f"{m.group(1)} {m.group(2).rstrip('.:,')}"
        routes = match_route(names.routes, m.group(1), m.group(2))
        named["route"] |= routes
        if not routes and said not in FOREIGN_ROUTES:
            bad("route", said, "no such HTTP route")
    for m in BARE_ROUTE.finditer(text):
        path = m.group(1).rstrip("/") or "/"
        routes = set().union(*(match_route(names.routes, meth, path) for meth in METHODS))
        named["route"] |= routes
        if routes or path in FOREIGN_ROUTES or not path.startswith(("/v1/", "/v2/")):
            continue
        if not any(p.startswith(path + "/") for _, p in names.routes):
            bad("route", m.group(1), "no HTTP route has this path")
    for m in METRIC.finditer(text):
        metric = m.group()
        found = metric_of(names.metrics, metric)
        if found:
            named["metric"] |= found
        else:
            bad("metric", metric, "/metrics writes no such family")
    for m in ENV.finditer(text):
        if m.group() not in names.env and m.group() not in FOREIGN_ENV:
            bad("environment variable", m.group(), "nothing reads it")
    for m in EXTRA.finditer(text):
        for extra in re.split(r",\s*", m.group(1)):
            if extra not in names.extras:
                bad("extra", f"[{extra}]", "pyproject.toml has no such extra")
    for m in EXTRA_WORD.finditer(text):
        extra = m.group(1) or m.group(2)
        if extra not in names.extras and not PEERS.search(text):
            bad("extra", extra, "pyproject.toml has no such extra")
    for m in DOTTED.finditer(text):
        if m.group(1) in FOREIGN_DOTTED:
            continue
        why = dotted_problem(m.group(1).rstrip("."))
        if why:
            bad("module path", m.group(1), why)
    if not line.code:
        for flag, said in said_defaults(text):
            if flag in names.defaults and not same_default(flag, names.defaults[flag], said):
                shown = names.defaults[flag]
                bad("default", f"{flag} {said}", f"its default is {shown!r} (settings.py)")
    if not line.code and names.statuses:
        for route, code in said_statuses(names, text):
            bad("status", f"{route} {code}", "the OpenAPI document lists no such answer of it")
    page = line.where.rsplit(":", 1)[0]
    for m in FILE.finditer(text):
        relative = (Path(page).parent / m.group(1)).as_posix()
        if not normal(relative).startswith("../") and normal(relative) in names.files:
            continue  # a link's target, from the page's folder
        why = file_problem(names.files, m.group(1))
        if why and m.group(1) not in FOREIGN_FILES:
            bad("file", m.group(1), why)
    return out


# A default said beside its flag in prose: "`--x` (default 5", "`--x`, default 5", "`--x` (5 s)",
# "`--x` windows (default 16", "`--x` (default `./path`)". A value that is not a number or a code
# span ("the artifact's", "a quarter") is not compared.
SAID_DEFAULT = re.compile(
    r"`(--[a-z0-9-]+)`(?:\s+[a-z]+)?(?:\s*\((?:default:?\s*)?|,\s*default:?\s+)"
    r"(`[^`]+`|\d[\d,]*(?:\.\d+)?(?:\s?(?:ms|s|KiB|MiB|GiB|tokens|texts)\b)?)(?=[\s),;:.]|$)"
)
UNIT_BYTES = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def said_defaults(text: str) -> list[tuple[str, str]]:
    """Each (flag, value) a prose line gives as a flag's default."""
    out = []
    for m in SAID_DEFAULT.finditer(text):
        in_sum = text[: m.start()].rstrip().endswith("+")  # `--a` + `--b` (3 s): the sum's
        if not in_sum:
            out.append((m.group(1), m.group(2)))
    return out


def same_default(flag: str, default: object, said: str) -> bool:
    """Whether `said` ("1 MiB", "1,000 ms", "`./ringserve.sock`") is `default`; a default that
    is chosen at start (None) is not compared."""
    if default is None:
        return True
    if said.startswith("`"):
        value = said.strip("`")
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else str(default)
        return value == shown or value.endswith(":" + shown)  # `127.0.0.1:8000` for --port
    number, _, unit = said.replace(",", "").partition(" ")
    if not unit and number[-1:] in "sx" and not number[-1:].isdigit():
        number, unit = number.rstrip("sx"), number[-1]
    try:
        value = float(number) * UNIT_BYTES.get(unit, 1)
    except ValueError:
        return True
    if unit == "ms" and flag.endswith("-s"):
        value /= 1000
    elif unit == "s" and flag.endswith("-ms"):
        value *= 1000
    if isinstance(default, bool) or not isinstance(default, int | float):
        return True  # a flag's on/off, a word: not a number to compare
    return abs(value - float(default)) < 1e-9


STATUS = re.compile(r"(?<![\w.,/-])([45]\d\d)(?![\w.,/-])")


def said_statuses(names: Names, text: str) -> list[tuple[str, int]]:
    """Each (route, status) a sentence or table row says a route answers that its OpenAPI
    entry does not list: one route named, then 4xx/5xx codes after it."""
    if text.startswith("|"):
        units = [(text.split("|")[1], text)]
    else:
        units = [(s, s) for s in re.split(r"(?<=[.;])\s", text)]
    out = []
    for where, unit in units:
        found = list(ROUTE.finditer(where))
        if len(found) != 1:
            continue
        said = found[0].group(0)
        codes = {int(c) for c in STATUS.findall(unit[unit.find(said) + len(said) :])}
        for route in match_route(set(names.statuses), found[0].group(1), found[0].group(2)):
            method, path = route.split(" ", 1)
            out += [(route, c) for c in sorted(codes - names.statuses[method, path])]
    return out


def normal(path: str) -> str:
    parts: list[str] = []
    for part in path.split("/"):
        if part == ".." and parts and parts[-1] != "..":
            parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    return "/".join(parts)


def looks_like_command(text: str, m: re.Match[str], line_code: str) -> bool:
    """`ringserve serve` in a code span or a shell line, not "ringserve answers" in prose."""
    before = text[: m.start()]
    return before.count("`") % 2 == 1 or (before.strip() in ("", "$") and bool(line_code))


def check_toml(names: Names, line: Line, table: str) -> list[str]:
    key = TOML_KEY.match(line.text)
    if not key:
        return []
    name = key.group(1)
    allowed = names.model_keys if table.startswith("models.") else names.config_keys
    if table and not table.startswith("models."):
        return []  # pyproject.toml, a model's own TOML: not the server's config file
    if name in allowed:
        return []
    where = f"[{table}] table" if table else "top level"
    return [f"{line.where}: config key {name}: not a key of the config file's {where}"]


def check_message(names: Names, line: Line) -> list[str]:
    out: list[str] = []
    text = line.text
    for m in re.finditer(r"\bringserve ([a-z][a-z-]*)\b(?!:)([^`;\n]*)", text):
        command = m.group(1)
        if command in PROCESS_TITLES:
            continue
        if command not in names.commands and command != "ctl":
            out.append(f"{line.where}: command ringserve {command}: no such `ringserve` command")
            continue
        own = names.commands.get(command, set()) | {"--control", "--help"}
        for f in FLAG.findall(m.group(2)):
            if f not in own:
                out.append(f"{line.where}: flag {f}: no such option of `ringserve {command}`")
    known = names.flags_for(text) | names.other_flags
    for f in FLAG.findall(text):
        if f not in known:
            out.append(f"{line.where}: flag {f}: no `ringserve` command or script takes it")
    for m in FILE.finditer(text):
        if m.group(1).endswith((".md", ".py")):
            why = file_problem(names.files, m.group(1))
            if why:
                out.append(f"{line.where}: file {m.group(1)}: {why}")
    return out


def variants(path: str) -> list[str]:
    """A path with optional parts in brackets (`/v2/models[/{name}]/stats`), each way."""
    m = re.search(r"\[([^\[\]]*)\]", path)
    if not m:
        return [path]
    return variants(path[: m.start()] + m.group(1) + path[m.end() :]) + variants(
        path[: m.start()] + path[m.end() :]
    )


def match_route(routes: set[tuple[str, str]], method: str, path: str) -> set[str]:
    """The routes `METHOD path` names (every way of its optional parts); a literal segment
    names its own route before a template's parameter (`/v2/models/stats`)."""
    out: set[str] = set()
    for said in variants(path.split("?")[0].rstrip(".:,")):
        if said.endswith("/") and said != "/":
            said = said[:-1]
        if (method, said) in routes:
            out.add(f"{method} {said}")
            continue
        segments = said.split("/")
        found = {
            f"{m} {p}"
            for m, p in routes
            if m == method
            and len(p.split("/")) == len(segments)
            and all(
                a == b or a.startswith("{") or b.startswith(("{", "<")) or b.isupper()
                for a, b in zip(p.split("/"), segments, strict=True)
            )
        }
        if not found:
            return set()  # one way of the optional parts names nothing
        out |= found
    return out


def metric_of(metrics: set[str], name: str) -> set[str]:
    """The families `name` names: itself, a histogram's series of it, or a prefix `x_*`."""
    if name.endswith(("*", "_")):
        prefix = name.rstrip("*")
        return {m for m in metrics if m.startswith(prefix)}
    for suffix in ("", "_bucket", "_sum", "_count"):
        if suffix and name.endswith(suffix) and name[: -len(suffix)] in metrics:
            return {name[: -len(suffix)]}
        if not suffix and name in metrics:
            return {name}
    return set()


def dotted_problem(name: str) -> str | None:
    """Why `ringserve.service.x.Y` (or `service.x`, `devkit.x`) names nothing, or None."""
    full = name
    if full.split(".")[0] in PACKAGES:
        full = "ringserve." + full
    parts = full.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            continue
        if i == len(parts):
            return None
        try:
            obj: object = importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - any failure is the finding
            return f"{module} does not import: {exc!r}"
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return f"{module} has no {'.'.join(parts[i:])}"
            obj = getattr(obj, attr)
        return None
    return "no such module"


def file_problem(files: set[str], name: str) -> str | None:
    name = name.rstrip(".")
    if any(c in name for c in "*{}"):
        pattern = re.escape(name).replace(r"\*", "[^/]*").replace(r"\{", "{").replace(r"\}", "}")
        pattern = re.sub(r"\{[^}]*\}", "[^/]+", pattern)
        return None if any(re.fullmatch(pattern, f) for f in files) else "matches no file"
    if name in files or name.rstrip("/") in files:
        return None
    if name.split("/")[0] in TOP_DIRS or name[:1].isupper() or name in ROOT_FILES:
        return "no such file in the repository"
    # a path inside a package (`rpc/h2.py`, `settings.py`): some file must end with it
    if any(f == name or f.endswith("/" + name) for f in files):
        return None
    return "no file of the repository has this path" if "/" in name else "no such file"


def findings() -> list[str]:
    lines = [line for page in docs_pages() for line in page_lines(page)]
    return drift(Names.from_code(), lines, message_lines())


def main() -> int:
    found = findings()
    for f in found:
        print(f)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
