"""deploy/grafana: the dashboard JSON and the alert rules are well formed and ask only for metric
names and labels that a real server exports.

There is no PromQL parser here, so expressions get the checks that catch what goes wrong in
practice: metric names that do not exist (typos, renames), label names the metric does not carry,
unbalanced brackets, unknown functions and malformed range durations.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from devkit.launcher import ROOT
from devkit.metrics import LONG_TEXT, fake_gpu_exposition
from devkit.server import ServerProc, serving

GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "ringserve-dashboard.json"
ALERTS = GRAFANA / "alerts.yml"
TARGET_LABELS = {"instance", "job"}  # added by Prometheus at scrape time
FUNCTIONS = {
    "sum", "max", "min", "avg", "count", "by", "without", "rate", "irate", "increase",
    "histogram_quantile", "clamp_min", "clamp_max", "max_over_time", "min_over_time",
    "avg_over_time", "abs", "absent", "delta", "deriv",
}  # fmt: skip
DURATION = re.compile(r"^(\d+(ms|[smhdwy]))+$|^\$__(rate_)?interval$")
METRIC = re.compile(r"\bringserve_[A-Za-z0-9_]+")


def exported(text: str) -> dict[str, set[str]]:
    """Sample name -> label names seen, for one exposition (families' names included)."""
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            names.setdefault(s.name, set()).update(s.labels)
        labels = set().union(*(set(s.labels) - {"le"} for s in family.samples))
        names.setdefault(family.name, set()).update(labels)
    return names


@pytest.fixture(scope="module")
def known(
    tmp_path_factory: pytest.TempPathFactory, default_model: str
) -> Iterator[dict[str, set[str]]]:
    """What a real server exports after some traffic, plus the CUDA-only families."""
    args = ["--workers", "1", "--spares", "0"]
    with serving(ServerProc(tmp_path_factory.mktemp("grafana"), args), 1) as srv:
        srv.classify(["short", LONG_TEXT])
        srv.request("POST", "/v1/classify", b"not json")
        status, _, body = srv.request("GET", "/metrics")
        assert status == 200
        names = exported(body.decode())
    for name, labels in exported(fake_gpu_exposition()).items():
        names.setdefault(name, set()).update(labels)
    yield names


def balanced(expr: str) -> bool:
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    for ch in re.sub(r'"(\\.|[^"\\])*"', '""', expr):  # brackets inside strings do not count
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
            return False
    return not stack


def check_expr(expr: str, known: dict[str, set[str]]) -> set[str]:
    """Fail on anything wrong in `expr`; return the labels its result can carry."""
    assert balanced(expr), f"unbalanced brackets: {expr}"
    names = METRIC.findall(expr)
    assert names, f"no ringserve metric in: {expr}"
    for name in names:
        assert name in known, f"{name} is not exported by the server: {expr}"
    labels = set().union(*(known[n] for n in names)) | TARGET_LABELS | {"le"}
    for name, inner in re.findall(r"\b(ringserve_[A-Za-z0-9_]+)\s*\{([^}]*)\}", expr):
        for matcher in filter(None, (m.strip() for m in inner.split(","))):
            m = re.fullmatch(r'([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"[^"]*"', matcher)
            assert m, f"bad label matcher {matcher!r}: {expr}"
            assert m.group(1) in known[name] | TARGET_LABELS, f"{name} has no {m.group(1)}"
    for grouping in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        for label in filter(None, (x.strip() for x in grouping.split(","))):
            assert label in labels, f"grouping by unknown label {label!r}: {expr}"
    for duration in re.findall(r"\[([^\]]*)\]", expr):
        assert DURATION.match(duration.strip()), f"bad range {duration!r}: {expr}"
    for func in re.findall(r"\b([a-z_]+)\s*\(", expr):
        assert func in FUNCTIONS, f"unknown function {func}: {expr}"
    return labels


def test_dashboard_structure_and_names(known: dict[str, set[str]]) -> None:
    doc = json.loads(DASHBOARD.read_text())
    for key in ("uid", "title", "panels", "schemaVersion", "templating", "time"):
        assert key in doc, key
    assert isinstance(doc["schemaVersion"], int) and doc["title"]
    variables = {v["name"] for v in doc["templating"]["list"]}
    assert "datasource" in variables
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    occupied: set[tuple[int, int]] = set()
    queries = 0
    for p in doc["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        cells = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & occupied, f"panel {p['title']!r} overlaps another"
        occupied |= cells
        if p["type"] == "row":
            continue
        assert p["type"] in {"timeseries", "stat", "heatmap", "bargauge", "gauge", "table"}
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], f"panel {p['title']!r} has no query"
        for t in p["targets"]:
            labels = check_expr(t["expr"], known)
            for used in re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", "")):
                assert used in labels, f"legend uses {used!r} absent from {t['expr']}"
            queries += 1
    assert queries >= 20
    used = set(METRIC.findall(DASHBOARD.read_text()))
    for required in (
        "ringserve_requests_total",
        "ringserve_request_latency_seconds_bucket",
        "ringserve_batch_size_sum",
        "ringserve_queue_depth",
        "ringserve_inflight",
        "ringserve_worker_up",
        "ringserve_worker_restarts_total",
        "ringserve_worker_rss_bytes",
        "ringserve_gpu_memory_used_bytes",
        "ringserve_gpu_utilization_ratio",
    ):
        assert required in used, f"the dashboard does not show {required}"


def test_alert_rules_structure_and_names(known: dict[str, set[str]]) -> None:
    doc = yaml.safe_load(ALERTS.read_text())
    assert isinstance(doc, dict) and isinstance(doc["groups"], list) and doc["groups"]
    names: set[str] = set()
    exprs: dict[str, str] = {}
    for group in doc["groups"]:
        assert group["name"] and isinstance(group["rules"], list) and group["rules"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
            assert re.fullmatch(r"[A-Z][A-Za-z0-9]+", rule["alert"]), rule["alert"]
            assert rule["alert"] not in names, f"duplicate alert {rule['alert']}"
            names.add(rule["alert"])
            if "for" in rule:
                assert DURATION.match(str(rule["for"])), rule["for"]
            assert rule["labels"]["severity"] in {"critical", "warning", "info"}
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]
            labels = check_expr(str(rule["expr"]), known)
            text = json.dumps(rule["annotations"])
            for used in re.findall(r"\$labels\.(\w+)", text):
                assert used in labels, f"{rule['alert']} annotation uses {used!r}"
            exprs[rule["alert"]] = str(rule["expr"])
    joined = "\n".join(exprs.values())
    assert "ringserve_worker_restarts_total" in joined  # restarts
    assert "ringserve_rejected_requests_total" in joined  # overload
    assert "ringserve_worker_up" in joined  # worker down
    assert any(  # P99 over a threshold
        "histogram_quantile(0.99" in e and "ringserve_request_latency_seconds_bucket" in e
        for e in exprs.values()
    )


def test_checker_catches_mistakes(known: dict[str, set[str]]) -> None:
    """The checks above are only worth their passes if they fail on the usual mistakes."""
    bad = [
        "rate(ringserve_request_total[5m])",  # misspelt name
        'ringserve_worker_up{gpu="0"}',  # label the metric lacks
        "sum by (bucket) (ringserve_worker_up",  # unbalanced
        "rate(ringserve_requests_total[5 m])",  # bad duration
        "rates(ringserve_requests_total[5m])",  # unknown function
    ]
    for expr in bad:
        with pytest.raises(AssertionError):
            check_expr(expr, known)
    assert Path(DASHBOARD).is_file() and Path(ALERTS).is_file()
