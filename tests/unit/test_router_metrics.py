"""The router's request metrics (services/router/metrics.py): each request
counted once under the cell it went to (`router` for its own answers), its
time observed, whether or not the labelled children were made before."""

from __future__ import annotations

from prometheus_client import REGISTRY

from services.router import metrics


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_observe__counted_per_cell_and_status__time_observed__router_for_none():
    before = _value("cronwheel_router_requests_total", cell="eu", status="201")
    count = _value("cronwheel_router_request_seconds_count", cell="eu")
    total = _value("cronwheel_router_request_seconds_sum", cell="eu")
    own = _value("cronwheel_router_requests_total", cell="router", status="422")
    for seconds in (0.002, 0.004, 0.006):
        metrics.observe("eu", 201, seconds)
    metrics.observe(None, 422, 0.001)
    assert _value("cronwheel_router_requests_total", cell="eu", status="201") == before + 3
    assert _value("cronwheel_router_request_seconds_count", cell="eu") == count + 3
    assert abs(_value("cronwheel_router_request_seconds_sum", cell="eu") - total - 0.012) < 1e-9
    assert _value("cronwheel_router_requests_total", cell="router", status="422") == own + 1
