"""deploy/kubernetes/scale-out, rendered and validated offline: the kustomization resolved here
in Python, every built-in object checked strictly against Kubernetes' own schemas
(kubernetes-validate, bundled, nothing fetched), the KEDA ScaledObject against the schema of
KEDA's CRD (tests/keda_scaledobject.json, tightened here to refuse unknown fields), the Envoy
configuration cross-checked with the pods it balances, and the YAML that
docs/guides/kubernetes.md shows checked to be the files' own text."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from devkit.launcher import ROOT

HERE = ROOT / "deploy" / "kubernetes" / "scale-out"
PAGE = ROOT / "docs" / "guides" / "kubernetes.md"
K8S_VERSION = "1.37.0"  # the newest kubernetes-validate knows
KEDA_SCHEMA = Path(__file__).parents[1] / "keda_scaledobject.json"
# What the Python resolution below understands: anything else in the kustomization fails the test
# rather than being rendered wrongly.
KUSTOMIZATION_KEYS = {"apiVersion", "kind", "resources"}
# The prometheus scaler's trigger metadata (kedacore/keda pkg/scalers/prometheus_scaler.go).
PROMETHEUS_KEYS = {
    "serverAddress", "query", "queryParameters", "threshold", "activationThreshold", "namespace",
    "customHeaders", "ignoreNullValues", "unsafeSsl", "awsRegion", "timeout", "identityOwner",
}  # fmt: skip


def render(root: Path = HERE) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize root` prints, for a kustomization of plain resources."""
    kustomization = yaml.safe_load((root / "kustomization.yaml").read_text())
    assert set(kustomization) <= KUSTOMIZATION_KEYS, set(kustomization) - KUSTOMIZATION_KEYS
    assert kustomization["kind"] == "Kustomization"
    objects = []
    for name in kustomization["resources"]:
        path = root / name
        if path.is_dir():
            objects += render(path)
        else:
            objects += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return objects


