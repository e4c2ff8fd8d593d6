"""Every sample a service exposes carries its cell (cronwheel/metrics.py,
CellLabelled; docs/observability.md "Cells"): the families of each service
type, the libraries' too, through the renderer the gateway's /metrics uses
and through the HTTP server every other service starts."""

from __future__ import annotations

import importlib
import socket
import urllib.request

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, Gauge
from prometheus_client.parser import text_string_to_metric_families

from cronwheel import config, metrics

# One family declared by each service type (its module), and the sample to find.
BY_SERVICE = {
    "gateway": ("services.gateway.http_metrics", "cronwheel_http_request_seconds_bucket"),
    "timer": ("services.timer.service", "cronwheel_firing_lateness_seconds_bucket"),
    "relay": ("cronwheel.metrics", "cronwheel_outbox_published_total"),
    "dispatcher": ("cronwheel.metrics", "cronwheel_dispatcher_dozing_partitions"),
    "workflow": ("services.workflow.service", "cronwheel_workflow_node_runs_created_total"),
    "webhook": ("services.webhook.service", "cronwheel_webhook_waiting_runs"),
    "executor": ("services.executor.service", "cronwheel_executor_active_runs"),
}


@pytest.fixture(scope="module", autouse=True)
def families():
    for module, _ in BY_SERVICE.values():
        importlib.import_module(module)
    # A labelled family has no sample until a child exists: one for the gateway's.
    from services.gateway.http_metrics import LATENCY

    LATENCY.labels("GET", "/cell-label-test")


def _samples(text: str) -> list:
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def test_render__every_sample_of_every_service_type_carries_the_cell():
    body, kind = metrics.render("eu")
    assert kind.startswith("text/plain")
    samples = _samples(body.decode())
    names = {s.name for s in samples}
    for service, (_, name) in BY_SERVICE.items():
        assert name in names, f"{service}: {name} not exposed"
    assert {s.labels.get("cell") for s in samples} == {"eu"}
    # The libraries' collectors (process, GC) are labelled too: every sample.
    assert any(s.name.startswith("python_gc_") for s in samples)


def test_render__the_process_s_own_registry_is_unchanged():
    metrics.render("eu")
    # What in-process readers see keeps the metric's own labels only.
    value = REGISTRY.get_sample_value(
        "cronwheel_firing_lateness_seconds_count", {"priority": "normal"}
    )
    assert value is not None
    assert (
        REGISTRY.get_sample_value(
            "cronwheel_firing_lateness_seconds_count", {"priority": "normal", "cell": "eu"}
        )
        is None
    )


def test_cell__unset__the_single_cell_stack_s_name(monkeypatch):
    monkeypatch.delenv("CRONWHEEL_CELL", raising=False)
    body, _ = metrics.render()
    assert {s.labels["cell"] for s in _samples(body.decode())} == {"local"}
    monkeypatch.setenv("CRONWHEEL_CELL", "us")
    body, _ = metrics.render()
    assert {s.labels["cell"] for s in _samples(body.decode())} == {"us"}


def test_labelled__a_sample_naming_its_cell_keeps_it__restricted_names_too():
    registry = CollectorRegistry()
    gauge = Gauge("cw_test_where", "test", ["cell", "kind"], registry=registry)
    gauge.labels("other", "a").set(1)
    Gauge("cw_test_plain", "test", registry=registry).set(2)
    view = metrics.CellLabelled("eu", registry)
    got = {(s.name, s.labels["cell"]) for fam in view.collect() for s in fam.samples}
    assert got == {("cw_test_where", "other"), ("cw_test_plain", "eu")}
    only = view.restricted_registry(["cw_test_plain"])
    assert [s.labels for fam in only.collect() for s in fam.samples] == [{"cell": "eu"}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("service", ["timer", "relay", "dispatcher", "workflow", "webhook",
                                     "executor"])  # fmt: skip
def test_serve__each_service_s_metrics_port__every_sample_carries_the_cell(monkeypatch, service):
    monkeypatch.setenv("CRONWHEEL_CELL", "eu")
    port = _free_port()
    server = metrics.serve(service, config.Metrics(addr=f"127.0.0.1:{port}"))
    assert server is not None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            samples = _samples(resp.read().decode())
    finally:
        server.shutdown()
        server.server_close()
    names = {s.name for s in samples}
    assert BY_SERVICE[service][1] in names
    assert {s.labels.get("cell") for s in samples} == {"eu"}
