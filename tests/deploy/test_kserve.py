"""deploy/kserve: the ServingRuntime and the InferenceService validate against KServe's own CRD
schemas (vendored unmodified in tests/deploy/kserve_crds/, see its README), and agree with each
other, with deploy/k8s and with the server: the gRPC v2 port, the model format, the model
repository at KServe's mount point, the image, the settings, the drain timing.

Kubernetes validates a custom resource against the CRD's structural schema, which jsonschema
does not know as such: `x-kubernetes-int-or-string` (no `type`: an integer or a string, e.g. a
resource quantity), `x-kubernetes-list-type` set/map (no duplicates, or no two items with the
same keys), and unknown fields, which the API server prunes, or rejects with kubectl's default
strict field validation, unless `x-kubernetes-preserve-unknown-fields`. `kube_to_jsonschema`
turns those into JSON Schema (unknown fields: `additionalProperties: false`) and refuses any
other `x-kubernetes-*` keyword, so a newer CRD cannot be half-checked silently."""

from __future__ import annotations

import copy
import functools
import hashlib
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import jsonschema.validators
import kubernetes_validate
import pytest
import yaml

from service.server import SERVICE_NAME
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
KSERVE = ROOT / "deploy" / "kserve"
K8S = ROOT / "deploy" / "k8s"
CRDS = Path(__file__).resolve().parent / "kserve_crds"
RUNTIME = KSERVE / "serving-runtime.yaml"
ISVC = KSERVE / "inference-service.yaml"
MODEL_MOUNT = "/mnt/models"  # KServe's DefaultModelLocalMountPath: where the storage initializer puts storageUri
GRPC_PORT = 50051
# Where the model is: the runtime's own business (KServe's mount point), not deploy/k8s's.
MODEL_LOCATION = {f"MTSERVE_{n}" for n in ("MODEL_REPOSITORY", "MODELS", "DEFAULT_MODEL", "MODEL_DIR", "ONNX_DIR")}

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the InferenceService CRD is 2 MB


def load(path: Path) -> list[dict]:
    return [d for d in yaml.load_all(path.read_text(), Loader=LOADER) if d is not None]


def load_one(path: Path) -> dict:
    (doc,) = load(path)
    return doc


# ----------------------------------------------------------------------------- structural schema -> JSON Schema

HANDLED = {
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-list-type",  # checked by the validator's keyword below
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",  # a merge strategy for server-side apply: nothing to validate
}


def kube_to_jsonschema(s: dict, path: str = "") -> dict:
    s = dict(s)
    unknown = {k for k in s if k.startswith("x-kubernetes-")} - HANDLED
    if unknown:
        raise NotImplementedError(f"{path or '/'}: {sorted(unknown)} not translated to JSON Schema")
    if "properties" in s:
        s["properties"] = {k: kube_to_jsonschema(v, f"{path}.{k}") for k, v in s["properties"].items()}
    for key in ("items", "additionalProperties", "not"):
        if isinstance(s.get(key), dict):
            s[key] = kube_to_jsonschema(s[key], f"{path}/{key}")
    for key in ("anyOf", "allOf", "oneOf"):
        if key in s:
            s[key] = [kube_to_jsonschema(x, f"{path}/{key}") for x in s[key]]
    if s.get("x-kubernetes-int-or-string"):
        s.pop("type", None)  # controller-gen writes the anyOf; a hand-written CRD may not
        s.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if s.pop("nullable", False) and "type" in s:
        s["type"] = [s["type"], "null"]
    if (
        s.get("type") == "object"
        and "additionalProperties" not in s
        and not s.get("x-kubernetes-preserve-unknown-fields")
    ):
        s["additionalProperties"] = False  # only the listed properties (none: an empty object)
    return s


def _list_type(validator, list_type, instance, schema) -> Iterator[jsonschema.ValidationError]:
    if not validator.is_type(instance, "array"):
        return
    if list_type == "set":
        keys = [yaml.safe_dump(item, sort_keys=True) for item in instance]
    elif list_type == "map":
        names = schema.get("x-kubernetes-list-map-keys", [])
        props = schema.get("items", {}).get("properties", {})
        # The API server defaults before it checks the keys (a container port's protocol: TCP).
        keys = [tuple(item.get(k, props.get(k, {}).get("default")) for k in names) for item in instance]
    else:
        return
    seen = set()
    for i, key in enumerate(keys):
        if key in seen:
            yield jsonschema.ValidationError(f"item {i}: duplicate in a list of type {list_type}: {instance[i]!r}")
        seen.add(key)


