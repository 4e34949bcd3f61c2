#!/usr/bin/env python3
"""Checks the fluxpipe Helm chart without a cluster and without the helm CLI.

Run by helm/check inside its virtualenv (helm-python-sdk, kubernetes-validate,
PyYAML; jsonschema comes with kubernetes-validate). For each scenario it
lints the chart, renders it, validates every rendered Kubernetes object with
`kubernetes-validate --strict`, validates the Prometheus Operator objects
(which kubernetes-validate has no schema for) against the JSON schemas of
helm/ci/crd-schemas/ (the CRDs' fields the chart uses, closed) and checks
what they select and contain (and their rules with `promtool check rules`
and `promtool test rules` when promtool is installed), parses the pipeline
config in the ConfigMap as TOML and compares it with the values. Values
files under helm/ci/bad/ must be refused. The Grafana dashboard and
helm/README.md are checked too, and every metric the alerts and the
dashboard query must be one fluxpipe exports (the table of docs/metrics.md
and, when target/release/fluxpipe exists, a name found in the binary).

Exits non-zero after printing every problem found.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import helm_python as helm
import jsonschema
import yaml
from helm_python import _native

HELM = Path(__file__).resolve().parent.parent
REPO = HELM.parent
CHART = HELM / "fluxpipe"
CI = HELM / "ci"
KUBE_VERSION = "1.34.0"
MONITORING_API = "monitoring.coreos.com/v1"
RELEASE = "fluxpipe"
NAMESPACE = "flux"
# Objects of the Prometheus Operator: kubernetes-validate has no schema for
# them, so they are checked here.
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}
SEVERITIES = {"critical", "warning", "info"}
ALERT_KINDS = {
    "job_state", "prolog", "epilog", "overrun", "exec_incomplete",
    "node_drained", "node_offline", "node_torpid", "feed_silent", "instance_down",
}
# JSON schemas of the Prometheus Operator objects, by kind.
CRD_SCHEMAS = {
    "ServiceMonitor": CI / "crd-schemas/servicemonitor.json",
    "PrometheusRule": CI / "crd-schemas/prometheusrule.json",
}
# Metrics the table of docs/metrics.md does not list yet but the chart relies on.
EXTRA_METRICS = {"flux_jobs_stuck", "fluxpipe_socket_connections",
                 "fluxpipe_socket_connections_total", "fluxpipe_source_errors_total"}
# Label names that look like metric names.
METRIC_LIKE_LABELS = {"flux_cluster"}
METRIC_RE = re.compile(r"\b((?:fluxpipe|flux)_[a-z_]+)\b")

problems: list[str] = []


def problem(scenario: str, message: str) -> None:
    problems.append(f"[{scenario}] {message}")
    print(f"FAIL [{scenario}] {message}", flush=True)


def render(values: dict | None, api_versions: list[str]) -> dict[str, str]:
    """Render the chart as `helm template` would.

    Chart.render() of helm-python-sdk 0.2.2 passes only name, namespace,
    revision and install/upgrade flags to the library, whose render options
    also take `api_versions` and `kube_version` (the CLI's --api-versions and
    --kube-version); this calls the same library function with them.
    """
    opts = {
        "name": RELEASE,
        "namespace": NAMESPACE,
        "is_install": True,
        "kube_version": f"v{KUBE_VERSION}",
        "api_versions": api_versions,
    }
    with helm.Chart.load(CHART) as chart:
        out = _native.call_string(
            "helm_render",
            chart._raw(),
            None if values is None else json.dumps(values),
            json.dumps(opts),
        )
    return json.loads(out)


def merged_values(values: dict | None) -> dict:
    with helm.Chart.load(CHART) as chart:
        return chart.merge_values(values or {})


def lint(scenario: str, values: dict | None) -> None:
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}")
    for m in report.get("messages", []):
        # 1 = info (only "icon is recommended"), 2 = warning, 3 = error.
        if m.get("severity", 0) >= 2:
            problem(scenario, f"lint: {m.get('path')}: {m.get('error', '').strip()}")
    for e in report.get("errors", []):
        problem(scenario, f"lint: {e.strip()}")


def objects(manifests: dict[str, str]) -> list[dict]:
    docs = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                doc["__source"] = path
                docs.append(doc)
    return docs


def kubernetes_validate(scenario: str, docs: list[dict], workdir: Path) -> None:
    files = []
    for i, doc in enumerate(docs):
        if doc["kind"] in CRD_KINDS:
            continue
        body = {k: v for k, v in doc.items() if k != "__source"}
        f = workdir / f"{scenario}-{i:02d}-{doc['kind']}.yaml"
        f.write_text(yaml.safe_dump(body, sort_keys=False))
        files.append(str(f))
    tool = Path(sys.executable).with_name("kubernetes-validate")
    run = subprocess.run(
        [str(tool), "--strict", "--quiet", "-k", KUBE_VERSION, *files],
        capture_output=True, text=True,
    )
    if run.returncode != 0:
        problem(scenario, "kubernetes-validate --strict:\n" + run.stdout + run.stderr)
    else:
        print(f"ok   [{scenario}] kubernetes-validate --strict -k {KUBE_VERSION}: "
              f"{len(files)} objects valid", flush=True)


def by_kind(docs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


def check_pod(scenario: str, pod: dict, values: dict) -> None:
    spec = pod["spec"]
    psc = spec.get("securityContext", {})
    if psc.get("runAsNonRoot") is not True:
        problem(scenario, "pod securityContext.runAsNonRoot is not true")
    if psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        problem(scenario, "pod seccompProfile is not RuntimeDefault")
    (c,) = [c for c in spec["containers"] if c["name"] == "fluxpipe"]
    want = ["fluxpipe", "run", "--config", "/etc/fluxpipe/fluxpipe.toml"]
    if c["command"][:4] != want:
        problem(scenario, f"container command {c['command']} does not start with {want}")
    sc = c.get("securityContext", {})
    if sc.get("readOnlyRootFilesystem") is not True:
        problem(scenario, "readOnlyRootFilesystem is not true")
    if sc.get("allowPrivilegeEscalation") is not False:
        problem(scenario, "allowPrivilegeEscalation is not false")
    if sc.get("capabilities", {}).get("drop") != ["ALL"]:
        problem(scenario, "capabilities.drop is not [ALL]")
    if sc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        problem(scenario, "container seccompProfile is not RuntimeDefault")
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        got = c.get(probe, {}).get("httpGet", {})
        if got.get("path") != path or got.get("port") != "metrics":
            problem(scenario, f"{probe} is not GET {path} on port metrics: {got}")
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    if ports.get("metrics") != values["metrics"]["port"]:
        problem(scenario, f"container port metrics is {ports.get('metrics')}")
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    for path in ("/etc/fluxpipe", "/var/lib/fluxpipe"):
        if path not in mounts:
            problem(scenario, f"nothing mounted at {path}")
    if "checksum/config" not in pod["metadata"].get("annotations", {}):
        problem(scenario, "pod template has no checksum/config annotation")


def check_config(scenario: str, cm: dict, values: dict, workdir: Path) -> None:
    text = cm["data"]["fluxpipe.toml"]
    try:
        config = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        problem(scenario, f"fluxpipe.toml is not TOML: {e}")
        return
    if config.get("data_dir") != "/var/lib/fluxpipe":
        problem(scenario, f"data_dir is {config.get('data_dir')!r}, not /var/lib/fluxpipe")
    api = config.get("api")
    if not isinstance(api, dict):
        problem(scenario, "the config needs an [api] table (probes and metrics)")
    elif not api.get("address", "").endswith(f":{values['metrics']['port']}"):
        problem(scenario, f"[api] address {api.get('address')} is not on "
                          f"metrics.port {values['metrics']['port']}")
    inputs = {(p["port"], p.get("protocol", "TCP")) for p in values["service"]["inputPorts"]}
    for name, src in config.get("sources", {}).items():
        kind, mode = src.get("type"), src.get("mode", "tcp")
        if kind == "http" or (kind == "socket" and mode in ("tcp", "udp")):
            proto = "TCP" if kind == "http" else mode.upper()
            port = int(src["address"].rsplit(":", 1)[1])
            if (port, proto) not in inputs:
                problem(scenario, f"source {name} listens on {proto} {port}, "
                                  "which is not in service.inputPorts")
    for name, rule in config.get("alerts", {}).get("rules", {}).items():
        if rule.get("kind") not in ALERT_KINDS:
            problem(scenario, f"alerts.rules.{name}.kind {rule.get('kind')!r} is unknown")
    print(f"ok   [{scenario}] fluxpipe.toml parses as TOML and matches the values", flush=True)
    # The real check of the config, when a fluxpipe binary is at hand.
    binary = os.environ.get("FLUXPIPE_BIN") or str(REPO / "target/release/fluxpipe")
    if os.access(binary, os.X_OK):
        f = workdir / f"{scenario}-fluxpipe.toml"
        f.write_text(text)
        run = subprocess.run([binary, "validate", "--config", str(f)],
                             capture_output=True, text=True)
        if run.returncode != 0:
            problem(scenario, f"fluxpipe validate:\n{run.stdout}{run.stderr}")
        else:
            print(f"ok   [{scenario}] fluxpipe validate accepts fluxpipe.toml", flush=True)
    else:
        print(f"skip [{scenario}] fluxpipe validate: no binary at {binary}", flush=True)


def crd_validator(kind: str) -> jsonschema.Draft7Validator:
    schema = json.loads(CRD_SCHEMAS[kind].read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def crd_errors(doc: dict) -> list[str]:
    """What the CRD schema of doc's kind finds wrong with it."""
    body = {k: v for k, v in doc.items() if k != "__source"}
    errors = crd_validator(doc["kind"]).iter_errors(body)
    return [f"{'/'.join(map(str, e.absolute_path)) or '.'}: {e.message}"
            for e in sorted(errors, key=lambda e: list(map(str, e.absolute_path)))]


