"""librdkafka's own statistics of a service's producer, as metrics.

The Kafka hop from a service's produce() call to a record being readable is
most of the firing path's lateness (docs/architecture.md, "The floor beside
the platform's own load"), and librdkafka alone knows how that time splits:
`int_latency`, a record's wait in the producer's queue before it goes into a
request (the linger, and requests ahead of it); `outbuf_latency`, a request's
wait before it is written to the socket; `rtt`, the broker's answer. Every
`CRONWHEEL_KAFKA_STATS_MS` the client hands its statistics (JSON) to the
callback below, during the service's own poll() or flush() (every consumer
service polls its producer once a turn), and its
histograms start again: each gauge is the last interval's, 0 when nothing
was sent in it.

Off by default: librdkafka builds the JSON with every partition the producer
has met, which at thousands of tenants is megabytes a time to build and
parse. Turn it on to find where a hop's time goes, at an interval of seconds.
"""

from __future__ import annotations

import json
import logging

from cronwheel import config, metrics

log = logging.getLogger("cronwheel.kafka_stats")

# librdkafka's histograms (microseconds) -> the `stage` label
STAGES = {"int_latency": "queue", "outbuf_latency": "outbuf", "rtt": "rtt"}
QUANTILES = {"p50": "0.5", "p99": "0.99", "max": "1"}


class Recorder:
    """A producer's `stats_cb`: the last interval's latencies, per broker."""

    def __init__(self, role: str):
        self.role = role
        self.intervals = 0

    def __call__(self, stats_json: str) -> None:
        try:
            stats = json.loads(stats_json)
            self._record(stats)
        except Exception as exc:  # a client's JSON we do not read; never into the poll() caller
            log.warning("librdkafka statistics of %s not read: %s", self.role, exc)
            return
        self.intervals += 1

    def _record(self, stats: dict) -> None:
        """Every value read first, then set: a JSON missing a part sets none."""
        queued = int(stats["msg_cnt"])
        latencies = []
        for broker in stats["brokers"].values():
            if broker["nodeid"] < 0:  # a bootstrap connection, not a broker's
                continue
            node = str(broker["nodeid"])
            for field, stage in STAGES.items():
                histogram = broker[field]
                for key, quantile in QUANTILES.items():
                    seconds = histogram[key] / 1e6 if histogram["cnt"] else 0.0
                    latencies.append(((self.role, node, stage, quantile), seconds))
        metrics.KAFKA_PRODUCER_QUEUED.labels(self.role).set(queued)
        for labels, seconds in latencies:
            metrics.KAFKA_PRODUCER_LATENCY.labels(*labels).set(seconds)


def options(role: str) -> dict:
    """The producer configuration that turns the statistics on for `role`
    (`CRONWHEEL_KAFKA_STATS_MS`), else nothing."""
    every_ms = config.load(config.Metrics).kafka_stats_ms
    if not every_ms:
        return {}
    return {"statistics.interval.ms": every_ms, "stats_cb": Recorder(role)}