def by_kind_name(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def strict(schema: Any) -> Any:
    """The CRD's schema refusing unknown fields, as the API server's strict field validation
    does (a structural schema prunes them silently otherwise)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def validate_scaled_object(doc: dict[str, Any]) -> None:
    schema = strict(json.loads(KEDA_SCHEMA.read_text()))
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: checked by the API server
    jsonschema.validate(doc, schema)
    assert doc["apiVersion"] == "keda.sh/v1alpha1"


def test_every_object_validates_offline() -> None:
    kinds = []
    for doc in render():
        if doc["kind"] == "ScaledObject":
            validate_scaled_object(doc)
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        kinds.append(doc["kind"])
    pods = ["Deployment", "Service", "PodDisruptionBudget"]  # ringserve.yaml
    envoy = ["ConfigMap", "Deployment", "Service"]  # envoy.yaml
    assert sorted(kinds) == sorted([*pods, *envoy, "ScaledObject"])


def test_the_validators_refuse_a_typo() -> None:
    objects = by_kind_name(render())
    bad = copy.deepcopy(objects["Deployment", "ringserve"])
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)
    scaled = copy.deepcopy(objects["ScaledObject", "ringserve"])
    scaled["spec"]["minReplicas"] = 2  # the HPA's spelling, not KEDA's
    with pytest.raises(jsonschema.ValidationError):
        validate_scaled_object(scaled)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_kustomize_renders_the_same() -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(HERE)], capture_output=True, text=True, check=True
    ).stdout
    theirs = by_kind_name([d for d in yaml.safe_load_all(out) if d])
    assert theirs == by_kind_name(render())


def test_pods_serve_their_own_model_and_drain_inside_the_grace_period() -> None:
    objects = by_kind_name(render())
    pod = objects["Deployment", "ringserve"]["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    (server,) = pod["containers"]
    args = dict(a.lstrip("-").split("=", 1) for a in server["args"])
    name, path = args["model"].split("=", 1)
    assert init["command"][-1] == path  # the init container writes what the server reads
    mounts = {m["name"]: m["mountPath"] for m in server["volumeMounts"]}
    assert path.startswith(mounts["models"] + "/")
    assert {m["name"] for m in init["volumeMounts"]} == {"models"}
    assert float(args["shutdown-delay-s"]) > 0
    grace = pod["terminationGracePeriodSeconds"]
    assert grace > float(args["shutdown-delay-s"]) + float(args["drain-timeout-s"])
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["dshm"] == "/dev/shm" and volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert server["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert server["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert pod["securityContext"]["runAsNonRoot"] is True
    budget = objects["PodDisruptionBudget", "ringserve"]["spec"]
    assert budget["selector"]["matchLabels"] == pod_labels(objects)
    assert name == "minilm"


def pod_labels(objects: dict[tuple[str, str], dict[str, Any]]) -> dict[str, str]:
    labels: dict[str, str] = objects["Deployment", "ringserve"]["spec"]["template"]["metadata"][
        "labels"
    ]
    return labels


def test_envoy_balances_the_headless_service_ports() -> None:
    objects = by_kind_name(render())
    pods = objects["Service", "ringserve-pods"]["spec"]
    assert pods["clusterIP"] == "None" and pods["selector"] == pod_labels(objects)
    container_ports = {
        p["name"]: p["containerPort"]
        for p in objects["Deployment", "ringserve"]["spec"]["template"]["spec"]["containers"][0][
            "ports"
        ]
    }
    service_ports = {p["port"] for p in pods["ports"]}
    assert service_ports <= set(container_ports.values())
    envoy = yaml.safe_load(objects["ConfigMap", "ringserve-envoy"]["data"]["envoy.yaml"])
    clusters = {c["name"]: c for c in envoy["static_resources"]["clusters"]}
    for cluster in clusters.values():
        (group,) = cluster["load_assignment"]["endpoints"]
        (endpoint,) = group["lb_endpoints"]
        address = endpoint["endpoint"]["address"]["socket_address"]
        assert address["address"].split(".")[0] == "ringserve-pods"
        assert address["port_value"] in service_ports
        assert cluster["lb_policy"] == "LEAST_REQUEST" and cluster["type"] == "STRICT_DNS"
    assert clusters["pods_http"]["health_checks"][0]["http_health_check"]["path"] == (
        "/v2/health/ready"
    )
    assert "grpc_health_check" in clusters["pods_grpc"]["health_checks"][0]
    options = clusters["pods_grpc"]["typed_extension_protocol_options"]
    assert "http2_protocol_options" in json.dumps(options)  # gRPC needs HTTP/2 to the pods
    routed = set()
    for listener in envoy["static_resources"]["listeners"]:
        manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
        for host in manager["route_config"]["virtual_hosts"]:
            routed |= {r["route"]["cluster"] for r in host["routes"]}
    assert routed == set(clusters)
    balanced = {c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"][
        "socket_address"]["port_value"] for c in clusters.values()}  # fmt: skip
    assert balanced == {container_ports["http"], container_ports["grpc"]}
    front = objects["Service", "ringserve"]["spec"]
    envoy_pod = objects["Deployment", "ringserve-envoy"]["spec"]["template"]
    assert front["selector"] == envoy_pod["metadata"]["labels"]
    config = envoy_pod["spec"]["containers"][0]
    assert config["args"][-1].startswith(config["volumeMounts"][0]["mountPath"] + "/")


def test_autoscaler_scales_the_deployment_on_a_metric_the_server_has() -> None:
    objects = by_kind_name(render())
    spec = objects["ScaledObject", "ringserve"]["spec"]
    assert spec["scaleTargetRef"]["name"] == "ringserve"
    triggers = {t["type"]: t for t in spec["triggers"]}
    prometheus = triggers["prometheus"]
    assert set(prometheus["metadata"]) <= PROMETHEUS_KEYS
    float(prometheus["metadata"]["threshold"])
    names = set(re.findall(r"\b(ringserve_\w+)", prometheus["metadata"]["query"]))
    metrics = (ROOT / "docs" / "reference" / "metrics.md").read_text(encoding="utf-8")
    assert names and all(f"`{n}`" in metrics for n in names), names
    budget = objects["PodDisruptionBudget", "ringserve"]["spec"]
    assert spec["minReplicaCount"] > budget["minAvailable"]


def test_the_page_shows_the_files() -> None:
    """Every yaml block of the page is a run of lines of one of the files, word for word."""
    files = {p.name: p.read_text(encoding="utf-8") for p in HERE.iterdir() if p.is_file()}
    shown = re.findall(r"^```yaml\n(.*?)^```$", PAGE.read_text(encoding="utf-8"), re.M | re.S)
    assert len(shown) >= 3
    for block in shown:
        assert any(block in text for text in files.values()), block[:200]