def check_crd_shape(scenario: str, doc: dict) -> None:
    errors = crd_errors(doc)
    for e in errors:
        problem(scenario, f"{doc['kind']} does not match {CRD_SCHEMAS[doc['kind']].name}: {e}")
    if not errors:
        print(f"ok   [{scenario}] {doc['kind']} matches helm/ci/crd-schemas/"
              f"{CRD_SCHEMAS[doc['kind']].name}", flush=True)


def crd_schema_self_test(sm: dict, pr: dict) -> None:
    """The schemas are closed and typed: spoiled copies of rendered objects
    must fail them, or the shape checks above prove nothing."""
    import copy
    spoilers = [
        ("ServiceMonitor", sm, "endpoint key typo",
         lambda d: d["spec"]["endpoints"][0].update(intervall="30s")),
        ("ServiceMonitor", sm, "interval `30 s`",
         lambda d: d["spec"]["endpoints"][0].update(interval="30 s")),
        ("ServiceMonitor", sm, "selector outside spec",
         lambda d: d.update(selector=d["spec"].pop("selector"))),
        ("ServiceMonitor", sm, "relabeling action `rename`",
         lambda d: d["spec"]["endpoints"][0].update(
             relabelings=[{"action": "rename", "targetLabel": "x"}])),
        ("PrometheusRule", pr, "rule key `fro`",
         lambda d: d["spec"]["groups"][0]["rules"][0].update(fro="5m")),
        ("PrometheusRule", pr, "for `5 minutes`",
         lambda d: d["spec"]["groups"][0]["rules"][0].update({"for": "5 minutes"})),
        ("PrometheusRule", pr, "rule without expr",
         lambda d: d["spec"]["groups"][0]["rules"][0].pop("expr")),
        ("PrometheusRule", pr, "numeric label value",
         lambda d: d["spec"]["groups"][0]["rules"][0].update(labels={"team": 7})),
    ]
    for kind, doc, what, spoil in spoilers:
        if not doc:
            continue
        bad = copy.deepcopy(doc)
        spoil(bad)
        if not crd_errors(bad):
            problem("crd-schemas", f"{kind} schema accepts a {what}")
    print(f"ok   [crd-schemas] the schemas refuse {len(spoilers)} spoiled objects", flush=True)