KubeValidator = jsonschema.validators.extend(jsonschema.Draft4Validator, {"x-kubernetes-list-type": _list_type})
FORMATS = jsonschema.FormatChecker()
FORMATS.checks("int32")(lambda v: not isinstance(v, int) or -(2**31) <= v < 2**31)
FORMATS.checks("int64")(lambda v: not isinstance(v, int) or -(2**63) <= v < 2**63)


@functools.cache
def crds() -> dict[str, dict]:
    out = {}
    for f in sorted(CRDS.glob("*.yaml")):
        crd = load_one(f)
        assert crd["apiVersion"] == "apiextensions.k8s.io/v1" and crd["kind"] == "CustomResourceDefinition", f
        out[crd["metadata"]["name"]] = crd
    return out


@functools.cache
def validator_for(api_version: str, kind: str) -> Any:
    """The validator of the CRD version the API server would use for a manifest of this
    apiVersion and kind: the served version of that name."""
    group, version = api_version.split("/")
    (crd,) = [c for c in crds().values() if c["spec"]["group"] == group and c["spec"]["names"]["kind"] == kind]
    (v,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    assert v["served"], f"{crd['metadata']['name']} does not serve {version}"
    schema = kube_to_jsonschema(v["schema"]["openAPIV3Schema"])
    # The API server checks metadata as ObjectMeta whatever the CRD says (checked separately below).
    schema["properties"]["metadata"] = {"type": "object"}
    KubeValidator.check_schema(schema)
    return KubeValidator(schema, format_checker=FORMATS)


def errors(doc: dict) -> list[str]:
    v = validator_for(doc["apiVersion"], doc["kind"])
    return [f"{'.'.join(map(str, e.absolute_path)) or '/'}: {e.message}" for e in v.iter_errors(doc)]


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def _no_mtserve_environment(monkeypatch):
    """Settings(...) here sees the manifests' variables only, not the test process's MTSERVE_*."""
    for key in list(os.environ):
        if key.startswith("MTSERVE_"):
            monkeypatch.delenv(key)


@pytest.fixture(scope="module")
def runtime() -> dict:
    return load_one(RUNTIME)


@pytest.fixture(scope="module")
def isvc() -> dict:
    return load_one(ISVC)


@pytest.fixture(scope="module")
def k8s() -> dict[tuple[str, str], dict]:
    out = {}
    for f in sorted(K8S.glob("*.yaml")):
        if f.name == "kustomization.yaml":
            continue
        for d in load(f):
            out[(d["kind"], d["metadata"]["name"])] = d
    return out


def container(runtime: dict) -> dict:
    (c,) = runtime["spec"]["containers"]
    return c


def env(runtime: dict) -> dict[str, str]:
    pairs = [(e["name"], e["value"]) for e in container(runtime)["env"]]
    assert len(dict(pairs)) == len(pairs), "an env var is set twice"
    return dict(pairs)


# ----------------------------------------------------------------------------- the vendored CRDs


def test_the_vendored_crds_are_kserves_unmodified():
    readme = (CRDS / "README.md").read_text()
    assert "https://github.com/kserve/kserve" in readme
    assert re.search(r"\bv\d+\.\d+\.\d+\b", readme) and re.search(r"\b[0-9a-f]{40}\b", readme)
    files = sorted(f.name for f in CRDS.glob("*.yaml"))
    assert files == ["serving.kserve.io_inferenceservices.yaml", "serving.kserve.io_servingruntimes.yaml"]
    for name in files:
        data = (CRDS / name).read_bytes()
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git hash-object
        row = re.search(rf"`{re.escape(name)}` \| `([0-9a-f]{{40}})`", readme)
        assert row, f"README lists no blob id for {name}"
        assert blob == row[1], f"{name} differs from the KServe file the README names"
        assert f"config/crd/full/{name}" in readme
    assert set(crds()) == {"servingruntimes.serving.kserve.io", "inferenceservices.serving.kserve.io"}


@pytest.mark.parametrize("path", [RUNTIME, ISVC], ids=lambda p: p.name)
def test_manifest_is_a_served_storage_version_of_its_crd(path):
    doc = load_one(path)
    group, version = doc["apiVersion"].split("/")
    (crd,) = [c for c in crds().values() if c["spec"]["names"]["kind"] == doc["kind"]]
    assert crd["spec"]["group"] == group == "serving.kserve.io"
    assert crd["spec"]["scope"] == "Namespaced" and "namespace" not in doc["metadata"]  # kubectl -n decides
    (v,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    assert v["served"] and v["storage"]


# ----------------------------------------------------------------------------- schema validation


@pytest.mark.parametrize("path", [RUNTIME, ISVC], ids=lambda p: p.name)
def test_manifest_validates_against_the_kserve_crd(path):
    doc = load_one(path)
    assert errors(doc) == []
    # metadata is ObjectMeta: validated as the metadata of a core object, strictly.
    kubernetes_validate.validate(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]},
        kubernetes_validate.latest_version(),
        strict=True,
    )
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])  # a DNS-1035 label: it names Services


