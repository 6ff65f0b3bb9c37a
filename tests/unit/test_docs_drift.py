"""The docs name only what the code has, and the code's public names are all on some page
(devkit/drift.py): the check passes on the tree, and it fails, naming the page and line, when a
flag, a route, a metric or a control command is renamed in (a copy of) the code's names."""

from __future__ import annotations

import re

import pytest

from devkit import drift
from devkit.launcher import ROOT


@pytest.fixture(scope="module")
def names() -> drift.Names:
    return drift.Names.from_code()


@pytest.fixture(scope="module")
def lines() -> list[drift.Line]:
    return [line for page in drift.docs_pages() for line in drift.page_lines(page)]


def test_docs_and_messages_name_only_what_exists(
    names: drift.Names, lines: list[drift.Line]
) -> None:
    found = drift.drift(names, lines, drift.message_lines())
    hint = "docs drifted from the code (`python -m devkit.drift`; its docstring says how to fix):"
    assert found == [], "\n".join([hint, *found])


def test_names_are_read_from_the_code(names: drift.Names) -> None:
    assert "--max-queue" in names.commands["serve"] and "--from" in names.commands["export"]
    assert ("POST", "/v1/classify") in names.routes and ("GET", "/metrics") in names.routes
    assert {"ringserve_requests_total", "ringserve_queue_depth"} <= names.metrics
    assert {"status", "models", "load", "unload"} <= names.control
    assert {"encoder", "export", "test"} <= names.extras
    assert "RINGSERVE_MAX_QUEUE" in names.env and "max_queue" in names.config_keys


def test_metrics_page_has_each_family_with_its_type_and_help(names: drift.Names) -> None:
    """docs/reference/metrics.md is generated from what service/ops/prometheus.py writes: every
    family, each with its type and (where the code gives it whole) its help line."""
    families = drift.metric_families()
    assert set(families) == names.metrics
    assert families["ringserve_requests_total"][0] == "counter"
    assert families["ringserve_queue_depth"] == (
        "gauge",
        "Texts admitted and not yet answered (bounded by --max-queue).",
    )
    assert families["ringserve_request_latency_seconds"][0] == "histogram"
    assert all(kind in drift.KINDS and help_text for kind, help_text in families.values())


RENAMES = [
    ("flag", "--max-queue", "--queue-max"),
    ("route", "POST /v1/classify", "POST /v1/label"),
    ("metric", "ringserve_queue_depth", "ringserve_queue_size"),
    ("control", "drain", "stop"),
]


@pytest.mark.parametrize(("kind", "old", "new"), RENAMES)
def test_a_rename_in_the_code_is_reported_where_the_docs_name_the_old(
    names: drift.Names, lines: list[drift.Line], kind: str, old: str, new: str
) -> None:
    """Rename one name in a copy of the code's names (the code is not touched): each page line
    that names the old one is reported with its file and line, and the new one as unnamed."""
    assert drift.drift(names, lines) == []
    found = drift.drift(names.renamed(kind, old, new), lines)
    label = {"control": "control command"}.get(kind, kind)
    said = old.split(" ", 1)[1] if kind == "route" else old
    reported = [f for f in found if f.startswith(("README.md:", "docs/"))]
    assert reported, found
    for finding in reported:
        where, what = finding.split(": ", 1)
        assert what.startswith(f"{label} "), finding
        assert said in what, finding
        path, line = where.rsplit(":", 1)
        text = (ROOT / path).read_text(encoding="utf-8").splitlines()[int(line) - 1]
        assert said in text or text.rstrip().endswith("\\"), finding  # the line names it
    pages = {f.split(":", 1)[0] for f in reported}
    assert "docs/api.md" in pages, pages
    assert f"(no page): {kind} {new}: defined in the code, named on no docs page" in found


def at(text: str, code: str = "") -> list[drift.Line]:
    return [drift.Line("docs/x.md:1", text, code)]


@pytest.mark.parametrize(
    ("text", "code", "kind", "name"),
    [
        ("run `ringserve serve --no-such-flag 1`", "", "flag", "--no-such-flag"),
        ("`ringserve export --max-queue 3`", "", "flag", "--max-queue"),
        ("then `ringserve build DIR`", "", "command", "ringserve build"),
        ("`ringserve ctl pause`", "", "control command", "pause"),
        ('send `{"cmd": "pause"}`', "", "control command", "pause"),
        ("`GET /v1/nothing`", "", "route", "GET /v1/nothing"),
        ("`/v2/nothing/here`", "", "route", "/v2/nothing/here"),
        ("watch `ringserve_no_such_total`", "", "metric", "ringserve_no_such_total"),
        ("set `RINGSERVE_" + "NOPE`", "", "environment variable", "RINGSERVE_" + "NOPE"),
        ("pip install '.[nosuch]'", "sh", "extra", "[nosuch]"),
        ("the `nosuch` extra", "", "extra", "nosuch"),
        ("see `service/protocols/nosuch.py`", "", "file", "service/protocols/nosuch.py"),
        ("see `rpc/h2.py`", "", "file", "rpc/h2.py"),
        ("`DESIGN.md` says", "", "file", "DESIGN.md"),
        ("`service.corpus.Corpus`", "", "module path", "service.corpus.Corpus"),
        (
            "`ringserve.service.config.settings.NOPE`",
            "",
            "module path",
            "ringserve.service.config.settings",
        ),
        ("max_queue_size = 3", "toml", "config key", "max_queue_size"),
    ],
)
def test_each_kind_of_name_is_checked(
    names: drift.Names, text: str, code: str, kind: str, name: str
) -> None:
    """(A name the check must not find in the code is written in two parts here: the check
    reads the repository's literals, this file's among them.)"""
    found = [f for f in drift.drift(names, at(text, code)) if not f.startswith("(no page)")]
    assert len(found) == 1 and found[0].startswith(f"docs/x.md:1: {kind} {name}"), found


