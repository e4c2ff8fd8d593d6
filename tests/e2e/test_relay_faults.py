"""The outbox relay as a real process, killed with -9 while the timer keeps firing:
a kill between Kafka's acknowledgement and the outbox delete publishes rows
again (duplicates on the topic are allowed), but no run is ever lost, and the
database still holds exactly one run per instant."""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter

import psycopg
import pytest
from confluent_kafka import TopicPartition

from cronwheel import kafka
from cronwheel.kafka import Topics
from tests.e2e.test_timer_faults import (
    assert_one_run_per_instant,
    create_interval_jobs,
    owned_count,
)
from tests.support.kafka import drain
from tests.support.procs import launcher
from tests.support.wait import wait_drained, wait_for

pytestmark = pytest.mark.e2e

KILLS = 8


@pytest.fixture
def conn(database_url):
    with psycopg.connect(database_url, autocommit=True) as c:
        yield c


@pytest.fixture
def launch(database_url, kafka_bootstrap, topic_prefix):
    with launcher(database_url, kafka_bootstrap, topic_prefix, lease_ttl_ms=1000) as la:
        yield la


def records_on(bootstrap: str, topic: str) -> int:
    """How many records the topic holds, from its partitions' watermarks."""
    c = kafka.consumer(f"test-{uuid.uuid4().hex[:8]}", bootstrap, principal="observer")
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        total = 0
        for p in parts:
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            total += high - low
        return total
    finally:
        c.close()


def publishing(conn, app: str) -> bool:
    """Whether the relay's last query read an outbox batch: it is now producing
    that batch, and deletes it only once Kafka acknowledged it."""
    return any(
        "SELECT id, topic, key, value, headers" in q
        for (q,) in conn.execute(
            "SELECT query FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database()",
            [app],
        )
    )


def outbox_rows(conn) -> int:
    return conn.execute("SELECT count(*) FROM outbox").fetchone()[0]


def test_relay__killed_between_produce_and_delete__every_run_reaches_the_topic(
    conn, launch, kafka_bootstrap, topic_prefix
):
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    topics = Topics(topic_prefix)
    create_interval_jobs(conn, topics, 60, (200, 400), rng)
    (tenant_id,) = conn.execute("SELECT tenant_id FROM tenants").fetchone()
    timer = launch.start("timer")
    wait_for(lambda: owned_count(conn, "timer", timer.owner()), 15, 0.05, "timer leases")
    wait_for(lambda: outbox_rows(conn) > 0, 15, 0.05, "the timer to fire")
    for i in range(KILLS):
        app = f"relay-{i}"
        relay = launch.start("relay", PGAPPNAME=app)
        wait_for(lambda a=app: publishing(conn, a), 15, 0.002, "the relay to read a batch")
        # The fault: a random point after it read a batch, mostly while Kafka
        # takes the batch and before the outbox delete commits.
        time.sleep(rng.uniform(0, 0.05))
        relay.kill()
    assert timer.stop() == 0
    relay = launch.start("relay")
    backlog = outbox_rows(conn)
    try:
        # Progress within 20 s: a relay that sent to a topic its producer did
        # not know yet once held the whole backlog 30 s (the wake topic).
        took = wait_drained(lambda: outbox_rows(conn), 20, 0.1, "an undisturbed relay's drain")
    except AssertionError:
        print(relay.log()[-4000:])
        raise
    assert relay.stop() == 0

    runs = assert_one_run_per_instant(conn)
    run_ids = {r for (r,) in conn.execute("SELECT run_id FROM runs_daily")}
    topic = topics.runs(tenant_id)
    total = records_on(kafka_bootstrap, topic)
    records = drain(kafka_bootstrap, topic, want=total, timeout=60)
    assert len(records) == total
    seen = Counter(datum["run_id"] for _t, _k, _n, datum, _m in records)
    assert all(key.decode() == datum["run_id"] for _t, key, _n, datum, _m in records)
    assert set(seen) - run_ids == set(), "records of runs the database does not hold"
    lost = run_ids - set(seen)
    assert not lost, f"{len(lost)} runs never reached {topic}: {sorted(lost)[:5]}"
    duplicates = total - len(seen)
    print(
        f"seed {seed}: {KILLS} relay kills -9, {runs} runs, {total} records on the topic, "
        f"{duplicates} duplicates ({sum(1 for n in seen.values() if n > 1)} runs seen twice+); "
        f"a backlog of {backlog} drained in {took:.1f}s"
    )