DELETE = object()
C0 = "spec.containers.0"
MODEL = "spec.predictor.model"

BROKEN_RUNTIMES = {
    "containers not a list": ("spec.containers", "x"),
    "protocol version not a string": ("spec.protocolVersions", [5]),
    "autoSelect not a boolean": ("spec.supportedModelFormats.0.autoSelect", "yes"),
    "model format without a name": ("spec.supportedModelFormats.0.name", DELETE),
    "priority below the minimum": ("spec.supportedModelFormats.0.priority", 0),
    "port above int32": (f"{C0}.ports.0.containerPort", 2**31),
    "unknown container field": (f"{C0}.portz", []),
    "unknown spec field": ("spec.multiModels", False),
    "unknown field in an env var": (f"{C0}.env.0.valeu", "/mnt/models"),
    "quantity that is no quantity": (f"{C0}.resources.limits.cpu", "two cores"),
    "quantity of the wrong type": (f"{C0}.resources.limits.memory", [2]),
    "grpc probe port not an integer": (f"{C0}.startupProbe.grpc.port", 50051.5),
    "annotation value not a string": ("spec.annotations.prometheus.kserve.io/port", 9090),
    "duplicate container port": (f"{C0}.ports.1", {"name": "h2c-again", "containerPort": GRPC_PORT}),
    "duplicate env var": (f"{C0}.env.1", {"name": "MTSERVE_MODEL_REPOSITORY", "value": "/models"}),
}
BROKEN_ISVCS = {
    "predictor not an object": ("spec.predictor", "mtserve"),
    "model format not an object": (f"{MODEL}.modelFormat", "mtserve-onnx"),
    "model format without a name": (f"{MODEL}.modelFormat.name", DELETE),
    "scale metric out of its enum": ("spec.predictor.scaleMetric", "gpu"),
    "replicas not an integer": ("spec.predictor.minReplicas", "2"),
    "unknown predictor field": ("spec.predictor.replicas", 2),
    "unknown model field": (f"{MODEL}.storageURI", "pvc://x"),
    "quantity that is no quantity": (f"{MODEL}.resources.requests.memory", "1 GB"),
    "rolling update neither int nor string": ("spec.predictor.deploymentStrategy.rollingUpdate.maxSurge", 1.5),
    "no predictor": ("spec.predictor", DELETE),
}


def _dotted(path: str) -> list[str]:
    # Annotation keys contain dots: join the segments after "annotations" back into one key.
    parts = path.split(".")
    if "annotations" in parts:
        i = parts.index("annotations") + 1
        parts[i:] = [".".join(parts[i:])]
    return parts


def broken_at(doc: dict, path: str, value: Any) -> dict:
    out = copy.deepcopy(doc)
    *parents, last = [int(p) if p.isdigit() else p for p in _dotted(path)]
    node = out
    for p in parents:
        node = node[p]
    if value is DELETE:
        del node[last]
    elif isinstance(node, list) and last == len(node):
        node.append(value)
    else:
        node[last] = value
    return out


