"""Prometheus metrics, one registry per process. Services expose them on
CRONWHEEL_METRICS_PORT (each service adds its own offset when run by `cronwheel
dev`); the gateway also serves them at /metrics.

Every sample a service exposes carries `cell="<name>"` (CRONWHEEL_CELL, the
single-cell stack's `local` when unset): `exposed()` is the registry as
/metrics renders it, each family's samples copied with the label added, so no
metric's definition names the cell and the label is on every sample, the
libraries' (process_*, python_gc_*) included (docs/observability.md, "Cells").
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)
from prometheus_client.metrics_core import Metric

from cronwheel import config
from cronwheel.core.runs import PRIORITIES

LATENESS_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

RUNS_FIRED = Counter("cronwheel_runs_fired_total", "Runs created by the firing loop", ["kind"])
FIRING_LATENESS = Histogram(
    "cronwheel_firing_lateness_seconds",
    "From a timer's due time to the commit of the transaction that fired it",
    ["priority"],
    buckets=LATENESS_BUCKETS,
)
for _class in PRIORITIES:  # every class's series exists before its first run
    FIRING_LATENESS.labels(_class)
MISSED_INSTANTS = Counter(
    "cronwheel_missed_instants_total", "Scheduled instants older than the catch-up window"
)
FENCED_TIMERS = Counter(
    "cronwheel_fenced_timers_total", "Timers left alone because their partition lease was lost"
)
OWNED_PARTITIONS = Gauge(
    "cronwheel_owned_partitions", "Partitions this instance leases", ["service"]
)
OUTBOX_PUBLISHED = Counter("cronwheel_outbox_published_total", "Outbox rows acknowledged by Kafka")
OUTBOX_FAILED = Counter("cronwheel_outbox_failed_total", "Outbox rows Kafka refused (retried)")
CLASS_BARRIERS = Counter(
    "cronwheel_relay_class_barriers_total",
    "Times the relay waited for a class above normal to be acknowledged before producing"
    " the lower classes due with it",
)
DEAD_LETTERS = Counter(
    "cronwheel_dead_letters_total", "Records set aside as undecodable", ["consumer", "reason"]
)
PROCESSED_PRUNED = Counter(
    "cronwheel_processed_pruned_total",
    "Idempotency rows deleted after the redelivery window",
    ["consumer"],
)
KAFKA_PRODUCER_LATENCY = Gauge(
    "cronwheel_kafka_producer_latency_seconds",
    "librdkafka's last statistics interval (CRONWHEEL_KAFKA_STATS_MS): a record's wait in the"
    " producer's queue, a request's before the socket, and the broker's round trip",
    ["role", "broker", "stage", "quantile"],
)
KAFKA_PRODUCER_QUEUED = Gauge(
    "cronwheel_kafka_producer_queued_messages",
    "Records in the producer's queue, not yet acknowledged (CRONWHEEL_KAFKA_STATS_MS)",
    ["role"],
)
CONSUMER_LAG = Gauge("cronwheel_consumer_lag", "Records behind the end of the topic", ["consumer"])
KAFKA_CLIENTS_RESTARTED = Counter(
    "cronwheel_kafka_clients_restarted_total",
    "Times a service started new Kafka clients because its consumer held partitions it did not read (cronwheel.fetch_watch)",
    ["service"],
)
PRODUCER_HOT_MOVES = Counter(
    "cronwheel_producer_hot_moves_total",
    "Topics a service's sharded producer moved to its hot shard or back"
    " (cronwheel.producer_shards.HotTopics)",
)
PRODUCERS_RENEWED = Counter(
    "cronwheel_producers_renewed_total",
    "Times a service replaced a producer that had met many topics gone quiet (cronwheel.topics_met)",
    ["service"],
)
QUOTA_HELD = Gauge(
    "cronwheel_quota_held",
    "Due job timers (fire) or read records (dispatch) that tenants' token buckets hold back"
    " as of this instance's last pass",
    ["kind"],
)
QUOTA_THROTTLED = Counter(
    "cronwheel_quota_throttled_total",
    "Passes in which a tenant's token bucket held something back, per tenant and pass",
    ["kind"],
)
FAIR_LANES = Gauge(
    "cronwheel_fair_lanes",
    "Lanes (class and tenant, or class and topic) the last backlogged pass shared out",
    ["service"],
)
CLASS_PAUSED = Gauge(
    "cronwheel_dispatcher_class_paused_partitions",
    "Run-topic partitions the dispatcher pauses because a higher class has records waiting",
)
DOZING = Gauge(
    "cronwheel_dispatcher_dozing_partitions",
    "Idle run-topic partitions the dispatcher leaves out of its fetches until a wake",
)
UNPLACED_ACKS = Counter(
    "cronwheel_dispatcher_unplaced_acks_total",
    "Forwards the broker acknowledged without an offset (librdkafka's duplicate-sequence"
    " success: written by an earlier send, at an offset not known)",
)
MISSED_WAKES = Counter(
    "cronwheel_dispatcher_missed_wakes_total",
    "Dozing partitions found with records by the sweep rather than woken by the relay",
)
LATE_WAKES = Counter(
    "cronwheel_relay_late_wakes_total",
    "Wakes the relay sent as it published a record later than its topic's last wake holds",
)
CLASS_PAUSES = Counter(
    "cronwheel_dispatcher_class_pauses_total",
    "Times the dispatcher paused lower-class partitions for a higher class's backlog",
)

SERVICE_PORT_OFFSET = {
    "gateway": 0, "timer": 1, "relay": 2, "dispatcher": 3, "workflow": 4, "webhook": 5,
    "executor": 6, "router": 7,
}  # fmt: skip


class LabelledOnce:
    """Labelled children of metrics, made once per key by `make(*key)`:
    prometheus_client's `labels()` validates and locks on every call, which a
    request path pays per request otherwise. Bounded like the series
    themselves (one entry per label combination)."""

    def __init__(self, make: Callable[..., tuple]):
        self._make = make
        self._made: dict[tuple, tuple] = {}

    def __call__(self, *key) -> tuple:
        made = self._made.get(key)
        if made is None:
            made = self._made[key] = self._make(*key)
        return made


CELL_LABEL = "cell"


class CellLabelled:
    """`registry` as the exposition sees it, with `cell="<cell>"` on every
    sample. A view, not a registry of its own: nothing registers here, and the
    families are copied per scrape, so the process's own metrics (what tests
    read with REGISTRY.get_sample_value) stay as defined. A sample that names
    a cell already keeps it."""

    def __init__(self, cell: str, registry=REGISTRY):
        self.cell = cell
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            labelled = copy.copy(family)
            labelled.samples = [
                s._replace(labels={**s.labels, CELL_LABEL: s.labels.get(CELL_LABEL, self.cell)})
                for s in family.samples
            ]
            yield labelled

    def restricted_registry(self, names: Iterable[str]) -> CellLabelled:
        """What the exposition asks for `/metrics?name[]=...`."""
        return CellLabelled(self.cell, self.registry.restricted_registry(names))


def exposed(cell: str | None = None) -> CellLabelled:
    """The process's registry as /metrics renders it: every sample with its
    cell (`cell`, or this process's: CRONWHEEL_CELL)."""
    return CellLabelled(cell or config.cell())


def render(cell: str | None = None) -> tuple[bytes, str]:
    """The /metrics body (Prometheus text format) and its content type."""
    return generate_latest(exposed(cell)), CONTENT_TYPE_LATEST


def serve(service: str, settings: config.Metrics) -> WSGIServer | None:
    """Expose /metrics (any path answers, so /healthz serves as liveness) on
    CRONWHEEL_METRICS_ADDR (host:port, one service per container), or on
    127.0.0.1 at CRONWHEEL_METRICS_PORT + the service's offset (`cronwheel dev`),
    every sample labelled with the process's cell. The gateway serves /metrics
    on its own HTTP port. Returns the HTTP server (None when there is none)."""
    if service == "gateway":
        return None
    if settings.addr:
        host, _, port = settings.addr.rpartition(":")
        bind, at = host.strip("[]") or "0.0.0.0", int(port)
    elif settings.port is not None:
        bind, at = "127.0.0.1", settings.port + SERVICE_PORT_OFFSET[service]
    else:
        return None
    server, _thread = start_http_server(at, addr=bind, registry=exposed())
    return server
