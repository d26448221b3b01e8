"""deploy/prometheus and deploy/grafana against a real Prometheus (the Debian `prometheus`
package): promtool checks the config and rules and runs the alert unit tests; then a Prometheus
started on a loopback port scrapes a running server serving two models under load (1 s scrape
interval) and every PromQL expression of the Grafana dashboard (for all models and for each one
through its $model and $version variables) and of the alert rules is evaluated through the HTTP
API and must return data. The same for a server of two replicas, scraped through its supervisor."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.support import free_port

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PROM = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "mtserve.json"
SENTENCES = [
    "Ein Hund rennt durch den Schnee.",
    "Zwei Männer sitzen auf einer Bank.",
    "Eine Frau mit einem roten Hut spielt Gitarre auf der Straße vor vielen Menschen.",
    "Ein Kind lacht.",
]
RATE_INTERVAL = "20s"  # what Grafana's $__rate_interval becomes here (scrape interval 1 s)
MODELS = ("tiny-a", "tiny-b")  # the live test's repository: the tiny model twice
# The dashboard's selector of model-scoped series: the model variable (the inference_* metrics'
# model is NAME or NAME-encoder) and the version variable.
MODEL_SELECTORS = ('model=~"$model"', 'model=~"($model)(-encoder)?"')
VERSION_SELECTOR = 'version=~"$version"'


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(
            f"`{name}` not found: install the Debian package `prometheus` (apt-get install prometheus); "
            ".ci/run installs it"
        )
    return path


def dashboard_exprs(model: str = ".*", version: str = ".*") -> list[tuple[str, str]]:
    """Every panel query as Grafana sends it: $model and $version substituted (".*" is what the
    variables' "All" becomes: their allValue), $__rate_interval too."""
    dash = json.loads(DASHBOARD.read_text())
    return [
        (
            p["title"],
            t["expr"].replace("$__rate_interval", RATE_INTERVAL).replace("$model", model).replace("$version", version),
        )
        for p in dash["panels"]
        for t in p["targets"]
    ]


def model_scoped_metrics() -> dict[str, str]:
    """{series name: family} of every metric with a `model` label (service/metrics.py), under
    each name a query may use (`_total`, `_bucket`, `_sum`, `_count`, `_info`)."""
    from prometheus_client.metrics import MetricWrapperBase

    from service.metrics import Metrics

    out = {}
    for m in vars(Metrics()).values():
        if isinstance(m, MetricWrapperBase) and "model" in m._labelnames:
            if m._labelnames == ("model",):
                continue  # about a model's name, not one served version (mtserve_default_model)
            assert m._labelnames[:2] == ("model", "version"), m._name
            suffixes = {"counter": ["_total"], "info": ["_info"], "histogram": ["_bucket", "_sum", "_count"]}
            for suffix in suffixes.get(m._type, ["_sum", "_count"] if m._type == "summary" else [""]):
                out[m._name + suffix] = m._name
    return out


def doc_exprs() -> list[tuple[str, str]]:
    """The "Useful queries" table of docs/metrics.md: (what, PromQL)."""
    text = (DEPLOY.parent / "docs" / "metrics.md").read_text().split("## Useful queries", 1)[1]
    rows = [line for line in text.splitlines() if line.startswith("| ") and "`" in line]
    out = []
    for row in rows:
        code = re.findall(r"`([^`]+)`", row.replace("\\|", "\x00"))[-1].replace("\x00", "|")
        out.append((row.split("|")[1].strip(), code))
    assert len(out) >= 5
    return out


def alert_rules() -> list[dict]:
    return [r for g in yaml.safe_load((PROM / "alerts.yml").read_text())["groups"] for r in g["rules"]]


def for_replicas(rule: dict) -> bool:
    """A rule over the supervisor's own series, which only a server with replicas exports."""
    return "mtserve_replica" in rule["expr"]


def alert_query(expr: str) -> str:
    """`<query> > 0.05` -> `<query>`: the threshold is what stays silent on a healthy server."""
    m = re.fullmatch(r"(?s)\s*(.*\S)\s*(>|<|>=|<=|==|!=)\s*[-+0-9.e]+\s*", expr)
    assert m, f"alert expression is not '<query> <op> <threshold>': {expr}"
    return m.group(1)


# ------------------------------------------------------------------------------ static checks


def test_promtool_checks_config_and_rules():
    promtool = tool("promtool")
    for args in (["check", "config", str(PROM / "prometheus.yml")], ["check", "rules", str(PROM / "alerts.yml")]):
        r = subprocess.run([promtool, *args], check=False, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(
        [promtool, "check", "rules", str(PROM / "alerts.yml")], check=False, capture_output=True, text=True
    )
    assert f"{len(alert_rules())} rules found" in r.stdout + r.stderr


def test_alert_unit_tests_fire_and_stay_silent():
    r = subprocess.run(
        [tool("promtool"), "test", "rules", str(PROM / "alerts_test.yml")],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    tested = set(re.findall(r"alertname: (\w+)", (PROM / "alerts_test.yml").read_text()))
    assert tested == {r["alert"] for r in alert_rules()}


def test_dashboard_has_the_panels_and_is_provisioned():
    dash = json.loads(DASHBOARD.read_text())
    titles = " | ".join(p["title"] for p in dash["panels"]).lower()
    for needed in (
        "request rate",
        "error",
        "p50 / p95 / p99",
        "queue wait",
        "batch",
        "tokens per second",
        "in-flight",
        "padding",
        "by model",
    ):
        assert needed in titles, needed
    ds = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    uid = ds["datasources"][0]["uid"]
    assert all(
        p["datasource"]["uid"] == uid and all(t["datasource"]["uid"] == uid for t in p["targets"])
        for p in dash["panels"]
    )
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    mounts = " ".join(v for v in compose["services"]["grafana"]["volumes"])
    assert "./grafana/dashboards" in mounts and "./grafana/provisioning" in mounts
    prov = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "dashboards" / "mtserve.yml").read_text())
    assert f"./grafana/dashboards:{prov['providers'][0]['options']['path']}" in mounts


def test_dashboard_selects_models_and_versions():
    """The $model and $version variables (multi-select, All = every value) come from
    mtserve_model_info, the version's from the models chosen; every query over a model-scoped
    metric filters on both, and the panels where models differ most split by model."""
    dash = json.loads(DASHBOARD.read_text())
    ds = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert list(variables) == ["model", "version"]  # version's query reads $model: model comes first
    for name, query in (
        ("model", "label_values(mtserve_model_info, model)"),
        ("version", 'label_values(mtserve_model_info{model=~"$model"}, version)'),
    ):
        v = variables[name]
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        assert v["type"] == "query" and q == query, v
        assert v["datasource"]["uid"] == ds["datasources"][0]["uid"]
        assert v["multi"] is True and v["includeAll"] is True and v["allValue"] == ".*"
        assert v["refresh"] in (1, 2)  # options reloaded on load / on time range change

    scoped = model_scoped_metrics()
    assert {"mtserve_decoder_step_duration_seconds_bucket", "mtserve_model_info", "mtserve_inferences_total"} <= set(
        scoped
    )
    seen = set()
    for p in dash["panels"]:
        for t in p["targets"]:
            for name, selector in re.findall(r"\b(mtserve_\w+)(\{[^}]*\})?", t["expr"]):
                if name not in scoped:
                    continue
                seen.add(scoped[name])
                where = f"{p['title']}: {name}{selector}"
                assert any(m in selector for m in MODEL_SELECTORS), where
                assert VERSION_SELECTOR in selector, where
                # the (-encoder)? form belongs to the per-KServe-model metrics only
                assert ('model=~"($model)(-encoder)?"' in selector) == name.startswith(
                    ("mtserve_inference", "mtserve_last_inference")
                ), where
    assert {scoped[n] for n in scoped} - seen <= {"mtserve_sentences", "mtserve_last_inference_timestamp_seconds"}, (
        "model-scoped metrics no panel shows",
        {scoped[n] for n in scoped} - seen,
    )
    split = [
        p
        for p in dash["panels"]
        if any(k in p["title"].lower() for k in ("tokens per second", "queue wait", "decoder-step", "by model"))
    ]
    assert len(split) >= 4
    for p in split:  # one series per model: summed by model, each named after its model
        for t in p["targets"]:
            assert "by (model" in t["expr"] and "{{model}}" in t["legendFormat"], (p["title"], t["expr"])


def test_compose_wires_the_service_prometheus_and_grafana():
    """Names and ports line up across compose.yaml, prometheus.yml and the Grafana data source:
    Prometheus scrapes the service by its compose name on its metrics port, loads the mounted
    rule file, and Grafana reads from Prometheus by its compose name."""
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"mtserve", "prometheus", "grafana"} <= set(services)
    svc = services["mtserve"]
    container_ports = {p.split(":")[-1] for p in svc["ports"]}
    assert {"50051", "9090"} <= container_ports
    grace = float(svc["environment"]["MTSERVE_GRACE_PERIOD_S"])
    assert svc["stop_signal"] == "SIGTERM" and float(svc["stop_grace_period"].rstrip("s")) > grace

    prom = services["prometheus"]
    prom_yml = yaml.safe_load((PROM / "prometheus.yml").read_text())
    mounted = {v.split(":")[1]: v.split(":")[0] for v in prom["volumes"] if v.startswith("./")}
    config_flag = next(a for a in prom["command"] if a.startswith("--config.file="))
    assert config_flag.split("=", 1)[1] in mounted
    for rule in prom_yml["rule_files"]:
        assert f"/etc/prometheus/{rule}" in mounted and (DEPLOY / mounted[f"/etc/prometheus/{rule}"]).is_file()
    (job,) = [j for j in prom_yml["scrape_configs"] if j["job_name"] == "mtserve"]
    assert job["static_configs"][0]["targets"] == ["mtserve:9090"]
    assert "mtserve" in prom.get("depends_on", [])

    ds = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"  # Prometheus's own port inside the network
    assert "prometheus" in services["grafana"].get("depends_on", [])


