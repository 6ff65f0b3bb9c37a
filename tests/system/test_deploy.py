"""The deploy/ files, checked offline, and the two things they rely on from the server: the
worker count taken from the cgroup CPU limit, and READY=1 sent to systemd once serving."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit.launcher import ROOT

DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.37.0"  # the newest kubernetes-validate knows
KSERVE_FIELDS = json.loads((Path(__file__).parents[1] / "kserve_fields.json").read_text())


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()) if d]


def by_kind(name: str) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in docs(name)}


# -- Kubernetes ----------------------------------------------------------------------------------
def k8s_validate(doc: dict[str, Any]) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("name", ["deployment.yaml"])
def test_kubernetes_files_pass_strict_validation(name: str) -> None:
    kinds = []
    for doc in docs(name):
        k8s_validate(doc)  # raises on any unknown field or wrong type
        kinds.append(doc["kind"])
    print(f"{name}: {kinds} valid (strict) against Kubernetes {K8S_VERSION}")
    assert sorted(kinds) == [
        "Deployment",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "Service",
    ]


def test_strict_validation_catches_a_typo() -> None:
    """The validator is not a rubber stamp: a misspelt field fails."""
    import kubernetes_validate

    bad = by_kind("deployment.yaml")["Deployment"]
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s_validate(bad)


def test_deployment_rolls_and_drains_safely() -> None:
    kinds = by_kind("deployment.yaml")
    dep = kinds["Deployment"]["spec"]
    pod = dep["template"]["spec"]
    (c,) = pod["containers"]
    args = dict(a.lstrip("-").split("=", 1) for a in c["args"])
    assert dep["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    delay, drain = float(args["shutdown-delay-s"]), float(args["drain-timeout-s"])
    assert delay > 0 or "preStop" in c.get("lifecycle", {})
    assert pod["terminationGracePeriodSeconds"] > delay + drain
    assert "workers" not in args  # taken from the CPU limit (cgroup cpu.max)
    # restricted Pod Security Standard
    sc, csc = pod["securityContext"], c["securityContext"]
    assert sc["runAsNonRoot"] and isinstance(sc["runAsUser"], int) and sc["runAsUser"] > 0
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert csc["allowPrivilegeEscalation"] is False and csc["capabilities"]["drop"] == ["ALL"]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["timeoutSeconds"] >= 3, probe
    shm = {v["name"]: v for v in pod["volumes"]}["dshm"]
    assert shm["emptyDir"]["medium"] == "Memory"
    assert any(m["mountPath"] == "/dev/shm" for m in c["volumeMounts"])
    assert {t["topologyKey"] for t in pod["topologySpreadConstraints"]} >= {
        "kubernetes.io/hostname"
    }
    assert kinds["PodDisruptionBudget"]["spec"]["minAvailable"] >= 1
    metrics = kinds["HorizontalPodAutoscaler"]["spec"]["metrics"]
    assert {"cpu", "ringserve_inflight"} <= {
        m.get("resource", m.get("pods", {}).get("metric", {})).get("name") for m in metrics
    }


# -- KServe --------------------------------------------------------------------------------------
PY_TYPES = {"str": str, "bool": bool, "int": int, "dict(str, str)": dict}


def check_fields(obj: dict[str, Any], kind: str, where: str) -> list[str]:
    """Every key is a field of `kind` (vendored schema excerpt), of the right simple type."""
    fields = KSERVE_FIELDS[kind]
    errors = []
    for key, value in obj.items():
        if key not in fields:
            errors.append(f"{where}.{key}: no such field in {kind}")
            continue
        want = fields[key]
        simple = PY_TYPES.get(want)
        if simple is not None and not isinstance(value, simple):
            errors.append(f"{where}.{key}: {want} expected, got {type(value).__name__}")
        if want.startswith("list[") and not isinstance(value, list):
            errors.append(f"{where}.{key}: a list expected")
    return errors


def kserve_errors(kinds: dict[str, dict[str, Any]]) -> list[str]:
    rt = kinds["ServingRuntime"]
    isvc = kinds["InferenceService"]
    errors = []
    if rt["apiVersion"] != "serving.kserve.io/v1alpha1":
        errors.append("ServingRuntime apiVersion")
    if isvc["apiVersion"] != "serving.kserve.io/v1beta1":
        errors.append("InferenceService apiVersion")
    errors += check_fields(rt["spec"], "ServingRuntimeSpec", "ServingRuntime.spec")
    for i, fmt in enumerate(rt["spec"]["supportedModelFormats"]):
        errors += check_fields(fmt, "SupportedModelFormat", f"supportedModelFormats[{i}]")
    predictor = isvc["spec"]["predictor"]
    errors += check_fields(predictor, "PredictorSpec", "InferenceService.spec.predictor")
    errors += check_fields(predictor["model"], "ModelSpec", "predictor.model")
    errors += check_fields(predictor["model"]["modelFormat"], "ModelFormat", "model.modelFormat")
    return errors


def test_kserve_fields_match_the_crd_schema() -> None:
    kinds = by_kind("kserve.yaml")
    errors = kserve_errors(kinds)
    # The runtime's containers and volumes are core Kubernetes types: validate them as a Pod's.
    spec = kinds["ServingRuntime"]["spec"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "ringserve-runtime-check"},
        "spec": {"containers": spec["containers"], "volumes": spec["volumes"]},
    }
    k8s_validate(pod)
    print(f"kserve.yaml: ServingRuntime + InferenceService fields checked, errors {errors}")
    assert errors == []
    typo = json.loads(json.dumps(kinds))
    typo["InferenceService"]["spec"]["predictor"]["model"]["storageURI"] = "pvc://x"
    assert kserve_errors(typo) == ["predictor.model.storageURI: no such field in ModelSpec"]


def test_kserve_runtime_serves_under_the_inference_service_name() -> None:
    kinds = by_kind("kserve.yaml")
    (c,) = kinds["ServingRuntime"]["spec"]["containers"]
    args = dict(a.lstrip("-").split("=", 1) for a in c["args"])
    assert args["model-name"] == "{{.Name}}"  # KServe fills in the InferenceService's name
    assert args["model"] == "/mnt/models"
    assert kinds["InferenceService"]["spec"]["predictor"]["model"]["storageUri"]
    assert int(args["workers"]) == int(c["resources"]["limits"]["cpu"])
    assert any(m["mountPath"] == "/dev/shm" for m in c["volumeMounts"])
    assert float(args["shutdown-delay-s"]) + float(args["drain-timeout-s"]) < 30


def test_model_name_serves_kserve_paths(start_server) -> None:
    srv = start_server("--workers", "1", "--spares", "0", "--model-name", "sst2-minilm-isvc")
    assert srv.request("GET", "/v2/models/sst2-minilm-isvc/ready")[0] == 200
    assert srv.request("GET", "/v2/models/sst2-minilm/ready")[0] == 404
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["fine"]}]}
    status, _, data = srv.request("POST", "/v2/models/sst2-minilm-isvc/infer", body)
    assert status == 200, data
    assert json.loads(data)["model_name"] == "sst2-minilm-isvc"


# -- container -----------------------------------------------------------------------------------
def test_containerfile() -> None:
    text = (DEPLOY / "container" / "Containerfile").read_text()
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    entry = next(ln for ln in lines if ln.startswith("ENTRYPOINT"))
    assert "tini" in json.loads(entry.split(None, 1)[1])[0]
    user = [ln for ln in lines if ln.startswith("USER")][-1].split()[1]
    assert re.fullmatch(r"\d+(:\d+)?", user), user
    assert re.search(r"^ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu$", text, re.M)
    assert any(ln.startswith("HEALTHCHECK") for ln in lines)
    assert "--stop-timeout" in text  # documented: Docker's 10 s default cuts a 30 s drain


# -- systemd -------------------------------------------------------------------------------------
UNITS = ["ringserve.service", "ringserve@.service"]


def installed_copy(tmp_path: Path, unit: str) -> Path:
    """The unit as installed: ExecStart pointing at this checkout's ringserve (verify checks that
    the binary exists), and a template under an instance name."""
    text = (DEPLOY / "systemd" / unit).read_text()
    text = text.replace(
        "/opt/ringserve/.venv/bin/ringserve", str(Path(sys.executable).parent / "ringserve")
    )
    path = tmp_path / unit.replace("@.", "@blue.")
    path.write_text(text)
    return path


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemd-analyze", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze not installed (no systemd here)",
)
@pytest.mark.parametrize("unit", UNITS)
def test_systemd_unit_verifies_clean(tmp_path: Path, unit: str) -> None:
    path = installed_copy(tmp_path, unit)
    verify = analyze("verify", str(path))
    # verify exits 0 on unknown keys and bad values; its warnings are the failures.
    assert verify.returncode == 0 and verify.stdout + verify.stderr == "", verify.stderr
    security = analyze("security", "--offline=true", str(path))
    score = float(re.search(r"Overall exposure level for \S+: ([\d.]+)", security.stdout)[1])
    print(f"{unit}: systemd-analyze verify clean; security exposure {score}")
    assert score < 3.0
    text = path.read_text()
    assert "Type=notify" in text and "User=ringserve" in text
    if "@" in unit:
        assert "RINGSERVE_REUSE_PORT=1" in text and "RuntimeDirectoryPreserve=yes" in text


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze not installed (no systemd here)",
)
def test_systemd_verify_catches_a_typo(tmp_path: Path) -> None:
    path = installed_copy(tmp_path, "ringserve.service")
    path.write_text(path.read_text().replace("Type=notify", "Type=notfy"))
    verify = analyze("verify", str(path))
    assert "Failed to parse service type" in verify.stderr


# -- what the files rely on ----------------------------------------------------------------------
def real_cgroup_v1() -> Path | None:
    root = Path("/sys/fs/cgroup/cpu")
    if not (root / "cpu.cfs_quota_us").exists() or not os.access(root, os.W_OK):
        return None
    return root


@pytest.mark.skipif(real_cgroup_v1() is None, reason="no writable cgroup v1 cpu controller here")
def test_default_workers_follow_a_real_cgroup_limit() -> None:
    """A real cgroup with a 1-CPU quota: a process in it counts 1 worker, whatever its cores."""
    root = real_cgroup_v1()
    assert root is not None
    group = root / f"ringserve-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("100000")
        code = (
            "import os, sys; open(sys.argv[1], 'w').write(str(os.getpid()));"
            "from ringserve.service.config.settings import default_workers, _cpu_count;"
            "print(default_workers(), _cpu_count())"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, str(group / "cgroup.procs")],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
        ).stdout.split()  # fmt: skip
        print(f"cgroup quota 1 CPU: default_workers {out[0]}, cores in affinity {out[1]}")
        assert out[0] == "1"
    finally:
        group.rmdir()


def test_sd_notify_ready_once_serving(start_server, tmp_path: Path) -> None:
    """Type=notify: a real datagram socket as systemd's NOTIFY_SOCKET gets READY=1 only when the
    server answers ready, and STOPPING=1 on SIGTERM."""
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sd:
        sd.bind(str(path))
        sd.settimeout(180)
        srv = start_server(
            "--workers", "1", "--spares", "0", env={"NOTIFY_SOCKET": str(path)}, wait=False
        )
        ready = sd.recv(4096).decode()
        status = srv.request("GET", "/v2/health/ready")[0]
        print(f"sd_notify: {ready!r}, then /v2/health/ready {status}")
        assert ready.splitlines()[0] == "READY=1"
        assert f"MAINPID={srv.pid}" in ready.splitlines()
        assert status == 200
        srv.proc.send_signal(signal.SIGTERM)
        assert sd.recv(4096) == b"STOPPING=1"
        assert srv.proc.wait(60) == 0
    assert srv.stop() == 0


def test_sd_notify_without_systemd_does_nothing() -> None:
    from ringserve.service.notify import sd_notify

    assert sd_notify("READY=1", env={}) is False
    assert sd_notify("READY=1", env={"NOTIFY_SOCKET": "relative/path"}) is False