def assert_rejected_at(bad: dict, path: str) -> None:
    """bad fails validation, and for the change at path (inside the new value, or at the object
    or list that holds it), not for something else."""
    errs = errors(bad)
    assert errs, f"{path}: accepted"
    where = [e.split(": ", 1)[0] for e in errs]
    assert any(path == w or path.startswith(w + ".") or w.startswith(path + ".") for w in where), errs


@pytest.mark.parametrize("case", sorted(BROKEN_RUNTIMES))
def test_the_validator_rejects_a_broken_runtime(runtime, case):
    path, value = BROKEN_RUNTIMES[case]
    bad = broken_at(runtime, path, value)
    assert bad != runtime
    assert_rejected_at(bad, path)
    with pytest.raises(jsonschema.ValidationError):
        validator_for(bad["apiVersion"], bad["kind"]).validate(bad)


@pytest.mark.parametrize("case", sorted(BROKEN_ISVCS))
def test_the_validator_rejects_a_broken_inference_service(isvc, case):
    path, value = BROKEN_ISVCS[case]
    bad = broken_at(isvc, path, value)
    assert bad != isvc
    assert_rejected_at(bad, path)


def test_the_validator_accepts_what_kubernetes_accepts(runtime, isvc):
    """Int-or-string and quantities both ways, open maps, preserve-unknown-fields, and a list
    map whose items differ in a defaulted key: the strictness above is not over-strictness."""
    ok = broken_at(runtime, f"{C0}.resources.limits.cpu", 2)
    ok = broken_at(ok, f"{C0}.resources.requests.cpu", "1500m")
    ok = broken_at(ok, f"{C0}.startupProbe.grpc.port", GRPC_PORT)
    ok = broken_at(ok, f"{C0}.ports.2", {"containerPort": 9090, "protocol": "UDP"})  # (9090, UDP) is new
    ok = broken_at(ok, "spec.annotations.example.com/anything", "x")
    assert errors(ok) == []
    ok = broken_at(isvc, "spec.predictor.deploymentStrategy.rollingUpdate.maxSurge", "25%")
    ok = broken_at(ok, "status", {"anything": {"goes": ["here"]}})  # status preserves unknown fields
    assert errors(ok) == []


def test_the_translation_refuses_what_it_does_not_know():
    with pytest.raises(NotImplementedError, match="x-kubernetes-validations"):
        kube_to_jsonschema({"type": "object", "x-kubernetes-validations": [{"rule": "self.a > 0"}]})
    s = kube_to_jsonschema({"x-kubernetes-int-or-string": True})
    v = KubeValidator(s)
    assert v.is_valid(1) and v.is_valid("1Gi") and not v.is_valid(1.5) and not v.is_valid(None)


# ----------------------------------------------------------------------------- what the manifests say


def test_runtime_serves_grpc_v2_on_50051(runtime):
    spec = runtime["spec"]
    assert runtime["kind"] == "ServingRuntime" and runtime["metadata"]["name"] == "mtserve"
    assert spec["protocolVersions"] == ["grpc-v2"]
    assert spec["multiModel"] is False
    c = container(runtime)
    assert c["name"] == "kserve-container"  # the container the InferenceService's model spec merges into
    # The first port is the one KServe puts behind the predictor Service's port 80; a name with
    # h2c or grpc makes it appProtocol kubernetes.io/h2c.
    first = c["ports"][0]
    assert first["containerPort"] == GRPC_PORT and first.get("protocol", "TCP") == "TCP"
    assert "h2c" in first["name"] or "grpc" in first["name"]
    settings = Settings(**{k.removeprefix("MTSERVE_").lower(): v for k, v in env(runtime).items()})
    assert int(settings.address.rsplit(":", 1)[1]) == GRPC_PORT
    assert settings.address.rsplit(":", 1)[0] in ("0.0.0.0", "[::]")  # reachable from outside the pod
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["grpc"]["port"] == GRPC_PORT, probe
    assert c["readinessProbe"]["grpc"]["service"] == SERVICE_NAME  # NOT_SERVING while draining
    assert c["livenessProbe"]["grpc"].get("service", "") == ""