def check_service_monitor(scenario: str, sm: dict, services: list[dict]) -> None:
    spec = sm.get("spec", {})
    sel = spec.get("selector", {}).get("matchLabels", {})
    matched = [s for s in services
               if sel and all(s["metadata"]["labels"].get(k) == v for k, v in sel.items())
               and s["spec"].get("clusterIP") != "None"]
    if len(matched) != 1:
        problem(scenario, f"ServiceMonitor selects {len(matched)} Services, not 1")
        return
    svc = matched[0]
    names = {p["name"] for p in svc["spec"]["ports"]}
    for ep in spec.get("endpoints", []):
        if ep.get("port") not in names:
            problem(scenario, f"ServiceMonitor endpoint port {ep.get('port')} not on the Service")
        if ep.get("path", "/metrics") != "/metrics":
            problem(scenario, "ServiceMonitor path is not /metrics")
    if not spec.get("endpoints"):
        problem(scenario, "ServiceMonitor has no endpoints")
    job = spec.get("jobLabel")
    if job and job not in svc["metadata"]["labels"]:
        problem(scenario, f"ServiceMonitor jobLabel {job} is not a label of the Service")
    print(f"ok   [{scenario}] ServiceMonitor selects the Service and its metrics port", flush=True)


def check_prometheus_rule(scenario: str, pr: dict, workdir: Path) -> list[str]:
    groups = pr.get("spec", {}).get("groups")
    if not groups:
        problem(scenario, "PrometheusRule has no groups")
        return []
    names = [g.get("name") for g in groups]
    if len(names) != len(set(names)):
        problem(scenario, f"rule group names repeat: {names}")
    alerts = []
    for g in groups:
        if not g.get("name") or not g.get("rules"):
            problem(scenario, f"rule group without name or rules: {g.get('name')}")
        for r in g.get("rules", []):
            if ("alert" in r) == ("record" in r):
                problem(scenario, f"a rule needs one of alert/record: {r}")
            if not isinstance(r.get("expr"), str) or not r["expr"].strip():
                problem(scenario, f"rule {r.get('alert') or r.get('record')} has no expr")
            if "alert" in r:
                alerts.append(r["alert"])
                if r.get("labels", {}).get("severity") not in SEVERITIES:
                    problem(scenario, f"alert {r['alert']} has no severity in {sorted(SEVERITIES)}")
                ann = r.get("annotations", {})
                if r["alert"].startswith(("Flux", "Fluxpipe")) and not (
                        ann.get("summary") and ann.get("description")):
                    problem(scenario, f"alert {r['alert']} lacks summary/description")
    promtool = shutil.which("promtool")
    if promtool:
        f = workdir / f"{scenario}-rules.yaml"
        f.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
        run = subprocess.run([promtool, "check", "rules", str(f)], capture_output=True, text=True)
        if run.returncode != 0:
            problem(scenario, f"promtool check rules:\n{run.stdout}{run.stderr}")
        else:
            print(f"ok   [{scenario}] promtool check rules: {len(alerts)} alerts", flush=True)
        tests = CI / "rules-test.yaml"
        if tests.exists() and scenario == "all-alerts":
            t = workdir / "rules-test.yaml"
            t.write_text(tests.read_text().replace("RULES_FILE", f.name))
            run = subprocess.run([promtool, "test", "rules", str(t)],
                                 capture_output=True, text=True, cwd=workdir)
            if run.returncode != 0:
                problem(scenario, f"promtool test rules:\n{run.stdout}{run.stderr}")
            else:
                print(f"ok   [{scenario}] promtool test rules (helm/ci/rules-test.yaml)", flush=True)
    else:
        print(f"skip [{scenario}] promtool check rules: promtool is not installed "
              "(Debian package prometheus)", flush=True)
    return alerts


