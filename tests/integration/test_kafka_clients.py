"""Both Kafka clients the project uses speak the broker that `cronwheel up`
starts (Kafka 4.1): confluent-kafka (services, SDK) and aiokafka (under
faust-streaming), each round-tripping Avro single-object records."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from cronwheel import kafka
from cronwheel.core import events
from cronwheel.core.avro import default_registry
from tests.support.kafka import drain

pytestmark = pytest.mark.integration


def _aio(role: str, bootstrap: str) -> dict:
    """aiokafka's arguments for a platform role's SASL principal."""
    conf = kafka.security(role, bootstrap)
    out = {"security_protocol": conf["security.protocol"]}
    if "sasl.username" in conf:
        out.update(
            sasl_mechanism=conf["sasl.mechanism"],
            sasl_plain_username=conf["sasl.username"],
            sasl_plain_password=conf["sasl.password"],
        )
    return out


def _record(i: int) -> bytes:
    return events.run_ready(
        run_id=f"{i:032x}", tenant_id="ten_a", partition_id=1, attempt=1,
        scheduled_ms=1_700_000_000_000 + i, created_ms=1_700_000_000_005 + i,
        priority="normal", target={"type": "queue", "queue": "q"}, payload=json.dumps({"i": i}, separators=(",", ":")),
    )  # fmt: skip


def test_confluent_kafka__idempotent_producer__records_round_trip(kafka_bootstrap, topic_prefix):
    topic = f"{topic_prefix}.runs.roundtrip"  # a run topic: the relay writes it
    kafka.ensure_topics([topic], partitions=3, bootstrap=kafka_bootstrap, principal="dispatcher")
    p = kafka.producer(kafka_bootstrap, principal="relay")
    for i in range(20):
        p.produce(topic, key=f"{i:032x}".encode(), value=_record(i))
    assert p.flush(15) == 0
    got = drain(kafka_bootstrap, topic, want=20)
    assert sorted(d["payload"] for *_, d, _m in got) == sorted(
        json.dumps({"i": i}, separators=(",", ":")) for i in range(20)
    )
    assert {name for _t, _k, name, _d, _m in got} == {"RunReady"}


def test_aiokafka__the_faust_client__reads_and_writes_the_same_records(
    kafka_bootstrap, topic_prefix
):
    topic = f"{topic_prefix}.runs.aiokafka"
    kafka.ensure_topics([topic], partitions=2, bootstrap=kafka_bootstrap, principal="dispatcher")

    async def scenario() -> list[dict]:
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka_bootstrap,
            enable_idempotence=True,
            **_aio("relay", kafka_bootstrap),
        )
        await producer.start()
        try:
            for i in range(5):
                await producer.send_and_wait(topic, _record(i), key=f"{i:032x}".encode())
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=kafka_bootstrap, group_id=f"{topic_prefix}.dispatcher",
            auto_offset_reset="earliest", enable_auto_commit=False, **_aio("dispatcher", kafka_bootstrap),
        )  # fmt: skip
        await consumer.start()
        out: list[dict] = []
        deadline = time.monotonic() + 30
        try:
            while len(out) < 5 and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=200)
                for records in batch.values():
                    out.extend(default_registry().decode(r.value)[1] for r in records)
            await consumer.commit()
        finally:
            await consumer.stop()
        return out

    got = asyncio.run(scenario())
    assert sorted(d["run_id"] for d in got) == [f"{i:032x}" for i in range(5)]


def test_producer_statistics__a_platform_role_reports_the_broker_round_trip(
    kafka_bootstrap, topic_prefix, monkeypatch
):
    """CRONWHEEL_KAFKA_STATS_MS on: a platform role's producer hands
    librdkafka's statistics to cronwheel.kafka_stats during its poll(), and
    the broker's round trip of what it sent shows in the metric."""
    from prometheus_client import REGISTRY

    monkeypatch.setenv("CRONWHEEL_KAFKA_STATS_MS", "100")
    topic = f"{topic_prefix}.runs.stats"
    kafka.ensure_topics([topic], bootstrap=kafka_bootstrap, principal="dispatcher")
    producer = kafka.producer(kafka_bootstrap, principal="relay")
    for i in range(20):
        producer.produce(topic, _record(i))
    assert producer.flush(30) == 0
    labels = {"role": "relay", "stage": "rtt", "quantile": "1"}

    def round_trip() -> float:
        return max(
            (s.value for m in REGISTRY.collect() if m.name == "cronwheel_kafka_producer_latency_seconds"
             for s in m.samples if labels.items() <= s.labels.items()),
            default=0.0,
        )  # fmt: skip

    deadline = time.monotonic() + 30
    while round_trip() == 0.0 and time.monotonic() < deadline:
        producer.produce(topic, _record(99))
        producer.poll(0.2)  # the statistics arrive through poll()
    assert 0.0 < round_trip() < 30.0
