"""The container image, built and run for real with podman (`make test-container`; not part of
`make test`: the build installs torch and exports the shipped model, several minutes on 2 cores).

Builds the `cpu` target of the Dockerfile on a local Debian base made with debootstrap
(scripts/container_base.sh: base images cannot be pulled here), checks the image (no torch,
non-root user, ports, health check), runs it, waits for SERVING through the image's own
HEALTHCHECK and the gRPC health protocol, translates a sentence through the container's port,
scrapes its metrics, then sends SIGTERM under load and sees it drain and exit 0.

The image bakes the model repository (Triton's layout, models/NAME/VERSION/) into
/models/NAME/VERSION/onnx and serves it (MTSERVE_MODEL_REPOSITORY=/models, no MTSERVE_MODEL_DIR).

Environment: MTSERVE_TEST_IMAGE=NAME skips the build and tests that image;
MTSERVE_TEST_MODEL=DIR bakes that one model dir (as NAME/1, NAME its dir's name) instead of the
repository models/; MTSERVE_WHEELS=DIR passes a local wheel directory as the `wheels` build
context (default /opt/wheels when it exists)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from service.client import Client
from service.client.healthcheck import check
from service.repository.layout import scan, wanted
from tests.support import free_port

pytestmark = [pytest.mark.slow, pytest.mark.container, pytest.mark.timeout(3600)]
REPO = Path(__file__).resolve().parents[2]
MODELS = "models"  # the repository the image bakes in
MODEL = "models/de-en/1"  # its shipped model, served by default (the first by name)
PODMAN = ["podman"]
RUN = ["--runtime", "runc", "--network", "host"]


def sh(*args: str, timeout: float = 120, check_rc: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(list(args), check=False, capture_output=True, text=True, timeout=timeout)
    if check_rc and r.returncode != 0:
        raise AssertionError(f"{' '.join(args)} -> {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    return r


def healthcheck_of(info: dict) -> dict | None:
    """The HEALTHCHECK of `podman image inspect` output (docker-format images keep it)."""
    return info.get("Healthcheck") or info.get("HealthCheck") or info["Config"].get("Healthcheck")


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> str:
    if os.environ.get("MTSERVE_TEST_IMAGE"):
        return os.environ["MTSERVE_TEST_IMAGE"]
    model = os.environ.get("MTSERVE_TEST_MODEL")
    if model is None and not (REPO / MODEL / "model.safetensors").is_file():
        pytest.skip(
            f"the shipped checkpoint {MODEL}/model.safetensors is missing: nothing to bake into the image "
            "(MTSERVE_TEST_MODEL=DIR bakes another model dir)"
        )
    if os.geteuid() != 0 and shutil.which("podman") is None:
        pytest.skip("podman is not installed and installing it needs root")
    t0 = time.time()
    base = sh(str(REPO / "scripts" / "container_base.sh"), timeout=900).stdout.strip().splitlines()[-1]
    t_base = time.time() - t0
    wheels = os.environ.get("MTSERVE_WHEELS", "/opt/wheels")
    extra = ["--build-context", f"wheels={wheels}", "--build-arg", "TORCH_INDEX_URL="] if Path(wheels).is_dir() else []
    if model is not None:  # a repository of that one model dir, its checkpoint files copied
        src = Path(model).resolve()
        version = tmp_path_factory.mktemp("repository") / src.name / "1"
        version.mkdir(parents=True)
        for f in ("model.safetensors", "config.json", "tokenizer.json"):
            shutil.copy2(src / f, version / f)
        extra += ["--build-context", f"models={version.parent.parent}"]
    ca = Path(os.environ.get("PIP_CERT", "/etc/ssl/certs/ca-certificates.crt"))
    if ca.is_file():  # the host's CA bundle: this machine's registry traffic goes through a TLS proxy
        extra += ["--build-context", f"certs={ca.parent}"] if ca.name == "ca-certificates.crt" else []
    tag = "localhost/mtserve:cpu-test"
    t0 = time.time()
    log = tmp_path_factory.mktemp("container") / "build.log"
    with open(log, "w") as out:
        build = subprocess.run(
            [
                *PODMAN,
                "build",
                "--format",
                "docker",
                "--network",
                "host",
                "--target",
                "cpu",
                "--build-arg",
                f"BASE={base}",
                *extra,
                "-t",
                tag,
                str(REPO),
            ],
            check=False,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=2400,
        )
    assert build.returncode == 0, log.read_text()[-8000:]
    print(f"\nbase image {base}: {t_base:.0f}s; podman build --target cpu: {time.time() - t0:.0f}s")
    return tag


def test_image_has_no_torch_runs_as_non_root_and_declares_ports_and_health(image):
    (info,) = json.loads(sh(*PODMAN, "image", "inspect", image).stdout)
    cfg = info["Config"]
    print(f"\n{image}: {info['Size'] / 1e6:.0f} MB")
    assert cfg["User"] and cfg["User"].split(":")[0] not in ("0", "root")
    assert {"50051/tcp", "9090/tcp"} <= set(cfg["ExposedPorts"])
    assert cfg["Entrypoint"] == ["mtserve", "serve"] and cfg.get("StopSignal") in ("SIGTERM", "15")
    env = dict(e.split("=", 1) for e in cfg["Env"])
    assert env["MTSERVE_MODEL_REPOSITORY"] == "/models" and "MTSERVE_MODEL_DIR" not in env
    health = healthcheck_of(info)
    assert health and "service.client.healthcheck" in " ".join(health["Test"])
    r = sh(
        *PODMAN,
        "run",
        "--rm",
        *RUN,
        "--entrypoint",
        "python3",
        image,
        "-c",
        "import importlib.util as u, json, os, pathlib; print(json.dumps([u.find_spec('torch') is None, os.getuid(), "
        "{str(p.relative_to('/models')): sorted(os.listdir(p)) for p in pathlib.Path('/models').glob('*/*/onnx')}]))",
    )
    no_torch, uid, versions = json.loads(r.stdout.strip().splitlines()[-1])
    assert no_torch is True and uid != 0
    if not os.environ.get("MTSERVE_TEST_MODEL"):  # every version dir of the repository, and nothing else
        expected = sorted(f"{v.name}/{v.version}/onnx" for vs in scan(REPO / MODELS).values() for v in vs)
        assert sorted(versions) == expected and f"{Path(MODEL).relative_to(MODELS)}/onnx" in versions, versions
    assert versions
    for files in versions.values():
        assert "manifest.json" in files and "encoder.fp32.onnx" in files and "decoder.int8.onnx" in files


def test_container_serves_translates_and_drains_on_sigterm(image):
    port, metrics = free_port(), free_port()
    name = f"mtserve-test-{port}"
    sh(
        *PODMAN,
        "run",
        "-d",
        "--name",
        name,
        *RUN,
        "-e",
        f"MTSERVE_ADDRESS=127.0.0.1:{port}",
        "-e",
        f"MTSERVE_METRICS_PORT={metrics}",
        "-e",
        "MTSERVE_GRACE_PERIOD_S=20",
        image,
    )
    address = f"127.0.0.1:{port}"
    try:
        t0 = time.time()
        while check(address, timeout=1) != "SERVING":
            state = json.loads(sh(*PODMAN, "inspect", name).stdout)[0]["State"]
            assert state["Running"], sh(*PODMAN, "logs", name, check_rc=False).stdout
            assert time.time() - t0 < 180, "not SERVING after 180 s"
            time.sleep(0.5)
        print(f"\ncontainer SERVING after {time.time() - t0:.1f}s")
        # The image's own HEALTHCHECK command, run inside the container (podman's periodic
        # health checks need systemd timers, absent here, so run it as the runtime would).
        (info,) = json.loads(sh(*PODMAN, "image", "inspect", image).stdout)
        test_cmd = healthcheck_of(info)["Test"]
        assert test_cmd[0] == "CMD"
        r = sh(*PODMAN, "exec", name, *test_cmd[1:], check_rc=False)
        assert r.returncode == 0 and r.stdout.strip().endswith("SERVING"), r.stdout + r.stderr
        with Client(address, timeout=60) as c:
            (t,) = c.translate(["Ein Hund rennt durch den Schnee."], beam_size=4)
            info = c.model_info()
        print(f"translation: {t.text!r}; serving {[(m.name, m.version) for m in info.models]}")
        assert t.text
        if not os.environ.get("MTSERVE_TEST_MODEL"):  # the shipped model translates this one right
            assert "dog" in t.text.lower() and "snow" in t.text.lower()
            # the latest version of every model of the repository, the shipped one among them
            latest = {(v.name, v.version) for v in wanted(scan(REPO / MODELS), [])}
            assert {(m.name, m.version) for m in info.models} == latest and ("de-en", "1") in latest
        assert info.execution_provider == "cpu"
        import urllib.request

        body = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10).read().decode()
        assert 'mtserve_requests_total{code="OK",method="Translate"} 1.0' in body

        # SIGTERM with requests in flight: every accepted request is answered, then exit 0.
        outcomes, started = [], []

        def call(i: int) -> None:
            try:
                with Client(address, timeout=60) as c:
                    started.append(i)
                    r = c.translate(
                        [
                            f"Eine Frau mit einem roten Hut spielt Gitarre Nummer {i}.",
                            "Zwei Männer sitzen auf einer Bank im Park.",
                        ],
                        beam_size=4,
                    )
                    outcomes.append(("OK", len(r)))
            except grpc.RpcError as e:
                outcomes.append((e.code().name, e.details()))

        with ThreadPoolExecutor(16) as pool:
            futs = [pool.submit(call, i) for i in range(32)]
            while len(started) < 16:
                time.sleep(0.01)
            time.sleep(0.2)
            sh(*PODMAN, "kill", "--signal", "SIGTERM", name)
            for f in futs:
                f.result()
        rc = int(sh(*PODMAN, "wait", name, timeout=60).stdout.strip())
        logs = sh(*PODMAN, "logs", name).stdout + sh(*PODMAN, "logs", name).stderr
        codes = [o[0] for o in outcomes]
        print(f"under SIGTERM: {codes.count('OK')} OK, {codes.count('UNAVAILABLE')} UNAVAILABLE; exit {rc}")
        assert rc == 0, logs[-4000:]
        assert "draining" in logs and "drained" in logs
        assert set(codes) <= {"OK", "UNAVAILABLE"}, outcomes
        assert codes.count("OK") >= 1 and all(n == 2 for c, n in outcomes if c == "OK")
    finally:
        sh(*PODMAN, "rm", "-f", name, check_rc=False)