@pytest.mark.parametrize(
    "text",
    [
        "`ringserve serve --max-queue 64 --workers 2`",
        "`POST /v2/models/{name}/infer` and `GET /v2/models[/{name}[/versions/{v}]]/stats`",
        "`ringserve_request_latency_seconds_bucket`, `ringserve_gpu_*`",
        "`ringserve ctl load NAME --version 2`, `service/protocols/control.py`",
        "`ringserve.service.offline.corpus.Corpus`, `deploy/systemd/ringserve@.service`",
        "`pip install 'ringserve[encoder]'`, `RINGSERVE_MAX_QUEUE`",
        "sudo useradd --system --home /opt/ringserve ringserve",
        "`benchmarks.serving --lone`, an old flag <!-- drift-ok: history -->",
    ],
)
def test_what_exists_is_not_reported(names: drift.Names, text: str) -> None:
    assert [f for f in drift.drift(names, at(text)) if not f.startswith("(no page)")] == []


def test_the_codes_messages_are_checked(names: drift.Names) -> None:
    """A message the code prints naming a command or a flag that does not exist is reported with
    its file and line (the literals of service/, factory/ and workers/; docstrings aside)."""
    message = [drift.Line("service/x.py:7", "built by `ringserve build` with --no-such", "m")]
    found = drift.drift(names, [], message)
    assert "service/x.py:7: command ringserve build: no such `ringserve` command" in found
    assert any(re.match(r"service/x\.py:7: flag --no-such: ", f) for f in found), found
    assert drift.message_lines(), "the code's literals are read"


@pytest.mark.parametrize(
    "text",
    [
        "1 to `--max-texts`, default 512",
        "body over `--max-body` (2 MiB)",
        "`--max-queue-ms` (default 500 ms)",
        "`--request-timeout-s` (60 s)",
        "`--window-stride` tokens (default 64)",
        "`--control` (default `./server.sock`)",
    ],
)
def test_a_wrong_default_beside_its_flag_is_reported(names: drift.Names, text: str) -> None:
    found = [f for f in drift.drift(names, at(text)) if not f.startswith("(no page)")]
    assert len(found) == 1 and found[0].startswith("docs/x.md:1: default --"), found
    assert "(settings.py)" in found[0]


@pytest.mark.parametrize(
    "text",
    [
        "1 to `--max-texts`, default 256; over `--max-body` (1 MiB), `--max-head` (8 KiB)",
        "`--max-queue-ms` (default 1,000 ms), `--read-timeout-s` (10 s)",
        "`--grpc-port` (default 8002, `0` = off)",
        "`--control` (default `./ringserve.sock`), on `--host`:`--port` (default `127.0.0.1:8000`)",
        "within `--bulk-max-wait-ms` + `--max-queue-ms` (3 s by default)",  # a sum
        "`--workers` (default: one per core), `--max-queue` (per model)",  # chosen at start; a word
    ],
)
def test_a_right_default_is_not_reported(names: drift.Names, text: str) -> None:
    assert [f for f in drift.drift(names, at(text)) if not f.startswith("(no page)")] == []


def test_a_default_changed_in_the_code_is_reported_where_the_docs_say_the_old(
    names: drift.Names, lines: list[drift.Line]
) -> None:
    changed = drift.dataclasses.replace(names, defaults={**names.defaults, "--max-texts": 128})
    found = drift.drift(changed, lines)
    said = [f for f in found if f.startswith("docs/api.md:") and "default --max-texts 256" in f]
    assert said, found


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("`GET /v2/health/live` answers 200, or 404 when the process is ill.", "404"),
        ("| `GET /v1/models/{name}` | its model, or 418 for a name not loaded |", "418"),
        ("`POST /v1/classify` answers 400 for a bad body, or 409 for a busy one.", "409"),
    ],
)
def test_a_status_a_route_does_not_answer_is_reported(
    names: drift.Names, text: str, said: str
) -> None:
    found = [f for f in drift.drift(names, at(text)) if not f.startswith("(no page)")]
    assert len(found) == 1 and found[0].startswith("docs/x.md:1: status "), found
    assert found[0].split(":", 2)[2].split(": ")[0].endswith(said), found


@pytest.mark.parametrize(
    "text",
    [
        "| `GET /v1/models/{name}` | its model; 404 for a name not loaded |",
        "`POST /v1/classify` answers 400, 413 or 503. Then 418 is said of no route.",
        "`GET /v2/health/ready` is 503 while draining",
    ],
)
def test_a_status_the_route_answers_is_not_reported(names: drift.Names, text: str) -> None:
    assert [f for f in drift.drift(names, at(text)) if not f.startswith("(no page)")] == []