def scenario(name: str, values: dict | None, api_versions: list[str], expect: dict,
             workdir: Path) -> dict:
    print(f"---- {name}", flush=True)
    lint(name, values)
    try:
        manifests = render(values, api_versions)
    except helm.HelmError as e:
        problem(name, f"render: {e}")
        return {}
    docs = objects(manifests)
    kinds = by_kind(docs)
    merged = merged_values(values)
    for kind, count in expect.items():
        got = len(kinds.get(kind, []))
        if got != count:
            problem(name, f"{got} {kind} rendered, expected {count}")
    kubernetes_validate(name, docs, workdir)
    for w in kinds.get("Deployment", []) + kinds.get("StatefulSet", []):
        check_pod(name, w["spec"]["template"], merged)
    for sts in kinds.get("StatefulSet", []):
        claims = [c["metadata"]["name"] for c in sts["spec"].get("volumeClaimTemplates", [])]
        if claims != ["data"]:
            problem(name, f"StatefulSet volumeClaimTemplates are {claims}, not [data]")
    for dep in kinds.get("Deployment", []):
        vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
        if "emptyDir" not in vols.get("data", {}):
            problem(name, "Deployment's data volume is not an emptyDir")
    for cm in kinds.get("ConfigMap", []):
        if "fluxpipe.toml" in cm.get("data", {}):
            check_config(name, cm, merged, workdir)
        if "fluxpipe.json" in cm.get("data", {}):
            shipped = json.loads((CHART / "dashboards/fluxpipe.json").read_text())
            if json.loads(cm["data"]["fluxpipe.json"]) != shipped:
                problem(name, "dashboard ConfigMap differs from dashboards/fluxpipe.json")
            if cm["metadata"]["labels"].get("grafana_dashboard") != "1":
                problem(name, "dashboard ConfigMap lacks label grafana_dashboard: \"1\"")
    svc = [s for s in kinds.get("Service", []) if s["spec"].get("clusterIP") != "None"]
    for s in svc:
        names = [p["name"] for p in s["spec"]["ports"]]
        if "metrics" not in names:
            problem(name, "the Service has no port named metrics")
        for p in merged["service"]["inputPorts"]:
            if p["name"] not in names:
                problem(name, f"the Service lacks input port {p['name']}")
    for kind in CRD_KINDS:
        for doc in kinds.get(kind, []):
            check_crd_shape(name, doc)
    for sm in kinds.get("ServiceMonitor", []):
        check_service_monitor(name, sm, kinds.get("Service", []))
    alerts: list[str] = []
    for pr in kinds.get("PrometheusRule", []):
        alerts += check_prometheus_rule(name, pr, workdir)
    return {"manifests": manifests, "kinds": kinds, "alerts": alerts, "merged": merged}


