"""deploy/k8s: every manifest validates with kubernetes-validate (strict, against the oldest and
newest Kubernetes versions we support), and the manifests agree with each other and with the
server: ports, probes, labels, the grace period, the ServiceMonitor (a CRD, which
kubernetes-validate has no schema for: checked here against the Prometheus Operator's field
definitions and the Service instead)."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from service.server import SERVICE_NAME
from service.settings import Settings

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]  # native gRPC probes are GA since 1.27


def docs() -> dict[tuple[str, str], dict]:
    out = {}
    for f in sorted(K8S.glob("*.yaml")):
        if f.name == "kustomization.yaml":
            continue
        for d in yaml.safe_load_all(f.read_text()):
            out[(d["kind"], d["metadata"]["name"])] = d
    return out


@pytest.fixture(scope="module")
def manifests():
    return docs()


def test_kustomization_lists_every_manifest():
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == sorted(f.name for f in K8S.glob("*.yaml") if f.name != "kustomization.yaml")


@pytest.mark.parametrize("version", VERSIONS)
def test_core_manifests_validate_strictly(manifests, version):
    kinds = set()
    for (kind, _name), d in manifests.items():
        if kind == "ServiceMonitor":
            with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                kubernetes_validate.validate(d, version, strict=True)
            continue
        kubernetes_validate.validate(d, version, strict=True)
        kinds.add(kind)
    assert kinds == {"ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"}


def test_the_validator_rejects_a_broken_manifest(manifests):
    broken = yaml.safe_load(yaml.safe_dump(manifests[("Deployment", "mtserve")]))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["port"] = "grpc"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)
    broken = yaml.safe_load(yaml.safe_dump(manifests[("Service", "mtserve")]))
    broken["spec"]["portz"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


def test_deployment_probes_ports_and_lifecycle(manifests):
    dep = manifests[("Deployment", "mtserve")]
    cm = manifests[("ConfigMap", "mtserve")]["data"]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    settings = Settings(**{k.removeprefix("MTSERVE_").lower(): v for k, v in cm.items()})  # the ConfigMap is valid
    assert ports["grpc"] == int(settings.address.rsplit(":", 1)[1])
    assert ports["metrics"] == settings.metrics_port
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["grpc"]["port"] == ports["grpc"], probe
    assert c["readinessProbe"]["grpc"]["service"] == SERVICE_NAME  # NOT_SERVING while draining
    assert c["livenessProbe"]["grpc"].get("service", "") == ""
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > pre_stop + settings.grace_period_s + 5
    assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]
    assert c["envFrom"][0]["configMapRef"]["name"] == "mtserve"
    assert pod["securityContext"]["runAsNonRoot"] and c["securityContext"]["readOnlyRootFilesystem"]
    assert (
        dep["spec"]["selector"]["matchLabels"].items()
        <= pod.get("labels", dep["spec"]["template"]["metadata"]["labels"]).items()
    )


def test_services_hpa_and_pdb_select_the_pods(manifests):
    dep = manifests[("Deployment", "mtserve")]
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    container_ports = {p["name"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]}
    for name in ("mtserve", "mtserve-headless"):
        svc = manifests[("Service", name)]["spec"]
        assert svc["selector"].items() <= pod_labels.items()
        assert {p["targetPort"] for p in svc["ports"]} <= container_ports
    assert manifests[("Service", "mtserve-headless")]["spec"]["clusterIP"] == "None"
    hpa = manifests[("HorizontalPodAutoscaler", "mtserve")]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "mtserve"}
    assert 2 <= hpa["minReplicas"] < hpa["maxReplicas"]
    pdb = manifests[("PodDisruptionBudget", "mtserve")]["spec"]
    assert pdb["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["minAvailable"] < hpa["minReplicas"]  # a drain can always proceed


# The fields of monitoring.coreos.com/v1 ServiceMonitor that we use, as the Prometheus Operator's
# CRD defines them (Duration pattern included); anything else is rejected.
DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
SERVICE_MONITOR = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "jobLabel": {"type": "string"},
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}},
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "interval": {"type": "string", "pattern": DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": DURATION},
                        },
                    },
                },
            },
        },
    },
}


def test_service_monitor_scrapes_the_metrics_port_of_one_service(manifests):
    sm = manifests[("ServiceMonitor", "mtserve")]
    jsonschema.validate(sm, SERVICE_MONITOR)
    kubernetes_validate.validate(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": sm["metadata"]}, VERSIONS[-1], strict=True
    )  # its metadata is valid ObjectMeta
    selected = [
        name
        for (kind, name), d in manifests.items()
        if kind == "Service" and sm["spec"]["selector"]["matchLabels"].items() <= d["metadata"]["labels"].items()
    ]
    assert selected == ["mtserve"]  # not the headless Service too: each pod scraped once
    # Job label = Service name = the job the alert rules and the compose Prometheus use.
    assert 'job="mtserve"' in (K8S.parent / "prometheus" / "alerts.yml").read_text()
    svc_ports = {p["name"] for p in manifests[("Service", "mtserve")]["spec"]["ports"]}
    for ep in sm["spec"]["endpoints"]:
        assert ep["port"] in svc_ports and ep["path"] == "/metrics"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(
            {**sm, "spec": {**sm["spec"], "endpoints": [{"port": "metrics", "interval": "15 s"}]}}, SERVICE_MONITOR
        )
