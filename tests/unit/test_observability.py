"""deploy/grafana/cronwheel.json and deploy/prometheus/alerts.yml ask only for
metrics and labels the code exports: the names are collected from
prometheus_client's registry after importing every module that declares a
metric, so a renamed or dropped metric fails here rather than as an empty panel
or an alert that can never fire. promtool, where installed, parses every
expression and runs the alerts on made-up series."""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY
from prometheus_client.metrics import MetricWrapperBase

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "cronwheel.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"

# A metric declared as a module-level prometheus_client object: `NAME = Counter(`.
DECLARES = re.compile(r"^\w+ = (?:Prom)?(?:Counter|Gauge|Histogram|Summary)\(", re.M)
METRIC = re.compile(r"\bcronwheel_[a-z0-9_]+\b")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
MATCHER = re.compile(r"[{,]\s*([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)\s*\"")
# Labels every series carries beside its own: `job` and `instance` added by
# the scrape, `cell` by the exposition (metrics.CellLabelled); and a
# histogram's buckets carry `le`.
TARGET_LABELS = {"job", "instance", "cell"}
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
}


def metric_modules() -> list[str]:
    """Every platform module declaring a metric (the SDK exports none)."""
    found = []
    for path in [*(ROOT / "cronwheel").rglob("*.py"), *(ROOT / "services").rglob("*.py")]:
        rel = path.relative_to(ROOT)
        if "sdk" in rel.parts or "prometheus_client" not in (text := path.read_text()):
            continue
        if DECLARES.search(text):
            found.append(".".join(rel.with_suffix("").parts))
    return sorted(found)