def test_runtime_metrics_annotations_name_the_metrics_port(runtime):
    ann = runtime["spec"]["annotations"]
    settings = Settings(**{k.removeprefix("MTSERVE_").lower(): v for k, v in env(runtime).items()})
    assert settings.metrics_port > 0
    assert int(ann["prometheus.kserve.io/port"]) == int(ann["prometheus.io/port"]) == settings.metrics_port
    assert ann["prometheus.kserve.io/path"] == ann["prometheus.io/path"] == "/metrics"
    assert ann["prometheus.io/scrape"] == "true"
    ports = {p["name"]: p["containerPort"] for p in container(runtime)["ports"]}
    assert ports["metrics"] == settings.metrics_port


def test_every_env_var_is_a_server_setting(runtime):
    known = {f"MTSERVE_{name.upper()}" for name in Settings.model_fields}
    assert set(env(runtime)) <= known, set(env(runtime)) - known  # Settings ignores unknown names


def image_env(target: str) -> dict[str, str]:
    """The ENV instructions of one stage of the Dockerfile (FROM ... AS target)."""
    lines = [line for line in (ROOT / "Dockerfile").read_text().splitlines() if not line.lstrip().startswith("#")]
    out: dict[str, str] = {}
    stage = None
    for line in "\n".join(lines).replace("\\\n", " ").splitlines():
        words = line.split()
        if words and words[0].upper() == "FROM":
            stage = words[-1] if len(words) >= 4 and words[-2].upper() == "AS" else None
        elif words and words[0].upper() == "ENV" and stage == target:
            for word in shlex.split(line.strip()[3:]):
                key, _, value = word.partition("=")
                out[key] = value
    return out


def test_the_server_as_started_reads_the_model_repository_at_kserves_mount_point(runtime, k8s):
    """The settings the server ends up with in the container: the image's ENV, then the
    runtime's env; the model comes from /mnt/models, not from the models baked into the image.
    The container runs the image's own ENTRYPOINT (`mtserve serve`, PID 1, which gets SIGTERM and
    drains), as the Deployment of deploy/k8s does: no command or args of its own."""
    c = container(runtime)
    assert env(runtime)["MTSERVE_MODEL_REPOSITORY"] == MODEL_MOUNT
    target = c["image"].rsplit(":", 1)[1]
    baked = image_env(target)
    assert baked, f"no stage {target!r} with ENV in the Dockerfile"
    entrypoint = re.search(rf"FROM \S+ AS {target}\n(?:.*\n)*?ENTRYPOINT (\[.*\])", (ROOT / "Dockerfile").read_text())
    assert entrypoint and yaml.safe_load(entrypoint[1]) == ["mtserve", "serve"]
    assert "command" not in c and "args" not in c, "the image's ENTRYPOINT runs the server"
    (kc,) = k8s[("Deployment", "mtserve")]["spec"]["template"]["spec"]["containers"]
    assert "command" not in kc and "args" not in kc
    # The image serves a repository (its own, /models) and sets no single model dir that would
    # override whatever repository the runtime names.
    assert not {"MTSERVE_MODEL_DIR", "MTSERVE_ONNX_DIR"} & set(baked), baked
    assert baked.get("MTSERVE_MODEL_REPOSITORY") == "/models"
    effective = {**baked, **env(runtime)}
    settings = Settings(
        **{k.removeprefix("MTSERVE_").lower(): v for k, v in effective.items() if k.startswith("MTSERVE_")}
    )
    assert settings.model_dir is None and settings.onnx_dir is None
    assert settings.model_repository == Path(MODEL_MOUNT)
    assert settings.model_list == []  # every model of the repository, its latest version


def test_nothing_in_the_inference_service_moves_the_model(isvc):
    model = isvc["spec"]["predictor"]["model"]
    assert not {e["name"] for e in model.get("env", [])} & MODEL_LOCATION
    assert "command" not in model and "args" not in model
    assert "storageUri" in model and "storageUris" not in isvc["spec"]["predictor"]
    assert re.fullmatch(r"(pvc|s3|gs|hf|oci|https?)://[^/\s]+(/\S*)?", model["storageUri"])


