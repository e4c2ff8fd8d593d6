"""librdkafka's statistics read into metrics (cronwheel.kafka_stats): the
last interval's queue wait, socket wait and round trip per broker, in
seconds; an interval with nothing sent reads 0; JSON it cannot read is
logged and changes nothing."""

from __future__ import annotations

import json
import logging

from prometheus_client import REGISTRY

from cronwheel import kafka_stats
from cronwheel.kafka_stats import Recorder

LATENCY = "cronwheel_kafka_producer_latency_seconds"


def _histogram(p50: int, p99: int, top: int, cnt: int = 10) -> dict:
    return {"min": 1, "max": top, "avg": p50, "p50": p50, "p99": p99, "cnt": cnt}


def _stats(rtt: dict, queued: int = 3) -> str:
    broker = {
        "nodeid": 1,
        "int_latency": _histogram(1_000, 38_000, 57_000),
        "outbuf_latency": _histogram(17, 2_751, 11_075),
        "rtt": rtt,
    }
    bootstrap = {**broker, "nodeid": -1, "rtt": _histogram(9, 9, 9_000_000)}
    return json.dumps({"msg_cnt": queued, "brokers": {"b1": broker, "boot": bootstrap}})


def _seen(role: str, stage: str, quantile: str) -> float | None:
    labels = {"role": role, "broker": "1", "stage": stage, "quantile": quantile}
    return REGISTRY.get_sample_value(LATENCY, labels)


def test_recorder__last_interval_per_stage_in_seconds__bootstrap_connection_left_out():
    r = Recorder("unit-relay")
    r(_stats(_histogram(197, 14_783, 35_524)))
    assert _seen("unit-relay", "queue", "0.99") == 0.038
    assert _seen("unit-relay", "outbuf", "1") == 0.011075
    assert _seen("unit-relay", "rtt", "0.5") == 0.000197
    assert REGISTRY.get_sample_value(LATENCY, {"role": "unit-relay", "broker": "-1",
                                               "stage": "rtt", "quantile": "1"}) is None  # fmt: skip
    assert (
        REGISTRY.get_sample_value(
            "cronwheel_kafka_producer_queued_messages", {"role": "unit-relay"}
        )
        == 3
    )
    r(_stats(_histogram(0, 0, 0, cnt=0)))  # nothing sent in this interval
    assert _seen("unit-relay", "rtt", "1") == 0.0
    assert r.intervals == 2


def test_recorder__json_it_cannot_read__logged_and_nothing_changes(caplog):
    r = Recorder("unit-odd")
    r(_stats(_histogram(100, 200, 300)))
    with caplog.at_level(logging.WARNING, "cronwheel.kafka_stats"):
        r("{not json")
        r(json.dumps({"brokers": {}}))  # no msg_cnt
        r(json.dumps({"msg_cnt": 0, "brokers": []}))  # brokers not an object
        half = json.loads(_stats(_histogram(900, 900, 900), queued=7))
        del half["brokers"]["b1"]["outbuf_latency"]
        r(json.dumps(half))  # a broker without one histogram: nothing of it is set
    assert r.intervals == 1
    assert _seen("unit-odd", "rtt", "1") == 0.0003
    assert (
        REGISTRY.get_sample_value("cronwheel_kafka_producer_queued_messages", {"role": "unit-odd"})
        == 3
    )
    assert len([m for m in caplog.messages if "not read" in m]) == 4


def test_options__off_unless_asked(monkeypatch):
    monkeypatch.delenv("CRONWHEEL_KAFKA_STATS_MS", raising=False)
    assert kafka_stats.options("relay") == {}
    monkeypatch.setenv("CRONWHEEL_KAFKA_STATS_MS", "5000")
    got = kafka_stats.options("relay")
    assert got["statistics.interval.ms"] == 5000
    assert isinstance(got["stats_cb"], Recorder) and got["stats_cb"].role == "relay"


def test_recorders_of_one_role__queued_summed__latency_the_worst__a_silent_one_left_out(
    monkeypatch,
):
    """A service sending through several producers (cronwheel.producer_shards):
    one producer's report does not overwrite the others'."""
    clock = [100.0]
    monkeypatch.setattr(kafka_stats.time, "monotonic", lambda: clock[0])
    a, b = Recorder("unit-shards", 1000), Recorder("unit-shards", 1000)
    a(_stats(_histogram(100, 2_000, 5_000), queued=3))
    b(_stats(_histogram(300, 1_000, 9_000), queued=4))

    def queued() -> float | None:
        return REGISTRY.get_sample_value(
            "cronwheel_kafka_producer_queued_messages", {"role": "unit-shards"}
        )

    assert queued() == 7
    assert _seen("unit-shards", "rtt", "0.5") == 0.0003  # b's
    assert _seen("unit-shards", "rtt", "0.99") == 0.002  # a's
    assert _seen("unit-shards", "rtt", "1") == 0.009  # b's
    clock[0] += 2.5  # b reports again within its three intervals: both stay
    b(_stats(_histogram(0, 0, 0, cnt=0), queued=0))
    assert queued() == 3 and _seen("unit-shards", "rtt", "1") == 0.005
    clock[0] += 1.0  # a silent for 3.5 s, three intervals and more: left out
    b(_stats(_histogram(0, 0, 0, cnt=0), queued=1))
    assert queued() == 1 and _seen("unit-shards", "rtt", "1") == 0.0