def load_values(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def negative_tests() -> None:
    bad = sorted((CI / "bad").glob("*.yaml"))
    if not bad:
        problem("bad", "no values files in helm/ci/bad")
    for f in bad:
        values = load_values(f)
        report = helm.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}")
        if not report.get("errors"):
            problem("bad", f"lint accepted {f.name}")
        try:
            render(values, [])
        except helm.HelmValuesError as e:
            first = str(e).strip().splitlines()[-1]
            print(f"ok   [bad] {f.name} refused: {first}", flush=True)
        except helm.HelmError as e:
            problem("bad", f"{f.name} failed, but not on its values: {e}")
        else:
            problem("bad", f"render accepted {f.name}")


def check_dashboard() -> set[str]:
    path = CHART / "dashboards/fluxpipe.json"
    try:
        dash = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        problem("dashboard", f"{path} is not JSON: {e}")
        return set()
    names = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
    if names.get("datasource", {}).get("type") != "datasource":
        problem("dashboard", "no datasource variable")
    if "flux_cluster" not in names:
        problem("dashboard", "no flux_cluster variable")
    ids: set[int] = set()
    metrics: set[str] = set()
    count = 0
    for p in dash.get("panels", []):
        if p.get("id") in ids:
            problem("dashboard", f"panel id {p.get('id')} repeated")
        ids.add(p.get("id"))
        if p.get("type") == "row":
            continue
        count += 1
        exprs = [t.get("expr", "") for t in p.get("targets", [])]
        if not exprs or not all(e.strip() for e in exprs):
            problem("dashboard", f"panel {p.get('title')!r} has no query")
        for e in exprs:
            metrics |= set(METRIC_RE.findall(e))
            if "flux_" in e and "fluxpipe_" not in e and "$flux_cluster" not in e:
                problem("dashboard", f"panel {p.get('title')!r} ignores $flux_cluster: {e}")
    metrics -= METRIC_LIKE_LABELS
    print(f"ok   [dashboard] {count} panels, each with a query; {len(metrics)} metrics used",
          flush=True)
    return metrics


