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

A service may send through several producers (cronwheel.producer_shards),
each with its statistics and its own `Recorder`: a role's gauges are then
over all of them, the records queued summed and each latency the worst
producer's (an upper bound of the union's quantile, not the quantile). A
producer that stopped reporting (renewed, closed) drops out after
`STALE_INTERVALS` of its intervals.

Off by default: librdkafka builds the JSON with every partition the producer
has met, which at thousands of tenants is megabytes a time to build and
parse. Turn it on to find where a hop's time goes, at an interval of seconds.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time

from cronwheel import config, metrics

log = logging.getLogger("cronwheel.kafka_stats")

# librdkafka's histograms (microseconds) -> the `stage` label
STAGES = {"int_latency": "queue", "outbuf_latency": "outbuf", "rtt": "rtt"}
QUANTILES = {"p50": "0.5", "p99": "0.99", "max": "1"}
STALE_INTERVALS = 3  # a producer silent this many of its intervals is left out

_KEYS = itertools.count()
_LOCK = threading.Lock()  # each producer's callback runs in whichever thread polls it
# role -> recorder's key -> (monotonic time, records queued, [(labels, seconds)], stale_s)
_LAST: dict[str, dict[int, tuple[float, int, list, float]]] = {}


class Recorder:
    """A producer's `stats_cb`: the last interval's latencies, per broker."""

    def __init__(self, role: str, every_ms: int = 0):
        self.role = role
        self.intervals = 0
        self.key = next(_KEYS)
        # 0: never left out (one producer's recorder is replaced, not silent)
        self.stale_s = STALE_INTERVALS * every_ms / 1000

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
        now = time.monotonic()
        with _LOCK:
            last = _LAST.setdefault(self.role, {})
            last[self.key] = (now, queued, latencies, self.stale_s)
            for key, (at, _q, _l, stale_s) in list(last.items()):
                if stale_s and now - at > stale_s:
                    del last[key]
            worst: dict[tuple, float] = {}
            for _at, _q, each, _s in last.values():
                for labels, seconds in each:
                    worst[labels] = max(seconds, worst.get(labels, 0.0))
            metrics.KAFKA_PRODUCER_QUEUED.labels(self.role).set(
                sum(q for _a, q, _l, _s in last.values())
            )
            for labels, seconds in worst.items():
                metrics.KAFKA_PRODUCER_LATENCY.labels(*labels).set(seconds)


def options(role: str) -> dict:
    """The producer configuration that turns the statistics on for `role`
    (`CRONWHEEL_KAFKA_STATS_MS`), else nothing."""
    every_ms = config.load(config.Metrics).kafka_stats_ms
    if not every_ms:
        return {}
    return {"statistics.interval.ms": every_ms, "stats_cb": Recorder(role, every_ms)}