def test_inference_service_uses_the_runtime(runtime, isvc):
    assert isvc["kind"] == "InferenceService" and isvc["metadata"]["name"] == "mtserve-translation"
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    fmt = model["modelFormat"]
    matching = [
        f
        for f in runtime["spec"]["supportedModelFormats"]
        if f["name"] == fmt["name"] and ("version" not in fmt or f.get("version") == fmt["version"])
    ]
    assert matching, f"{fmt} is no supported model format of the runtime"
    assert fmt["name"] == "mtserve-onnx" and matching[0].get("autoSelect") is True
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    assert model["protocolVersion"] == "grpc-v2"
    ann = isvc["metadata"]["annotations"]
    # Standard mode (Deployment + Service + HPA): KServe's default config says Serverless, whose
    # Knative would refuse the preStop hook and the second port.
    assert ann["serving.kserve.io/deploymentMode"] in ("Standard", "RawDeployment")
    # "true" would repoint prometheus.io/port at Knative's queue-proxy.
    assert ann["serving.kserve.io/enable-prometheus-scraping"] == "false"


def test_drain_fits_in_the_termination_grace_period(runtime, isvc):
    c = container(runtime)
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    grace = float(env(runtime)["MTSERVE_GRACE_PERIOD_S"])
    period = isvc["spec"]["predictor"].get("terminationGracePeriodSeconds", 30)  # Kubernetes' default
    assert pre_stop + grace + 5 <= period


def test_same_image_settings_and_hardening_as_deploy_k8s(runtime, isvc, k8s):
    dep = k8s[("Deployment", "mtserve")]["spec"]
    (kc,) = dep["template"]["spec"]["containers"]
    c = container(runtime)
    assert c["image"] == kc["image"]
    cm = k8s[("ConfigMap", "mtserve")]["data"]
    same = {k: v for k, v in env(runtime).items() if k not in MODEL_LOCATION}
    assert same == {k: v for k, v in cm.items() if k not in MODEL_LOCATION}
    assert c["resources"] == kc["resources"] == isvc["spec"]["predictor"]["model"]["resources"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe] == kc[probe], probe
    assert c["lifecycle"] == kc["lifecycle"]
    pod_sc = dep["template"]["spec"]["securityContext"]
    for key, value in kc["securityContext"].items():
        assert c["securityContext"][key] == value, key
    for key in ("runAsNonRoot", "runAsUser", "runAsGroup", "seccompProfile"):  # pod-level there
        assert c["securityContext"][key] == pod_sc[key], key
    assert isvc["spec"]["predictor"]["securityContext"]["fsGroup"] == pod_sc["fsGroup"]
    assert (
        dep["template"]["spec"]["terminationGracePeriodSeconds"]
        == isvc["spec"]["predictor"]["terminationGracePeriodSeconds"]
    )
    hpa = k8s[("HorizontalPodAutoscaler", "mtserve")]["spec"]
    pred = isvc["spec"]["predictor"]
    assert (pred["minReplicas"], pred["maxReplicas"]) == (hpa["minReplicas"], hpa["maxReplicas"])
    assert pred["scaleTarget"] == hpa["metrics"][0]["resource"]["target"]["averageUtilization"]


def test_the_predictor_pod_is_a_valid_pod(runtime, isvc):
    """The pod KServe builds, roughly: the runtime's containers and volumes with the predictor's
    pod fields; validated as a core Pod by kubernetes-validate, strictly."""
    pred = isvc["spec"]["predictor"]
    pod_fields = {k: pred[k] for k in ("terminationGracePeriodSeconds", "securityContext") if k in pred}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{isvc['metadata']['name']}-predictor"},
        "spec": {"containers": runtime["spec"]["containers"], "volumes": runtime["spec"]["volumes"], **pod_fields},
    }
    kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
    mounts = {m["name"] for c in runtime["spec"]["containers"] for m in c.get("volumeMounts", [])}
    assert mounts <= {v["name"] for v in runtime["spec"]["volumes"]}