def exported() -> dict[str, set[str]]:
    """{sample name: its labels} of every cronwheel_ metric the code declares."""
    for module in metric_modules():
        importlib.import_module(module)
    out: dict[str, set[str]] = {}
    # prometheus_client has no public list of a registry's collectors or of a
    # metric's label names; both are read as metrics_dir.py reads them.
    for collector in list(REGISTRY._collector_to_names):  # noqa: SLF001
        if not isinstance(collector, MetricWrapperBase):  # the process and GC collectors
            continue
        labels = set(collector._labelnames)  # noqa: SLF001
        for family in collector.describe():
            if not family.name.startswith("cronwheel_"):
                continue
            for suffix in SUFFIXES[family.type]:
                out[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return out


def dashboard_exprs() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and query variable of the dashboard."""
    doc = json.loads(DASHBOARD.read_text())
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append((f"panel {p['title']!r} {t['refId']}", t["expr"]))
            walk(p.get("panels", []))

    walk(doc["panels"])
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query)
            assert m, f"variable {var['name']}: {query}"
            out.append((f"variable {var['name']}", f"{m[1]}{{{m[2]}=~'.*'}}"))
    return out


def alert_rules() -> list[dict]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def check(where: str, expr: str, known: dict[str, set[str]]) -> list[str]:
    """What in `expr` the code does not export: metric names, then labels
    (grouped by or matched) that none of its metrics carries."""
    names = set(METRIC.findall(expr))
    faults = [f"{where}: {n} is not exported" for n in sorted(names - set(known))]
    if not names:
        faults.append(f"{where}: no cronwheel metric in {expr!r}")
    carried = TARGET_LABELS.union(*(known.get(n, set()) for n in names))
    used = {x.strip() for g in GROUPING.findall(expr) for x in g.split(",") if x.strip()}
    used |= set(MATCHER.findall(expr))
    faults += [
        f"{where}: label {x!r} is on none of {sorted(names)}" for x in sorted(used - carried)
    ]
    return faults


def test_exported__the_known_metrics_are_collected():
    known = exported()
    for name in (
        "cronwheel_runs_fired_total",
        "cronwheel_firing_lateness_seconds_bucket",
        "cronwheel_consumer_lag",
        "cronwheel_http_request_seconds_bucket",  # the gateway's
        "cronwheel_webhook_deliveries_total",  # a service's own module
    ):
        assert name in known, name
    assert known["cronwheel_dead_letters_total"] == {"consumer", "reason"}
    assert check("x", "sum by (consumr) (cronwheel_consumer_lag)", known) == [
        "x: label 'consumr' is on none of ['cronwheel_consumer_lag']"
    ]
    assert check("x", "rate(cronwheel_runs_fired[5m])", known) == [
        "x: cronwheel_runs_fired is not exported"
    ]


def test_dashboard__every_metric_and_label_is_exported():
    known = exported()
    faults = [f for where, expr in dashboard_exprs() for f in check(where, expr, known)]
    assert faults == []


def test_dashboard__covers_the_issue_s_metrics__every_query_filtered_by_cell():
    exprs = [expr for _, expr in dashboard_exprs()]
    text = "\n".join(exprs)
    for name in (
        "cronwheel_runs_fired_total",
        "cronwheel_firing_lateness_seconds_bucket",
        "cronwheel_missed_instants_total",
        "cronwheel_dead_letters_total",
        "cronwheel_consumer_lag",
        "cronwheel_http_request_seconds_bucket",
    ):
        assert name in text, name
    panels = [e for w, e in dashboard_exprs() if w.startswith("panel")]
    unfiltered = [e for e in panels if 'cell=~"$cell"' not in e]
    assert unfiltered == []
    doc = json.loads(DASHBOARD.read_text())
    names = [v["name"] for v in doc["templating"]["list"]]
    assert names == ["datasource", "cell"]
    cell = doc["templating"]["list"][1]
    assert cell["includeAll"] and cell["allValue"] == ".*"  # series without `cell` match too


def test_dashboard__worker_protocol_panels__exactly_the_worker_routes():
    """The route regex of the worker protocol panels matches the gateway's
    worker protocol routes (fastpath.WORKER) and none of its other routes."""
    from services.gateway import routes
    from services.gateway.fastpath import WORKER

    regexes = {
        m
        for w, e in dashboard_exprs()
        if "cronwheel_http_request" in e
        for m in re.findall(r'route=~"([^"]+)"', e)
    }
    assert len(regexes) == 1, regexes
    # PromQL anchors a regex matcher at both ends, as fullmatch does.
    worker = re.compile(regexes.pop())
    paths = set()
    for info in pkgutil.iter_modules(routes.__path__):
        module = importlib.import_module(f"{routes.__name__}.{info.name}")
        paths |= {r.path for r in module.router.routes}
    wanted = {s.path for s in WORKER}
    assert wanted <= paths
    assert {p for p in paths if worker.fullmatch(p)} == wanted


def test_alerts__every_metric_and_label_is_exported__each_waits_and_says_what_to_do():
    known = exported()
    rules = alert_rules()
    faults = [f for r in rules for f in check(r["alert"], r["expr"], known)]
    assert faults == []
    for r in rules:
        assert re.fullmatch(r"\d+[smh]", r.get("for", "")), r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]
        assert r["labels"]["severity"] in ("warning", "critical"), r["alert"]
    text = "\n".join(r["expr"] for r in rules)
    assert "histogram_quantile(0.99" in text and "cronwheel_firing_lateness_seconds" in text
    for name in (
        "cronwheel_missed_instants_total",
        "cronwheel_dead_letters_total",
        "cronwheel_consumer_lag",
    ):
        assert name in text, name


# -- promtool ----------------------------------------------------------------------

# On PATH, or beside this interpreter (`make install` puts it in .venv/bin).
PROMTOOL = shutil.which("promtool") or shutil.which(
    "promtool", path=str(Path(sys.executable).parent)
)
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed (make install takes it from Debian's prometheus"
    " package); the names are checked above without it",
)


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)


@needs_promtool
def test_promtool__alert_rules_check():
    p = promtool("check", "rules", str(ALERTS))
    assert p.returncode == 0, p.stdout + p.stderr


@needs_promtool
def test_promtool__dashboard_queries_parse(tmp_path):
    """Each panel's query, its Grafana variables given values, as a recording
    rule: promtool parses it as Prometheus would."""
    rules = []
    for i, (_where, expr) in enumerate(dashboard_exprs()):
        expr = expr.replace("$__rate_interval", "5m").replace("$cell", ".*")
        assert "$" not in expr, expr
        rules.append({"record": f"cronwheel:dashboard_query_{i}", "expr": expr})
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    p = promtool("check", "rules", str(path))
    assert p.returncode == 0, p.stdout + p.stderr


# Series fed to the rules minute by minute, and the alerts expected at given
# times: each alert fires on its trouble once its `for:` has passed, not before.
ALERT_TESTS = """
rule_files: [{alerts}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'cronwheel_firing_lateness_seconds_bucket{{le="0.5"}}'
        values: '0+100x5 500+10x30'
      - series: 'cronwheel_firing_lateness_seconds_bucket{{le="2.5"}}'
        values: '0+100x5 600+100x30'
      - series: 'cronwheel_firing_lateness_seconds_bucket{{le="+Inf"}}'
        values: '0+100x5 600+100x30'
      - series: 'cronwheel_missed_instants_total'
        values: '0x20 3x20'
      - series: 'cronwheel_owned_partitions{{service="timer", instance="a"}}'
        values: '512x40'
      - series: 'cronwheel_owned_partitions{{service="timer", instance="b"}}'
        values: '512x10 _x30'
      - series: 'cronwheel_dead_letters_total{{consumer="dispatcher", reason="undecodable"}}'
        values: '0x5 1x30'
      - series: 'cronwheel_consumer_lag{{consumer="webhook", instance="a"}}'
        values: '4000x5 6000x30'
      - series: 'cronwheel_kafka_clients_restarted_total{{service="dispatcher", instance="a"}}'
        values: '0x5 1x10 4x20'
    alert_rule_test:
      - eval_time: 4m
        alertname: CronwheelFiringLatenessP99High
        exp_alerts: []
      - eval_time: 25m
        alertname: CronwheelFiringLatenessP99High
        exp_alerts:
          - exp_labels: {{severity: warning}}
      - eval_time: 20m
        alertname: CronwheelMissedInstants
        exp_alerts: []
      - eval_time: 23m
        alertname: CronwheelMissedInstants
        exp_alerts:
          - exp_labels: {{severity: critical}}
      - eval_time: 9m
        alertname: CronwheelTimerPartitionsUnleased
        exp_alerts: []
      - eval_time: 25m
        alertname: CronwheelTimerPartitionsUnleased
        exp_alerts:
          - exp_labels: {{severity: critical}}
      - eval_time: 8m
        alertname: CronwheelDeadLetters
        exp_alerts:
          - exp_labels: {{severity: warning, consumer: dispatcher, reason: undecodable}}
      - eval_time: 12m
        alertname: CronwheelKafkaClientsRestarting
        exp_alerts: []
      - eval_time: 25m
        alertname: CronwheelKafkaClientsRestarting
        exp_alerts:
          - exp_labels: {{severity: warning, service: dispatcher}}
      - eval_time: 12m
        alertname: CronwheelConsumerLagHigh
        exp_alerts: []
      - eval_time: 17m
        alertname: CronwheelConsumerLagHigh
        exp_alerts:
          - exp_labels: {{severity: warning, consumer: webhook}}
"""


@needs_promtool
def test_promtool__alerts_fire_on_their_trouble_after_their_for(tmp_path):
    # The rules without their annotations (promtool compares them too; the
    # texts are not what this test is about).
    doc = yaml.safe_load(ALERTS.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations")
    rules = tmp_path / "alerts.yml"
    rules.write_text(yaml.safe_dump(doc))
    path = tmp_path / "alerts_test.yml"
    path.write_text(ALERT_TESTS.format(alerts=json.dumps(str(rules))))
    p = promtool("test", "rules", str(path))
    assert p.returncode == 0, p.stdout + p.stderr