def rule_metrics(pr_docs: list[dict]) -> set[str]:
    """The flux_* and fluxpipe_* metrics the rules' expressions use."""
    out: set[str] = set()
    for pr in pr_docs:
        for g in pr["spec"]["groups"]:
            for r in g.get("rules", []):
                out |= set(METRIC_RE.findall(str(r.get("expr", ""))))
    return out - METRIC_LIKE_LABELS


def check_metrics_exist(rules: set[str], dashboard: set[str]) -> None:
    """Every metric an alert or a panel queries is one fluxpipe exports: in
    the table of docs/metrics.md (or EXTRA_METRICS), and, when the binary
    is built, its name is in the binary (histogram suffixes aside; as a
    substring: the binary packs its strings without separators, so this
    catches invented names, and the table, matched exactly, the rest)."""
    before = len(problems)
    known = documented_metrics() | EXTRA_METRICS
    base = {m: re.sub(r"_(bucket|sum|count)$", "", m) for m in rules | dashboard}
    for m in sorted(rules):
        if base[m] not in known:
            problem("metrics", f"an alert uses {m}, which docs/metrics.md does not list")
    binary = Path(os.environ.get("FLUXPIPE_BIN") or REPO / "target/release/fluxpipe")
    if os.access(binary, os.X_OK):
        data = binary.read_bytes()
        for m in sorted(rules | dashboard):
            if base[m].encode() not in data:
                problem("metrics", f"{m} is queried but {binary.name} does not export it")
        where = f"docs/metrics.md and {binary}"
    else:
        print(f"skip [metrics] no binary at {binary}: metric names checked against "
              "docs/metrics.md only", flush=True)
        where = "docs/metrics.md"
    if len(problems) == before:
        print(f"ok   [metrics] the {len(rules)} metrics of the alerts and the "
              f"{len(dashboard)} of the dashboard are all in {where}", flush=True)


def documented_metrics() -> set[str]:
    """The metric names of the table of docs/metrics.md (the manual's page
    on metrics; the table comes before any subsection)."""
    text = (REPO / "docs/metrics.md").read_text()
    section = text.split("\n## ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            names |= set(re.findall(r"`([a-z_]+)`", first))
    return names


def check_docs(alerts: list[str], dashboard_metrics: set[str]) -> None:
    before = len(problems)
    readme = (HELM / "README.md").read_text()
    metrics = documented_metrics()
    extra = EXTRA_METRICS
    for m in sorted(metrics | extra):
        if f"`{m}`" not in readme:
            problem("docs", f"helm/README.md does not list metric {m}")
    used = {re.sub(r"_(bucket|sum|count)$", "", m) for m in dashboard_metrics}
    for m in sorted(used - metrics - extra):
        problem("docs", f"the dashboard uses {m}, which docs/metrics.md does not list")
    for a in sorted(set(alerts)):
        if a.startswith(("Flux", "Fluxpipe")) and a != "FluxSchedQueueLong" and f"`{a}`" not in readme:
            problem("docs", f"helm/README.md does not list alert {a}")
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())

    def keys(d: dict, prefix: str = "") -> list[str]:
        out = []
        for k, v in d.items():
            full = f"{prefix}{k}"
            if isinstance(v, dict) and v and full not in (
                    "prometheusRule.rules", "podSecurityContext", "securityContext",
                    "resources", "livenessProbe", "readinessProbe", "dashboard.labels"):
                out += keys(v, full + ".")
            else:
                out.append(full)
        return out
    for k in keys(defaults):
        if f"`{k}`" not in readme:
            problem("docs", f"helm/README.md does not document values key {k}")
    if len(problems) == before:
        print("ok   [docs] helm/README.md lists every metric, alert and values key", flush=True)


