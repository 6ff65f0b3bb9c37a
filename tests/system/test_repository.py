"""A model repository on a real server: what it starts with, `ctl models` and `status`, an
unload (its requests then 404), a load again, a refused load (its reason kept, the others
serving), a reload of every model, and --model-control none refusing loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit.launcher import ROOT
from devkit.server import ServerProc, serving


def copy_artifact(source: str, target: Path) -> Path:
    """The artifact's files linked (they are large and never written), its manifest copied
    (a test may edit it)."""
    target.mkdir(parents=True)
    for f in Path(source).iterdir():
        if f.name == "manifest.json":
            (target / f.name).write_bytes(f.read_bytes())
        else:
            os.symlink(f, target / f.name)
    return target


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Path:
    root = tmp_path_factory.mktemp("repo")
    copy_artifact(default_model, root / "alpha")  # an artifact: version 1
    copy_artifact(default_model, root / "beta" / "1")
    copy_artifact(default_model, root / "beta" / "3")  # the highest version serves
    (root / "empty").mkdir()  # no artifact, no versions: listed, never loaded
    return root


@pytest.fixture(scope="module")
def explicit(tmp_path_factory: pytest.TempPathFactory, repo: Path) -> Iterator[ServerProc]:
    args = ["--model-repository", str(repo), "--model-control", "explicit"]
    args += ["--model", "alpha", "--model", "beta", "--workers", "1", "--spares", "0"]
    with serving(ServerProc(tmp_path_factory.mktemp("explicit"), args), 1) as srv:
        yield srv


def rows(srv: ServerProc) -> dict[str, dict[str, Any]]:
    reply = srv.ctl({"cmd": "models"})
    assert reply["ok"], reply
    return {r["name"]: r for r in reply["models"]}


def classify(srv: ServerProc, model: str) -> int:
    status, _, _ = srv.request("POST", "/v1/classify", {"text": "a fine film", "model": model})
    return status


def v1_names_models(srv: ServerProc) -> bool:
    """Whether /v1 takes "model" (the protocols' part of many models)."""
    status, _, data = srv.request("GET", "/openapi.json")
    return status == 200 and b'"model"' in data and b"/v1/models" in data


def ctl_command(srv: ServerProc, *argv: str) -> tuple[int, dict[str, Any]]:
    """`ringserve ctl ...` as an operator types it: its exit code and its answer."""
    command = [sys.executable, "-m", "ringserve.service.cli", "ctl", "--control", srv.control]
    out = subprocess.run(
        [*command, *argv], capture_output=True, text=True, timeout=600, cwd=ROOT, check=False
    )
    return out.returncode, json.loads(out.stdout)


def ctl(srv: ServerProc, **cmd: Any) -> dict[str, Any]:
    return srv.ctl(cmd, timeout=600)


def test_start_lists_every_model_of_the_repository(explicit: ServerProc) -> None:
    found = rows(explicit)
    assert set(found) == {"alpha", "beta", "empty"}
    assert (found["alpha"]["state"], found["alpha"]["version"]) == ("READY", "1")
    assert (found["beta"]["state"], found["beta"]["version"]) == ("READY", "3")
    assert found["empty"]["state"] == "UNAVAILABLE"
    assert "no artifact" in found["empty"]["reason"]
    status = explicit.status()
    models = {m["name"]: m for m in status["models"]}
    assert set(models) == {"alpha", "beta"}
    for m in models.values():
        assert m["state"] == "READY" and len(m["fingerprint"]) >= 16
        assert "rss_bytes_per_worker" in m
    assert models["alpha"]["fingerprint"] == models["beta"]["fingerprint"]  # the same files


def worker_pids(srv: ServerProc) -> list[int]:
    """The serving workers (a replaced one is listed while it drains)."""
    return [w["pid"] for w in srv.status()["workers"] if w["state"] in ("ready", "degraded")]


def test_unload_then_load_again(explicit: ServerProc) -> None:
    first = worker_pids(explicit)
    reply = ctl(explicit, cmd="unload", model="beta")
    assert reply["ok"], reply
    assert rows(explicit)["beta"]["state"] == "UNAVAILABLE"
    assert [m["name"] for m in explicit.status()["models"]] == ["alpha"]
    rolled = worker_pids(explicit)
    assert len(rolled) == 1 and rolled != first  # the worker holding beta was replaced
    assert classify(explicit, "alpha") == 200
    if v1_names_models(explicit):
        assert classify(explicit, "beta") == 404
    again = ctl(explicit, cmd="unload", model="beta")
    assert (again["ok"], again.get("code")) == (False, 404), again
    reply = ctl(explicit, cmd="load", model="beta", version=1)
    assert reply["ok"], reply
    found = rows(explicit)
    assert (found["beta"]["state"], found["beta"]["version"]) == ("READY", "1")
    assert classify(explicit, "beta") == 200 and classify(explicit, "alpha") == 200
    assert len(worker_pids(explicit)) == 1 and worker_pids(explicit) != rolled


def test_a_broken_artifact_is_refused_with_its_reason(
    explicit: ServerProc, repo: Path, default_model: str
) -> None:
    broken = copy_artifact(default_model, repo / "broken")
    manifest = json.loads((broken / "manifest.json").read_text())
    manifest["fingerprint"] = "0" * len(manifest["fingerprint"])
    (broken / "manifest.json").write_text(json.dumps(manifest))
    before, pids = explicit.status(), worker_pids(explicit)
    reply = ctl(explicit, cmd="load", model="broken")
    assert (reply["ok"], reply.get("code")) == (False, 400), reply
    assert "fingerprint" in reply["error"]
    found = rows(explicit)
    assert found["broken"]["state"] == "UNAVAILABLE"
    assert "fingerprint" in found["broken"]["reason"]
    after = explicit.status()

    def facts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:  # less the memory, a measurement
        return [{k: v for k, v in r.items() if k != "rss_bytes_per_worker"} for r in rows]

    assert facts(after["models"]) == facts(before["models"])  # nothing else changed
    assert worker_pids(explicit) == pids
    assert classify(explicit, "alpha") == 200
    missing = ctl(explicit, cmd="load", model="nowhere")
    assert (missing["ok"], missing.get("code")) == (False, 404), missing


def test_reload_rolls_every_model(explicit: ServerProc) -> None:
    before = explicit.status()
    reply = ctl(explicit, cmd="reload")
    assert reply["ok"], reply
    assert reply["generation"] > 0
    models = [(m["name"], m["state"]) for m in explicit.status()["models"]]
    assert models == [(m["name"], m["state"]) for m in before["models"]]
    assert classify(explicit, "alpha") == 200


def test_model_control_none_loads_the_repository_and_refuses_loads(
    tmp_path: Path, repo: Path
) -> None:
    args = ["--model-repository", str(repo), "--workers", "1", "--spares", "0"]
    with serving(ServerProc(tmp_path, args), 1) as srv:
        found = rows(srv)
        assert {n for n, r in found.items() if r["state"] == "READY"} == {"alpha", "beta"}
        for cmd in ({"cmd": "load", "model": "alpha"}, {"cmd": "unload", "model": "beta"}):
            reply = srv.ctl(cmd)
            assert (reply["ok"], reply.get("code")) == (False, 400), reply
            assert "explicit" in reply["error"]


def test_a_load_past_the_memory_budget_is_refused(tmp_path: Path, repo: Path) -> None:
    args = ["--model-repository", str(repo), "--model-control", "explicit", "--model", "alpha"]
    args += ["--memory-budget", "64M", "--workers", "1", "--spares", "0"]
    with serving(ServerProc(tmp_path, args), 1) as srv:
        code, reply = ctl_command(srv, "load", "beta", "--version", "1")
        assert code == 1 and (reply["ok"], reply["code"]) == (False, 409), reply
        assert "--memory-budget" in reply["error"]
        code, listed = ctl_command(srv, "models")
        assert code == 0
        beta = next(r for r in listed["models"] if r["name"] == "beta")
        assert beta["state"] == "UNAVAILABLE" and "--memory-budget" in beta["reason"]
        assert [m["name"] for m in srv.status()["models"]] == ["alpha"]
        assert classify(srv, "alpha") == 200
        code, reply = ctl_command(srv, "unload", "alpha")  # the only one: it stays
        assert code == 1 and reply["code"] == 409, reply
