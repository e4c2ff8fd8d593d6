"""New tenants arriving while runs flow: the dispatcher, a real process, sees its
pattern subscription grow in cooperative rebalances. It must stay up and
forward every run once.

The burst reproduces the abort seen under tenant churn (confluent-kafka's
"CallState_get: Assertion `cs != NULL' failed", exit -6). A rebalance callback
that calls list_topics on its own consumer clears that client's call state,
and the next callback of the same consume() aborts (cronwheel.consuming)."""

from __future__ import annotations

import os
import time
import uuid

import pytest
from confluent_kafka import KafkaException, TopicPartition

from cronwheel import kafka
from cronwheel.core.avro import default_registry
from cronwheel.kafka import Topics
from tests.integration.test_dispatcher import NO_LEADER_YET, ready
from tests.support.procs import launcher
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e

TENANTS = int(os.environ.get("CHURN_TENANTS", "150"))
PACE_S = float(os.environ.get("CHURN_PACE_S", "0.01"))


def test_tenant_churn__new_run_topics_while_runs_flow__dispatcher_stays_up__every_run_forwarded_once(
    database_url, kafka_bootstrap, topic_prefix
):
    topics = Topics(topic_prefix)
    producer = kafka.producer(kafka_bootstrap, principal="relay")
    sent: set[str] = set()
    made: set[str] = set()

    def send(tenant: str, n: int) -> None:
        if tenant not in made:  # the broker creates no topic on a produce
            kafka.ensure_topics(
                [topics.runs(tenant)], kafka.RUN_PARTITIONS, kafka_bootstrap, principal="dispatcher"
            )
            made.add(tenant)
        for i in range(n):
            run_id = f"{tenant}-r{i}"
            producer.produce(topics.runs(tenant), key=run_id.encode(), value=ready(tenant, run_id))
            sent.add(run_id)
        producer.poll(0)

    with launcher(database_url, kafka_bootstrap, topic_prefix) as launch:
        send("first", 5)
        assert producer.flush(30) == 0
        dispatcher = launch.start("dispatcher")
        wait_for(lambda: "dispatcher starting" in dispatcher.log(), timeout=30, what="start")
        tenants = [f"burst{i}{uuid.uuid4().hex[:4]}" for i in range(TENANTS)]
        for i, tenant in enumerate(tenants):
            # Each new tenant's run topic is made just before its first record;
            # the runs of earlier tenants keep flowing.
            send(tenant, 3)
            send(tenants[i // 2], 1) if i else None
            assert producer.flush(30) == 0
            assert dispatcher.alive(), f"dispatcher died:\n{dispatcher.log()[-3000:]}"
            time.sleep(PACE_S)  # the churn's pace, not a wait
        queues = f"{topic_prefix}.q."
        wait_for(
            lambda: records_on(kafka_bootstrap, queues) >= len(sent) or not dispatcher.alive(),
            timeout=90,
            interval=0.5,
            what="every run on its queue topic",
        )
        assert dispatcher.alive(), f"dispatcher died:\n{dispatcher.log()[-3000:]}"
        assert "Assertion" not in dispatcher.log()
    run_ids = read_all(kafka_bootstrap, queues)
    assert set(run_ids) == sent, f"{len(sent - set(run_ids))} runs not forwarded"
    assert len(run_ids) == len(sent), f"{len(run_ids) - len(sent)} runs forwarded twice"


def _partitions(c, prefix: str) -> list[TopicPartition]:
    meta = c.list_topics(timeout=10).topics
    return [
        TopicPartition(name, p) for name, t in meta.items() if name.startswith(prefix)
        for p in t.partitions
    ]  # fmt: skip


def records_on(bootstrap: str, prefix: str) -> int:
    """Records the topics starting with `prefix` hold, duplicates included."""
    c = kafka.consumer(f"count-{uuid.uuid4().hex[:8]}", bootstrap, principal="observer")
    try:
        total = 0
        for tp in _partitions(c, prefix):
            try:
                low, high = c.get_watermark_offsets(tp, timeout=10)
            except KafkaException as e:
                if e.args[0].code() in NO_LEADER_YET:
                    return -1  # a fresh topic: asked again
                raise
            total += high - low
        return total
    finally:
        c.close()


def read_all(bootstrap: str, prefix: str) -> list[str]:
    """Every record's run_id on those topics, by explicit assignment (a pattern
    subscription reads partitions again when its topics grow)."""
    c = kafka.consumer(f"read-{uuid.uuid4().hex[:8]}", bootstrap, principal="observer")
    try:
        ends = {}
        parts = []
        for tp in _partitions(c, prefix):
            low, high = c.get_watermark_offsets(tp, timeout=10)
            if high > low:
                ends[(tp.topic, tp.partition)] = high
                parts.append(TopicPartition(tp.topic, tp.partition, low))
        c.assign(parts)
        out: list[str] = []
        deadline = time.monotonic() + 60
        while ends and time.monotonic() < deadline:
            for m in c.consume(500, timeout=0.5):
                if m.error():
                    continue
                out.append(default_registry().decode(m.value())[1]["run_id"])
                where = (m.topic(), m.partition())
                if m.offset() + 1 >= ends.get(where, 0):
                    ends.pop(where, None)
        assert not ends, f"could not read {len(ends)} partitions to their end"
        return out
    finally:
        c.close()