# ------------------------------------------------------------------------------ live Prometheus


class Prometheus:
    def __init__(self, binary: str, workdir: Path, target: str):
        self.port = free_port()
        config = workdir / "prometheus.yml"
        config.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(PROM / "alerts.yml")],
                    "scrape_configs": [{"job_name": "mtserve", "static_configs": [{"targets": [target]}]}],
                }
            )
        )
        self.log = open(workdir / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.wait(lambda: self.get("/-/ready", raw=True) is not None, 60, "Prometheus not ready")

    def get(self, path: str, raw: bool = False, **params):
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            body = urllib.request.urlopen(url, timeout=10).read()
        except OSError:
            if raw:
                return None
            raise
        return body if raw else json.loads(body)

    def query(self, expr: str) -> list:
        r = self.get("/api/v1/query", query=expr)
        assert r["status"] == "success", (expr, r)
        return r["data"]["result"]

    def wait(self, cond, timeout: float, what: str) -> None:
        end = time.time() + timeout
        while time.time() < end:
            assert self.proc.poll() is None, (self.log.flush(), Path(self.log.name).read_text())
            if cond():
                return
            time.sleep(0.25)
        raise TimeoutError(what)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def finite(result: list) -> bool:
    return any(math.isfinite(float(s["value"][1])) for s in result)


def model_repository(root: Path, model_dir: Path) -> Path:
    """A repository in Triton's layout holding one model dir under each of MODELS, version 1
    (symlinks: the same tiny export twice)."""
    for name in MODELS:
        (root / name).mkdir(parents=True)
        (root / name / "1").symlink_to(model_dir, target_is_directory=True)
    return root


def service_features(client, sentence: str, model: str = "") -> int:
    """Traffic for the translation service's panels: an HTML text with a do-not-translate word,
    and a text whose language is detected (source_language "auto"); the Translate calls made."""
    word = sentence.split()[1]
    client.translate([f"<p>{sentence}</p>"], model=model, text_type="html", do_not_translate=[word], beam_size=1)
    client.translate([sentence], source_language="auto", target_language="en", beam_size=1)
    return 2


def test_prometheus_scrapes_a_server_under_load_and_every_query_returns_data(make_server, tiny_onnx_dir, tmp_path):
    binary = tool("prometheus")
    repo = model_repository(tmp_path / "models", tiny_onnx_dir.parent)
    srv = make_server(
        model_dir=None,
        onnx_dir=None,
        model_repository=repo,
        metrics_port=free_port(),
        metrics_address="127.0.0.1",
        decode_workers=1,
    )
    prom = Prometheus(binary, tmp_path, f"127.0.0.1:{srv.server.metrics_port}")
    stop = threading.Event()

    def load(kind: int) -> None:
        """Every API on both models, in turn (the default model, tiny-a, named or not)."""
        with srv.client(timeout=30) as c:
            i = 0
            while not stop.is_set():
                i += 1
                model = ("", "tiny-b", "tiny-a", "tiny-b")[i % 4]
                if kind == 0:
                    c.translate(SENTENCES, beam_size=2, model=model)
                elif kind == 1:
                    list(c.translate_stream(SENTENCES[i % 4], beam_size=1, model=model))
                else:
                    c.translate([SENTENCES[i % 4]], beam_size=1, model=model)
                    c.encode(SENTENCES[:2], model=model)
                    service_features(c, SENTENCES[i % 4], model)
                time.sleep(0.02)

    threads = [threading.Thread(target=load, args=(k,), daemon=True) for k in (0, 1, 2)]
    try:
        for t in threads:
            t.start()
        prom.wait(lambda: [s for s in prom.query('up{job="mtserve"}') if s["value"][1] == "1"], 60, "target not up")
        # Enough scrapes with traffic in between for rate() over the dashboard's window, for both models.
        prom.wait(
            lambda: (
                len(
                    [
                        s
                        for s in prom.query(
                            f"sum by (model) (rate(mtserve_generated_tokens_total[{RATE_INTERVAL}])) > 0"
                        )
                        if math.isfinite(float(s["value"][1]))
                    ]
                )
                == len(MODELS)
            ),
            60,
            "no token rate for both models",
        )
        time.sleep(3)
        # One series set per model, each with its version, and nothing under another name.
        for expr in (
            "count by (model) (mtserve_decoder_step_duration_seconds_count)",
            "count by (model) (mtserve_queue_depth)",
            'count by (model) (mtserve_model_info{version="1"})',
        ):
            assert sorted(s["metric"]["model"] for s in prom.query(expr)) == sorted(MODELS), expr
        assert sorted(
            s["metric"]["model"] for s in prom.query("count by (model) (mtserve_inferences_total)")
        ) == sorted([*MODELS, *(f"{m}-encoder" for m in MODELS)])
        missing = []
        for title, expr in dashboard_exprs() + doc_exprs():
            if not finite(prom.query(expr)):
                missing.append((title, expr))
        for rule in alert_rules():
            # a rule over the supervisor's series gets its data in the replicated server's test
            if not for_replicas(rule) and not finite(prom.query(alert_query(rule["expr"]))):
                missing.append((rule["alert"], rule["expr"]))
            prom.query(rule["expr"])  # the full expression parses and evaluates (empty: not firing)
        # The variables' own queries, and each model chosen on its own: data, and only its own.
        assert sorted(s["metric"]["model"] for s in prom.query("group by (model) (mtserve_model_info)")) == sorted(
            MODELS
        )
        assert [
            s["metric"]["version"] for s in prom.query('group by (version) (mtserve_model_info{model=~"tiny-b"})')
        ] == ["1"]
        for model in MODELS:
            for title, expr in dashboard_exprs(model=model, version="1"):
                result = prom.query(expr)
                if not finite(result):
                    missing.append((f"{title} [$model={model}]", expr))
                others = {s["metric"]["model"] for s in result if "model" in s["metric"]} - {model, f"{model}-encoder"}
                assert not others, (title, model, others)
        assert not missing, missing
        # Prometheus loaded and evaluated the rule file itself, without errors; nothing fires.
        prom.wait(
            lambda: all(
                r.get("lastEvaluation", "").startswith("20") and not r["lastEvaluation"].startswith("0001")
                for g in prom.get("/api/v1/rules")["data"]["groups"]
                for r in g["rules"]
            ),
            30,
            "rules not evaluated",
        )
        groups = prom.get("/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        assert {r["name"] for r in rules} == {r["alert"] for r in alert_rules()}
        assert all(r["health"] == "ok" and not r.get("lastError") for r in rules), rules
        assert prom.get("/api/v1/alerts")["data"]["alerts"] == []
        info = prom.query("mtserve_model_info")
        assert {s["metric"]["model"] for s in info} == set(MODELS)
        assert all(s["metric"]["provider"] == "cpu" and s["metric"]["job"] == "mtserve" for s in info)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        prom.stop()


def test_prometheus_scrapes_a_replicated_server_through_its_supervisor(tiny_onnx_dir, tmp_path):
    """`--replicas 2`: the supervisor's merged /metrics is one target. Every dashboard query and
    "useful query" returns data, each replica's series are told apart by `replica`, and summed
    over replicas they count every request once."""
    from tests.service.test_replicas import Supervised, translate_over_connections

    binary = tool("prometheus")
    server = Supervised(tiny_onnx_dir)
    prom = None
    stop = threading.Event()
    sent = []

    def load() -> None:  # Translate over several connections, and a stream for its panel
        from service.client import Client

        with Client(server.address, timeout=30) as c:
            while not stop.is_set():
                sent.append(translate_over_connections(server.address, 16, connections=8).count("OK"))
                list(c.translate_stream(SENTENCES[len(sent) % len(SENTENCES)], beam_size=1))
                sent.append(service_features(c, SENTENCES[len(sent) % len(SENTENCES)]))
                time.sleep(0.05)

    thread = threading.Thread(target=load, daemon=True)
    try:
        server.wait_serving()
        prom = Prometheus(binary, tmp_path, f"127.0.0.1:{server.metrics_port}")
        thread.start()
        prom.wait(lambda: [s for s in prom.query('up{job="mtserve"}') if s["value"][1] == "1"], 60, "target not up")
        prom.wait(
            lambda: finite(prom.query(f"sum(rate(mtserve_generated_tokens_total[{RATE_INTERVAL}])) > 0")),
            60,
            "no token rate",
        )
        time.sleep(3)
        missing = [(title, expr) for title, expr in dashboard_exprs() + doc_exprs() if not finite(prom.query(expr))]
        assert not missing, missing
        assert sorted(s["metric"]["replica"] for s in prom.query("mtserve_model_info")) == ["0", "1"]
        assert [s["value"][1] for s in prom.query("mtserve_replicas_ready")] == ["2"]
        assert [s["value"][1] for s in prom.query("mtserve_replica_restarts_total")] == ["0"]
        # The alerts over the supervisor's series get data from it, and none fires.
        replica_rules = [r for r in alert_rules() if for_replicas(r)]
        assert replica_rules
        for rule in replica_rules:
            assert finite(prom.query(alert_query(rule["expr"]))), rule["alert"]
            assert prom.query(rule["expr"]) == [], rule["alert"]
        stop.set()
        thread.join(60)
        # Once the load stops, the last scrape's sum over replicas counts every request once.
        total = sum(sent)
        prom.wait(
            lambda: [
                s
                for s in prom.query('sum(mtserve_requests_total{method="Translate",code="OK"})')
                if float(s["value"][1]) == total
            ],
            30,
            f"the replicas' Translate counts do not sum to {total}",
        )
    finally:
        stop.set()
        thread.join(60)
        if prom is not None:
            prom.stop()
        server.stop()