def main() -> int:
    print(f"helm-python-sdk {helm.__version__} (Helm SDK {helm.helm_sdk_version()}), "
          f"Kubernetes {KUBE_VERSION}", flush=True)
    with tempfile.TemporaryDirectory(prefix="fluxpipe-helm-") as tmp:
        work = Path(tmp)
        default = scenario("default", None, [], {
            "Deployment": 1, "StatefulSet": 0, "Service": 1, "ConfigMap": 1,
            "ServiceAccount": 1, "ServiceMonitor": 0, "PrometheusRule": 0,
            "PodDisruptionBudget": 0}, work)
        full_values = load_values(CI / "full-values.yaml")
        full = scenario("full", full_values, [MONITORING_API], {
            "Deployment": 0, "StatefulSet": 1, "Service": 2, "ConfigMap": 2,
            "ServiceMonitor": 1, "PrometheusRule": 1, "PodDisruptionBudget": 1}, work)
        scenario("full-without-monitoring-api", full_values, [], {
            "StatefulSet": 1, "ServiceMonitor": 0, "PrometheusRule": 0}, work)
        scenario("deployment", load_values(CI / "deployment-values.yaml"), [MONITORING_API], {
            "Deployment": 1, "StatefulSet": 0, "Service": 1, "ConfigMap": 1,
            "ServiceAccount": 0, "PodDisruptionBudget": 1, "ServiceMonitor": 0}, work)
        # Every chart alert on, in default form, for the docs check.
        all_on = {"prometheusRule": {"enabled": True, "rules": {
            k: {"enabled": True} for k in merged_values(None)["prometheusRule"]["rules"]}}}
        every = scenario("all-alerts", all_on, [MONITORING_API], {"PrometheusRule": 1}, work)
        # Turned on as it ships, the PrometheusRule watches the pipeline only:
        # the Flux* alerts duplicate fluxpipe's own rules and are opt-in.
        rules_on = scenario("rules-as-shipped", {"prometheusRule": {"enabled": True}},
                            [MONITORING_API], {"PrometheusRule": 1}, work)
        doubled = [a for a in rules_on.get("alerts", []) if not a.startswith("Fluxpipe")]
        if doubled or not rules_on.get("alerts"):
            problem("rules-as-shipped", f"Flux alerts on by default beside fluxpipe's own: {doubled}")
        full_kinds = full.get("kinds", {})
        crd_schema_self_test((full_kinds.get("ServiceMonitor") or [{}])[0],
                             (full_kinds.get("PrometheusRule") or [{}])[0])

        # Full scenario specifics: overrides, additions and switches.
        alerts = full.get("alerts", [])
        if "FluxNodeTorpid" in alerts or "FluxSchedQueueLong" not in alerts:
            problem("full", f"rule overrides not applied: {alerts}")
        for pr in full.get("kinds", {}).get("PrometheusRule", []):
            for r in pr["spec"]["groups"][0]["rules"]:
                if r.get("alert") == "FluxNodeOffline" and r.get("for") != "30m":
                    problem("full", "FluxNodeOffline.for override not applied")
                if "alert" in r and r.get("labels", {}).get("team") != "hpc":
                    problem("full", f"additionalRuleLabels missing on {r['alert']}")

        # A new config rolls the pods: the checksum follows the config.
        if default:
            other = render({"config": default["merged"]["config"] + "\n# changed\n"}, [])

            def checksum(manifests: dict[str, str]) -> str:
                dep = [d for d in objects(manifests) if d["kind"] == "Deployment"][0]
                return dep["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            if checksum(other) == checksum(default["manifests"]):
                problem("default", "checksum/config does not change with the config")
            else:
                print("ok   [default] checksum/config changes with the config", flush=True)

        print("---- bad values", flush=True)
        negative_tests()
        print("---- dashboard and docs", flush=True)
        dm = check_dashboard()
        check_docs(every.get("alerts", []), dm)
        check_metrics_exist(rule_metrics(every.get("kinds", {}).get("PrometheusRule", [])), dm)

    if problems:
        print(f"\nhelm check: {len(problems)} problems", flush=True)
        return 1
    print("\nhelm check: chart, dashboard and docs OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
