"""The relay and the dispatcher replace a producer that has met many topics
gone quiet with a fresh one (cronwheel/topics_met.py), delivering what the
old one held first: every run still reaches its topic once, before the
renewal and after it."""

from __future__ import annotations

import logging
import re
from collections import Counter

import psycopg
import pytest

from cronwheel.config import ProducerRenewal
from cronwheel.core.clock import now_ms
from cronwheel.kafka import Topics
from cronwheel.store.jobs import Jobs, create_tenant
from services.dispatcher.service import Dispatcher
from services.relay.service import Relay
from tests.integration.test_dispatcher import produce, ready
from tests.support.kafka import read_all
from tests.support.running import running
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

# Looked at every second; renewed once three topics were met and at most half used.
RENEWAL = ProducerRenewal(every_s=1.0, at_least_topics=3)

JOB = {
    "name": "queued",
    "schedule": {"every_ms": 86_400_000},
    "target": {"type": "queue", "queue": "billing"},
}


def _renewed_having_met(line: str, topics: int) -> None:
    """The renewal's log line names `topics` met and at most half of them used
    in the look's second (TopicsMet's rule): usually none, but on a loaded
    machine a publish or a nudge can still fall inside it (one did in CI)."""
    met = re.search(r"the last had met (\d+) topics, (\d+) of them used", line)
    assert met is not None and int(met[1]) == topics and 2 * int(met[2]) <= topics, line


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
    relay = Relay(database_url, kafka_bootstrap, idle_ms=50, renewal=RENEWAL)
    old = relay.producer._producer
    with running(relay):
        wait_for(lambda: relay.published_total >= 4, 60, what="the first four published")
        # Five topics met (the run topics and the wake topic); a look with
        # at most half of them used renews the producer.
        wait_for(lambda: relay.producer.renewed_total >= 1, 30, what="a new producer")
        assert relay.producer._producer is not old
        busy_tenant, busy_job = made[0]
        with psycopg.connect(database_url, autocommit=True) as conn:
            later = jobs.trigger(conn, busy_tenant, busy_job["job_id"], now_ms())["run_id"]
        wait_for(lambda: relay.published_total >= 5, 60, what="the later run published")
    [line] = [r.getMessage() for r in caplog.records if "a new producer" in r.getMessage()]
    # The four run topics and the dozing dispatchers' wake topic (cronwheel.dozing).
    _renewed_having_met(line, 5)
    published = Counter(
        m.key().decode()
        for m in read_all(kafka_bootstrap, [topics.runs(t["tenant_id"]) for t in tenants])
    )
    assert published == {run_id: 1 for run_id in [*first, later]}


def test_dispatcher_met_queues_gone_quiet__new_producer__each_run_forwarded_once(
    database_url, kafka_bootstrap, topic_prefix, caplog
):
    caplog.set_level(logging.INFO, logger="cronwheel.dispatcher")
    topics = Topics(topic_prefix)
    tenants = [f"t{i}" for i in range(4)]
    for t in tenants:
        produce(kafka_bootstrap, topics.runs(t), [(f"{t}-a".encode(), ready(t, f"{t}-a"))])
    dispatcher = Dispatcher(database_url, kafka_bootstrap, topics, renewal=RENEWAL)
    old = dispatcher.producer._producer
    with running(dispatcher):
        wait_for(lambda: dispatcher.forwarded_total >= 4, 60, what="the first four forwarded")
        wait_for(lambda: dispatcher.producer.renewed_total >= 1, 30, what="a new producer")
        assert dispatcher.producer._producer is not old
        produce(kafka_bootstrap, topics.runs("t0"), [(b"t0-b", ready("t0", "t0-b"))])
        wait_for(lambda: dispatcher.forwarded_total >= 5, 60, what="the later run forwarded")
    [line] = [r.getMessage() for r in caplog.records if "a new producer" in r.getMessage()]
    # The four queues, and the wake topic its nudge after the assignment wrote to.
    _renewed_having_met(line, 5)
    queues = [topics.queue(t, "billing") for t in tenants]
    forwarded = Counter(m.key().decode() for m in read_all(kafka_bootstrap, queues))
    assert forwarded == {**{f"{t}-a": 1 for t in tenants}, "t0-b": 1}
