"""The router's metrics (docs/observability.md, "The router"): what it
answered, for which cell, how long until the answer began, and the 421s a
cell gave it. Served on CRONWHEEL_METRICS_PORT + 7 or CRONWHEEL_METRICS_ADDR
(cronwheel/metrics.py), not on the public address, whose /metrics is the
default cell's gateway's.

`cell` is the cell a request was forwarded to (the label cronwheel/metrics.py
leaves as it is), `router` for what the router answered itself (health, a
422 for an unknown cell, a 503 while the directory is away and nothing is
cached, the moves), `every` for the tenant list merged from every cell.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from cronwheel.metrics import LabelledOnce

ITSELF = "router"
EVERY = "every"

REQUESTS = Counter(
    "cronwheel_router_requests_total",
    "Requests the router answered, by the cell it forwarded to and the status",
    ["cell", "status"],
)
LATENCY = Histogram(
    "cronwheel_router_request_seconds",
    "From a request's arrival at the router to the start of its answer",
    ["cell"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
MISDIRECTED = Counter(
    "cronwheel_router_misdirected_total",
    "421s from a cell (a tenant moved since the router's cache read it): `retried`"
    " forwarded again to the cell the directory names now, `returned` passed back"
    " (the directory named the same cell, or the body could not be sent again)",
    ["outcome"],
)
for _outcome in ("retried", "returned"):
    MISDIRECTED.labels(_outcome)


_children = LabelledOnce(
    lambda cell, status: (REQUESTS.labels(cell, str(status)), LATENCY.labels(cell))
)


def observe(cell: str | None, status: int, seconds: float) -> None:
    requests, latency = _children(cell or ITSELF, status)
    requests.inc()
    latency.observe(seconds)
