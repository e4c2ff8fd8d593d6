"""The relay replaces a producer that has met many topics gone quiet with a
fresh one (cronwheel/topics_met.py), delivering what the old one held first:
every run still reaches its topic once, before the renewal and after it."""

from __future__ import annotations

import logging
from collections import Counter

import psycopg
import pytest

from cronwheel.core.clock import now_ms
from cronwheel.kafka import Topics
from cronwheel.store.jobs import Jobs, create_tenant
from services.relay.service import Relay
from tests.support.kafka import read_all
from tests.support.running import running
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

JOB = {
    "name": "queued",
    "schedule": {"every_ms": 86_400_000},
    "target": {"type": "queue", "queue": "billing"},
}


def test_relay_met_topics_gone_quiet__new_producer__each_run_published_once(
    database_url, kafka_bootstrap, topic_prefix, caplog
):
    caplog.set_level(logging.INFO, logger="cronwheel.relay")
    topics = Topics(topic_prefix)
    jobs = Jobs(topics)
    with psycopg.connect(database_url, autocommit=True) as conn:
        tenants = [create_tenant(conn, f"t{i}") for i in range(4)]
        made = [(t, jobs.create(conn, t, JOB, now_ms())) for t in tenants]
        first = [jobs.trigger(conn, t, j["job_id"], now_ms())["run_id"] for t, j in made]
    relay = Relay(
        database_url, kafka_bootstrap, idle_ms=50, renew_producer_s=1.0, renew_producer_topics=3
    )
    old = relay.producer
    with running(relay):
        wait_for(lambda: relay.published_total >= 4, 60, what="the first four published")
        # Four topics met; a look with none of them used renews the producer.
        wait_for(lambda: relay.producers_renewed >= 1, 30, what="a new producer")
        assert relay.producer is not old
        busy_tenant, busy_job = made[0]
        with psycopg.connect(database_url, autocommit=True) as conn:
            later = jobs.trigger(conn, busy_tenant, busy_job["job_id"], now_ms())["run_id"]
        wait_for(lambda: relay.published_total >= 5, 60, what="the later run published")
    [line] = [r.getMessage() for r in caplog.records if "a new producer" in r.getMessage()]
    assert "the last had met 4 topics, 0 of them used" in line
    published = Counter(
        m.key().decode()
        for m in read_all(kafka_bootstrap, [topics.runs(t["tenant_id"]) for t in tenants])
    )
    assert published == {run_id: 1 for run_id in [*first, later]}
